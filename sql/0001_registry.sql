-- Registry: roles, the envelope taxonomy, the permission matrix, workspaces, port rights.
-- Everything agentpost owns lives in the schema `agentpost`, so it can share a database.

CREATE SCHEMA IF NOT EXISTS agentpost;

-- Errors raised by our functions carry SQLSTATEs of class "AP" so the Python layer can map
-- them to typed exceptions: AP400 bad input, AP403 forbidden, AP404 unknown, AP409 conflict.
CREATE FUNCTION agentpost._fail(p_code text, p_message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END $$;

CREATE TABLE agentpost.roles (
    name       text PRIMARY KEY,
    inherits   text REFERENCES agentpost.roles (name),
    -- the role itself followed by its ancestors; fixed at definition, so checks need no recursion
    lineage    text[] NOT NULL,
    builtin    boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO agentpost.roles (name, inherits, lineage, builtin) VALUES
    ('coordinator', NULL, '{coordinator}', true),
    ('worker', NULL, '{worker}', true),
    ('observer', NULL, '{observer}', true);

CREATE TABLE agentpost.envelope_types (
    name            text PRIMARY KEY,
    required_fields text[] NOT NULL DEFAULT '{}',
    builtin         boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now()
);

INSERT INTO agentpost.envelope_types (name, builtin) VALUES
    ('directive', true), ('feedback', true), ('query', true);

-- The permission matrix: one row per (type, sender role, receiver role). A derived role holds
-- every row of its ancestors (checked through workspaces.lineage).
CREATE TABLE agentpost.permissions (
    type          text NOT NULL REFERENCES agentpost.envelope_types (name),
    sender_role   text NOT NULL REFERENCES agentpost.roles (name),
    receiver_role text NOT NULL REFERENCES agentpost.roles (name),
    PRIMARY KEY (type, sender_role, receiver_role)
);

INSERT INTO agentpost.permissions (type, sender_role, receiver_role) VALUES
    ('directive', 'coordinator', 'worker'),
    ('feedback', 'coordinator', 'worker'),
    ('query', 'worker', 'coordinator');

CREATE TABLE agentpost.workspaces (
    id         text PRIMARY KEY,
    role       text NOT NULL REFERENCES agentpost.roles (name),
    lineage    text[] NOT NULL,
    parent     text REFERENCES agentpost.workspaces (id),
    originator text NOT NULL,
    delegation boolean NOT NULL DEFAULT false,
    state      text NOT NULL DEFAULT 'idle' CHECK (state IN (
        'idle', 'active', 'blocked', 'migrating', 'suspended', 'integrating', 'closed', 'failed')),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX workspaces_parent ON agentpost.workspaces (parent);

-- Allowed workspace transitions (WACP §4 inbox rules hang off these states).
CREATE TABLE agentpost.workspace_transitions (
    from_state text NOT NULL,
    to_state   text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);

INSERT INTO agentpost.workspace_transitions (from_state, to_state) VALUES
    ('idle', 'active'), ('idle', 'suspended'), ('idle', 'migrating'),
    ('idle', 'closed'), ('idle', 'failed'),
    ('active', 'blocked'), ('active', 'suspended'), ('active', 'migrating'),
    ('active', 'integrating'), ('active', 'closed'), ('active', 'failed'),
    ('blocked', 'active'), ('blocked', 'suspended'), ('blocked', 'migrating'),
    ('blocked', 'closed'), ('blocked', 'failed'),
    ('migrating', 'idle'), ('migrating', 'active'), ('migrating', 'blocked'),
    ('migrating', 'failed'),
    ('suspended', 'idle'), ('suspended', 'active'), ('suspended', 'blocked'),
    ('suspended', 'closed'), ('suspended', 'failed'),
    ('integrating', 'closed'), ('integrating', 'failed');

-- Port rights (WACP §5.6). A right lets `holder` send to `target`.
CREATE TABLE agentpost.port_rights (
    id           text PRIMARY KEY DEFAULT 'right-' || replace(gen_random_uuid()::text, '-', ''),
    holder       text NOT NULL,
    target       text NOT NULL REFERENCES agentpost.workspaces (id),
    kind         text NOT NULL CHECK (kind IN ('send', 'send_once')),
    -- live: usable; consumed: a send_once used; revoked: by a coordinator;
    -- in_transit: a send_once travelling inside an envelope, granted to the receiver on delivery
    state        text NOT NULL DEFAULT 'live'
                 CHECK (state IN ('live', 'consumed', 'revoked', 'in_transit', 'lost')),
    created_by   text NOT NULL,
    via_envelope text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at     timestamptz
);

CREATE INDEX port_rights_live ON agentpost.port_rights (holder, target, kind)
    WHERE state = 'live';
CREATE INDEX port_rights_in_transit ON agentpost.port_rights (via_envelope)
    WHERE state = 'in_transit';
