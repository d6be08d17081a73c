-- read(min_strength <= 0) returns marks at strength 0 too (Markspace §8.2: only marks with
-- effective_strength < min_strength are excluded), never superseded ones (§10: invisible),
-- as the markspace package does: expired intents, resolved need copies, fully invalidated
-- marks, marks written at strength 0. A threshold > 0 reads as before (strength >= p_min > 0).
--
-- The read functions mark_read (sql/0007) and mark_read_tree (sql/0067) are replaced by one,
-- mark_read_at (p_nested says which), with the strength rule in one place (mark_reads).
-- Each branch keeps its access path: the exact scope on the indexes of sql/0007, the nested
-- scopes on the C-collation indexes of sql/0067. fades_at pruning is
-- the caller's (p_prune): -Infinity when p_min <= 0, since faded marks may then qualify.

-- A row of a read: the mark's columns (postgres.MARK_COLUMNS), then its effective strength.
CREATE TYPE agentpost.mark_read_row AS (
    id uuid, mark_type text, agent_id uuid, scope text, created_at float8,
    initial_strength float8, supersedes uuid, resource text, action text,
    topic text, confidence float8, source text, invalidates uuid, severity text,
    priority float8, blocking boolean, resolved_by uuid, failed boolean, body json,
    strength float8
);

-- marks_at rows as a read returns them: not pruned by fades_at, strength >= p_min, and at
-- strength 0 (only reachable with p_min <= 0) not superseded. marks_at gives a superseded
-- mark strength 0 without saying why, hence the probe (marks_supersedes), made only for rows
-- at 0. A SQL function, inlined with marks_at into each query below, so the callers'
-- conditions and the fades_at bound reach the indexes.
CREATE FUNCTION agentpost.mark_reads(p_space text, p_now float8, p_min float8, p_prune float8)
RETURNS SETOF agentpost.mark_read_row
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
           m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
           m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
           m.body, m.strength
      FROM agentpost.marks_at(p_space, p_now) m
     WHERE m.fades_at >= p_prune AND m.strength >= p_min
       AND (m.strength > 0
            OR (p_min <= 0 AND (SELECT true FROM agentpost.marks x
                                 WHERE x.space = p_space AND x.supersedes = m.id
                                 LIMIT 1) IS NULL));
$$;

-- read(): the marks of p_scope (and, with p_nested, of every scope nested under it: the
-- C-order range [p_scope || '/', p_scope || '0'), see sql/0067) matching the filters, by
-- mark_reads' rule. plpgsql so each branch's plan is made once per session; one branch per
-- access path: (scope, resource), (scope, topic), (scope, mark_type), (scope). The nested
-- query runs only when one probe of marks_tree finds a nested mark.
CREATE FUNCTION agentpost.mark_read_at(p_space text, p_scope text, p_nested boolean,
                                       p_resource text, p_topic text, p_mark_type text,
                                       p_min float8, p_now float8, p_prune float8)
RETURNS SETOF agentpost.mark_read_row
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lo text := p_scope || '/';
    hi text := p_scope || '0';
    nested boolean := p_nested AND EXISTS (
        SELECT 1 FROM agentpost.marks x
         WHERE x.space = p_space AND x.scope COLLATE "C" >= lo AND x.scope COLLATE "C" < hi);
BEGIN
    IF p_resource IS NOT NULL THEN
        RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
         WHERE ARRAY[m.scope, m.resource] = ARRAY[p_scope, p_resource]
           AND m.resource IS NOT NULL AND (p_topic IS NULL OR m.topic = p_topic)
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type);
        IF nested THEN
            RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
             WHERE m.resource = p_resource AND m.scope COLLATE "C" >= lo
               AND m.scope COLLATE "C" < hi AND (p_topic IS NULL OR m.topic = p_topic)
               AND (p_mark_type IS NULL OR m.mark_type = p_mark_type);
        END IF;
    ELSIF p_topic IS NOT NULL THEN
        RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
         WHERE ARRAY[m.scope, m.topic] = ARRAY[p_scope, p_topic] AND m.topic IS NOT NULL
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type);
        IF nested THEN
            RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
             WHERE m.topic = p_topic AND m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND (p_mark_type IS NULL OR m.mark_type = p_mark_type);
        END IF;
    ELSIF p_mark_type IS NOT NULL THEN
        RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
         WHERE m.scope = p_scope AND m.mark_type = p_mark_type;
        IF nested THEN
            RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
             WHERE m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND m.mark_type = p_mark_type;
        END IF;
    ELSE
        RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
         WHERE m.scope = p_scope;
        IF nested THEN
            RETURN QUERY SELECT m.* FROM agentpost.mark_reads(p_space, p_now, p_min, p_prune) m
             WHERE m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi;
        END IF;
    END IF;
END $$;

-- Replaced by mark_read_at (queries.sql calls it with p_nested false for read_exact and the
-- guard's read_with_claims, true for read).
DROP FUNCTION agentpost.mark_read(text, text, text, text, text, float8, float8, float8);
DROP FUNCTION agentpost.mark_read_tree(text, text, text, text, text, float8, float8, float8);
