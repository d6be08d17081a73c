-- A resolution boundary looks its intents up by id (issue "Flat cost as the store grows":
-- resolve_deferred over 1,000 resources took 8 s at 100,000 marks and 66 s at 1,000,000).
-- 0014's check that every verdict names an intent of its agent on (scope, resource) was a
-- NOT EXISTS over marks with all of those conditions; store sessions use generic plans, and
-- the generic plan walked every intent of the space (marks_intents on `space`) and filtered
-- on scope and resource, for every boundary. Now each intent is fetched by primary key and
-- its fields are compared after, which no plan can turn into a scan. Same result: NULL and
-- nothing changed when an intent_id names no such intent, else the boundary's number.
CREATE OR REPLACE FUNCTION agentpost.mark_record_boundary(p_space text, p_scope text,
                                                          p_resource text, p_now float8,
                                                          p_rows json)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    b bigint;
BEGIN
    IF EXISTS (SELECT 1
                 FROM json_to_recordset(p_rows) AS r(agent_id uuid, intent_id uuid)
                 LEFT JOIN LATERAL (SELECT m.space, m.agent_id, m.mark_type, m.scope,
                                           m.resource
                                      FROM agentpost.marks m
                                     WHERE m.id = r.intent_id) m ON true
                WHERE m.space IS DISTINCT FROM p_space
                   OR m.agent_id IS DISTINCT FROM r.agent_id
                   OR m.mark_type IS DISTINCT FROM 'intent'
                   OR m.scope IS DISTINCT FROM p_scope
                   OR m.resource IS DISTINCT FROM p_resource) THEN
        RETURN NULL;
    END IF;
    b := nextval('agentpost.mark_boundaries');
    DELETE FROM agentpost.mark_verdicts
     WHERE space = p_space AND scope = p_scope AND resource = p_resource;
    DELETE FROM agentpost.mark_verdicts WHERE space = p_space AND expires_at < p_now;
    INSERT INTO agentpost.mark_verdicts (space, scope, resource, agent_id, boundary, allowed,
                                         intent_id, winner_id, decided_at, expires_at)
    SELECT p_space, p_scope, p_resource, r.agent_id, b, r.allowed, r.intent_id, r.winner_id,
           p_now, m.created_at + m.ttl
      FROM json_to_recordset(p_rows) AS r(agent_id uuid, allowed boolean, intent_id uuid,
                                          winner_id uuid)
      JOIN agentpost.marks m ON m.id = r.intent_id;
    RETURN b;
END $$;
