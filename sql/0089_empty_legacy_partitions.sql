-- A legacy partition that holds nothing goes (issue 26). sql/0086 to 0088 attached each
-- table's rows from before partitioning as `<table>_legacy`; on a store created since, or
-- that had no rows yet, those partitions are empty forever (nothing is written into 1900).
-- Every statement that cannot prune partitions by `part_day` (a look-up by id, a lease, a
-- chain's head) opens and locks each partition and its indexes, so an empty one costs each
-- of them something for nothing: the envelopes' partitioning measured 0.86x to 0.98x the
-- unpartitioned table's rates with it (docs/operations.md). A store upgraded with history
-- keeps its legacy partitions until a prune takes them.

DO $$
DECLARE
    v_table text;
    v_empty boolean;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['trail', 'signals', 'envelopes'] LOOP
        IF to_regclass('agentpost.' || v_table || '_legacy') IS NULL THEN
            CONTINUE;
        END IF;
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM agentpost.%I)', v_table || '_legacy')
           INTO v_empty;
        IF v_empty THEN
            EXECUTE format('ALTER TABLE agentpost.%I DETACH PARTITION agentpost.%I',
                           v_table, v_table || '_legacy');
            EXECUTE format('DROP TABLE agentpost.%I', v_table || '_legacy');
        END IF;
    END LOOP;
END $$;
