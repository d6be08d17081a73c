-- The tamper-evident trail. One hash chain per workspace (plus `system` for registry changes
-- and `human:<user>` for the human highway), so unrelated senders never wait on each other.
-- Each entry stores the canonical JSON `record` that was hashed:
--     hash = sha256(prev_hash || utf8(record)),  mac = HMAC-SHA256(key, hash)
-- The HMAC key never reaches the database: the client sets the key's inner and outer pads
-- (RFC 2104) as session settings agentpost.mac_ipad / agentpost.mac_opad.

CREATE TABLE agentpost.trail_heads (
    chain   text PRIMARY KEY,
    seq     bigint NOT NULL DEFAULT 0,
    hash    bytea NOT NULL DEFAULT decode(repeat('00', 32), 'hex'),
    last_at timestamptz NOT NULL DEFAULT '-infinity'
);

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

-- Lock a chain's head for this transaction, creating it on first use.
CREATE FUNCTION agentpost._lock_chain(p_chain text, OUT seq bigint, OUT hash bytea,
                                      OUT last_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT h.seq, h.hash, h.last_at INTO seq, hash, last_at
      FROM agentpost.trail_heads h WHERE h.chain = p_chain FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agentpost.trail_heads (chain) VALUES (p_chain) ON CONFLICT DO NOTHING;
        SELECT h.seq, h.hash, h.last_at INTO seq, hash, last_at
          FROM agentpost.trail_heads h WHERE h.chain = p_chain FOR UPDATE;
    END IF;
END $$;

-- Lock several chains in one sorted pass (every multi-chain lock goes through here, sorted,
-- so two transactions can never wait on each other in a cycle).
CREATE FUNCTION agentpost._lock_chains(p_chains text[]) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    c text;
    v_last timestamptz := '-infinity';
    v_at timestamptz;
BEGIN
    FOR c IN SELECT DISTINCT u FROM unnest(p_chains) u WHERE u IS NOT NULL ORDER BY u LOOP
        SELECT h.last_at INTO v_at FROM agentpost.trail_heads h WHERE h.chain = c FOR UPDATE;
        IF NOT FOUND THEN
            SELECT l.last_at INTO v_at FROM agentpost._lock_chain(c) l;
        END IF;
        v_last := greatest(v_last, v_at);
    END LOOP;
    RETURN v_last;
END $$;

-- Append entries, in the given order within each chain. Heads are locked in sorted chain
-- order (so concurrent writers never deadlock); hashes are computed in the loop, the rows go
-- in with one INSERT. Every chain written must have a head already (workspaces get one at
-- creation; _ensure_chains makes the others).
CREATE FUNCTION agentpost._trail_write(p_chain text[], p_event text[], p_envelope text[],
                                       p_body jsonb[]) RETURNS void
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
    h_chain text[];
    h_seq bigint[];
    h_hash bytea[];
    h_at timestamptz[];
    m int := 0;
BEGIN
    IF coalesce(cardinality(p_chain), 0) = 0 THEN
        RETURN;
    END IF;
    v_ipad := decode(current_setting('agentpost.mac_ipad', true), 'hex');
    v_opad := decode(current_setting('agentpost.mac_opad', true), 'hex');
    IF v_ipad IS NULL OR v_opad IS NULL OR v_ipad = '' THEN
        PERFORM agentpost._mac_pad('ipad');  -- raises the configuration error
    END IF;
    -- lock every head involved, sorted, in one statement
    SELECT array_agg(x.chain ORDER BY x.chain), array_agg(x.seq ORDER BY x.chain),
           array_agg(x.hash ORDER BY x.chain), array_agg(x.last_at ORDER BY x.chain)
      INTO h_chain, h_seq, h_hash, h_at
      FROM (SELECT h.chain, h.seq, h.hash, h.last_at FROM agentpost.trail_heads h
             WHERE h.chain = ANY (p_chain) ORDER BY h.chain FOR UPDATE) x;
    FOR r IN
        SELECT u.c, u.e, u.v, u.b
          FROM unnest(p_chain, p_event, p_envelope, p_body) WITH ORDINALITY AS u(c, e, v, b, k)
         ORDER BY u.c, u.k
    LOOP
        IF cur IS DISTINCT FROM r.c THEN
            IF cur IS NOT NULL THEN
                h_seq[m] := v_seq; h_hash[m] := v_hash; h_at[m] := v_at;
            END IF;
            m := m + 1;  -- heads and entries are both sorted by chain: walk them together
            IF h_chain[m] IS DISTINCT FROM r.c THEN
                PERFORM agentpost._fail('AP500', format('trail chain %L has no head', r.c));
            END IF;
            cur := r.c;
            v_seq := h_seq[m];
            v_hash := h_hash[m];
            -- timestamps are monotonic within a chain even if the clock steps back
            v_at := greatest(v_now, h_at[m] + interval '1 microsecond');
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
    h_seq[m] := v_seq; h_hash[m] := v_hash; h_at[m] := v_at;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT c, s, e, v, a, rec, p, h, sha256(v_opad || sha256(v_ipad || h))
      FROM unnest(o_chain, o_seq, o_event, o_env, o_at, o_rec, o_prev, o_hash)
           AS u(c, s, e, v, a, rec, p, h);
    UPDATE agentpost.trail_heads t SET seq = u.s, hash = u.h, last_at = u.a
      FROM unnest(h_chain[1:m], h_seq[1:m], h_hash[1:m], h_at[1:m]) AS u(c, s, h, a)
     WHERE t.chain = u.c;
END $$;

-- Create the heads of chains that are not workspaces (the human highway's, `system`).
CREATE FUNCTION agentpost._ensure_chains(p_chains text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agentpost.trail_heads (chain)
    SELECT DISTINCT c FROM unnest(p_chains) c ON CONFLICT DO NOTHING;
END $$;

INSERT INTO agentpost.trail_heads (chain) VALUES ('system');

-- (plpgsql rather than sql throughout: plpgsql caches its plans per session, an SQL-language
-- function called from plpgsql is planned again at every call)
CREATE FUNCTION agentpost._trail_one(p_chain text, p_event text, p_envelope text, p_body jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._trail_write(ARRAY[p_chain], ARRAY[p_event], ARRAY[p_envelope],
                                   ARRAY[p_body]);
END $$;
