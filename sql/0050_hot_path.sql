-- The hot path stays flat as the store grows (issue "Flat cost as the store grows").
--
-- Measured before: one consumer leasing and acking in batches of 100 fell from about 6,000/s
-- to under 200/s once a million other envelopes sat in the table, in any inbox, and VACUUM
-- ANALYZE did not bring it back. The indexes were not the problem: every hot index is
-- already partial and holds only what waits or is in flight (envelopes_ready: delivered and
-- unconsumed; envelopes_leased: holding a lease token; envelopes_pending: validated, not yet
-- delivered), so consumed, dead-lettered and rejected envelopes are in none of them. The
-- plans were: a statement that names its envelopes by id but also says
-- `status = 'acknowledged' AND consumed_at IS NULL` lets the planner answer it from a whole
-- partial index (every inbox's backlog) instead of primary-key probes, and with stale or
-- missing statistics that is what it picked (ack read all of envelopes_ready per batch). A
-- generic plan, once cached by a long-lived session, keeps its choice until an ANALYZE.
--
-- The rules every statement of the lease, ack, nack, heartbeat, expiry, redelivery, delivery
-- and leasable-count paths now follows (docs/design.md, "Long-lived stores: layout"):
--   1. A statement about given envelopes reads and writes them by primary key only: it
--      selects them by id, locked, with its conditions judged in the select list (so no
--      condition can make a partial index look usable), and updates them by id.
--   2. A statement about an inbox starts from a hot partial index with the inbox as its
--      leading column; the lease claim reads envelopes_ready in its own order (processing
--      order) under a LIMIT, so the first entries are the answer.
--   3. The functions run with enable_seqscan off: a sequential scan of envelopes is never
--      an option they weigh, whatever the statistics say or said when a session cached its
--      plan. (Procedures cannot carry a SET clause, so their reads of envelopes moved into
--      functions.)
-- tests/test_hot_path_plans.py explains every such statement on a store with a million
-- envelopes of history and holds these rules.
--
-- A lease or ack batch writes its trail entries in one call: the UPDATE that leases or
-- consumes the envelopes returns each row's signed state (the `row` _trail_write would have
-- added), and _trail_append (sql/0055, the send batches' writer) chains, signs and inserts
-- them all, one entry per envelope, each verifiable on its own.

-- Leases that outlived their envelope: before 0016, consume() left the lease token on the
-- row it consumed, and such rows sat in envelopes_leased (and in every expiry sweep) for
-- ever. The token and expiry are not part of the row's signed state (sql/0017).
UPDATE agentpost.envelopes
   SET lease_token = NULL, lease_until = NULL
 WHERE lease_token IS NOT NULL AND (consumed_at IS NOT NULL OR status <> 'acknowledged');

-- Dead letters of an inbox, newest first, without walking its consumed history (the
-- dead_letters query); written only when an envelope becomes undeliverable.
CREATE INDEX envelopes_dead ON agentpost.envelopes (recipient, seq)
    WHERE status = 'undeliverable';

-- Claim up to p_max leasable envelopes of an inbox, in processing order, for p_ttl_ms.
-- Expired leases of this inbox are returned first (counted as redeliveries). The blocking
-- gate holds: while a blocking envelope waits unconsumed, only blocking ones are leased.
CREATE OR REPLACE FUNCTION agentpost.lease(p_ws text, p_max int, p_ttl_ms int, p_holder text)
RETURNS SETOF agentpost.envelopes
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_expired text[];
    v_top smallint;
    v_claim text[];
    v_ids text[];
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    PERFORM agentpost._check_workspace(p_ws);
    -- (a plain index probe first: it marks the dead index entries of finished leases as it
    -- passes them, which a bitmap scan never does, so the common "nothing expired" stays
    -- cheap between vacuums)
    IF EXISTS (SELECT 1 FROM agentpost.envelopes e
                WHERE e.recipient = p_ws AND e.lease_token IS NOT NULL
                  AND e.lease_until <= now()
                ORDER BY e.lease_until LIMIT 1) THEN
        SELECT array_agg(e.id) INTO v_expired FROM agentpost.envelopes e
         WHERE e.recipient = p_ws AND e.lease_token IS NOT NULL AND e.lease_until <= now();
    END IF;
    IF v_expired IS NOT NULL THEN
        PERFORM agentpost._lock_parties(ARRAY[p_ws], v_expired);
        PERFORM agentpost._return_leases(v_expired, true, 0);
    ELSE
        PERFORM agentpost._lock_chain(p_ws);
    END IF;

    -- the gate (one probe of the inbox index), then the claim: the inbox index from its
    -- start, in its own order, up to p_max rows (deliveries and consumes of this inbox wait
    -- for its chain, which this transaction holds, so the gate cannot move in between)
    v_top := CASE WHEN EXISTS (SELECT 1 FROM agentpost.envelopes b
                                WHERE b.recipient = p_ws AND b.status = 'acknowledged'
                                  AND b.consumed_at IS NULL AND b.rank = 0)
                  THEN 0 ELSE 2 END;
    SELECT array_agg(c.id) INTO v_claim
      FROM (SELECT e.id FROM agentpost.envelopes e
             WHERE e.recipient = p_ws AND e.status = 'acknowledged'
               AND e.consumed_at IS NULL AND e.rank <= v_top
               AND e.lease_token IS NULL
               AND (e.lease_until IS NULL OR e.lease_until <= now())
             ORDER BY e.rank, coalesce(e.queue_pos, e.seq)
             LIMIT p_max
               FOR UPDATE SKIP LOCKED) c;
    IF v_claim IS NULL THEN
        RETURN;
    END IF;

    WITH u AS (
        UPDATE agentpost.envelopes e
           SET lease_token = gen_random_uuid(), lease_holder = p_holder,
               lease_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
               leases = e.leases + 1,
               first_leased_at = coalesce(e.first_leased_at, clock_timestamp())
         WHERE e.id = ANY (v_claim)
        RETURNING e.id, e.rank, coalesce(e.queue_pos, e.seq) AS pos, e.leases, e.lease_until,
                  agentpost._envelope_row(e, false) AS state
    )
    SELECT array_agg(u.id ORDER BY u.rank, u.pos), array_agg(p_ws),
           array_agg('envelope_leased'::text),
           array_agg(u.id ORDER BY u.rank, u.pos),
           array_agg(jsonb_build_object('envelope_id', u.id, 'workspace_id', p_ws,
                                        'holder', p_holder, 'attempt', u.leases,
                                        'expires_at', u.lease_until, 'row', u.state)
                     ORDER BY u.rank, u.pos)
      INTO v_ids, t_chain, t_event, t_env, t_body
      FROM u;
    PERFORM agentpost._trail_append(t_chain, t_event, t_env, t_body, clock_timestamp());
    PERFORM agentpost._count(p_ws, cardinality(v_ids), 0, 0, 0, 0, 0);
    RETURN QUERY SELECT e.* FROM unnest(v_ids) WITH ORDINALITY AS x(id, k)
                   JOIN agentpost.envelopes e ON e.id = x.id
                  ORDER BY x.k;
END $$;

-- Acknowledge leases, all or nothing: each envelope is consumed (its trail entry says by
-- which lease). Acking a blocking envelope reopens delivery to its inbox.
CREATE OR REPLACE FUNCTION agentpost.ack(p_ids text[], p_tokens uuid[], p_durable boolean)
RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ws text[];
    v_wanted int;
    v_ok text[];
    v_n int;
    v_bad text;
    v_bad_token uuid;
    v_blocking text[];
    r record;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    -- (an ack lost in a server crash means one more delivery: see config.py)
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT array_agg(DISTINCT e.recipient) INTO v_ws
      FROM agentpost.envelopes e WHERE e.id = ANY (p_ids);
    PERFORM agentpost._lock_chains(v_ws);
    SELECT count(*) INTO v_wanted
      FROM (SELECT DISTINCT u.id, u.tok FROM unnest(p_ids, p_tokens) AS u(id, tok)) d;
    -- the tokens' envelopes by primary key, locked, each judged in the select list
    SELECT array_agg(x.id) FILTER (WHERE x.live) INTO v_ok
      FROM (SELECT e.id,
                   coalesce(e.lease_token = t.tok AND e.lease_until > clock_timestamp()
                            AND e.status = 'acknowledged' AND e.consumed_at IS NULL,
                            false) AS live
              FROM (SELECT DISTINCT u.id, u.tok FROM unnest(p_ids, p_tokens) AS u(id, tok)) t
              JOIN agentpost.envelopes e ON e.id = t.id
               FOR UPDATE OF e) x;
    IF coalesce(cardinality(v_ok), 0) < v_wanted THEN
        -- name the first token that failed (nothing was changed)
        SELECT u.id, u.tok INTO v_bad, v_bad_token
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, tok, k)
         WHERE NOT (u.id = ANY (coalesce(v_ok, '{}')))
            OR (SELECT count(DISTINCT v.tok) FROM unnest(p_ids, p_tokens) AS v(id, tok)
                 WHERE v.id = u.id) > 1
         ORDER BY u.k LIMIT 1;
        PERFORM agentpost._stale(v_bad, v_bad_token);
    END IF;
    WITH a AS (
        UPDATE agentpost.envelopes e
           SET consumed_at = clock_timestamp(), lease_token = NULL, lease_until = NULL
         WHERE e.id = ANY (v_ok)
        RETURNING e.id, e.seq, e.recipient, e.rank, e.leases, e.lease_holder,
                  agentpost._envelope_row(e, false) AS state
    )
    SELECT count(*), array_agg(a.recipient ORDER BY a.seq),
           array_agg('envelope_consumed'::text), array_agg(a.id ORDER BY a.seq),
           array_agg(jsonb_build_object('envelope_id', a.id, 'workspace_id', a.recipient,
                                        'via', 'ack', 'attempt', a.leases,
                                        'holder', a.lease_holder, 'row', a.state)
                     ORDER BY a.seq),
           array_agg(DISTINCT a.recipient) FILTER (WHERE a.rank = 0)
      INTO v_n, t_chain, t_event, t_env, t_body, v_blocking
      FROM a;
    PERFORM agentpost._trail_append(t_chain, t_event, t_env, t_body, clock_timestamp());
    FOR r IN SELECT x.ws, count(*) AS n FROM unnest(t_chain) AS x(ws) GROUP BY x.ws LOOP
        PERFORM agentpost._count(r.ws, 0, r.n::int, 0, 0, 0, 0);
    END LOOP;
    IF v_blocking IS NOT NULL THEN
        PERFORM agentpost._reopen(v_blocking);
    END IF;
    RETURN v_n;
