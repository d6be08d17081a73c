-- The commands, the sagas with their steps, and the routes, partitioned by month like the
-- envelopes (sql/0088; issue 26: the history tables that grow with the trail). This is the
-- layout a prune needs to let their old rows go by dropping a month, not by DELETE; this
-- migration moves no row and drops nothing (docs/operations.md says what the prune does with
-- them today, and docs/design.md what it is to do).
--
-- Partitions, per table: <table>_pYYYYMM by month, <table>_legacy (the rows written before
-- this migration, part_day 1900-01-01; dropped at once where empty, as sql/0089 does),
-- <table>_kept (part_day -infinity: for the rows a prune is to keep), <table>_default (a
-- month no partition was made for). `trail_ensure_partitions` makes their months with the
-- trail's.
--
-- A saga's steps live in their saga's partition: a step's part_day is its saga's (written
-- by `saga_plan_step`, checked on insert), so the steps' keys, (saga_id, position) and
-- (saga_id, name), are unique per partition and therefore everywhere.
--
-- Postgres 15 allows no unique key without the partition key, and no foreign key to a
-- partitioned table by one. So:
-- - each partition has its own keys (`_partition_keys`), and a trigger before each insert
--   (`_history_insert`) refuses a key another month already holds, with the error the key
--   gave (unique_violation, the constraint's name): a command's id and (workspace,
--   idempotency_key), a saga's id and (workspace, saga_key), a route's id. The trigger
--   looks, it takes no lock: a lock per row held to the commit would run a bulk insert (or
--   a prune moving thousands of rows between months, which fires it too) out of the lock
--   table. Two inserts of one key racing in one month meet at that month's own key; the
--   store's functions take an advisory lock on the key before they look and insert
--   (`_history_key_lock`), so two of their calls never race whatever the month;
-- - the three references among these tables (a recovery's target command, a step's saga,
--   a step's compensation command) are checked by the same triggers, with the error the
--   foreign key gave (foreign_key_violation). The store deletes none of these rows, so the
--   referenced row's side of a foreign key (no delete while referenced) is not needed: a
--   prune is to keep what a kept row references.
-- The functions that relied on ON CONFLICT over those keys take the same lock first and look:
-- `command_submit`, `saga_begin` and `_route_record` (which now updates the routes it has and
-- inserts the others, in one statement).

ALTER TABLE agentpost.commands DROP CONSTRAINT commands_target_command_id_fkey;
ALTER TABLE agentpost.saga_steps DROP CONSTRAINT saga_steps_compensation_id_fkey;
ALTER TABLE agentpost.saga_steps DROP CONSTRAINT saga_steps_saga_id_fkey;
ALTER TABLE agentpost.commands DROP CONSTRAINT commands_action_fkey;
ALTER TABLE agentpost.commands DROP CONSTRAINT commands_executor_fkey;
ALTER TABLE agentpost.commands DROP CONSTRAINT commands_workspace_fkey;
ALTER TABLE agentpost.saga_steps DROP CONSTRAINT saga_steps_action_fkey;
ALTER TABLE agentpost.sagas DROP CONSTRAINT sagas_workspace_fkey;
DROP TRIGGER commands_changed_notify ON agentpost.commands;
DROP TRIGGER commands_inserted_notify ON agentpost.commands;

-- Each table renamed <table>_legacy with its indexes (a partition's keys and indexes are its
-- own), given part_day; a constant default is not written into the rows (no rewrite).
DO $$
DECLARE
    v_table text;
    v_index text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['commands', 'sagas', 'saga_steps', 'routes'] LOOP
        EXECUTE format('ALTER TABLE agentpost.%I RENAME TO %I', v_table, v_table || '_legacy');
        EXECUTE format('ALTER TABLE agentpost.%I ADD COLUMN part_day date NOT NULL'
                       ' DEFAULT ''1900-01-01''', v_table || '_legacy');
        EXECUTE format('ALTER TABLE agentpost.%I ALTER COLUMN part_day DROP DEFAULT',
                       v_table || '_legacy');
        FOR v_index IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                        WHERE i.indrelid = ('agentpost.' || v_table || '_legacy')::regclass LOOP
            -- (renaming a key's index renames its constraint too)
            EXECUTE format('ALTER INDEX agentpost.%I RENAME TO %I', v_index,
                           v_table || '_legacy' || substr(v_index, length(v_table) + 1));
        END LOOP;
    END LOOP;
END $$;

CREATE TABLE agentpost.commands (
    LIKE agentpost.commands_legacy INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS
) PARTITION BY RANGE (part_day);
CREATE TABLE agentpost.sagas (
    LIKE agentpost.sagas_legacy INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS
) PARTITION BY RANGE (part_day);
CREATE TABLE agentpost.saga_steps (
    LIKE agentpost.saga_steps_legacy INCLUDING DEFAULTS INCLUDING GENERATED
    INCLUDING CONSTRAINTS
) PARTITION BY RANGE (part_day);
CREATE TABLE agentpost.routes (
    LIKE agentpost.routes_legacy INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS
) PARTITION BY RANGE (part_day);
ALTER TABLE agentpost.commands ALTER COLUMN part_day SET DEFAULT (now() AT TIME ZONE 'UTC')::date;
ALTER TABLE agentpost.sagas ALTER COLUMN part_day SET DEFAULT (now() AT TIME ZONE 'UTC')::date;
ALTER TABLE agentpost.routes ALTER COLUMN part_day SET DEFAULT (now() AT TIME ZONE 'UTC')::date;
-- (a step's part_day has no default: it is its saga's)

CREATE INDEX commands_newest ON agentpost.commands USING btree (created_at DESC, id DESC);
CREATE INDEX commands_started ON agentpost.commands USING btree (lease_expires_at)
    WHERE (state = 'started'::text);
CREATE INDEX commands_state_newest ON agentpost.commands
    USING btree (state, created_at DESC, id DESC);
CREATE INDEX commands_target ON agentpost.commands USING btree (target_command_id, kind)
    WHERE (target_command_id IS NOT NULL);
CREATE INDEX commands_workspace_newest ON agentpost.commands
    USING btree (workspace, created_at DESC, id DESC);
CREATE INDEX routes_family ON agentpost.routes USING btree (root_id, id);
CREATE INDEX routes_open ON agentpost.routes USING btree (envelope_id)
    WHERE (end_actor IS NULL);
CREATE INDEX routes_recent ON agentpost.routes USING btree (updated_at DESC, id DESC);

CREATE TRIGGER commands_changed_notify AFTER UPDATE OF state, declined ON agentpost.commands
    FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state)
                        OR (old.declined IS DISTINCT FROM new.declined)))
    EXECUTE FUNCTION agentpost._notify_command();
