"""Consumers of one inbox that do not wait for each other (issue 25; sql/0083), on a real
database.

Leases and acks of one inbox hold its chain key shared; their entries go to the inbox's own
chain when nobody else holds it, else to a consumer lane `lane:<k>:<inbox>`. What is pinned
here: with another consumer mid-lease, a lease and an ack still run, on a lane, and the trail
still verifies whole and since a checkpoint (the lane names no workspace row, the ack's
lifecycle entry is found in the lane); the workspace's trail includes its lanes; what moves
the blocking gate (a blocking envelope's ack, a delivery) still waits for the consumers
(WACP §6 blocking); several consumers racing on one inbox consume each envelope exactly
once, and the trail verifies after.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from agentpost.protocol.chains import lane_inbox, reserved_chain
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import inbox_held, query
from store.test_leases import BOSS, fill, send, topology

WAIT = 10.0  # seconds a test waits for something that must happen


def _lanes(store: EnvelopeStore, ws: str, event: str) -> set[str]:
    return {e.chain for e in store.trail(workspace_id=ws, event=event)}


def _waiting_for_a_lock(dsn: str) -> bool:
    return bool(query(dsn, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                           " AND NOT granted"))


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_lane_names_an_inbox_and_no_workspace() -> None:
    assert lane_inbox("lane:3:w1") == "w1"
    assert lane_inbox("lane:0:a.b-c_d") == "a.b-c_d"
    assert lane_inbox("w1") == "w1"
    assert reserved_chain("lane:0:w1")


def test_courier_lease_and_ack_beside_another_consumer_go_to_a_lane(
        store: EnvelopeStore, dsn: str) -> None:
    """Courier §6.3/§6.4, WACP §3 Integrity: a lease and an ack made while another consumer
    holds the inbox write on one of its lanes; the trail verifies, whole and since a
    checkpoint taken before; the workspace's trail lists the lane's entries."""
    topology(store)
    fill(store, "w1", 3)
    before = store.checkpoint()
    with inbox_held(dsn, "w1"):
        leases = store.lease("w1", max=2, ttl=60)
        assert store.ack_many([lease.token for lease in leases]) == 2
    (leased,) = _lanes(store, "w1", "envelope_leased")
    (consumed,) = _lanes(store, "w1", "envelope_consumed")
    assert leased.startswith("lane:") and lane_inbox(leased) == "w1"
    assert consumed.startswith("lane:") and lane_inbox(consumed) == "w1"
    assert all(store.get(lease.envelope_id).consumed_at is not None for lease in leases)
    # alone again: the inbox's own chain, as before lanes
    (lease,) = store.lease("w1", max=1, ttl=60)
    store.ack(lease.token)
    assert store.trail(envelope_id=lease.envelope_id, event="envelope_consumed")[0].chain \
        == "w1"
    whole = store.verify_trail()
    assert whole.ok and not whole.missing_rows, whole
    since = store.verify_trail(since=before)
    assert since.ok and not since.missing_rows and not since.rows_unaccounted, since


def test_an_ack_cut_from_a_lane_is_still_missed(store: EnvelopeStore, dsn: str) -> None:
    """WACP §3 Integrity: an envelope consumed on a lane whose `envelope_consumed` entry is
    deleted (the lane's tail cut off) fails verification, as on the inbox's own chain."""
    topology(store)
    fill(store, "w1", 1)
    with inbox_held(dsn, "w1"):
        (lease,) = store.lease("w1", max=1, ttl=60)
        store.ack(lease.token)
    (entry,) = store.trail(envelope_id=lease.envelope_id, event="envelope_consumed")
    assert entry.chain.startswith("lane:")
    query(dsn, "DELETE FROM agentpost.trail WHERE id = %s RETURNING id", (entry.id,))
    result = store.verify_trail()
    assert not result.ok
    assert lease.envelope_id in (result.failure or ""), result


def test_wacp_6_a_blocking_ack_waits_for_the_other_consumers(
        store: EnvelopeStore, dsn: str) -> None:
    """WACP §6 blocking: acknowledging a blocking envelope reopens the gate, so it takes the
    inbox's chain exclusively: it waits while another consumer holds the inbox, then runs,
    on the inbox's own chain, and the envelope held behind the gate is delivered."""
    topology(store)
    gate = send(store, "w1", "gate", priority="blocking")
    behind = send(store, "w1", "behind")
    assert store.get(behind).status is Status.VALIDATED
    (lease,) = store.lease("w1", max=1, ttl=60)
    assert lease.envelope_id == gate
    done = threading.Event()
    with EnvelopeStore(dsn) as other:
        with inbox_held(dsn, "w1"):
            acker = threading.Thread(target=lambda: (other.ack(lease.token), done.set()))
            acker.start()
            _until(lambda: _waiting_for_a_lock(dsn), "the blocking ack never waited")
            assert not done.is_set()
        acker.join(WAIT)
        assert done.is_set()
    (entry,) = store.trail(envelope_id=gate, event="envelope_consumed")
    assert entry.chain == "w1"
    _until(lambda: store.get(behind).status is Status.ACKNOWLEDGED,
           "the envelope behind the gate was never delivered")
    assert store.verify_trail().ok


def test_wacp_6_a_delivery_waits_for_the_consumers(store: EnvelopeStore, dsn: str) -> None:
    """WACP §6 blocking: a delivery moves the gate, so it takes the inbox's chain
    exclusively and cannot land between a lease's look at the gate and its claim: while a
    consumer holds the inbox, a send to it is not delivered (it waits, then is retried)."""
    topology(store)
    with inbox_held(dsn, "w1"):
        result = store.send(BOSS, "w1", "directive", "later")
        assert result.status is Status.VALIDATED
    assert query(dsn, "SELECT count(*) FROM agentpost.trail WHERE envelope_id = %s"
                      " AND event = 'envelope_delivered'", (result.envelope_id,)) == [(0,)]

    def delivered() -> bool:  # the delivery is retried once the consumer lets go
        store.redeliver()
        return store.get(result.envelope_id).status is Status.ACKNOWLEDGED

    _until(delivered, "the send was never delivered once the consumer let go")
    assert store.verify_trail().ok


def test_courier_racing_consumers_consume_each_envelope_once(
        store: EnvelopeStore, dsn: str) -> None:
    """Courier §6.3: four consumers with their own connections lease and ack one inbox until
    it is empty; every envelope is consumed exactly once, by one lease each, and the trail,
    lanes and all, verifies."""
    topology(store)
    ids = set(fill(store, "w1", 400))
    taken: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def consume(slot: int) -> None:
        try:
            with EnvelopeStore(dsn) as store:
                while leases := store.lease("w1", max=10, ttl=60, holder=f"c{slot}"):
                    store.ack_many([lease.token for lease in leases])
                    taken[slot].extend(lease.envelope_id for lease in leases)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    counts = Counter(eid for slot in taken for eid in slot)
    assert set(counts) == ids and set(counts.values()) == {1}
    consumed = store.trail(workspace_id="w1", event="envelope_consumed")
    assert Counter(e.envelope_id for e in consumed) == Counter(ids)
    assert {lane_inbox(e.chain) for e in consumed} == {"w1"}
    result = store.verify_trail()
    assert result.ok and not result.missing_rows, result
