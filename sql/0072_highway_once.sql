-- The human highway acts once (issue 22): one recovery of a command at a time, no recovery of
-- a compensated command, and single-use keys for a person's requeue.
--
-- Recoveries. A recovery command *stands* while it runs (started), or while it waits
-- (canonicalized ... authorized), is not declined and its target's state still offers its
-- kind, i.e. while it could still start (agentpost.protocol.commands.stands). A new recovery
-- of a target is refused (AP409, nothing written) while another one stands: the check runs in
-- _command_check_submit under the target's row lock, which the insert keeps until it commits,
-- so of two recoveries submitted at once one is created and the other refused. A target is
-- thus never re-run (retry, reprocess) and undone (compensate) at once, nor compensated or
-- canceled twice. And no recovery starts once its target's state no longer offers its kind:
-- a retry of a command compensated meanwhile is refused with target_not_recoverable, like a
-- second compensation (rows written before this rule can still be in that position).
--
-- Requeue. agentpost.requeue gains a fourth argument, the single-use key of a person's
-- confirmation: the first call with a key requeues and records the key with its result in
-- the same transaction; a later call with the key acts no more and returns that result
-- (duplicate true), even if the envelope was dead-lettered again since. The key is claimed
-- before anything else, so a concurrent replay waits for the first call and then finds it.

CREATE TABLE agentpost.highway_keys (
    key        text PRIMARY KEY,
    action     text NOT NULL,
    subject    text NOT NULL,
    originator text NOT NULL,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The first standing recovery of p_target, whose state is p_state.
CREATE FUNCTION agentpost._command_standing(p_target text, p_state text)
RETURNS agentpost.commands LANGUAGE sql STABLE AS $$
    SELECT s.* FROM agentpost.commands s
     WHERE s.target_command_id = p_target
       AND (s.state = 'started'
            OR (s.state IN ('canonicalized', 'confirmation_required', 'confirmed',
                            'authz_pending', 'authorized')
                AND NOT s.declined
                AND EXISTS (SELECT 1 FROM agentpost.command_recovery r
                             WHERE r.state = p_state AND r.kind = s.kind)))
     ORDER BY s.created_at, s.id
     LIMIT 1;
$$;

-- sql/0008's checks of a request become _command_check_request; _command_check_submit
-- (which command_submit calls) is now those checks, then the standing rule, under the
-- target's row lock that they took (FOR UPDATE).
ALTER FUNCTION agentpost._command_check_submit(text, text, text, text, text)
    RENAME TO _command_check_request;

CREATE FUNCTION agentpost._command_check_submit(p_workspace text, p_kind text, p_target text,
                                                p_action text, p_executor text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t agentpost.commands;
    s agentpost.commands;
BEGIN
    PERFORM agentpost._command_check_request(p_workspace, p_kind, p_target, p_action,
                                             p_executor);
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

-- May this recovery start? Its target's state still offers its kind, no other recovery of
-- the target runs, and (cancel, compensate) no sibling of its kind ran: a target is
-- canceled or compensated once, and nothing is re-run or undone once it is compensated.
CREATE OR REPLACE FUNCTION agentpost._command_target_ok(c agentpost.commands) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM agentpost.commands t
                     JOIN agentpost.command_recovery r ON r.state = t.state AND r.kind = c.kind
                    WHERE t.id = c.target_command_id)
       AND NOT EXISTS (SELECT 1 FROM agentpost.commands s
                        WHERE s.target_command_id = c.target_command_id AND s.id <> c.id
                          AND (s.state = 'started'
                               OR (s.kind = c.kind AND s.kind IN ('cancel', 'compensate')
                                   AND s.state = 'executed')));
END $$;

-- Claim a single-use key for p_action on p_subject by p_user: NULL when this call claimed it
-- (the caller acts, in this transaction, and records its result), else the result recorded
-- when the key was first used, with duplicate true. A key used for another action, subject
-- or person is a conflict.
CREATE FUNCTION agentpost._highway_claim(p_key text, p_action text, p_subject text,
                                         p_user text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    k agentpost.highway_keys;
BEGIN
    IF coalesce(length(p_key), 0) NOT BETWEEN 1 AND 200 THEN
        PERFORM agentpost._fail('AP400', 'a confirmation key has 1 to 200 characters');
    END IF;
    INSERT INTO agentpost.highway_keys (key, action, subject, originator)
    VALUES (p_key, p_action, p_subject, p_user)
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO k FROM agentpost.highway_keys WHERE key = p_key;
    IF k.action <> p_action OR k.subject <> p_subject OR k.originator <> p_user THEN
        PERFORM agentpost._fail('AP409', format(
            'confirmation key %L was already used for another action', p_key));
    END IF;
    RETURN coalesce(k.result, '{}') || jsonb_build_object('duplicate', true);
END $$;

-- A person's requeue under a single-use key (see the top of this file).
CREATE FUNCTION agentpost.requeue(p_ws text, p_id text, p_user text, p_key text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v jsonb;
BEGIN
    IF p_key IS NULL THEN
        RETURN agentpost.requeue(p_ws, p_id, p_user);
    END IF;
    v := agentpost._highway_claim(p_key, 'requeue', p_ws || '/' || p_id, p_user);
    IF v IS NOT NULL THEN
        RETURN v;
    END IF;
    v := agentpost.requeue(p_ws, p_id, p_user);
    UPDATE agentpost.highway_keys SET result = v WHERE key = p_key;
    RETURN v || jsonb_build_object('duplicate', false);
END $$;
