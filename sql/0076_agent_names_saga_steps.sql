-- Agent names and settled saga steps (issue 22 §5).
--
-- Agent names. The mark space keeps an agent by its id on every mark; its name lived only in
-- the writing process (`Agent.name`), so the page could name an agent only when its id was
-- derived from a name it could guess. mark_agents records, per space, the name each agent
-- id last wrote under: mark_write gains a variant taking the batch's agents (ids and names)
-- that records them in the same call, before the marks are inserted, and a fleet apply
-- records its agents' names through mark_name_agents. Recording is cheap by construction:
-- a process sends an agent's name only until it is recorded (PostgresMarkSpace remembers,
-- per process, what it recorded, and then calls the plain mark_write); an agent already
-- recorded under that name costs one primary-key probe and writes nothing; only a first
-- write, or a write under another name (a rename: the newest name wins), inserts or updates
-- the row, and it never waits for another transaction (see mark_name_agents).
-- Names are cut to 200 characters; an empty name is not recorded. Rows are never deleted
-- by gc(): a name stays known for the marks the agent left.
--
-- Saga steps. _saga_steps_json said `pending` for every step whose command had not executed,
-- whatever the saga's state. A step is pending only while it can still execute: in a running
-- saga, with a command that has not ended. A command that ended without executing (failed,
-- rejected, canceled, or its confirmation declined), or any unexecuted step of a saga that
-- stopped running steps (compensating, compensated, escalated: it plans no step again), has
-- nothing to undo and never will: its compensation is `not_needed`. Every reader of the
-- saga's JSON (saga_view and every saga function's result: SagaView, the commands page and
-- its JSON API, the saga operators, plain SQL) now gets the same answer.

CREATE TABLE agentpost.mark_agents (
    space    text NOT NULL,
    agent_id uuid NOT NULL,
    name     text NOT NULL CHECK (name <> '' AND length(name) <= 200),
    named_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (space, agent_id)
);

-- an id's names in any space, newest first (the pages look agents up by id)
CREATE INDEX mark_agents_agent ON agentpost.mark_agents (agent_id, named_at DESC);

-- Record that the agents p_ids[k] write under p_names[k] in p_space (the last name given
-- for an id wins): `recorded` rows were inserted or renamed, `skipped` names were left to
-- another transaction. A name is recorded under a transaction-scoped advisory lock on
-- (space, agent id), so a write never waits on another transaction's uncommitted name row
-- (two guard transactions writing one new agent at once would otherwise serialize, or
-- deadlock on their resource locks): without p_wait (a mark write), a name another
-- transaction is recording right now is skipped, to be recorded by that transaction or by
-- the agent's next write; with p_wait (a fleet apply) it waits.
CREATE FUNCTION agentpost.mark_name_agents(p_space text, p_ids uuid[], p_names text[],
                                           p_wait boolean, OUT recorded integer,
                                           OUT skipped integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_name text;
    v_key bigint;
    v_rows integer;
BEGIN
    recorded := 0;
    skipped := 0;
    FOR v_id, v_name IN
        SELECT x.id, x.name
          FROM (SELECT DISTINCT ON (g.id) g.id,
                       CASE WHEN length(g.name) > 200 THEN left(g.name, 199) || '…'
                            ELSE g.name END AS name
                  FROM unnest(p_ids, p_names) WITH ORDINALITY AS g(id, name, k)
                 WHERE g.id IS NOT NULL AND g.name IS NOT NULL AND g.name <> ''
                 ORDER BY g.id, g.k DESC) x
         WHERE NOT EXISTS (SELECT 1 FROM agentpost.mark_agents o
                            WHERE o.space = p_space AND o.agent_id = x.id AND o.name = x.name)
         ORDER BY x.id
    LOOP
        v_key := hashtextextended('agentpost.mark_agents:' || json_build_array(p_space, v_id), 0);
        IF p_wait THEN
            PERFORM pg_advisory_xact_lock(v_key);
        ELSIF NOT pg_try_advisory_xact_lock(v_key) THEN
            skipped := skipped + 1;
            CONTINUE;
        END IF;
        INSERT INTO agentpost.mark_agents AS a (space, agent_id, name)
        VALUES (p_space, v_id, v_name)
        ON CONFLICT (space, agent_id) DO UPDATE
           SET name = excluded.name, named_at = clock_timestamp()
         WHERE a.name IS DISTINCT FROM excluded.name;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        recorded := recorded + v_rows;
    END LOOP;
END $$;

-- mark_write (sql/0066) with the batch's agents recorded in the same call; `named` says
-- every name is recorded as given (false: one was left to another transaction), so a
-- process can remember what it need not send again.
CREATE FUNCTION agentpost.mark_write(p_space text, p_now float8, p_rows json,
                                     p_agent_ids uuid[], p_agent_names text[])
RETURNS TABLE (n bigint, id uuid, created_at float8, named boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_skipped integer;
BEGIN
    SELECT r.skipped INTO v_skipped
      FROM agentpost.mark_name_agents(p_space, p_agent_ids, p_agent_names, false) r;
    RETURN QUERY SELECT w.n, w.id, w.created_at, v_skipped = 0
                   FROM agentpost.mark_write(p_space, p_now, p_rows) w;
END $$;

-- The steps with their commands. compensation: pending (a running saga's step whose command
-- has not executed and has not ended: nothing to undo so far), not_needed (its command ended
-- without executing, or the saga stopped running steps: nothing to undo, ever), recorded
-- (executed; due once the saga compensates), compensated, escalated, none (executed, no
-- handler).
CREATE OR REPLACE FUNCTION agentpost._saga_steps_json(p_saga text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'position', st.position, 'name', st.name, 'command_key', st.command_key,
                'action', st.action,
                'command_id', c.id, 'command_state', c.state, 'handler', st.handler,
                'args', st.args, 'attempts', st.attempts, 'attempt_base', st.attempt_base,
                'compensation_command_id', st.compensation_id, 'last_error', st.last_error,
                'compensation', CASE
                    WHEN c.state = 'compensated' THEN 'compensated'
                    WHEN c.state IS DISTINCT FROM 'executed' THEN
                        CASE WHEN s.state = 'running' AND NOT coalesce(c.declined, false)
                                  AND coalesce(c.state, '') NOT IN ('failed', 'rejected',
                                                                    'canceled')
                             THEN 'pending' ELSE 'not_needed' END
                    WHEN st.handler IS NULL THEN 'none'
                    WHEN st.escalated THEN 'escalated'
                    ELSE 'recorded' END) ORDER BY st.position), '[]'::jsonb)
              FROM agentpost.saga_steps st
              JOIN agentpost.sagas s ON s.id = st.saga_id
              LEFT JOIN agentpost.commands c
                ON c.workspace = st.workspace AND c.idempotency_key = st.command_key
             WHERE st.saga_id = p_saga);
END $$;
