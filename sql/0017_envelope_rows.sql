-- The trail protects envelope rows (WACP §3, Integrity: the envelope carries an integrity
-- proof, and it is verified). Before, the trail's hashes covered the entries but not the rows
-- they describe: a row edited in the table (content replaced, consumed_at set back to NULL,
-- priority raised to blocking, originator changed, redeliveries reset) passed verify_trail().
--
-- Now every entry of an event that changes an envelope's row carries the row as it stands after
-- the change, under `row` in its signed body:
--   status, reason, delivered_at_us, consumed_at_us, redeliveries, leases  (what moves), and on
--   the entry that creates the row (envelope_created / envelope_rejected) also `fixed`: the
--   fields that never change after creation, in clear (sender, recipient, originator, type,
--   format, priority, origin, in_reply_to, seq, created_at_us) or as SHA-256 digests
--   (content_sha256; extras_sha256 over attachments, rights, tags, headers, meta, hops).
-- verify_trail() compares every row with its last such entry (what moves) and with its
-- creation entry (what is fixed), field by field (the `envelope_gaps` query). Bodies still
-- carry no payload: a digest of it only.
--
-- The state is added in one place, _trail_write, for the events in c_lifecycle; every writer
-- of those events changes the row (UPDATE, so under its lock) in the same transaction before
-- writing, so the snapshot is the state that transaction commits, and entries of one envelope
-- are in trail-id order of its changes. _submit_one writes its entry itself and so adds it too.

-- (STABLE as its body is: an SQL function declared with a stricter volatility than its body
-- is not inlined, and is then planned again in every transaction; see docs/design.md)
CREATE FUNCTION agentpost._us(p_at timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM p_at) * 1000000)::bigint;
$$;

-- An envelope row's signed state: what moves, and with p_fixed what never does.
CREATE FUNCTION agentpost._envelope_row(e agentpost.envelopes, p_fixed boolean) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
               'status', e.status, 'reason', e.reason,
               'delivered_at_us', agentpost._us(e.delivered_at),
               'consumed_at_us', agentpost._us(e.consumed_at),
               'redeliveries', e.redeliveries, 'leases', e.leases)
        || CASE WHEN p_fixed THEN jsonb_build_object('fixed', jsonb_build_object(
               'sender', e.sender, 'recipient', e.recipient, 'originator', e.originator,
               'type', e.type, 'format', e.format, 'priority', e.priority,
               'origin', e.origin, 'in_reply_to', e.in_reply_to, 'seq', e.seq,
               'created_at_us', agentpost._us(e.created_at),
               'content_sha256', encode(sha256(convert_to(e.content, 'UTF8')), 'hex'),
               'extras_sha256', encode(sha256(convert_to(jsonb_build_array(
                   e.attachments, e.rights, to_jsonb(e.tags), e.headers, e.meta, e.hops)::text,
                   'UTF8')), 'hex')))
           ELSE '{}'::jsonb END;
$$;

