-- Read queries of the inboxes pages (pages/inboxes.py). Every read starts from an inbox's
-- slice of a partial index (envelopes_ready: waiting; envelopes_delivered: ever delivered)
-- and is LIMITed, so the cost follows the inbox's backlog and the sample, never the history.

-- name: overview
-- Every inbox's stats in one statement (no query per inbox): the numbers of `stats()`
-- (queries.sql, inbox_stats: depth and in-flight from the waiting slice, rates and
-- enqueue -> first-lease latency over the most recent %(sample)s deliveries within
-- %(window_s)s seconds, dead letters from inbox_counters) and the oldest waiting envelope;
-- a page of inboxes by id after %(after)s (each costs a walk of its sample: about 1.5 ms
-- on a store of a million trail entries, so a page is what bounds the statement).
SELECT w.id, w.state, q.depth, q.in_flight, q.oldest, coalesce(c.dead, 0) AS dead,
       round((r.n_in / greatest(0.001, CASE
           WHEN r.n >= %(sample)s THEN least(%(window_s)s, extract(epoch FROM now() - r.first))
           ELSE %(window_s)s END))::numeric, 3) AS rate_in,
       round((r.n_out / greatest(0.001, CASE
           WHEN r.n >= %(sample)s THEN least(%(window_s)s, extract(epoch FROM now() - r.first))
           ELSE %(window_s)s END))::numeric, 3) AS rate_out,
       round(r.p50::numeric, 3) AS p50, round(r.p95::numeric, 3) AS p95
  FROM agentpost.workspaces w
 CROSS JOIN LATERAL (
       SELECT count(*) AS depth,
              count(*) FILTER (WHERE e.lease_token IS NOT NULL AND e.lease_until > now())
                  AS in_flight,
              min(e.created_at) AS oldest
         FROM agentpost.envelopes e
        WHERE e.recipient = w.id AND e.status = 'acknowledged' AND e.consumed_at IS NULL) q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE s.created_at >= now() - %(window_s)s * interval '1 second')
                  AS n_in,
              count(*) FILTER (WHERE s.first_leased_at >= now()
                                                       - %(window_s)s * interval '1 second')
                  AS n_out,
              count(*) AS n, min(s.created_at) AS first,
              percentile_cont(0.5) WITHIN GROUP (
                  ORDER BY extract(epoch FROM s.first_leased_at - s.created_at) * 1000) AS p50,
              percentile_cont(0.95) WITHIN GROUP (
                  ORDER BY extract(epoch FROM s.first_leased_at - s.created_at) * 1000) AS p95
         FROM (SELECT e.created_at, e.first_leased_at
                 FROM agentpost.envelopes e
                WHERE e.recipient = w.id AND e.delivered_at IS NOT NULL
                ORDER BY e.seq DESC
                LIMIT %(sample)s) s) r
  LEFT JOIN agentpost.inbox_counters c ON c.workspace_id = w.id
 WHERE w.id > %(after)s
 ORDER BY w.id
 LIMIT %(limit)s

-- name: oldest
-- When the oldest envelope waiting in one inbox was created.
SELECT min(e.created_at)
  FROM agentpost.envelopes e
 WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL

-- name: waiting
-- The first envelopes of an inbox in processing order, with their leases: a walk of
-- envelopes_ready in its own order.
SELECT e.id, e.sender, e.type, e.priority, e.origin, e.created_at, e.delivered_at,
       e.redeliveries, e.lease_holder,
       CASE WHEN e.lease_token IS NOT NULL AND e.lease_until > now() THEN e.lease_until END
  FROM agentpost.envelopes e
 WHERE e.recipient = %(ws)s AND e.status = 'acknowledged' AND e.consumed_at IS NULL
 ORDER BY e.rank, coalesce(e.queue_pos, e.seq)
 LIMIT %(limit)s

-- name: latencies
-- Enqueue -> first lease (ms) of the inbox's most recent leased deliveries.
SELECT extract(epoch FROM s.first_leased_at - s.created_at) * 1000
  FROM (SELECT e.created_at, e.first_leased_at
          FROM agentpost.envelopes e
         WHERE e.recipient = %(ws)s AND e.delivered_at IS NOT NULL
         ORDER BY e.seq DESC
         LIMIT %(sample)s) s
 WHERE s.first_leased_at IS NOT NULL

-- name: throughput
-- Envelopes in (created) and out (consumed) per minute over the last hour, among the inbox's
-- most recent %(sample)s deliveries.
WITH recent AS (
    SELECT e.created_at, e.consumed_at
      FROM agentpost.envelopes e
     WHERE e.recipient = %(ws)s AND e.delivered_at IS NOT NULL
     ORDER BY e.seq DESC
     LIMIT %(sample)s
)
SELECT 'in', extract(epoch FROM date_trunc('minute', created_at))::bigint, count(*)
  FROM recent WHERE created_at >= now() - interval '1 hour' GROUP BY 2
UNION ALL
SELECT 'out', extract(epoch FROM date_trunc('minute', consumed_at))::bigint, count(*)
  FROM recent WHERE consumed_at >= now() - interval '1 hour' GROUP BY 2

-- name: consumed
-- A page of an inbox's consumed envelopes, newest first (by seq), below %(before)s. A backward
-- walk of envelopes_delivered (the inbox's deliveries) bounded to %(walk)s rows, of which the
-- consumed ones are kept: a page costs the same at any depth, even where waiting envelopes
-- and dead letters lie between. One row always comes back: how many rows the walk read and
-- the lowest seq it reached (where the next page goes on when the walk ran out before the
-- page was full), then the page's envelope (NULLs when the walk found none).
WITH walk AS (
    SELECT e.id, e.seq, e.sender, e.type, e.priority, e.origin, e.created_at, e.consumed_at,
           e.redeliveries, e.leases
      FROM agentpost.envelopes e
     WHERE e.recipient = %(ws)s AND e.delivered_at IS NOT NULL AND e.seq < %(before)s
     ORDER BY e.seq DESC
     LIMIT %(walk)s
)
SELECT w.walked, w.lowest, c.id, c.seq, c.sender, c.type, c.priority, c.origin, c.created_at,
       c.consumed_at, c.redeliveries, c.leases
  FROM (SELECT count(*) AS walked, min(seq) AS lowest FROM walk) w
  LEFT JOIN LATERAL (SELECT * FROM walk WHERE walk.consumed_at IS NOT NULL
                      ORDER BY walk.seq DESC LIMIT %(limit)s) c ON true
 ORDER BY c.seq DESC
