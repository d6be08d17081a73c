-- The human highway's requeue of a dead letter (an envelope undeliverable after WACP §7's
-- bounded redelivery of Courier §6.3's leases), and the index the envelope page's thread
-- needs.
--
-- A dead letter (status undeliverable after exhausting its redeliveries, once delivered) is
-- made leasable again by a person: in one transaction the row goes back to its inbox
-- (status acknowledged, no reason, a fresh redelivery count, at the tail of its level) and
-- an `envelope_requeued` entry in the inbox's chain records who did it (origin human,
-- originator the user, as WACP §3 has human-highway work carry them; ids only, no payload,
-- as WACP §10 wants of trail entries) and signs the row as it leaves it (sql/0017), so
-- verify_trail() compares the row with this entry from now on (the envelope_gaps query
-- lists the event). The entries of the dead-lettering stay: the trail is append-only. A
-- sealed or terminal inbox (integrating, closed, failed) takes nothing back.

CREATE INDEX envelopes_reply ON agentpost.envelopes (in_reply_to, seq)
    WHERE in_reply_to IS NOT NULL;

CREATE FUNCTION agentpost.requeue(p_ws text, p_id text, p_user text) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_ws text;
    v_state text;
    e record;
    v_row jsonb;
    v_rank smallint;
BEGIN
    SELECT x.recipient INTO v_ws FROM agentpost.envelopes x WHERE x.id = p_id;
    IF NOT FOUND THEN
        PERFORM agentpost._fail('AP404', format('unknown envelope %L', p_id));
    END IF;
    IF v_ws <> p_ws THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %L belongs to the inbox %L, not %L', p_id, v_ws, p_ws));
    END IF;
    PERFORM agentpost._lock_parties(ARRAY[v_ws], ARRAY[p_id]);
    -- (under the inbox's chain lock, which a transition takes too)
    SELECT w.state INTO v_state FROM agentpost.workspaces w WHERE w.id = v_ws;
    IF v_state IN ('integrating', 'closed', 'failed') THEN
        PERFORM agentpost._fail('AP409', format(
            'the inbox %L is %s: nothing can be delivered to it any more', v_ws, v_state));
    END IF;
    SELECT x.status, x.reason, x.delivered_at, x.consumed_at INTO e
      FROM agentpost.envelopes x WHERE x.id = p_id
       FOR UPDATE;
    IF e.status <> 'undeliverable' OR e.delivered_at IS NULL OR e.consumed_at IS NOT NULL THEN
        PERFORM agentpost._fail('AP409', format(
            'envelope %L is not a dead letter of its inbox (status %s%s); only dead letters '
            'can be requeued', p_id, e.status,
            CASE WHEN e.delivered_at IS NULL THEN ', never delivered' ELSE '' END));
    END IF;
    UPDATE agentpost.envelopes x
       SET status = 'acknowledged', reason = NULL, redeliveries = 0,
           lease_token = NULL, lease_holder = NULL, lease_until = NULL,
           queue_pos = nextval('agentpost.envelope_seq')
     WHERE x.id = p_id
    RETURNING agentpost._envelope_row(x, false), x.rank INTO v_row, v_rank;
    PERFORM agentpost._trail_append(
        ARRAY[v_ws], ARRAY['envelope_requeued'], ARRAY[p_id],
        ARRAY[jsonb_build_object('envelope_id', p_id, 'workspace_id', v_ws,
                                 'origin', 'human', 'originator', p_user,
                                 'previous_reason', e.reason, 'row', v_row)],
        clock_timestamp());
    PERFORM pg_notify('agentpost_inbox', v_ws);
    RETURN jsonb_build_object('envelope_id', p_id, 'workspace_id', v_ws,
                              'blocking', v_rank = 0);
END $$;
