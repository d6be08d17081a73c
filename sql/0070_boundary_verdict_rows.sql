-- A resolution boundary writes its verdicts with each intent fetched by id (bench marks:
-- resolve_deferred over 1,000 resources took 6 s at 10,000 marks, 29 s at 100,000 and 170 s
-- at 1,000,000 on a fresh store, 3 s at every size once statistics were fresh). 0056 made
-- the boundary's check fetch each intent by primary key, but the INSERT of the verdicts
-- still joined the marks table; with statistics taken while the store was small, that join
-- was planned as a hash join over a sequential scan of every mark, once per boundary. A
-- scalar subquery per verdict row can only run as a primary-key probe. Same rows: the check
-- before it guarantees every intent_id names an intent of the space.
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
           p_now, (SELECT m.created_at + m.ttl FROM agentpost.marks m
                    WHERE m.id = r.intent_id)
      FROM json_to_recordset(p_rows) AS r(agent_id uuid, allowed boolean, intent_id uuid,
                                          winner_id uuid);
    RETURN b;
END $$;