CREATE TRIGGER commands_inserted_notify AFTER INSERT ON agentpost.commands
    FOR EACH ROW EXECUTE FUNCTION agentpost._notify_command();

-- As in sql/0088, with these tables' keys (and the envelopes' and the trail's as there).
CREATE OR REPLACE FUNCTION agentpost._partition_keys(p_table text, p_name text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_keys text[] := CASE p_table
        WHEN 'envelopes' THEN ARRAY['PRIMARY KEY (id)']
        WHEN 'commands' THEN ARRAY['PRIMARY KEY (id)', 'UNIQUE (workspace, idempotency_key)']
        WHEN 'sagas' THEN ARRAY['PRIMARY KEY (id)', 'UNIQUE (workspace, saga_key)']
        WHEN 'saga_steps' THEN ARRAY['PRIMARY KEY (saga_id, position)', 'UNIQUE (saga_id, name)']
        WHEN 'routes' THEN ARRAY['PRIMARY KEY (id)']
        ELSE '{}'::text[] END;
BEGIN
    IF p_table = 'trail' THEN
        PERFORM agentpost._trail_partition_keys(p_name);
    END IF;
    FOR i IN 1 .. cardinality(v_keys) LOOP
        EXECUTE format('ALTER TABLE agentpost.%I ADD CONSTRAINT %I %s', p_name,
                       p_name || CASE WHEN i = 1 THEN '_pkey' ELSE '_key' || (i - 1) END,
                       v_keys[i]);
    END LOOP;
    IF p_table = 'envelopes' THEN
        EXECUTE format('ALTER TABLE agentpost.%I SET (autovacuum_vacuum_scale_factor = 0.01,'
                       ' autovacuum_vacuum_threshold = 1000,'
                       ' autovacuum_analyze_scale_factor = 0.05)', p_name);
    END IF;
END $$;

DO $$
DECLARE
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['commands', 'sagas', 'saga_steps', 'routes'] LOOP
        EXECUTE format('ALTER TABLE agentpost.%I ATTACH PARTITION agentpost.%I'
                       ' FOR VALUES FROM (''1900-01-01'') TO (''1900-01-02'')',
                       v_table, v_table || '_legacy');
        EXECUTE format('CREATE TABLE agentpost.%I PARTITION OF agentpost.%I'
                       ' FOR VALUES FROM (MINVALUE) TO (''1900-01-01'')',
                       v_table || '_kept', v_table);
        PERFORM agentpost._partition_keys(v_table, v_table || '_kept');
        EXECUTE format('CREATE TABLE agentpost.%I PARTITION OF agentpost.%I DEFAULT',
                       v_table || '_default', v_table);
        PERFORM agentpost._partition_keys(v_table, v_table || '_default');
    END LOOP;
END $$;

-- the references to the tables outside these four, as they were (checked over the legacy
-- rows once, here)
ALTER TABLE agentpost.commands ADD CONSTRAINT commands_action_fkey
    FOREIGN KEY (action) REFERENCES agentpost.envelope_types(name);
ALTER TABLE agentpost.commands ADD CONSTRAINT commands_executor_fkey
    FOREIGN KEY (executor) REFERENCES agentpost.workspaces(id);
ALTER TABLE agentpost.commands ADD CONSTRAINT commands_workspace_fkey
    FOREIGN KEY (workspace) REFERENCES agentpost.workspaces(id);
ALTER TABLE agentpost.saga_steps ADD CONSTRAINT saga_steps_action_fkey
    FOREIGN KEY (action) REFERENCES agentpost.envelope_types(name);
ALTER TABLE agentpost.sagas ADD CONSTRAINT sagas_workspace_fkey
    FOREIGN KEY (workspace) REFERENCES agentpost.workspaces(id);

-- The functions typed by these tables' rows were bound to the old tables' types, now the
-- legacy partitions': each is made again, as it stood, for the new one (as sql/0088 did).
DO $$
DECLARE
    f record;
    v_def text;
BEGIN
    FOR f IN SELECT p.oid, p.oid::regprocedure AS sig FROM pg_proc p
              WHERE p.pronamespace = 'agentpost'::regnamespace
                AND (pg_get_function_identity_arguments(p.oid) ~ '(commands|sagas|saga_steps|routes)_legacy'
                     OR pg_get_function_result(p.oid) ~ '(commands|sagas|saga_steps|routes)_legacy') LOOP
        v_def := pg_get_functiondef(f.oid);
        v_def := replace(v_def, 'agentpost.commands_legacy', 'agentpost.commands');
        v_def := replace(v_def, 'agentpost.sagas_legacy', 'agentpost.sagas');
        v_def := replace(v_def, 'agentpost.saga_steps_legacy', 'agentpost.saga_steps');
        v_def := replace(v_def, 'agentpost.routes_legacy', 'agentpost.routes');
        EXECUTE format('DROP FUNCTION %s', f.sig);
        EXECUTE v_def;
    END LOOP;
END $$;

-- The keys and references a month's own keys cannot hold (the top of this file); the
-- refusals are the errors the keys and foreign keys gave. The lock the store's functions take
-- on a key before they look for it and insert:
CREATE FUNCTION agentpost._history_key_lock(p_table text, VARIADIC p_key text[]) RETURNS void
    LANGUAGE sql
    AS $$
    SELECT pg_advisory_xact_lock(
        hashtextextended('agentpost.' || p_table || ':' || array_to_string(p_key, chr(1)), 0));
$$;

CREATE FUNCTION agentpost._history_refuse(p_constraint text, p_detail text, p_fk boolean)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_fk THEN
        RAISE foreign_key_violation USING CONSTRAINT = p_constraint, DETAIL = p_detail,
            MESSAGE = format('insert or update violates foreign key constraint "%s"',
                             p_constraint);
    END IF;
    RAISE unique_violation USING CONSTRAINT = p_constraint, DETAIL = p_detail,
        MESSAGE = format('duplicate key value violates unique constraint "%s"', p_constraint);
END $$;

CREATE FUNCTION agentpost._history_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_ARGV[0] = 'commands' THEN
        IF EXISTS (SELECT 1 FROM agentpost.commands WHERE id = NEW.id) THEN
            PERFORM agentpost._history_refuse('commands_pkey',
                format('Key (id)=(%s) already exists.', NEW.id), false);
        ELSIF EXISTS (SELECT 1 FROM agentpost.commands WHERE workspace = NEW.workspace
                                                      AND idempotency_key = NEW.idempotency_key) THEN
            PERFORM agentpost._history_refuse('commands_workspace_idempotency_key_key',
                format('Key (workspace, idempotency_key)=(%s, %s) already exists.',
                       NEW.workspace, NEW.idempotency_key), false);
        ELSIF NEW.target_command_id IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM agentpost.commands WHERE id = NEW.target_command_id) THEN
            PERFORM agentpost._history_refuse('commands_target_command_id_fkey',
                format('Key (target_command_id)=(%s) is not present in table "commands".',
                       NEW.target_command_id), true);
        END IF;
    ELSIF TG_ARGV[0] = 'sagas' THEN
        IF EXISTS (SELECT 1 FROM agentpost.sagas WHERE id = NEW.id) THEN
            PERFORM agentpost._history_refuse('sagas_pkey',
                format('Key (id)=(%s) already exists.', NEW.id), false);
        ELSIF EXISTS (SELECT 1 FROM agentpost.sagas WHERE workspace = NEW.workspace
                                                   AND saga_key = NEW.saga_key) THEN
            PERFORM agentpost._history_refuse('sagas_workspace_saga_key_key',
                format('Key (workspace, saga_key)=(%s, %s) already exists.',
                       NEW.workspace, NEW.saga_key), false);
        END IF;
    ELSIF TG_ARGV[0] = 'routes' THEN
        IF EXISTS (SELECT 1 FROM agentpost.routes WHERE id = NEW.id) THEN
            PERFORM agentpost._history_refuse('routes_pkey',
                format('Key (id)=(%s) already exists.', NEW.id), false);
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- A step is written into its saga's partition, and names a compensation command that exists.
CREATE FUNCTION agentpost._saga_step_written() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.part_day IS DISTINCT FROM (
            SELECT s.part_day FROM agentpost.sagas s WHERE s.id = NEW.saga_id) THEN
        IF NOT EXISTS (SELECT 1 FROM agentpost.sagas s WHERE s.id = NEW.saga_id) THEN
            PERFORM agentpost._history_refuse('saga_steps_saga_id_fkey',
                format('Key (saga_id)=(%s) is not present in table "sagas".', NEW.saga_id), true);
        END IF;
        RAISE check_violation USING CONSTRAINT = 'saga_steps_part_day',
            MESSAGE = format('step %L of saga %L must be written into its saga''s partition',
                             NEW.name, NEW.saga_id);
    END IF;
    IF NEW.compensation_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.compensation_id IS DISTINCT FROM OLD.compensation_id)
       AND NOT EXISTS (SELECT 1 FROM agentpost.commands c WHERE c.id = NEW.compensation_id) THEN
        PERFORM agentpost._history_refuse('saga_steps_compensation_id_fkey',
            format('Key (compensation_id)=(%s) is not present in table "commands".',
                   NEW.compensation_id), true);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER commands_unique BEFORE INSERT ON agentpost.commands
    FOR EACH ROW EXECUTE FUNCTION agentpost._history_insert('commands');
