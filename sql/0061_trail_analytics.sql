-- Trail analytics (issue 13 shows them, issue 14's Spark jobs compute them): one table per
-- question, every row keyed by its time window [window_start, window_end). A job that
-- (re)computes a window replaces that window's rows in one transaction:
--     DELETE FROM <table> WHERE window_start = $1 AND window_end = $2; INSERT ...
-- and records the run in analytics_runs (one row per job and window, upserted). Counts are
-- whole numbers >= 0, rates fractions in [0, 1], latencies milliseconds. The page reads the
-- latest window of each table through its primary key (window_start leads it).

CREATE TABLE agentpost.analytics_runs (
    job          text        NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    computed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    source_rows  bigint      NOT NULL DEFAULT 0 CHECK (source_rows >= 0),
    PRIMARY KEY (job, window_start, window_end),
    CHECK (window_end > window_start)
);
CREATE INDEX analytics_runs_newest ON agentpost.analytics_runs (computed_at DESC);

-- Delivery latency per inbox: created_at -> delivered_at of the envelopes delivered to it.
CREATE TABLE agentpost.analytics_inbox_latency (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    inbox        text        NOT NULL,
    delivered    bigint      NOT NULL CHECK (delivered >= 0),
    p50_ms       double precision NOT NULL CHECK (p50_ms >= 0),
    p95_ms       double precision NOT NULL CHECK (p95_ms >= p50_ms),
    p99_ms       double precision NOT NULL CHECK (p99_ms >= p95_ms),
    PRIMARY KEY (window_start, window_end, inbox),
    CHECK (window_end > window_start)
);

-- Redeliveries, dead letters and rejections per inbox and reason; rate = count / envelopes
-- sent to the inbox in the window.
CREATE TABLE agentpost.analytics_delivery_outcomes (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    inbox        text        NOT NULL,
    outcome      text        NOT NULL CHECK (outcome IN ('redelivered', 'dead_lettered',
                                                         'rejected')),
    reason       text        NOT NULL DEFAULT '',
    count        bigint      NOT NULL CHECK (count >= 0),
    rate         double precision NOT NULL CHECK (rate BETWEEN 0 AND 1),
    PRIMARY KEY (window_start, window_end, inbox, outcome, reason),
    CHECK (window_end > window_start)
);

-- Mark-space conflicts per scope and conflict policy, by outcome (won, lost, deferred, ...).
CREATE TABLE agentpost.analytics_conflicts (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    scope        text        NOT NULL,
    policy       text        NOT NULL,
    outcome      text        NOT NULL,
    count        bigint      NOT NULL CHECK (count >= 0),
    PRIMARY KEY (window_start, window_end, scope, policy, outcome),
    CHECK (window_end > window_start)
);

-- Commands per workspace and action: how they ended, and how many were compensated.
CREATE TABLE agentpost.analytics_commands (
    window_start      timestamptz NOT NULL,
    window_end        timestamptz NOT NULL,
    workspace         text        NOT NULL,
    action            text        NOT NULL,
    commands          bigint      NOT NULL CHECK (commands >= 0),
    executed          bigint      NOT NULL DEFAULT 0 CHECK (executed >= 0),
    failed            bigint      NOT NULL DEFAULT 0 CHECK (failed >= 0),
    rejected          bigint      NOT NULL DEFAULT 0 CHECK (rejected >= 0),
    canceled          bigint      NOT NULL DEFAULT 0 CHECK (canceled >= 0),
    compensated       bigint      NOT NULL DEFAULT 0 CHECK (compensated >= 0),
    compensation_rate double precision NOT NULL DEFAULT 0
        CHECK (compensation_rate BETWEEN 0 AND 1),
    PRIMARY KEY (window_start, window_end, workspace, action),
    CHECK (window_end > window_start)
);

-- Per-agent (workspace) activity, with the job's anomaly verdict.
CREATE TABLE agentpost.analytics_agent_activity (
    window_start   timestamptz NOT NULL,
    window_end     timestamptz NOT NULL,
    agent          text        NOT NULL,
    sent           bigint      NOT NULL DEFAULT 0 CHECK (sent >= 0),
    received       bigint      NOT NULL DEFAULT 0 CHECK (received >= 0),
    acked          bigint      NOT NULL DEFAULT 0 CHECK (acked >= 0),
    nacked         bigint      NOT NULL DEFAULT 0 CHECK (nacked >= 0),
    marks          bigint      NOT NULL DEFAULT 0 CHECK (marks >= 0),
    commands       bigint      NOT NULL DEFAULT 0 CHECK (commands >= 0),
    anomaly        boolean     NOT NULL DEFAULT false,
    anomaly_score  double precision,
    anomaly_reason text,
    PRIMARY KEY (window_start, window_end, agent),
    CHECK (window_end > window_start),
    CHECK (anomaly = (anomaly_reason IS NOT NULL))
);
