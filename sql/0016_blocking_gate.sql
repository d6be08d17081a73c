-- The blocking gate reopens however a blocking envelope leaves its inbox (WACP §6, blocking
-- priority semantics: delivery pauses only until the blocking envelope is done with).
-- Before, only an ack or consume() drained the queue behind it: a blocking envelope
-- dead-lettered by its fourth nack or expiry left what was queued behind it validated,
-- nothing leasable and nobody woken, until another send or a maintenance run came by. Now
-- every exit (ack, consume, dead letter by nack or by expiry) goes through _reopen: the queue
-- drains and the inbox is notified, whether or not anything was left to deliver (envelopes
-- already delivered behind the gate become leasable).
--
-- Also: consume() clears the envelope's lease, and a token for a consumed envelope is refused
-- as "consumed", not "expired".

-- Reopen the inboxes of the given workspaces after a blocking envelope left them: deliver what
-- waits behind the gate and wake their consumers. The caller holds their chains. Returns the
-- number of envelopes delivered.
CREATE FUNCTION agentpost._reopen(p_ws text[]) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int := 0;
    w text;
BEGIN
    FOREACH w IN ARRAY p_ws LOOP
        v_n := v_n + greatest(agentpost._drain(w), 0);
        PERFORM pg_notify('agentpost_inbox', w);
    END LOOP;
    RETURN v_n;
END $$;

CREATE OR REPLACE FUNCTION agentpost._stale(p_id text, p_token uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    SELECT x.lease_token, x.lease_until, x.consumed_at, x.status INTO e
      FROM agentpost.envelopes x WHERE x.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    IF e.lease_token IS DISTINCT FROM p_token OR e.consumed_at IS NOT NULL THEN
        PERFORM agentpost._fail('APL09', format(
            'the lease on envelope %L is stale: it was %s since', p_id,
            CASE WHEN e.consumed_at IS NOT NULL THEN 'consumed (acknowledged)'
                 WHEN e.status = 'undeliverable' THEN 'dead-lettered'
                 WHEN e.lease_token IS NOT NULL THEN 'leased again'
                 ELSE 'returned to the inbox' END));
    END IF;
    PERFORM agentpost._fail('APL09', format('the lease on envelope %L has expired', p_id));
END $$;

CREATE OR REPLACE FUNCTION agentpost._return_leases(p_ids text[], p_expired_only boolean, p_delay_ms int)
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

CREATE OR REPLACE FUNCTION agentpost.ack(p_ids text[], p_tokens uuid[], p_durable boolean)
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
        PERFORM agentpost._reopen(v_blocking);
    END IF;
    RETURN v_n;
END $$;

CREATE OR REPLACE FUNCTION agentpost.consume(p_ws text, p_id text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    e record;
    v_gate text;
BEGIN
    PERFORM agentpost._lock_chain(p_ws);
    SELECT x.status, x.consumed_at, x.rank, x.sender INTO e
      FROM agentpost.envelopes x WHERE x.id = p_id AND x.recipient = p_ws;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format(
            'envelope %L is not in the inbox of %L', p_id, p_ws));
    END IF;
    IF e.status <> 'acknowledged' THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %L has not been delivered (status %s)', p_id, e.status));
    END IF;
    IF e.consumed_at IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format('envelope %L was already consumed', p_id));
    END IF;
    SELECT x.id INTO v_gate FROM agentpost.envelopes x
     WHERE x.recipient = p_ws AND x.status = 'acknowledged' AND x.consumed_at IS NULL
       AND x.rank = 0
     ORDER BY x.seq LIMIT 1;
    IF v_gate IS NOT NULL AND v_gate <> p_id THEN
        PERFORM agentpost._fail('APB09', format(
            'the inbox of %L is held by blocking envelope %L; consume it first', p_ws, v_gate));
    END IF;
    UPDATE agentpost.envelopes
       SET consumed_at = clock_timestamp(), lease_token = NULL, lease_until = NULL
     WHERE id = p_id;
    PERFORM agentpost._trail_one(p_ws, 'envelope_consumed', p_id,
        jsonb_build_object('envelope_id', p_id, 'workspace_id', p_ws));
    IF e.rank = 0 THEN
        RETURN agentpost._reopen(ARRAY[p_ws]);
    END IF;
    RETURN 0;
END $$;