END $$;

-- Return leased envelopes to their inboxes: expired leases (p_expired_only) or a nack. The
-- caller holds the chains of the receivers and of the senders. Each return counts a
-- redelivery; the (MAX+1)th return dead-letters the envelope instead: status undeliverable,
-- reason redelivery_exhausted, the `failed` signal and both entries in the sender's chain.
-- A dead-lettered blocking envelope reopens its inbox (sql/0016).
CREATE OR REPLACE FUNCTION agentpost._return_leases(p_ids text[], p_expired_only boolean,
                                                    p_delay_ms int)
RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_max constant int := 3;
    v_event text := CASE WHEN p_expired_only THEN 'lease_expired' ELSE 'lease_nacked' END;
    v_back text[];
    v_n int;
    v_ids text[];
    r record;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    -- by primary key, locked, judged in the select list
    SELECT array_agg(x.id) FILTER (WHERE x.held) INTO v_back
      FROM (SELECT e.id,
                   coalesce(e.lease_token IS NOT NULL AND e.status = 'acknowledged'
                            AND e.consumed_at IS NULL
                            AND (NOT p_expired_only OR e.lease_until <= now()), false) AS held
              FROM agentpost.envelopes e WHERE e.id = ANY (p_ids)
               FOR UPDATE) x;
    IF v_back IS NULL THEN
        RETURN 0;
    END IF;
    WITH ret AS (
        UPDATE agentpost.envelopes e
           SET redeliveries = e.redeliveries + 1,
               lease_token = NULL, lease_holder = NULL,
               lease_until = CASE WHEN p_delay_ms > 0
                                  THEN clock_timestamp() + p_delay_ms * interval '1 millisecond'
                             END,
               queue_pos = nextval('agentpost.envelope_seq'),
               status = CASE WHEN e.redeliveries >= v_max THEN 'undeliverable' ELSE e.status END,
               reason = CASE WHEN e.redeliveries >= v_max THEN 'redelivery_exhausted'
                             ELSE e.reason END
         WHERE e.id = ANY (v_back)
        RETURNING e.id, e.seq, e.sender, e.recipient, e.leases, e.redeliveries, e.status,
                  e.reason
    ), s AS (
        INSERT INTO agentpost.signals (workspace_id, signal, ref, reason, emitted_by)
        SELECT ret.sender, 'failed', ret.id, ret.reason, 'runtime' FROM ret
         WHERE ret.status = 'undeliverable'
    )
    SELECT count(*) FILTER (WHERE j = 1), array_agg(x.id) FILTER (WHERE j = 1),
           array_agg(CASE WHEN j = 1 THEN x.recipient ELSE x.sender END ORDER BY x.seq, j),
           array_agg(CASE j WHEN 1 THEN v_event WHEN 2 THEN 'envelope_undeliverable'
                            ELSE 'signal_emitted' END ORDER BY x.seq, j),
           array_agg(x.id ORDER BY x.seq, j),
           array_agg(CASE j
                         WHEN 1 THEN jsonb_build_object(
                             'envelope_id', x.id, 'workspace_id', x.recipient,
                             'attempt', x.leases, 'redelivery', x.redeliveries,
                             'delay_ms', CASE WHEN NOT p_expired_only THEN p_delay_ms END,
                             'dead_lettered', x.status = 'undeliverable')
                         WHEN 2 THEN jsonb_build_object(
                             'envelope_id', x.id, 'from', x.sender, 'to', x.recipient,
                             'reason', x.reason, 'timestamp', clock_timestamp())
                         ELSE jsonb_build_object('signal', 'failed', 'ref', x.id,
                                                 'to', x.sender, 'reason', x.reason)
                     END ORDER BY x.seq, j)
      INTO v_n, v_ids, t_chain, t_event, t_env, t_body
      FROM ret x CROSS JOIN generate_series(1, 3) AS j
     WHERE j = 1 OR x.status = 'undeliverable';
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    FOR r IN SELECT e.recipient AS ws,
                    count(*) FILTER (WHERE e.status = 'acknowledged') AS back,
                    count(*) FILTER (WHERE e.status = 'undeliverable') AS dead,
                    bool_or(e.status = 'acknowledged' AND e.lease_until IS NULL) AS now_ready,
                    bool_or(e.status = 'undeliverable' AND e.rank = 0) AS ungated
               FROM agentpost.envelopes e WHERE e.id = ANY (v_ids)
              GROUP BY e.recipient
    LOOP
        PERFORM agentpost._count(r.ws, 0, 0,
                                 CASE WHEN p_expired_only THEN 0 ELSE (r.back + r.dead)::int END,
                                 CASE WHEN p_expired_only THEN (r.back + r.dead)::int ELSE 0 END,
                                 r.back::int, r.dead::int);
        IF r.ungated THEN
            PERFORM agentpost._reopen(ARRAY[r.ws]);
        ELSIF r.now_ready THEN
            PERFORM pg_notify('agentpost_inbox', r.ws);
        END IF;
    END LOOP;
    RETURN v_n;
