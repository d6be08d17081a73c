-- The tamper-evident trail. One hash chain per workspace (plus `system` for registry changes
-- and `human:<user>` for the human highway), so unrelated senders never wait on each other.
-- Each entry stores the canonical JSON `record` that was hashed:
--     hash = sha256(prev_hash || utf8(record)),  mac = HMAC-SHA256(key, hash)
-- The HMAC key never reaches the database: the client sets the key's inner and outer pads
-- (RFC 2104) as session settings agentpost.mac_ipad / agentpost.mac_opad.
--
-- A chain is serialized by a transaction-scoped advisory lock on its name, and its head is its
-- last entry (found through the unique index). There is deliberately no "heads" table: a row
-- updated on every append turns into a hot spot of dead tuples that slows every send.

CREATE TABLE agentpost.trail (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chain       text NOT NULL,
    chain_seq   bigint NOT NULL,
    event       text NOT NULL,
    envelope_id text,
    at          timestamptz NOT NULL,
    record      text NOT NULL,
    prev_hash   bytea NOT NULL,
    hash        bytea NOT NULL,
    mac         bytea NOT NULL,
    UNIQUE (chain, chain_seq)
);

CREATE INDEX trail_envelope ON agentpost.trail (envelope_id) WHERE envelope_id IS NOT NULL;

CREATE FUNCTION agentpost._mac_pad(p_name text) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := current_setting('agentpost.mac_' || p_name, true);
BEGIN
    IF v IS NULL OR v = '' THEN
        PERFORM agentpost._fail('AP500', 'the trail signing key is not configured for this session');
    END IF;
    RETURN decode(v, 'hex');
END $$;

-- The advisory-lock key of a chain.
CREATE FUNCTION agentpost._chain_key(p_chain text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('agentpost.trail:' || p_chain, 0);
$$;

-- Lock chains for this transaction, in ascending key order (every multi-chain lock goes
-- through here, so two transactions can never wait on each other in a cycle).
CREATE FUNCTION agentpost._lock_chains(p_chains text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(x.k)
       FROM (SELECT DISTINCT agentpost._chain_key(c) AS k
               FROM unnest(p_chains) c WHERE c IS NOT NULL ORDER BY 1) x;
END $$;

CREATE FUNCTION agentpost._lock_chain(p_chain text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(agentpost._chain_key(p_chain));
END $$;

-- The latest timestamp written to any of these chains (for monotonic timestamps).
CREATE FUNCTION agentpost._chains_last_at(p_chains text[]) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT max(l.at) FROM unnest(p_chains) c,
                   LATERAL (SELECT t.at FROM agentpost.trail t WHERE t.chain = c
                             ORDER BY t.chain_seq DESC LIMIT 1) l);
END $$;

-- Append entries, in the given order within each chain. The chains are locked first (sorted)
-- unless the caller already holds them; hashes are computed in the loop (measured faster here
-- than building the records set-based); the rows go in with one INSERT.
CREATE FUNCTION agentpost._trail_write(p_chain text[], p_event text[], p_envelope text[],
                                       p_body jsonb[], p_locked boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    cur text := NULL;
    n int := 0;
    v_seq bigint;
    v_hash bytea;
    v_last timestamptz;
    v_at timestamptz;
    v_at_us bigint;
    v_rec text;
    v_now timestamptz := clock_timestamp();
    v_ipad bytea;
    v_opad bytea;
    o_chain text[];
    o_seq bigint[];
    o_event text[];
    o_env text[];
    o_at timestamptz[];
    o_rec text[];
    o_prev bytea[];
    o_hash bytea[];
BEGIN
    IF coalesce(cardinality(p_chain), 0) = 0 THEN
        RETURN;
    END IF;
    v_ipad := decode(current_setting('agentpost.mac_ipad', true), 'hex');
    v_opad := decode(current_setting('agentpost.mac_opad', true), 'hex');
    IF v_ipad IS NULL OR v_opad IS NULL OR v_ipad = '' THEN
        PERFORM agentpost._mac_pad('ipad');  -- raises the configuration error
    END IF;
    IF NOT p_locked THEN
        PERFORM agentpost._lock_chains(p_chain);
    END IF;
    FOR r IN
        SELECT u.c, u.e, u.v, u.b
          FROM unnest(p_chain, p_event, p_envelope, p_body) WITH ORDINALITY AS u(c, e, v, b, k)
         ORDER BY u.c, u.k
    LOOP
        IF cur IS DISTINCT FROM r.c THEN
            cur := r.c;
            SELECT t.chain_seq, t.hash, t.at INTO v_seq, v_hash, v_last
              FROM agentpost.trail t WHERE t.chain = r.c ORDER BY t.chain_seq DESC LIMIT 1;
            IF NOT FOUND THEN
                v_seq := 0;
                v_hash := decode(repeat('00', 32), 'hex');
                v_last := '-infinity';
            END IF;
            -- timestamps are monotonic within a chain even if the clock steps back
            v_at := greatest(v_now, v_last + interval '1 microsecond');
            v_at_us := (extract(epoch FROM v_at) * 1000000)::bigint;
        END IF;
        n := n + 1;
        v_seq := v_seq + 1;
        v_rec := jsonb_build_object('chain', r.c, 'seq', v_seq, 'event', r.e,
                                    'envelope_id', r.v, 'at_us', v_at_us, 'body', r.b)::text;
        o_prev[n] := v_hash;
        v_hash := sha256(v_hash || convert_to(v_rec, 'UTF8'));
        o_chain[n] := r.c;
        o_seq[n] := v_seq;
        o_event[n] := r.e;
        o_env[n] := r.v;
        o_at[n] := v_at;
        o_rec[n] := v_rec;
        o_hash[n] := v_hash;
    END LOOP;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT c, s, e, v, a, rec, p, h, sha256(v_opad || sha256(v_ipad || h))
      FROM unnest(o_chain, o_seq, o_event, o_env, o_at, o_rec, o_prev, o_hash)
           AS u(c, s, e, v, a, rec, p, h);
END $$;

-- (plpgsql rather than sql for helpers called from plpgsql: plpgsql caches its plans per
-- session, an SQL-language function called from plpgsql is planned again at every call)
CREATE FUNCTION agentpost._trail_one(p_chain text, p_event text, p_envelope text, p_body jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._trail_write(ARRAY[p_chain], ARRAY[p_event], ARRAY[p_envelope],
                                   ARRAY[p_body]);
END $$;
