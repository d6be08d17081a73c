-- The mark space pages of the web UI (docs/ui.md, "The mark space"): what they list must
-- come from an index in the order shown, so a page costs the same with 100 marks in a space
-- as with 100,000.

-- A scope's marks, newest first, paged by seq (write order). marks_scope starts with
-- (space, scope) too, but its order is (mark_type, fades_at): listing a scope by it would
-- sort every mark of the scope. The scope is indexed as a one-element array, which only the
-- pages' queries compare (ARRAY[scope] = ARRAY[...]), as 0007 does for (scope, resource): on
-- a plain (space, scope, seq) the planner would also take this index for the store's reads
-- of a scope (mark_read), which need marks_scope to skip faded marks in the index.
CREATE INDEX marks_scope_recent ON agentpost.marks (space, (ARRAY[scope]), seq);

-- The latest verdicts of a space (and the outcome counts over them), newest boundary first.
-- The primary key starts with the space but orders by (scope, resource, agent_id).
CREATE INDEX mark_verdicts_recent ON agentpost.mark_verdicts (space, boundary);

-- What a page needs to recompute a mark's effective strength at any time, as marks_at does
-- (sql/0007): whether some mark supersedes it (then 0), and the decay terms of the
-- unsuperseded warnings that invalidate it, [initial_strength, created_at, half_life] in
-- write order. SQL, single SELECT, STABLE: inlined into the page queries.
CREATE FUNCTION agentpost.mark_decay_terms(p_space text, p_id uuid)
RETURNS TABLE (superseded boolean, warnings json)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (SELECT true FROM agentpost.marks x
             WHERE x.space = p_space AND x.supersedes = p_id LIMIT 1) IS NOT NULL,
           (SELECT json_agg(json_build_array(w.initial_strength, w.created_at, w.half_life)
                            ORDER BY w.seq)
              FROM agentpost.marks w
             WHERE w.space = p_space AND w.invalidates = p_id AND w.mark_type = 'warning'
               AND (SELECT true FROM agentpost.marks y
                     WHERE y.space = p_space AND y.supersedes = w.id LIMIT 1) IS NULL);
$$;

-- How many marks a space (p_scope NULL) or one of its scopes holds, counted up to p_cap: a
-- walk of marks_clock or marks_scope_recent that stops at the cap. Bitmap and sequential
-- scans are off inside: on a table without statistics (autovacuum off, or too young) the
-- planner takes a space for a few rows and would collect every one of its marks, sorted,
-- before the LIMIT.
CREATE FUNCTION agentpost.mark_count_upto(p_space text, p_scope text, p_cap integer)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_seqscan = off AS $$
BEGIN
    IF p_scope IS NULL THEN
        RETURN (SELECT count(*) FROM (SELECT 1 FROM agentpost.marks m
                                       WHERE m.space = p_space
                                       ORDER BY m.created_at LIMIT p_cap) c);
    END IF;
    RETURN (SELECT count(*) FROM (SELECT 1 FROM agentpost.marks m
                                   WHERE m.space = p_space
                                     AND ARRAY[m.scope] = ARRAY[p_scope]
                                   ORDER BY m.seq LIMIT p_cap) c);
END $$;