CREATE TRIGGER sagas_unique BEFORE INSERT ON agentpost.sagas
    FOR EACH ROW EXECUTE FUNCTION agentpost._history_insert('sagas');
CREATE TRIGGER routes_unique BEFORE INSERT ON agentpost.routes
    FOR EACH ROW EXECUTE FUNCTION agentpost._history_insert('routes');
CREATE TRIGGER saga_steps_written BEFORE INSERT OR UPDATE OF compensation_id
    ON agentpost.saga_steps FOR EACH ROW EXECUTE FUNCTION agentpost._saga_step_written();

-- sql/0077's command_submit: the command's row has its month (part_day); the race with
-- another submit of the key, settled by ON CONFLICT before, is settled by the key's lock
-- (the one `_history_insert` takes), taken before the second look for the key.
CREATE OR REPLACE FUNCTION agentpost.command_submit(p_id text, p_workspace text, p_key text, p_kind text, p_target text, p_mutating boolean, p_auto_confirm text, p_action text, p_executor text, p_args jsonb, p_evidence jsonb, p_advance boolean, p_lease_ms integer) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    c agentpost.commands;
    a record;
    v_bodies jsonb[];
    v_chains text[];
    v_status text := 'created';
    v_refusal text;
BEGIN
    IF EXISTS (SELECT 1 FROM agentpost.commands
                WHERE workspace = p_workspace AND idempotency_key = p_key) THEN
        RETURN jsonb_build_object('status', 'duplicate', 'view', agentpost._command_duplicate(
            p_workspace, p_key, p_kind, p_target, p_mutating, p_action, p_executor));
    END IF;
    PERFORM agentpost._command_check_request(p_workspace, p_kind, p_target, p_action,
                                             p_executor);
    -- The target's row lock is held from here: a replay that waited for it finds its key;
    -- the key's lock, taken next, holds off a submit of the key with another target.
    PERFORM agentpost._history_key_lock('commands', p_workspace, p_key);
    IF EXISTS (SELECT 1 FROM agentpost.commands
                WHERE workspace = p_workspace AND idempotency_key = p_key) THEN
        RETURN jsonb_build_object('status', 'duplicate', 'view', agentpost._command_duplicate(
            p_workspace, p_key, p_kind, p_target, p_mutating, p_action, p_executor));
    END IF;
    PERFORM agentpost._command_check_standing(p_kind, p_target);
    c := ROW(p_id, p_workspace, p_key, p_kind, p_target, p_mutating, p_auto_confirm, p_action,
             p_executor, p_args, 'canonicalized', false, NULL, false, NULL, false, NULL, NULL,
             NULL, clock_timestamp(), clock_timestamp(),
             (now() AT TIME ZONE 'UTC')::date)::agentpost.commands;
    v_bodies := ARRAY[agentpost._command_body(c, 'received', 'canonicalized', 'state_change',
        jsonb_build_object('auto_confirm', p_auto_confirm, 'executor', p_executor,
                           'idempotency_key', p_key) || coalesce(p_evidence, '{}'))];
    IF p_advance THEN
        SELECT * INTO a FROM agentpost._command_advance(c, p_lease_ms, false);
        c := a.c_out;
        v_bodies := v_bodies || a.bodies;
        v_status := a.status;
        v_refusal := a.refusal;
    END IF;
    INSERT INTO agentpost.commands VALUES (c.*);
    v_chains := array_fill('command:' || c.id, ARRAY[cardinality(v_bodies)]);
    IF p_target IS NOT NULL THEN
        v_chains := v_chains || ('command:' || p_target);
        v_bodies := v_bodies || jsonb_build_object(
            'lifecycle', jsonb_build_object(
                'command_id', p_target, 'transition', NULL,
                'timestamp', clock_timestamp(), 'evidence_type', 'recovery_requested'),
            'recovery_command_id', c.id, 'recovery_kind', c.kind);
    END IF;
    PERFORM agentpost._command_trail(v_chains, v_bodies);
    RETURN jsonb_build_object('status', v_status, 'refusal', v_refusal,
                              'view', agentpost._command_json(c, false));
