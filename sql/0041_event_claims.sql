-- Claims of event watchers: what an Airflow asset watcher (agentpost.triggers.events.
-- InboxEventTrigger) has reported, so each envelope arriving in an inbox starts exactly one
-- DAG run per watcher, however often the trigger runs (a triggerer restart, two triggerers
-- picking it up). An arrival is an envelope delivered to the inbox (delivered_at set) at or
-- after the watcher's first claim; a claim row is written in the transaction that hands the
-- envelope out, and never handed out again.

CREATE TABLE agentpost.event_watchers (
    watcher      text PRIMARY KEY,
    workspace_id text NOT NULL,
    -- arrivals from this moment on are reported (what came before is not an event)
    since        timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE agentpost.event_claims (
    watcher     text NOT NULL REFERENCES agentpost.event_watchers ON DELETE CASCADE,
    envelope_id text NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (watcher, envelope_id)
);

-- Claim for p_watcher up to p_max envelopes that arrived in inbox p_ws and that it has not
-- claimed yet, in arrival order; returns their ids. The watcher's row lock serializes its
-- claimers, so concurrent callers never claim the same envelope twice.
CREATE FUNCTION agentpost.claim_arrivals(p_watcher text, p_ws text, p_max int)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_since timestamptz;
    v_ws text;
    v_ids text[];
BEGIN
    INSERT INTO agentpost.event_watchers (watcher, workspace_id) VALUES (p_watcher, p_ws)
        ON CONFLICT (watcher) DO NOTHING;
    SELECT since, workspace_id INTO v_since, v_ws
      FROM agentpost.event_watchers WHERE watcher = p_watcher FOR UPDATE;
    IF v_ws <> p_ws THEN
        RAISE EXCEPTION 'watcher % watches inbox %, not %', p_watcher, v_ws, p_ws
            USING ERRCODE = 'AP400';
    END IF;
    WITH picked AS (
        SELECT e.id, e.delivered_at, e.seq
          FROM agentpost.envelopes e
         WHERE e.recipient = p_ws AND e.delivered_at >= v_since
           AND NOT EXISTS (SELECT 1 FROM agentpost.event_claims c
                            WHERE c.watcher = p_watcher AND c.envelope_id = e.id)
         ORDER BY e.delivered_at, e.seq
         LIMIT p_max
    ), claimed AS (
        INSERT INTO agentpost.event_claims (watcher, envelope_id)
        SELECT p_watcher, id FROM picked
        RETURNING envelope_id
    )
    SELECT array_agg(p.id ORDER BY p.delivered_at, p.seq) INTO v_ids
      FROM picked p JOIN claimed c ON c.envelope_id = p.id;
    RETURN coalesce(v_ids, '{}');
END $$;
