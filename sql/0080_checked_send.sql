-- A send that writes nothing unless it is the common case (issue 24).
--
-- An agent's tool must not send what the store would reject: a rejection is recorded on the
-- trail (WACP §9), and a language model's mistaken call is an answer to the model, not an
-- event of the fleet. The tool therefore asked `send_options` first and sent second: two
-- round trips for every call, the first of them repeating checks the send makes again.
-- send_checked makes the send's own checks once. When the draft is the common case that
-- _send_direct_one takes (a live send right, a permission-matrix row or a delegation edge, the
-- type's required fields present, a sender that is not terminal, a receiver that takes
-- envelopes, no enabled rules) it is sent exactly as send_one sends it; otherwise the call
-- returns NULL having written nothing, and the caller decides the case the long way (the
-- seat's routes, then `send`, which records what it rejects). A NULL is never a refusal by
-- itself: a send_once right or an enabled rule also take the long way.
--
-- _send_direct_one gains the envelope's meta (Courier §4.1: the tool call and the run that
-- made it), which the common case used to drop; the old signature goes, the default keeps
-- send_one's call as it was.

DROP FUNCTION agentpost._send_direct_one(text, text, text, text, text, jsonb, text, text,
                                         text[]);

CREATE FUNCTION agentpost._send_direct_one(p_sender text, p_recipient text, p_type text,
                                           p_format text, p_content text, p_attachments jsonb,
                                           p_in_reply_to text, p_priority text, p_keys text[],
                                           p_meta jsonb DEFAULT '{}',
                                           OUT o_id text, OUT o_status text)
RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE
    v_orig text;
    s_seq bigint; s_hash bytea; s_at timestamptz;
    r_seq bigint; r_hash bytea; r_at timestamptz;
    v_open boolean := false;
    v_env agentpost.envelopes;
    v_ts timestamptz;
    v_at timestamptz[];
    v_rec text[];
    v_hash bytea[];
    v_prev bytea[];
    v_ipad bytea := decode(current_setting('agentpost.mac_ipad', true), 'hex');
    v_opad bytea := decode(current_setting('agentpost.mac_opad', true), 'hex');
