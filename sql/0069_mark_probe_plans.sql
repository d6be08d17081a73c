-- Two probes of sql/0007 walked a whole space when the statistics were taken while the
-- space was small (tests/test_marks_read_plans.py found them; the planner then rates every
-- index of marks alike):
--
-- * mark_adjusted_strength's warnings against a mark walked marks_tree on
--   (space, mark_type = 'warning'), testing invalidates row by row: every warning of the
--   space, for every mark a read computes; and each warning's supersession test (NOT
--   EXISTS) became a walk of every supersedes entry of the space.
-- * mark_claims' supersession test (NOT EXISTS) walked every supersedes entry of the
--   space for each action holding the resource.
--
-- The fix is 0007's own rule for the mark's supersession test: a scalar subquery with
-- LIMIT 1, which the planner can only run as a probe per row. The warning type moves from
-- the WHERE clause to the aggregate's FILTER, so the only index conditions left are
-- (space, invalidates), which marks_invalidates matches in full and no other index does.
-- Same results: the same rows are summed in the same order.

CREATE OR REPLACE FUNCTION agentpost.mark_adjusted_strength(p_space text, p_id uuid,
                                                            p_base float8, p_now float8)
RETURNS TABLE (strength float8)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
               WHEN p_base <= 0 THEN 0::float8
               WHEN (SELECT true FROM agentpost.marks x
                      WHERE x.space = p_space AND x.supersedes = p_id LIMIT 1) THEN 0::float8
               ELSE greatest(0::float8, p_base - coalesce((
                   SELECT agentpost._mark_sum(
                              agentpost.mark_base_strength(w.mark_type, w.initial_strength,
                                  w.created_at, p_now, w.half_life, w.ttl, false, w.source)
                              ORDER BY w.seq) FILTER (WHERE w.mark_type = 'warning')
                     FROM agentpost.marks w
                    WHERE w.space = p_space AND w.invalidates = p_id
                      AND (SELECT true FROM agentpost.marks y
                            WHERE y.space = p_space AND y.supersedes = w.id LIMIT 1) IS NULL),
                   0))
           END;
$$;

CREATE OR REPLACE FUNCTION agentpost.mark_claims(p_space text, p_scope text, p_resource text)
RETURNS SETOF agentpost.marks
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT m.* FROM agentpost.marks m
     WHERE m.space = p_space AND ARRAY[m.scope, m.resource] = ARRAY[p_scope, p_resource]
       AND m.resource IS NOT NULL AND m.fades_at >= 'Infinity'::float8 AND m.failed = false
       AND (SELECT true FROM agentpost.marks x
             WHERE x.space = m.space AND x.supersedes = m.id LIMIT 1) IS NULL
     ORDER BY m.seq;
END $$;
