-- Sagas (issue 5): a sequence of commands in one unit of work, each step recording its
-- compensation as it executes; on a later failure the executed steps are compensated in
-- reverse order, each compensation a `compensate` command of the ledger (sql/0008).
--
-- A step is planned (this file) before its command is submitted: the step row names the
-- command by its idempotency key, `saga:<saga id>/<step name>`, and carries the compensation
-- (a handler name and JSON args). The compensation is *recorded* exactly when that command is
-- `executed`: the step status is a join on the command's state through the commands'
-- unique (workspace, idempotency_key) index, so recording is atomic with execution by
-- construction; no second write after the execution can be lost. Likewise a step is
-- `compensated` exactly when its command is (the ledger moves the target in the same
-- transaction as its compensate command's execution).
--
-- The saga row decides the saga's state: running -> completed, or running -> compensating
-- (a step failed) -> compensated (nothing recorded is left) | escalated (a compensation
-- exhausted its attempts; the runner raises a blocking need), and escalated -> compensating
-- again once that need is resolved (a new budget of attempts). Every change takes the saga's
-- row lock, then appends to the saga's trail chain `saga:<id>` in the same transaction.
-- Payloads (args, outcomes) stay in rows; trail bodies carry metadata.
--
-- Malformed input is refused by the client (agentpost.store.sagas) before it gets here. An
-- unknown saga, step, action or executor raises AP404; a request the saga's state forbids (a
-- step planned differently on a re-run, completing a saga whose step has not executed,
-- recording an attempt with a command that does not compensate the step) AP409. Nothing is
-- written when either is raised.

CREATE TABLE agentpost.sagas (
    id          text PRIMARY KEY,
    workspace   text NOT NULL REFERENCES agentpost.workspaces (id),
    saga_key    text NOT NULL,
    state       text NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'completed', 'compensating', 'compensated', 'escalated')),
    failed_step text,
    reason      text,
    -- what the escalation said (the blocking need's context) and the need, once written
    escalation  jsonb,
    need_id     text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (workspace, saga_key)
);

CREATE TABLE agentpost.saga_steps (
    saga_id         text NOT NULL REFERENCES agentpost.sagas (id),
    position        int NOT NULL CHECK (position >= 1),
    name            text NOT NULL,
    -- the step's command, by (workspace, idempotency_key): it may not exist yet
    workspace       text NOT NULL,
    command_key     text NOT NULL,
    action          text NOT NULL REFERENCES agentpost.envelope_types (name),
    -- the compensation: a handler name and its JSON args; NULL handler: nothing to undo
    handler         text,
    args            jsonb NOT NULL DEFAULT '{}',
    attempts        int NOT NULL DEFAULT 0,
    -- attempts spent before the last reopening (a resolved escalation grants a new budget)
    attempt_base    int NOT NULL DEFAULT 0,
    compensation_id text REFERENCES agentpost.commands (id),
    last_error      text,
    escalated       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (saga_id, position),
    UNIQUE (saga_id, name)
);

-- The steps with their commands. compensation: pending (the command has not executed:
-- nothing to undo), recorded (executed; due once the saga compensates), compensated,
-- escalated, none (executed, no handler).
CREATE FUNCTION agentpost._saga_steps_json(p_saga text) RETURNS jsonb
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
                    WHEN c.state IS DISTINCT FROM 'executed' THEN 'pending'
                    WHEN st.handler IS NULL THEN 'none'
                    WHEN st.escalated THEN 'escalated'
                    ELSE 'recorded' END) ORDER BY st.position), '[]'::jsonb)
              FROM agentpost.saga_steps st
              LEFT JOIN agentpost.commands c
                ON c.workspace = st.workspace AND c.idempotency_key = st.command_key
             WHERE st.saga_id = p_saga);
END $$;

CREATE FUNCTION agentpost._saga_json(s agentpost.sagas) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'saga_id', s.id, 'workspace', s.workspace, 'key', s.saga_key, 'state', s.state,
        'failed_step', s.failed_step, 'reason', s.reason, 'escalation', s.escalation,
        'need_id', s.need_id, 'created_at', s.created_at, 'updated_at', s.updated_at,
        'steps', agentpost._saga_steps_json(s.id));
