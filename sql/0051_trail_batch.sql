-- Trail entries of a lease or ack batch written by one statement, rows signed from the
-- statement that changed them.
--
-- A batch of 100 leases (or acks) writes 100 entries in the inbox's chain, one per envelope,
-- each hash-chained and signed as before (verify_trail() checks every one). Before, they went
-- through _trail_write: one statement looked every envelope up again by primary key to sign
-- its row (sql/0017), another read the chain heads, a plpgsql loop built, hashed and linked
-- the entries one by one, and an INSERT wrote them. Now the UPDATE that leases or consumes
-- the envelopes returns each row's signed state (`row`, the same object _trail_write would
-- have added: the row as this transaction leaves it), and _trail_batch builds, chains, signs
-- and inserts the whole batch in one INSERT ... SELECT: the chain's head, the records, the
-- hash chain (a recursive step per entry: each hash covers the one before) and the MACs.
-- Entries, hashes and MACs are byte for byte what _trail_write writes for the same bodies.

-- Append complete entries (lifecycle bodies already carry their `row`), in the given order
-- within each chain; the caller holds every chain's lock.
CREATE FUNCTION agentpost._trail_batch(p_chain text[], p_event text[], p_envelope text[],
                                       p_body jsonb[])
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_ipad bytea;
    v_opad bytea;
BEGIN
    IF coalesce(cardinality(p_chain), 0) = 0 THEN
        RETURN;
    END IF;
    v_ipad := decode(current_setting('agentpost.mac_ipad', true), 'hex');
    v_opad := decode(current_setting('agentpost.mac_opad', true), 'hex');
    IF v_ipad IS NULL OR v_opad IS NULL OR v_ipad = '' THEN
        PERFORM agentpost._mac_pad('ipad');  -- raises the configuration error
    END IF;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    WITH RECURSIVE h AS (
        SELECT d.c, coalesce(l.chain_seq, 0) AS seq, l.hash,
               greatest(v_now, l.at + interval '1 microsecond') AS at
          FROM (SELECT DISTINCT c FROM unnest(p_chain) c) d
          LEFT JOIN LATERAL (SELECT t.chain_seq, t.hash, t.at FROM agentpost.trail t
                              WHERE t.chain = d.c ORDER BY t.chain_seq DESC LIMIT 1) l ON true
    ), r AS (
        SELECT u.k, u.c, u.n, h.seq + u.n AS seq, u.ev, u.env, h.at,
               agentpost._record(u.c, h.seq + u.n, u.ev, u.env, h.at, u.b) AS rec
          FROM (SELECT x.*, row_number() OVER (PARTITION BY x.c ORDER BY x.k) AS n
                  FROM unnest(p_chain, p_event, p_envelope, p_body) WITH ORDINALITY
                       AS x(c, ev, env, b, k)) u
          JOIN h ON h.c = u.c
    ), link(c, n, hash, prev) AS (
        SELECT h.c, 0::bigint, h.hash, NULL::bytea FROM h
        UNION ALL
        SELECT r.c, r.n, agentpost._link(link.hash, r.rec),
               coalesce(link.hash, decode(repeat('00', 32), 'hex'))
          FROM link JOIN r ON r.c = link.c AND r.n = link.n + 1
    )
    SELECT r.c, r.seq, r.ev, r.env, r.at, r.rec, l.prev, l.hash,
           agentpost._mac(l.hash, v_ipad, v_opad)
      FROM r JOIN link l ON l.c = r.c AND l.n = r.n
     ORDER BY r.k;
END $$;

-- (As sql/0050, with the trail written by _trail_batch.)
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
    PERFORM agentpost._trail_batch(t_chain, t_event, t_env, t_body);
    PERFORM agentpost._count(p_ws, cardinality(v_ids), 0, 0, 0, 0, 0);
    RETURN QUERY SELECT e.* FROM unnest(v_ids) WITH ORDINALITY AS x(id, k)
                   JOIN agentpost.envelopes e ON e.id = x.id
                  ORDER BY x.k;
END $$;

-- (As sql/0050, with the trail written by _trail_batch.)
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
    PERFORM agentpost._trail_batch(t_chain, t_event, t_env, t_body);
    FOR r IN SELECT x.ws, count(*) AS n FROM unnest(t_chain) AS x(ws) GROUP BY x.ws LOOP
        PERFORM agentpost._count(r.ws, 0, r.n::int, 0, 0, 0, 0);
    END LOOP;
    IF v_blocking IS NOT NULL THEN
        PERFORM agentpost._reopen(v_blocking);
    END IF;
    RETURN v_n;
END $$;
