-- The agentpost page (issue 13) lists commands and routes newest first, with filters, and
-- must stay fast on a large store: every listing is an index scan that stops at its LIMIT.
-- Commands: newest first overall, per workspace, per state (keyset paging on (created_at,
-- id)). A workspace and a state together use the workspace index and filter on the state.
-- Routes: the most recently changed routed envelopes.
CREATE INDEX commands_newest ON agentpost.commands (created_at DESC, id DESC);
CREATE INDEX commands_workspace_newest
    ON agentpost.commands (workspace, created_at DESC, id DESC);
CREATE INDEX commands_state_newest ON agentpost.commands (state, created_at DESC, id DESC);
CREATE INDEX routes_recent ON agentpost.routes (updated_at DESC, id DESC);
