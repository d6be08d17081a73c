-- Registry changes, workspaces, their transitions, consumption and port-right management.
-- Each function is one protocol step: one transaction, its trail entries committed with it.
-- Error codes besides the generic ones of 0001: APT09 invalid transition, APB09 inbox held by
-- a blocking envelope.

CREATE FUNCTION agentpost.define_role(p_name text, p_inherits text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_lineage text[];
    v_existing record;
BEGIN
    IF p_name !~ '^[A-Za-z][A-Za-z0-9._-]*$' THEN
        PERFORM agentpost._fail('AP400', format(
            'role name %L must start with a letter and use only letters, digits, ".", "_", "-"',
            p_name));
    END IF;
    PERFORM agentpost._lock_chain('system');
    SELECT * INTO v_existing FROM agentpost.roles WHERE name = p_name;
    IF FOUND THEN
        IF v_existing.inherits IS NOT DISTINCT FROM p_inherits THEN
            RETURN jsonb_build_object('name', p_name, 'inherits', p_inherits, 'created', false);
        END IF;
        PERFORM agentpost._fail('AP409', format(
            'role %L already exists and inherits %L', p_name, v_existing.inherits));
    END IF;
    IF p_inherits IS NOT NULL THEN
        SELECT lineage INTO v_lineage FROM agentpost.roles WHERE name = p_inherits;
        IF NOT FOUND THEN
            PERFORM agentpost._fail('AP404', format('unknown role %L', p_inherits));
        END IF;
    END IF;
    INSERT INTO agentpost.roles (name, inherits, lineage)
    VALUES (p_name, p_inherits, ARRAY[p_name] || coalesce(v_lineage, '{}'));
    PERFORM agentpost._trail_one('system', 'role_defined', NULL,
        jsonb_build_object('role', p_name, 'inherits', p_inherits));
    RETURN jsonb_build_object('name', p_name, 'inherits', p_inherits, 'created', true);
END $$;

CREATE FUNCTION agentpost.register_type(p_name text, p_senders text[], p_receivers text[],
                                        p_required text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text;
    v_required text[];
    v_rows int;
BEGIN
    PERFORM agentpost._lock_chain('system');
    SELECT u INTO v_missing FROM unnest(p_senders || p_receivers) u
      LEFT JOIN agentpost.roles r ON r.name = u WHERE r.name IS NULL LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown role %L', v_missing));
    END IF;
    SELECT required_fields INTO v_required FROM agentpost.envelope_types WHERE name = p_name;
    IF FOUND THEN
        IF NOT (v_required @> p_required AND v_required <@ p_required) THEN
            PERFORM agentpost._fail('AP409', format(
                'type %L is already registered with required fields %s', p_name, v_required));
        END IF;
    ELSE
        INSERT INTO agentpost.envelope_types (name, required_fields) VALUES (p_name, p_required);
    END IF;
    INSERT INTO agentpost.permissions (type, sender_role, receiver_role)
    SELECT p_name, s, r FROM unnest(p_senders) s CROSS JOIN unnest(p_receivers) r
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM agentpost._trail_one('system', 'type_registered', NULL,
        jsonb_build_object('type', p_name, 'senders', p_senders, 'receivers', p_receivers,
                           'required_fields', p_required));
    RETURN jsonb_build_object('name', p_name, 'rows_added', v_rows);
END $$;

-- May a workspace of lineage p_from send anything to one of lineage p_to? (Rights along a
-- parent-child edge are created when it may.)
CREATE FUNCTION agentpost._may_send(p_from text[], p_to text[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM agentpost.permissions p
                    WHERE p.sender_role = ANY (p_from) AND p.receiver_role = ANY (p_to));
END $$;

CREATE FUNCTION agentpost.create_workspace(p_id text, p_role text, p_parent text,
                                           p_originator text, p_delegation boolean,
                                           p_caused_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_lineage text[];
    v_parent record;
    v_orig text := coalesce(p_originator, 'system');
    v_inherited text;
    v_id text;
    v_right text;
    r record;
    t_chain text[] := '{}'; t_event text[] := '{}'; t_env text[] := '{}';
    t_body jsonb[] := '{}';
BEGIN
    SELECT lineage INTO v_lineage FROM agentpost.roles WHERE name = p_role;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown role %L', p_role));
    END IF;
    IF p_parent IS NOT NULL THEN
        SELECT * INTO v_parent FROM agentpost.workspaces WHERE id = p_parent FOR SHARE;
        IF NOT FOUND THEN
            PERFORM agentpost._fail('AP404', format('unknown parent workspace %L', p_parent));
        END IF;
        IF v_parent.state IN ('integrating', 'closed', 'failed') THEN
            PERFORM agentpost._fail('AP409', format(
                'parent workspace %L is %s and cannot have children', p_parent, v_parent.state));
        END IF;
    END IF;
    -- originator propagates (WACP §3) from the causing envelope and from the parent; where
    -- both carry a user, it must be the same one
    IF p_caused_by IS NOT NULL THEN
        SELECT originator INTO v_inherited FROM agentpost.envelopes
         WHERE id = p_caused_by AND status IN ('validated', 'acknowledged');
        IF NOT FOUND THEN
            PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_caused_by));
        END IF;
    END IF;
    IF p_parent IS NOT NULL THEN
        IF v_parent.originator <> 'system' THEN
            IF v_inherited IS NOT NULL AND v_inherited <> 'system'
               AND v_inherited <> v_parent.originator THEN
                PERFORM agentpost._fail('AP409', format(
                    'originator is immutable: envelope %L carries %L but the parent carries %L',
                    p_caused_by, v_inherited, v_parent.originator));
            END IF;
            v_inherited := v_parent.originator;
        END IF;
    END IF;
    IF v_inherited IS NOT NULL AND v_inherited <> 'system' THEN
        IF v_orig <> 'system' AND v_orig <> v_inherited THEN
            PERFORM agentpost._fail('AP409', format(
                'originator is immutable: the new workspace inherits %L, not %L',
                v_inherited, v_orig));
        END IF;
        v_orig := v_inherited;
    END IF;
    IF p_id IS NOT NULL AND p_id !~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' THEN
        -- (':' in particular is reserved: human:<user> is the human highway's sender)
        PERFORM agentpost._fail('AP400', format(
            'workspace id %L may use only letters, digits, ".", "_" and "-"', p_id));
    END IF;
    v_id := coalesce(p_id, left(p_role, 24) || '-'
                           || left(replace(gen_random_uuid()::text, '-', ''), 12));
    INSERT INTO agentpost.workspaces (id, role, lineage, parent, originator, delegation)
    VALUES (v_id, p_role, v_lineage, p_parent, v_orig, p_delegation)
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP409', format('workspace %L already exists', v_id));
    END IF;

    t_chain := t_chain || v_id;
    t_event := t_event || 'workspace_created'::text;
    t_env := t_env || NULL::text;
    t_body := t_body || jsonb_build_object('workspace_id', v_id, 'role', p_role,
                                           'parent', p_parent, 'originator', v_orig,
                                           'delegation', p_delegation);
    IF p_parent IS NOT NULL THEN
        -- send rights along the new edge, each way, per the permission matrix (and
        -- delegation rows)
        FOR r IN SELECT * FROM (VALUES (p_parent, v_id, v_parent.lineage, v_lineage),
                                       (v_id, p_parent, v_lineage, v_parent.lineage))
                              AS e(holder, target, from_lineage, to_lineage)
        LOOP
            CONTINUE WHEN NOT (agentpost._may_send(r.from_lineage, r.to_lineage)
                               OR v_parent.delegation);
            INSERT INTO agentpost.port_rights (holder, target, kind, created_by)
            VALUES (r.holder, r.target, 'send', 'runtime') RETURNING id INTO v_right;
            t_chain := t_chain || v_id;
            t_event := t_event || 'port_right_created'::text;
            t_env := t_env || NULL::text;
            t_body := t_body || jsonb_build_object('right_id', v_right, 'right_type', 'send',
                                                   'holder', r.holder, 'target', r.target,
                                                   'created_by', 'runtime');
        END LOOP;
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body);
    RETURN (SELECT to_jsonb(w) FROM agentpost.workspaces w WHERE w.id = v_id);
END $$;

-- Move a workspace to a new state. Resuming delivers what queued (in order); sealing records
-- everything still queued for it as undeliverable, in a second transaction.
CREATE PROCEDURE agentpost.transition(p_ws text, p_state text,
                                      INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_from text;
    v_delivered int := 0;
    v_undelivered int := 0;
BEGIN
    PERFORM agentpost._lock_chain(p_ws);
    SELECT state INTO v_from FROM agentpost.workspaces WHERE id = p_ws FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown workspace %L', p_ws));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agentpost.workspace_transitions
                    WHERE from_state = v_from AND to_state = p_state) THEN
        PERFORM agentpost._fail('APT09', format(
            'workspace %L cannot go from %s to %s', p_ws, v_from, p_state));
    END IF;
    UPDATE agentpost.workspaces SET state = p_state, updated_at = clock_timestamp()
     WHERE id = p_ws;
    PERFORM agentpost._trail_one(p_ws, 'workspace_transition', NULL,
        jsonb_build_object('workspace_id', p_ws, 'from_state', v_from, 'to_state', p_state));
    IF p_state IN ('idle', 'active', 'blocked') THEN
        v_delivered := agentpost._drain(p_ws);
    END IF;
    COMMIT;
    IF p_state IN ('integrating', 'closed', 'failed') THEN
        -- (a send validated just before this commit and committed after this sweep is swept
        -- by its own delivery phase, which finds the workspace sealed)
        v_undelivered := agentpost._sweep_sealed(p_ws);
        COMMIT;
    END IF;
    p_result := jsonb_build_object('workspace_id', p_ws, 'from_state', v_from,
                                   'to_state', p_state, 'delivered', v_delivered,
                                   'undeliverable', v_undelivered);
END $$;

-- The receiver has acted on an envelope. While a blocking envelope waits, only it (the
-- first blocking one, in channel order among themselves) may be consumed; consuming it
-- reopens delivery.
CREATE FUNCTION agentpost.consume(p_ws text, p_id text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    e record;
    v_gate text;
BEGIN
    PERFORM agentpost._lock_chain(p_ws);
    SELECT x.status, x.consumed_at, x.rank, x.sender INTO e
      FROM agentpost.envelopes x WHERE x.id = p_id AND x.recipient = p_ws;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format(
            'envelope %L is not in the inbox of %L', p_id, p_ws));
    END IF;
    IF e.status <> 'acknowledged' THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %L has not been delivered (status %s)', p_id, e.status));
    END IF;
    IF e.consumed_at IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format('envelope %L was already consumed', p_id));
    END IF;
    SELECT x.id INTO v_gate FROM agentpost.envelopes x
     WHERE x.recipient = p_ws AND x.status = 'acknowledged' AND x.consumed_at IS NULL
       AND x.rank = 0
     ORDER BY x.seq LIMIT 1;
    IF v_gate IS NOT NULL AND v_gate <> p_id THEN
        PERFORM agentpost._fail('APB09', format(
            'the inbox of %L is held by blocking envelope %L; consume it first', p_ws, v_gate));
    END IF;
    UPDATE agentpost.envelopes SET consumed_at = clock_timestamp() WHERE id = p_id;
    PERFORM agentpost._trail_one(p_ws, 'envelope_consumed', p_id,
        jsonb_build_object('envelope_id', p_id, 'workspace_id', p_ws));
    IF e.rank = 0 THEN
        RETURN agentpost._drain(p_ws);
    END IF;
    RETURN 0;
END $$;

-- A workspace's role lineage; an unknown workspace is an error.
CREATE FUNCTION agentpost._lineage_of(p_ws text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text[];
BEGIN
    SELECT lineage INTO v FROM agentpost.workspaces WHERE id = p_ws;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown workspace %L', p_ws));
    END IF;
    RETURN v;
END $$;

-- Mint a right: the target itself (it holds the receive right) or a coordinator may.
CREATE FUNCTION agentpost.grant_right(p_by text, p_holder text, p_target text, p_kind text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_by text[];
    v_right text;
BEGIN
    v_by := agentpost._lineage_of(p_by);
    PERFORM agentpost._lineage_of(p_holder), agentpost._lineage_of(p_target);
    IF p_by <> p_target AND NOT 'coordinator' = ANY (v_by) THEN
        PERFORM agentpost._fail('AP403', format(
            'only %L itself or a coordinator may grant rights to it', p_target));
    END IF;
    INSERT INTO agentpost.port_rights (holder, target, kind, created_by)
    VALUES (p_holder, p_target, p_kind, p_by) RETURNING id INTO v_right;
    PERFORM agentpost._trail_one(p_holder, 'port_right_created', NULL,
        jsonb_build_object('right_id', v_right, 'right_type', p_kind, 'holder', p_holder,
                           'target', p_target, 'created_by', p_by));
    RETURN v_right;
END $$;

CREATE FUNCTION agentpost.revoke_right(p_right text, p_by text, p_reason text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_by text[];
    r record;
BEGIN
    v_by := agentpost._lineage_of(p_by);
    IF NOT 'coordinator' = ANY (v_by) THEN
        PERFORM agentpost._fail('AP403', format(
            'only a coordinator may revoke rights; %L is not one', p_by));
    END IF;
    SELECT * INTO r FROM agentpost.port_rights WHERE id = p_right;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown port right %L', p_right));
    END IF;
    PERFORM agentpost._lock_chain(r.holder);
    SELECT * INTO r FROM agentpost.port_rights WHERE id = p_right FOR UPDATE;
    IF r.state <> 'live' THEN
        PERFORM agentpost._fail('AP409', format('port right %L is %s', p_right, r.state));
    END IF;
    UPDATE agentpost.port_rights SET state = 'revoked', ended_at = clock_timestamp()
     WHERE id = p_right;
    PERFORM agentpost._trail_one(r.holder, 'port_right_revoked', NULL,
        jsonb_build_object('right_id', p_right, 'right_type', r.kind, 'holder', r.holder,
                           'target', r.target, 'revoked_by', p_by, 'reason', p_reason));
    RETURN jsonb_build_object('right_id', p_right, 'holder', r.holder, 'target', r.target);
END $$;