END $$;

-- Give a lease back: the envelope returns to the tail of its level, leasable after the
-- delay; the fourth return dead-letters it. Returns the envelope's status afterwards.
CREATE OR REPLACE FUNCTION agentpost.nack(p_id text, p_token uuid, p_delay_ms int,
                                          p_durable boolean)
RETURNS text
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ws text;
    v_live boolean;
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT e.recipient INTO v_ws FROM agentpost.envelopes e WHERE e.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    PERFORM agentpost._lock_parties(ARRAY[v_ws], ARRAY[p_id]);
    SELECT coalesce(e.lease_token = p_token AND e.lease_until > clock_timestamp()
                    AND e.status = 'acknowledged' AND e.consumed_at IS NULL, false)
      INTO v_live
      FROM agentpost.envelopes e WHERE e.id = p_id
       FOR UPDATE;
    IF NOT v_live THEN
        PERFORM agentpost._stale(p_id, p_token);
    END IF;
    PERFORM agentpost._return_leases(ARRAY[p_id], false, p_delay_ms);
    RETURN (SELECT e.status FROM agentpost.envelopes e WHERE e.id = p_id);
END $$;

-- Extend a live lease to p_ttl_ms from now (no trail entry: it changes no outcome).
CREATE OR REPLACE FUNCTION agentpost.heartbeat(p_id text, p_token uuid, p_ttl_ms int)
RETURNS timestamptz
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_live boolean;
    v_until timestamptz;