END $$;

-- One entry in the saga's chain (the caller holds the saga's row lock).
CREATE FUNCTION agentpost._saga_event(s agentpost.sagas, p_event text, p_extra jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._trail_one(
        'saga:' || s.id, p_event, NULL,
        jsonb_build_object('saga_id', s.id, 'saga_key', s.saga_key, 'workspace', s.workspace,
                           'state', s.state, 'timestamp', clock_timestamp())
        || coalesce(p_extra, '{}'));
END $$;

CREATE FUNCTION agentpost._saga_lock(p_saga text) RETURNS agentpost.sagas
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas;
BEGIN
    SELECT * INTO s FROM agentpost.sagas WHERE id = p_saga FOR UPDATE;
    IF s.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown saga %L', p_saga));
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION agentpost._saga_step(p_saga text, p_name text) RETURNS agentpost.saga_steps
LANGUAGE plpgsql STABLE AS $$
DECLARE
    st agentpost.saga_steps;
BEGIN
    SELECT * INTO st FROM agentpost.saga_steps WHERE saga_id = p_saga AND name = p_name;
    IF st.saga_id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('saga %L has no step %L', p_saga, p_name));
    END IF;
    RETURN st;
END $$;

CREATE FUNCTION agentpost._saga_command(st agentpost.saga_steps) RETURNS agentpost.commands
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c agentpost.commands;
BEGIN
    SELECT * INTO c FROM agentpost.commands
     WHERE workspace = st.workspace AND idempotency_key = st.command_key;
    RETURN c;
END $$;

-- A compensating saga with no recorded compensation left is compensated.
CREATE FUNCTION agentpost._saga_settle(s agentpost.sagas) RETURNS agentpost.sagas
LANGUAGE plpgsql AS $$
BEGIN
    IF s.state <> 'compensating' OR EXISTS (
            SELECT 1 FROM agentpost.saga_steps st
              JOIN agentpost.commands c
                ON c.workspace = st.workspace AND c.idempotency_key = st.command_key
             WHERE st.saga_id = s.id AND st.handler IS NOT NULL AND c.state = 'executed') THEN
        RETURN s;
    END IF;
    UPDATE agentpost.sagas SET state = 'compensated', updated_at = clock_timestamp()
     WHERE id = s.id RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_compensated', NULL);
    RETURN s;
END $$;