BEGIN
    IF v_ipad IS NULL OR v_opad IS NULL OR v_ipad = '' THEN
        PERFORM agentpost._mac_pad('ipad');  -- raises the configuration error
    END IF;
    PERFORM pg_advisory_xact_lock(agentpost._chain_key(p_sender));
    SELECT s.originator, l.chain_seq, l.hash, l.at
      INTO v_orig, s_seq, s_hash, s_at
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
        RETURN;
    END IF;
    IF p_recipient <> p_sender
       AND pg_try_advisory_xact_lock(agentpost._chain_key(p_recipient)) THEN
        SELECT true, l.chain_seq, l.hash, l.at INTO v_open, r_seq, r_hash, r_at
          FROM agentpost.workspaces w
          LEFT JOIN LATERAL (SELECT x.chain_seq, x.hash, x.at FROM agentpost.trail x
                              WHERE x.chain = p_recipient
                              ORDER BY x.chain_seq DESC LIMIT 1) l ON true
         WHERE w.id = p_recipient AND w.state IN ('idle', 'active', 'blocked')
           AND NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                            WHERE e.recipient = p_recipient AND e.status = 'validated')
           AND NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                            WHERE e.recipient = p_recipient AND e.status = 'acknowledged'
                              AND e.consumed_at IS NULL AND e.rank = 0);
        v_open := coalesce(v_open, false);
    END IF;
    v_ts := greatest(clock_timestamp(), s_at + interval '1 microsecond');
    -- entry times: creation after the row's timestamp, delivery after creation and after
    -- the receiver's last entry
    v_at[1] := v_ts + interval '1 microsecond';
    v_at[2] := greatest(v_at[1], r_at) + interval '1 microsecond';
    v_at[3] := v_at[2] + interval '1 microsecond';
    INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format,
                                     content, attachments, in_reply_to, rights, priority,
                                     origin, status, created_at, delivered_at, attempts, meta)
    VALUES (gen_random_uuid()::text, nextval('agentpost.envelope_seq'), p_sender, p_recipient,
            v_orig, p_type, p_format, p_content, p_attachments, p_in_reply_to, '[]',
            p_priority, 'agent', CASE WHEN v_open THEN 'acknowledged' ELSE 'validated' END,
            v_ts, CASE WHEN v_open THEN v_at[2] END, CASE WHEN v_open THEN 1 ELSE 0 END,
            coalesce(p_meta, '{}'))
    RETURNING * INTO v_env;
    o_id := v_env.id;
    o_status := v_env.status;
    v_rec[1] := agentpost._record(p_sender, coalesce(s_seq, 0) + 1, 'envelope_created', o_id,
        v_at[1], jsonb_build_object(
            'envelope_id', o_id, 'from', p_sender, 'to', p_recipient, 'type', p_type,
            'priority', p_priority, 'in_reply_to', p_in_reply_to, 'originator', v_orig,
            'origin', 'agent', 'timestamp', v_ts,
            -- the row as its creation left it (before the delivery below, if any)
            'row', agentpost._envelope_row(v_env, true)
                   || jsonb_build_object('status', 'validated', 'delivered_at_us', NULL)));
    v_prev[1] := coalesce(s_hash, decode(repeat('00', 32), 'hex'));
    v_hash[1] := agentpost._link(s_hash, v_rec[1]);
    IF v_open THEN
        v_rec[2] := agentpost._record(p_recipient, coalesce(r_seq, 0) + 1,
            'envelope_delivered', o_id, v_at[2], jsonb_build_object(
                'envelope_id', o_id, 'from', p_sender, 'to', p_recipient,
                'delivered_at', v_env.delivered_at, 'attempt', 1,
                'row', agentpost._envelope_row(v_env, false)));
        v_prev[2] := coalesce(r_hash, decode(repeat('00', 32), 'hex'));
        v_hash[2] := agentpost._link(r_hash, v_rec[2]);
        v_rec[3] := agentpost._record(p_recipient, coalesce(r_seq, 0) + 2, 'signal_emitted',
            o_id, v_at[3], jsonb_build_object('signal', 'acknowledged', 'ref', o_id,
                                              'to', p_sender));
        v_prev[3] := v_hash[2];
        v_hash[3] := agentpost._link(v_hash[2], v_rec[3]);
        INSERT INTO agentpost.signals (workspace_id, signal, ref, emitted_by, at)
        VALUES (p_sender, 'acknowledged', o_id, p_recipient, v_env.delivered_at);
        -- the live wake-up the delivery trigger sends for an UPDATE to acknowledged
        PERFORM pg_notify('agentpost_inbox', p_recipient);
    END IF;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT u.c, u.s, u.e, o_id, u.a, u.r, u.p, u.h, agentpost._mac(u.h, v_ipad, v_opad)
      FROM unnest(ARRAY[p_sender, p_recipient, p_recipient],
                  ARRAY[coalesce(s_seq, 0) + 1, coalesce(r_seq, 0) + 1, coalesce(r_seq, 0) + 2],
                  ARRAY['envelope_created', 'envelope_delivered', 'signal_emitted'],
                  v_at, v_rec, v_prev, v_hash) AS u(c, s, e, a, r, p, h)
     WHERE u.h IS NOT NULL;
    RETURN NEXT;
END $$;


CREATE PROCEDURE agentpost.send_checked(p_sender text, p_recipient text, p_type text,
                                        p_format text, p_content text, p_attachments jsonb,
                                        p_in_reply_to text, p_priority text, p_keys text[],
                                        p_meta jsonb, p_timeout_ms int,
                                        INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
    v_status text;
BEGIN
    IF EXISTS (SELECT 1 FROM agentpost.rules WHERE enabled) THEN
        RETURN;  -- rules fire on a send: the long way
    END IF;
    SELECT s.o_id, s.o_status INTO v_id, v_status
      FROM agentpost._send_direct_one(p_sender, p_recipient, p_type, p_format, p_content,
                                      p_attachments, p_in_reply_to, p_priority, p_keys,
                                      p_meta) s;
    IF v_id IS NULL THEN
        RETURN;  -- not the common case: nothing written
    END IF;
    IF v_status <> 'acknowledged' THEN
        COMMIT;  -- queued: durable first, delivered after (WACP §7)
        CALL agentpost._deliver_to(p_recipient, p_timeout_ms);
        SELECT e.status INTO v_status FROM agentpost.envelopes e WHERE e.id = v_id;
    END IF;
    p_result := jsonb_build_object('envelope_id', v_id, 'status', v_status,
                                   'reason', NULL, 'duplicate', false);
END $$;
