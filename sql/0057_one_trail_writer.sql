-- One batch trail writer. sql/0051 (lease and ack batches) and sql/0055 (send batches) each
-- brought one: _trail_batch (a recursive query: every entry of a chain at one time) and
-- _trail_append (a loop: times strictly increasing along the call, so an envelope's delivery
-- entry is later than its creation entry in another chain). Both hash, chain and sign the
-- same records; keeping two would let them drift. _trail_batch is now _trail_append with the
-- transaction's clock as its floor, so lease and ack entries follow the same rules as sends.
CREATE OR REPLACE FUNCTION agentpost._trail_batch(p_chain text[], p_event text[],
                                                  p_envelope text[], p_body jsonb[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM agentpost._trail_append(p_chain, p_event, p_envelope, p_body, clock_timestamp());
END $$;
