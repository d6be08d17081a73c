-- What the metrics endpoint reads without walking history (issue 26).
--
-- /agentpost/metrics (agentpost.web.metrics) is scraped every few seconds for months, so each
-- number it serves must cost what the live state costs, never what the history costs:
-- inbox depth, in-flight and oldest age come from the envelopes_ready slice, dead letters and
-- redeliveries from inbox_counters, commands by state from commands_state_newest, the event
-- claim backlog from event_claims_pending. Two numbers had no such place:
--
-- - rejections by reason: a partial index over the rejected envelopes alone. A send that is
--   accepted does not touch it (its row fails the predicate), so the send path pays nothing;
--   the count walks only the rejections.
-- - when the trail was last verified: trail_verifications, one row per verification the
--   maintenance DAG's verify task (or `agentpost trail verify --record`) made, with what it
--   found. The store's own verify_trail() stays read-only: recording is the caller's choice.

CREATE INDEX envelopes_rejected ON agentpost.envelopes (reason) WHERE status = 'rejected';

CREATE TABLE agentpost.trail_verifications (
    id          bigserial PRIMARY KEY,
    verified_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ok          boolean NOT NULL,
    entries     bigint NOT NULL CHECK (entries >= 0),
    -- the checkpoint file it was checked against (its name), NULL: the whole trail
    anchor      text CHECK (length(anchor) <= 500),
    by          text NOT NULL CHECK (by <> '' AND length(by) <= 200)
);

CREATE INDEX trail_verifications_ok ON agentpost.trail_verifications (verified_at DESC)
    WHERE ok;
