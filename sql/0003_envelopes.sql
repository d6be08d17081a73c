-- Envelopes, signals, and the two phases of a send (WACP §4–§7).
--
-- Phase 1 (_submit) validates and records `envelope_created` (or `envelope_rejected`) in the
-- sender's chain and commits durably. Phase 2 (_drain) places validated envelopes in the
-- receiver's inbox in creation order and, in the same transaction, emits the `acknowledged`
-- signal; its entries go to the receiver's chain. A crash between the phases leaves envelopes
-- in status `validated`; recover() completes them. Every phase locks chains in sorted order.

CREATE SEQUENCE agentpost.envelope_seq;

CREATE TABLE agentpost.envelopes (
    id              text PRIMARY KEY,
    seq             bigint NOT NULL,
    sender          text NOT NULL,
    recipient       text NOT NULL,
    originator      text NOT NULL,
    type            text NOT NULL,
    format          text NOT NULL,
    content         text,
    attachments     jsonb NOT NULL DEFAULT '[]',
    in_reply_to     text,
    rights          jsonb NOT NULL DEFAULT '[]',
    priority        text NOT NULL CHECK (priority IN ('normal', 'urgent', 'blocking')),
    rank            smallint GENERATED ALWAYS AS (
                        CASE priority WHEN 'blocking' THEN 0 WHEN 'urgent' THEN 1 ELSE 2 END
                    ) STORED,
    origin          text NOT NULL CHECK (origin IN ('agent', 'human')),
    status          text NOT NULL CHECK (status IN (
                        'validated', 'acknowledged', 'rejected', 'undeliverable')),
    reason          text,
    created_at      timestamptz NOT NULL,
    delivered_at    timestamptz,
    consumed_at     timestamptz,
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz
);

-- Every envelope passes through `validated` and leaves it, so the pending index below is a
-- queue index: vacuum it often, or its dead entries slow down every delivery.
ALTER TABLE agentpost.envelopes SET (autovacuum_vacuum_scale_factor = 0.01,
                                     autovacuum_vacuum_threshold = 1000,
                                     autovacuum_analyze_scale_factor = 0.05);

-- the inbox in processing order: blocking, urgent, normal; creation order within a level
CREATE INDEX envelopes_inbox ON agentpost.envelopes (recipient, rank, seq)
    WHERE status = 'acknowledged' AND consumed_at IS NULL;
-- validated but not yet delivered (queued, backing off, or cut off by a crash)
CREATE INDEX envelopes_pending ON agentpost.envelopes (recipient, seq)
    WHERE status = 'validated';

