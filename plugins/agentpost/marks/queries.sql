-- Statements of the durable mark space (agentpost.marks.postgres). Tables and the strength
-- functions are in sql/0007_marks.sql. Every mark-returning query yields the columns in the
-- order of postgres.MARK_COLUMNS, then (reads) the effective strength.
-- The space parameter is always the space's name, and the now parameter the space's clock,
-- never now(): the injectable clock drives the SQL too.

-- name: write
-- A batch of checked marks (JSON rows built by PostgresMarkSpace._row), in one statement.
SELECT n, id, created_at FROM agentpost.mark_write(%(space)s, %(now)s, %(rows)s::json)

-- name: write_named
-- The same, recording the writing agent's name on the way (sql/0076); `named`: recorded.
SELECT n, id, created_at, named
  FROM agentpost.mark_write(%(space)s, %(now)s, %(rows)s::json, %(agent_ids)s::uuid[],
                            %(agent_names)s::text[])

-- name: write_run
-- `write` with the run that wrote marks n = run_n recorded beside them (sql/0079), in the
-- same statement: the agent tools' one round trip (PostgresMarkSpace.recording_run).
WITH w AS (SELECT n, id, created_at FROM agentpost.mark_write(%(space)s, %(now)s, %(rows)s::json)),
     r AS (INSERT INTO agentpost.mark_runs (space, mark_id, workspace, tool, call_id, run)
           SELECT %(space)s, w.id, %(workspace)s, %(tool)s, %(call_id)s, %(run)s::jsonb
             FROM w WHERE w.n = ANY (%(run_n)s::bigint[])
               ON CONFLICT (space, mark_id) DO NOTHING)
SELECT n, id, created_at FROM w

-- name: write_named_run
-- `write_named` with the run recorded, as write_run.
WITH w AS (SELECT n, id, created_at, named
             FROM agentpost.mark_write(%(space)s, %(now)s, %(rows)s::json,
                                       %(agent_ids)s::uuid[], %(agent_names)s::text[])),
     r AS (INSERT INTO agentpost.mark_runs (space, mark_id, workspace, tool, call_id, run)
           SELECT %(space)s, w.id, %(workspace)s, %(tool)s, %(call_id)s, %(run)s::jsonb
             FROM w WHERE w.n = ANY (%(run_n)s::bigint[])
               ON CONFLICT (space, mark_id) DO NOTHING)
SELECT n, id, created_at, named FROM w

-- name: name_agents
-- A fleet apply's agents (it waits for a name another transaction is recording).
SELECT recorded FROM agentpost.mark_name_agents(%(space)s, %(agent_ids)s::uuid[],
                                                %(agent_names)s::text[], true)

-- name: agent_names
SELECT agent_id, name FROM agentpost.mark_agents
 WHERE space = %(space)s AND (%(ids)s::uuid[] IS NULL OR agent_id = ANY (%(ids)s::uuid[]))
 ORDER BY agent_id

-- name: get
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body
  FROM agentpost.marks
 WHERE id = %(id)s AND space = %(space)s

-- name: read
-- §8.2: the scope, and with nested every scope under it (read; read_exact: the scope alone),
-- optional filters, strength >= min_strength, never superseded (sql/0068).
SELECT * FROM agentpost.mark_read_at(%(space)s, %(scope)s, %(nested)s, %(resource)s,
                                     %(topic)s, %(mark_type)s, %(min_strength)s, %(now)s,
                                     %(prune)s)

-- name: active_marks
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body, strength
  FROM agentpost.marks_at(%(space)s, %(now)s)
 WHERE (%(scope)s::text IS NULL OR scope = %(scope)s)
   AND (%(mark_type)s::text IS NULL OR mark_type = %(mark_type)s)
   AND fades_at >= %(prune)s
   AND strength > 0

-- name: strength_of_stored
SELECT agentpost.mark_strength(%(space)s, %(id)s, %(now)s)

-- name: strength_of_unstored
-- A mark this space does not hold: decay and trust from the given fields, then supersession
-- and warnings by its id (if it has one), as for a stored mark.
SELECT s.strength
  FROM agentpost.mark_adjusted_strength(
           %(space)s, %(id)s::uuid,
           agentpost.mark_base_strength(%(mark_type)s::text, %(initial_strength)s::float8,
                                        %(created_at)s::float8, %(now)s::float8,
                                        %(half_life)s::float8, %(ttl)s::float8,
                                        %(resolved)s::boolean, %(source)s::text),
           %(now)s::float8) s