BEGIN
    SELECT coalesce(e.lease_token = p_token AND e.lease_until > clock_timestamp()
                    AND e.status = 'acknowledged' AND e.consumed_at IS NULL, false)
      INTO v_live
      FROM agentpost.envelopes e WHERE e.id = p_id
       FOR UPDATE;
    IF NOT coalesce(v_live, false) THEN
        PERFORM agentpost._stale(p_id, p_token);
    END IF;
    UPDATE agentpost.envelopes e
       SET lease_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
     WHERE e.id = p_id
    RETURNING e.lease_until INTO v_until;
    RETURN v_until;
END $$;

-- The inboxes holding expired leases (a walk of envelopes_leased: what is in flight).
CREATE FUNCTION agentpost._expired_inboxes() RETURNS text[]
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN ARRAY(SELECT DISTINCT e.recipient FROM agentpost.envelopes e
                  WHERE e.lease_token IS NOT NULL AND e.lease_until <= now() ORDER BY 1);
END $$;

-- Return the expired leases of one inbox; the number returned.
CREATE FUNCTION agentpost._expire_inbox(p_ws text) RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ids text[];
BEGIN
    SELECT array_agg(e.id) INTO v_ids FROM agentpost.envelopes e
     WHERE e.recipient = p_ws AND e.lease_token IS NOT NULL AND e.lease_until <= now();
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM agentpost._lock_parties(ARRAY[p_ws], v_ids);
    RETURN agentpost._return_leases(v_ids, true, 0);
