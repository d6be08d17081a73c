-- Statements of the mark space pages (agentpost.web.pages.marks). Every list is LIMITed and
-- read in the order of an index (sql/0007_marks.sql, sql/0058_mark_pages.sql); counts are
-- capped, so no page counts a whole space. The now parameter is the page's render clock.

-- name: spaces
-- The spaces that hold marks: a loose index scan of marks_clock (one probe per space), each
-- with its number of marks counted up to a cap (sql/0058).
WITH RECURSIVE s(space) AS (
    (SELECT m.space FROM agentpost.marks m ORDER BY m.space LIMIT 1)
    UNION ALL
    SELECT (SELECT m.space FROM agentpost.marks m WHERE m.space > s.space
             ORDER BY m.space LIMIT 1)
      FROM s WHERE s.space IS NOT NULL
)
SELECT s.space,
       agentpost.mark_count_upto(s.space, NULL, %(cap)s)
  FROM s WHERE s.space IS NOT NULL
 LIMIT %(limit)s

-- name: space_exists
SELECT EXISTS (SELECT 1 FROM agentpost.marks WHERE space = %(space)s)

-- name: scopes
-- The scopes of a space, loosely scanned on marks_scope (one probe per scope), with capped
-- counts.
WITH RECURSIVE s(scope) AS (
    (SELECT m.scope FROM agentpost.marks m WHERE m.space = %(space)s
      ORDER BY m.scope LIMIT 1)
    UNION ALL
    SELECT (SELECT m.scope FROM agentpost.marks m WHERE m.space = %(space)s
               AND m.scope > s.scope ORDER BY m.scope LIMIT 1)
      FROM s WHERE s.scope IS NOT NULL
)
SELECT s.scope,
       agentpost.mark_count_upto(%(space)s, s.scope, %(cap)s)
  FROM s WHERE s.scope IS NOT NULL
 LIMIT %(limit)s

-- name: marks
-- Marks of a space with their strength at now and what the page needs to recompute it, by
-- filter: one page of a scope's marks (`scope`), newest first, seq below `before`
-- (marks_scope_recent); the newest of the whole space, its default view (marks_clock); one
-- mark (`id`, by primary key). A filter given as NULL drops out when Postgres plans the
-- statement (the driver sends values inline, so the NULL tests and CASEs are constants), and
-- so does the other view's ORDER BY term: the lists get the plans of queries written for
-- them alone (one mark only adds a sort of its one row).
SELECT m.id, m.seq, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
       m.resource, m.action, m.topic, m.confidence, m.source, m.priority, m.blocking,
       m.resolved_by, m.failed, m.supersedes, m.invalidates, m.half_life, m.ttl, m.body,
       d.superseded, d.warnings, s.strength
  FROM agentpost.marks m
 CROSS JOIN LATERAL agentpost.mark_decay_terms(m.space, m.id) d
 CROSS JOIN LATERAL agentpost.mark_adjusted_strength(
           m.space, m.id,
           agentpost.mark_base_strength(m.mark_type, m.initial_strength, m.created_at,
                                        %(now)s, m.half_life, m.ttl,
                                        m.resolved_by IS NOT NULL, m.source),
           %(now)s) s
 WHERE m.space = %(space)s
   AND (%(id)s::uuid IS NULL OR m.id = %(id)s::uuid)
   AND (%(scope)s::text IS NULL OR ARRAY[m.scope] = ARRAY[%(scope)s::text])
   AND (%(before)s::bigint IS NULL OR m.seq < %(before)s)
 ORDER BY CASE WHEN %(scope)s::text IS NULL THEN m.created_at END DESC,
          CASE WHEN %(scope)s::text IS NULL THEN m.id END DESC,
          CASE WHEN %(scope)s::text IS NOT NULL THEN m.seq END DESC
 LIMIT %(limit)s

