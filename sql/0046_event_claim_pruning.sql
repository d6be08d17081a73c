-- The lifetime of event claims (0041, 0045). A claim must stay while the claim query could
-- otherwise hand its envelope out again. Each watcher keeps a cursor: the last arrival, in
-- arrival order (delivered_at, seq), up to which every arrival is confirmed. The claim query
-- never looks at or before the cursor, so confirmed claims there can go; so can claims of
-- envelopes no longer stored. Pending claims and confirmed ones after a gap stay.
--
-- Why arrival order is safe: deliveries to one inbox are serialized by its chain lock
-- (0003's _drain) and stamp delivered_at = clock_timestamp() under it, so they become
-- visible in delivered_at order, and an arrival not yet visible lands after the cursor.
-- p_margin keeps the cursor that far behind the clock, against a clock stepping back.

-- Move p_watcher's cursor over its contiguous confirmed arrivals older than p_margin and
-- delete the claims that no longer matter; returns how many were deleted.
CREATE FUNCTION agentpost._prune_watcher_claims(p_watcher text, p_margin interval)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_ws text;
    v_since timestamptz;
    v_at timestamptz;
    v_seq bigint;
    v_gap_at timestamptz;
    v_gap_seq bigint;
    v_limit timestamptz := clock_timestamp() - p_margin;
    v_n int;
    v_m int;
BEGIN
    SELECT workspace_id, since, cursor_at, cursor_seq INTO v_ws, v_since, v_at, v_seq
      FROM agentpost.event_watchers WHERE watcher = p_watcher FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- the first arrival after the cursor that is not confirmed (unclaimed or pending)
    SELECT e.delivered_at, e.seq INTO v_gap_at, v_gap_seq
      FROM agentpost.envelopes e
      LEFT JOIN agentpost.event_claims c ON c.watcher = p_watcher AND c.envelope_id = e.id
     WHERE e.recipient = v_ws AND e.delivered_at >= v_since AND e.delivered_at < v_limit
       AND (v_at IS NULL OR (e.delivered_at, e.seq) > (v_at, v_seq))
       AND c.confirmed_at IS NULL
     ORDER BY e.delivered_at, e.seq
     LIMIT 1;
    -- the cursor moves to the last confirmed arrival before that gap
    SELECT e.delivered_at, e.seq INTO v_at, v_seq
      FROM agentpost.envelopes e
      JOIN agentpost.event_claims c ON c.watcher = p_watcher AND c.envelope_id = e.id
     WHERE e.recipient = v_ws AND e.delivered_at >= v_since AND e.delivered_at < v_limit
       AND (v_gap_at IS NULL OR (e.delivered_at, e.seq) < (v_gap_at, v_gap_seq))
       AND c.confirmed_at IS NOT NULL
     ORDER BY e.delivered_at DESC, e.seq DESC
     LIMIT 1;
    IF FOUND THEN
        UPDATE agentpost.event_watchers w SET cursor_at = v_at, cursor_seq = v_seq
         WHERE w.watcher = p_watcher
           AND (w.cursor_at IS NULL OR (v_at, v_seq) > (w.cursor_at, w.cursor_seq));
    END IF;
    SELECT cursor_at, cursor_seq INTO v_at, v_seq
      FROM agentpost.event_watchers WHERE watcher = p_watcher;
    DELETE FROM agentpost.event_claims c
     USING agentpost.envelopes e
     WHERE c.watcher = p_watcher AND e.id = c.envelope_id AND c.confirmed_at IS NOT NULL
       AND v_at IS NOT NULL AND (e.delivered_at, e.seq) <= (v_at, v_seq);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM agentpost.event_claims c
     WHERE c.watcher = p_watcher
       AND NOT EXISTS (SELECT 1 FROM agentpost.envelopes e WHERE e.id = c.envelope_id);
    GET DIAGNOSTICS v_m = ROW_COUNT;
    RETURN v_n + v_m;
END $$;

-- Prune every watcher's claims; returns how many were deleted.
CREATE FUNCTION agentpost.prune_event_claims(p_margin interval) RETURNS int
LANGUAGE sql AS $$
    SELECT coalesce(sum(agentpost._prune_watcher_claims(watcher, p_margin)), 0)::int
      FROM (SELECT watcher FROM agentpost.event_watchers ORDER BY watcher) w
$$;

-- Forget watchers no trigger asked for in p_idle (their claims go with them). A watcher
-- that comes back starts afresh: arrivals count from its next claim, so what arrived while
-- it was dropped is not reported. Returns the dropped names.
CREATE FUNCTION agentpost.drop_event_watchers(p_idle interval) RETURNS text[]
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM agentpost.event_watchers WHERE seen_at < clock_timestamp() - p_idle
        RETURNING watcher)
    SELECT coalesce(array_agg(watcher ORDER BY watcher), '{}') FROM gone
$$;