END $$;

-- Return every expired lease, one inbox per transaction.
CREATE OR REPLACE PROCEDURE agentpost.expire_leases(INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ws text;
    v_got int;
    v_n int := 0;
    v_inboxes int := 0;
BEGIN
    FOREACH v_ws IN ARRAY agentpost._expired_inboxes() LOOP
        v_got := agentpost._expire_inbox(v_ws);
        COMMIT;
        CONTINUE WHEN v_got = 0;
        v_n := v_n + v_got;
        v_inboxes := v_inboxes + 1;
    END LOOP;
    p_result := jsonb_build_object('expired', v_n, 'inboxes', v_inboxes);
END $$;

-- What lease() could take from an inbox now (its own conditions, blocking gate included; a
-- lease that ran out counts, as lease() returns it first, unless that return dead-letters
-- it), narrowed by an optional filter (each NULL: any): how many, and the first p_limit ids
-- in processing order (none when p_limit is 0). A walk of the inbox's part of
-- envelopes_ready. The one definition of "leasable": the count below and the Airflow
-- triggers' filtered matches (store/watches.py) both read it.
CREATE FUNCTION agentpost.leasable_matching(p_ws text, p_type text, p_sender text,
                                            p_in_reply_to text, p_priority text, p_limit int)
RETURNS TABLE (available bigint, envelope_ids text[])
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
DECLARE
    v_top smallint;
BEGIN
    v_top := CASE WHEN EXISTS (SELECT 1 FROM agentpost.envelopes b
                                WHERE b.recipient = p_ws AND b.status = 'acknowledged'
                                  AND b.consumed_at IS NULL AND b.rank = 0)
                  THEN 0 ELSE 2 END;
    RETURN QUERY
    SELECT count(*),
           coalesce((array_agg(e.id ORDER BY e.rank, coalesce(e.queue_pos, e.seq))
                         FILTER (WHERE p_limit > 0))[1:p_limit], '{}')
      FROM agentpost.envelopes e
     WHERE e.recipient = p_ws AND e.status = 'acknowledged'
       AND e.consumed_at IS NULL AND e.rank <= v_top
       AND (e.lease_until IS NULL OR e.lease_until <= now())
       AND (e.lease_token IS NULL OR e.redeliveries < 3)
       AND (p_type IS NULL OR e.type = p_type)
       AND (p_sender IS NULL OR e.sender = p_sender)
       AND (p_in_reply_to IS NULL OR e.in_reply_to = p_in_reply_to)
       AND (p_priority IS NULL OR e.priority = p_priority);
END $$;

-- How many envelopes lease() could take from an inbox now (leasable_matching, unfiltered).
CREATE FUNCTION agentpost.leasable(p_ws text) RETURNS bigint
LANGUAGE sql STABLE
AS $$ SELECT available FROM agentpost.leasable_matching(p_ws, NULL, NULL, NULL, NULL, 0) $$;

-- Phase 2: deliver a workspace's validated envelopes in creation order, each delivery and its
-- acknowledged signal in one step. Stops at the first envelope still backing off, and after
-- a blocking envelope (the gate stays shut until it is consumed).
-- Returns the number delivered, or -1 when the receiver is sealed and envelopes still wait for
-- it (a send validated just before the receiver was sealed): see _sweep_sealed.
-- (As sql/0003, but the delivered rows are locked and re-checked by primary key, and updated
-- by primary key: see the head of this file.)
CREATE OR REPLACE FUNCTION agentpost._drain(p_ws text) RETURNS int
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_state text;
    v_gated boolean;
    v_any boolean;
    v_ids text[];
    v_at timestamptz;
    v_n int;
    r record;
    tr record;
    v_right text;
    v_with_rights text[];
    t_chain text[] := '{}'; t_event text[] := '{}'; t_env text[] := '{}';
    t_body jsonb[] := '{}';
BEGIN
    PERFORM agentpost._lock_chain(p_ws);
    -- In one look: the receiver's state, the blocking gate (a delivered blocking envelope not
    -- yet consumed), and its queue in creation order, in one pass over the pending index (a
    -- queue index is full of dead entries between vacuums, so it is walked once): what is
    -- deliverable is the prefix before the first envelope still backing off, up to and
    -- including the first blocking one.
    SELECT w.state,
           EXISTS (SELECT 1 FROM agentpost.envelopes e
                    WHERE e.recipient = p_ws AND e.status = 'acknowledged'
                      AND e.consumed_at IS NULL AND e.rank = 0),
           q.any, q.ids
      INTO v_state, v_gated, v_any, v_ids
      FROM agentpost.workspaces w,
           LATERAL (SELECT count(*) > 0 AS any,
                           array_agg(x.id ORDER BY x.seq)
                               FILTER (WHERE NOT x.waiting AND NOT x.behind_blocking) AS ids
                      FROM (SELECT e.id, e.seq,
                                   bool_or(coalesce(e.next_attempt_at > now(), false))
                                       OVER (ORDER BY e.seq ROWS UNBOUNDED PRECEDING) AS waiting,
                                   coalesce(bool_or(e.rank = 0)
                                       OVER (ORDER BY e.seq
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                       false) AS behind_blocking
                              FROM agentpost.envelopes e
                             WHERE e.recipient = p_ws AND e.status = 'validated') x) q
     WHERE w.id = p_ws;
    IF NOT coalesce(v_any, false) THEN
        RETURN 0;
    END IF;
    IF v_state IN ('integrating', 'closed', 'failed') THEN
        -- sealed: what still waits for it must be recorded undeliverable, which needs the
        -- senders' chains; the caller does that after committing (see _deliver_to)
        RETURN -1;
    END IF;
    IF v_ids IS NULL OR v_state IS NULL OR v_state NOT IN ('idle', 'active', 'blocked')
       OR v_gated THEN
        RETURN 0;
    END IF;
    -- still validated? (a sealed receiver's sweep takes the senders' chains, not this one)
    SELECT array_agg(x.id ORDER BY x.seq) FILTER (WHERE x.pending) INTO v_ids
      FROM (SELECT e.id, e.seq, e.status = 'validated' AS pending
              FROM agentpost.envelopes e WHERE e.id = ANY (v_ids)
               FOR UPDATE) x;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;

    -- delivery times follow creation order (a microsecond apart from now): rows updated by
    -- primary key come in no particular order, so clock_timestamp() per row would not
    v_at := clock_timestamp();
    WITH d AS (
        UPDATE agentpost.envelopes e
           SET status = 'acknowledged',
               delivered_at = v_at + (o.k - 1) * interval '1 microsecond',
               attempts = e.attempts + 1, next_attempt_at = NULL
          FROM unnest(v_ids) WITH ORDINALITY AS o(id, k)
         WHERE e.id = o.id
        RETURNING e.id, e.seq, e.sender, e.delivered_at, e.attempts,
                  e.rights <> '[]' AS has_rights
    ), s AS (
        INSERT INTO agentpost.signals (workspace_id, signal, ref, emitted_by, at)
        SELECT d.sender, 'acknowledged', d.id, p_ws, d.delivered_at FROM d
    )
    SELECT count(*), array_agg(p_ws), array_agg(x.event), array_agg(x.id), array_agg(x.body),
           array_agg(x.id) FILTER (WHERE x.j = 1 AND x.has_rights)
      INTO v_n, t_chain, t_event, t_env, t_body, v_with_rights
      FROM (SELECT d.id, d.has_rights, j,
                   CASE j WHEN 1 THEN 'envelope_delivered' ELSE 'signal_emitted' END AS event,
                   CASE j
                       WHEN 1 THEN jsonb_build_object(
                           'envelope_id', d.id, 'from', d.sender, 'to', p_ws,
                           'delivered_at', d.delivered_at, 'attempt', d.attempts)
                       ELSE jsonb_build_object('signal', 'acknowledged', 'ref', d.id,
                                               'to', d.sender)
                   END AS body
              FROM d CROSS JOIN generate_series(1, 2) AS j
             ORDER BY d.seq, j) x;
    v_n := v_n / 2;
    IF v_n = 0 THEN
        RETURN 0;
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    IF v_with_rights IS NULL THEN
        RETURN v_n;
    END IF;

    -- port rights carried by the delivered envelopes pass to the receiver
    t_chain := '{}'; t_event := '{}'; t_env := '{}'; t_body := '{}';
    FOR r IN SELECT e.id, e.sender, e.rights FROM agentpost.envelopes e
              WHERE e.id = ANY (v_with_rights) ORDER BY e.seq
    LOOP
        FOR tr IN SELECT x.type AS kind, x.target
                    FROM jsonb_to_recordset(r.rights) AS x(type text, target text)
        LOOP
            IF tr.kind = 'send' THEN
                INSERT INTO agentpost.port_rights (holder, target, kind, created_by,
                                                   via_envelope)
                VALUES (p_ws, tr.target, 'send', r.sender, r.id)
                RETURNING id INTO v_right;
            ELSE
                UPDATE agentpost.port_rights pr SET holder = p_ws, state = 'live'
                 WHERE pr.id = (SELECT x.id FROM agentpost.port_rights x
                                 WHERE x.via_envelope = r.id AND x.state = 'in_transit'
                                   AND x.target = tr.target ORDER BY x.id LIMIT 1)
                RETURNING pr.id INTO v_right;
            END IF;
            t_chain := t_chain || p_ws;
            t_event := t_event || 'port_right_transferred'::text;
            t_env := t_env || r.id;
            t_body := t_body || jsonb_build_object(
                'right_id', v_right, 'right_type', tr.kind, 'from_holder', r.sender,
                'to_holder', p_ws, 'target', tr.target, 'via_envelope', r.id);
        END LOOP;
    END LOOP;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body);
    RETURN v_n;
