-- The signals, partitioned by month like the trail (sql/0086; issue 26: the history tables
-- that grow with the trail leave with it). A signal is written beside each delivery,
-- rejection and dead letter, and its `signal_emitted` trail entry says the same (signal, ref,
-- to), so a month of signals goes with the trail's month, once that is archived
-- (`agentpost trail prune`). Partitions: signals_pYYYYMM by month, signals_legacy (the
-- signals written before this migration, part_day 1900-01-01), signals_default (a month no
-- partition was made for). Readers page by (workspace_id, id), which each partition indexes.

ALTER TABLE agentpost.signals RENAME TO signals_legacy;
ALTER TABLE agentpost.signals_legacy ALTER COLUMN id DROP IDENTITY;  -- drops its sequence
CREATE SEQUENCE agentpost.signals_id_seq;
SELECT setval('agentpost.signals_id_seq',
              coalesce((SELECT max(id) FROM agentpost.signals_legacy), 0) + 1, false);
ALTER TABLE agentpost.signals_legacy ADD COLUMN part_day date NOT NULL DEFAULT '1900-01-01';
ALTER TABLE agentpost.signals_legacy ALTER COLUMN part_day DROP DEFAULT;
ALTER INDEX agentpost.signals_workspace RENAME TO signals_legacy_workspace;
ALTER TABLE agentpost.signals_legacy RENAME CONSTRAINT signals_pkey TO signals_legacy_pkey;

CREATE TABLE agentpost.signals (
    id bigint NOT NULL DEFAULT nextval('agentpost.signals_id_seq'),
    workspace_id text NOT NULL,
    signal text NOT NULL,
    ref text,
    reason text,
    emitted_by text,
    at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
    part_day date NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date
) PARTITION BY RANGE (part_day);
ALTER SEQUENCE agentpost.signals_id_seq OWNED BY agentpost.signals.id;
CREATE INDEX signals_workspace ON agentpost.signals USING btree (workspace_id, id);
ALTER TABLE agentpost.signals ATTACH PARTITION agentpost.signals_legacy
    FOR VALUES FROM ('1900-01-01') TO ('1900-01-02');
CREATE TABLE agentpost.signals_default PARTITION OF agentpost.signals DEFAULT;

-- One month of a partitioned history table (`trail` or `signals`), made if missing: the
-- entries of that month found in its default partition are moved in, under a lock that holds
-- new ones off until it is attached. True when it made it.
CREATE FUNCTION agentpost._ensure_month(p_table text, p_month date) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_name text := p_table || '_p' || to_char(p_month, 'YYYYMM');
    v_next date := (p_month + interval '1 month')::date;
BEGIN
    IF to_regclass('agentpost.' || v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('LOCK TABLE agentpost.%I IN ACCESS EXCLUSIVE MODE', p_table || '_default');
    EXECUTE format('CREATE TABLE agentpost.%I (LIKE agentpost.%I INCLUDING DEFAULTS)',
                   v_name, p_table);
    EXECUTE format('WITH moved AS (DELETE FROM agentpost.%I WHERE part_day >= %L'
                   ' AND part_day < %L RETURNING *) INSERT INTO agentpost.%I'
                   ' SELECT * FROM moved', p_table || '_default', p_month, v_next, v_name);
    IF p_table = 'trail' THEN
        PERFORM agentpost._trail_partition_keys(v_name);
    END IF;
    EXECUTE format('ALTER TABLE agentpost.%I ATTACH PARTITION agentpost.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', p_table, v_name, p_month, v_next);
    RETURN true;
END $$;

-- As in sql/0086, for the signals' months too; returns the partitions made, of both.
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
        FOREACH v_table IN ARRAY ARRAY['trail', 'signals'] LOOP
            IF agentpost._ensure_month(v_table, v_month) THEN
                RETURN NEXT v_table || '_p' || to_char(v_month, 'YYYYMM');
            END IF;
        END LOOP;
        v_month := (v_month + interval '1 month')::date;
    END LOOP;
END $$;

SELECT agentpost.trail_ensure_partitions(2);
