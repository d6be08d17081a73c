-- Hierarchical reads (Markspace §7.5, §8.2, as the markspace package reads): read(scope)
-- returns the marks of `scope` and of every scope nested under it ("research" reads
-- "research/a" and "research/a/b", never "research2"). mark_read stays the exact-scope read
-- (read(nested=False), the guard's view of one scope) on the indexes of sql/0007;
-- mark_read_tree appends the nested scopes, found as one range of the scope in C order:
-- every name that starts with `scope/` lies in [scope || '/', scope || '0'), since '0'
-- follows '/' in C order, and nothing else does. The indexes below compare scope in the "C"
-- collation whatever the database's, so the range is byte order; a scope without nested
-- marks costs one empty index probe.

-- nested reads by resource, by topic, and of whole scopes (optionally by mark type)
CREATE INDEX marks_tree_resource ON agentpost.marks (space, resource, (scope COLLATE "C"), fades_at)
    WHERE resource IS NOT NULL;
CREATE INDEX marks_tree_topic ON agentpost.marks (space, topic, (scope COLLATE "C"), fades_at)
    WHERE topic IS NOT NULL;
CREATE INDEX marks_tree ON agentpost.marks (space, (scope COLLATE "C"), mark_type, fades_at);

CREATE FUNCTION agentpost.mark_read_tree(p_space text, p_scope text, p_resource text, p_topic text,
                                    p_mark_type text, p_min float8, p_now float8,
                                    p_prune float8)
RETURNS TABLE (id uuid, mark_type text, agent_id uuid, scope text, created_at float8,
               initial_strength float8, supersedes uuid, resource text, action text,
               topic text, confidence float8, source text, invalidates uuid, severity text,
               priority float8, blocking boolean, resolved_by uuid, failed boolean, body json,
               strength float8)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lo text := p_scope || '/';
    hi text := p_scope || '0';
    nested boolean;
BEGIN
    -- the exact scope as mark_read (sql/0007) reads it, on the same indexes; then, if the
    -- space holds marks of any scope nested under it (one probe of marks_tree: far cheaper
    -- than starting the strength query), those scopes, one C-order range of the tree indexes
    nested := EXISTS (SELECT 1 FROM agentpost.marks x
                       WHERE x.space = p_space
                         AND x.scope COLLATE "C" >= lo AND x.scope COLLATE "C" < hi);
    IF p_resource IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE ARRAY[m.scope, m.resource] = ARRAY[p_scope, p_resource]
           AND m.resource IS NOT NULL AND m.fades_at >= p_prune
           AND (p_topic IS NULL OR m.topic = p_topic)
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
           AND m.strength > 0 AND m.strength >= p_min;
        IF nested THEN
            RETURN QUERY
            SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
                   m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
                   m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
                   m.body, m.strength
              FROM agentpost.marks_at(p_space, p_now) m
             WHERE m.resource = p_resource
               AND m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND m.fades_at >= p_prune
               AND (p_topic IS NULL OR m.topic = p_topic)
               AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
               AND m.strength > 0 AND m.strength >= p_min;
        END IF;
    ELSIF p_topic IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE ARRAY[m.scope, m.topic] = ARRAY[p_scope, p_topic]
           AND m.topic IS NOT NULL AND m.fades_at >= p_prune
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
           AND m.strength > 0 AND m.strength >= p_min;
        IF nested THEN
            RETURN QUERY
            SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
                   m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
                   m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
                   m.body, m.strength
              FROM agentpost.marks_at(p_space, p_now) m
             WHERE m.topic = p_topic
               AND m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND m.fades_at >= p_prune
               AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
               AND m.strength > 0 AND m.strength >= p_min;
        END IF;
    ELSIF p_mark_type IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE m.scope = p_scope AND m.mark_type = p_mark_type AND m.fades_at >= p_prune
           AND m.strength > 0 AND m.strength >= p_min;
        IF nested THEN
            RETURN QUERY
            SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
                   m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
                   m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
                   m.body, m.strength
              FROM agentpost.marks_at(p_space, p_now) m
             WHERE m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND m.mark_type = p_mark_type AND m.fades_at >= p_prune
               AND m.strength > 0 AND m.strength >= p_min;
        END IF;
    ELSE
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE m.scope = p_scope AND m.fades_at >= p_prune
           AND m.strength > 0 AND m.strength >= p_min;
        IF nested THEN
            RETURN QUERY
            SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
                   m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
                   m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
                   m.body, m.strength
              FROM agentpost.marks_at(p_space, p_now) m
             WHERE m.scope COLLATE "C" >= lo AND m.scope COLLATE "C" < hi
               AND m.fades_at >= p_prune
               AND m.strength > 0 AND m.strength >= p_min;
        END IF;
    END IF;
END $$;
