-- The trail, partitioned by month (issue 26: a trail that is archived and pruned). Old
-- history leaves Postgres by dropping a month's partition once it is archived, not by DELETE
-- (docs/operations.md, "Archive and prune").
--
-- The partition key is `part_day`, the UTC day the writing transaction started (a column
-- default: a generated column cannot be a partition key). It is not part of the signed record,
-- so moving an entry between partitions changes nothing any check reads. Partitions:
--   trail_pYYYYMM  one per month, [first day, first day of the next month); created ahead by
--                  `agentpost.trail_ensure_partitions` (here, and by every maintenance run);
--   trail_legacy   the entries written before this migration (their part_day is 1900-01-01):
--                  archivable once its newest entry is older than the cut;
--   trail_kept     the entries a prune keeps from the months it drops (part_day -infinity):
--                  each chain's head at the cut and every entry a later check still reads;
--   trail_default  a safety net for a month no partition was made for (a maintenance run
--                  moves its entries into the month's partition when it makes it).
-- Postgres 15 allows neither an identity column nor a unique key without the partition key on
-- a partitioned table: `id` takes its values from a sequence, and each partition has its own
-- unique (id) and unique (chain, chain_seq), which the appends (one writer per chain, under
-- the chain's lock) keep across partitions and verify_trail checks. The head lookups
-- (ORDER BY chain_seq DESC LIMIT 1) probe each partition's index: with a few months kept,
-- a few probes; measured side by side, single sends, batches and leases ran at 0.99x to 1.02x
-- the unpartitioned trail.

ALTER TABLE agentpost.trail RENAME TO trail_legacy;
ALTER TABLE agentpost.trail_legacy ALTER COLUMN id DROP IDENTITY;  -- drops its sequence
CREATE SEQUENCE agentpost.trail_id_seq;
SELECT setval('agentpost.trail_id_seq',
              coalesce((SELECT max(id) FROM agentpost.trail_legacy), 0) + 1, false);
-- a constant default is not written into the existing rows (no table rewrite)
ALTER TABLE agentpost.trail_legacy ADD COLUMN part_day date NOT NULL DEFAULT '1900-01-01';
ALTER TABLE agentpost.trail_legacy ALTER COLUMN part_day DROP DEFAULT;
ALTER INDEX agentpost.trail_at_brin RENAME TO trail_legacy_at_brin;
ALTER INDEX agentpost.trail_envelope RENAME TO trail_legacy_envelope;
ALTER INDEX agentpost.trail_right_rows RENAME TO trail_legacy_right_rows;
ALTER INDEX agentpost.trail_route_rows RENAME TO trail_legacy_route_rows;
ALTER TABLE agentpost.trail_legacy RENAME CONSTRAINT trail_pkey TO trail_legacy_pkey;
ALTER TABLE agentpost.trail_legacy
    RENAME CONSTRAINT trail_chain_chain_seq_key TO trail_legacy_chain_chain_seq_key;

CREATE TABLE agentpost.trail (
    id bigint NOT NULL DEFAULT nextval('agentpost.trail_id_seq'),
    chain text NOT NULL,
    chain_seq bigint NOT NULL,
    event text NOT NULL,
    envelope_id text,
    at timestamp with time zone NOT NULL,
    record text NOT NULL,
    prev_hash bytea NOT NULL,
    hash bytea NOT NULL,
    mac bytea NOT NULL,
    part_day date NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date
) PARTITION BY RANGE (part_day);
ALTER SEQUENCE agentpost.trail_id_seq OWNED BY agentpost.trail.id;

-- the indexes every partition has; attaching trail_legacy adopts its own equivalent ones
CREATE INDEX trail_at_brin ON agentpost.trail USING brin (at);
CREATE INDEX trail_envelope ON agentpost.trail USING btree (envelope_id)
    WHERE envelope_id IS NOT NULL;
CREATE INDEX trail_right_rows ON agentpost.trail
    USING btree (((record::jsonb -> 'body') ->> 'right_id'))
    WHERE event IN ('port_right_created', 'port_right_transferred', 'port_right_consumed',
                    'port_right_revoked');
CREATE INDEX trail_route_rows ON agentpost.trail USING btree (((record::jsonb -> 'body') ->> 'id'))
    WHERE event = 'route_progress';

-- a partition's own keys (the parent cannot have them, above)
CREATE FUNCTION agentpost._trail_partition_keys(p_table text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    EXECUTE format('ALTER TABLE agentpost.%I ADD CONSTRAINT %I UNIQUE (id)',
                   p_table, p_table || '_id_key');
    EXECUTE format('ALTER TABLE agentpost.%I ADD CONSTRAINT %I UNIQUE (chain, chain_seq)',
                   p_table, p_table || '_chain_chain_seq_key');
END $$;

ALTER TABLE agentpost.trail ATTACH PARTITION agentpost.trail_legacy
    FOR VALUES FROM ('1900-01-01') TO ('1900-01-02');
CREATE TABLE agentpost.trail_kept PARTITION OF agentpost.trail
    FOR VALUES FROM (MINVALUE) TO ('1900-01-01');
SELECT agentpost._trail_partition_keys('trail_kept');
CREATE TABLE agentpost.trail_default PARTITION OF agentpost.trail DEFAULT;
SELECT agentpost._trail_partition_keys('trail_default');

-- Makes the monthly partitions from this month through `p_months_ahead` months ahead, and from
-- `p_from`'s month when given (a store restored, or a test's history). A month whose entries
-- went to trail_default meanwhile gets them moved into its new partition, under a lock that
-- holds new ones off until it is attached. Returns the partitions it made.
CREATE FUNCTION agentpost.trail_ensure_partitions(p_months_ahead integer DEFAULT 2,
                                                  p_from date DEFAULT NULL)
    RETURNS SETOF text
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_month date := date_trunc('month', coalesce(least(p_from, (now() AT TIME ZONE 'UTC')::date),
                                                 (now() AT TIME ZONE 'UTC')::date))::date;
    v_last date := (date_trunc('month', (now() AT TIME ZONE 'UTC')::date)
                    + make_interval(months => greatest(p_months_ahead, 0)))::date;
    v_name text;
    v_next date;
BEGIN
    IF p_months_ahead IS NULL OR p_months_ahead < 0 OR p_months_ahead > 120 THEN
        RAISE EXCEPTION 'months ahead must be 0 to 120, not %', p_months_ahead
            USING ERRCODE = 'AP001';
    END IF;
    WHILE v_month <= v_last LOOP
        v_name := 'trail_p' || to_char(v_month, 'YYYYMM');
        v_next := (v_month + interval '1 month')::date;
        IF to_regclass('agentpost.' || v_name) IS NULL THEN
            LOCK TABLE agentpost.trail_default IN ACCESS EXCLUSIVE MODE;
            EXECUTE format('CREATE TABLE agentpost.%I (LIKE agentpost.trail INCLUDING DEFAULTS)',
                           v_name);
            EXECUTE format('WITH moved AS (DELETE FROM agentpost.trail_default'
                           ' WHERE part_day >= %L AND part_day < %L RETURNING *)'
                           ' INSERT INTO agentpost.%I SELECT * FROM moved',
                           v_month, v_next, v_name);
            PERFORM agentpost._trail_partition_keys(v_name);
            EXECUTE format('ALTER TABLE agentpost.trail ATTACH PARTITION agentpost.%I'
                           ' FOR VALUES FROM (%L) TO (%L)', v_name, v_month, v_next);
            RETURN NEXT v_name;
        END IF;
        v_month := v_next;
    END LOOP;
END $$;

SELECT agentpost.trail_ensure_partitions(2);

-- Each prune: the cut, the verified checkpoint the archive took at it (a later full
-- verification runs since the last one's), and what it dropped and kept.
CREATE TABLE agentpost.trail_prunes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cut date NOT NULL,
    pruned_at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
    checkpoint text NOT NULL,
    partitions text[] NOT NULL,
    dropped bigint NOT NULL CHECK (dropped >= 0),
    kept bigint NOT NULL CHECK (kept >= 0),
    archive text NOT NULL CHECK (length(archive) <= 4096)
);