END $$;

-- sql/0010's saga_begin, with the key's lock in place of ON CONFLICT.
CREATE OR REPLACE FUNCTION agentpost.saga_begin(p_id text, p_workspace text, p_key text) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    s agentpost.sagas;
BEGIN
    SELECT * INTO s FROM agentpost.sagas WHERE workspace = p_workspace AND saga_key = p_key;
    IF s.id IS NULL THEN
        PERFORM agentpost._check_workspace(p_workspace);
        PERFORM agentpost._history_key_lock('sagas', p_id);
        PERFORM agentpost._history_key_lock('sagas', p_workspace, p_key);
        SELECT * INTO s FROM agentpost.sagas WHERE workspace = p_workspace AND saga_key = p_key;
        IF s.id IS NULL THEN
            INSERT INTO agentpost.sagas (id, workspace, saga_key)
            VALUES (p_id, p_workspace, p_key)
            RETURNING * INTO s;
            PERFORM agentpost._saga_event(s, 'saga_begun', NULL);
            RETURN agentpost._saga_json(s) || jsonb_build_object('existing', false);
        END IF;
    END IF;
    RETURN agentpost._saga_json(s) || jsonb_build_object('existing', true);
END $$;

-- sql/0010's saga_plan_step: a step is written into its saga's partition.
CREATE OR REPLACE FUNCTION agentpost.saga_plan_step(p_saga text, p_position integer, p_name text, p_action text, p_executor text, p_handler text, p_args jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    s agentpost.sagas := agentpost._saga_lock(p_saga);
    st agentpost.saga_steps;
    v_status text := 'replay';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agentpost.envelope_types t WHERE t.name = p_action) THEN
        PERFORM agentpost._fail('AP404', format('unknown action %L (not a registered type)',
                                                p_action));
    END IF;
    PERFORM agentpost._check_workspace(coalesce(p_executor, s.workspace));
    SELECT * INTO st FROM agentpost.saga_steps WHERE saga_id = p_saga AND name = p_name;
    IF st.saga_id IS NOT NULL THEN
        IF st.position <> p_position OR st.action <> p_action
           OR st.handler IS DISTINCT FROM p_handler OR st.args <> p_args THEN
            PERFORM agentpost._fail('AP409', format(
                'step %L of saga %L was planned as step %s, %s, with compensation %s %s',
                p_name, p_saga, st.position, st.action, coalesce(st.handler, 'none'),
                st.args));
        END IF;
    ELSIF s.state IN ('running', 'completed') THEN
        IF s.state = 'completed' THEN
            PERFORM agentpost._fail('AP409', format('saga %L is completed; it has no step %L',
                                                    p_saga, p_name));
        END IF;
        IF p_position <> 1 + coalesce((SELECT max(position) FROM agentpost.saga_steps
                                        WHERE saga_id = p_saga), 0) THEN
            PERFORM agentpost._fail('AP409', format(
                'saga %L: step %L comes at position %s, but the saga has a different step there',
                p_saga, p_name, p_position));
        END IF;
        INSERT INTO agentpost.saga_steps (saga_id, position, name, workspace, command_key,
                                          action, handler, args, part_day)
        VALUES (p_saga, p_position, p_name, s.workspace, 'saga:' || p_saga || '/' || p_name,
                p_action, p_handler, p_args, s.part_day)
        RETURNING * INTO st;
        PERFORM agentpost._saga_event(s, 'saga_step_planned', jsonb_build_object(
            'step', p_name, 'position', p_position, 'command_key', st.command_key,
            'action', p_action, 'compensation', p_handler));
        v_status := 'planned';
    END IF;
    IF s.state NOT IN ('running', 'completed') THEN
        v_status := 'closed';
    END IF;
    RETURN jsonb_build_object('status', v_status, 'command_key', st.command_key,
                              'saga', agentpost._saga_json(s));