-- Signals the runtime emits to workspaces: acknowledged (ref = envelope id), failed,
-- rejected (the sender's notification of a rejection).
CREATE TABLE agentpost.signals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id text NOT NULL,
    signal       text NOT NULL,
    ref          text,
    reason       text,
    emitted_by   text,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX signals_workspace ON agentpost.signals (workspace_id, id);

-- Phase 1: validate drafts (structure, then permission, then send right; the first failure is
-- the reason) and record them. Senders' chains stay locked until commit, so creation order is
-- commit order per sender, and so per channel. Set-based: a batch costs a handful of
-- statements; only drafts that must spend a send-once right or carry rights take a per-draft
-- path.
CREATE FUNCTION agentpost._submit(p_drafts jsonb, p_origin text, p_user text)
RETURNS TABLE (idx int, envelope_id text, status text, reason text, recipient text)
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
    -- timestamps are monotonic within each sender
    v_last := agentpost._chains_last_at(v_senders);
    v_last := greatest(clock_timestamp(), coalesce(v_last, '-infinity'));

    -- validate and insert in one statement; creation order follows draft order per sender
    WITH v AS (
        SELECT d.*, gen_random_uuid()::text AS id,
               CASE WHEN p_origin = 'human' THEN p_user ELSE s.originator END AS orig,
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
                   WHEN p_origin = 'human' AND jsonb_array_length(d.rights) > 0
                       THEN 'no_send_right'  -- a human holds no port rights to transfer
               END AS reason,
               p_origin = 'agent' AND (jsonb_array_length(d.rights) > 0 OR NOT EXISTS (
                   SELECT 1 FROM agentpost.port_rights pr
                    WHERE pr.holder = d.sender AND pr.target = d.recipient
                      AND pr.kind = 'send' AND pr.state = 'live')) AS slow
          FROM jsonb_to_recordset(p_drafts) AS d(
                   i int, sender text, recipient text, type text, format text, content text,
                   attachments jsonb, in_reply_to text, priority text, rights jsonb,
                   keys text[], malformed text)
          LEFT JOIN agentpost.workspaces s ON s.id = d.sender
          LEFT JOIN agentpost.workspaces t ON t.id = d.recipient
          LEFT JOIN agentpost.envelope_types ty ON ty.name = d.type
         ORDER BY d.sender, d.i
    ), numbered AS (
        SELECT v.*, nextval('agentpost.envelope_seq') AS seq,
               v_last + row_number() OVER () * interval '1 microsecond' AS ts
          FROM v
    ), ins AS (
        INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format,
                                         content, attachments, in_reply_to, rights, priority,
                                         origin, status, reason, created_at)
        SELECT n.id, n.seq, n.sender, n.recipient, n.orig, n.type, n.format,
               CASE WHEN n.reason IS NULL THEN n.content END,
               CASE WHEN n.reason IS NULL THEN n.attachments ELSE '[]' END,
               n.in_reply_to,
               CASE WHEN n.reason IS NULL THEN n.rights ELSE '[]' END,
               n.priority, p_origin,
               CASE WHEN n.reason IS NULL THEN 'validated' ELSE 'rejected' END,
               n.reason, n.ts
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
    a_consumed := array_fill(NULL::text, ARRAY[cardinality(a_id)]);
    FOR k IN 1 .. cardinality(a_id) LOOP
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

    RETURN QUERY SELECT u.i, u.id, CASE WHEN u.reason IS NULL THEN 'validated' ELSE 'rejected' END,
                        u.reason, u.recipient
                   FROM unnest(a_i, a_id, a_reason, a_recipient) AS u(i, id, reason, recipient);
END $$;

-- Phase 1 for the common case of one draft, in four statements: an agent's well-formed
-- envelope to a target it holds a send right to, carrying no rights. Returns NULL when the
-- draft is anything else; the caller then uses _submit, which decides every reason. (The
-- conditions below are _submit's acceptance conditions; test_fast_path.py holds the two
-- paths to the same outcomes.)
CREATE FUNCTION agentpost._submit_one(p_sender text, p_recipient text, p_type text,
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
            'validated', v_ts);
    v_at := v_ts + interval '1 microsecond';
    v_rec := agentpost._record(p_sender, coalesce(v_head_seq, 0) + 1, 'envelope_created', v_id,
        v_at, jsonb_build_object(
            'envelope_id', v_id, 'from', p_sender, 'to', p_recipient, 'type', p_type,
            'priority', p_priority, 'in_reply_to', p_in_reply_to, 'originator', v_orig,
            'origin', 'agent', 'timestamp', v_ts));
    INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                 hash, mac)
    SELECT p_sender, coalesce(v_head_seq, 0) + 1, 'envelope_created', v_id, v_at, v_rec,
           coalesce(v_head_hash, decode(repeat('00', 32), 'hex')), h,
           agentpost._mac(h, decode(current_setting('agentpost.mac_ipad'), 'hex'),
                          decode(current_setting('agentpost.mac_opad'), 'hex'))
      FROM agentpost._link(v_head_hash, v_rec) AS h;
    RETURN v_id;
END $$;