END $$;

-- What redeliver() works on: the receivers with due (or sealed-out) validated envelopes, and
-- how many envelopes wait undelivered. Walks of envelopes_pending.
CREATE FUNCTION agentpost._due_receivers() RETURNS text[]
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN (SELECT array_agg(DISTINCT e.recipient)
              FROM agentpost.envelopes e JOIN agentpost.workspaces w ON w.id = e.recipient
             WHERE e.status = 'validated'
               AND (w.state IN ('integrating', 'closed', 'failed')
                    OR (w.state IN ('idle', 'active', 'blocked')
                        AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now()))));
END $$;

CREATE FUNCTION agentpost._pending_count() RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
    RETURN (SELECT count(*) FROM agentpost.envelopes e WHERE e.status = 'validated');
END $$;

-- Acknowledgment-timeout redelivery: retry every recipient with due envelopes.
CREATE OR REPLACE PROCEDURE agentpost.redeliver(p_timeout_ms int,
                                                INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_recipients text[];
    v_before bigint;
BEGIN
    v_recipients := agentpost._due_receivers();
    v_before := agentpost._pending_count();
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    p_result := jsonb_build_object(
        'recipients', coalesce(cardinality(v_recipients), 0),
        'pending_before', v_before,
        'pending_after', agentpost._pending_count());
END $$;
