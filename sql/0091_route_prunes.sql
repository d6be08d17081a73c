-- What a prune dropped of the routes, beside what it dropped of the trail and the envelopes
-- (issue 26: a route's months leave with the trail's; `store/route_archive.py` says which
-- rows stay).
ALTER TABLE agentpost.trail_prunes ADD COLUMN routes bigint NOT NULL DEFAULT 0
    CHECK (routes >= 0);