-- Phase 2: deliver a workspace's validated envelopes in creation order, each delivery and its
-- acknowledged signal in one step. Stops at the first envelope still backing off, and after
-- a blocking envelope (the gate stays shut until it is consumed).
-- Returns the number delivered, or -1 when the receiver is sealed and envelopes still wait for
-- it (a send validated just before the receiver was sealed): see _sweep_sealed.
CREATE FUNCTION agentpost._drain(p_ws text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_gated boolean;
    v_any boolean;
    v_ids text[];
    v_n int;
    r record;
    tr record;
    v_right text;
    v_with_rights text[];
    t_chain text[] := '{}'; t_event text[] := '{}'; t_env text[] := '{}';
    t_body jsonb[] := '{}';
BEGIN
    PERFORM agentpost._lock_chain(p_ws);
    -- In one look: the receiver's state, the blocking gate (a delivered blocking envelope not
    -- yet consumed), and its queue in creation order, in one pass over the pending index (a
    -- queue index is full of dead entries between vacuums, so it is walked once): what is
    -- deliverable is the prefix before the first envelope still backing off, up to and
    -- including the first blocking one.
    SELECT w.state,
           EXISTS (SELECT 1 FROM agentpost.envelopes e
                    WHERE e.recipient = p_ws AND e.status = 'acknowledged'
                      AND e.consumed_at IS NULL AND e.rank = 0),
           q.any, q.ids
      INTO v_state, v_gated, v_any, v_ids
      FROM agentpost.workspaces w,
           LATERAL (SELECT count(*) > 0 AS any,
                           array_agg(x.id ORDER BY x.seq)
                               FILTER (WHERE NOT x.waiting AND NOT x.behind_blocking) AS ids
                      FROM (SELECT e.id, e.seq,
                                   bool_or(coalesce(e.next_attempt_at > now(), false))
                                       OVER (ORDER BY e.seq ROWS UNBOUNDED PRECEDING) AS waiting,
                                   coalesce(bool_or(e.rank = 0)
                                       OVER (ORDER BY e.seq
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                       false) AS behind_blocking
                              FROM agentpost.envelopes e
                             WHERE e.recipient = p_ws AND e.status = 'validated') x) q
     WHERE w.id = p_ws;
    IF NOT coalesce(v_any, false) THEN
        RETURN 0;
    END IF;
    IF v_state IN ('integrating', 'closed', 'failed') THEN
        -- sealed: what still waits for it must be recorded undeliverable, which needs the
        -- senders' chains; the caller does that after committing (see _deliver_to)
        RETURN -1;
    END IF;
    IF v_ids IS NULL OR v_state IS NULL OR v_state NOT IN ('idle', 'active', 'blocked')
       OR v_gated THEN
        RETURN 0;
    END IF;

    WITH d AS (
        UPDATE agentpost.envelopes e
           SET status = 'acknowledged', delivered_at = clock_timestamp(),
               attempts = e.attempts + 1, next_attempt_at = NULL
         WHERE e.id = ANY (v_ids) AND e.status = 'validated'
        RETURNING e.id, e.seq, e.sender, e.delivered_at, e.attempts,
                  e.rights <> '[]' AS has_rights
    ), s AS (
        INSERT INTO agentpost.signals (workspace_id, signal, ref, emitted_by, at)
        SELECT d.sender, 'acknowledged', d.id, p_ws, d.delivered_at FROM d
    )
    SELECT count(*), array_agg(p_ws), array_agg(x.event), array_agg(x.id), array_agg(x.body),
           array_agg(x.id) FILTER (WHERE x.j = 1 AND x.has_rights)
      INTO v_n, t_chain, t_event, t_env, t_body, v_with_rights
      FROM (SELECT d.id, d.has_rights, j,
                   CASE j WHEN 1 THEN 'envelope_delivered' ELSE 'signal_emitted' END AS event,
                   CASE j
                       WHEN 1 THEN jsonb_build_object(
                           'envelope_id', d.id, 'from', d.sender, 'to', p_ws,
                           'delivered_at', d.delivered_at, 'attempt', d.attempts)
                       ELSE jsonb_build_object('signal', 'acknowledged', 'ref', d.id,
                                               'to', d.sender)
                   END AS body
              FROM d CROSS JOIN generate_series(1, 2) AS j
             ORDER BY d.seq, j) x;
    v_n := v_n / 2;
    IF v_n = 0 THEN
        RETURN 0;
    END IF;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    IF v_with_rights IS NULL THEN
        RETURN v_n;
    END IF;

    -- port rights carried by the delivered envelopes pass to the receiver
    t_chain := '{}'; t_event := '{}'; t_env := '{}'; t_body := '{}';
    FOR r IN SELECT e.id, e.sender, e.rights FROM agentpost.envelopes e
              WHERE e.id = ANY (v_with_rights) ORDER BY e.seq
    LOOP
        FOR tr IN SELECT x.type AS kind, x.target
                    FROM jsonb_to_recordset(r.rights) AS x(type text, target text)
        LOOP
            IF tr.kind = 'send' THEN
                INSERT INTO agentpost.port_rights (holder, target, kind, created_by,
                                                   via_envelope)
                VALUES (p_ws, tr.target, 'send', r.sender, r.id)
                RETURNING id INTO v_right;
            ELSE
                UPDATE agentpost.port_rights pr SET holder = p_ws, state = 'live'
                 WHERE pr.id = (SELECT x.id FROM agentpost.port_rights x
                                 WHERE x.via_envelope = r.id AND x.state = 'in_transit'
                                   AND x.target = tr.target ORDER BY x.id LIMIT 1)
                RETURNING pr.id INTO v_right;
            END IF;
            t_chain := t_chain || p_ws;
            t_event := t_event || 'port_right_transferred'::text;
            t_env := t_env || r.id;
            t_body := t_body || jsonb_build_object(
                'right_id', v_right, 'right_type', tr.kind, 'from_holder', r.sender,
                'to_holder', p_ws, 'target', tr.target, 'via_envelope', r.id);
        END LOOP;
    END LOOP;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body);
    RETURN v_n;
