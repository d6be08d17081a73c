-- Envelope ids in time order (issue 25: lease+ack in one inbox ran at 0.72x to 0.88x the empty
-- store's beside another inbox holding 330,000 waiting envelopes, 0.59x in an earlier run).
--
-- An envelope's id was a random UUID (version 4). Its row's primary key and the trail's
-- `trail_envelope` index take one entry per envelope and one per entry naming it, and a random
-- key lands on a random leaf page: once the indexes outgrow shared_buffers (a 330,000 envelope
-- backlog makes the trail about 870 MB here, against 128 MB of buffers), nearly every send,
-- lease and ack reads a leaf page back and dirties it, and the rate falls as history grows.
-- A version 7 UUID (RFC 9562) starts with the millisecond it was made, so new ids land on the
-- right-hand pages of both indexes, which stay in memory. Its other 74 bits stay random, so
-- ids are no easier to guess across milliseconds than before within one. Measured (a script,
-- not a timed test; one consumer, batches of 100, 2 cores): with the backlog, 0.97x and 0.98x
-- the empty store's rate, against 0.88x and 0.72x with random ids. Ids chosen by the caller
-- (idempotency keys, Courier §6.4) are kept as given.

CREATE FUNCTION agentpost.uuid7() RETURNS uuid
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    AS $$
DECLARE
    b bytea := uuid_send(gen_random_uuid());
BEGIN
    -- the first 48 bits: Unix time in milliseconds; then version 7; the rest stays random
    b := overlay(b PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp())
                                                    * 1000)::bigint) FROM 3)
                 FROM 1 FOR 6);
    b := set_byte(b, 6, (get_byte(b, 6) & 15) | 112);
    RETURN encode(b, 'hex')::uuid;
END $$;

-- The four places that name a new envelope, as they were but for its id.