END $$;

-- sql/0013's _route_record: the routes' ids are locked (sorted) before the stored rows are
-- read, and the rows it has are updated and the others inserted, in one statement, in place
-- of ON CONFLICT (id) DO UPDATE. A batch that names a route twice is refused, as ON CONFLICT
-- refused it (it cannot affect one row twice).
CREATE OR REPLACE FUNCTION agentpost._route_record(p_ws text, p_rows jsonb, p_start boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_ended text; v_collision text; v_routed_parent text; v_parent text; v_taken text;
    t_chain text[]; t_event text[]; t_env text[]; t_body jsonb[];
    v_n int;
BEGIN
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        PERFORM agentpost._fail('AP400', 'route rows must be a JSON array');
    END IF;
    SELECT min(x->>'id') INTO v_taken FROM jsonb_array_elements(p_rows) x
     GROUP BY x->>'id' HAVING count(*) > 1 LIMIT 1;
    IF v_taken IS NOT NULL THEN
        PERFORM agentpost._fail('AP400', format('route rows name route %L twice', v_taken));
    END IF;
    PERFORM agentpost._history_key_lock('routes', k.id)
       FROM (SELECT DISTINCT x->>'id' AS id FROM jsonb_array_elements(p_rows) x
              WHERE x->>'id' IS NOT NULL ORDER BY 1) k;
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
        SELECT j.ord, x->>'id' AS id,
               coalesce((SELECT p.root_id FROM agentpost.routes p
                          WHERE p.id = x->>'parent_id'), x->>'id') AS root_id,
               x->>'parent_id' AS parent_id,
               ARRAY(SELECT jsonb_array_elements_text(x->'actors')) AS actors,
               (x->>'current')::int AS current, x->>'end' AS end_actor,
               x->>'phase' AS phase, x->>'envelope_id' AS envelope_id,
               CASE WHEN jsonb_typeof(x->'error') = 'object' THEN x->'error' END AS error
          FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS j(x, ord)
    ), ins AS (
        INSERT INTO agentpost.routes (id, root_id, parent_id, actors, current, end_actor,
                                      phase, envelope_id, error)
        SELECT id, root_id, parent_id, actors, current, end_actor, phase, envelope_id, error
          FROM x WHERE NOT EXISTS (SELECT 1 FROM agentpost.routes r WHERE r.id = x.id)
        RETURNING *
    ), upd AS (
        UPDATE agentpost.routes r
           SET actors = x.actors, current = x.current, end_actor = x.end_actor,
               phase = x.phase, envelope_id = x.envelope_id, error = x.error,
               updated_at = clock_timestamp()
          FROM x
         WHERE r.id = x.id AND x.current >= r.current
        RETURNING r.*
    ), up AS (
        SELECT * FROM ins UNION ALL SELECT * FROM upd
    )
    SELECT count(*), array_agg(p_ws ORDER BY x.ord),
           array_agg('route_progress'::text ORDER BY x.ord),
           array_agg(up.envelope_id ORDER BY x.ord),
           array_agg(agentpost._route_body(up, p_ws) ORDER BY x.ord)
      INTO v_n, t_chain, t_event, t_env, t_body
      FROM up JOIN x ON x.id = up.id;
    PERFORM agentpost._trail_write(t_chain, t_event, t_env, t_body, true);
    RETURN v_n;
