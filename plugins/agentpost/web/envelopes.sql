-- Read queries of the envelope page (pages/envelopes.py). All by primary key or by the
-- envelope's own index entries (trail_envelope, envelopes_reply), LIMITed.

-- name: entries
-- The trail entries of one envelope in trail order, each with its chain predecessor (the
-- unique index (chain, chain_seq), one probe per entry), every column the per-entry check
-- covers.
WITH mine AS MATERIALIZED (  -- (a fence: read through trail_envelope, never by id order)
    SELECT t.* FROM agentpost.trail t WHERE t.envelope_id = %(id)s
)
SELECT t.id, t.chain, t.chain_seq, t.event, t.envelope_id,
       (extract(epoch FROM t.at) * 1000000)::bigint, t.record, t.prev_hash, t.hash, t.mac,
       t.at,
       p.*
  FROM (SELECT * FROM mine ORDER BY id LIMIT %(limit)s) t
  LEFT JOIN LATERAL (
        SELECT b.id, b.chain, b.chain_seq, b.event, b.envelope_id,
               (extract(epoch FROM b.at) * 1000000)::bigint, b.record, b.prev_hash, b.hash,
               b.mac
          FROM agentpost.trail b
         WHERE b.chain = t.chain AND b.chain_seq = t.chain_seq - 1
        OFFSET 0) p ON true
 ORDER BY t.id

-- name: ancestors
-- in_reply_to up to the root (nearest first), one primary-key probe per step (a scalar
-- subquery, so no plan can read the reply index whole; OFFSET 0 keeps the last look-up a
-- probe per row, never a join over the table), at most %(limit)s steps.
WITH RECURSIVE up(id, depth) AS (
    SELECT (SELECT e.in_reply_to FROM agentpost.envelopes e WHERE e.id = %(id)s), 1
    UNION ALL
    SELECT (SELECT e.in_reply_to FROM agentpost.envelopes e WHERE e.id = up.id), up.depth + 1
      FROM up
     WHERE up.id IS NOT NULL AND up.depth < %(limit)s
)
SELECT up.id, e.sender, e.recipient, e.type, e.created_at, e.id IS NOT NULL
  FROM up
  LEFT JOIN LATERAL (SELECT x.id, x.sender, x.recipient, x.type, x.created_at
                       FROM agentpost.envelopes x WHERE x.id = up.id OFFSET 0) e ON true
 WHERE up.id IS NOT NULL
 ORDER BY up.depth

-- name: replies
-- Direct replies, oldest first.
SELECT e.id, e.sender, e.recipient, e.type, e.created_at
  FROM agentpost.envelopes e
 WHERE e.in_reply_to = %(id)s
 ORDER BY e.seq
 LIMIT %(limit)s

-- name: lease
-- The envelope's live lease, if any.
SELECT e.lease_holder, e.lease_until, e.leases, e.first_leased_at
  FROM agentpost.envelopes e
 WHERE e.id = %(id)s
