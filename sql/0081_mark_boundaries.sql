-- Many deferred resolution boundaries in a few round trips (issue 25).
--
-- `Guard.resolve_deferred` runs one boundary per (scope, resource): BEGIN with the key's
-- advisory lock, a read of the resource, the verdicts, COMMIT; four round trips and a commit
-- per resource, so 1,000 contested resources took seconds. `Guard.resolve_deferred_many`
-- (and `resolve_all_deferred`, which uses it) takes the locks of a chunk of resources in one
-- statement, reads their boards in one, records their verdicts in one (this function), and
-- commits once. The conflict policy stays in Python, the same code for one resource or many
-- and for both backends: the server is asked for data and for storage, never for a verdict.
--
-- mark_lock_keys: the guard's advisory locks (keys as lock() makes them) in one statement,
-- in the order of their hash, so two batches that share keys take them in the same order
-- and never wait for each other in a cycle.

CREATE FUNCTION agentpost.mark_lock_keys(p_keys text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
    n integer := 0;
BEGIN
    FOR h IN SELECT DISTINCT hashtextextended(k, 0) FROM unnest(p_keys) AS k ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(h);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- mark_record_boundaries: the boundaries of several resources of one scope, each as
-- mark_record_boundary records one (a boundary number of its own, taken in the order given;
-- its verdicts replacing the key's previous ones), in a few set-based statements. p_rows is
-- a JSON array of {resource, verdicts}, distinct resources, verdicts as mark_record_boundary
-- takes them. If any verdict names no intent of its agent on its resource, nothing changes
-- and no row comes back. Returns (resource, boundary).
--
-- Each intent is checked by a scalar subquery on the primary key, which can only run as a
-- probe: 0056's LEFT JOIN LATERAL can still be flattened into a hash join over a sequential
-- scan of the marks, and was, on a space of 8,000 marks (about 1 ms per boundary, most of
-- a boundary's server time). mark_record_boundary now calls this function.
-- The previous verdicts of each key are deleted by their primary key, one key at a time.
CREATE FUNCTION agentpost.mark_record_boundaries(p_space text, p_scope text, p_now float8,
                                                 p_rows json)
RETURNS TABLE (resource text, boundary bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_keys text[];
    v_numbers bigint[] := '{}';
    v_key text;
BEGIN
    IF EXISTS (SELECT 1
                 FROM json_array_elements(p_rows) AS e,
                      json_to_recordset(e -> 'verdicts') AS r(agent_id uuid, intent_id uuid)
                WHERE (SELECT ARRAY[m.space, m.agent_id::text, m.mark_type, m.scope,
                                    m.resource]
                         FROM agentpost.marks m WHERE m.id = r.intent_id)
                      IS DISTINCT FROM ARRAY[p_space, r.agent_id::text, 'intent', p_scope,
                                             e ->> 'resource']) THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(t.e ->> 'resource' ORDER BY t.n), '{}') INTO v_keys
      FROM json_array_elements(p_rows) WITH ORDINALITY AS t(e, n);
    FOR i IN 1 .. cardinality(v_keys) LOOP
        v_numbers := v_numbers || nextval('agentpost.mark_boundaries');
    END LOOP;
    -- key by key: `resource = ANY (v_keys)` was planned as a filter over every verdict of
    -- the scope (the primary key's first two columns only)
    FOREACH v_key IN ARRAY v_keys LOOP
        DELETE FROM agentpost.mark_verdicts d
         WHERE d.space = p_space AND d.scope = p_scope AND d.resource = v_key;
    END LOOP;
    DELETE FROM agentpost.mark_verdicts d WHERE d.space = p_space AND d.expires_at < p_now;
    INSERT INTO agentpost.mark_verdicts (space, scope, resource, agent_id, boundary, allowed,
                                         intent_id, winner_id, decided_at, expires_at)
    SELECT p_space, p_scope, t.e ->> 'resource', r.agent_id, v_numbers[t.n], r.allowed,
           r.intent_id, r.winner_id, p_now,
           (SELECT m.created_at + m.ttl FROM agentpost.marks m WHERE m.id = r.intent_id)
      FROM json_array_elements(p_rows) WITH ORDINALITY AS t(e, n),
           json_to_recordset(t.e -> 'verdicts') AS r(agent_id uuid, allowed boolean,
                                                     intent_id uuid, winner_id uuid);
    RETURN QUERY SELECT k.resource, k.boundary FROM unnest(v_keys, v_numbers) AS k(resource, boundary);
END $$;

-- One boundary is a batch of one (the check above, not a join over the space's marks).
CREATE OR REPLACE FUNCTION agentpost.mark_record_boundary(p_space text, p_scope text,
                                                          p_resource text, p_now float8,
                                                          p_rows json)
RETURNS bigint
LANGUAGE sql AS $$
    SELECT b.boundary
      FROM agentpost.mark_record_boundaries(
               p_space, p_scope, p_now,
               json_build_array(json_build_object('resource', p_resource, 'verdicts', p_rows))) b
$$;

-- mark_write_read: `Guard.pre_action`'s intent and its second look at the resource (§9.2
-- step 4) in one round trip: mark_write (with the writer's name when p_agent_ids is given,
-- as the five-argument mark_write records it), then what read_with_claims returns for
-- (p_scope, p_resource), the new marks included (each statement of a plpgsql function sees
-- the ones before it). Every row carries the write's result as JSON, [[n, id, created_at,
-- named], ...]; a last row has no mark (claim NULL), so the result is there when the
-- resource holds nothing.
CREATE FUNCTION agentpost.mark_write_read(p_space text, p_now float8, p_rows json,
                                          p_agent_ids uuid[], p_agent_names text[],
                                          p_scope text, p_resource text, p_min float8,
                                          p_prune float8)
RETURNS TABLE (wrote json, claim boolean, mark agentpost.mark_read_row)
LANGUAGE plpgsql AS $$
DECLARE
    v_wrote json;
BEGIN
    IF p_agent_ids IS NULL THEN
        SELECT json_agg(json_build_array(w.n, w.id, w.created_at, true) ORDER BY w.n)
          INTO v_wrote FROM agentpost.mark_write(p_space, p_now, p_rows) w;
    ELSE
        SELECT json_agg(json_build_array(w.n, w.id, w.created_at, w.named) ORDER BY w.n)
          INTO v_wrote
          FROM agentpost.mark_write(p_space, p_now, p_rows, p_agent_ids, p_agent_names) w;
    END IF;
    RETURN QUERY
    SELECT v_wrote, false, r
      FROM agentpost.mark_read_at(p_space, p_scope, false, p_resource, NULL, NULL, p_min,
                                  p_now, p_prune) r;
    RETURN QUERY
    SELECT v_wrote, true,
           ROW(c.id, c.mark_type, c.agent_id, c.scope, c.created_at, c.initial_strength,
               c.supersedes, c.resource, c.action, c.topic, c.confidence, c.source,
               c.invalidates, c.severity, c.priority, c.blocking, c.resolved_by, c.failed,
               c.body, NULL)::agentpost.mark_read_row
      FROM agentpost.mark_claims(p_space, p_scope, p_resource) c;
    RETURN QUERY SELECT v_wrote, NULL::boolean, NULL::agentpost.mark_read_row;
END $$;
