-- SMCL commands (RFC-WF-0018): the lifecycle machine, its gates and its evidence, enforced here
-- under the command's row lock.
--
-- The allowed transitions are data (command_transitions, mirroring
-- agentpost.protocol.commands.ALLOWED; `required` lists the fields the transition's evidence
-- carries besides the lifecycle block); the conditional rules are in _command_refusal.
--
-- Gates decide, callers don't: confirmation comes from an auto-confirm policy named at submit,
-- a resolved blocking need (command_confirm, checked against the need recorded when it was
-- requested) or a human-highway envelope (command_confirm_envelope, verified here);
-- authorization comes from the permission matrix (_command_authz). The generic
-- command_transition refuses (with evidence) what the machine forbids and raises AP403 for a
-- target that only a gate or an execution may reach.
--
-- Evidence goes to the trail, one chain per command: `command:<id>`. A step collects its
-- artifacts and appends them with one _trail_write, so the fast path (command_run: submit,
-- auto-confirm, authorization and start) is one statement and one trail write. Writers hold
-- the command's row lock (insert or FOR UPDATE) before the chain's lock; a step touching a
-- target too (cancel, compensate) locks the recovery command, then its target.
--
-- `received` (S0) is pre-envelope and never stored: a row is born `canonicalized`, and its
-- first evidence is received->canonicalized. Errors: AP400 malformed, AP403 a gate's
-- decision asked of the generic path or a forged confirmation, AP404 unknown, AP409 conflict.

