-- The routes page (pages/routes.py). Every query is a probe or a bounded range of an index:
-- routes_recent (sql/0060_web_listings.sql), the routes' primary key, routes_family
-- (root_id, id), the envelopes' primary key and the trail's trail_envelope index.

-- name: recent
SELECT id, root_id, parent_id, actors, current, end_actor, phase, status, progress,
       envelope_id, error, updated_at
  FROM agentpost.routes
 ORDER BY updated_at DESC, id DESC
 LIMIT %(limit)s

-- name: one
SELECT id, root_id, parent_id, actors, current, end_actor, phase, status, progress,
       envelope_id, error, updated_at
  FROM agentpost.routes
 WHERE id = %(id)s

-- name: family
SELECT id, root_id, parent_id, actors, current, end_actor, phase, status, progress,
       envelope_id, error, updated_at
  FROM agentpost.routes
 WHERE root_id = %(root)s
 ORDER BY id
 LIMIT %(limit)s

-- name: hops
-- The WACP envelopes that carried an envelope's hops (ids `asya:{id}:{index}[:{end}]`).
SELECT id, recipient, status, reason, created_at, delivered_at, consumed_at
  FROM agentpost.envelopes
 WHERE id = ANY(%(ids)s)

-- name: phases
-- The route_progress entries of those hops: each phase an actor reported, and when.
SELECT envelope_id, at, record
  FROM agentpost.trail
 WHERE envelope_id = ANY(%(ids)s) AND event = 'route_progress'
 ORDER BY id
 LIMIT %(limit)s
