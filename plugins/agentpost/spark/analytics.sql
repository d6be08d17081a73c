-- The analytics job's reads beside the window's trail entries (agentpost.spark.analytics).
-- Each is a SELECT that Snapshot.table runs over JDBC in the job's snapshot, with the
-- window's bounds bound as literals: %(start)s, %(end)s (timestamptz) and %(start_s)s,
-- %(end_s)s (the same instants in epoch seconds, the mark space's clock).

-- name: creations
-- The creation entries, outside the window, of the envelopes delivered in it (an envelope
-- delivered now may have been created in an earlier window; those created in it are among
-- the window's own entries): their signed rows carry created_at_us. By the trail_envelope
-- index.
SELECT c.id, c.envelope_id, c.record
  FROM agentpost.trail c
 WHERE c.event = 'envelope_created'
   AND (c.at < %(start)s OR c.at >= %(end)s)
   AND c.envelope_id IN (SELECT d.envelope_id FROM agentpost.trail d
                          WHERE d.event = 'envelope_delivered'
                            AND d.at >= %(start)s AND d.at < %(end)s)

-- name: commands
-- Commands submitted in the window, in their current state.
SELECT c.workspace, c.action, c.kind,
       c.state, (extract(epoch FROM c.created_at) * 1000000)::bigint AS at_us
  FROM agentpost.commands c
 WHERE c.created_at >= %(start)s AND c.created_at < %(end)s

-- name: marks
-- Marks written in the window (every space).
SELECT m.seq, m.space, m.id::text AS id, m.mark_type, m.agent_id::text AS agent, m.scope,
       m.created_at, m.topic, m.supersedes::text AS supersedes,
       m.resolved_by::text AS resolved_by, (m.body ->> 'question') AS question
  FROM agentpost.marks m
 WHERE m.created_at >= %(start_s)s AND m.created_at < %(end_s)s

-- name: needs_resolved_in_window
-- The needs that a resolution written in the window resolved (opened whenever): the time
-- to resolution needs their created_at.
SELECT o.seq, o.space, o.id::text AS id, o.scope, o.created_at,
       (o.body ->> 'question') AS question
  FROM agentpost.marks o
 WHERE o.id IN (SELECT c.supersedes FROM agentpost.marks c
                 WHERE c.mark_type = 'need' AND c.resolved_by IS NOT NULL
                   AND c.created_at >= %(start_s)s AND c.created_at < %(end_s)s)

-- name: contested
-- Intents and actions on every (space, scope, resource) that has an intent written in the
-- window: the competitors of those intents (written before or after them) and the actions
-- that show who went ahead.
SELECT m.seq, m.space, m.id::text AS id, m.mark_type, m.agent_id::text AS agent, m.scope,
       m.resource, m.created_at, m.ttl, m.supersedes::text AS supersedes,
       coalesce(m.failed, false) AS failed
  FROM agentpost.marks m
 WHERE m.mark_type IN ('intent', 'action') AND m.resource IS NOT NULL
   AND (m.space, m.scope, m.resource) IN (
       SELECT w.space, w.scope, w.resource FROM agentpost.marks w
        WHERE w.mark_type = 'intent'
          AND w.created_at >= %(start_s)s AND w.created_at < %(end_s)s)

-- name: verdicts
-- Deferred-resolution verdicts still kept (sql/0014: a boundary replaces the previous
-- one's rows on its resource, and expired rows go at the next boundary of the space).
SELECT v.space, v.intent_id::text AS intent_id, v.allowed,
       v.winner_id::text AS winner_id, (v.consumed_by IS NOT NULL) AS consumed
  FROM agentpost.mark_verdicts v
