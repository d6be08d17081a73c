-- Command events and read-only lookups for SMCL commands (sql/0008_commands.sql).
--
-- Every change a waiter may be waiting for NOTIFYs `agentpost_command` with the command's id
-- as payload: the row's insert (submit), every change of its state (gates, start, end,
-- sweep, cancel/compensate of a target, a confirmation) and a decline, which marks the
-- command declined without changing its state. The notification is sent when the
-- transaction that made the change commits, and Postgres folds identical notifications of
-- one transaction into one, so a fast path (submit .. started in one statement) notifies
-- once. A lease renewal notifies nothing. A notification is only a hint: listeners re-read
-- the command.
--
-- command_find and command_recoveries read without writing anything (no evidence), unlike a
-- duplicate submit, which records duplicate_delivery.

CREATE FUNCTION agentpost._notify_command() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agentpost_command', NEW.id);
    RETURN NULL;
END $$;

CREATE TRIGGER commands_inserted_notify
    AFTER INSERT ON agentpost.commands
    FOR EACH ROW EXECUTE FUNCTION agentpost._notify_command();

CREATE TRIGGER commands_changed_notify
    AFTER UPDATE OF state, declined ON agentpost.commands
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state
                       OR OLD.declined IS DISTINCT FROM NEW.declined)
    EXECUTE FUNCTION agentpost._notify_command();

-- The command of (workspace, idempotency key), or NULL when there is none. An unknown
-- workspace is AP404 (as for a submit), so a misspelt name is not mistaken for "no command".
CREATE FUNCTION agentpost.command_find(p_workspace text, p_key text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c agentpost.commands;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = p_workspace) THEN
        PERFORM agentpost._fail('AP404', format('unknown workspace %L', p_workspace));
    END IF;
    SELECT * INTO c FROM agentpost.commands
     WHERE workspace = p_workspace AND idempotency_key = p_key;
    IF c.id IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN agentpost._command_json(c, false);
END $$;

-- The recovery commands targeting p_id (of kind p_kind, or every kind when NULL), oldest
-- first, through the commands_target index. AP404 for an unknown command.
CREATE FUNCTION agentpost.command_recoveries(p_id text, p_kind text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_kind IS NOT NULL AND p_kind NOT IN ('retry', 'cancel', 'reprocess', 'compensate') THEN
        PERFORM agentpost._fail('AP400', format('unknown recovery kind %L', p_kind));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agentpost.commands WHERE id = p_id) THEN
        PERFORM agentpost._fail('AP404', format('unknown command %L', p_id));
    END IF;
    RETURN coalesce((
        SELECT jsonb_agg(agentpost._command_json(c, false) ORDER BY c.created_at, c.id)
          FROM agentpost.commands c
         WHERE c.target_command_id = p_id AND (p_kind IS NULL OR c.kind = p_kind)), '[]');
END $$;
