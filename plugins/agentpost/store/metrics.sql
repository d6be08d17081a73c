-- The metrics snapshot (store/metrics.py): each number from an index of the live state, never
-- a walk of history (sql/0082_metrics.sql).

-- name: inboxes
-- Per inbox with anything waiting, in flight or counted: depth, in flight, the oldest waiting
-- envelope's age (s), redeliveries and dead letters so far. Deepest first.
SELECT w.id, coalesce(q.depth, 0), coalesce(q.in_flight, 0), q.oldest_s,
       coalesce(c.redeliveries, 0), coalesce(c.dead, 0)
  FROM agentpost.workspaces w
  LEFT JOIN (SELECT e.recipient, count(*) AS depth,
                    count(*) FILTER (WHERE e.lease_token IS NOT NULL AND e.lease_until > now())
                        AS in_flight,
                    extract(epoch FROM now() - min(e.created_at))::float8 AS oldest_s
               FROM agentpost.envelopes e
              WHERE e.status = 'acknowledged' AND e.consumed_at IS NULL
              GROUP BY e.recipient) q ON q.recipient = w.id
  LEFT JOIN agentpost.inbox_counters c ON c.workspace_id = w.id
 ORDER BY coalesce(q.depth, 0) DESC, w.id

-- name: latencies
-- Enqueue -> first lease (s) of the most recent %(sample)s leased deliveries of each inbox
-- named (the envelopes_delivered slice of each).
SELECT extract(epoch FROM s.first_leased_at - s.created_at)::float8
  FROM unnest(%(inboxes)s::text[]) AS i(id)
 CROSS JOIN LATERAL (SELECT e.created_at, e.first_leased_at
                       FROM agentpost.envelopes e
                      WHERE e.recipient = i.id AND e.delivered_at IS NOT NULL
                      ORDER BY e.seq DESC
                      LIMIT %(sample)s) s
 WHERE s.first_leased_at IS NOT NULL

-- name: rejections
SELECT e.reason, count(*) FROM agentpost.envelopes e
 WHERE e.status = 'rejected' GROUP BY e.reason ORDER BY e.reason

-- name: commands
SELECT c.state, count(*) FROM agentpost.commands c GROUP BY c.state ORDER BY c.state

-- name: backlog
SELECT count(*) FROM agentpost.event_claims WHERE confirmed_at IS NULL

-- name: verified
-- Seconds since the newest verification that passed (NULL: never), and the newest one's
-- outcome.
SELECT (SELECT extract(epoch FROM now() - max(v.verified_at))::float8
          FROM agentpost.trail_verifications v WHERE v.ok),
       (SELECT v.ok FROM agentpost.trail_verifications v ORDER BY v.verified_at DESC LIMIT 1)

-- name: record_verification
INSERT INTO agentpost.trail_verifications (ok, entries, anchor, by)
VALUES (%(ok)s, %(entries)s, %(anchor)s, %(by)s)