-- Begin a saga, or find it: (workspace, key) names one saga for ever, so running the same
-- unit of work again meets the saga (and its steps) it already started.
CREATE FUNCTION agentpost.saga_begin(p_id text, p_workspace text, p_key text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas;
BEGIN
    SELECT * INTO s FROM agentpost.sagas WHERE workspace = p_workspace AND saga_key = p_key;
    IF s.id IS NULL THEN
        PERFORM agentpost._check_workspace(p_workspace);
        INSERT INTO agentpost.sagas (id, workspace, saga_key) VALUES (p_id, p_workspace, p_key)
        ON CONFLICT (workspace, saga_key) DO NOTHING
        RETURNING * INTO s;
        IF s.id IS NOT NULL THEN
            PERFORM agentpost._saga_event(s, 'saga_begun', NULL);
            RETURN agentpost._saga_json(s) || jsonb_build_object('existing', false);
        END IF;
        SELECT * INTO s FROM agentpost.sagas WHERE workspace = p_workspace AND saga_key = p_key;
    END IF;
    RETURN agentpost._saga_json(s) || jsonb_build_object('existing', true);
END $$;

-- Plan step p_position of a saga (before its command is submitted). A step planned before
-- (a re-run) must come back at the same position with the same action and compensation: it
-- replays. The action and the executor are checked here as the ledger will check them, so a
-- step the ledger would refuse as unknown is not planned either.
-- Returns {"status": planned | replay | closed, "step": {...}, "saga": {...}}; `closed` when
-- the saga no longer runs steps (compensating, compensated, escalated).
CREATE FUNCTION agentpost.saga_plan_step(p_saga text, p_position int, p_name text,
                                         p_action text, p_executor text, p_handler text,
                                         p_args jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    st agentpost.saga_steps;
    v_status text := 'replay';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.envelope_types t WHERE t.name = p_action) THEN
        PERFORM agentpost._fail('AP404', format('unknown action %L (not a registered type)',
                                                p_action));
    END IF;
    PERFORM agentpost._check_workspace(coalesce(p_executor, s.workspace));
    SELECT * INTO st FROM agentpost.saga_steps WHERE saga_id = p_saga AND name = p_name;
    IF st.saga_id IS NOT NULL THEN
        IF st.position <> p_position OR st.action <> p_action
           OR st.handler IS DISTINCT FROM p_handler OR st.args <> p_args THEN
            PERFORM agentpost._fail('AP409', format(
                'step %L of saga %L was planned as step %s, %s, with compensation %s %s',
                p_name, p_saga, st.position, st.action, coalesce(st.handler, 'none'),
                st.args));
        END IF;
    ELSIF s.state IN ('running', 'completed') THEN
        IF s.state = 'completed' THEN
            PERFORM agentpost._fail('AP409', format('saga %L is completed; it has no step %L',
                                                    p_saga, p_name));
        END IF;
        IF p_position <> 1 + coalesce((SELECT max(position) FROM agentpost.saga_steps
                                        WHERE saga_id = p_saga), 0) THEN
            PERFORM agentpost._fail('AP409', format(
                'saga %L: step %L comes at position %s, but the saga has a different step there',
                p_saga, p_name, p_position));
        END IF;
        INSERT INTO agentpost.saga_steps (saga_id, position, name, workspace, command_key,
                                          action, handler, args)
        VALUES (p_saga, p_position, p_name, s.workspace, 'saga:' || p_saga || '/' || p_name,
                p_action, p_handler, p_args)
        RETURNING * INTO st;
        PERFORM agentpost._saga_event(s, 'saga_step_planned', jsonb_build_object(
            'step', p_name, 'position', p_position, 'command_key', st.command_key,
            'action', p_action, 'compensation', p_handler));
        v_status := 'planned';
    END IF;
    IF s.state NOT IN ('running', 'completed') THEN
        v_status := 'closed';
    END IF;
    RETURN jsonb_build_object('status', v_status, 'command_key', st.command_key,
                              'saga', agentpost._saga_json(s));
END $$;

-- A step's command ended without executing (failed, rejected, canceled, or its confirmation
-- was declined): the saga starts compensating. The database checks the command's state; a
-- saga already past running is returned as it is.
CREATE FUNCTION agentpost.saga_step_failed(p_saga text, p_name text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    st agentpost.saga_steps := agentpost._saga_step(p_saga, p_name);
    c agentpost.commands := agentpost._saga_command(st);
BEGIN
    IF s.state <> 'running' THEN
        RETURN agentpost._saga_json(s);
    END IF;
    IF c.state IS NULL OR (c.state NOT IN ('failed', 'rejected', 'canceled', 'compensated')
                           AND NOT c.declined) THEN
        PERFORM agentpost._fail('AP409', format('step %L of saga %L has not failed (%s)',
                                                p_name, p_saga, coalesce(c.state, 'no command')));
    END IF;
    UPDATE agentpost.sagas
       SET state = 'compensating', failed_step = p_name,
           reason = coalesce(c.reason, CASE WHEN c.declined THEN 'confirmation_declined'
                                            ELSE 'step command ' || c.state END),
           updated_at = clock_timestamp()
     WHERE id = p_saga RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_compensating', jsonb_build_object(
        'failed_step', p_name, 'command_id', c.id, 'command_state', c.state,
        'reason', s.reason));
    s := agentpost._saga_settle(s);
    RETURN agentpost._saga_json(s);
END $$;

