-- Consuming inboxes (Courier on top of WACP): leases, acknowledgments, redelivery and dead
-- letters; caller-chosen envelope ids as idempotency keys; on-insert rules; live wake-ups.
--
-- A Courier stream is a workspace's inbox. An envelope in the inbox (status acknowledged, not
-- consumed) is *leasable* when it holds no live lease and is not delayed. A lease stamps the
-- row itself (token, holder, expiry): a claim is `FOR UPDATE SKIP LOCKED` over the inbox
-- index, and because the claim updates the row, a concurrent claimer re-checks the new
-- version and skips it. Acking consumes the envelope; a nack or an expiry returns it to the
-- tail of its priority level (a new queue position) and counts a redelivery; the fourth
-- return dead-letters it. Every step writes its trail entries in the inbox's chain.

-- Courier's routing fields, rule generations, and the lease columns.
ALTER TABLE agentpost.envelopes
    ADD COLUMN tags            text[] NOT NULL DEFAULT '{}',
    ADD COLUMN headers         jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN meta            jsonb NOT NULL DEFAULT '{}',
    -- how many rule firings led to this envelope (0 for what agents and people send)
    ADD COLUMN hops            int NOT NULL DEFAULT 0,
    -- the inbox position: seq until the envelope is returned to the tail of its level
    ADD COLUMN queue_pos       bigint,
    ADD COLUMN lease_token     uuid,
    ADD COLUMN lease_holder    text,
    -- expiry of the live lease; without a token: not leasable before this (a nack's delay)
    ADD COLUMN lease_until     timestamptz,
    ADD COLUMN leases          int NOT NULL DEFAULT 0,
    ADD COLUMN redeliveries    int NOT NULL DEFAULT 0,
    ADD COLUMN first_leased_at timestamptz;

ALTER TABLE agentpost.envelopes DROP CONSTRAINT envelopes_origin_check,
    ADD CONSTRAINT envelopes_origin_check CHECK (origin IN ('agent', 'human', 'system'));

-- the inbox in processing order, returns at the tail of their level
DROP INDEX agentpost.envelopes_inbox;
CREATE INDEX envelopes_ready ON agentpost.envelopes (recipient, rank, (coalesce(queue_pos, seq)))
    WHERE status = 'acknowledged' AND consumed_at IS NULL;
-- live (or expired, not yet returned) leases, found by expiry
CREATE INDEX envelopes_leased ON agentpost.envelopes (recipient, lease_until)
    WHERE lease_token IS NOT NULL;
-- everything ever delivered to an inbox, newest first: latestPerAgent, stats, dead letters
CREATE INDEX envelopes_delivered ON agentpost.envelopes (recipient, seq)
    WHERE delivered_at IS NOT NULL;

-- Counters per inbox for the stats (one row per inbox, bumped once per operation).
CREATE TABLE agentpost.inbox_counters (
    workspace_id text PRIMARY KEY,
    leased       bigint NOT NULL DEFAULT 0,
    acks         bigint NOT NULL DEFAULT 0,
    nacks        bigint NOT NULL DEFAULT 0,
    expiries     bigint NOT NULL DEFAULT 0,
    redeliveries bigint NOT NULL DEFAULT 0,
    dead         bigint NOT NULL DEFAULT 0
);

CREATE FUNCTION agentpost._count(p_ws text, p_leased int, p_acks int, p_nacks int,
                                 p_expiries int, p_redeliveries int, p_dead int)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agentpost.inbox_counters AS c
           (workspace_id, leased, acks, nacks, expiries, redeliveries, dead)
    VALUES (p_ws, p_leased, p_acks, p_nacks, p_expiries, p_redeliveries, p_dead)
    ON CONFLICT (workspace_id) DO UPDATE
       SET leased = c.leased + p_leased, acks = c.acks + p_acks, nacks = c.nacks + p_nacks,
           expiries = c.expiries + p_expiries, redeliveries = c.redeliveries + p_redeliveries,
           dead = c.dead + p_dead;
END $$;

-- Live wake-ups: a delivery notifies the receiving inbox. Postgres folds identical
-- notifications of one transaction into one, so a batch notifies each inbox once.
CREATE FUNCTION agentpost._notify_inbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agentpost_inbox', NEW.recipient);
    RETURN NULL;
END $$;

CREATE TRIGGER envelopes_delivered_notify
    AFTER UPDATE OF status ON agentpost.envelopes
    FOR EACH ROW WHEN (OLD.status = 'validated' AND NEW.status = 'acknowledged')
    EXECUTE FUNCTION agentpost._notify_inbox();

-- ---------------------------------------------------------------------------------------
-- Leases

CREATE FUNCTION agentpost._check_workspace(p_ws text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = p_ws) THEN
        PERFORM agentpost._fail('AP404', format('unknown workspace %L', p_ws));
    END IF;
END $$;

-- Return leased envelopes to their inboxes: expired leases (p_expired_only) or a nack. The
-- caller holds the chains of the receivers and of the senders. Each return counts a
-- redelivery; the (MAX+1)th return dead-letters the envelope instead: status undeliverable,
-- reason redelivery_exhausted, the `failed` signal and both entries in the sender's chain.
CREATE FUNCTION agentpost._return_leases(p_ids text[], p_expired_only boolean, p_delay_ms int)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_max constant int := 3;
    v_event text := CASE WHEN p_expired_only THEN 'lease_expired' ELSE 'lease_nacked' END;
    v_n int;
    v_ids text[];
    r record;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
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
         WHERE e.id = ANY (p_ids) AND e.lease_token IS NOT NULL
           AND e.status = 'acknowledged' AND e.consumed_at IS NULL
           AND (NOT p_expired_only OR e.lease_until <= now())
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
    IF coalesce(v_n, 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    FOR r IN SELECT e.recipient AS ws,
                    count(*) FILTER (WHERE e.status = 'acknowledged') AS back,
                    count(*) FILTER (WHERE e.status = 'undeliverable') AS dead,
                    bool_or(e.status = 'acknowledged' AND e.lease_until IS NULL) AS now_ready
               FROM agentpost.envelopes e WHERE e.id = ANY (v_ids)
              GROUP BY e.recipient
    LOOP
        PERFORM agentpost._count(r.ws, 0, 0,
                                 CASE WHEN p_expired_only THEN 0 ELSE (r.back + r.dead)::int END,
                                 CASE WHEN p_expired_only THEN (r.back + r.dead)::int ELSE 0 END,
                                 r.back::int, r.dead::int);
        IF r.now_ready THEN
            PERFORM pg_notify('agentpost_inbox', r.ws);
        END IF;
    END LOOP;
    RETURN v_n;
END $$;

-- Lock a receiver's chain and the chains of the senders of the given envelopes, sorted.
CREATE FUNCTION agentpost._lock_parties(p_ws text[], p_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._lock_chains(p_ws || ARRAY(
        SELECT DISTINCT e.sender FROM agentpost.envelopes e WHERE e.id = ANY (p_ids)));
END $$;

-- Claim up to p_max leasable envelopes of an inbox, in processing order, for p_ttl_ms.
-- Expired leases of this inbox are returned first (counted as redeliveries). The blocking
-- gate holds: while a blocking envelope waits unconsumed, only blocking ones are leased.
CREATE FUNCTION agentpost.lease(p_ws text, p_max int, p_ttl_ms int, p_holder text)
RETURNS SETOF agentpost.envelopes
LANGUAGE plpgsql AS $$
DECLARE
    v_expired text[];
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

    WITH c AS (
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.recipient = p_ws AND e.status = 'acknowledged' AND e.consumed_at IS NULL
           AND e.lease_token IS NULL
           AND (e.lease_until IS NULL OR e.lease_until <= now())
           AND (e.rank = 0 OR NOT EXISTS (
                    SELECT 1 FROM agentpost.envelopes b
                     WHERE b.recipient = p_ws AND b.status = 'acknowledged'
                       AND b.consumed_at IS NULL AND b.rank = 0))
         ORDER BY e.rank, coalesce(e.queue_pos, e.seq)
         LIMIT p_max
           FOR UPDATE SKIP LOCKED
    ), u AS (
        UPDATE agentpost.envelopes e
           SET lease_token = gen_random_uuid(), lease_holder = p_holder,
               lease_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
               leases = e.leases + 1,
               first_leased_at = coalesce(e.first_leased_at, clock_timestamp())
          FROM c WHERE e.id = c.id
        RETURNING e.id, e.rank, coalesce(e.queue_pos, e.seq) AS pos, e.leases, e.lease_until
    )
    SELECT array_agg(u.id ORDER BY u.rank, u.pos), array_agg(p_ws),
           array_agg('envelope_leased'::text),
           array_agg(u.id ORDER BY u.rank, u.pos),
           array_agg(jsonb_build_object('envelope_id', u.id, 'workspace_id', p_ws,
                                        'holder', p_holder, 'attempt', u.leases,
                                        'expires_at', u.lease_until) ORDER BY u.rank, u.pos)
      INTO v_ids, t_chain, t_event, t_env, t_body
      FROM u;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    PERFORM agentpost._count(p_ws, cardinality(v_ids), 0, 0, 0, 0, 0);
    RETURN QUERY SELECT e.* FROM agentpost.envelopes e WHERE e.id = ANY (v_ids)
                  ORDER BY array_position(v_ids, e.id);
END $$;

-- Why a token does not name a live lease: unknown envelope (AP404) or stale (APL09).
CREATE FUNCTION agentpost._stale(p_id text, p_token uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    SELECT x.lease_token, x.lease_until, x.consumed_at, x.status INTO e
      FROM agentpost.envelopes x WHERE x.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    IF e.lease_token IS DISTINCT FROM p_token THEN
        PERFORM agentpost._fail('APL09', format(
            'the lease on envelope %L is stale: it was %s since', p_id,
            CASE WHEN e.consumed_at IS NOT NULL THEN 'acknowledged'
                 WHEN e.status = 'undeliverable' THEN 'dead-lettered'
                 WHEN e.lease_token IS NOT NULL THEN 'leased again'
                 ELSE 'returned to the inbox' END));
    END IF;
    PERFORM agentpost._fail('APL09', format('the lease on envelope %L has expired', p_id));
END $$;

-- Acknowledge leases, all or nothing: each envelope is consumed (its trail entry says by
-- which lease). Acking a blocking envelope reopens delivery to its inbox.
CREATE FUNCTION agentpost.ack(p_ids text[], p_tokens uuid[], p_durable boolean)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_ws text[];
    v_wanted int;
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
    WITH t AS (
        SELECT DISTINCT u.id, u.tok FROM unnest(p_ids, p_tokens) AS u(id, tok)
    ), a AS (
        UPDATE agentpost.envelopes e
           SET consumed_at = clock_timestamp(), lease_token = NULL, lease_until = NULL
          FROM t
         WHERE e.id = ANY (p_ids) AND e.id = t.id AND e.lease_token = t.tok
           AND e.lease_until > clock_timestamp()
           AND e.status = 'acknowledged' AND e.consumed_at IS NULL
        RETURNING e.id, e.seq, e.recipient, e.rank, e.leases, e.lease_holder
    )
    SELECT count(*), array_agg(a.recipient ORDER BY a.seq),
           array_agg('envelope_consumed'::text), array_agg(a.id ORDER BY a.seq),
           array_agg(jsonb_build_object('envelope_id', a.id, 'workspace_id', a.recipient,
                                        'via', 'ack', 'attempt', a.leases,
                                        'holder', a.lease_holder) ORDER BY a.seq),
           array_agg(DISTINCT a.recipient) FILTER (WHERE a.rank = 0)
      INTO v_n, t_chain, t_event, t_env, t_body, v_blocking
      FROM a;
    IF v_n < v_wanted THEN
        -- name the first token that failed (the whole call is undone by the error)
        SELECT u.id, u.tok INTO v_bad, v_bad_token
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, tok, k)
         WHERE NOT (u.id = ANY (coalesce(t_env, '{}')))
            OR (SELECT count(DISTINCT v.tok) FROM unnest(p_ids, p_tokens) AS v(id, tok)
                 WHERE v.id = u.id) > 1
         ORDER BY u.k LIMIT 1;
        PERFORM agentpost._stale(v_bad, v_bad_token);
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    FOR r IN SELECT x.ws, count(*) AS n FROM unnest(t_chain) AS x(ws) GROUP BY x.ws LOOP
        PERFORM agentpost._count(r.ws, 0, r.n::int, 0, 0, 0, 0);
    END LOOP;
    IF v_blocking IS NOT NULL THEN
        PERFORM agentpost._drain(w) FROM unnest(v_blocking) w;
    END IF;
    RETURN v_n;
END $$;

-- Give a lease back: the envelope returns to the tail of its level, leasable after the
-- delay; the fourth return dead-letters it. Returns the envelope's status afterwards.
CREATE FUNCTION agentpost.nack(p_id text, p_token uuid, p_delay_ms int, p_durable boolean)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_ws text;
BEGIN
    IF NOT p_durable THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT e.recipient INTO v_ws FROM agentpost.envelopes e WHERE e.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    PERFORM agentpost._lock_parties(ARRAY[v_ws], ARRAY[p_id]);
    IF NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                    WHERE e.id = p_id AND e.lease_token = p_token
                      AND e.lease_until > clock_timestamp()
                      AND e.status = 'acknowledged' AND e.consumed_at IS NULL
                      FOR UPDATE) THEN
        PERFORM agentpost._stale(p_id, p_token);
    END IF;
    PERFORM agentpost._return_leases(ARRAY[p_id], false, p_delay_ms);
    RETURN (SELECT e.status FROM agentpost.envelopes e WHERE e.id = p_id);
END $$;

-- Extend a live lease to p_ttl_ms from now (no trail entry: it changes no outcome).
CREATE FUNCTION agentpost.heartbeat(p_id text, p_token uuid, p_ttl_ms int) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_until timestamptz;
BEGIN
    UPDATE agentpost.envelopes e
       SET lease_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
     WHERE e.id = p_id AND e.lease_token = p_token AND e.lease_until > clock_timestamp()
       AND e.status = 'acknowledged' AND e.consumed_at IS NULL
    RETURNING e.lease_until INTO v_until;
    IF v_until IS NULL THEN
        PERFORM agentpost._stale(p_id, p_token);
    END IF;
    RETURN v_until;
END $$;

-- Return every expired lease, one inbox per transaction.
CREATE PROCEDURE agentpost.expire_leases(INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ws text;
    v_ids text[];
    v_n int := 0;
    v_inboxes int := 0;
BEGIN
    FOR v_ws IN SELECT DISTINCT e.recipient FROM agentpost.envelopes e
                 WHERE e.lease_token IS NOT NULL AND e.lease_until <= now() ORDER BY 1
    LOOP
        SELECT array_agg(e.id) INTO v_ids FROM agentpost.envelopes e
         WHERE e.recipient = v_ws AND e.lease_token IS NOT NULL AND e.lease_until <= now();
        CONTINUE WHEN v_ids IS NULL;
        PERFORM agentpost._lock_parties(ARRAY[v_ws], v_ids);
        v_n := v_n + agentpost._return_leases(v_ids, true, 0);
        v_inboxes := v_inboxes + 1;
        COMMIT;
    END LOOP;
    p_result := jsonb_build_object('expired', v_n, 'inboxes', v_inboxes);
END $$;

-- ---------------------------------------------------------------------------------------
-- Phase 1 of a send, replacing 0003's _submit: as before, plus caller-chosen ids
-- (idempotency keys), Courier's tags/headers/meta, rule-sent envelopes (origin system) and
-- the on-insert rules.

CREATE FUNCTION agentpost._accept(p_drafts jsonb, p_origin text, p_user text)
RETURNS TABLE (idx int, envelope_id text, status text, reason text, recipient text,
              duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_senders text[];
    v_locked int;
    v_last timestamptz;
    v_bad text;
    v_terminal text;
    v_reason text;
    v_consumed text;
    v_right text;
    v_ok boolean;
    tr record;
    k int;
    a_i int[]; a_id text[]; a_sender text[]; a_recipient text[]; a_type text[];
    a_prio text[]; a_reply text[]; a_orig text[]; a_ts timestamptz[]; a_reason text[];
    a_slow boolean[]; a_rights jsonb[]; a_consumed text[];
    v_dup_ids text[];
BEGIN
    v_senders := ARRAY(SELECT DISTINCT d.sender
                         FROM jsonb_to_recordset(p_drafts) AS d(sender text) ORDER BY 1);
    PERFORM agentpost._lock_chains(v_senders);
    IF p_origin = 'agent' THEN
        -- all senders must exist (there is nobody to record a rejection against otherwise)
        -- and none may be terminal
        SELECT count(w.id), min(w.id) FILTER (WHERE w.state IN ('closed', 'failed'))
          INTO v_locked, v_terminal
          FROM unnest(v_senders) u JOIN agentpost.workspaces w ON w.id = u;
        IF v_locked < cardinality(v_senders) THEN
            SELECT u INTO v_bad FROM unnest(v_senders) u
             WHERE NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = u) LIMIT 1;
            PERFORM agentpost._fail('AP404', format('unknown sender workspace %L', v_bad));
        END IF;
        IF v_terminal IS NOT NULL THEN
            PERFORM agentpost._fail('AP409',
                format('workspace %L is in a terminal state and cannot send', v_terminal));
        END IF;
    END IF;
    -- Caller-chosen ids are idempotency keys (Courier §6.4): locked after the chains, in
    -- sorted order, so two racing sends of one id serialize; an id already stored makes its
    -- draft a duplicate that sends nothing. The same id on another channel is a conflict.
    PERFORM pg_advisory_xact_lock(x.k)
       FROM (SELECT DISTINCT hashtextextended('agentpost.id:' || d.envelope_id, 0) AS k
               FROM jsonb_to_recordset(p_drafts) AS d(envelope_id text)
              WHERE d.envelope_id IS NOT NULL ORDER BY 1) x;
    SELECT array_agg(e.id),
           min(e.id) FILTER (WHERE e.sender <> d.sender OR e.recipient <> d.recipient)
      INTO v_dup_ids, v_bad
      FROM jsonb_to_recordset(p_drafts) AS d(envelope_id text, sender text, recipient text)
      JOIN agentpost.envelopes e ON e.id = d.envelope_id;
    IF v_bad IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope id %L is already used by an envelope of another channel', v_bad));
    END IF;
    v_dup_ids := coalesce(v_dup_ids, '{}');

    -- timestamps are monotonic within each sender
    v_last := agentpost._chains_last_at(v_senders);
    v_last := greatest(clock_timestamp(), coalesce(v_last, '-infinity'));

    -- validate and insert in one statement; creation order follows draft order per sender
    WITH v AS (
        SELECT d.*, coalesce(d.envelope_id, gen_random_uuid()::text) AS id,
               CASE WHEN p_origin = 'agent' THEN s.originator
                    ELSE coalesce(d.originator, p_user) END AS orig,
               CASE
                   WHEN d.malformed IS NOT NULL THEN 'invalid_structure'
                   WHEN ty.name IS NULL THEN 'invalid_type'
                   WHEN t.id IS NULL THEN 'target_not_found'
                   WHEN t.state IN ('integrating', 'closed', 'failed') THEN 'target_terminal'
                   WHEN cardinality(ty.required_fields) > 0
                        AND NOT coalesce(ty.required_fields <@ d.keys, false)
                       THEN 'invalid_structure'
                   WHEN p_origin = 'agent' AND NOT (
                        -- delegation (WACP §2): directive/feedback down to the delegate's
                        -- children, query up to the delegate
                        (s.delegation AND t.parent = s.id AND d.type IN ('directive', 'feedback'))
                        OR (t.delegation AND s.parent = t.id AND d.type = 'query')
                        OR EXISTS (SELECT 1 FROM agentpost.permissions p
                                    WHERE p.type = d.type AND p.sender_role = ANY (s.lineage)
                                      AND p.receiver_role = ANY (t.lineage)))
                       THEN 'permission_denied'
                   WHEN p_origin <> 'agent' AND jsonb_array_length(d.rights) > 0
                       THEN 'no_send_right'  -- a human or a rule holds no port rights
               END AS reason,
               p_origin = 'agent' AND (jsonb_array_length(d.rights) > 0 OR NOT EXISTS (
                   SELECT 1 FROM agentpost.port_rights pr
                    WHERE pr.holder = d.sender AND pr.target = d.recipient
                      AND pr.kind = 'send' AND pr.state = 'live')) AS slow
          FROM jsonb_to_recordset(p_drafts) AS d(
                   i int, sender text, recipient text, type text, format text, content text,
                   attachments jsonb, in_reply_to text, priority text, rights jsonb,
                   keys text[], malformed text, envelope_id text, tags text[], headers jsonb,
                   meta jsonb, hops int, originator text)
          LEFT JOIN agentpost.workspaces s ON s.id = d.sender
          LEFT JOIN agentpost.workspaces t ON t.id = d.recipient
          LEFT JOIN agentpost.envelope_types ty ON ty.name = d.type
         WHERE d.envelope_id IS NULL OR d.envelope_id <> ALL (v_dup_ids)
         ORDER BY d.sender, d.i
    ), numbered AS (
        SELECT v.*, nextval('agentpost.envelope_seq') AS seq,
               v_last + row_number() OVER () * interval '1 microsecond' AS ts
          FROM v
    ), ins AS (
        INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format,
                                         content, attachments, in_reply_to, rights, priority,
                                         origin, status, reason, created_at, tags, headers,
                                         meta, hops)
        SELECT n.id, n.seq, n.sender, n.recipient, n.orig, n.type, n.format,
               CASE WHEN n.reason IS NULL THEN n.content END,
               CASE WHEN n.reason IS NULL THEN n.attachments ELSE '[]' END,
               n.in_reply_to,
               CASE WHEN n.reason IS NULL THEN n.rights ELSE '[]' END,
               n.priority, p_origin,
               CASE WHEN n.reason IS NULL THEN 'validated' ELSE 'rejected' END,
               n.reason, n.ts, coalesce(n.tags, '{}'), coalesce(n.headers, '{}'),
               coalesce(n.meta, '{}'), coalesce(n.hops, 0)
          FROM numbered n
    )
    -- (numbered is produced in seq order and a CTE scan keeps that order)
    SELECT array_agg(n.i), array_agg(n.id), array_agg(n.sender), array_agg(n.recipient),
           array_agg(n.type), array_agg(n.priority), array_agg(n.in_reply_to),
           array_agg(n.orig), array_agg(n.ts), array_agg(n.reason), array_agg(n.slow),
           array_agg(n.rights)
      INTO a_i, a_id, a_sender, a_recipient, a_type, a_prio, a_reply, a_orig, a_ts,
           a_reason, a_slow, a_rights
      FROM numbered n;

    -- the per-draft path: spend a send-once right when no send right exists, and move
    -- transferred send-once rights into transit; all or nothing per envelope
    a_consumed := array_fill(NULL::text, ARRAY[coalesce(cardinality(a_id), 0)]);
    FOR k IN 1 .. coalesce(cardinality(a_id), 0) LOOP
        CONTINUE WHEN a_reason[k] IS NOT NULL OR NOT a_slow[k];
        v_consumed := NULL;
        v_reason := NULL;
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM agentpost.port_rights x
                            WHERE x.holder = a_sender[k] AND x.target = a_recipient[k]
                              AND x.kind = 'send' AND x.state = 'live') THEN
                UPDATE agentpost.port_rights pr
                   SET state = 'consumed', ended_at = clock_timestamp(), via_envelope = a_id[k]
                 WHERE pr.id = (SELECT x.id FROM agentpost.port_rights x
                                 WHERE x.holder = a_sender[k] AND x.target = a_recipient[k]
                                   AND x.kind = 'send_once' AND x.state = 'live'
                                 ORDER BY x.created_at, x.id LIMIT 1)
                RETURNING pr.id INTO v_consumed;
                IF v_consumed IS NULL THEN
                    RAISE EXCEPTION USING ERRCODE = 'AP499';
                END IF;
            END IF;
            FOR tr IN SELECT x.type AS kind, x.target
                        FROM jsonb_to_recordset(a_rights[k]) AS x(type text, target text)
            LOOP
                IF tr.kind = 'send' THEN
                    v_ok := EXISTS (SELECT 1 FROM agentpost.port_rights x
                                     WHERE x.holder = a_sender[k] AND x.target = tr.target
                                       AND x.kind = 'send' AND x.state = 'live');
                ELSE
                    v_right := NULL;
                    UPDATE agentpost.port_rights pr
                       SET state = 'in_transit', via_envelope = a_id[k]
                     WHERE pr.id = (SELECT x.id FROM agentpost.port_rights x
                                     WHERE x.holder = a_sender[k] AND x.target = tr.target
                                       AND x.kind = 'send_once' AND x.state = 'live'
                                     ORDER BY x.created_at, x.id LIMIT 1)
                    RETURNING pr.id INTO v_right;
                    v_ok := v_right IS NOT NULL;
                END IF;
                IF NOT v_ok THEN
                    RAISE EXCEPTION USING ERRCODE = 'AP499';
                END IF;
            END LOOP;
        EXCEPTION WHEN SQLSTATE 'AP499' THEN
            v_reason := 'no_send_right';
            v_consumed := NULL;
        END;
        a_consumed[k] := v_consumed;
        IF v_reason IS NOT NULL THEN
            a_reason[k] := v_reason;
            UPDATE agentpost.envelopes e
               SET status = 'rejected', reason = v_reason, content = NULL, attachments = '[]',
                   rights = '[]'
             WHERE e.id = a_id[k];
        END IF;
    END LOOP;

    IF EXISTS (SELECT 1 FROM unnest(a_reason) r WHERE r IS NOT NULL) THEN
        INSERT INTO agentpost.signals (workspace_id, signal, ref, reason, emitted_by, at)
        SELECT u.sender, 'rejected', u.id, u.reason, 'runtime', u.ts
          FROM unnest(a_sender, a_id, a_reason, a_ts) AS u(sender, id, reason, ts)
         WHERE u.reason IS NOT NULL;
    END IF;

    -- the senders' trail entries, in creation order: created (and the send-once right it
    -- spent), or rejected and the notification
    PERFORM agentpost._trail_write(array_agg(x.chain), array_agg(x.event),
                                   array_agg(x.id), array_agg(x.body), true)
      FROM (SELECT u.sender AS chain, u.id,
                   CASE
                       WHEN j = 1 AND u.reason IS NULL THEN 'envelope_created'
                       WHEN j = 1 THEN 'envelope_rejected'
                       WHEN u.reason IS NULL THEN 'port_right_consumed'
                       ELSE 'signal_emitted'
                   END AS event,
                   CASE
                       WHEN j = 1 AND u.reason IS NULL THEN jsonb_build_object(
                           'envelope_id', u.id, 'from', u.sender, 'to', u.recipient,
                           'type', u.type, 'priority', u.prio, 'in_reply_to', u.reply,
                           'originator', u.orig, 'origin', p_origin, 'timestamp', u.ts)
                       WHEN j = 1 THEN jsonb_build_object(
                           'envelope_id', u.id, 'from', u.sender, 'to', u.recipient,
                           'type', u.type, 'reason', u.reason, 'timestamp', u.ts)
                       WHEN u.reason IS NULL THEN jsonb_build_object(
                           'right_id', u.consumed, 'holder', u.sender, 'target', u.recipient,
                           'via_envelope', u.id)
                       ELSE jsonb_build_object('signal', 'rejected', 'ref', u.id,
                                               'to', u.sender, 'reason', u.reason)
                   END AS body
              FROM unnest(a_id, a_sender, a_recipient, a_type, a_prio, a_reply, a_orig, a_ts,
                          a_reason, a_consumed)
                   WITH ORDINALITY AS u(id, sender, recipient, type, prio, reply, orig, ts,
                                        reason, consumed, k)
              CROSS JOIN generate_series(1, 2) AS j
             WHERE j = 1 OR u.reason IS NOT NULL OR u.consumed IS NOT NULL
             ORDER BY u.k, j) x;

    -- on-insert rules see every accepted envelope (their firings are sent after commit)
    PERFORM agentpost._match_rules(ARRAY(SELECT u.id FROM unnest(a_id, a_reason) AS u(id, reason)
                                          WHERE u.reason IS NULL));

    RETURN QUERY SELECT u.i, u.id, CASE WHEN u.reason IS NULL THEN 'validated' ELSE 'rejected' END,
                        u.reason, u.recipient, false
                   FROM unnest(a_i, a_id, a_reason, a_recipient) AS u(i, id, reason, recipient)
                  WHERE u.id IS NOT NULL
                 UNION ALL
                 SELECT d.i, e.id, e.status, e.reason, e.recipient, true
                   FROM jsonb_to_recordset(p_drafts) AS d(i int, envelope_id text)
                   JOIN agentpost.envelopes e ON e.id = d.envelope_id
                  WHERE d.envelope_id = ANY (v_dup_ids);