END $$;

-- Record envelopes as undeliverable (sealed target, or redelivery exhausted): the entry and
-- the sender's `failed` signal go to the sender's chain. Only still-validated envelopes change.
CREATE FUNCTION agentpost._undeliver(p_ids text[], p_reason text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    PERFORM agentpost._lock_chains(ARRAY(
        SELECT e.sender FROM agentpost.envelopes e WHERE e.id = ANY (p_ids)));
    WITH u AS (
        UPDATE agentpost.envelopes e
           SET status = 'undeliverable',
               reason = coalesce(p_reason, (SELECT 'target_' || w.state
                                              FROM agentpost.workspaces w
                                             WHERE w.id = e.recipient))
         WHERE e.id = ANY (p_ids) AND e.status = 'validated'
        RETURNING e.id, e.seq, e.sender, e.recipient, e.reason
    ), s AS (
        INSERT INTO agentpost.signals (workspace_id, signal, ref, reason, emitted_by)
        SELECT u.sender, 'failed', u.id, u.reason, 'runtime' FROM u
    ), l AS (
        UPDATE agentpost.port_rights pr SET state = 'lost', ended_at = clock_timestamp()
          FROM u WHERE pr.via_envelope = u.id AND pr.state = 'in_transit'
    )
    SELECT count(*),
           array_agg(u.sender ORDER BY u.seq, j),
           array_agg(CASE j WHEN 1 THEN 'envelope_undeliverable' ELSE 'signal_emitted' END
                     ORDER BY u.seq, j),
           array_agg(u.id ORDER BY u.seq, j),
           array_agg(CASE j
                         WHEN 1 THEN jsonb_build_object(
                             'envelope_id', u.id, 'from', u.sender, 'to', u.recipient,
                             'reason', u.reason, 'timestamp', clock_timestamp())
                         ELSE jsonb_build_object('signal', 'failed', 'ref', u.id,
                                                 'to', u.sender, 'reason', u.reason)
                     END ORDER BY u.seq, j)
      INTO v_n, t_chain, t_event, t_env, t_body
      FROM u CROSS JOIN generate_series(1, 2) AS j;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body);
    RETURN v_n / 2;
END $$;

-- A delivery attempt to p_ws failed (it could not complete within the acknowledgment
-- timeout): count the attempt on each due envelope, back off attempt × base, and after the
-- fourth attempt (three redeliveries) record the envelope undeliverable.
CREATE FUNCTION agentpost._delivery_failed(p_ws text, p_base_ms int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_exhausted text[];
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    WITH f AS (
        UPDATE agentpost.envelopes e
           SET attempts = e.attempts + 1,
               next_attempt_at = now() + (e.attempts + 1) * p_base_ms
                                         * interval '1 millisecond'
         WHERE e.recipient = p_ws AND e.status = 'validated'
           AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
        RETURNING e.id, e.seq, e.sender, e.recipient, e.attempts, e.next_attempt_at
    )
    SELECT array_agg(f.id) FILTER (WHERE f.attempts >= 4),
           array_agg(f.sender ORDER BY f.seq),
           array_agg('envelope_delivery_failed'::text ORDER BY f.seq),
           array_agg(f.id ORDER BY f.seq),
           array_agg(jsonb_build_object('envelope_id', f.id, 'from', f.sender,
                                        'to', f.recipient, 'attempt', f.attempts,
                                        'next_attempt_at',
                                        CASE WHEN f.attempts < 4 THEN f.next_attempt_at END)
                     ORDER BY f.seq)
      INTO v_exhausted, t_chain, t_event, t_env, t_body
      FROM f;
    PERFORM agentpost._lock_chains(t_chain);
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body);
    IF v_exhausted IS NOT NULL THEN
        RETURN agentpost._undeliver(v_exhausted, 'delivery_exhausted');
    END IF;
    RETURN 0;
