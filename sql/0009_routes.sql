-- Asya actor routes (the Asya envelope routing spec): where each routed envelope
-- stands, queryable cheaply, and every change of it recorded in the trail; a hop (an actor
-- handling one envelope) committed as one transaction.
--
-- What an actor's result does is pure Python (agentpost.protocol.routes); the hops travel as
-- ordinary WACP envelopes between actor workspaces (agentpost.store.routes). This table is
-- the status view: one row per Asya envelope id (a fan-out child 0 keeps its parent's id and
-- so its row), updated in place as the envelope moves. Status and progress are generated
-- columns computed by the same rules as agentpost.protocol.routes.status / progress, so they
-- cannot drift from the route. `envelope_id` names the WACP envelope that carries the row's
-- current hop: a lease on any other envelope is not a hop of the route (a stale copy, or a
-- forged `meta.asya`) and is refused.

CREATE TABLE agentpost.routes (
    id          text        PRIMARY KEY,
    -- the id of the envelope that started the route: a fan-out family shares it
    root_id     text        NOT NULL,
    parent_id   text,
    actors      text[]      NOT NULL CHECK (cardinality(actors) > 0),
    current     int         NOT NULL CHECK (current >= 0),
    end_actor   text        CHECK (end_actor IN ('happy-end', 'error-end')),
    phase       text        CHECK (phase IN ('queued', 'received', 'processing', 'completed')),
    -- the WACP envelope that carries the current hop, and the actor error that ended it
    envelope_id text        NOT NULL,
    error       jsonb,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    status      text        GENERATED ALWAYS AS (
        CASE WHEN end_actor = 'happy-end' THEN 'succeeded'
             WHEN end_actor = 'error-end' THEN 'failed'
             WHEN current > 0 OR phase IN ('received', 'processing', 'completed')
                  THEN 'running'
             WHEN phase = 'queued' THEN 'pending'
             ELSE 'unknown' END) STORED,
    progress    double precision GENERATED ALWAYS AS (
        CASE WHEN end_actor = 'happy-end' THEN 1.0
             ELSE (current + CASE WHEN phase = 'completed' AND end_actor IS NULL
                                  THEN 1 ELSE 0 END)::double precision
                  / cardinality(actors) END) STORED,
    CHECK (current <= cardinality(actors)),
    CHECK (current < cardinality(actors) OR end_actor = 'happy-end')
);
-- a family in id order: route_family's query, exactly
CREATE INDEX routes_family ON agentpost.routes (root_id, id);
-- the envelopes still under way, by their current hop: the timeout sweep walks only these
CREATE INDEX routes_open ON agentpost.routes (envelope_id) WHERE end_actor IS NULL;

