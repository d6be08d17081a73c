-- The durable mark space (Markspace spec; agentpost.marks.postgres.PostgresMarkSpace).
--
-- Many independent spaces share these tables, told apart by `space` (one per fleet or tenant);
-- a space needs no row of its own, so creating one costs nothing. Marks are immutable rows:
-- nothing here updates a mark, and strength is never stored. Reads compute it from the row
-- and the caller's `now` (decay, trust, supersession, warnings): marks_at() below is the one
-- definition of effective strength every read goes through.
--
-- Scopes are Python configuration, not rows. What a mark needs from its scope to decay (the
-- half-life of an observation or warning, the TTL of an intent) is copied onto the row when
-- it is written, so every process computes the same strength for it whatever scope
-- definitions it was started with.

-- Write order of the whole table. CACHE 1 (the default, spelled out): a session must not
-- hold a block of numbers, or a later write in another session could get a smaller one.
-- 48 bits, as mark_id() uses them: the 2^48-th write fails instead of wrapping around.
CREATE SEQUENCE agentpost.marks_seq AS bigint MAXVALUE 281474976710655 CACHE 1;

CREATE TABLE agentpost.marks (
    -- from mark_id(seq): ids order as the writes did (P32's tiebreak, see mark_id)
    id               uuid PRIMARY KEY,
    space            text NOT NULL,
    -- write order (within a space: the order of watched marks, P52)
    seq              bigint NOT NULL,
    mark_type        text NOT NULL
                     CHECK (mark_type IN ('intent', 'action', 'observation', 'warning', 'need')),
    agent_id         uuid NOT NULL,
    scope            text NOT NULL,
    created_at       float8 NOT NULL CHECK (created_at > '-Infinity' AND created_at < 'Infinity'),
    initial_strength float8 NOT NULL
                     CHECK (initial_strength >= 0 AND initial_strength < 'Infinity'),
    supersedes       uuid,
    -- coordination fields (NULL where the mark type has none)
    resource         text,
    action           text,
    topic            text,
    confidence       float8,
    source           text
                     CHECK (source IN ('fleet', 'external_verified', 'external_unverified')),
    invalidates      uuid,
    severity         text,
    priority         float8,
    blocking         boolean,
    resolved_by      uuid,
    failed           boolean,
    -- decay parameters of the governing scope when the mark was written
    half_life        float8 CHECK (half_life > 0 AND half_life < 'Infinity'),
    ttl              float8 CHECK (ttl > 0 AND ttl < 'Infinity'),
    -- after this time the mark's decay-times-trust strength is 0 (intents, resolved needs)
    -- or below 5e-7 (observations, warnings; actions and unresolved needs never fade), and
    -- warnings and supersession only lower it: reads skip such marks in the index instead of
    -- computing them (observations and warnings only when min_strength >= 1e-6)
    fades_at         float8 NOT NULL,
    -- content fields (result, content, reason, question, context) as JSON text, kept as
    -- written: jsonb would turn 1e+16 into the integer 10000000000000000, and a mark must
    -- come back exactly as it was stored (P30). Nothing queries inside it.
    body             json NOT NULL DEFAULT '{}',
    CHECK ((mark_type IN ('observation', 'warning')) = (half_life IS NOT NULL)),
    CHECK ((mark_type = 'intent') = (ttl IS NOT NULL))
);

-- read(scope, resource=...): intents and actions on one resource. (scope, resource) and
-- (scope, topic) are indexed as one array value, and mark_read() compares the array: with
-- plain columns, a read by resource could also use marks_scope through its (space, scope)
-- prefix, and without statistics (a table never analyzed: autovacuum off, or too young)
-- the planner rates the two alike and may walk a whole scope. The array leaves one choice.
CREATE INDEX marks_resource ON agentpost.marks (space, (ARRAY[scope, resource]), fades_at)
    WHERE resource IS NOT NULL;
-- read(scope, topic=...): observations and warnings on one topic
CREATE INDEX marks_topic ON agentpost.marks (space, (ARRAY[scope, topic]), fades_at)
    WHERE topic IS NOT NULL;
-- read(scope) and read(scope, mark_type=...), active_marks(scope)
CREATE INDEX marks_scope ON agentpost.marks (space, scope, mark_type, fades_at);
-- "is this mark superseded?" and "which warnings target it?" (§10, §9.5)
CREATE INDEX marks_supersedes ON agentpost.marks (space, supersedes)
    WHERE supersedes IS NOT NULL;
CREATE INDEX marks_invalidates ON agentpost.marks (space, invalidates)
    WHERE invalidates IS NOT NULL;
-- the latest created_at of a space, which the next write's created_at may not precede (P32)
CREATE INDEX marks_clock ON agentpost.marks (space, created_at);
-- active_marks(mark_type='intent') across scopes (Guard.resolve_all_deferred): live intents
CREATE INDEX marks_intents ON agentpost.marks (space, fades_at) WHERE mark_type = 'intent';
-- aggregate_needs(): the (few) unresolved needs of a space
CREATE INDEX marks_needs ON agentpost.marks (space, seq)
    WHERE mark_type = 'need' AND resolved_by IS NULL;

-- A subscription (§13.3): the agent's watch patterns, a JSON array of WatchPattern objects.
-- The subscriber's read authorization is kept with it: which marks of PROTECTED and CLASSIFIED
-- scopes it may see in full is decided when a mark is queued, as in memory.
CREATE TABLE agentpost.mark_subscriptions (
    space       text NOT NULL,
    agent_id    uuid NOT NULL,
    patterns    jsonb NOT NULL CHECK (jsonb_typeof(patterns) = 'array'),
    read_scopes text[] NOT NULL,
    PRIMARY KEY (space, agent_id)
);

-- Watched marks waiting for their subscriber (§13.4). A write queues the mark for every
-- matching subscriber other than the mark's agent, in the write's own statement;
-- get_watched_marks deletes and returns them in write order, so each is delivered at most
-- once (P51, P52). `projected`: the subscriber gets the projected copy (§7.4).
CREATE TABLE agentpost.mark_watch (
    space     text NOT NULL,
    agent_id  uuid NOT NULL,
    seq       bigint NOT NULL,
    mark_id   uuid NOT NULL,
    projected boolean NOT NULL,
    PRIMARY KEY (space, agent_id, seq)
);
ALTER TABLE agentpost.mark_watch SET (autovacuum_vacuum_scale_factor = 0.01,
                                      autovacuum_vacuum_threshold = 1000);

-- The id of the mark written p_seq-th: a UUIDv8 (RFC 9562's custom layout) whose first 48
-- bits are p_seq and the rest random (version 8, RFC variant). Marks are ordered by
-- (created_at, id) (P32) and created_at = max(clock, latest) ties whenever the clock stands
-- still or lags: with ids in write order, ties still follow write order, so a FIRST_WRITER
-- winner already let through stays the winner. The sequence is global, so ids are unique in
-- the table (P31); 74 random bits keep them hard to guess.
CREATE FUNCTION agentpost.mark_id(p_seq bigint) RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
DECLARE
    b bytea := uuid_send(gen_random_uuid());
BEGIN
    b := overlay(b PLACING substring(int8send(p_seq) FROM 3 FOR 6) FROM 1 FOR 6);
    b := set_byte(b, 6, (get_byte(b, 6) & 15) | 128);
    RETURN encode(b, 'hex')::uuid;
END $$;

-- Trust weight of a source (§4.1); marks without a source (all but observations) weigh 1.
-- tests/test_marks_postgres.py holds these to agentpost.marks.core.TRUST_WEIGHTS.
CREATE FUNCTION agentpost.mark_trust_weight(p_source text) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE p_source
               WHEN 'external_verified' THEN 0.7::float8
               WHEN 'external_unverified' THEN 0.3::float8
               ELSE 1.0::float8
           END;
$$;

-- a * b for a, b >= 0, as Python computes it, except that a product too small to be
-- anything but 0 or a denormal is 0: Postgres raises an error where the IEEE product
-- underflows to zero, Python quietly returns 0.
CREATE FUNCTION agentpost._mark_mul(p_a float8, p_b float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 2 AS $$
BEGIN
    IF p_a = 0 OR p_b = 0 OR ln(p_a) + ln(p_b) < -744.0 THEN
        RETURN 0;
    END IF;
    RETURN p_a * p_b;
END $$;

-- Decay times trust of one mark at p_now (core.effective_strength, §3.1 and §4.2): the same
-- arithmetic in the same order, so SQL and Python agree to the last bit or nearly.
-- Intents: full strength while age <= ttl; actions: constant; needs: full until resolved;
-- observations and warnings: initial * 0.5 ^ (age / half_life), times the trust weight.
-- A negative age (the clock was set back) counts as 0.
CREATE FUNCTION agentpost.mark_base_strength(
    p_type text, p_initial float8, p_created_at float8, p_now float8, p_half_life float8,
    p_ttl float8, p_resolved boolean, p_source text
) RETURNS float8
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 5 AS $$
DECLARE
    age float8;
    half float8;
    lr float8;
    e float8;
BEGIN
    -- age = max(0, now - created_at); where Python's subtraction overflows to inf, so does
    -- this one, by halves (Postgres raises instead of returning inf)
    IF p_now <= p_created_at THEN
        age := 0;
    ELSIF p_now > 8e307 OR p_created_at < -8e307 THEN
        half := CASE WHEN abs(p_now) < 1e-300 THEN 0 ELSE p_now * 0.5 END
              - CASE WHEN abs(p_created_at) < 1e-300 THEN 0 ELSE p_created_at * 0.5 END;
        age := CASE WHEN half >= power(2::float8, 1023) THEN 'Infinity'
                    ELSE p_now - p_created_at END;
    ELSE
        age := p_now - p_created_at;
    END IF;
    IF p_type = 'action' THEN
        RETURN p_initial;
    ELSIF p_type = 'need' THEN
        RETURN CASE WHEN p_resolved THEN 0 ELSE p_initial END;
    ELSIF p_type = 'intent' THEN
        RETURN CASE WHEN age <= p_ttl THEN p_initial ELSE 0 END;
    ELSIF p_initial = 0 THEN
        RETURN 0;
    END IF;
    -- e = age / half_life, where Python's division would under- or overflow
    IF age = 0 THEN
        e := 0;
    ELSE
        lr := ln(age) - ln(p_half_life);
        IF lr < -744.0 THEN
            e := 0;
        ELSIF lr > 709.0 THEN
            RETURN 0;
        ELSE
            e := age / p_half_life;
        END IF;
    END IF;
    IF e >= 1075 THEN  -- 0.5 ^ e is 0 in IEEE doubles
        RETURN 0;
    END IF;
    RETURN agentpost._mark_mul(agentpost._mark_mul(p_initial, power(0.5::float8, e)),
                               agentpost.mark_trust_weight(p_source));
END $$;

-- fades_at for a mark created at p_created_at that stays above the threshold for p_life
-- seconds (computed in Python, +-Infinity for "always" and "never"), with a little slack so
-- rounding can only keep a mark a moment longer, never drop one early (and no pruning at
-- all for absurd magnitudes, rather than an overflow error).
CREATE FUNCTION agentpost._mark_fades_at(p_created_at float8, p_life float8) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
               WHEN p_life = 'Infinity' OR p_life = '-Infinity' THEN p_life
               WHEN abs(p_created_at) > 1e300 OR abs(p_life) > 1e300 THEN 'Infinity'::float8
               ELSE p_created_at + p_life
                    + greatest(abs(p_created_at) + abs(p_life), 1e-300) * 1e-9 + 1e-6
           END;
$$;

-- Whether read_scopes grant content access to p_scope (core.Agent.can_read): a scope or an
-- ancestor of it is listed (P23, P26).
CREATE FUNCTION agentpost.mark_can_read(p_read_scopes text[], p_scope text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_read_scopes) r
                    WHERE p_scope = r OR starts_with(p_scope, r || '/'));
$$;

-- Whether a mark with these fields matches any of a subscription's patterns
-- (core.WatchPattern.matches, §13.1): scope hierarchically, the other fields when set.
CREATE FUNCTION agentpost.mark_watch_matches(p_patterns jsonb, p_scope text, p_type text,
                                             p_topic text, p_resource text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (
        SELECT 1
          FROM jsonb_array_elements(p_patterns) p
         WHERE (p_scope = p ->> 'scope' OR starts_with(p_scope, (p ->> 'scope') || '/'))
           AND (p ->> 'mark_type' IS NULL OR p ->> 'mark_type' = p_type)
           AND (p ->> 'topic' IS NULL OR p ->> 'topic' = p_topic)
           AND (p ->> 'resource' IS NULL OR p ->> 'resource' = p_resource));
$$;

-- Sum of non-negative strengths in the order given, as Python's sum() adds floats, except
-- that where Python's sum overflows to inf this one saturates at inf instead of raising.
CREATE FUNCTION agentpost._mark_sum_step(p_sum float8, p_x float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF p_x > 1.7976931348623157e308 - p_sum THEN
        RETURN 'Infinity';
    END IF;
    RETURN p_sum + p_x;
END $$;

CREATE AGGREGATE agentpost._mark_sum(float8) (
    SFUNC = agentpost._mark_sum_step, STYPE = float8, INITCOND = '0'
);

-- The effective strength of mark p_id (§9.5, §10) from its decay-times-trust strength
-- p_base: 0 when any mark of the space supersedes it; otherwise p_base minus the strength of
-- the unsuperseded warnings that invalidate it (summed in write order, as Python sums them),
-- never below 0. A table function so that it is inlined into the queries that use it. The
-- supersession test is a scalar subquery (LIMIT 1), not EXISTS, so that the planner always
-- probes the index per mark: with stale statistics it could otherwise choose to hash every
-- supersedes of the space (the test server runs without autovacuum).
CREATE FUNCTION agentpost.mark_adjusted_strength(p_space text, p_id uuid, p_base float8,
                                                 p_now float8)
RETURNS TABLE (strength float8)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
               WHEN p_base <= 0 THEN 0::float8
               WHEN (SELECT true FROM agentpost.marks x
                      WHERE x.space = p_space AND x.supersedes = p_id LIMIT 1) THEN 0::float8
               ELSE greatest(0::float8, p_base - coalesce((
                   SELECT agentpost._mark_sum(
                              agentpost.mark_base_strength(w.mark_type, w.initial_strength,
                                  w.created_at, p_now, w.half_life, w.ttl, false, w.source)
                              ORDER BY w.seq)
                     FROM agentpost.marks w
                    WHERE w.space = p_space AND w.invalidates = p_id
                      AND w.mark_type = 'warning'
                      AND NOT EXISTS (SELECT 1 FROM agentpost.marks y
                                       WHERE y.space = p_space AND y.supersedes = w.id)), 0))
           END;
$$;

-- Every mark of a space with its effective strength at p_now: what reads select from. It is
-- inlined, so a caller's conditions on scope, resource, topic, mark_type and fades_at reach
-- the indexes, and strength is computed for the matching rows only. (The OFFSET 0s keep the
-- strengths columns computed once per row, not expressions repeated wherever they are used.)
CREATE FUNCTION agentpost.marks_at(p_space text, p_now float8)
RETURNS TABLE (id uuid, seq bigint, mark_type text, agent_id uuid, scope text,
               created_at float8, initial_strength float8, supersedes uuid, resource text,
               action text, topic text, confidence float8, source text, invalidates uuid,
               severity text, priority float8, blocking boolean, resolved_by uuid,
               failed boolean, body json, fades_at float8, strength float8)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT m.id, m.seq, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
           m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
           m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
           m.body, m.fades_at, a.strength
      FROM agentpost.marks m
     CROSS JOIN LATERAL (
           SELECT agentpost.mark_base_strength(m.mark_type, m.initial_strength, m.created_at,
                      p_now, m.half_life, m.ttl, m.resolved_by IS NOT NULL, m.source) AS base
           OFFSET 0) b
     CROSS JOIN LATERAL (
           SELECT s.strength FROM agentpost.mark_adjusted_strength(m.space, m.id, b.base, p_now) s
           OFFSET 0) a
     WHERE m.space = p_space;
$$;

-- P39: the actions holding one resource: neither failed nor superseded, whatever warnings
-- say about them (a warning contests a fact, it does not undo it: §9.5). Written to match
-- marks_resource (space, [scope, resource], fades_at) in full, as mark_read does: actions
-- never fade (fades_at = Infinity) and only actions have a non-NULL `failed`; a mark_type
-- test would let the planner of a table without statistics walk marks_scope over every
-- action of the space instead. plpgsql, like mark_read, for a plan made once per session.
CREATE FUNCTION agentpost.mark_claims(p_space text, p_scope text, p_resource text)
RETURNS SETOF agentpost.marks
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT m.* FROM agentpost.marks m
     WHERE m.space = p_space AND ARRAY[m.scope, m.resource] = ARRAY[p_scope, p_resource]
       AND m.resource IS NOT NULL AND m.fades_at >= 'Infinity'::float8 AND m.failed = false
       AND NOT EXISTS (SELECT 1 FROM agentpost.marks x
                        WHERE x.space = m.space AND x.supersedes = m.id)
     ORDER BY m.seq;
END $$;

-- read(): the marks of one scope that match the filters, with strength > 0 and >= p_min, at
-- p_now. A plpgsql function so that each branch's plan is made once per session instead of
-- for every read (planning the inlined strength query costs more than running it); one
-- branch per access path, so each generic plan has its index: (scope, resource),
-- (scope, topic), (scope, mark_type), (scope). p_prune is p_now when the index may skip
-- marks that have faded (see fades_at), else -Infinity.
CREATE FUNCTION agentpost.mark_read(p_space text, p_scope text, p_resource text, p_topic text,
                                    p_mark_type text, p_min float8, p_now float8,
                                    p_prune float8)
RETURNS TABLE (id uuid, mark_type text, agent_id uuid, scope text, created_at float8,
               initial_strength float8, supersedes uuid, resource text, action text,
               topic text, confidence float8, source text, invalidates uuid, severity text,
               priority float8, blocking boolean, resolved_by uuid, failed boolean, body json,
               strength float8)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_resource IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE ARRAY[m.scope, m.resource] = ARRAY[p_scope, p_resource]
           AND m.resource IS NOT NULL AND m.fades_at >= p_prune
           AND (p_topic IS NULL OR m.topic = p_topic)
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
           AND m.strength > 0 AND m.strength >= p_min;
    ELSIF p_topic IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE ARRAY[m.scope, m.topic] = ARRAY[p_scope, p_topic]
           AND m.topic IS NOT NULL AND m.fades_at >= p_prune
           AND (p_mark_type IS NULL OR m.mark_type = p_mark_type)
           AND m.strength > 0 AND m.strength >= p_min;
    ELSIF p_mark_type IS NOT NULL THEN
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE m.scope = p_scope AND m.mark_type = p_mark_type AND m.fades_at >= p_prune
           AND m.strength > 0 AND m.strength >= p_min;
    ELSE
        RETURN QUERY
        SELECT m.id, m.mark_type, m.agent_id, m.scope, m.created_at, m.initial_strength,
               m.supersedes, m.resource, m.action, m.topic, m.confidence, m.source,
               m.invalidates, m.severity, m.priority, m.blocking, m.resolved_by, m.failed,
               m.body, m.strength
          FROM agentpost.marks_at(p_space, p_now) m
         WHERE m.scope = p_scope AND m.fades_at >= p_prune
           AND m.strength > 0 AND m.strength >= p_min;
    END IF;
END $$;

-- write(): store a batch of marks checked by the Python side (JSON rows, see
-- PostgresMarkSpace._row) and return, per row number, the id and created_at given. created_at is p_now, or the
-- space's latest created_at if the clock is behind it (P32); seq follows the batch order;
-- every subscriber whose patterns match a mark (other than the mark's agent) gets it queued
-- in this same statement (P50), as a projection or not at all where the scope's visibility
-- and the subscriber's read authorization say so (§7.4). plpgsql, again, for a plan made
-- once per session.
CREATE FUNCTION agentpost.mark_write(p_space text, p_now float8, p_rows json)
RETURNS TABLE (n bigint, id uuid, created_at float8)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH rows AS MATERIALIZED (
        -- nextval after the sort (volatile expressions are), so seq follows the batch order
        SELECT r.*, nextval('agentpost.marks_seq') AS seq
          FROM ROWS FROM (json_to_recordset(p_rows) AS (
                   mark_type text, agent_id uuid, scope text, initial_strength float8,
                   supersedes uuid, resource text, action text, topic text,
                   confidence float8, source text, invalidates uuid, severity text,
                   priority float8, blocking boolean, resolved_by uuid, failed boolean,
                   half_life float8, ttl float8, life float8, visibility text, body json))
               WITH ORDINALITY AS r(mark_type, agent_id, scope, initial_strength,
                                    supersedes, resource, action, topic, confidence, source,
                                    invalidates, severity, priority, blocking, resolved_by,
                                    failed, half_life, ttl, life, visibility, body, n)
         ORDER BY r.n
    ), clock AS (
        SELECT greatest(p_now, max(m.created_at)) AS t
          FROM agentpost.marks m
         WHERE m.space = p_space
    ), ins AS (
        INSERT INTO agentpost.marks AS m (id, space, seq, mark_type, agent_id, scope,
                                          created_at, initial_strength, supersedes, resource,
                                          action, topic, confidence, source, invalidates,
                                          severity, priority, blocking, resolved_by, failed,
                                          half_life, ttl, fades_at, body)
        SELECT agentpost.mark_id(r.seq), p_space, r.seq, r.mark_type, r.agent_id, r.scope,
               c.t, r.initial_strength, r.supersedes, r.resource, r.action, r.topic,
               r.confidence, r.source, r.invalidates, r.severity, r.priority, r.blocking,
               r.resolved_by, r.failed, r.half_life, r.ttl,
               agentpost._mark_fades_at(c.t, r.life), r.body
          FROM rows r CROSS JOIN clock c
        RETURNING m.id, m.seq, m.created_at, m.agent_id, m.scope, m.mark_type, m.topic,
                  m.resource
    ), watched AS (
        INSERT INTO agentpost.mark_watch (space, agent_id, seq, mark_id, projected)
        SELECT p_space, s.agent_id, i.seq, i.id,
               r.visibility = 'protected'
               AND NOT agentpost.mark_can_read(s.read_scopes, i.scope)
          FROM ins i
          JOIN rows r ON r.seq = i.seq
          JOIN agentpost.mark_subscriptions s ON s.space = p_space
         WHERE s.agent_id <> i.agent_id
           AND agentpost.mark_watch_matches(s.patterns, i.scope, i.mark_type, i.topic,
                                            i.resource)
           AND (r.visibility <> 'classified'
                OR agentpost.mark_can_read(s.read_scopes, i.scope))
    )
    SELECT r.n, i.id, i.created_at FROM ins i JOIN rows r ON r.seq = i.seq;
END $$;

-- strength_of() of a stored mark (NULL when the space has no such mark); plpgsql for a plan
-- made once per session, like mark_read.
CREATE FUNCTION agentpost.mark_strength(p_space text, p_id uuid, p_now float8)
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT m.strength FROM agentpost.marks_at(p_space, p_now) m WHERE m.id = p_id);
END $$;
