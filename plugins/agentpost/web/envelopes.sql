-- Read queries of the envelope page (pages/envelopes.py). All by primary key or by the
-- envelope's own index entries (trail_envelope, envelopes_reply), LIMITed.

-- name: entries
-- The trail entries of one envelope in trail order, each with its chain predecessor (the
-- unique index (chain, chain_seq)), every column the per-entry check covers.
SELECT t.id, t.chain, t.chain_seq, t.event, t.envelope_id,
       (extract(epoch FROM t.at) * 1000000)::bigint, t.record, t.prev_hash, t.hash, t.mac,
       t.at,
       p.id, p.chain, p.chain_seq, p.event, p.envelope_id,
       (extract(epoch FROM p.at) * 1000000)::bigint, p.record, p.prev_hash, p.hash, p.mac
  FROM agentpost.trail t
  LEFT JOIN agentpost.trail p ON p.chain = t.chain AND p.chain_seq = t.chain_seq - 1
 WHERE t.envelope_id = %(id)s
 ORDER BY t.id
 LIMIT %(limit)s

-- name: ancestors
-- in_reply_to up to the root (nearest first), one primary-key probe per step, at most
-- %(limit)s steps (a cycle cannot loop: ids are assigned at creation, but the cap holds).
WITH RECURSIVE up(id, depth) AS (
    SELECT e.in_reply_to, 1 FROM agentpost.envelopes e
     WHERE e.id = %(id)s AND e.in_reply_to IS NOT NULL
    UNION ALL
    SELECT e.in_reply_to, up.depth + 1
      FROM up JOIN agentpost.envelopes e ON e.id = up.id
     WHERE e.in_reply_to IS NOT NULL AND up.depth < %(limit)s
)
SELECT up.id, e.sender, e.recipient, e.type, e.created_at, e.id IS NOT NULL
  FROM up LEFT JOIN agentpost.envelopes e ON e.id = up.id
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
