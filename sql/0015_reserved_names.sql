-- Reserved workspace ids. A workspace's id names its trail chain, so it must not be the name
-- of a chain the store writes for something else: `system` (registry changes), `human:<user>`
-- (the human highway), `command:<id>`, `saga:<id>`, `rule:<id>` (what an on-insert rule
-- sends). 0004's id alphabet already keeps ':' out of ids; `system` got through, and the
-- reason for the rest was not said. (agentpost.protocol.chains holds the same list.)
--
-- create_workspace of 0004 is kept, renamed, and called by a new create_workspace that checks
-- the id first; a later migration replacing create_workspace must keep the check.

CREATE FUNCTION agentpost._reserved_chain(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_name = 'system' OR p_name ~ '^(human|command|saga|rule):';
$$;

ALTER FUNCTION agentpost.create_workspace(text, text, text, text, boolean, text)
    RENAME TO _create_workspace;

CREATE FUNCTION agentpost.create_workspace(p_id text, p_role text, p_parent text,
                                           p_originator text, p_delegation boolean,
                                           p_caused_by text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF agentpost._reserved_chain(p_id) THEN
        PERFORM agentpost._fail('AP400', format(
            'workspace id %L is reserved: it names a trail chain that is not a workspace''s'
            ' (''system'', or one starting with human:, command:, saga:, rule:)', p_id));
    END IF;
    RETURN agentpost._create_workspace(p_id, p_role, p_parent, p_originator, p_delegation,
                                       p_caused_by);
END $$;