-- name: intents
-- Live intents of a space, or of one scope when `scope` is given, the latest first: the
-- newest `window` by TTL end, walked backwards on marks_intents (a space) or marks_scope (a
-- scope; intents fade at their TTL), then the superseded ones dropped; each with the verdict
-- its agent holds on the resource (the current boundary's, if any).
SELECT m.id, m.agent_id, m.resource, m.action, m.confidence, m.created_at, m.ttl,
       v.allowed, v.winner_id, v.boundary, v.intent_id = m.id AS decided, m.scope
  FROM (SELECT * FROM agentpost.marks c
         WHERE c.space = %(space)s AND (%(scope)s::text IS NULL OR c.scope = %(scope)s)
           AND c.mark_type = 'intent' AND c.fades_at >= %(now)s
         ORDER BY c.fades_at DESC LIMIT %(window)s) m
  LEFT JOIN agentpost.mark_verdicts v
         ON v.space = m.space AND v.scope = m.scope AND v.resource = m.resource
        AND v.agent_id = m.agent_id
 WHERE (SELECT true FROM agentpost.marks x
         WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NULL
 ORDER BY m.fades_at DESC
 LIMIT %(limit)s

-- name: verdicts
-- The latest verdicts of a space (mark_verdicts_recent), newest boundary first; only those
-- of one scope when `scope` is given.
SELECT scope, resource, agent_id, intent_id, allowed, winner_id, boundary, decided_at,
       expires_at, consumed_by
  FROM agentpost.mark_verdicts
 WHERE space = %(space)s AND (%(scope)s::text IS NULL OR scope = %(scope)s)
 ORDER BY boundary DESC
 LIMIT %(limit)s

-- name: verdict_outcomes
-- Outcome counts over the space's latest verdicts (at most `sample`).
SELECT outcome, count(*)
  FROM (SELECT CASE WHEN allowed AND consumed_by IS NOT NULL THEN 'won, acted'
                    WHEN allowed THEN 'won'
                    WHEN winner_id IS NULL THEN 'no winner'
                    ELSE 'lost' END AS outcome
          FROM agentpost.mark_verdicts
         WHERE space = %(space)s AND (%(scope)s::text IS NULL OR scope = %(scope)s)
         ORDER BY boundary DESC
         LIMIT %(sample)s) v
 GROUP BY outcome

-- name: open_needs
-- Open needs among the newest `window` need marks not resolved (marks_needs, walked
-- backwards), of one scope when given: those a later mark supersedes (the originals of
-- resolved needs) are dropped after the walk.
SELECT m.id, m.agent_id, m.scope, m.created_at, m.initial_strength, m.priority, m.blocking,
       m.body
  FROM (SELECT * FROM agentpost.marks c
         WHERE c.space = %(space)s AND c.mark_type = 'need' AND c.resolved_by IS NULL
           AND (%(scope)s::text IS NULL OR c.scope = %(scope)s)
         ORDER BY c.seq DESC LIMIT %(window)s) m
 WHERE (SELECT true FROM agentpost.marks x
         WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NULL
 ORDER BY m.seq DESC
 LIMIT %(limit)s

-- name: need_state
-- A need's state for the resolve action: type, scope, body, and whether it is resolved.
SELECT m.mark_type, m.scope, m.body,
       m.resolved_by IS NOT NULL
       OR (SELECT true FROM agentpost.marks x
            WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NOT NULL
  FROM agentpost.marks m
 WHERE m.id = %(id)s AND m.space = %(space)s

-- name: trail_resolution
-- The trail entry of a need resolved by a person (WACP §3: hash-chained and signed like
-- every entry), on the person's human-highway chain, in the resolution's own transaction.
-- The session signs with pads set for this transaction only (the mark space's sessions
-- carry no trail key).
SELECT set_config('agentpost.mac_ipad', %(ipad)s, true),
       set_config('agentpost.mac_opad', %(opad)s, true);
SELECT agentpost._trail_one(%(chain)s, 'need_resolved_by_human', NULL, %(body)s::jsonb)