CREATE TABLE agentpost.command_transitions (
    from_state text NOT NULL,
    to_state   text NOT NULL,
    required   text[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (from_state, to_state)
);

INSERT INTO agentpost.command_transitions (from_state, to_state, required) VALUES
    ('received', 'canonicalized', '{}'),
    ('canonicalized', 'confirmation_required', '{}'),
    ('confirmation_required', 'confirmed', '{confirmed_by}'),
    ('canonicalized', 'authz_pending', '{}'),
    ('confirmed', 'authz_pending', '{}'),
    ('authz_pending', 'authorized', '{decided_by}'),
    ('authz_pending', 'rejected', '{decided_by,reason}'),
    ('authorized', 'started', '{}'),
    ('started', 'executed', '{}'),
    ('started', 'failed', '{reason}'),
    ('started', 'canceled', '{reason}'),
    ('failed', 'compensated', '{compensation_command_id}'),
    ('executed', 'compensated', '{compensation_command_id}');

CREATE TABLE agentpost.command_recovery (
    state text NOT NULL,
    kind  text NOT NULL,
    PRIMARY KEY (state, kind)
);

INSERT INTO agentpost.command_recovery (state, kind) VALUES
    ('started', 'cancel'),
    ('failed', 'retry'), ('failed', 'reprocess'), ('failed', 'compensate'),
    ('executed', 'compensate'),
    ('rejected', 'reprocess'),
    ('canceled', 'reprocess');

-- The human highway's confirmation envelope (content {"command_id", "decision"}, format json).
INSERT INTO agentpost.envelope_types (name, required_fields, builtin)
VALUES ('command.confirmation', '{command_id,decision}', true);

CREATE TABLE agentpost.commands (
    id                text PRIMARY KEY,
    workspace         text NOT NULL REFERENCES agentpost.workspaces (id),
    idempotency_key   text NOT NULL,
    kind              text NOT NULL
        CHECK (kind IN ('primary', 'retry', 'cancel', 'reprocess', 'compensate')),
    target_command_id text REFERENCES agentpost.commands (id),
    mutating          boolean NOT NULL,
    auto_confirm      text,
    action            text NOT NULL REFERENCES agentpost.envelope_types (name),
    executor          text NOT NULL REFERENCES agentpost.workspaces (id),
    -- kept for retry and reprocess; the trail only ever sees them redacted
    args              jsonb,
    state             text NOT NULL,
    confirmed         boolean NOT NULL DEFAULT false,
    confirmed_by      text,
    declined          boolean NOT NULL DEFAULT false,
    need_id           text,
    authorized        boolean NOT NULL DEFAULT false,
    outcome           jsonb,
    reason            text,
    lease_expires_at  timestamptz,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (workspace, idempotency_key),
    CHECK ((kind = 'primary') = (target_command_id IS NULL))
);

CREATE INDEX commands_target ON agentpost.commands (target_command_id, kind)
    WHERE target_command_id IS NOT NULL;
-- the sweep's scan: started commands by lease expiry
CREATE INDEX commands_started ON agentpost.commands (lease_expires_at)
    WHERE state = 'started';

CREATE FUNCTION agentpost._command_json(c agentpost.commands, p_duplicate boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'command_id', c.id, 'kind', c.kind, 'workspace', c.workspace,
        'idempotency_key', c.idempotency_key, 'target_command_id', c.target_command_id,
        'mutating', c.mutating, 'auto_confirm', c.auto_confirm, 'action', c.action,
        'executor', c.executor, 'args', c.args, 'state', c.state,
        'confirmed_by', c.confirmed_by, 'declined', c.declined, 'need_id', c.need_id,
        'last_transition_at', c.updated_at, 'reason', c.reason, 'outcome', c.outcome,
        'lease_expires_at', c.lease_expires_at, 'duplicate', p_duplicate);
END $$;

CREATE FUNCTION agentpost._command_event(p_to text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_to
        WHEN 'canonicalized' THEN 'command.accepted'
        WHEN 'confirmation_required' THEN 'command.confirmation.requested'
        WHEN 'confirmed' THEN 'command.confirmation.satisfied'
        WHEN 'authz_pending' THEN 'authz.requested'
        WHEN 'authorized' THEN 'authz.decided'
        WHEN 'rejected' THEN 'execution.rejected'
        WHEN 'started' THEN 'execution.started'
        WHEN 'executed' THEN 'execution.executed'
        WHEN 'failed' THEN 'execution.failed'
        WHEN 'canceled' THEN 'execution.canceled'
        WHEN 'compensated' THEN 'compensation.compensated' END;
$$;

CREATE FUNCTION agentpost._command_states() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['received', 'canonicalized', 'confirmation_required', 'confirmed',
                 'authz_pending', 'authorized', 'rejected', 'started', 'executed', 'failed',
                 'canceled', 'compensated'];
$$;

-- One evidence artifact: the RFC's lifecycle block, the command's identity, and p_extra.
-- A state change also names the RFC event of the state entered.
CREATE FUNCTION agentpost._command_body(c agentpost.commands, p_from text, p_to text,
                                        p_type text, p_extra jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'lifecycle', jsonb_build_object(
            'command_id', c.id, 'transition', p_from || '→' || p_to,
            'timestamp', clock_timestamp(), 'evidence_type', p_type),
        'event', CASE WHEN p_type = 'state_change' THEN agentpost._command_event(p_to) END,
        'kind', c.kind, 'workspace', c.workspace, 'mutating', c.mutating,
        'action', c.action, 'target_command_id', c.target_command_id)
        || coalesce(p_extra, '{}');
END $$;

-- Append artifacts (chain i gets body i), one trail write. Event names follow the type.
CREATE FUNCTION agentpost._command_trail(p_chains text[], p_bodies jsonb[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._trail_write(
        p_chains,
        ARRAY(SELECT 'command_' || (b -> 'lifecycle' ->> 'evidence_type')
                FROM unnest(p_bodies) WITH ORDINALITY u(b, i) ORDER BY i),
        array_fill(NULL::text, ARRAY[cardinality(p_chains)]),
        p_bodies);
END $$;

CREATE FUNCTION agentpost._command_write(p_id text, p_bodies jsonb[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._command_trail(array_fill('command:' || p_id,
                                                ARRAY[cardinality(p_bodies)]), p_bodies);
END $$;

-- Why c.state -> p_to is refused, or NULL when the machine allows it.
CREATE FUNCTION agentpost._command_refusal(c agentpost.commands, p_to text, p_context jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.command_transitions t
                    WHERE t.from_state = c.state AND t.to_state = p_to) THEN
        RETURN 'transition_not_allowed';
    END IF;
    IF p_to = 'confirmation_required' AND (NOT c.mutating OR c.auto_confirm IS NOT NULL) THEN
        RETURN 'confirmation_not_applicable';
    END IF;
    IF p_to = 'started' AND c.mutating AND NOT c.confirmed AND c.auto_confirm IS NULL THEN
        RETURN CASE WHEN c.declined THEN 'confirmation_declined' ELSE 'not_confirmed' END;
    END IF;
    IF p_to = 'started' AND NOT c.authorized THEN
        RETURN 'not_authorized';
    END IF;
    IF p_to = 'started' AND c.target_command_id IS NOT NULL
       AND NOT agentpost._command_target_ok(c) THEN
        RETURN 'target_not_recoverable';
    END IF;
    IF p_to = 'compensated' AND NOT EXISTS (
            SELECT 1 FROM agentpost.commands k
             WHERE k.id = p_context ->> 'compensation_command_id'
               AND k.kind = 'compensate' AND k.target_command_id = c.id
               AND k.state = 'executed') THEN
        RETURN 'compensation_not_proven';
    END IF;
    RETURN NULL;
END $$;

-- May this cancel/compensate still act on its target? (The target's state still offers the
-- kind, and no sibling of the same kind is running or done: a target is compensated or
-- canceled once.) Retry and reprocess don't act on the target.
CREATE FUNCTION agentpost._command_target_ok(c agentpost.commands) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF c.kind NOT IN ('cancel', 'compensate') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM agentpost.commands t
                     JOIN agentpost.command_recovery r ON r.state = t.state AND r.kind = c.kind
                    WHERE t.id = c.target_command_id)
       AND NOT EXISTS (SELECT 1 FROM agentpost.commands s
                        WHERE s.target_command_id = c.target_command_id AND s.kind = c.kind
                          AND s.id <> c.id AND s.state IN ('started', 'executed'));
END $$;

-- The authorization decision from the permission matrix: the requester's role lineage must
-- hold a sender row and the executor's a receiver row for the action; a requester that is
-- suspended, closed or failed (or an executor closed or failed) is denied.
CREATE FUNCTION agentpost._command_authz(c agentpost.commands) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    req agentpost.workspaces;
    exe agentpost.workspaces;
    v_reason text;
BEGIN
    SELECT * INTO req FROM agentpost.workspaces WHERE id = c.workspace;
    SELECT * INTO exe FROM agentpost.workspaces WHERE id = c.executor;
    IF req.state IN ('suspended', 'closed', 'failed') THEN
        v_reason := 'requester_' || req.state;
    ELSIF exe.state IN ('closed', 'failed') THEN
        v_reason := 'executor_' || exe.state;
    ELSIF NOT EXISTS (SELECT 1 FROM agentpost.permissions p
                       WHERE p.type = c.action AND p.sender_role = ANY (req.lineage)
                         AND p.receiver_role = ANY (exe.lineage)) THEN
        v_reason := 'not_permitted';
    END IF;
    RETURN jsonb_build_object(
        'decided_by', 'policy:permission-matrix', 'decision',
        CASE WHEN v_reason IS NULL THEN 'allow' ELSE 'deny' END, 'reason', v_reason,
        'requester', req.id, 'requester_role', req.role, 'executor', exe.id,
        'executor_role', exe.role, 'action', c.action);
END $$;

-- Move c (in memory) as far as its gates allow: canonicalized/confirmed -> authz_pending ->
-- authorized|rejected -> started. Stops where a human is needed (a mutating command neither
-- confirmed nor auto-confirmed stays canonicalized or confirmation_required) and refuses a
-- start the rules forbid. The caller writes c and the collected bodies.
CREATE FUNCTION agentpost._command_advance(c agentpost.commands, p_lease_ms int,
                                           p_attempt boolean, OUT c_out agentpost.commands,
                                           OUT bodies jsonb[], OUT status text,
                                           OUT refusal text)
LANGUAGE plpgsql AS $$
DECLARE
    v_decision jsonb;
    v_now timestamptz := clock_timestamp();
BEGIN
    bodies := '{}';
    c_out := c;
    IF c.state IN ('started', 'executed', 'failed', 'canceled', 'compensated', 'rejected') THEN
        status := 'unchanged';
        RETURN;
    END IF;
    IF c.mutating AND NOT c.confirmed AND c.auto_confirm IS NULL
       AND c.state IN ('canonicalized', 'confirmation_required') THEN
        -- the gate waits for a person; asked to start (p_attempt), that is a refused attempt
        status := CASE WHEN c.declined THEN 'declined' ELSE 'needs_confirmation' END;
        IF p_attempt THEN
            refusal := CASE WHEN c.declined THEN 'confirmation_declined'
                            ELSE 'not_confirmed' END;
            bodies := ARRAY[agentpost._command_body(c, c.state, 'started',
                'invalid_transition_attempt', jsonb_build_object('refusal', refusal))];
            status := 'refused';
        END IF;
        RETURN;
    END IF;
    IF c.state IN ('canonicalized', 'confirmed') THEN
        bodies := bodies || agentpost._command_body(c, c.state, 'authz_pending', 'state_change',
            jsonb_build_object('auto_confirm', c.auto_confirm, 'confirmed_by', c.confirmed_by));
        c.state := 'authz_pending';
    END IF;
    IF c.state = 'authz_pending' THEN
        v_decision := agentpost._command_authz(c);
        IF v_decision ->> 'decision' = 'deny' THEN
            c.state := 'rejected';
            c.reason := v_decision ->> 'reason';
            bodies := bodies || agentpost._command_body(c, 'authz_pending', 'rejected',
                                                        'state_change', v_decision);
            c.updated_at := v_now;
            c_out := c;
            status := 'rejected';
            RETURN;
        END IF;
        c.state := 'authorized';
        c.authorized := true;
        bodies := bodies || agentpost._command_body(c, 'authz_pending', 'authorized',
                                                    'state_change', v_decision);
    END IF;
    refusal := agentpost._command_refusal(c, 'started', '{}');
    IF refusal IS NOT NULL THEN
        bodies := bodies || agentpost._command_body(c, c.state, 'started',
            'invalid_transition_attempt', jsonb_build_object('refusal', refusal));
        c_out := c;
        status := 'refused';
        RETURN;
    END IF;
    c.state := 'started';
    c.lease_expires_at := v_now + make_interval(secs => p_lease_ms / 1000.0);
    bodies := bodies || agentpost._command_body(c, 'authorized', 'started', 'state_change',
        jsonb_build_object('confirmation', CASE WHEN c.mutating THEN coalesce(
                               'auto_confirm:' || c.auto_confirm, c.confirmed_by) END,
                           'lease_expires_at', c.lease_expires_at));
    c.updated_at := v_now;
    c_out := c;
    status := 'started';
END $$;

CREATE FUNCTION agentpost._command_save(c agentpost.commands) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE agentpost.commands
       SET state = c.state, authorized = c.authorized, reason = c.reason,
           lease_expires_at = c.lease_expires_at, updated_at = c.updated_at
     WHERE id = c.id;
END $$;

CREATE FUNCTION agentpost._command_check_submit(p_workspace text, p_kind text, p_target text,
                                                p_action text, p_executor text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t agentpost.commands;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = p_workspace) THEN
        PERFORM agentpost._fail('AP404', format('unknown workspace %L', p_workspace));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = p_executor) THEN
        PERFORM agentpost._fail('AP404', format('unknown executor workspace %L', p_executor));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agentpost.envelope_types e WHERE e.name = p_action) THEN
        PERFORM agentpost._fail('AP400', format(
            'unknown action type %L: register it with register_type first', p_action));
    END IF;
    IF p_kind = 'primary' THEN
        IF p_target IS NOT NULL THEN
            PERFORM agentpost._fail('AP400', 'a primary command has no target_command_id');
        END IF;
        RETURN;
    END IF;
    IF p_kind NOT IN ('retry', 'cancel', 'reprocess', 'compensate') THEN
        PERFORM agentpost._fail('AP400', format('unknown command kind %L', p_kind));
    END IF;
    SELECT * INTO t FROM agentpost.commands WHERE id = p_target FOR UPDATE;
    IF t.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown target command %L', p_target));
    END IF;
    IF t.workspace <> p_workspace THEN
        PERFORM agentpost._fail('AP409', format(
            'target command %L belongs to workspace %L', p_target, t.workspace));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agentpost.command_recovery r
                    WHERE r.state = t.state AND r.kind = p_kind) THEN
        PERFORM agentpost._fail('AP409', format('a %s command cannot target a command in state %s',
                                                p_kind, t.state));
    END IF;
END $$;

CREATE FUNCTION agentpost._command_duplicate(p_workspace text, p_key text, p_kind text,
                                             p_target text, p_mutating boolean,
                                             p_action text, p_executor text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands;
BEGIN
    SELECT * INTO c FROM agentpost.commands
     WHERE workspace = p_workspace AND idempotency_key = p_key FOR UPDATE;
    IF c.kind <> p_kind OR c.target_command_id IS DISTINCT FROM p_target
       OR c.mutating <> p_mutating OR c.action <> p_action OR c.executor <> p_executor THEN
        PERFORM agentpost._fail('AP409', format(
            'idempotency key %L was already used for a different command (%s)', p_key, c.id));
    END IF;
    PERFORM agentpost._command_write(c.id, ARRAY[agentpost._command_body(
        c, c.state, c.state, 'duplicate_delivery',
        jsonb_build_object('idempotency_key', p_key, 'in_progress', c.state = 'started'))]);
    RETURN agentpost._command_json(c, true);
END $$;

-- Submit and, with p_advance, pass every gate that needs no human and start: the fast path.
-- A duplicate (workspace, idempotency_key) returns the existing command's view with
-- duplicate = true and records duplicate_delivery; it never creates or starts anything. The
-- duplicate is looked for first, and again after the insert lost a race on the unique key.
-- A recovery command links itself in the target's chain (recovery_requested).
-- Returns {"status": created|needs_confirmation|declined|rejected|refused|started|duplicate,
-- "refusal", "view"}.
CREATE FUNCTION agentpost.command_submit(
    p_id text, p_workspace text, p_key text, p_kind text, p_target text, p_mutating boolean,
    p_auto_confirm text, p_action text, p_executor text, p_args jsonb, p_evidence jsonb,
    p_advance boolean, p_lease_ms int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands;
    a record;
    v_bodies jsonb[];
    v_chains text[];
    v_status text := 'created';
    v_refusal text;
BEGIN
    IF EXISTS (SELECT 1 FROM agentpost.commands
                WHERE workspace = p_workspace AND idempotency_key = p_key) THEN
        RETURN jsonb_build_object('status', 'duplicate', 'view', agentpost._command_duplicate(
            p_workspace, p_key, p_kind, p_target, p_mutating, p_action, p_executor));
    END IF;
    PERFORM agentpost._command_check_submit(p_workspace, p_kind, p_target, p_action,
                                            p_executor);
    c := ROW(p_id, p_workspace, p_key, p_kind, p_target, p_mutating, p_auto_confirm, p_action,
             p_executor, p_args, 'canonicalized', false, NULL, false, NULL, false, NULL, NULL,
             NULL, clock_timestamp(), clock_timestamp())::agentpost.commands;
    v_bodies := ARRAY[agentpost._command_body(c, 'received', 'canonicalized', 'state_change',
        jsonb_build_object('auto_confirm', p_auto_confirm, 'executor', p_executor,
                           'idempotency_key', p_key) || coalesce(p_evidence, '{}'))];
    IF p_advance THEN
        SELECT * INTO a FROM agentpost._command_advance(c, p_lease_ms, false);
        c := a.c_out;
        v_bodies := v_bodies || a.bodies;
        v_status := a.status;
        v_refusal := a.refusal;
    END IF;
    INSERT INTO agentpost.commands VALUES (c.*)
    ON CONFLICT (workspace, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'duplicate', 'view', agentpost._command_duplicate(
            p_workspace, p_key, p_kind, p_target, p_mutating, p_action, p_executor));
    END IF;
    v_chains := array_fill('command:' || c.id, ARRAY[cardinality(v_bodies)]);
    IF p_target IS NOT NULL THEN
        v_chains := v_chains || ('command:' || p_target);
        v_bodies := v_bodies || jsonb_build_object(
            'lifecycle', jsonb_build_object(
                'command_id', p_target, 'transition', NULL,
                'timestamp', clock_timestamp(), 'evidence_type', 'recovery_requested'),
            'recovery_command_id', c.id, 'recovery_kind', c.kind);
    END IF;
    PERFORM agentpost._command_trail(v_chains, v_bodies);
    RETURN jsonb_build_object('status', v_status, 'refusal', v_refusal,
                              'view', agentpost._command_json(c, false));
END $$;

CREATE FUNCTION agentpost._command_lock(p_id text) RETURNS agentpost.commands
LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands;
BEGIN
    SELECT * INTO c FROM agentpost.commands WHERE id = p_id FOR UPDATE;
    IF c.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown command %L', p_id));
    END IF;
    RETURN c;
END $$;

-- Pass the remaining gates and start a command submitted or confirmed earlier (the step
-- path's execute). Same result shape as command_submit.
CREATE FUNCTION agentpost.command_advance(p_id text, p_lease_ms int) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands := agentpost._command_lock(p_id);
    a record;
BEGIN
    SELECT * INTO a FROM agentpost._command_advance(c, p_lease_ms, true);
    IF cardinality(a.bodies) > 0 THEN
        PERFORM agentpost._command_save(a.c_out);
        PERFORM agentpost._command_write(p_id, a.bodies);
    END IF;
    RETURN jsonb_build_object('status', a.status, 'refusal', a.refusal,
                              'view', agentpost._command_json(a.c_out, false));
END $$;

-- canonicalized -> confirmation_required, recording the blocking need posted for it (if any).
-- Refused (with evidence) where the machine forbids it.
CREATE FUNCTION agentpost.command_request_confirmation(p_id text, p_need_id text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands := agentpost._command_lock(p_id);
    v_refusal text := agentpost._command_refusal(c, 'confirmation_required', '{}');
BEGIN
    IF v_refusal IS NOT NULL THEN
        PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
            c, c.state, 'confirmation_required', 'invalid_transition_attempt',
            jsonb_build_object('refusal', v_refusal, 'need_id', p_need_id))]);
        RETURN jsonb_build_object('status', 'refused', 'refusal', v_refusal,
                                  'view', agentpost._command_json(c, false));
    END IF;
    UPDATE agentpost.commands SET state = 'confirmation_required', need_id = p_need_id,
                                  updated_at = clock_timestamp()
     WHERE id = p_id RETURNING * INTO c;
    PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
        c, 'canonicalized', 'confirmation_required', 'state_change',
        jsonb_build_object('need_id', p_need_id, 'channels',
            CASE WHEN p_need_id IS NULL THEN '["envelope"]'::jsonb
                 ELSE '["need", "envelope"]'::jsonb END))]);
    RETURN jsonb_build_object('status', 'ok', 'view', agentpost._command_json(c, false));