END $$;

-- ---------------------------------------------------------------------------------------
-- On-insert rules (Courier §8)
--
-- A rule matches accepted envelopes (exact to, from and type; all of its tags; each of its
-- header values) in the transaction that accepts them, and queues its `notify` envelopes in
-- rule_outbox; the send path sends the queue right after its commit, as envelopes from
-- `rule:<id>` (origin system, no permission matrix, but a registered type and a live target).
-- An envelope carries how many rule generations led to it (hops); one at a rule's max_hops
-- never fires it, so rules that notify each other stop. A cooldown fires a rule at most once
-- per period, for the first matching envelope.

CREATE TABLE agentpost.rules (
    id            text PRIMARY KEY,
    definition    jsonb NOT NULL,
    match_to      text,
    match_from    text,
    match_type    text,
    match_tags    text[] NOT NULL DEFAULT '{}',
    match_headers jsonb NOT NULL DEFAULT '{}',
    actions       jsonb NOT NULL,
    cooldown_ms   int NOT NULL DEFAULT 0,
    max_hops      int NOT NULL DEFAULT 3,
    enabled       boolean NOT NULL DEFAULT true,
    fired         bigint NOT NULL DEFAULT 0,
    last_fired_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE agentpost.rule_outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule_id    text NOT NULL,
    trigger_id text NOT NULL,
    recipient  text NOT NULL,
    type       text NOT NULL,
    priority   text NOT NULL,
    content    jsonb NOT NULL,
    hops       int NOT NULL,
    originator text NOT NULL
);