-- name: all_marks
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body
  FROM agentpost.marks
 WHERE space = %(space)s
   AND (%(scope)s::text IS NULL OR scope = %(scope)s)
   AND (%(mark_type)s::text IS NULL OR mark_type = %(mark_type)s)
 ORDER BY seq

-- name: count
SELECT count(*) FROM agentpost.marks WHERE space = %(space)s

-- name: count_marks
SELECT scope, mark_type, count(*) FROM agentpost.marks WHERE space = %(space)s GROUP BY 1, 2

-- name: superseded
SELECT EXISTS (SELECT 1 FROM agentpost.marks WHERE space = %(space)s AND supersedes = %(id)s)

-- name: unresolved_needs
-- §8.4: needs neither resolved nor superseded, at strength > 0 after warnings (the
-- package's rule), in write order.
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body
  FROM agentpost.marks m
 WHERE m.space = %(space)s AND m.mark_type = 'need' AND m.resolved_by IS NULL
   AND (SELECT s.strength
          FROM agentpost.mark_adjusted_strength(m.space, m.id, m.initial_strength,
                                                %(now)s::float8) s) > 0
 ORDER BY m.seq

-- name: claims
-- P39: the actions holding one resource (see mark_claims), in write order.
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body
  FROM agentpost.mark_claims(%(space)s, %(scope)s, %(resource)s)

-- name: read_with_claims
-- The guard's view of one resource in one round trip: read_exact(scope, resource=...) rows (with
-- their strength, claim = false), then the resource's claims (claim = true).
SELECT r.*, false AS claim
  FROM agentpost.mark_read_at(%(space)s, %(scope)s, false, %(resource)s, NULL, NULL,
                              %(min_strength)s, %(now)s, %(prune)s) r
UNION ALL
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body,
       NULL::float8, true
  FROM agentpost.mark_claims(%(space)s, %(scope)s, %(resource)s)

-- name: write_read_with_claims
-- write (or write_named) and then read_with_claims of one resource, in one round trip
-- (sql/0081): the read's columns, claim, then the write's result as JSON on every row; the
-- last row has no mark.
SELECT (f.mark).*, f.claim, f.wrote
  FROM agentpost.mark_write_read(%(space)s, %(now)s, %(rows)s::json, %(agent_ids)s::uuid[],
                                 %(agent_names)s::text[], %(scope)s, %(resource)s,
                                 %(min_strength)s, %(prune)s) f

-- name: subscribe
-- P48/P49: the new patterns replace the old, and what was queued before goes with them.
WITH dropped AS (
    DELETE FROM agentpost.mark_watch WHERE space = %(space)s AND agent_id = %(agent_id)s
)
INSERT INTO agentpost.mark_subscriptions AS s (space, agent_id, patterns, read_scopes)
VALUES (%(space)s, %(agent_id)s, %(patterns)s::jsonb, %(read_scopes)s::text[])
ON CONFLICT (space, agent_id)
DO UPDATE SET patterns = excluded.patterns, read_scopes = excluded.read_scopes
RETURNING s.agent_id

-- name: unsubscribe
WITH dropped AS (
    DELETE FROM agentpost.mark_watch WHERE space = %(space)s AND agent_id = %(agent_id)s
)
DELETE FROM agentpost.mark_subscriptions
 WHERE space = %(space)s AND agent_id = %(agent_id)s
RETURNING agent_id

-- name: take_watched
-- P51: deleting is taking; of two concurrent polls, a queued mark goes to one only. Marks
-- are handed out only while they match the current subscription (P50): a write racing a
-- re-subscribe or an unsubscribe may queue a mark under the old patterns after the queue
-- was dropped; such a mark is dropped here instead of delivered. A mark matches if it or
-- the mark it supersedes does (sql/0066_mark_watch_supersession.sql).
WITH taken AS (
    DELETE FROM agentpost.mark_watch
     WHERE space = %(space)s AND agent_id = %(agent_id)s
    RETURNING seq, mark_id, projected
)
SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
       m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source, m.invalidates,
       m.severity, m.priority, m.blocking, m.resolved_by, m.failed, m.body, t.projected
  FROM taken t
  JOIN agentpost.marks m ON m.id = t.mark_id
  JOIN agentpost.mark_subscriptions s ON s.space = %(space)s AND s.agent_id = %(agent_id)s
 WHERE agentpost.mark_watch_matches(s.patterns, m.scope, m.mark_type, m.topic, m.resource)
    OR (SELECT agentpost.mark_watch_matches(s.patterns, o.scope, o.mark_type, o.topic,
                                            o.resource)
          FROM agentpost.marks o WHERE o.id = m.supersedes AND o.space = m.space)
 ORDER BY t.seq