-- Record attempt p_attempt at compensating a step: p_command must be a finished compensate
-- command targeting the step's command. Recording an attempt twice is a no-op.
CREATE FUNCTION agentpost.saga_attempt(p_saga text, p_name text, p_attempt int, p_command text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    st agentpost.saga_steps := agentpost._saga_step(p_saga, p_name);
    c agentpost.commands := agentpost._saga_command(st);
    k agentpost.commands;
    v_ok boolean;
BEGIN
    IF p_attempt <= st.attempts THEN
        RETURN agentpost._saga_json(s);
    END IF;
    IF s.state <> 'compensating' OR p_attempt <> st.attempts + 1 THEN
        PERFORM agentpost._fail('AP409', format(
            'saga %L is %s; step %L has %s attempts: attempt %s cannot be recorded',
            p_saga, s.state, p_name, st.attempts, p_attempt));
    END IF;
    SELECT * INTO k FROM agentpost.commands WHERE id = p_command;
    IF k.id IS NULL OR k.kind <> 'compensate' OR k.target_command_id IS DISTINCT FROM c.id
       OR k.state NOT IN ('executed', 'failed', 'rejected', 'canceled') THEN
        PERFORM agentpost._fail('AP409', format(
            'command %L is not a finished compensation of step %L of saga %L',
            p_command, p_name, p_saga));
    END IF;
    v_ok := k.state = 'executed';
    UPDATE agentpost.saga_steps
       SET attempts = p_attempt, compensation_id = k.id,
           last_error = CASE WHEN v_ok THEN NULL ELSE coalesce(k.reason, k.state) END
     WHERE saga_id = p_saga AND name = p_name;
    PERFORM agentpost._saga_event(s,
        CASE WHEN v_ok THEN 'saga_step_compensated' ELSE 'saga_compensation_failed' END,
        jsonb_build_object('step', p_name, 'position', st.position, 'command_id', c.id,
                           'compensate_command_id', k.id, 'attempt', p_attempt,
                           'compensate_state', k.state,
                           'error', CASE WHEN v_ok THEN NULL ELSE coalesce(k.reason, k.state) END));
    s := agentpost._saga_settle(s);
    RETURN agentpost._saga_json(s);
END $$;

-- A step's compensation exhausted its attempts: the saga is escalated, with the context the
-- runner's blocking need carries. Escalating an escalated saga returns it as it is.
CREATE FUNCTION agentpost.saga_escalate(p_saga text, p_name text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    st agentpost.saga_steps := agentpost._saga_step(p_saga, p_name);
    c agentpost.commands := agentpost._saga_command(st);
    v_context jsonb;
BEGIN
    IF s.state = 'escalated' THEN
        RETURN agentpost._saga_json(s);
    END IF;
    IF s.state <> 'compensating' OR c.state IS DISTINCT FROM 'executed' THEN
        PERFORM agentpost._fail('AP409', format(
            'saga %L is %s and step %L is %s: nothing to escalate',
            p_saga, s.state, p_name, coalesce(c.state, 'not submitted')));
    END IF;
    v_context := jsonb_build_object(
        'saga', p_saga, 'saga_key', s.saga_key, 'workspace', s.workspace, 'step', p_name,
        'position', st.position, 'command_id', c.id, 'failed_step', s.failed_step,
        'attempts', st.attempts, 'compensate_command_id', st.compensation_id,
        'last_error', st.last_error);
    UPDATE agentpost.saga_steps SET escalated = true WHERE saga_id = p_saga AND name = p_name;
    UPDATE agentpost.sagas
       SET state = 'escalated', escalation = v_context, updated_at = clock_timestamp()
     WHERE id = p_saga RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_escalated', v_context);
    RETURN agentpost._saga_json(s);
END $$;

-- The blocking need an escalation raised, recorded once.
CREATE FUNCTION agentpost.saga_need(p_saga text, p_need text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
BEGIN
    IF s.need_id = p_need THEN
        RETURN agentpost._saga_json(s);
    END IF;
    IF s.state <> 'escalated' OR s.need_id IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format('saga %L is %s with need %s', p_saga, s.state,
                                                coalesce(s.need_id, 'none')));
    END IF;
    UPDATE agentpost.sagas SET need_id = p_need, updated_at = clock_timestamp()
     WHERE id = p_saga RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_need_raised', jsonb_build_object('need_id', p_need));
    RETURN agentpost._saga_json(s);
END $$;

-- End a running saga whose every step executed. Completing it again is a no-op.
CREATE FUNCTION agentpost.saga_complete(p_saga text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    v_step text;
BEGIN
    IF s.state = 'completed' THEN
        RETURN agentpost._saga_json(s);
    END IF;
    IF s.state <> 'running' THEN
        PERFORM agentpost._fail('AP409', format('saga %L is %s, it cannot complete',
                                                p_saga, s.state));
    END IF;
    SELECT st.name INTO v_step FROM agentpost.saga_steps st
      LEFT JOIN agentpost.commands c
        ON c.workspace = st.workspace AND c.idempotency_key = st.command_key
     WHERE st.saga_id = p_saga AND c.state IS DISTINCT FROM 'executed'
     ORDER BY st.position LIMIT 1;
    IF v_step IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format('saga %L cannot complete: step %L has not executed',
                                                p_saga, v_step));
    END IF;
    UPDATE agentpost.sagas SET state = 'completed', updated_at = clock_timestamp()
     WHERE id = p_saga RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_completed', jsonb_build_object(
        'steps', (SELECT count(*) FROM agentpost.saga_steps WHERE saga_id = p_saga)));
    RETURN agentpost._saga_json(s);
