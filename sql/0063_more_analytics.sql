-- The analytics job's two further tables (issue: Spark over the trail), by the conventions of
-- sql/0061_trail_analytics.sql: the window leads the primary key, a re-run of a window
-- replaces its rows (agentpost.spark.results.replace_window), counts are whole numbers >= 0,
-- latencies milliseconds, durations seconds. docs/ui.md, "Trail analytics", is the contract.

-- Delivery latency per channel (sender -> inbox): created_at -> delivered_at of the
-- envelopes delivered in the window, as analytics_inbox_latency but split by sender.
CREATE TABLE agentpost.analytics_channel_latency (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    sender       text        NOT NULL,
    inbox        text        NOT NULL,
    delivered    bigint      NOT NULL CHECK (delivered >= 0),
    p50_ms       double precision NOT NULL CHECK (p50_ms >= 0),
    p95_ms       double precision NOT NULL CHECK (p95_ms >= p50_ms),
    p99_ms       double precision NOT NULL CHECK (p99_ms >= p95_ms),
    PRIMARY KEY (window_start, window_end, sender, inbox),
    CHECK (window_end > window_start)
);

-- Need clusters (Markspace §8.4: per scope, needs with the same question key) per mark
-- space: needs opened in the window, needs resolved in the window (whenever opened), needs
-- opened in the window and still open at its end, and the time to resolution of the ones
-- resolved in the window (NULL when none was).
CREATE TABLE agentpost.analytics_needs (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    space        text        NOT NULL,
    scope        text        NOT NULL,
    cluster_key  text        NOT NULL,
    opened       bigint      NOT NULL DEFAULT 0 CHECK (opened >= 0),
    resolved     bigint      NOT NULL DEFAULT 0 CHECK (resolved >= 0),
    still_open   bigint      NOT NULL DEFAULT 0 CHECK (still_open >= 0 AND still_open <= opened),
    ttr_p50_s    double precision CHECK (ttr_p50_s >= 0),
    ttr_p95_s    double precision CHECK (ttr_p95_s >= ttr_p50_s),
    PRIMARY KEY (window_start, window_end, space, scope, cluster_key),
    CHECK (window_end > window_start),
    CHECK ((resolved = 0) = (ttr_p50_s IS NULL) AND (ttr_p50_s IS NULL) = (ttr_p95_s IS NULL))
);

COMMENT ON COLUMN agentpost.analytics_delivery_outcomes.rate IS
    'envelopes of the inbox with this outcome and reason in the window / envelopes of the '
    'inbox in play in the window (sent to it in the window, or with any outcome in it)';
