"""The blocking gate reopens however a blocking envelope leaves its inbox (WACP §6, blocking
priority semantics; WACP §11 "Blocking priority": subsequent deliveries pause *until the
blocking envelope is consumed*, and no longer).

A blocking envelope can leave its inbox by an ack, by `consume()`, or by being dead-lettered
(its fourth nack, or its fourth lease expiry, found by `lease()` or by the sweep). On every
path, at once and in the same call: what was queued behind it is delivered, what was already
delivered behind it becomes leasable, and the inbox is notified, as after an ack. Before the
fix, a dead-lettered blocking envelope left the queue stalled until some unrelated send or a
maintenance run came by.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from agentpost.protocol.errors import LeaseLost
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import query
from test_leases import BOSS, SHORT_TTL, assert_trail_ok, fill, ids, send, topology, wait_past
from test_live_delivery import notifications, raw_listen


@pytest.fixture
def inbox(store: EnvelopeStore) -> Iterator[EnvelopeStore]:
    topology(store, ["w1", "w2"])
    yield store
    assert_trail_ok(store)


def _nack_four_times(store: EnvelopeStore, gate: str) -> None:
    for _ in range(4):
        [lease] = store.lease("w1")
        assert lease.envelope_id == gate
        store.nack(lease.token)


def _expire_four_times_then_lease(store: EnvelopeStore, gate: str) -> None:
    """The fourth expiry is found by a consumer's own `lease()` call."""
    for _ in range(4):
        [lease] = store.lease("w1", ttl=SHORT_TTL)
        assert lease.envelope_id == gate
        wait_past([lease])


def _expire_four_times_then_sweep(store: EnvelopeStore, gate: str) -> None:
    """The fourth expiry is found by the sweep (`expire_leases`), with nobody leasing."""
    _expire_four_times_then_lease(store, gate)
    store.expire_leases()


def _ack(store: EnvelopeStore, gate: str) -> None:
    [lease] = store.lease("w1")
    assert lease.envelope_id == gate
    store.ack(lease.token)


def _consume(store: EnvelopeStore, gate: str) -> None:
    store.consume("w1", gate)


EXITS: dict[str, Callable[[EnvelopeStore, str], None]] = {
    "ack": _ack,
    "consume": _consume,
    "dead_letter_by_nack": _nack_four_times,
    "dead_letter_by_expiry_in_lease": _expire_four_times_then_lease,
    "dead_letter_by_expiry_in_sweep": _expire_four_times_then_sweep,
}


def _leave(store: EnvelopeStore, dsn: str, exit_path: str, gate: str) -> list[str]:
    """Make the gate leave its inbox by `exit_path`; the inbox notifications seen after the
    gate's last step (a listener that starts then, so earlier wake-ups do not count)."""
    steps = EXITS[exit_path]
    if exit_path == "dead_letter_by_expiry_in_lease":
        steps(store, gate)
        with raw_listen(dsn) as conn:
            taken = store.lease("w1", max=10)  # finds the fourth expiry and dead-letters
            return [*notifications(conn, first_within=2.0, settle=0.3), *ids(taken)]
    if exit_path == "dead_letter_by_expiry_in_sweep":
        _expire_four_times_then_lease(store, gate)
        with raw_listen(dsn) as conn:
            store.expire_leases()
            return notifications(conn, first_within=2.0, settle=0.3)
    if exit_path == "dead_letter_by_nack":
        for _ in range(3):
            [lease] = store.lease("w1")
            store.nack(lease.token)
        [lease] = store.lease("w1")
        with raw_listen(dsn) as conn:
            store.nack(lease.token)
            return notifications(conn, first_within=2.0, settle=0.3)
    with raw_listen(dsn) as conn:
        steps(store, gate)
        return notifications(conn, first_within=2.0, settle=0.3)


@pytest.mark.parametrize("exit_path", list(EXITS))
def test_wacp_blocking_priority_gate_reopens_on_every_exit(inbox: EnvelopeStore, dsn: str,
                                                           exit_path: str) -> None:
    """WACP §6 (blocking priority): a blocking envelope B, then a normal M to the same worker.
    M waits behind B (validated, not delivered). However B leaves the inbox, M is delivered
    in the same call, the inbox is notified, and M can be leased."""
    gate = send(inbox, "w1", "gate", priority="blocking")
    behind = send(inbox, "w1", "behind")
    assert inbox.get(behind).status is Status.VALIDATED, "M was not held behind the gate"
    seen = _leave(inbox, dsn, exit_path, gate)
    assert "w1" in seen, f"the inbox was not notified when the gate left by {exit_path}"
    assert inbox.get(behind).status is Status.ACKNOWLEDGED, (
        f"M is still queued after the gate left by {exit_path}")
    if exit_path != "dead_letter_by_expiry_in_lease":  # that path leased M in the same call
        assert ids(inbox.lease("w1", max=10)) == [behind]
    else:
        assert behind in seen
    if exit_path.startswith("dead_letter"):
        assert inbox.get(gate).status is Status.UNDELIVERABLE


@pytest.mark.parametrize("exit_path", list(EXITS))
def test_wacp_blocking_priority_delivered_envelopes_become_leasable(
        inbox: EnvelopeStore, dsn: str, exit_path: str) -> None:
    """WACP §6 (blocking priority): envelopes delivered *before* B arrived sit in the inbox
    but are not leasable while B waits; when B leaves, by any path, they become leasable and
    the inbox is notified although nothing new was delivered."""
    early = fill(inbox, "w1", 2, prefix="early")
    gate = send(inbox, "w1", "gate", priority="blocking")
    seen = _leave(inbox, dsn, exit_path, gate)
    assert "w1" in seen, f"the inbox was not notified when the gate left by {exit_path}"
    if exit_path == "dead_letter_by_expiry_in_lease":
        assert [s for s in seen if s != "w1"] == early
    else:
        assert ids(inbox.lease("w1", max=10)) == early


def test_wacp_blocking_priority_other_inboxes_are_not_disturbed(inbox: EnvelopeStore,
                                                                 dsn: str) -> None:
    """Dead-lettering a blocking envelope of w1 reopens w1 only: w2's own gate holds."""
    send(inbox, "w1", "gate-1", priority="blocking")
    gate2 = send(inbox, "w2", "gate-2", priority="blocking")
    behind2 = send(inbox, "w2", "behind-2")
    for _ in range(4):
        [lease] = inbox.lease("w1")
        inbox.nack(lease.token)
    assert inbox.get(behind2).status is Status.VALIDATED
    assert ids(inbox.lease("w2", max=10)) == [gate2]


def test_ack_after_consume_says_consumed(inbox: EnvelopeStore, dsn: str) -> None:
    """Courier §11 (lease errors are 409s with a reason that says what happened): a lease
    whose envelope was consumed through `consume()` is refused as consumed, not as expired,
    and the consumed envelope holds no lease any more."""
    [eid] = fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1")
    inbox.consume("w1", eid)
    for call in (inbox.ack, inbox.nack, inbox.heartbeat):
        with pytest.raises(LeaseLost) as raised:
            call(lease.token)
        message = str(raised.value)
        assert "consumed" in message and "expired" not in message, message
    assert query(dsn, "SELECT consumed_at IS NOT NULL, lease_token FROM agentpost.envelopes"
                      " WHERE id = %s", (eid,)) == [(True, None)]
    assert inbox.stats("w1").in_flight == 0
    assert [s for s in inbox.signals(BOSS) if s.signal == "failed"] == []