END $$;

CREATE FUNCTION agentpost.saga_view(p_saga text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s agentpost.sagas;
BEGIN
    SELECT * INTO s FROM agentpost.sagas WHERE id = p_saga;
    IF s.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown saga %L', p_saga));
    END IF;
    RETURN agentpost._saga_json(s);
END $$;

-- Settle a compensating saga whose recorded compensations are all done (e.g. a step's
-- command was compensated outside the saga): it becomes compensated.
CREATE FUNCTION agentpost.saga_settle(p_saga text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    RETURN agentpost._saga_json(agentpost._saga_settle(agentpost._saga_lock(p_saga)));
END $$;

-- The blocking need of an escalation was resolved (the runner read the resolution from the
-- mark space): the saga compensates again, and the escalated step gets a new budget of
-- attempts (a step compensated by hand meanwhile is simply no longer recorded).
CREATE FUNCTION agentpost.saga_reopen(p_saga text, p_need text, p_resolved_by text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
BEGIN
    IF s.state <> 'escalated' OR s.need_id IS DISTINCT FROM p_need THEN
        PERFORM agentpost._fail('AP409', format('saga %L is %s with need %s, not %s', p_saga,
                                                s.state, coalesce(s.need_id, 'none'), p_need));
    END IF;
    UPDATE agentpost.saga_steps SET escalated = false, attempt_base = attempts
     WHERE saga_id = p_saga AND escalated;
    UPDATE agentpost.sagas
       SET state = 'compensating', escalation = NULL, need_id = NULL,
           updated_at = clock_timestamp()
     WHERE id = p_saga RETURNING * INTO s;
    PERFORM agentpost._saga_event(s, 'saga_reopened', jsonb_build_object(
        'need_id', p_need, 'resolved_by', p_resolved_by));
    s := agentpost._saga_settle(s);
    RETURN agentpost._saga_json(s);
END $$;

-- The action that resolved a need of a Postgres mark space (the resolution is a copy of the
-- need that supersedes it, carrying resolved_by), or NULL while the need is open.
CREATE FUNCTION agentpost.saga_need_resolution(p_space text, p_need uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT m.resolved_by::text FROM agentpost.marks m
             WHERE m.space = p_space AND m.supersedes = p_need AND m.mark_type = 'need'
               AND m.resolved_by IS NOT NULL
             LIMIT 1);
END $$;