CREATE OR REPLACE FUNCTION agentpost._trail_write(p_chain text[], p_event text[], p_envelope text[],
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
    -- the events that change an envelope's row (in the transaction that writes them, under
    -- the row's lock), and of those, the ones that create it
    c_lifecycle constant text[] := ARRAY['envelope_created', 'envelope_rejected',
        'envelope_delivered', 'envelope_delivery_failed', 'envelope_undeliverable',
        'envelope_leased', 'lease_nacked', 'lease_expired', 'envelope_consumed'];
    c_birth constant text[] := ARRAY['envelope_created', 'envelope_rejected'];
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
    IF p_event && c_lifecycle THEN
        -- (a look-up per entry by primary key: a join would let a generic plan scan the table)
        SELECT array_agg(CASE WHEN x.ev = ANY (c_lifecycle)
                              THEN x.b || coalesce(
                                  (SELECT jsonb_build_object('row', agentpost._envelope_row(
                                              e, x.ev = ANY (c_birth)))
                                     FROM agentpost.envelopes e WHERE e.id = x.env), '{}')
                              ELSE x.b END ORDER BY x.k)
          INTO p_body
          FROM unnest(p_event, p_envelope, p_body) WITH ORDINALITY AS x(ev, env, b, k);
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

CREATE OR REPLACE FUNCTION agentpost._submit_one(p_sender text, p_recipient text, p_type text,
                                      p_format text, p_content text, p_attachments jsonb,
                                      p_in_reply_to text, p_priority text, p_keys text[])
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_orig text;
    v_head_seq bigint;
    v_head_hash bytea;
    v_last timestamptz;
    v_id text;
    v_ts timestamptz;
    v_at timestamptz;
    v_rec text;
    v_env agentpost.envelopes;
BEGIN
    PERFORM pg_advisory_xact_lock(agentpost._chain_key(p_sender));
    SELECT s.originator, l.chain_seq, l.hash, l.at
      INTO v_orig, v_head_seq, v_head_hash, v_last
      FROM agentpost.workspaces s
      JOIN agentpost.workspaces t ON t.id = p_recipient
      JOIN agentpost.envelope_types ty ON ty.name = p_type
      LEFT JOIN LATERAL (SELECT x.chain_seq, x.hash, x.at FROM agentpost.trail x
                          WHERE x.chain = p_sender ORDER BY x.chain_seq DESC LIMIT 1) l ON true
     WHERE s.id = p_sender AND s.state NOT IN ('closed', 'failed')
       AND t.state NOT IN ('integrating', 'closed', 'failed')
       AND (cardinality(ty.required_fields) = 0
            OR coalesce(ty.required_fields <@ p_keys, false))
       AND ((s.delegation AND t.parent = s.id AND p_type IN ('directive', 'feedback'))
            OR (t.delegation AND s.parent = t.id AND p_type = 'query')
            OR EXISTS (SELECT 1 FROM agentpost.permissions p
                        WHERE p.type = p_type AND p.sender_role = ANY (s.lineage)
                          AND p.receiver_role = ANY (t.lineage)))
       AND EXISTS (SELECT 1 FROM agentpost.port_rights pr
                    WHERE pr.holder = p_sender AND pr.target = p_recipient
                      AND pr.kind = 'send' AND pr.state = 'live');
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_id := gen_random_uuid()::text;
    v_ts := greatest(clock_timestamp(), v_last + interval '1 microsecond');
    INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format,
                                     content, attachments, in_reply_to, rights, priority,
                                     origin, status, created_at)
    VALUES (v_id, nextval('agentpost.envelope_seq'), p_sender, p_recipient, v_orig, p_type,
            p_format, p_content, p_attachments, p_in_reply_to, '[]', p_priority, 'agent',
            'validated', v_ts)
    RETURNING * INTO v_env;
    v_at := v_ts + interval '1 microsecond';
    v_rec := agentpost._record(p_sender, coalesce(v_head_seq, 0) + 1, 'envelope_created', v_id,
        v_at, jsonb_build_object(
            'envelope_id', v_id, 'from', p_sender, 'to', p_recipient, 'type', p_type,
            'priority', p_priority, 'in_reply_to', p_in_reply_to, 'originator', v_orig,
            'origin', 'agent', 'timestamp', v_ts,
            'row', agentpost._envelope_row(v_env, true)));
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT p_sender, coalesce(v_head_seq, 0) + 1, 'envelope_created', v_id, v_at, v_rec,
           coalesce(v_head_hash, decode(repeat('00', 32), 'hex')), h,
           agentpost._mac(h, decode(current_setting('agentpost.mac_ipad'), 'hex'),
                          decode(current_setting('agentpost.mac_opad'), 'hex'))
      FROM agentpost._link(v_head_hash, v_rec) AS h;
    RETURN v_id;
END $$;
