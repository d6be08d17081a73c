-- Consumers of one inbox that do not wait for each other (issue 25: four consumers of one
-- inbox ran at 0.8x one consumer).
--
-- A lease and an ack used to take the inbox's chain exclusively, for the chain's next
-- sequence number and to keep the blocking gate still while the lease looked at it; so an
-- inbox served one lease or ack at a time, its commit included. Now they take the inbox's
-- chain key in shared mode: leases and acks of one inbox run side by side (their rows are
-- claimed SKIP LOCKED), while whatever moves the gate (a delivery, the ack of a blocking
-- envelope, a nack, an expiry, a consume) still takes it exclusively and so waits for them,
-- as they wait for it. Their entries (`envelope_leased`, `envelope_consumed`) go to the
-- inbox's own chain when nothing else holds it (one consumer: the trail looks as before),
-- else to a consumer lane: one of eight chains `lane:<k>:<inbox>`, each locked exclusively
-- like any chain, tried without waiting in an order that starts at the backend's own. A
-- lane is taken last, after the rows are locked, and nothing waits while holding one but
-- for the inbox's counter row, so lanes add no lock cycle. An envelope's entries stay in
-- trail-id order of its changes: each is written under the envelope's row lock.

-- `lane:` names no workspace (workspace ids cannot hold ':'), and is reserved all the same
CREATE OR REPLACE FUNCTION agentpost._reserved_chain(p_name text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT p_name = 'system' OR p_name ~ '^(human|command|saga|rule|lane):';
$$;

-- an inbox's consumer lanes, in lane order (eight: more consumers than that share them)
CREATE FUNCTION agentpost.consumer_lanes(p_ws text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT ARRAY(SELECT 'lane:' || k || ':' || p_ws FROM generate_series(0, 7) AS k ORDER BY k);
$$;

-- the inbox a chain's lease and ack entries belong to: its own name, or a lane's inbox
CREATE FUNCTION agentpost.lane_inbox(p_chain text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN p_chain LIKE 'lane:%' THEN regexp_replace(p_chain, '^lane:[0-9]+:', '')
                ELSE p_chain END;
$$;

CREATE FUNCTION agentpost._lock_inbox_shared(p_ws text) RETURNS void
    LANGUAGE sql
    AS $$
    SELECT pg_advisory_xact_lock_shared(agentpost._chain_key(p_ws));
$$;

-- The chain this transaction's lease or ack entries of inbox p_ws go to, locked: the inbox's
-- own if no one else holds it (this transaction's shared hold does not count), else the
-- first free lane from this backend's own, else this backend's lane once it is free.
CREATE FUNCTION agentpost._consumer_chain(p_ws text) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_lanes text[];
    v_first int;
    v_lane text;
BEGIN
    IF pg_try_advisory_xact_lock(agentpost._chain_key(p_ws)) THEN
        RETURN p_ws;
    END IF;
    v_lanes := agentpost.consumer_lanes(p_ws);
    v_first := pg_backend_pid() % cardinality(v_lanes);
    FOR k IN 0 .. cardinality(v_lanes) - 1 LOOP
        v_lane := v_lanes[(v_first + k) % cardinality(v_lanes) + 1];
        IF pg_try_advisory_xact_lock(agentpost._chain_key(v_lane)) THEN
            RETURN v_lane;
        END IF;
    END LOOP;
    v_lane := v_lanes[v_first + 1];
    PERFORM pg_advisory_xact_lock(agentpost._chain_key(v_lane));
    RETURN v_lane;
END $$;

CREATE OR REPLACE FUNCTION agentpost.lease(p_ws text, p_max integer, p_ttl_ms integer, p_holder text) RETURNS SETOF agentpost.envelopes
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_expired text[];
    v_top smallint;
    v_claim text[];
    v_ids text[];
    v_chain text;
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
        PERFORM agentpost._lock_inbox_shared(p_ws);
    END IF;

    -- the gate (one probe of the inbox index), then the claim: the inbox index from its
    -- start, in its own order, up to p_max rows (whatever can move the gate, a delivery, a
    -- blocking envelope's ack, a nack or an expiry, takes the inbox's chain exclusively, so
    -- it waits for this transaction's shared hold: the gate cannot move in between; other
    -- leases and acks share the hold and claim past each other, SKIP LOCKED)
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

    v_chain := agentpost._consumer_chain(p_ws);
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
    SELECT array_agg(u.id ORDER BY u.rank, u.pos), array_agg(v_chain),
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

CREATE OR REPLACE FUNCTION agentpost.ack(p_ids text[], p_tokens uuid[], p_durable boolean) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_ws text[];
    v_gate boolean;
    v_shared boolean;
    v_chain text;
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
    -- one inbox and no blocking envelope among them (the common ack): share the inbox's
    -- hold with its other consumers and write on a consumer chain once the rows are locked;
    -- else (a blocking envelope's ack moves the gate) the inboxes' chains, exclusively
    SELECT array_agg(DISTINCT e.recipient), bool_or(e.rank = 0) INTO v_ws, v_gate
      FROM agentpost.envelopes e WHERE e.id = ANY (p_ids);
    v_shared := coalesce(cardinality(v_ws) = 1 AND NOT v_gate, false);
    IF v_shared THEN
        PERFORM agentpost._lock_inbox_shared(v_ws[1]);
    ELSE
        PERFORM agentpost._lock_chains(v_ws);
    END IF;
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
    v_chain := CASE WHEN v_shared THEN agentpost._consumer_chain(v_ws[1]) END;
    WITH a AS (
        UPDATE agentpost.envelopes e
           SET consumed_at = clock_timestamp(), lease_token = NULL, lease_until = NULL
         WHERE e.id = ANY (v_ok)
        RETURNING e.id, e.seq, e.recipient, e.rank, e.leases, e.lease_holder,
                  agentpost._envelope_row(e, false) AS state
    )
    SELECT count(*), array_agg(coalesce(v_chain, a.recipient) ORDER BY a.seq),
           array_agg('envelope_consumed'::text), array_agg(a.id ORDER BY a.seq),
           array_agg(jsonb_build_object('envelope_id', a.id, 'workspace_id', a.recipient,
                                        'via', 'ack', 'attempt', a.leases,
                                        'holder', a.lease_holder, 'row', a.state)
                     ORDER BY a.seq),
           array_agg(DISTINCT a.recipient) FILTER (WHERE a.rank = 0)
      INTO v_n, t_chain, t_event, t_env, t_body, v_blocking
      FROM a;
    PERFORM agentpost._trail_append(t_chain, t_event, t_env, t_body, clock_timestamp());
    FOR r IN SELECT e.recipient AS ws, count(*) AS n FROM agentpost.envelopes e
              WHERE e.id = ANY (v_ok) GROUP BY e.recipient LOOP
        PERFORM agentpost._count(r.ws, 0, r.n::int, 0, 0, 0, 0);
    END LOOP;
    IF v_blocking IS NOT NULL THEN
        PERFORM agentpost._reopen(v_blocking);
    END IF;
    RETURN v_n;
END $$;