END $$;

-- A confirmation decision (confirm | decline) by p_by, from p_source. A need's resolution
-- must name the need recorded by command_request_confirmation. A decline has no state to go
-- to in the RFC: it records confirmation_declined and marks the command so it never starts.
CREATE FUNCTION agentpost._command_decide(c agentpost.commands, p_decision text, p_by text,
                                          p_source jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_decision NOT IN ('confirm', 'decline') THEN
        PERFORM agentpost._fail('AP400', format(
            'a confirmation decision is "confirm" or "decline", not %L', p_decision));
    END IF;
    IF c.state <> 'confirmation_required' THEN
        PERFORM agentpost._fail('AP409', format(
            'command %s is %s: %s', c.id, c.state, CASE WHEN c.confirmed
                THEN 'already confirmed' ELSE 'no confirmation was requested' END));
    END IF;
    IF c.declined THEN
        PERFORM agentpost._fail('AP409', format('command %s was declined', c.id));
    END IF;
    IF p_source ? 'need_id' AND p_source ->> 'need_id' IS DISTINCT FROM c.need_id THEN
        PERFORM agentpost._fail('AP409', format(
            'need %s is not the confirmation need of command %s', p_source ->> 'need_id', c.id));
    END IF;
    IF p_decision = 'decline' THEN
        UPDATE agentpost.commands
           SET declined = true, reason = 'confirmation_declined', updated_at = clock_timestamp()
         WHERE id = c.id RETURNING * INTO c;
        PERFORM agentpost._command_write(c.id, ARRAY[agentpost._command_body(
            c, c.state, c.state, 'confirmation_declined',
            jsonb_build_object('declined_by', p_by, 'source', p_source,
                               'reason', 'confirmation_declined'))]);
    ELSE
        UPDATE agentpost.commands
           SET state = 'confirmed', confirmed = true, confirmed_by = p_by,
               updated_at = clock_timestamp()
         WHERE id = c.id RETURNING * INTO c;
        PERFORM agentpost._command_write(c.id, ARRAY[agentpost._command_body(
            c, 'confirmation_required', 'confirmed', 'state_change',
            jsonb_build_object('confirmed_by', p_by, 'source', p_source))]);
    END IF;
    RETURN agentpost._command_json(c, false);
END $$;

-- Confirmation through a resolved need: the client read the resolution from the mark space.
CREATE FUNCTION agentpost.command_confirm(p_id text, p_decision text, p_by text,
                                          p_source jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(p_source ->> 'need_id', '') = '' THEN
        PERFORM agentpost._fail('AP400', 'a confirmation from a need names the need');
    END IF;
    RETURN agentpost._command_decide(agentpost._command_lock(p_id), p_decision, p_by,
                                     p_source);
END $$;

-- Confirmation through the human highway: a `command.confirmation` envelope injected by a
-- person (origin human) into the command's workspace after the confirmation was requested,
-- content {"command_id", "decision"}. Everything is checked here; one envelope decides once.
CREATE FUNCTION agentpost.command_confirm_envelope(p_envelope text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    e agentpost.envelopes;
    c agentpost.commands;
    v_content jsonb;
BEGIN
    SELECT * INTO e FROM agentpost.envelopes WHERE id = p_envelope;
    IF e.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_envelope));
    END IF;
    IF e.type <> 'command.confirmation' OR e.format <> 'json' THEN
        PERFORM agentpost._fail('AP400', format(
            'envelope %s is a %s (%s), not a json command.confirmation', e.id, e.type, e.format));
    END IF;
    IF e.origin <> 'human' OR e.sender NOT LIKE 'human:%' THEN
        PERFORM agentpost._fail('AP403', format(
            'envelope %s was not sent by a person through the human highway', e.id));
    END IF;
    IF e.status NOT IN ('validated', 'acknowledged') THEN
        PERFORM agentpost._fail('AP409', format('envelope %s is %s', e.id, e.status));
    END IF;
    v_content := e.content::jsonb;
    IF jsonb_typeof(v_content) <> 'object' OR coalesce(v_content ->> 'command_id', '') = '' THEN
        PERFORM agentpost._fail('AP400', format('envelope %s names no command_id', e.id));
    END IF;
    SELECT * INTO c FROM agentpost.commands WHERE id = v_content ->> 'command_id' FOR UPDATE;
    IF c.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown command %L', v_content ->> 'command_id'));
    END IF;
    IF e.recipient <> c.workspace THEN
        PERFORM agentpost._fail('AP403', format(
            'envelope %s went to %s, not to the command''s workspace %s', e.id, e.recipient,
            c.workspace));
    END IF;
    IF c.state = 'confirmation_required' AND e.created_at < c.updated_at THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %s predates the confirmation request of command %s', e.id, c.id));
    END IF;
    RETURN agentpost._command_decide(c, coalesce(v_content ->> 'decision', ''), e.sender,
        jsonb_build_object('envelope_id', e.id, 'user', e.originator));
END $$;

-- End an execution: started -> executed (with the outcome) or failed (with the reason). An
-- executed cancel or compensate moves its target (canceled / compensated) in this transaction;
-- a target that moved on meanwhile fails the recovery command instead. A command that is no
-- longer started (swept, canceled) records the late attempt and is returned as it is.
CREATE FUNCTION agentpost.command_finish(p_id text, p_to text, p_outcome jsonb, p_reason text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands := agentpost._command_lock(p_id);
    t agentpost.commands;
    v_to text := p_to;
    v_reason text := p_reason;
    v_chains text[] := ARRAY['command:' || p_id];
    v_bodies jsonb[];
    v_target jsonb;
BEGIN
    IF p_to NOT IN ('executed', 'failed') THEN
        PERFORM agentpost._fail('AP400', format('an execution ends executed or failed, not %L',
                                                p_to));
    END IF;
    IF c.state <> 'started' THEN
        PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
            c, c.state, p_to, 'invalid_transition_attempt',
            jsonb_build_object('refusal', 'transition_not_allowed',
                               'outcome_present', p_outcome IS NOT NULL))]);
        RETURN jsonb_build_object('status', 'refused', 'refusal', 'transition_not_allowed',
                                  'view', agentpost._command_json(c, false));
    END IF;
    IF p_to = 'executed' AND c.kind IN ('cancel', 'compensate') THEN
        t := agentpost._command_lock(c.target_command_id);
        IF NOT EXISTS (SELECT 1 FROM agentpost.command_recovery r
                        WHERE r.state = t.state AND r.kind = c.kind) THEN
            v_to := 'failed';
            v_reason := 'target_' || t.state;
        ELSE
            v_target := jsonb_build_object(
                'from', t.state, 'to', CASE c.kind WHEN 'cancel' THEN 'canceled'
                                                   ELSE 'compensated' END);
        END IF;
    END IF;
    UPDATE agentpost.commands
       SET state = v_to, updated_at = clock_timestamp(), lease_expires_at = NULL,
           outcome = p_outcome, reason = v_reason
     WHERE id = p_id RETURNING * INTO c;
    v_bodies := ARRAY[agentpost._command_body(c, 'started', v_to, 'state_change',
        jsonb_build_object('reason', v_reason, 'outcome_present', p_outcome IS NOT NULL))];
    IF v_target IS NOT NULL THEN
        -- compensation is append-only: the target keeps its outcome
        UPDATE agentpost.commands
           SET state = v_target ->> 'to', updated_at = clock_timestamp(),
               lease_expires_at = NULL,
               reason = CASE WHEN c.kind = 'cancel' THEN 'canceled_by:' || c.id ELSE reason END
         WHERE id = t.id RETURNING * INTO t;
        v_chains := v_chains || ('command:' || t.id);
        v_bodies := v_bodies || agentpost._command_body(
            t, v_target ->> 'from', v_target ->> 'to', 'state_change',
            CASE c.kind WHEN 'cancel'
                 THEN jsonb_build_object('reason', t.reason, 'cancel_command_id', c.id)
                 ELSE jsonb_build_object('compensation_command_id', c.id) END);
    END IF;
    PERFORM agentpost._command_trail(v_chains, v_bodies);
    RETURN jsonb_build_object('status', 'ok', 'view', agentpost._command_json(c, false));