-- The body of a `route_progress` trail entry: the row as the runtime sees it afterwards.
CREATE FUNCTION agentpost._route_body(r agentpost.routes, p_ws text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('id', r.id, 'root_id', r.root_id, 'parent_id', r.parent_id,
                              'actors', r.actors, 'current', r.current, 'end', r.end_actor,
                              'phase', r.phase, 'status', r.status, 'progress', r.progress,
                              'error', r.error, 'reported_by', p_ws);
END $$;

-- Record route rows as actor p_ws reports them; the caller holds p_ws's chain. Each element
-- of p_rows is {id, parent_id, actors, current, end, phase, envelope_id, error}.
-- Rows are inserted or replaced (a row keeps its root_id; a new row takes its parent's root,
-- or is its own root when the parent is not routed). Refused (AP409, nothing recorded): moving
-- a row that already ended (end actors never advance), and a row whose parent differs from
-- the stored one (an id collision: a fan-out child named like an envelope routed on its own).
-- A row behind the stored index is stale (a re-run of a hop that moved on) and dropped.
-- With p_start (rows a gateway starts): a parent_id naming a routed envelope is refused (only
-- the runtime makes children of routed envelopes), and an id already routed is refused
-- unless the row is the same start again, which is skipped (a retried start).
-- Each recorded row writes a `route_progress` entry to p_ws's chain. Returns the count.
-- (The stored rows are looked up by scalar subqueries, one primary-key probe per reported
-- row: a join against a JSON array is planned as a hash join over the whole table.)
CREATE FUNCTION agentpost._route_record(p_ws text, p_rows jsonb, p_start boolean)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_ended text; v_collision text; v_routed_parent text; v_parent text; v_taken text;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
    v_n int;
BEGIN
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        PERFORM agentpost._fail('AP400', 'route rows must be a JSON array');
    END IF;
    WITH x AS (
        SELECT x, (SELECT r FROM agentpost.routes r WHERE r.id = x->>'id') AS old,
               (SELECT p.id FROM agentpost.routes p WHERE p.id = x->>'parent_id') AS parent
          FROM jsonb_array_elements(p_rows) x
    )
    SELECT min(x->>'id') FILTER (WHERE (old).end_actor IS NOT NULL),
           min(x->>'id') FILTER (WHERE (old).id IS NOT NULL
                                   AND (old).parent_id IS DISTINCT FROM x->>'parent_id'),
           min(x->>'id') FILTER (WHERE parent IS NOT NULL),
           min(parent) FILTER (WHERE parent IS NOT NULL),
           min(x->>'id') FILTER (WHERE (old).id IS NOT NULL AND NOT (
               (old).end_actor IS NULL AND (old).envelope_id = x->>'envelope_id'
               AND (old).actors = ARRAY(SELECT jsonb_array_elements_text(x->'actors'))))
      INTO v_ended, v_collision, v_routed_parent, v_parent, v_taken
      FROM x;
    IF p_start AND v_routed_parent IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %L names the routed envelope %L as its parent: only the runtime '
            'creates the children of a routed envelope', v_routed_parent, v_parent));
    END IF;
    IF p_start AND v_taken IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format('envelope %L is already routed', v_taken));
    END IF;
    IF v_ended IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'route %L already ended: end actors never advance', v_ended));
    END IF;
    IF v_collision IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope id %L is already routed under another parent', v_collision));
    END IF;
    IF p_start THEN  -- what is left routed already is the same start again: skipped
        p_rows := (SELECT coalesce(jsonb_agg(x), '[]') FROM jsonb_array_elements(p_rows) x
                    WHERE (SELECT r.id FROM agentpost.routes r WHERE r.id = x->>'id') IS NULL);
    END IF;
    WITH x AS (
        SELECT x->>'id' AS id,
               coalesce((SELECT p.root_id FROM agentpost.routes p
                          WHERE p.id = x->>'parent_id'), x->>'id') AS root_id,
               x->>'parent_id' AS parent_id,
               ARRAY(SELECT jsonb_array_elements_text(x->'actors')) AS actors,
               (x->>'current')::int AS current, x->>'end' AS end_actor,
               x->>'phase' AS phase, x->>'envelope_id' AS envelope_id,
               CASE WHEN jsonb_typeof(x->'error') = 'object' THEN x->'error' END AS error
          FROM jsonb_array_elements(p_rows) x
    ), up AS (
        INSERT INTO agentpost.routes AS r (id, root_id, parent_id, actors, current, end_actor,
                                           phase, envelope_id, error)
        SELECT id, root_id, parent_id, actors, current, end_actor, phase, envelope_id, error
          FROM x
        ON CONFLICT (id) DO UPDATE
           SET actors = EXCLUDED.actors, current = EXCLUDED.current,
               end_actor = EXCLUDED.end_actor, phase = EXCLUDED.phase,
               envelope_id = EXCLUDED.envelope_id, error = EXCLUDED.error,
               updated_at = clock_timestamp()
         WHERE EXCLUDED.current >= r.current
        RETURNING r.*
    )
    SELECT count(*), array_agg(p_ws), array_agg('route_progress'::text),
           array_agg(up.envelope_id), array_agg(agentpost._route_body(up, p_ws))
      INTO v_n, t_chain, t_event, t_env, t_body
      FROM up;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    RETURN v_n;
END $$;

-- Record route rows as actor p_ws reports them (progress points), in one transaction.
CREATE FUNCTION agentpost.route_record(p_ws text, p_rows jsonb)
RETURNS int
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._check_workspace(p_ws);
    PERFORM agentpost._lock_chain(p_ws);
    RETURN agentpost._route_record(p_ws, p_rows, false);
END $$;

