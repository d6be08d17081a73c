-- Event claims in two steps (agentpost.triggers.events.InboxEventTrigger in Airflow's
-- shared-stream ack mode). 0041 made a claim final in the transaction that handed the
-- envelope out, before Airflow stored the asset event: a triggerer killed in between lost
-- the arrival's run. Now a claim is first *pending* (owned by one producer, so no other
-- instance reports the envelope meanwhile) and becomes *confirmed* only once Airflow has
-- confirmed the asset event persisted. A pending claim whose owner is gone is reported
-- again: so a kill can cause a second report (a duplicate run), never a lost one.
--
-- An owner is a producer's database session: `event_claim_owner()` numbers it and takes a
-- session-level advisory lock on (namespace 1095779651 = 'APEC', owner). The lock goes
-- with the session, so a killed triggerer's pending claims are orphaned as soon as its
-- connection closes; a session that lingers (a host lost without closing its sockets) is
-- outlived by the claim timeout instead.

ALTER TABLE agentpost.event_claims
    ADD COLUMN owner int,                 -- the producer holding a pending claim
    ADD COLUMN confirmed_at timestamptz,  -- NULL: pending
    ADD COLUMN reports int NOT NULL DEFAULT 1;  -- how often it was handed out (>1: again)

-- 0041's claims were final when made
UPDATE agentpost.event_claims SET confirmed_at = claimed_at;

CREATE INDEX event_claims_pending ON agentpost.event_claims (watcher)
    WHERE confirmed_at IS NULL;

ALTER TABLE agentpost.event_watchers
    -- the last time a trigger asked for arrivals (a watcher unseen for long has no trigger)
    ADD COLUMN seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- every arrival at or before (cursor_at, cursor_seq) in arrival order is confirmed: it is
    -- never looked at again, so its claim can go (0046's prune_event_claims moves it)
    ADD COLUMN cursor_at timestamptz,
    ADD COLUMN cursor_seq bigint;

CREATE SEQUENCE agentpost.event_claim_owners AS int MAXVALUE 2147483647 CYCLE;

-- A new owner for the calling session, locked for the session's lifetime.
CREATE FUNCTION agentpost.event_claim_owner() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_owner int := nextval('agentpost.event_claim_owners');
BEGIN
    PERFORM pg_advisory_lock(1095779651, v_owner);
    RETURN v_owner;
END $$;

-- The owners whose session is alive (holds its lock) in this database.
CREATE FUNCTION agentpost._live_claim_owners() RETURNS int[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(l.objid::bigint::int), '{}')
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.classid = 1095779651::oid AND l.objsubid = 2
       AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
$$;

-- Claim for p_watcher up to p_max arrivals in inbox p_ws, in arrival order: envelopes
-- never claimed, and pending claims that are orphaned (owner's session gone) or older than
-- p_timeout, never the caller's own (p_owner resolves those itself). p_final: the claim is
-- confirmed at once (no ack channel: at most once). Returns the envelope ids.
CREATE FUNCTION agentpost.claim_arrivals(p_watcher text, p_ws text, p_max int, p_owner int,
                                         p_timeout interval, p_final boolean)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_since timestamptz;
    v_ws text;
    v_at timestamptz;
    v_seq bigint;
    v_live int[];
    v_now timestamptz := clock_timestamp();
    v_ids text[];
BEGIN
    INSERT INTO agentpost.event_watchers (watcher, workspace_id) VALUES (p_watcher, p_ws)
        ON CONFLICT (watcher) DO NOTHING;
    -- the watcher's row lock serializes its claimers (and the pruning of its claims)
    UPDATE agentpost.event_watchers SET seen_at = v_now WHERE watcher = p_watcher
        RETURNING since, workspace_id, cursor_at, cursor_seq INTO v_since, v_ws, v_at, v_seq;
    IF v_ws <> p_ws THEN
        RAISE EXCEPTION 'watcher % watches inbox %, not %', p_watcher, v_ws, p_ws
            USING ERRCODE = 'AP400';
    END IF;
    v_live := agentpost._live_claim_owners();
    WITH picked AS (
        SELECT e.id, e.delivered_at, e.seq
          FROM agentpost.envelopes e
          LEFT JOIN agentpost.event_claims c ON c.watcher = p_watcher AND c.envelope_id = e.id
         WHERE e.recipient = p_ws AND e.delivered_at >= v_since
           AND (v_at IS NULL OR (e.delivered_at, e.seq) > (v_at, v_seq))
           AND (c.envelope_id IS NULL
                OR (c.confirmed_at IS NULL AND c.owner IS DISTINCT FROM p_owner
                    AND (c.owner IS NULL OR c.owner <> ALL (v_live)
                         OR c.claimed_at < v_now - p_timeout)))
         ORDER BY e.delivered_at, e.seq
         LIMIT p_max
    ), claimed AS (
        INSERT INTO agentpost.event_claims AS c (watcher, envelope_id, owner, claimed_at,
                                                 confirmed_at)
        SELECT p_watcher, id, p_owner, v_now, CASE WHEN p_final THEN v_now END FROM picked
        ON CONFLICT (watcher, envelope_id) DO UPDATE
            SET owner = EXCLUDED.owner, claimed_at = EXCLUDED.claimed_at,
                confirmed_at = EXCLUDED.confirmed_at, reports = c.reports + 1
            WHERE c.confirmed_at IS NULL  -- confirmed meanwhile by its owner: leave it
        RETURNING envelope_id
    )
    SELECT array_agg(p.id ORDER BY p.delivered_at, p.seq) INTO v_ids
      FROM picked p JOIN claimed c ON c.envelope_id = p.id;
    RETURN coalesce(v_ids, '{}');
END $$;

-- 0041's signature keeps its meaning: claims made final at once.
CREATE OR REPLACE FUNCTION agentpost.claim_arrivals(p_watcher text, p_ws text, p_max int)
RETURNS text[]
LANGUAGE sql AS $$
    SELECT agentpost.claim_arrivals(p_watcher, p_ws, p_max, NULL, interval '0', true)
$$;

-- Airflow stored the asset events of these arrivals: their claims are final, whoever holds
-- them now. Returns how many pending claims this confirmed.
CREATE FUNCTION agentpost.confirm_claims(p_watcher text, p_ids text[]) RETURNS int
LANGUAGE sql AS $$
    WITH done AS (
        UPDATE agentpost.event_claims SET confirmed_at = clock_timestamp()
         WHERE watcher = p_watcher AND envelope_id = ANY (p_ids) AND confirmed_at IS NULL
        RETURNING 1)
    SELECT count(*)::int FROM done
$$;

-- Airflow did not store them (the persist failed or timed out): hand them out again.
-- Only the caller's own pending claims go (another owner may have taken one over).
CREATE FUNCTION agentpost.release_claims(p_watcher text, p_ids text[], p_owner int)
RETURNS int
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM agentpost.event_claims
         WHERE watcher = p_watcher AND envelope_id = ANY (p_ids) AND owner = p_owner
           AND confirmed_at IS NULL
        RETURNING 1)
    SELECT count(*)::int FROM gone
$$;