END $$;

-- Everything still waiting for a sealed workspace becomes undeliverable (reason
-- target_<state>). Run without other chain locks held: it locks the senders' chains.
CREATE FUNCTION agentpost._sweep_sealed(p_ws text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_pending text[];
BEGIN
    SELECT array_agg(e.id) INTO v_pending
      FROM agentpost.envelopes e JOIN agentpost.workspaces w ON w.id = e.recipient
     WHERE e.recipient = p_ws AND e.status = 'validated'
       AND w.state IN ('integrating', 'closed', 'failed');
    IF v_pending IS NULL THEN
        RETURN 0;
    END IF;
    RETURN agentpost._undeliver(v_pending, NULL);
END $$;

-- Phase 2 for one receiver, in a transaction of its own with asynchronous commit (the trail
-- entries of phase 1 are already durable, and recover() redoes a lost delivery). A delivery
-- that cannot complete within the acknowledgment timeout counts as a failed attempt; a
-- receiver found sealed gets what waits for it recorded undeliverable.
CREATE PROCEDURE agentpost._deliver_to(p_ws text, p_timeout_ms int)
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true),
            set_config('lock_timeout', coalesce(p_timeout_ms, 0)::text, true);
    BEGIN
        v_n := agentpost._drain(p_ws);
    EXCEPTION WHEN lock_not_available OR query_canceled OR deadlock_detected
                   OR serialization_failure THEN
        v_n := NULL;
    END;
    COMMIT;
    IF v_n IS NULL THEN
        PERFORM agentpost._delivery_failed(p_ws, coalesce(p_timeout_ms, 1000));
        COMMIT;
    ELSIF v_n < 0 THEN
        PERFORM agentpost._sweep_sealed(p_ws);
        COMMIT;
    END IF;
END $$;

-- Phase 2 for many receivers, in sorted order.
CREATE PROCEDURE agentpost._deliver_all(p_recipients text[], p_timeout_ms int)
LANGUAGE plpgsql AS $$
DECLARE
    v_r text;
BEGIN
    FOR v_r IN SELECT DISTINCT u FROM unnest(p_recipients) u WHERE u IS NOT NULL ORDER BY 1
    LOOP
        CALL agentpost._deliver_to(v_r, p_timeout_ms);
    END LOOP;
END $$;

CREATE FUNCTION agentpost._results(p_ids text[]) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object('envelope_id', e.id,
                                                         'status', e.status,
                                                         'reason', e.reason)
                                      ORDER BY u.k), '[]')
              FROM unnest(p_ids) WITH ORDINALITY AS u(id, k)
              JOIN agentpost.envelopes e ON e.id = u.id);
END $$;

