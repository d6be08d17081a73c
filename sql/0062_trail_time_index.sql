-- The Spark jobs over the trail read a time window of it (issue: Spark over the trail). Trail
-- ids grow with time but not strictly across chains, so a window's ids are found by `at`:
-- a BRIN index costs the append-only trail almost nothing to keep (one summary per 128
-- pages, no per-row entry on the send path) and narrows a window's scan to its block ranges.
CREATE INDEX trail_at_brin ON agentpost.trail USING brin (at);