END $$;

-- The executors are alive: extend the leases of these started commands (one call for every
-- command a process runs). Returns how many were still started.
CREATE FUNCTION agentpost.command_heartbeat(p_ids text[], p_lease_ms int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    UPDATE agentpost.commands
       SET lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_ms / 1000.0)
     WHERE id = ANY (p_ids) AND state = 'started';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Started commands whose executor stopped renewing its lease: -> failed, reason executor_lost
-- (the RFC's started -> failed; retry, reprocess or compensate may follow). Skips rows
-- another transaction holds (finishing, or swept concurrently).
CREATE FUNCTION agentpost.command_sweep(p_limit int) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands;
    v_ids text[] := '{}';
    v_chains text[] := '{}';
    v_bodies jsonb[] := '{}';
BEGIN
    FOR c IN
        UPDATE agentpost.commands x
           SET state = 'failed', reason = 'executor_lost', updated_at = clock_timestamp(),
               lease_expires_at = NULL
         WHERE x.id IN (SELECT id FROM agentpost.commands
                         WHERE state = 'started' AND lease_expires_at < clock_timestamp()
                         ORDER BY lease_expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING x.*
    LOOP
        v_ids := v_ids || c.id;
        v_chains := v_chains || ('command:' || c.id);
        v_bodies := v_bodies || agentpost._command_body(c, 'started', 'failed', 'state_change',
            jsonb_build_object('reason', 'executor_lost', 'decided_by', 'sweep'));
    END LOOP;
    IF cardinality(v_ids) > 0 THEN
        PERFORM agentpost._command_trail(v_chains, v_bodies);
    END IF;
    RETURN to_jsonb(v_ids);
END $$;

-- Attempt a transition through the generic path. What the machine forbids is refused with
-- invalid_transition_attempt evidence (status refused); a transition only a gate or an
-- execution may take raises AP403 and changes nothing.
CREATE FUNCTION agentpost.command_transition(p_id text, p_to text, p_context jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands;
    v_from text;
    v_refusal text;
BEGIN
    IF NOT p_to = ANY (agentpost._command_states()) THEN
        PERFORM agentpost._fail('AP400', format('unknown command state %L', p_to));
    END IF;
    c := agentpost._command_lock(p_id);
    v_from := c.state;
    v_refusal := agentpost._command_refusal(c, p_to, coalesce(p_context, '{}'));
    IF v_refusal IS NOT NULL THEN
        PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
            c, v_from, p_to, 'invalid_transition_attempt',
            jsonb_build_object('refusal', v_refusal, 'context', p_context))]);
        RETURN jsonb_build_object('status', 'refused', 'refusal', v_refusal,
                                  'view', agentpost._command_json(c, false));
    END IF;
    IF p_to <> 'authz_pending' THEN
        PERFORM agentpost._fail('AP403', format(
            '%s→%s is decided by %s, not by a direct transition', v_from, p_to,
            CASE p_to WHEN 'confirmation_required' THEN 'request_confirmation'
                      WHEN 'confirmed' THEN 'a confirmation (need or human envelope)'
                      WHEN 'authorized' THEN 'the permission matrix (authorize)'
                      WHEN 'rejected' THEN 'the permission matrix (authorize)'
                      WHEN 'started' THEN 'execute or run'
                      WHEN 'canceled' THEN 'a cancel command'
                      WHEN 'compensated' THEN 'a compensate command'
                      ELSE 'the execution (execute, run or sweep)' END));
    END IF;
    UPDATE agentpost.commands SET state = p_to, updated_at = clock_timestamp()
     WHERE id = p_id RETURNING * INTO c;
    PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
        c, v_from, p_to, 'state_change', jsonb_build_object('context', p_context))]);
    RETURN jsonb_build_object('status', 'ok', 'view', agentpost._command_json(c, false));
