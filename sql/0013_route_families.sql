-- Asya routes: a fan-out of a fan-out must not lose a branch (Asya §Fan-Out, "Fanout ID
-- semantics"; docs/asya.md, "Fan-out ids" and "Families").
--
-- The spec's `{id}-{index}` collides when one id fans out twice (child 0 keeps the id), and
-- route_step took such a child for the envelope of the same id: it replaced that envelope's
-- row (whose hop then could not be completed) or was dropped as a duplicate of its hop (its
-- payload lost, the step reporting success). The runtime now names the children of an id's
-- later fan-outs apart (agentpost.protocol.routes.fan_out_id); the store refuses a step that
-- would still collide, so an older client or a hop sent before this migration fails loudly
-- (Conflict, nothing recorded) instead of losing a branch.

-- In a step of leased hops, each reported row is a leased envelope moving on, or an envelope
-- not routed yet (a fan-out child), and no id comes twice. Anything else is refused (AP409):
-- the row of a routed envelope the step does not move would be taken over, or its hop's WACP
-- id reused. The stored rows are probed by primary key (see _route_record).
CREATE FUNCTION agentpost._route_fresh(p_ids text[], p_rows jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_moving text[];
    v_bad text;
BEGIN
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        PERFORM agentpost._fail('AP400', 'route rows must be a JSON array');
    END IF;
    SELECT x->>'id' INTO v_bad FROM jsonb_array_elements(p_rows) x
     GROUP BY x->>'id' HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope id %L is routed twice by one step', v_bad));
    END IF;
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    v_moving := ARRAY(SELECT e.meta->'asya'->>'id' FROM agentpost.envelopes e
                       WHERE e.id = ANY (p_ids));
    SELECT x->>'id' INTO v_bad FROM jsonb_array_elements(p_rows) x
     WHERE x->>'id' <> ALL (v_moving)
       AND (SELECT r.id FROM agentpost.routes r WHERE r.id = x->>'id') IS NOT NULL
     LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope id %L is already routed: a fan-out child needs an id of its own '
            '(a step moves only the envelopes it leased)', v_bad));
    END IF;
END $$;

-- route_step as sql/0009_routes.sql describes it (one or many hops of p_actor, all or
-- nothing), now with the rows of a step of leased hops checked by _route_fresh before
-- anything is recorded.
CREATE OR REPLACE PROCEDURE agentpost.route_step(
    p_actor text, p_ids text[], p_tokens uuid[], p_drafts jsonb, p_rows jsonb,
    p_start boolean, p_timeout_ms int, p_next int, p_ttl_ms int, p_holder text,
    INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_bad text;
    v_token uuid;
    v_reason text;
    v_recorded int;
    v_acked int := 0;
    v_sent int;
    v_recipients text[];
    v_fired int;
    v_leased jsonb := '[]';
BEGIN
    PERFORM agentpost._check_workspace(p_actor);
    PERFORM agentpost._lock_chain(p_actor);
    IF jsonb_typeof(p_drafts) IS DISTINCT FROM 'array' THEN
        PERFORM agentpost._fail('AP400', 'route drafts must be a JSON array');
    END IF;
    SELECT d.sender INTO v_bad FROM jsonb_to_recordset(p_drafts) AS d(sender text)
     WHERE d.sender IS DISTINCT FROM p_actor LIMIT 1;
    IF FOUND THEN
        PERFORM agentpost._fail('AP400', format(
            'a hop of %L cannot send as %L', p_actor, v_bad));
    END IF;
    SELECT u.id, u.tok INTO v_bad, v_token
      FROM unnest(coalesce(p_ids, '{}'), p_tokens) AS u(id, tok)
     WHERE NOT coalesce((SELECT e.recipient = p_actor
                                AND (SELECT r.envelope_id FROM agentpost.routes r
                                      WHERE r.id = e.meta->'asya'->>'id') = e.id
                           FROM agentpost.envelopes e WHERE e.id = u.id), false)
     LIMIT 1;
    IF FOUND THEN
        -- a lease that ran out while another runtime moved the envelope on is stale first
        IF NOT EXISTS (SELECT 1 FROM agentpost.envelopes e
                        WHERE e.id = v_bad AND e.lease_token = v_token
                          AND e.lease_until > clock_timestamp()) THEN
            PERFORM agentpost._stale(v_bad, v_token);
        END IF;
        PERFORM agentpost._fail('AP409', format(
            'envelope %L is not the current hop of a routed envelope held by %L',
            v_bad, p_actor));
    END IF;
    PERFORM agentpost._route_fresh(p_ids, p_rows);
    v_recorded := agentpost._route_record(p_actor, p_rows, p_start);
    IF jsonb_array_length(p_drafts) > 0 THEN
        SELECT min(a.envelope_id) FILTER (WHERE a.status = 'rejected'),
               min(a.reason) FILTER (WHERE a.status = 'rejected'),
               count(*) FILTER (WHERE a.status = 'validated' AND NOT a.duplicate),
               array_agg(DISTINCT a.recipient)
                   FILTER (WHERE a.status = 'validated' AND NOT a.duplicate)
          INTO v_bad, v_reason, v_sent, v_recipients
          FROM agentpost._accept(p_drafts, 'agent', NULL) a;
        IF v_bad IS NOT NULL THEN
            PERFORM agentpost._fail('AP409', format(
                'hop %L was refused (%s): nothing of the step was recorded', v_bad,
                v_reason));
        END IF;
    END IF;
    IF cardinality(p_ids) > 0 THEN
        v_acked := agentpost.ack(p_ids, p_tokens, true);
    END IF;
    -- Leasing on returns expired leases first, which locks their senders' chains while
    -- p_actor's is held: with expired leases waiting, leave them to a lease of their own
    -- (leased = null), so that a step only ever locks its actor's chain (no lock cycles
    -- between actors that send to each other). now() is this transaction's, as in lease().
    IF p_next > 0 THEN
        IF EXISTS (SELECT 1 FROM agentpost.envelopes e
                    WHERE e.recipient = p_actor AND e.lease_token IS NOT NULL
                      AND e.lease_until <= now()
                    ORDER BY e.lease_until LIMIT 1) THEN
            v_leased := NULL;
        ELSE
            SELECT coalesce(jsonb_agg(to_jsonb(l) - 'ordinality' ORDER BY l.ordinality), '[]')
              INTO v_leased
              FROM agentpost.route_lease(p_actor, p_next, p_ttl_ms, p_holder)
                   WITH ORDINALITY l;
        END IF;
    END IF;
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    IF EXISTS (SELECT 1 FROM agentpost.rule_outbox) THEN
        CALL agentpost._fire_outbox(p_timeout_ms, v_fired);
    END IF;
    p_result := jsonb_build_object('recorded', v_recorded, 'acked', v_acked,
                                   'sent', coalesce(v_sent, 0), 'leased', v_leased);
END $$;