-- name: peek_watched
SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
       m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source, m.invalidates,
       m.severity, m.priority, m.blocking, m.resolved_by, m.failed, m.body, w.projected
  FROM agentpost.mark_watch w
  JOIN agentpost.marks m ON m.id = w.mark_id
  JOIN agentpost.mark_subscriptions s ON s.space = w.space AND s.agent_id = w.agent_id
 WHERE w.space = %(space)s AND w.agent_id = %(agent_id)s
   AND (agentpost.mark_watch_matches(s.patterns, m.scope, m.mark_type, m.topic, m.resource)
        OR (SELECT agentpost.mark_watch_matches(s.patterns, o.scope, o.mark_type, o.topic,
                                                o.resource)
              FROM agentpost.marks o WHERE o.id = m.supersedes AND o.space = m.space))
 ORDER BY w.seq

-- name: lock
-- The guard's serialization of one (scope, resource) of one space, across processes, until
-- the transaction ends. The key is 'agentpost.marks:' + the JSON array [space, scope, resource].
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))

-- name: record_boundary
-- §6.2.1 phase 3: a boundary's verdicts replace the previous ones on (scope, resource)
-- (sql/0014_deferred_grants.sql); NULL when an intent_id names no intent there.
SELECT agentpost.mark_record_boundary(%(space)s, %(scope)s, %(resource)s, %(now)s,
                                      %(rows)s::json)

-- name: lock_many
-- lock() of several keys at once (resolve_deferred_many), in hash order (sql/0081).
SELECT agentpost.mark_lock_keys(%(keys)s::text[])

-- name: read_many_with_claims
-- read_with_claims of several resources of one scope in one round trip: each resource's
-- read_exact rows (claim = false), then its claims (claim = true); rows carry their resource.
SELECT r.*, false AS claim
  FROM unnest(%(resources)s::text[]) AS k(resource)
 CROSS JOIN LATERAL agentpost.mark_read_at(%(space)s, %(scope)s, false, k.resource, NULL, NULL,
                                           %(min_strength)s, %(now)s, %(prune)s) r
UNION ALL
SELECT c.id, c.mark_type, c.agent_id, c.scope, c.created_at, c.initial_strength, c.supersedes,
       c.resource, c.action, c.topic, c.confidence, c.source, c.invalidates, c.severity,
       c.priority, c.blocking, c.resolved_by, c.failed, c.body,
       NULL::float8, true
  FROM unnest(%(resources)s::text[]) AS k(resource)
 CROSS JOIN LATERAL agentpost.mark_claims(%(space)s, %(scope)s, k.resource) c

-- name: record_boundaries
-- record_boundary for several resources of one scope, in order (sql/0081); no rows when a
-- verdict names no intent of its agent on its resource (then nothing changed).
SELECT resource, boundary
  FROM agentpost.mark_record_boundaries(%(space)s, %(scope)s, %(now)s, %(rows)s::json)

-- name: deferred_verdict
-- The agent's verdict at the latest boundary on (scope, resource), while its intent lives.
SELECT scope, resource, agent_id, intent_id, allowed, winner_id, boundary, decided_at,
       expires_at, consumed_by
  FROM agentpost.mark_verdicts
 WHERE space = %(space)s AND scope = %(scope)s AND resource = %(resource)s
   AND agent_id = %(agent_id)s AND expires_at >= %(now)s

-- name: consume_grant
-- The winner's action uses its ALLOW (once).
UPDATE agentpost.mark_verdicts
   SET consumed_by = %(action_id)s
 WHERE space = %(space)s AND scope = %(scope)s AND resource = %(resource)s
   AND agent_id = %(agent_id)s AND allowed AND consumed_by IS NULL AND expires_at >= %(now)s
RETURNING boundary

-- name: key_get
-- What a caller-chosen key did in the space (sql/0043_mark_keys.sql).
SELECT key, kind, agent_id, scope, resource, intent_id, mark_id, failed, started_at, calls
  FROM agentpost.mark_keys
 WHERE space = %(space)s AND key = %(key)s

-- name: key_put
-- Record a write, or the start of a call, under a key: a new row, or a new start of the same
-- call after a failed one. No row back: the key names something else, or a call under way.
INSERT INTO agentpost.mark_keys AS k (space, key, kind, agent_id, scope, resource,
                                      intent_id, mark_id, started_at)
