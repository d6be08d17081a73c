-- The Spark audit's reports (issue: Spark over the trail): one row per run, written by the
-- job when it ends, shown on the agentpost page's analytics view and in the task's log.
-- `report` is the whole report as JSON: {"ok": ..., "checks": {"<check>": {"checked": n,
-- "failed": m, "first": ["<offending id>", ...]}, ...}, ...}.
CREATE TABLE agentpost.audit_reports (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the snapshot the audit read: entries committed by then
    taken_at    timestamptz NOT NULL,
    ok          boolean     NOT NULL,
    entries     bigint      NOT NULL CHECK (entries >= 0),
    failed      bigint      NOT NULL CHECK (failed >= 0),
    report      jsonb       NOT NULL,
    CHECK (ok = (failed = 0)),
    CHECK (finished_at >= started_at)
);
CREATE INDEX audit_reports_newest ON agentpost.audit_reports (finished_at DESC);