END $$;

-- The authorization gate alone: (canonicalized|confirmed ->) authz_pending -> authorized or
-- rejected, decided by the permission matrix, without starting.
CREATE FUNCTION agentpost.command_authorize(p_id text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c agentpost.commands := agentpost._command_lock(p_id);
    v_decision jsonb;
    v_bodies jsonb[] := '{}';
BEGIN
    IF c.state NOT IN ('canonicalized', 'confirmed', 'authz_pending') THEN
        PERFORM agentpost._command_write(p_id, ARRAY[agentpost._command_body(
            c, c.state, 'authz_pending', 'invalid_transition_attempt',
            jsonb_build_object('refusal', 'transition_not_allowed'))]);
        RETURN jsonb_build_object('status', 'refused', 'refusal', 'transition_not_allowed',
                                  'view', agentpost._command_json(c, false));
    END IF;
    IF c.state <> 'authz_pending' THEN
        v_bodies := v_bodies || agentpost._command_body(c, c.state, 'authz_pending',
            'state_change', jsonb_build_object('auto_confirm', c.auto_confirm,
                                               'confirmed_by', c.confirmed_by));
    END IF;
    v_decision := agentpost._command_authz(c);
    c.state := CASE WHEN v_decision ->> 'decision' = 'allow' THEN 'authorized' ELSE 'rejected' END;
    c.authorized := c.state = 'authorized';
    c.reason := v_decision ->> 'reason';
    c.updated_at := clock_timestamp();
    v_bodies := v_bodies || agentpost._command_body(c, 'authz_pending', c.state, 'state_change',
                                                    v_decision);
    PERFORM agentpost._command_save(c);
    PERFORM agentpost._command_write(p_id, v_bodies);
    RETURN jsonb_build_object('status', c.state, 'view', agentpost._command_json(c, false));
END $$;

CREATE FUNCTION agentpost.command_view(p_id text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c agentpost.commands;
BEGIN
    SELECT * INTO c FROM agentpost.commands WHERE id = p_id;
    IF c.id IS NULL THEN
        PERFORM agentpost._fail('AP404', format('unknown command %L', p_id));
    END IF;
    RETURN agentpost._command_json(c, false);
END $$;

-- The resolved copy of a confirmation need in a Postgres mark space of this database (the
-- copy supersedes the need and names the resolving action), or NULL while unresolved.
CREATE FUNCTION agentpost.command_need_resolution(p_space text, p_need uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT m.id::text FROM agentpost.marks m
     WHERE m.space = p_space AND m.supersedes = p_need AND m.mark_type = 'need'
       AND m.resolved_by IS NOT NULL
     LIMIT 1;
$$;
