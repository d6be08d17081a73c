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

-- The three pieces of an entry, as SQL expressions shared by every writer. They are declared
-- STABLE, as their bodies are (jsonb and encoding conversions depend on session settings):
-- an IMMUTABLE one would not be inlined, and a non-inlined SQL function called from plpgsql
-- is planned again in every transaction.
CREATE FUNCTION agentpost._record(p_chain text, p_seq bigint, p_event text, p_envelope text,
                                  p_at timestamptz, p_body jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('chain', p_chain, 'seq', p_seq, 'event', p_event,
                              'envelope_id', p_envelope,
                              'at_us', (extract(epoch FROM p_at) * 1000000)::bigint,
                              'body', p_body)::text;
$$;

CREATE FUNCTION agentpost._link(p_prev bytea, p_record text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(coalesce(p_prev, decode(repeat('00', 32), 'hex'))
                  || convert_to(p_record, 'UTF8'));
$$;

CREATE FUNCTION agentpost._mac(p_hash bytea, p_ipad bytea, p_opad bytea) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT sha256(p_opad || sha256(p_ipad || p_hash));
$$;

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
-- unless the caller already holds them; every chain's head (its last entry) is read in one
-- statement; the hashes are chained in a loop over the arrays; the rows go in with one INSERT.
CREATE FUNCTION agentpost._trail_write(p_chain text[], p_event text[], p_envelope text[],
                                       p_body jsonb[], p_locked boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(p_chain), 0);
    j int;
    v_now timestamptz := clock_timestamp();
    v_ipad bytea;
    v_opad bytea;
    h_chain text[];
    h_seq bigint[];
    h_hash bytea[];
    h_at timestamptz[];
    o_seq bigint[];
    o_at timestamptz[];
    o_rec text[];
    o_prev bytea[];
    o_hash bytea[];
BEGIN
    IF n = 0 THEN
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
    SELECT array_agg(d.c), array_agg(coalesce(l.chain_seq, 0)), array_agg(l.hash),
           -- timestamps are monotonic within a chain even if the clock steps back
           array_agg(greatest(v_now, l.at + interval '1 microsecond'))
      INTO h_chain, h_seq, h_hash, h_at
      FROM (SELECT DISTINCT c FROM unnest(p_chain) c) d
      LEFT JOIN LATERAL (SELECT t.chain_seq, t.hash, t.at FROM agentpost.trail t
                          WHERE t.chain = d.c ORDER BY t.chain_seq DESC LIMIT 1) l ON true;
    FOR i IN 1 .. n LOOP
        j := CASE WHEN h_chain[1] = p_chain[i] THEN 1
                  ELSE array_position(h_chain, p_chain[i]) END;
        h_seq[j] := h_seq[j] + 1;
        o_seq[i] := h_seq[j];
        o_at[i] := h_at[j];
        o_rec[i] := agentpost._record(p_chain[i], h_seq[j], p_event[i], p_envelope[i],
                                      h_at[j], p_body[i]);
        o_prev[i] := coalesce(h_hash[j], decode(repeat('00', 32), 'hex'));
        h_hash[j] := agentpost._link(h_hash[j], o_rec[i]);
        o_hash[i] := h_hash[j];
    END LOOP;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT c, s, e, v, a, rec, p, h, agentpost._mac(h, v_ipad, v_opad)
      FROM unnest(p_chain, o_seq, p_event, p_envelope, o_at, o_rec, o_prev, o_hash)
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
