-- Direct delivery: one durable commit per send (issue "Flat cost as the store grows").
--
-- Before, every send was two transactions (phase 1 committed synchronously, phase 2
-- asynchronously) and wrote its envelope row twice: inserted `validated` (entering the
-- pending queue index), then updated to `acknowledged`. Now, when the receiver can take the
-- envelope at once, phase 1 and phase 2 are one transaction and the row is inserted already
-- delivered:
--   - the receiver's chain is taken with pg_try_advisory_xact_lock while the senders' chains
--     are held; a try never waits, so the ascending lock order that rules out cycles is not
--     needed for it. When the lock is busy, or the receiver is not idle/active/blocked, or
--     something already waits in its queue, or its blocking gate is shut, the envelope takes
--     the two-phase path as before (queued, committed, then drained).
--   - WACP §6 still holds: the envelope is validated before anything is written, and its
--     `envelope_created` entry is written before (lower trail id, earlier time) its
--     `envelope_delivered` entry, in the same transaction: no delivery is ever visible without
--     its creation entry, and a send that fails before its commit leaves nothing and returns
--     an error to its caller (nothing is dropped silently).
--   - Every event is still its own entry, hash-chained and signed: envelope_created (sender's
--     chain), envelope_delivered and the acknowledgment's signal_emitted (receiver's chain).
--     Each lifecycle entry signs the row as its event left it (sql/0017): the creation entry
--     signs status `validated` with no delivered_at (the row between the two events), the
--     delivery entry the row as committed.
--   - The live wake-up of the delivery trigger (an UPDATE to acknowledged) is sent with
--     pg_notify directly, since no UPDATE happens.
-- A batch is set-based: one INSERT for its envelope rows, one for its signals, one for its
-- trail entries (_trail_append).

-- Append complete trail entries, in the given order within each chain. Like _trail_write, but
-- the caller holds every chain's lock and gives each body whole (a lifecycle entry's `row`
-- included), so nothing is looked up again; and times strictly increase along the call, so
-- an envelope's delivery entry is later than its creation entry even when they go to
-- different chains in one transaction.
CREATE FUNCTION agentpost._trail_append(p_chain text[], p_event text[], p_envelope text[],
                                        p_body jsonb[], p_floor timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(p_chain), 0);
    j int;
    v_at timestamptz := greatest(clock_timestamp(), p_floor);
    v_ipad bytea := decode(current_setting('agentpost.mac_ipad', true), 'hex');
    v_opad bytea := decode(current_setting('agentpost.mac_opad', true), 'hex');
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
    IF v_ipad IS NULL OR v_opad IS NULL OR v_ipad = '' THEN
        PERFORM agentpost._mac_pad('ipad');  -- raises the configuration error
    END IF;
    SELECT array_agg(d.c), array_agg(coalesce(l.chain_seq, 0)), array_agg(l.hash),
           array_agg(l.at + interval '1 microsecond')
      INTO h_chain, h_seq, h_hash, h_at
      FROM (SELECT DISTINCT c FROM unnest(p_chain) c) d
      LEFT JOIN LATERAL (SELECT t.chain_seq, t.hash, t.at FROM agentpost.trail t
                          WHERE t.chain = d.c ORDER BY t.chain_seq DESC LIMIT 1) l ON true;
    FOR i IN 1 .. n LOOP
        j := CASE WHEN h_chain[1] = p_chain[i] THEN 1
                  ELSE array_position(h_chain, p_chain[i]) END;
        h_seq[j] := h_seq[j] + 1;
        v_at := greatest(v_at, h_at[j]);
        o_seq[i] := h_seq[j];
        o_at[i] := v_at;
        o_rec[i] := agentpost._record(p_chain[i], h_seq[j], p_event[i], p_envelope[i], v_at,
                                      p_body[i]);
        o_prev[i] := coalesce(h_hash[j], decode(repeat('00', 32), 'hex'));
        h_hash[j] := agentpost._link(h_hash[j], o_rec[i]);
        o_hash[i] := h_hash[j];
        v_at := v_at + interval '1 microsecond';
    END LOOP;
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT c, s, e, v, a, rec, p, h, agentpost._mac(h, v_ipad, v_opad)
      FROM unnest(p_chain, o_seq, p_event, p_envelope, o_at, o_rec, o_prev, o_hash)
           AS u(c, s, e, v, a, rec, p, h);
END $$;

