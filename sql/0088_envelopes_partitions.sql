-- The envelopes, partitioned by month like the trail (sql/0086; issue 26: the history tables
-- that grow with the trail leave with it). An envelope's row and its creation entry are
-- written by one transaction, so they share `part_day`, and a month of envelopes goes with the
-- trail's month once both are archived (`agentpost trail prune`): the rows still open, or
-- named by an entry that stays, move to `envelopes_kept` first; a signed `rows_pruned` entry
-- in the system chain says how many rows left and their digest, which a verification since an
-- earlier checkpoint takes off its row digests (docs/design.md, "Archive and prune").
-- Partitions: envelopes_pYYYYMM by month, envelopes_legacy (the rows written before this
-- migration, part_day 1900-01-01), envelopes_kept (part_day -infinity), envelopes_default
-- (a month no partition was made for).
--
-- An envelope's id must stay unique across months, and Postgres 15 allows no unique key
-- without the partition key. Each partition has its own primary key (id). Generated ids are
-- version 7 UUIDs, unique by construction; an id the caller chooses (an idempotency key,
-- Courier §6.4) is looked up in every partition under an advisory lock on the id before it is
-- used (`_accept`, sql/0084), so two sends of one id never both insert it. A look-up by id
-- probes each partition's key: with a few months kept, a few probes.

ALTER TABLE agentpost.envelopes RENAME TO envelopes_legacy;
-- a constant default is not written into the existing rows (no table rewrite)
ALTER TABLE agentpost.envelopes_legacy ADD COLUMN part_day date NOT NULL DEFAULT '1900-01-01';
ALTER TABLE agentpost.envelopes_legacy ALTER COLUMN part_day DROP DEFAULT;
ALTER TABLE agentpost.envelopes_legacy RENAME CONSTRAINT envelopes_pkey TO envelopes_legacy_pkey;
ALTER INDEX agentpost.envelopes_dead RENAME TO envelopes_legacy_dead;
ALTER INDEX agentpost.envelopes_delivered RENAME TO envelopes_legacy_delivered;
ALTER INDEX agentpost.envelopes_leased RENAME TO envelopes_legacy_leased;
ALTER INDEX agentpost.envelopes_pending RENAME TO envelopes_legacy_pending;
ALTER INDEX agentpost.envelopes_ready RENAME TO envelopes_legacy_ready;
ALTER INDEX agentpost.envelopes_rejected RENAME TO envelopes_legacy_rejected;
ALTER INDEX agentpost.envelopes_reply RENAME TO envelopes_legacy_reply;
-- the parent's trigger is cloned onto every partition, this one included, when attached
DROP TRIGGER envelopes_delivered_notify ON agentpost.envelopes_legacy;

-- the same columns in the same order (the row type gains part_day, last)
CREATE TABLE agentpost.envelopes (
    LIKE agentpost.envelopes_legacy INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS
) PARTITION BY RANGE (part_day);
ALTER TABLE agentpost.envelopes
    ALTER COLUMN part_day SET DEFAULT (now() AT TIME ZONE 'UTC')::date;

CREATE INDEX envelopes_dead ON agentpost.envelopes USING btree (recipient, seq)
    WHERE (status = 'undeliverable'::text);
CREATE INDEX envelopes_delivered ON agentpost.envelopes USING btree (recipient, seq)
    WHERE (delivered_at IS NOT NULL);
CREATE INDEX envelopes_leased ON agentpost.envelopes USING btree (recipient, lease_until)
    WHERE (lease_token IS NOT NULL);
CREATE INDEX envelopes_pending ON agentpost.envelopes USING btree (recipient, seq)
    WHERE (status = 'validated'::text);
CREATE INDEX envelopes_ready ON agentpost.envelopes
    USING btree (recipient, rank, COALESCE(queue_pos, seq))
    WHERE ((status = 'acknowledged'::text) AND (consumed_at IS NULL));
CREATE INDEX envelopes_rejected ON agentpost.envelopes USING btree (reason)
    WHERE (status = 'rejected'::text);
CREATE INDEX envelopes_reply ON agentpost.envelopes USING btree (in_reply_to, seq)
    WHERE (in_reply_to IS NOT NULL);
CREATE TRIGGER envelopes_delivered_notify AFTER UPDATE OF status ON agentpost.envelopes
    FOR EACH ROW WHEN (((old.status = 'validated'::text) AND (new.status = 'acknowledged'::text)))
    EXECUTE FUNCTION agentpost._notify_inbox();

