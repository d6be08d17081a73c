-- Watching a superseded mark (Markspace §13.3-§13.4, as the markspace package does it): a
-- mark that supersedes another is queued for every subscriber whose patterns match either
-- mark, so whoever watched the old mark learns it was replaced even when the new one moved
-- (another topic, resource or scope). mark_write as in sql/0007_marks.sql but for the
-- watched CTE; get_watched_marks (marks/queries.sql) applies the same either-mark rule.

CREATE OR REPLACE FUNCTION agentpost.mark_write(p_space text, p_now float8, p_rows json)
RETURNS TABLE (n bigint, id uuid, created_at float8)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH rows AS MATERIALIZED (
        -- nextval after the sort (volatile expressions are), so seq follows the batch order
        SELECT r.*, nextval('agentpost.marks_seq') AS seq
          FROM ROWS FROM (json_to_recordset(p_rows) AS (
                   mark_type text, agent_id uuid, scope text, initial_strength float8,
                   supersedes uuid, resource text, action text, topic text,
                   confidence float8, source text, invalidates uuid, severity text,
                   priority float8, blocking boolean, resolved_by uuid, failed boolean,
                   half_life float8, ttl float8, life float8, visibility text, body json))
               WITH ORDINALITY AS r(mark_type, agent_id, scope, initial_strength,
                                    supersedes, resource, action, topic, confidence, source,
                                    invalidates, severity, priority, blocking, resolved_by,
                                    failed, half_life, ttl, life, visibility, body, n)
         ORDER BY r.n
    ), clock AS (
        SELECT greatest(p_now, max(m.created_at)) AS t
          FROM agentpost.marks m
         WHERE m.space = p_space
    ), ins AS (
        INSERT INTO agentpost.marks AS m (id, space, seq, mark_type, agent_id, scope,
                                          created_at, initial_strength, supersedes, resource,
                                          action, topic, confidence, source, invalidates,
                                          severity, priority, blocking, resolved_by, failed,
                                          half_life, ttl, fades_at, body)
        SELECT agentpost.mark_id(r.seq), p_space, r.seq, r.mark_type, r.agent_id, r.scope,
               c.t, r.initial_strength, r.supersedes, r.resource, r.action, r.topic,
               r.confidence, r.source, r.invalidates, r.severity, r.priority, r.blocking,
               r.resolved_by, r.failed, r.half_life, r.ttl,
               agentpost._mark_fades_at(c.t, r.life), r.body
          FROM rows r CROSS JOIN clock c
        RETURNING m.id, m.seq, m.created_at, m.agent_id, m.scope, m.mark_type, m.topic,
                  m.resource
    ), watched AS (
        INSERT INTO agentpost.mark_watch (space, agent_id, seq, mark_id, projected)
        SELECT p_space, s.agent_id, i.seq, i.id,
               r.visibility = 'protected'
               AND NOT agentpost.mark_can_read(s.read_scopes, i.scope)
          FROM ins i
          JOIN rows r ON r.seq = i.seq
          LEFT JOIN agentpost.marks t ON t.id = r.supersedes AND t.space = p_space
          JOIN agentpost.mark_subscriptions s ON s.space = p_space
         WHERE s.agent_id <> i.agent_id
           AND (agentpost.mark_watch_matches(s.patterns, i.scope, i.mark_type, i.topic,
                                             i.resource)
                OR (t.id IS NOT NULL
                    AND agentpost.mark_watch_matches(s.patterns, t.scope, t.mark_type,
                                                     t.topic, t.resource)))
           AND (r.visibility <> 'classified'
                OR agentpost.mark_can_read(s.read_scopes, i.scope))
    )
    SELECT r.n, i.id, i.created_at FROM ins i JOIN rows r ON r.seq = i.seq;
END $$;
