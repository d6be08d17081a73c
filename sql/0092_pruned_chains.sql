-- The commands' and sagas' own chains leave whole with their months (issue 26;
-- store/history_archive.py says which). A chain that left is listed here with its last
-- entry, the prune that dropped it, and is never written again: a run since a checkpoint
-- that anchors it accepts it as gone by this list, which the prune's signed
-- `chains_pruned` entry vouches for (its count and keyed sum over these rows).
--
-- `prune` is NULL while a prune is choosing (the rows are its plan, written beside the
-- agents); the transaction that drops the months sets it. Only rows with a prune count.
CREATE TABLE agentpost.trail_pruned_chains (
    chain text PRIMARY KEY,
    seq bigint NOT NULL CHECK (seq >= 1),
    hash bytea NOT NULL,
    prune bigint REFERENCES agentpost.trail_prunes (id)
);
CREATE INDEX trail_pruned_chains_prune ON agentpost.trail_pruned_chains (prune);

-- A chain's first entry is refused if the chain was pruned: its history is archived, and
-- starting it again would make a checkpoint that anchors it see a chain cut back. Only
-- first entries are looked up (one index probe each, mostly a new command's or saga's).
CREATE FUNCTION agentpost._refuse_pruned_chain() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agentpost.trail_pruned_chains p
                WHERE p.chain = NEW.chain AND p.prune IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'AP409', MESSAGE = format(
            '%s was pruned: its history is in the archive and it takes no new entries',
            NEW.chain);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER trail_pruned_chain BEFORE INSERT ON agentpost.trail
    FOR EACH ROW WHEN (NEW.chain_seq = 1) EXECUTE FUNCTION agentpost._refuse_pruned_chain();

-- What a prune dropped of the commands, sagas and saga steps.
ALTER TABLE agentpost.trail_prunes
    ADD COLUMN commands bigint NOT NULL DEFAULT 0 CHECK (commands >= 0),
    ADD COLUMN sagas bigint NOT NULL DEFAULT 0 CHECK (sagas >= 0),
    ADD COLUMN saga_steps bigint NOT NULL DEFAULT 0 CHECK (saga_steps >= 0);