-- A partition's own keys and settings (the parent can have neither: above, and Postgres
-- takes no autovacuum settings on a partitioned table). The envelopes' rows are updated as
-- they are delivered, leased and consumed: vacuumed early, as the table was (sql/0003).
CREATE FUNCTION agentpost._partition_keys(p_table text, p_name text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF p_table = 'trail' THEN
        PERFORM agentpost._trail_partition_keys(p_name);
    ELSIF p_table = 'envelopes' THEN
        EXECUTE format('ALTER TABLE agentpost.%I ADD CONSTRAINT %I PRIMARY KEY (id)',
                       p_name, p_name || '_pkey');
        EXECUTE format('ALTER TABLE agentpost.%I SET (autovacuum_vacuum_scale_factor = 0.01,'
                       ' autovacuum_vacuum_threshold = 1000,'
                       ' autovacuum_analyze_scale_factor = 0.05)', p_name);
    END IF;
END $$;

ALTER TABLE agentpost.envelopes ATTACH PARTITION agentpost.envelopes_legacy
    FOR VALUES FROM ('1900-01-01') TO ('1900-01-02');
CREATE TABLE agentpost.envelopes_kept PARTITION OF agentpost.envelopes
    FOR VALUES FROM (MINVALUE) TO ('1900-01-01');
SELECT agentpost._partition_keys('envelopes', 'envelopes_kept');
CREATE TABLE agentpost.envelopes_default PARTITION OF agentpost.envelopes DEFAULT;
SELECT agentpost._partition_keys('envelopes', 'envelopes_default');

-- The functions typed by the envelopes' row (an argument or a result) were bound to the old
-- table's type, now envelopes_legacy's: each is made again, as it stood, for the new one.
DO $$
DECLARE
    f record;
    v_def text;
BEGIN
    FOR f IN SELECT p.oid, p.oid::regprocedure AS sig FROM pg_proc p
              WHERE p.pronamespace = 'agentpost'::regnamespace
                AND p.proname IN ('_envelope_row', '_render', 'lease') LOOP
        v_def := replace(pg_get_functiondef(f.oid), 'agentpost.envelopes_legacy',
                         'agentpost.envelopes');
        EXECUTE format('DROP FUNCTION %s', f.sig);
        EXECUTE v_def;
    END LOOP;
END $$;

-- As in sql/0087, with the envelopes' months, keys and settings too.
CREATE OR REPLACE FUNCTION agentpost._ensure_month(p_table text, p_month date) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_name text := p_table || '_p' || to_char(p_month, 'YYYYMM');
    v_next date := (p_month + interval '1 month')::date;
    v_cols text;
BEGIN
    IF to_regclass('agentpost.' || v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- the columns a row is moved with: all but the generated ones (an envelope's rank)
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO v_cols
      FROM pg_attribute a
     WHERE a.attrelid = ('agentpost.' || p_table)::regclass AND a.attnum > 0
       AND NOT a.attisdropped AND a.attgenerated = '';
    EXECUTE format('LOCK TABLE agentpost.%I IN ACCESS EXCLUSIVE MODE', p_table || '_default');
    EXECUTE format('CREATE TABLE agentpost.%I (LIKE agentpost.%I INCLUDING DEFAULTS'
                   ' INCLUDING GENERATED INCLUDING CONSTRAINTS)', v_name, p_table);
    EXECUTE format('WITH moved AS (DELETE FROM agentpost.%I WHERE part_day >= %L'
                   ' AND part_day < %L RETURNING *) INSERT INTO agentpost.%I (%s)'
                   ' SELECT %s FROM moved', p_table || '_default', p_month, v_next, v_name,
                   v_cols, v_cols);
    PERFORM agentpost._partition_keys(p_table, v_name);
    EXECUTE format('ALTER TABLE agentpost.%I ATTACH PARTITION agentpost.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', p_table, v_name, p_month, v_next);
    RETURN true;
END $$;

-- As in sql/0087, for the envelopes' months too; returns the partitions made, of all three.
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
        FOREACH v_table IN ARRAY ARRAY['trail', 'signals', 'envelopes'] LOOP
            IF agentpost._ensure_month(v_table, v_month) THEN
                RETURN NEXT v_table || '_p' || to_char(v_month, 'YYYYMM');
            END IF;
        END LOOP;
        v_month := (v_month + interval '1 month')::date;
    END LOOP;
END $$;

SELECT agentpost.trail_ensure_partitions(2);

-- What a prune dropped of the envelopes, beside what it dropped of the trail.
ALTER TABLE agentpost.trail_prunes ADD COLUMN envelopes bigint NOT NULL DEFAULT 0
    CHECK (envelopes >= 0);