CREATE FUNCTION agentpost.put_rule(p_rule jsonb, p_replace boolean) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_id text := p_rule->>'id';
    v_missing text;
BEGIN
    SELECT a->>'type' INTO v_missing FROM jsonb_array_elements(p_rule->'do') a
     WHERE NOT EXISTS (SELECT 1 FROM agentpost.envelope_types t WHERE t.name = a->>'type')
     LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP404', format(
            'rule %L notifies with unknown envelope type %L: register it first', v_id, v_missing));
    END IF;
    SELECT a->>'to' INTO v_missing FROM jsonb_array_elements(p_rule->'do') a
     WHERE NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = a->>'to') LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP404', format(
            'rule %L notifies unknown workspace %L', v_id, v_missing));
    END IF;
    PERFORM agentpost._lock_chain('system');
    IF EXISTS (SELECT 1 FROM agentpost.rules r WHERE r.id = v_id) AND NOT p_replace THEN
        PERFORM agentpost._fail('AP409', format('rule %L already exists', v_id));
    END IF;
    INSERT INTO agentpost.rules AS r (id, definition, match_to, match_from, match_type,
                                      match_tags, match_headers, actions, cooldown_ms,
                                      max_hops, enabled)
    VALUES (v_id, p_rule, p_rule->'when'->>'to', p_rule->'when'->>'from',
            p_rule->'when'->>'type',
            ARRAY(SELECT jsonb_array_elements_text(coalesce(p_rule->'when'->'tags', '[]'))),
            coalesce(p_rule->'when'->'headers', '{}'), p_rule->'do',
            coalesce((p_rule->'limits'->>'cooldownMs')::int, 0),
            coalesce((p_rule->>'max_hops')::int, 3),
            coalesce((p_rule->>'enabled')::boolean, true))
    ON CONFLICT (id) DO UPDATE
       SET definition = EXCLUDED.definition, match_to = EXCLUDED.match_to,
           match_from = EXCLUDED.match_from, match_type = EXCLUDED.match_type,
           match_tags = EXCLUDED.match_tags, match_headers = EXCLUDED.match_headers,
           actions = EXCLUDED.actions, cooldown_ms = EXCLUDED.cooldown_ms,
           max_hops = EXCLUDED.max_hops, enabled = EXCLUDED.enabled;
    PERFORM agentpost._trail_one('system', 'rule_defined', NULL, p_rule);
    RETURN p_rule;
