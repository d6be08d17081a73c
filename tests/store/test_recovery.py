"""Recovery works on the status column; WACP §7.2 defines its work set on the trail. These
tests check the two agree in every state an envelope can be in, and that recover() empties it.
"""

from __future__ import annotations

import threading

import psycopg2

from agentpost.store import EnvelopeStore

TRAIL_GAPS = """
SELECT t.envelope_id FROM agentpost.trail t
 WHERE t.event = 'envelope_created'
   AND NOT EXISTS (SELECT 1 FROM agentpost.trail o
                    WHERE o.envelope_id = t.envelope_id
                      AND o.event IN ('envelope_delivered', 'envelope_undeliverable'))
"""


def _sets(dsn: str) -> tuple[set[str], set[str]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(TRAIL_GAPS)
            gaps = {r[0] for r in cur.fetchall()}
            cur.execute("SELECT id FROM agentpost.envelopes WHERE status = 'validated'")
            pending = {r[0] for r in cur.fetchall()}
    finally:
        conn.close()
    return gaps, pending


def test_standard_redelivery_on_recovery_work_set_equals_trail_gaps(store: EnvelopeStore,
                                                                      dsn: str) -> None:
    """§7.2: recovery finds envelopes with envelope_created but neither envelope_delivered nor
    envelope_undeliverable. Our status `validated` must be exactly that set, whatever the
    reason the envelope waits (queued, backing off, cut off), and recover() must empty it."""
    lead = store.create_workspace("coordinator", workspace_id="lead").id
    for name in ("open", "paused", "busy", "doomed"):
        store.create_workspace("worker", parent=lead, workspace_id=name)
    store.transition("paused", "suspended")
    store.transition("doomed", "suspended")

    delivered = store.send(lead, "open", "directive", "delivered")
    rejected = store.send("open", lead, "directive", "rejected: workers do not direct")
    queued = store.send(lead, "paused", "directive", "queued while suspended")
    doomed = store.send(lead, "doomed", "directive", "queued, then its target closes")

    # an envelope whose delivery attempt times out: hold the receiver's chain lock
    holder = psycopg2.connect(dsn)
    holder.autocommit = True
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(agentpost._chain_key('busy'))")
    result: list = []
    sender = threading.Thread(target=lambda: result.append(
        store.send(lead, "busy", "directive", "backing off")))
    sender.start()
    sender.join(timeout=30)
    assert result and result[0].status == "validated"
    backing_off = result[0]

    gaps, pending = _sets(dsn)
    assert gaps == pending == {queued.envelope_id, doomed.envelope_id, backing_off.envelope_id}
    assert delivered.envelope_id not in gaps and rejected.envelope_id not in gaps

    # seal one target behind recovery's back (as if the sweep after the transition never ran)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("UPDATE agentpost.workspaces SET state = 'closed' WHERE id = 'doomed'")
    conn.close()
    store.transition("paused", "active")
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_unlock(agentpost._chain_key('busy'))")
    holder.close()

    outcome = store.recover()
    assert outcome["still_queued"] == 0
    assert _sets(dsn) == (set(), set())
    assert store.get(backing_off.envelope_id).status == "acknowledged"
    assert store.get(queued.envelope_id).status == "acknowledged"
    undeliverable = store.get(doomed.envelope_id)
    assert (undeliverable.status, undeliverable.reason) == ("undeliverable", "target_closed")
    assert any(s.signal == "failed" and s.ref == doomed.envelope_id for s in store.signals(lead))
    assert store.verify_trail().ok
