-- The run that wrote a mark (issue 24).
--
-- An agent's tool calls are recorded with the run that made them: an envelope in its
-- Courier meta, a lease and its ack by their holder, a command in its context. A mark has
-- none of these: its fields are the Markspace protocol's, and the space's tables hold what
-- the protocol defines. mark_runs records, beside the mark, which seat wrote it through
-- which tool and call, and the run (agentpost.tools RunInfo: by, ref, attrs: for an Airflow
-- task the task instance), so the agents page can list an agent's marks among its calls,
-- each linked to its task instance. It is written after the mark, in its own statement
-- (the mark space's write has no place for it): a process that dies in between leaves a
-- mark without its run, never a run without its mark. Rows go with their marks' space
-- only by hand; gc() keeps them (a run stays known for the marks the agent left).

CREATE TABLE agentpost.mark_runs (
    space       text NOT NULL,
    mark_id     uuid NOT NULL,
    workspace   text NOT NULL CHECK (workspace <> '' AND length(workspace) <= 200),
    tool        text NOT NULL CHECK (tool <> '' AND length(tool) <= 64),
    call_id     text CHECK (length(call_id) <= 200),
    run         jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (space, mark_id)
);

-- the agents page: a seat's newest marks
CREATE INDEX mark_runs_workspace_newest ON agentpost.mark_runs (workspace, recorded_at DESC);