END $$;

CREATE FUNCTION agentpost.remove_rule(p_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._lock_chain('system');
    DELETE FROM agentpost.rules WHERE id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown rule %L', p_id));
    END IF;
    PERFORM agentpost._trail_one('system', 'rule_removed', NULL, jsonb_build_object('id', p_id));
END $$;

CREATE FUNCTION agentpost.enable_rule(p_id text, p_enabled boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._lock_chain('system');
    UPDATE agentpost.rules
       SET enabled = p_enabled,
           definition = definition || jsonb_build_object('enabled', p_enabled)
     WHERE id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown rule %L', p_id));
    END IF;
    PERFORM agentpost._trail_one('system',
        CASE WHEN p_enabled THEN 'rule_enabled' ELSE 'rule_disabled' END, NULL,
        jsonb_build_object('id', p_id));
END $$;

-- A notify payload with ${env.<name>} references filled in from the inserted envelope
-- (values are inserted as JSON string text, so they cannot break the JSON around them).
CREATE FUNCTION agentpost._render(p_template jsonb, e agentpost.envelopes) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_text text := p_template::text;
    v_name text;
    v_value text;
BEGIN
    FOR v_name IN SELECT DISTINCT m[1]
                    FROM regexp_matches(v_text, '\$\{env\.([A-Za-z0-9_.-]+)\}', 'g') AS m
    LOOP
        v_value := CASE v_name
            WHEN 'id' THEN e.id
            WHEN 'from' THEN e.sender
            WHEN 'to' THEN e.recipient
            WHEN 'type' THEN e.type
            WHEN 'priority' THEN e.priority
            WHEN 'originator' THEN e.originator
            WHEN 'ts' THEN to_char(e.created_at AT TIME ZONE 'UTC',
                                   'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            ELSE CASE
                WHEN v_name LIKE 'headers.%' THEN e.headers->>substr(v_name, 9)
                WHEN v_name LIKE 'meta.%' THEN e.meta->>substr(v_name, 6)
            END
        END;
        v_value := to_jsonb(coalesce(v_value, ''))::text;
        v_text := replace(v_text, '${env.' || v_name || '}',
                          substr(v_value, 2, length(v_value) - 2));
    END LOOP;
    RETURN v_text::jsonb;
END $$;

-- Match accepted envelopes against the enabled rules and queue what they fire. Rules are
-- visited in id order (their rows are locked by the cooldown update, always in that order).
CREATE FUNCTION agentpost._match_rules(p_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_ids text[];
BEGIN
    IF cardinality(p_ids) = 0 OR NOT EXISTS (SELECT 1 FROM agentpost.rules WHERE enabled) THEN
        RETURN;
    END IF;
    FOR r IN SELECT ru.id, ru.actions, ru.cooldown_ms, array_agg(e.id ORDER BY e.seq) AS ids
               FROM agentpost.rules ru
               JOIN agentpost.envelopes e ON e.id = ANY (p_ids)
              WHERE ru.enabled AND e.hops < ru.max_hops
                AND (ru.match_to IS NULL OR ru.match_to = e.recipient)
                AND (ru.match_from IS NULL OR ru.match_from = e.sender)
                AND (ru.match_type IS NULL OR ru.match_type = e.type)
                AND e.tags @> ru.match_tags AND e.headers @> ru.match_headers
              GROUP BY ru.id ORDER BY ru.id
    LOOP
        v_ids := CASE WHEN r.cooldown_ms > 0 THEN r.ids[1:1] ELSE r.ids END;
        UPDATE agentpost.rules ru
           SET last_fired_at = clock_timestamp(), fired = ru.fired + cardinality(v_ids)
         WHERE ru.id = r.id
           AND (ru.cooldown_ms = 0 OR ru.last_fired_at IS NULL
                OR ru.last_fired_at + ru.cooldown_ms * interval '1 millisecond'
                   <= clock_timestamp());
        CONTINUE WHEN NOT FOUND;
        INSERT INTO agentpost.rule_outbox (rule_id, trigger_id, recipient, type, priority,
                                           content, hops, originator)
        SELECT r.id, e.id, a->>'to', a->>'type', coalesce(a->>'priority', 'normal'),
               agentpost._render(coalesce(a->'payload', '{}'), e), e.hops + 1, e.originator
          FROM unnest(v_ids) WITH ORDINALITY AS u(id, k)
          JOIN agentpost.envelopes e ON e.id = u.id
         CROSS JOIN LATERAL jsonb_array_elements(r.actions) WITH ORDINALITY AS x(a, j)
         ORDER BY u.k, x.j;
    END LOOP;
END $$;

-- Send what the rules queued, in rounds (a round's envelopes may fire the next generation),
-- each round committed and then delivered.
CREATE PROCEDURE agentpost._fire_outbox(p_timeout_ms int, INOUT p_sent int DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    v_drafts jsonb;
    v_recipients text[];
    v_n int;
BEGIN
    p_sent := 0;
    FOR round IN 1 .. 100 LOOP
        WITH o AS (
            DELETE FROM agentpost.rule_outbox
             WHERE id IN (SELECT x.id FROM agentpost.rule_outbox x ORDER BY x.id LIMIT 500
                             FOR UPDATE SKIP LOCKED)
            RETURNING *
        )
        SELECT jsonb_agg(jsonb_build_object(
                   'i', o.id, 'sender', 'rule:' || o.rule_id, 'recipient', o.recipient,
                   'type', o.type, 'format', 'json', 'content', o.content::text,
                   'attachments', '[]'::jsonb, 'in_reply_to', o.trigger_id,
                   'priority', o.priority, 'rights', '[]'::jsonb,
                   'keys', CASE WHEN jsonb_typeof(o.content) = 'object'
                                THEN to_jsonb(ARRAY(SELECT jsonb_object_keys(o.content))) END,
                   'hops', o.hops, 'originator', o.originator) ORDER BY o.id),
               count(*)
          INTO v_drafts, v_n
          FROM o;
        EXIT WHEN v_drafts IS NULL;
        SELECT array_agg(DISTINCT a.recipient) FILTER (WHERE a.status = 'validated')
          INTO v_recipients
          FROM agentpost._accept(v_drafts, 'system', NULL) a;
        COMMIT;
        CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
        p_sent := p_sent + v_n;
    END LOOP;
END $$;

CREATE PROCEDURE agentpost.fire_rules(p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_sent int;
BEGIN
    CALL agentpost._fire_outbox(p_timeout_ms, v_sent);
    p_result := jsonb_build_object('sent', v_sent);
END $$;

-- ---------------------------------------------------------------------------------------
-- The send path again, now through _accept (caller ids, Courier fields, rules).

DROP FUNCTION agentpost._results(text[]);

CREATE FUNCTION agentpost._results(p_ids text[], p_duplicates boolean[]) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object('envelope_id', e.id,
                                                         'status', e.status,
                                                         'reason', e.reason,
                                                         'duplicate', u.dup)
                                      ORDER BY u.k), '[]')
              FROM unnest(p_ids, p_duplicates) WITH ORDINALITY AS u(id, dup, k)
              JOIN agentpost.envelopes e ON e.id = u.id);
END $$;

CREATE OR REPLACE PROCEDURE agentpost.send(p_drafts jsonb, p_origin text, p_user text,
                                           p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_dups boolean[];
    v_recipients text[];
    v_fired int;
BEGIN
    SELECT array_agg(s.envelope_id ORDER BY s.idx), array_agg(s.duplicate ORDER BY s.idx),
           array_agg(DISTINCT s.recipient)
               FILTER (WHERE s.status = 'validated' AND NOT s.duplicate)
      INTO v_ids, v_dups, v_recipients
      FROM agentpost._accept(p_drafts, p_origin, p_user) s;
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    IF EXISTS (SELECT 1 FROM agentpost.rule_outbox) THEN
        CALL agentpost._fire_outbox(p_timeout_ms, v_fired);
    END IF;
    p_result := agentpost._results(v_ids, v_dups);
END $$;

CREATE OR REPLACE PROCEDURE agentpost.send_one(p_sender text, p_recipient text, p_type text,
                                               p_format text, p_content text,
                                               p_attachments jsonb, p_in_reply_to text,
                                               p_priority text, p_keys text[],
                                               p_timeout_ms int,
                                               INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
    v_status text;
    v_reason text;
    v_rules boolean;
    v_fired int;
BEGIN
    v_rules := EXISTS (SELECT 1 FROM agentpost.rules WHERE enabled);
    IF NOT v_rules THEN
        v_id := agentpost._submit_one(p_sender, p_recipient, p_type, p_format, p_content,
                                      p_attachments, p_in_reply_to, p_priority, p_keys);
    END IF;
    IF v_id IS NULL THEN
        SELECT s.envelope_id, s.status INTO v_id, v_status
          FROM agentpost._accept(jsonb_build_array(jsonb_build_object(
                   'i', 0, 'sender', p_sender, 'recipient', p_recipient, 'type', p_type,
                   'format', p_format, 'content', p_content, 'attachments', p_attachments,
                   'in_reply_to', p_in_reply_to, 'priority', p_priority, 'rights', '[]'::jsonb,
                   'keys', p_keys)), 'agent', NULL) s;
    END IF;
    COMMIT;
    IF v_status IS DISTINCT FROM 'rejected' THEN
        CALL agentpost._deliver_to(p_recipient, p_timeout_ms);
    END IF;
    IF v_rules AND EXISTS (SELECT 1 FROM agentpost.rule_outbox) THEN
        CALL agentpost._fire_outbox(p_timeout_ms, v_fired);
    END IF;
    SELECT e.status, e.reason INTO v_status, v_reason FROM agentpost.envelopes e
     WHERE e.id = v_id;
    p_result := jsonb_build_object('envelope_id', v_id, 'status', v_status,
                                   'reason', v_reason, 'duplicate', false);
END $$;

DROP FUNCTION agentpost._submit(jsonb, text, text);