-- The senders of a batch: locked (sorted), and, for agents, all existing and none terminal
-- (there is nobody to record a rejection against otherwise). The same errors as _accept.
CREATE FUNCTION agentpost._lock_senders(p_drafts jsonb, p_origin text) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_senders text[];
    v_found int;
    v_bad text;
    v_terminal text;
BEGIN
    v_senders := ARRAY(SELECT DISTINCT d.sender
                         FROM jsonb_to_recordset(p_drafts) AS d(sender text) ORDER BY 1);
    PERFORM agentpost._lock_chains(v_senders);
    IF p_origin <> 'agent' THEN
        RETURN v_senders;
    END IF;
    SELECT count(w.id), min(w.id) FILTER (WHERE w.state IN ('closed', 'failed'))
      INTO v_found, v_terminal
      FROM unnest(v_senders) u JOIN agentpost.workspaces w ON w.id = u;
    IF v_found < cardinality(v_senders) THEN
        SELECT u INTO v_bad FROM unnest(v_senders) u
         WHERE NOT EXISTS (SELECT 1 FROM agentpost.workspaces w WHERE w.id = u) LIMIT 1;
        PERFORM agentpost._fail('AP404', format('unknown sender workspace %L', v_bad));
    END IF;
    IF v_terminal IS NOT NULL THEN
        PERFORM agentpost._fail('AP409',
            format('workspace %L is in a terminal state and cannot send', v_terminal));
    END IF;
    RETURN v_senders;
END $$;

-- The receivers that can take envelopes in this transaction: their chain locked now without
-- waiting, in a delivering state, nothing queued for them (so channel order needs no
-- draining first), and no blocking envelope waiting to be consumed. (Two statements: the
-- state is read after the locks are held.)
CREATE FUNCTION agentpost._open_receivers(p_receivers text[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_locked text[];
BEGIN
    v_locked := ARRAY(SELECT r FROM unnest(p_receivers) r
                       WHERE r IS NOT NULL
                         AND pg_try_advisory_xact_lock(agentpost._chain_key(r)));
    RETURN ARRAY(
        SELECT w.id FROM unnest(v_locked) r JOIN agentpost.workspaces w ON w.id = r
         WHERE w.state IN ('idle', 'active', 'blocked')
           AND NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                            WHERE e.recipient = r AND e.status = 'validated')
           AND NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                            WHERE e.recipient = r AND e.status = 'acknowledged'
                              AND e.consumed_at IS NULL AND e.rank = 0));
END $$;