VALUES (%(space)s, %(key)s, %(kind)s, %(agent_id)s, %(scope)s, %(resource)s, %(intent_id)s,
        %(mark_id)s, %(started_at)s)
ON CONFLICT (space, key) DO UPDATE
   SET intent_id = EXCLUDED.intent_id, mark_id = NULL, failed = false,
       started_at = EXCLUDED.started_at, calls = k.calls + 1
 WHERE k.kind = 'execute' AND k.failed AND EXCLUDED.kind = 'execute'
   AND k.agent_id = EXCLUDED.agent_id AND k.scope = EXCLUDED.scope
   AND k.resource IS NOT DISTINCT FROM EXCLUDED.resource
RETURNING calls

-- name: key_settle
-- A call's outcome: the action mark that records it (in the action's transaction).
UPDATE agentpost.mark_keys
   SET mark_id = %(mark_id)s, failed = %(failed)s
 WHERE space = %(space)s AND key = %(key)s AND kind = 'execute' AND mark_id IS NULL
RETURNING calls

-- name: key_release
-- A person's release of a call that recorded no outcome: the next call under the key runs.
DELETE FROM agentpost.mark_keys
 WHERE space = %(space)s AND key = %(key)s AND kind = 'execute' AND mark_id IS NULL
RETURNING calls

-- name: quota_state
-- The agent's live marks (stored, not superseded; sql/0065_mark_quota.sql), and which of the
-- given ids are among them (marks the write supersedes give their place back).
SELECT count(*),
       coalesce(array_agg(m.id) FILTER (WHERE m.id = ANY (%(targets)s::uuid[])), '{}')
  FROM agentpost.marks m
 WHERE m.space = %(space)s AND m.agent_id = %(agent_id)s
   AND (SELECT true FROM agentpost.marks x
         WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NULL

-- name: intents
-- get_intents: intents on one resource in a scope or its children, neither superseded nor
-- past their TTL (warnings do not count), in write order. Live intents only (marks_intents).
SELECT id, mark_type, agent_id, scope, created_at, initial_strength, supersedes, resource,
       action, topic, confidence, source, invalidates, severity, priority, blocking,
       resolved_by, failed, body
  FROM agentpost.marks m
 WHERE m.space = %(space)s AND m.mark_type = 'intent' AND m.fades_at >= %(now)s
   AND m.resource = %(resource)s
   AND (m.scope = %(scope)s OR starts_with(m.scope, %(scope)s || '/'))
   AND agentpost.mark_base_strength(m.mark_type, m.initial_strength, m.created_at,
                                    %(now)s, m.half_life, m.ttl, false, m.source) > 0
   AND (SELECT true FROM agentpost.marks x
         WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NULL
 ORDER BY m.created_at, m.seq

-- name: gc
-- gc(grace_period): superseded marks, intents grace seconds past their TTL, resolved needs,
-- observations and warnings whose decay-times-trust strength is below 1e-10 and has been for
-- grace seconds (space.collectable is the same rule in Python). Actions stay (P2).
WITH doomed AS (
    SELECT m.id
      FROM agentpost.marks m
     WHERE m.space = %(space)s
       AND ((SELECT true FROM agentpost.marks x
              WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1)
            OR (m.mark_type = 'need' AND m.resolved_by IS NOT NULL)
            OR (m.mark_type = 'intent'
                AND agentpost.mark_base_strength(m.mark_type, m.initial_strength,
                                                 m.created_at, %(now)s, m.half_life, m.ttl,
                                                 false, m.source) <= 0
                AND %(now)s::float8 - m.created_at >= m.ttl + %(grace)s::float8)
            OR (m.mark_type IN ('observation', 'warning')
                AND agentpost.mark_base_strength(m.mark_type, m.initial_strength,
                                                 m.created_at, %(now)s, m.half_life, m.ttl,
                                                 false, m.source) < %(epsilon)s
                AND (%(grace)s::float8 <= 0
                     OR %(now)s::float8 - m.created_at
                        >= CASE WHEN m.initial_strength > %(epsilon)s
                                THEN m.half_life * (ln(m.initial_strength / %(epsilon)s)
                                                    / ln(2::float8))
                                ELSE 0 END + %(grace)s::float8)))
)
DELETE FROM agentpost.marks d
 USING doomed
 WHERE d.id = doomed.id
RETURNING d.id