-- Lease up to p_max envelopes of actor p_ws's inbox (agentpost.lease) and, in the same
-- transaction, report each leased hop `received` (Asya's first progress point: status
-- running) with its `route_progress` entry. `routed` says whether the envelope is the current
-- hop of a routed envelope; the caller returns the others (see RouteStore.receive).
CREATE FUNCTION agentpost.route_lease(p_ws text, p_max int, p_ttl_ms int, p_holder text)
RETURNS TABLE (id text, sender text, recipient text, originator text, type text,
               format text, content text, attachments jsonb, in_reply_to text, rights jsonb,
               priority text, created_at timestamptz, origin text, status text, seq bigint,
               reason text, delivered_at timestamptz, consumed_at timestamptz, attempts int,
               tags text[], headers jsonb, meta jsonb, redeliveries int, lease_token uuid,
               leases int, lease_until timestamptz, lease_holder text, routed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids text[];
    v_asya text[];
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
BEGIN
    SELECT array_agg(l.id ORDER BY l.ordinality) INTO v_ids
      FROM agentpost.lease(p_ws, p_max, p_ttl_ms, p_holder) WITH ORDINALITY AS l;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- (the routed ids first, so that the update probes routes_pkey: see _route_record)
    v_asya := ARRAY(SELECT e.meta->'asya'->>'id' FROM agentpost.envelopes e
                     WHERE e.id = ANY (v_ids));
    WITH u AS (
        UPDATE agentpost.routes r
           SET phase = 'received', updated_at = clock_timestamp()
         WHERE r.id = ANY (v_asya) AND r.envelope_id = ANY (v_ids) AND r.end_actor IS NULL
        RETURNING r.*
    )
    SELECT array_agg(p_ws), array_agg('route_progress'::text), array_agg(u.envelope_id),
           array_agg(agentpost._route_body(u, p_ws))
      INTO t_chain, t_event, t_env, t_body
      FROM u;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    RETURN QUERY
        SELECT e.id, e.sender, e.recipient, e.originator, e.type, e.format, e.content,
               e.attachments, e.in_reply_to, e.rights, e.priority, e.created_at, e.origin,
               e.status, e.seq, e.reason, e.delivered_at, e.consumed_at, e.attempts, e.tags,
               e.headers, e.meta, e.redeliveries, e.lease_token, e.leases, e.lease_until,
               e.lease_holder,
               coalesce((SELECT r.envelope_id = e.id FROM agentpost.routes r
                          WHERE r.id = e.meta->'asya'->>'id'), false)
          FROM unnest(v_ids) WITH ORDINALITY AS u(id, k)
          JOIN agentpost.envelopes e ON e.id = u.id
         ORDER BY u.k;
END $$;

-- One or many hops of actor p_actor, all or nothing: the leased envelopes (p_ids, p_tokens)
-- are acked, the envelopes they route on (p_drafts, sent by p_actor: the next actor, a
-- fan-out, an end actor) are accepted, and where each envelope now stands (p_rows) is
-- recorded with its `route_progress` entries, in ONE transaction: a crash leaves either
-- nothing (the leases run out and the hops are redelivered) or the whole step. A refused
-- draft (unknown or sealed target, no right, ...), a lease that is stale or not a current hop
-- held by p_actor, or a refused row (see _route_record) undoes everything. Then, like send,
-- the accepted envelopes are delivered (phase 2, its own transactions; recover() completes a
-- delivery cut off by a crash). Without leases and with p_start it starts routes. With
-- p_next > 0 the same transaction then leases up to p_next further hops of p_actor's inbox
-- (route_lease, for p_ttl_ms, held by p_holder): a runtime streaming hops one at a time pays
-- one call and one durable commit per hop. Returns {recorded, acked, sent, leased: [rows of
-- route_lease as JSON objects], or null when expired leases wait (the caller leases apart)}.
CREATE PROCEDURE agentpost.route_step(p_actor text, p_ids text[], p_tokens uuid[],
                                      p_drafts jsonb, p_rows jsonb, p_start boolean,
                                      p_timeout_ms int, p_next int, p_ttl_ms int,
                                      p_holder text, INOUT p_result jsonb DEFAULT NULL)
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

-- Routed envelopes by id, and a family (every envelope sharing a root) in id order.
CREATE FUNCTION agentpost.route_get(p_ids text[]) RETURNS SETOF agentpost.routes
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM agentpost.routes r WHERE r.id = ANY (p_ids) ORDER BY r.id;
$$;

CREATE FUNCTION agentpost.route_family(p_root text) RETURNS SETOF agentpost.routes
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM agentpost.routes r WHERE r.root_id = p_root ORDER BY r.root_id, r.id;
$$;

-- Envelopes still under way whose current hop was dead-lettered (its redeliveries were
-- exhausted: a handler that never finished, or crashed every time): Asya's "routed to
-- error-end on timeout" sweeps these. Walks routes_open, probes envelopes by primary key.
CREATE FUNCTION agentpost.route_timed_out() RETURNS SETOF agentpost.routes
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM agentpost.routes r
     WHERE r.end_actor IS NULL
       AND (SELECT e.status FROM agentpost.envelopes e WHERE e.id = r.envelope_id)
           = 'undeliverable'
     ORDER BY r.id;
$$;
