-- A repeated send of an envelope that is not delivered yet completes its delivery (Courier
-- §6.4: a retry with the same id is the same envelope; WACP §6: durability). Before, the
-- duplicate's receiver was left out of phase 2, so a retry racing the original's delivery
-- returned `validated` while the original was still being delivered, and a retry after the
-- original sender died between its two phases left the envelope queued until recover().
-- Now the duplicate drains the receiver too: it waits behind the original's phase 2 (the
-- receiver's chain lock) or does it itself, and reports the status delivery left.

CREATE OR REPLACE PROCEDURE agentpost.send(p_drafts jsonb, p_origin text, p_user text,
                                           p_timeout_ms int, INOUT p_result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
    v_dups boolean[];
    v_recipients text[];
    v_fired int;
BEGIN
    SELECT array_agg(s.envelope_id ORDER BY s.idx), array_agg(s.duplicate ORDER BY s.idx),
           array_agg(DISTINCT s.recipient)
               FILTER (WHERE s.status = 'validated')
      INTO v_ids, v_dups, v_recipients
      FROM agentpost._accept(p_drafts, p_origin, p_user) s;
    COMMIT;
    CALL agentpost._deliver_all(v_recipients, p_timeout_ms);
    IF EXISTS (SELECT 1 FROM agentpost.rule_outbox) THEN
        CALL agentpost._fire_outbox(p_timeout_ms, v_fired);
    END IF;
    p_result := agentpost._results(v_ids, v_dups);
END $$;