-- Phase 1 and, where the receiver is open, phase 2 of an agents' batch, set-based. Takes
-- the batches _accept would take through its set-based path only: no caller-chosen ids, no
-- rights carried, every accepted draft covered by a live send right. For any other batch it
-- returns no rows having written nothing (the caller then uses _accept; the senders' chains
-- stay locked, which _accept takes again at no cost). Validation is _accept's, in its order.
-- Within the batch, envelopes to an open receiver are delivered up to and including its
-- first blocking one; the rest of that receiver's queue waits behind the gate, as _drain
-- would leave it.
CREATE FUNCTION agentpost._accept_direct(p_drafts jsonb)
RETURNS TABLE (idx int, envelope_id text, status text, reason text, recipient text,
              duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last timestamptz;
    v_slow boolean;
    v_open text[];
    v_floor timestamptz;
    v_notify text[];
    a_i int[]; a_sender text[]; a_recipient text[]; a_type text[]; a_format text[];
    a_content text[]; a_att jsonb[]; a_reply text[]; a_prio text[]; a_tags jsonb[];
    a_headers jsonb[]; a_meta jsonb[]; a_orig text[]; a_reason text[];
    r_i int[]; r_id text[]; r_status text[]; r_reason text[]; r_recipient text[];
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    v_last := agentpost._chains_last_at(agentpost._lock_senders(p_drafts, 'agent'));
    v_last := greatest(clock_timestamp(), coalesce(v_last, '-infinity'));

    -- validate (writes nothing): _accept's reasons, in its order (sorted once, aggregated
    -- in that order)
    SELECT bool_or(x.slow), array_agg(x.i), array_agg(x.sender), array_agg(x.recipient),
           array_agg(x.type), array_agg(x.format), array_agg(x.content),
           array_agg(x.attachments), array_agg(x.in_reply_to), array_agg(x.priority),
           array_agg(x.tags), array_agg(x.headers), array_agg(x.meta), array_agg(x.orig),
           array_agg(x.reason)
      INTO v_slow, a_i, a_sender, a_recipient, a_type, a_format, a_content, a_att, a_reply,
           a_prio, a_tags, a_headers, a_meta, a_orig, a_reason
      FROM (SELECT d.i, d.sender, d.recipient, d.type, d.format, d.content, d.attachments,
                   d.in_reply_to, d.priority, d.tags, d.headers, d.meta,
                   s.originator AS orig, v.reason,
                   d.envelope_id IS NOT NULL OR jsonb_array_length(d.rights) > 0
                   OR (v.reason IS NULL AND NOT EXISTS (
                       SELECT 1 FROM agentpost.port_rights pr
                        WHERE pr.holder = d.sender AND pr.target = d.recipient
                          AND pr.kind = 'send' AND pr.state = 'live')) AS slow
              FROM jsonb_to_recordset(p_drafts) AS d(
                       i int, sender text, recipient text, type text, format text,
                       content text, attachments jsonb, in_reply_to text, priority text,
                       rights jsonb, keys text[], malformed text, envelope_id text, tags jsonb,
                       headers jsonb, meta jsonb)
              LEFT JOIN agentpost.workspaces s ON s.id = d.sender
              LEFT JOIN agentpost.workspaces t ON t.id = d.recipient
              LEFT JOIN agentpost.envelope_types ty ON ty.name = d.type
             CROSS JOIN LATERAL (SELECT CASE
                       WHEN d.malformed IS NOT NULL THEN 'invalid_structure'
                       WHEN ty.name IS NULL THEN 'invalid_type'
                       WHEN t.id IS NULL THEN 'target_not_found'
                       WHEN t.state IN ('integrating', 'closed', 'failed')
                           THEN 'target_terminal'
                       WHEN cardinality(ty.required_fields) > 0
                            AND NOT coalesce(ty.required_fields <@ d.keys, false)
                           THEN 'invalid_structure'
                       WHEN NOT (
                            (s.delegation AND t.parent = s.id
                             AND d.type IN ('directive', 'feedback'))
                            OR (t.delegation AND s.parent = t.id AND d.type = 'query')
                            OR EXISTS (SELECT 1 FROM agentpost.permissions p
                                        WHERE p.type = d.type
                                          AND p.sender_role = ANY (s.lineage)
                                          AND p.receiver_role = ANY (t.lineage)))
                           THEN 'permission_denied'
                   END AS reason) v
             ORDER BY d.sender, d.i) x;
    IF v_slow OR a_i IS NULL THEN
        RETURN;
    END IF;
    v_open := agentpost._open_receivers(ARRAY(
        SELECT DISTINCT u.r FROM unnest(a_recipient, a_reason) AS u(r, why)
         WHERE u.why IS NULL ORDER BY 1));

    -- the rows (delivered, queued or rejected), their signals, and their trail entries in
    -- creation order: created or rejected (+ the notification) in the sender's chain,
    -- delivered and acknowledged in the receiver's
    WITH v AS (
        SELECT u.*, gen_random_uuid()::text AS id
          FROM unnest(a_i, a_sender, a_recipient, a_type, a_format, a_content, a_att, a_reply,
                      a_prio, a_tags, a_headers, a_meta, a_orig, a_reason)
               WITH ORDINALITY AS u(i, sender, recipient, type, format, content, att, reply,
                                    prio, tags, headers, meta, orig, reason, k)
    ), numbered AS (
        SELECT v.*, nextval('agentpost.envelope_seq') AS seq,
               v_last + v.k * interval '1 microsecond' AS ts
          FROM v ORDER BY v.k
    ), flagged AS (
        SELECT n.*, n.reason IS NULL AND n.recipient = ANY (v_open) AND NOT coalesce(
                   bool_or(n.reason IS NULL AND n.prio = 'blocking')
                       OVER (PARTITION BY n.recipient ORDER BY n.seq
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS direct
          FROM numbered n
    ), ins AS (
        INSERT INTO agentpost.envelopes AS e (id, seq, sender, recipient, originator, type,
                                              format, content, attachments, in_reply_to, rights,
                                              priority, origin, status, reason, created_at,
                                              delivered_at, attempts, tags, headers, meta)
        SELECT f.id, f.seq, f.sender, f.recipient, f.orig, f.type, f.format,
               CASE WHEN f.reason IS NULL THEN f.content END,
               CASE WHEN f.reason IS NULL THEN f.att ELSE '[]' END,
               f.reply, '[]', f.prio, 'agent',
               CASE WHEN f.reason IS NOT NULL THEN 'rejected'
                    WHEN f.direct THEN 'acknowledged' ELSE 'validated' END,
               f.reason, f.ts,
               CASE WHEN f.direct THEN greatest(clock_timestamp(),
                                                f.ts + interval '1 microsecond') END,
               CASE WHEN f.direct THEN 1 ELSE 0 END,
               CASE WHEN coalesce(jsonb_array_length(f.tags), 0) = 0 THEN '{}'::text[]
                    ELSE ARRAY(SELECT jsonb_array_elements_text(f.tags)) END,
               coalesce(f.headers, '{}'), coalesce(f.meta, '{}')
          FROM flagged f ORDER BY f.seq
        -- (plain columns: a whole-row value would be taken apart again at every field used)
        RETURNING e.id, e.seq, e.sender, e.recipient, e.type, e.priority, e.in_reply_to,
                  e.originator, e.created_at, e.delivered_at, e.status, e.reason,
                  agentpost._envelope_row(e, true) AS rw
    ), sig AS (
        INSERT INTO agentpost.signals (workspace_id, signal, ref, reason, emitted_by, at)
        SELECT x.sender, CASE WHEN x.status = 'rejected' THEN 'rejected' ELSE 'acknowledged' END,
               x.id, x.reason,
               CASE WHEN x.status = 'rejected' THEN 'runtime' ELSE x.recipient END,
               coalesce(x.delivered_at, x.created_at)
          FROM ins x WHERE x.status IN ('rejected', 'acknowledged')
         ORDER BY x.seq
    ), entries AS (
        SELECT x.seq, j,
               CASE WHEN j = 1 OR x.status = 'rejected' THEN x.sender
                    ELSE x.recipient END AS chain,
               CASE WHEN j = 1 AND x.status = 'rejected' THEN 'envelope_rejected'
                    WHEN j = 1 THEN 'envelope_created'
                    WHEN j = 2 AND x.status = 'acknowledged' THEN 'envelope_delivered'
                    ELSE 'signal_emitted' END AS event,
               x.id AS env,
               CASE
                   WHEN j = 1 AND x.status = 'rejected' THEN jsonb_build_object(
                       'envelope_id', x.id, 'from', x.sender, 'to', x.recipient,
                       'type', x.type, 'reason', x.reason, 'timestamp', x.created_at,
                       'row', x.rw)
                   WHEN j = 1 THEN jsonb_build_object(
                       'envelope_id', x.id, 'from', x.sender, 'to', x.recipient,
                       'type', x.type, 'priority', x.priority, 'in_reply_to', x.in_reply_to,
                       'originator', x.originator, 'origin', 'agent',
                       'timestamp', x.created_at,
                       -- the row as its creation left it, before its delivery below
                       'row', x.rw || jsonb_build_object('status', 'validated',
                                                         'delivered_at_us', NULL))
                   WHEN x.status = 'rejected' THEN jsonb_build_object(
                       'signal', 'rejected', 'ref', x.id, 'to', x.sender, 'reason', x.reason)
                   WHEN j = 2 THEN jsonb_build_object(
                       'envelope_id', x.id, 'from', x.sender, 'to', x.recipient,
                       'delivered_at', x.delivered_at, 'attempt', 1, 'row', x.rw - 'fixed')
                   ELSE jsonb_build_object('signal', 'acknowledged', 'ref', x.id,
                                           'to', x.sender)
               END AS body
          FROM ins x
         CROSS JOIN generate_series(1, 3) AS j
         WHERE j = 1 OR (x.status = 'rejected' AND j = 2) OR x.status = 'acknowledged'
    )
    SELECT array_agg(en.chain ORDER BY en.seq, en.j), array_agg(en.event ORDER BY en.seq, en.j),
           array_agg(en.env ORDER BY en.seq, en.j), array_agg(en.body ORDER BY en.seq, en.j),
           (SELECT max(f.ts) FROM flagged f) + interval '1 microsecond',
           (SELECT array_agg(DISTINCT f.recipient) FILTER (WHERE f.direct) FROM flagged f),
           (SELECT array_agg(f.i ORDER BY f.seq) FROM flagged f),
           (SELECT array_agg(f.id ORDER BY f.seq) FROM flagged f),
           (SELECT array_agg(CASE WHEN f.reason IS NOT NULL THEN 'rejected'
                                  WHEN f.direct THEN 'acknowledged' ELSE 'validated' END
                             ORDER BY f.seq) FROM flagged f),
           (SELECT array_agg(f.reason ORDER BY f.seq) FROM flagged f),
           (SELECT array_agg(f.recipient ORDER BY f.seq) FROM flagged f)
      INTO t_chain, t_event, t_env, t_body, v_floor, v_notify, r_i, r_id, r_status, r_reason,
           r_recipient
      FROM entries en;
    PERFORM agentpost._trail_append(t_chain, t_event, t_env, t_body, v_floor);
    -- the live wake-up the delivery trigger sends for an UPDATE to acknowledged
    PERFORM pg_notify('agentpost_inbox', r) FROM unnest(v_notify) r;
    RETURN QUERY SELECT u.i, u.id, u.st, u.why, u.r, false
                   FROM unnest(r_i, r_id, r_status, r_reason, r_recipient) AS u(i, id, st, why, r);
END $$;

-- The send path: phase 1, and phase 2 in the same transaction for open receivers (one
-- durable commit); what had to queue is delivered after the commit as before.
CREATE OR REPLACE PROCEDURE agentpost.send(p_drafts jsonb, p_origin text, p_user text,
                                           p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_dups boolean[];
    v_recipients text[];
    v_direct jsonb;
    v_fired int;
BEGIN
    IF p_origin = 'agent' AND NOT EXISTS (SELECT 1 FROM agentpost.rules WHERE enabled) THEN
        SELECT array_agg(s.envelope_id ORDER BY s.idx), array_agg(false),
               array_agg(DISTINCT s.recipient) FILTER (WHERE s.status = 'validated'),
               jsonb_agg(jsonb_build_object('envelope_id', s.envelope_id, 'status', s.status,
                                            'reason', s.reason, 'duplicate', false)
                         ORDER BY s.idx)
          INTO v_ids, v_dups, v_recipients, v_direct
          FROM agentpost._accept_direct(p_drafts) s;
        IF v_ids IS NOT NULL AND v_recipients IS NULL THEN
            p_result := v_direct;  -- everything delivered or rejected: committed by CALL
            RETURN;
        END IF;
    END IF;
    IF v_ids IS NULL THEN
        SELECT array_agg(s.envelope_id ORDER BY s.idx), array_agg(s.duplicate ORDER BY s.idx),
               array_agg(DISTINCT s.recipient) FILTER (WHERE s.status = 'validated')
          INTO v_ids, v_dups, v_recipients
          FROM agentpost._accept(p_drafts, p_origin, p_user) s;
    END IF;
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    IF EXISTS (SELECT 1 FROM agentpost.rule_outbox) THEN
        CALL agentpost._fire_outbox(p_timeout_ms, v_fired);
    END IF;
    p_result := agentpost._results(v_ids, v_dups);
END $$;

-- The common single send (an agent's well-formed draft to a target it holds a send right to,
-- carrying no rights), with scalar parameters and plain statements: _submit_one's checks,
-- then, when the receiver is open (see _open_receivers; never the sender itself, whose chain
-- would need both entries in order), the row inserted delivered with its three entries and
-- the acknowledgment; else the row queued with its creation entry. Returns the id and status,
-- or no row when the draft is not this common case (the caller uses _accept, which decides
-- every reason).
CREATE FUNCTION agentpost._send_direct_one(p_sender text, p_recipient text, p_type text,
                                           p_format text, p_content text, p_attachments jsonb,
                                           p_in_reply_to text, p_priority text, p_keys text[],
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
                                     origin, status, created_at, delivered_at, attempts)
    VALUES (gen_random_uuid()::text, nextval('agentpost.envelope_seq'), p_sender, p_recipient,
            v_orig, p_type, p_format, p_content, p_attachments, p_in_reply_to, '[]',
            p_priority, 'agent', CASE WHEN v_open THEN 'acknowledged' ELSE 'validated' END,
            v_ts, CASE WHEN v_open THEN v_at[2] END, CASE WHEN v_open THEN 1 ELSE 0 END)
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

-- The send path for one well-formed draft (the Python layer checked its structure): the
-- same, with scalar parameters.
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
        SELECT s.o_id, s.o_status INTO v_id, v_status
          FROM agentpost._send_direct_one(p_sender, p_recipient, p_type, p_format, p_content,
                                          p_attachments, p_in_reply_to, p_priority, p_keys) s;
        IF v_status = 'acknowledged' THEN
            p_result := jsonb_build_object('envelope_id', v_id, 'status', v_status,
                                           'reason', NULL, 'duplicate', false);
            RETURN;  -- one transaction, committed by CALL
        END IF;
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
