-- Which run of a DAG handled each arrival (agentpost.factories.reactive): exactly one run
-- per consumer (a DAG id; two DAGs on one asset each handle every arrival).
--
-- Why: Airflow keeps one AssetDagRunQueue row per (asset, DAG). An asset event stored while
-- that row exists, after the scheduler chose the run's window and before it deleted the
-- row, gets no queue row of its own and is newer than that run's window: it waits for the
-- next asset event's run, and if no envelope follows, it is never handled. Its claim,
-- though, was made (pending or confirmed, sql/0045) before its event was stored, so before
-- the run that stranded it was committed: that run's task sees it. So a run takes its own
-- arrivals plus every arrival its watcher claimed that no run of the consumer took yet.
--
-- The sweep is bounded: a consumer's `since` is set at its first take (the earliest
-- delivery among that run's own arrivals, else now), so a new DAG does not take an old
-- backlog; arrivals delivered before 0071 (a watcher's `handled_from`) are never swept,
-- their runs handled them. A per-consumer cursor, like the watcher's (sql/0046), keeps the
-- sweep to the arrivals after the last contiguous taken one. A claim pruned by 0046 is
-- behind its watcher's cursor, so arrivals there still count as claimed.
--
-- Marks must outlive claims: a stranded arrival comes back in a later run's window, maybe
-- much later, and that run must find it taken. They are pruned by age only
-- (prune_event_handled, a generous keep), and pruning raises each consumer's `since` to the
-- same horizon so nothing older is swept again. Remaining weakness: an arrival whose event
-- comes back in a run's window after its mark was pruned is handled a second time.

ALTER TABLE agentpost.event_watchers
    -- arrivals delivered before this are never swept (existing watchers: 0071's time)
    ADD COLUMN handled_from timestamptz NOT NULL DEFAULT clock_timestamp();

CREATE TABLE agentpost.event_consumers (
    consumer   text NOT NULL,
    watcher    text NOT NULL,
    -- arrivals delivered before this are not swept for this consumer
    since      timestamptz NOT NULL,
    -- every arrival at or before (cursor_at, cursor_seq) in arrival order is taken
    cursor_at  timestamptz,
    cursor_seq bigint,
    PRIMARY KEY (consumer, watcher)
);

CREATE TABLE agentpost.event_handled (
    consumer    text NOT NULL,
    envelope_id text NOT NULL,
    watcher     text NOT NULL,
    run_key     text NOT NULL,  -- the run that took it (dag_id/run_id)
    taken_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, envelope_id)
);

CREATE INDEX event_handled_run ON agentpost.event_handled (consumer, run_key);
CREATE INDEX event_handled_taken ON agentpost.event_handled (taken_at);
CREATE INDEX event_handled_watcher ON agentpost.event_handled (watcher);

-- Move the consumer's cursor over its contiguous taken arrivals older than a minute (against
-- a clock stepping back; deliveries to an inbox become visible in delivered_at order, 0046).
CREATE FUNCTION agentpost._advance_event_consumer(p_consumer text, p_watcher text,
                                                  p_ws text, p_low timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
    v_seq bigint;
    v_gap_at timestamptz;
    v_gap_seq bigint;
    v_limit timestamptz := clock_timestamp() - interval '1 minute';
BEGIN
    SELECT cursor_at, cursor_seq INTO v_at, v_seq FROM agentpost.event_consumers
     WHERE consumer = p_consumer AND watcher = p_watcher;
    SELECT e.delivered_at, e.seq INTO v_gap_at, v_gap_seq
      FROM agentpost.envelopes e
     WHERE e.recipient = p_ws AND e.delivered_at >= p_low AND e.delivered_at < v_limit
       AND (v_at IS NULL OR (e.delivered_at, e.seq) > (v_at, v_seq))
       AND NOT EXISTS (SELECT 1 FROM agentpost.event_handled h
                        WHERE h.consumer = p_consumer AND h.envelope_id = e.id)
     ORDER BY e.delivered_at, e.seq
     LIMIT 1;
    SELECT e.delivered_at, e.seq INTO v_at, v_seq
      FROM agentpost.envelopes e
      JOIN agentpost.event_handled h ON h.consumer = p_consumer AND h.envelope_id = e.id
     WHERE e.recipient = p_ws AND e.delivered_at >= p_low AND e.delivered_at < v_limit
       AND (v_at IS NULL OR (e.delivered_at, e.seq) > (v_at, v_seq))
       AND (v_gap_at IS NULL OR (e.delivered_at, e.seq) < (v_gap_at, v_gap_seq))
     ORDER BY e.delivered_at DESC, e.seq DESC
     LIMIT 1;
    IF FOUND THEN
        UPDATE agentpost.event_consumers SET cursor_at = v_at, cursor_seq = v_seq
         WHERE consumer = p_consumer AND watcher = p_watcher;
    END IF;
END $$;

-- Take for run p_run of p_consumer: its own arrivals p_ids not taken by another run, plus
-- every arrival p_watcher claimed (pending or confirmed) that no run of p_consumer took yet.
-- Returns the ids this run holds, in arrival order; a retry of the run (same p_run) gets
-- them again. An unknown watcher sweeps nothing; an unknown envelope id raises AP404 and
-- takes nothing.
CREATE FUNCTION agentpost.take_arrivals(p_consumer text, p_watcher text, p_run text,
                                        p_ids text[])
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_missing text;
    v_since timestamptz;
    v_at timestamptz;
    v_seq bigint;
    v_ws text;
    v_low timestamptz;
    v_ids text[];
BEGIN
    SELECT i INTO v_missing FROM unnest(p_ids) i
     WHERE NOT EXISTS (SELECT 1 FROM agentpost.envelopes e WHERE e.id = i)
     LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', v_missing));
    END IF;
    INSERT INTO agentpost.event_consumers (consumer, watcher, since)
    SELECT p_consumer, p_watcher, coalesce(min(e.delivered_at), clock_timestamp())
      FROM agentpost.envelopes e WHERE e.id = ANY (p_ids)
        ON CONFLICT (consumer, watcher) DO NOTHING;
    -- the consumer's row lock serializes its takes
    SELECT since, cursor_at, cursor_seq INTO v_since, v_at, v_seq
      FROM agentpost.event_consumers
     WHERE consumer = p_consumer AND watcher = p_watcher FOR UPDATE;
    INSERT INTO agentpost.event_handled (consumer, envelope_id, watcher, run_key)
    SELECT DISTINCT p_consumer, i, p_watcher, p_run FROM unnest(p_ids) i
        ON CONFLICT (consumer, envelope_id) DO NOTHING;
    -- the sweep: one statement, so the watcher's cursor and its claims are one snapshot
    -- (0046's pruning moves the cursor and deletes the claims behind it together)
    INSERT INTO agentpost.event_handled (consumer, envelope_id, watcher, run_key)
    SELECT p_consumer, e.id, p_watcher, p_run
      FROM agentpost.event_watchers w
      JOIN agentpost.envelopes e ON e.recipient = w.workspace_id
     WHERE w.watcher = p_watcher
       AND e.delivered_at >= greatest(w.since, w.handled_from, v_since)
       AND (v_at IS NULL OR (e.delivered_at, e.seq) > (v_at, v_seq))
       AND (EXISTS (SELECT 1 FROM agentpost.event_claims c
                     WHERE c.watcher = p_watcher AND c.envelope_id = e.id)
            OR (e.delivered_at, e.seq) <= (w.cursor_at, w.cursor_seq))
       AND NOT EXISTS (SELECT 1 FROM agentpost.event_handled h
                        WHERE h.consumer = p_consumer AND h.envelope_id = e.id)
        ON CONFLICT (consumer, envelope_id) DO NOTHING;
    SELECT workspace_id, greatest(since, handled_from, v_since) INTO v_ws, v_low
      FROM agentpost.event_watchers WHERE watcher = p_watcher;
    IF FOUND THEN
        PERFORM agentpost._advance_event_consumer(p_consumer, p_watcher, v_ws, v_low);
    END IF;
    SELECT array_agg(h.envelope_id ORDER BY e.delivered_at, e.seq, h.envelope_id) INTO v_ids
      FROM agentpost.event_handled h
      JOIN agentpost.envelopes e ON e.id = h.envelope_id
     WHERE h.consumer = p_consumer AND h.run_key = p_run;
    RETURN coalesce(v_ids, '{}');
END $$;

-- Delete marks taken longer than p_keep ago, and raise every consumer's `since` to that
-- horizon first, so arrivals whose marks go are never swept again. Returns how many went.
CREATE FUNCTION agentpost.prune_event_handled(p_keep interval) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_horizon timestamptz := clock_timestamp() - p_keep;
    v_n int;
BEGIN
    UPDATE agentpost.event_consumers SET since = v_horizon WHERE since < v_horizon;
    DELETE FROM agentpost.event_handled WHERE taken_at < v_horizon;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

-- 0046's drop, now also forgetting the dropped watchers' consumers and marks (a watcher that
-- comes back starts afresh, and so do its consumers).
CREATE OR REPLACE FUNCTION agentpost.drop_event_watchers(p_idle interval) RETURNS text[]
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM agentpost.event_watchers WHERE seen_at < clock_timestamp() - p_idle
        RETURNING watcher
    ), marks AS (
        DELETE FROM agentpost.event_handled h USING gone WHERE h.watcher = gone.watcher
    ), consumers AS (
        DELETE FROM agentpost.event_consumers c USING gone WHERE c.watcher = gone.watcher
    )
    SELECT coalesce(array_agg(watcher ORDER BY watcher), '{}') FROM gone
$$;
