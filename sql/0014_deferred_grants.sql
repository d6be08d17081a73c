-- Verdicts of deferred resolution boundaries (Markspace §6.2.1 phase 3; P12, P16, P17), kept
-- with the space they were decided in, so that every process and every Guard sees them: the
-- boundary may run in a scheduled task while agents act from others.
--
-- One row per agent that had an active intent on (space, scope, resource) at the latest
-- boundary there. A boundary replaces every row of its (space, scope, resource), so at most
-- one unconsumed ALLOW exists per resource at any time (P17). An ALLOW is used once: the
-- winner's action sets consumed_by in the transaction that writes the action. A verdict is
-- about one intent and ends with it: expires_at is the intent's created_at + its TTL, as
-- stored on the mark (agentpost.marks.ttl); reads ignore rows past it, and the next boundary
-- of the space deletes them.

CREATE SEQUENCE agentpost.mark_boundaries AS bigint;

CREATE TABLE agentpost.mark_verdicts (
    space       text    NOT NULL,
    scope       text    NOT NULL,
    resource    text    NOT NULL,
    agent_id    uuid    NOT NULL,
    -- the boundary that decided it (agentpost.mark_boundaries: later boundaries are larger)
    boundary    bigint  NOT NULL,
    allowed     boolean NOT NULL,
    -- the agent's intent the verdict is about, and the intent that won (NULL: no winner)
    intent_id   uuid    NOT NULL,
    winner_id   uuid,
    decided_at  float8  NOT NULL,
    expires_at  float8  NOT NULL,
    -- the action that used an ALLOW
    consumed_by uuid,
    PRIMARY KEY (space, scope, resource, agent_id),
    CHECK (allowed OR consumed_by IS NULL)
);
-- the expired verdicts of a space, deleted at its next boundary
CREATE INDEX mark_verdicts_expiry ON agentpost.mark_verdicts (space, expires_at);

-- A boundary on (p_space, p_scope, p_resource) at p_now: its verdicts (a JSON array of
-- {agent_id, allowed, intent_id, winner_id}) replace the previous boundary's there. Every
-- intent_id must name an intent of that agent in the space, on that scope and resource (its
-- TTL comes from the mark); if one does not, nothing changes and the result is NULL. Returns the boundary's
-- number.
CREATE FUNCTION agentpost.mark_record_boundary(p_space text, p_scope text, p_resource text,
                                               p_now float8, p_rows json)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    b bigint;
BEGIN
    IF EXISTS (SELECT 1
                 FROM json_to_recordset(p_rows) AS r(agent_id uuid, intent_id uuid)
                WHERE NOT EXISTS (SELECT 1 FROM agentpost.marks m
                                   WHERE m.id = r.intent_id AND m.space = p_space
                                     AND m.agent_id = r.agent_id
                                     AND m.mark_type = 'intent' AND m.scope = p_scope
                                     AND m.resource = p_resource)) THEN
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