-- The send path: one call, two phases. The result lists, in draft order, each envelope's id,
-- status (acknowledged, validated = queued or retrying, rejected) and reason.
CREATE PROCEDURE agentpost.send(p_drafts jsonb, p_origin text, p_user text, p_timeout_ms int,
                                INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_recipients text[];
BEGIN
    SELECT array_agg(s.envelope_id ORDER BY s.idx),
           array_agg(DISTINCT s.recipient) FILTER (WHERE s.status = 'validated')
      INTO v_ids, v_recipients
      FROM agentpost._submit(p_drafts, p_origin, p_user) s;
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    p_result := agentpost._results(v_ids);
END $$;

-- The send path for one well-formed draft (the Python layer checked its structure): the
-- four-statement phase 1 when it applies, else the general one; then delivery.
CREATE PROCEDURE agentpost.send_one(p_sender text, p_recipient text, p_type text,
                                    p_format text, p_content text, p_attachments jsonb,
                                    p_in_reply_to text, p_priority text, p_keys text[],
                                    p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_id text;
    v_status text;
    v_reason text;
BEGIN
    v_id := agentpost._submit_one(p_sender, p_recipient, p_type, p_format, p_content,
                                  p_attachments, p_in_reply_to, p_priority, p_keys);
    IF v_id IS NULL THEN
        SELECT s.envelope_id, s.status INTO v_id, v_status
          FROM agentpost._submit(jsonb_build_array(jsonb_build_object(
                   'i', 0, 'sender', p_sender, 'recipient', p_recipient, 'type', p_type,
                   'format', p_format, 'content', p_content, 'attachments', p_attachments,
                   'in_reply_to', p_in_reply_to, 'priority', p_priority, 'rights', '[]'::jsonb,
                   'keys', p_keys)), 'agent', NULL) s;
    END IF;
    COMMIT;
    IF v_status IS DISTINCT FROM 'rejected' THEN
        CALL agentpost._deliver_to(p_recipient, p_timeout_ms);
    END IF;
    SELECT e.status, e.reason INTO v_status, v_reason FROM agentpost.envelopes e
     WHERE e.id = v_id;
    p_result := jsonb_build_object('envelope_id', v_id, 'status', v_status,
                                   'reason', v_reason);
END $$;

-- Deliver one envelope again (a transport retry). A duplicate of a delivered envelope is
-- suppressed: recorded as envelope_redelivered, no second delivery, no second acknowledgment.
CREATE FUNCTION agentpost.deliver_again(p_id text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    SELECT x.status, x.sender, x.recipient INTO e FROM agentpost.envelopes x WHERE x.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    IF e.status = 'acknowledged' THEN
        PERFORM agentpost._trail_one(e.recipient, 'envelope_redelivered', p_id,
            jsonb_build_object('envelope_id', p_id, 'from', e.sender, 'to', e.recipient,
                               'timestamp', clock_timestamp()));
        RETURN 'duplicate';
    ELSIF e.status = 'validated' THEN
        PERFORM agentpost._drain(e.recipient);
        RETURN (SELECT x.status FROM agentpost.envelopes x WHERE x.id = p_id);
    END IF;
    RETURN e.status;
END $$;

-- Acknowledgment-timeout redelivery: retry every recipient with due envelopes.
CREATE PROCEDURE agentpost.redeliver(p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_recipients text[];
    v_before bigint;
BEGIN
    SELECT array_agg(DISTINCT e.recipient) INTO v_recipients
      FROM agentpost.envelopes e JOIN agentpost.workspaces w ON w.id = e.recipient
     WHERE e.status = 'validated'
       AND (w.state IN ('integrating', 'closed', 'failed')
            OR (w.state IN ('idle', 'active', 'blocked')
                AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())));
    SELECT count(*) INTO v_before FROM agentpost.envelopes e WHERE e.status = 'validated';
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    p_result := jsonb_build_object(
        'recipients', coalesce(cardinality(v_recipients), 0),
        'pending_before', v_before,
        'pending_after', (SELECT count(*) FROM agentpost.envelopes e
                           WHERE e.status = 'validated'));
END $$;

-- Recovery after a crash (WACP §7.2): every validated-but-undelivered envelope is delivered
-- in channel order, or recorded undeliverable when its target is now sealed. Delivery of
-- older envelopes happens before any new delivery to that workspace, because every delivery
-- drains the inbox queue in creation order.
CREATE PROCEDURE agentpost.recover(INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_sealed text[];
    v_recipients text[];
    v_undelivered int := 0;
    v_delivered int := 0;
    v_r text;
BEGIN
    SELECT array_agg(e.id) INTO v_sealed
      FROM agentpost.envelopes e JOIN agentpost.workspaces w ON w.id = e.recipient
     WHERE e.status = 'validated' AND w.state IN ('integrating', 'closed', 'failed');
    IF v_sealed IS NOT NULL THEN
        v_undelivered := agentpost._undeliver(v_sealed, NULL);
        COMMIT;
    END IF;
    -- a restart forgets backoff timers: everything waiting is tried now, attempts kept
    UPDATE agentpost.envelopes e SET next_attempt_at = NULL
     WHERE e.status = 'validated' AND e.next_attempt_at IS NOT NULL;
    SELECT array_agg(DISTINCT e.recipient ORDER BY e.recipient) INTO v_recipients
      FROM agentpost.envelopes e WHERE e.status = 'validated';
    FOREACH v_r IN ARRAY coalesce(v_recipients, '{}') LOOP
        v_delivered := v_delivered + greatest(agentpost._drain(v_r), 0);
        COMMIT;
    END LOOP;
    p_result := jsonb_build_object('delivered', v_delivered, 'undeliverable', v_undelivered,
                                   'still_queued', (SELECT count(*) FROM agentpost.envelopes e
                                                     WHERE e.status = 'validated'));
END $$;