CREATE OR REPLACE FUNCTION agentpost._accept(p_drafts jsonb, p_origin text, p_user text) RETURNS TABLE(idx integer, envelope_id text, status text, reason text, recipient text, duplicate boolean)
    LANGUAGE plpgsql
    AS $$
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
    v_dup_ids text[];
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
    -- Caller-chosen ids are idempotency keys (Courier §6.4): locked after the chains, in
    -- sorted order, so two racing sends of one id serialize; an id already stored makes its
    -- draft a duplicate that sends nothing. The same id on another channel is a conflict.
    PERFORM pg_advisory_xact_lock(x.k)
       FROM (SELECT DISTINCT hashtextextended('agentpost.id:' || d.envelope_id, 0) AS k
               FROM jsonb_to_recordset(p_drafts) AS d(envelope_id text)
              WHERE d.envelope_id IS NOT NULL ORDER BY 1) x;
    SELECT array_agg(e.id),
           min(e.id) FILTER (WHERE e.sender <> d.sender OR e.recipient <> d.recipient)
      INTO v_dup_ids, v_bad
      FROM jsonb_to_recordset(p_drafts) AS d(envelope_id text, sender text, recipient text)
      JOIN agentpost.envelopes e ON e.id = d.envelope_id;
    IF v_bad IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope id %L is already used by an envelope of another channel', v_bad));
    END IF;
    v_dup_ids := coalesce(v_dup_ids, '{}');

    -- timestamps are monotonic within each sender
    v_last := agentpost._chains_last_at(v_senders);
    v_last := greatest(clock_timestamp(), coalesce(v_last, '-infinity'));

    -- validate and insert in one statement; creation order follows draft order per sender
    WITH v AS (
        SELECT d.*, coalesce(d.envelope_id, agentpost.uuid7()::text) AS id,
               CASE WHEN p_origin = 'agent' THEN s.originator
                    ELSE coalesce(d.originator, p_user) END AS orig,
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
                        (s.delegation AND t.parent IS NOT DISTINCT FROM s.id AND d.type IN ('directive', 'feedback'))
                        OR (t.delegation AND s.parent IS NOT DISTINCT FROM t.id AND d.type = 'query')
                        OR EXISTS (SELECT 1 FROM agentpost.permissions p
                                    WHERE p.type = d.type AND p.sender_role = ANY (s.lineage)
                                      AND p.receiver_role = ANY (t.lineage)))
                       THEN 'permission_denied'
                   WHEN p_origin <> 'agent' AND jsonb_array_length(d.rights) > 0
                       THEN 'no_send_right'  -- a human or a rule holds no port rights
               END AS reason,
               p_origin = 'agent' AND (jsonb_array_length(d.rights) > 0 OR NOT EXISTS (
                   SELECT 1 FROM agentpost.port_rights pr
                    WHERE pr.holder = d.sender AND pr.target = d.recipient
                      AND pr.kind = 'send' AND pr.state = 'live')) AS slow
          FROM jsonb_to_recordset(p_drafts) AS d(
                   i int, sender text, recipient text, type text, format text, content text,
                   attachments jsonb, in_reply_to text, priority text, rights jsonb,
                   keys text[], malformed text, envelope_id text, tags text[], headers jsonb,
                   meta jsonb, hops int, originator text)
          LEFT JOIN agentpost.workspaces s ON s.id = d.sender
          LEFT JOIN agentpost.workspaces t ON t.id = d.recipient
          LEFT JOIN agentpost.envelope_types ty ON ty.name = d.type
         WHERE d.envelope_id IS NULL OR d.envelope_id <> ALL (v_dup_ids)
         ORDER BY d.sender, d.i
    ), numbered AS (
        SELECT v.*, nextval('agentpost.envelope_seq') AS seq,
               v_last + row_number() OVER () * interval '1 microsecond' AS ts
          FROM v
    ), ins AS (
        INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format,
                                         content, attachments, in_reply_to, rights, priority,
                                         origin, status, reason, created_at, tags, headers,
                                         meta, hops)
        SELECT n.id, n.seq, n.sender, n.recipient, n.orig, n.type, n.format,
               CASE WHEN n.reason IS NULL THEN n.content END,
               CASE WHEN n.reason IS NULL THEN n.attachments ELSE '[]' END,
               n.in_reply_to,
               CASE WHEN n.reason IS NULL THEN n.rights ELSE '[]' END,
               n.priority, p_origin,
               CASE WHEN n.reason IS NULL THEN 'validated' ELSE 'rejected' END,
               n.reason, n.ts, coalesce(n.tags, '{}'), coalesce(n.headers, '{}'),
               coalesce(n.meta, '{}'), coalesce(n.hops, 0)
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
    a_consumed := array_fill(NULL::text, ARRAY[coalesce(cardinality(a_id), 0)]);
    FOR k IN 1 .. coalesce(cardinality(a_id), 0) LOOP
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

    -- on-insert rules see every accepted envelope (their firings are sent after commit)
    PERFORM agentpost._match_rules(ARRAY(SELECT u.id FROM unnest(a_id, a_reason) AS u(id, reason)
                                          WHERE u.reason IS NULL));

    RETURN QUERY SELECT u.i, u.id, CASE WHEN u.reason IS NULL THEN 'validated' ELSE 'rejected' END,
                        u.reason, u.recipient, false
                   FROM unnest(a_i, a_id, a_reason, a_recipient) AS u(i, id, reason, recipient)
                  WHERE u.id IS NOT NULL
                 UNION ALL
                 SELECT d.i, e.id, e.status, e.reason, e.recipient, true
                   FROM jsonb_to_recordset(p_drafts) AS d(i int, envelope_id text)
                   JOIN agentpost.envelopes e ON e.id = d.envelope_id
                  WHERE d.envelope_id = ANY (v_dup_ids);
END $$;

CREATE OR REPLACE FUNCTION agentpost._accept_direct(p_drafts jsonb) RETURNS TABLE(idx integer, envelope_id text, status text, reason text, recipient text, duplicate boolean)
    LANGUAGE plpgsql
    AS $$
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
                            (s.delegation AND t.parent IS NOT DISTINCT FROM s.id
                             AND d.type IN ('directive', 'feedback'))
                            OR (t.delegation AND s.parent IS NOT DISTINCT FROM t.id AND d.type = 'query')
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
        SELECT u.*, agentpost.uuid7()::text AS id
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

CREATE OR REPLACE FUNCTION agentpost._send_direct_one(p_sender text, p_recipient text, p_type text, p_format text, p_content text, p_attachments jsonb, p_in_reply_to text, p_priority text, p_keys text[], p_meta jsonb DEFAULT '{}'::jsonb, OUT o_id text, OUT o_status text) RETURNS SETOF record
    LANGUAGE plpgsql
    AS $$
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
    VALUES (agentpost.uuid7()::text, nextval('agentpost.envelope_seq'), p_sender, p_recipient,
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

CREATE OR REPLACE FUNCTION agentpost._submit_one(p_sender text, p_recipient text, p_type text, p_format text, p_content text, p_attachments jsonb, p_in_reply_to text, p_priority text, p_keys text[]) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
    v_id := agentpost.uuid7()::text;
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
