-- A recovery replayed while its first submission runs is a duplicate, not a conflict.
--
-- sql/0072 refuses a recovery while another recovery of its target stands, checked under the
-- target's row lock. Two processes submitting the *same* recovery (one idempotency key: racing
-- saga resumers compensating one step, a person's confirmation posted twice) both passed
-- command_submit's first look for the key before either had committed; the second then waited
-- for the target's lock, found the first's command standing, and was refused (AP409) where it
-- should have been answered with that very command. The key is now looked for again once the
-- target's lock is held, before the standing rule: the same key is a duplicate (and records
-- duplicate_delivery as any replay does), another key is still refused.

-- sql/0072's standing rule on its own, for command_submit to run after the second look.
CREATE FUNCTION agentpost._command_check_standing(p_kind text, p_target text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t agentpost.commands;
    s agentpost.commands;
BEGIN
    IF p_kind = 'primary' THEN
        RETURN;
    END IF;
    SELECT * INTO t FROM agentpost.commands WHERE id = p_target;
    s := agentpost._command_standing(t.id, t.state);
    IF s.id IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'command %s already has a recovery standing: %s %s is %s (one recovery of a '
            'command at a time)', t.id, s.kind, s.id, s.state));
    END IF;
END $$;

-- _command_check_submit keeps its meaning (request checks, then the standing rule) for any
-- other caller; command_submit now runs the two apart, with the second look for the key
-- between them.
CREATE OR REPLACE FUNCTION agentpost._command_check_submit(p_workspace text, p_kind text,
                                                           p_target text, p_action text,
                                                           p_executor text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._command_check_request(p_workspace, p_kind, p_target, p_action,
                                             p_executor);
    PERFORM agentpost._command_check_standing(p_kind, p_target);
END $$;

-- sql/0008's command_submit with the second look for the key (see the top of this file).
CREATE OR REPLACE FUNCTION agentpost.command_submit(
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
    PERFORM agentpost._command_check_request(p_workspace, p_kind, p_target, p_action,
                                             p_executor);
    -- The target's row lock is held from here: a replay that waited for it finds its key.
    IF EXISTS (SELECT 1 FROM agentpost.commands
                WHERE workspace = p_workspace AND idempotency_key = p_key) THEN
        RETURN jsonb_build_object('status', 'duplicate', 'view', agentpost._command_duplicate(
            p_workspace, p_key, p_kind, p_target, p_mutating, p_action, p_executor));
    END IF;
    PERFORM agentpost._command_check_standing(p_kind, p_target);
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
