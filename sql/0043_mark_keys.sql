-- Caller-chosen keys of the mark space (agentpost.marks.keys): at most one mark write, or one
-- guarded call, per key in a space, so that a retried caller (an Airflow task try) finds
-- what its earlier attempt did instead of doing it again.
--
-- kind 'write': mark_id is the mark written under the key, inserted in the write's
-- transaction. kind 'execute': a guarded call. Its row is inserted, and committed on its own,
-- before the tool runs (outside the guard's lock transaction, which a crash rolls back), and
-- mark_id is set to the action recording the outcome in the action's transaction. A row
-- without mark_id is a call that started and recorded no outcome: it may or may not have
-- acted, and only a person releases it (the row is deleted). A failed call (failed = true,
-- the tool raised) may be started again: calls counts the starts. There is no expiry.

CREATE TABLE agentpost.mark_keys (
    space      text    NOT NULL,
    key        text    NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    kind       text    NOT NULL CHECK (kind IN ('write', 'execute')),
    agent_id   uuid    NOT NULL,
    scope      text    NOT NULL,
    resource   text,
    -- the ALLOWed intent of the call (kind execute)
    intent_id  uuid,
    mark_id    uuid,
    failed     boolean NOT NULL DEFAULT false,
    -- the space's clock when the write was made or the call started
    started_at float8  NOT NULL,
    calls      integer NOT NULL DEFAULT 1,
    PRIMARY KEY (space, key),
    CHECK (kind = 'execute' OR mark_id IS NOT NULL),
    CHECK (mark_id IS NOT NULL OR NOT failed)
);