END $$;

-- As in sql/0088, with these tables' months too; returns the partitions made.
CREATE OR REPLACE FUNCTION agentpost.trail_ensure_partitions(p_months_ahead integer DEFAULT 2,
                                                             p_from date DEFAULT NULL)
    RETURNS SETOF text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', least(coalesce(p_from, v_today), v_today))::date;
    v_last date;
    v_table text;
BEGIN
    IF p_months_ahead IS NULL OR p_months_ahead < 0 OR p_months_ahead > 120 THEN
        RAISE EXCEPTION 'months ahead must be 0 to 120, not %', p_months_ahead
            USING ERRCODE = 'AP001';
    END IF;
    v_last := (date_trunc('month', v_today) + make_interval(months => p_months_ahead))::date;
    WHILE v_month <= v_last LOOP
        FOREACH v_table IN ARRAY ARRAY['trail', 'signals', 'envelopes', 'commands', 'sagas',
                                       'saga_steps', 'routes'] LOOP
            IF agentpost._ensure_month(v_table, v_month) THEN
                RETURN NEXT v_table || '_p' || to_char(v_month, 'YYYYMM');
            END IF;
        END LOOP;
        v_month := (v_month + interval '1 month')::date;
    END LOOP;
END $$;

SELECT agentpost.trail_ensure_partitions(2);

-- As sql/0089: a legacy partition that holds nothing goes at once.
DO $$
DECLARE
    v_table text;
    v_empty boolean;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['commands', 'sagas', 'saga_steps', 'routes'] LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM agentpost.%I)', v_table || '_legacy')
           INTO v_empty;
        IF v_empty THEN
            EXECUTE format('ALTER TABLE agentpost.%I DETACH PARTITION agentpost.%I',
                           v_table, v_table || '_legacy');
            EXECUTE format('DROP TABLE agentpost.%I', v_table || '_legacy');
        END IF;
    END LOOP;
END $$;
