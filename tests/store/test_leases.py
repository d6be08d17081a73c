"""Leases on an inbox (Courier §6.3, §6.4, §11; issue 3, "Leases"), on a real database.

What is pinned here: `lease()` claims in inbox order behind the blocking gate; concurrent
consumers never share a live lease; ack completes, nack and expiry return to the tail of the
priority level; stale tokens are refused with LeaseLost (the 409 of §11) and change nothing;
the fourth return dead-letters; heartbeats extend; every step is a trail event; enqueue is
idempotent by envelope id. A hypothesis test drives random interleavings of lease, ack, nack,
heartbeat and expiry against a model of the inbox.

The helpers at the top (topology, fill, events, wait_past) are shared with the other lease
test modules.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from agentpost.protocol.errors import Conflict, InvalidInput, LeaseLost
from agentpost.protocol.leases import DEAD_LETTER_REASON, Lease, stream_of
from agentpost.protocol.models import Status, TrailEvent
from agentpost.store import EnvelopeStore

BOSS = "boss"
LONG_TTL = 60.0  # never runs out within a test
SHORT_TTL = 0.3  # runs out within a test


# -- helpers shared with test_live_delivery, test_lease_soak and test_pg_restart ----------------


def topology(store: EnvelopeStore, workers: Iterable[str] = ("w1",)) -> None:
    """A coordinator `boss` with worker children: boss may send `directive` to each."""
    store.create_workspace("coordinator", workspace_id=BOSS)
    for ws in workers:
        store.create_workspace("worker", parent=BOSS, workspace_id=ws)


def fill(store: EnvelopeStore, ws: str, n: int, *, priority: str = "normal",
         prefix: str = "m") -> list[str]:
    """Deliver `n` directives from boss to `ws` in one batch; their ids in send order."""
    results = store.send_many([{"from": BOSS, "to": ws, "type": "directive",
                                "content": f"{prefix}{i}", "priority": priority}
                               for i in range(n)])
    assert all(r.status is Status.ACKNOWLEDGED for r in results), results
    return [r.envelope_id for r in results]


def send(store: EnvelopeStore, ws: str, content: str, priority: str = "normal") -> str:
    result = store.send(BOSS, ws, "directive", content, priority=priority)
    assert result.accepted, result
    return result.envelope_id


def events(store: EnvelopeStore, event: str, *, ws: str | None = None,
           envelope_id: str | None = None) -> list[TrailEvent]:
    return store.trail(workspace_id=ws, envelope_id=envelope_id, event=event)


def wait_past(leases: Iterable[Lease], margin: float = 0.05) -> None:
    """Sleep until every lease's expiry has passed (the server's clock is the host's)."""
    latest = max(lease.expires_at for lease in leases)
    left = (latest - datetime.now(UTC)).total_seconds() + margin
    if left > 0:
        time.sleep(left)


def assert_trail_ok(store: EnvelopeStore) -> None:
    verification = store.verify_trail()
    assert verification.ok, verification


@pytest.fixture
def inbox(store: EnvelopeStore) -> Iterator[EnvelopeStore]:
    """The store with boss -> w1; the trail must still verify at the end of the test."""
    topology(store)
    yield store
    assert_trail_ok(store)


def ids(leases: Iterable[Lease]) -> list[str]:
    return [lease.envelope_id for lease in leases]


# -- claiming ------------------------------------------------------------------------------------


def test_lease_claims_in_inbox_order_and_describes_the_lease(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: lease(ws, max, ttl) claims up to max deliverable envelopes in inbox
    order (urgent before normal, creation order within a level) and returns leases with an
    opaque token, the attempt number (1 the first time) and the expiry."""
    normal = fill(inbox, "w1", 3, prefix="n")
    urgent = fill(inbox, "w1", 2, priority="urgent", prefix="u")
    before = datetime.now(UTC)
    first = inbox.lease("w1", max=3, ttl=30.0, holder="alice")
    assert ids(first) == [*urgent, normal[0]]
    for lease in first:
        assert isinstance(lease.token, str) and lease.token
        assert lease.attempt == 1
        assert lease.holder == "alice"
        assert lease.envelope.to == "w1" and lease.envelope.status is Status.ACKNOWLEDGED
        # expires ttl after the claim (generous bounds: the clock is shared, the load is not)
        assert before + timedelta(seconds=25) < lease.expires_at
        assert lease.expires_at < datetime.now(UTC) + timedelta(seconds=35)
    assert len({lease.token for lease in first}) == 3
    rest = inbox.lease("w1", max=10, ttl=30.0)
    assert ids(rest) == normal[1:], "a second consumer got a leased envelope or lost order"
    assert inbox.lease("w1", max=10) == []
    assert len(events(inbox, "envelope_leased", ws="w1")) == 5


def test_lease_max_bounds_the_claim(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: *up to* max envelopes; fewer when fewer are deliverable."""
    sent = fill(inbox, "w1", 4)
    assert ids(inbox.lease("w1", max=1)) == sent[:1]
    assert ids(inbox.lease("w1", max=2)) == sent[1:3]
    assert ids(inbox.lease("w1", max=50)) == sent[3:]


@pytest.mark.parametrize(("kwargs", "what"), [
    ({"max": 0}, "max"), ({"max": -1}, "max"), ({"max": True}, "max"), ({"max": 1.5}, "max"),
    ({"ttl": 0}, "ttl"), ({"ttl": -1.0}, "ttl"), ({"ttl": "30"}, "ttl"),
])
def test_lease_rejects_bad_arguments(inbox: EnvelopeStore, kwargs: dict[str, Any],
                                     what: str) -> None:
    """Courier §11: validation errors are 400s (InvalidInput), and nothing is leased."""
    fill(inbox, "w1", 1)
    with pytest.raises(InvalidInput, match=what):
        inbox.lease("w1", **kwargs)
    assert events(inbox, "envelope_leased") == []


def test_lease_respects_the_blocking_gate(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases ("respecting the blocking gate and channel order"): while a blocking
    envelope waits unconsumed, only it is leased, also while it is leased itself; what was sent
    behind it is delivered and leasable, in channel order, once it is acked."""
    early = fill(inbox, "w1", 2, prefix="early")
    gate = send(inbox, "w1", "gate", priority="blocking")
    late = send(inbox, "w1", "late")  # queued behind the gate (not delivered yet)
    [held] = inbox.lease("w1", max=10)
    assert held.envelope_id == gate
    assert inbox.lease("w1", max=10) == [], "the gate let another envelope through"
    inbox.nack(held.token)
    [again] = inbox.lease("w1", max=10)
    assert (again.envelope_id, again.attempt) == (gate, 2)
    assert inbox.lease("w1", max=10) == []
    inbox.ack(again.token)
    assert ids(inbox.lease("w1", max=10)) == [*early, late]


def test_concurrent_consumers_never_share_a_live_lease(dsn: str) -> None:
    """Issue 3, Leases: concurrent consumers never receive the same envelope while its lease
    is live. Four threads, each with a store of its own, lease until the inbox is empty."""
    with EnvelopeStore(dsn) as setup:
        topology(setup)
        sent = fill(setup, "w1", 160)
    got: list[list[Lease]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def consume(slot: int) -> None:
        try:
            with EnvelopeStore(dsn) as store:
                start.wait()
                while leases := store.lease("w1", max=1 + slot % 3, ttl=LONG_TTL,
                                            holder=f"c{slot}"):
                    got[slot].extend(leases)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    everything = [lease.envelope_id for leases in got for lease in leases]
    twice = [eid for eid, n in Counter(everything).items() if n > 1]
    assert twice == [], f"envelopes leased twice while their lease was live: {twice[:10]}"
    assert sorted(everything) == sorted(sent)
    assert {lease.attempt for leases in got for lease in leases} == {1}
    for slot, leases in enumerate(got):
        assert {lease.holder for lease in leases} <= {f"c{slot}"}
    with EnvelopeStore(dsn) as store:
        assert len(events(store, "envelope_leased", ws="w1")) == 160
        assert_trail_ok(store)


# -- ack, nack, expiry ---------------------------------------------------------------------------


def test_ack_completes_the_envelope(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: ack(token) completes it (consumed, never leased again), recorded as
    `envelope_consumed` in the receiving workspace's chain."""
    [eid] = fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1")
    inbox.ack(lease.token)
    env = inbox.get(eid)
    assert env.consumed_at is not None and env.status is Status.ACKNOWLEDGED
    assert inbox.lease("w1", max=10) == []
    [consumed] = events(inbox, "envelope_consumed", envelope_id=eid)
    assert consumed.chain == "w1"
    [leased] = events(inbox, "envelope_leased", envelope_id=eid)
    assert leased.chain == "w1" and leased.seq < consumed.seq
    assert inbox.stats("w1").acks == 1


def test_nack_returns_to_the_tail_of_its_priority_level(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: nack(token) returns it to the inbox at the tail of its priority level
    (Courier §6.3 "re-enqueues (tail)"), counted as a redelivery, recorded as `lease_nacked`."""
    normal = fill(inbox, "w1", 2, prefix="n")
    urgent = fill(inbox, "w1", 2, priority="urgent", prefix="u")
    [first] = inbox.lease("w1")
    assert first.envelope_id == urgent[0]
    returned = inbox.nack(first.token)
    assert returned.id == urgent[0] and returned.redeliveries == 1
    assert returned.status is Status.ACKNOWLEDGED and returned.consumed_at is None
    again = inbox.lease("w1", max=10)
    assert ids(again) == [urgent[1], urgent[0], *normal]
    assert [lease.attempt for lease in again] == [1, 2, 1, 1]
    [nacked] = events(inbox, "lease_nacked", envelope_id=urgent[0])
    assert nacked.chain == "w1"


def test_nack_of_a_normal_envelope_goes_behind_the_others(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: the tail of the *normal* level is behind every normal envelope,
    including ones delivered after the lease was taken."""
    sent = fill(inbox, "w1", 3)
    [lease] = inbox.lease("w1")
    newer = send(inbox, "w1", "newer")
    inbox.nack(lease.token)
    assert ids(inbox.lease("w1", max=10)) == [*sent[1:], newer, sent[0]]


def test_nack_with_delay_holds_the_envelope_back(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: nack(token, delay) returns it to the inbox after `delay` seconds; until
    then it is not leased, and the rest of the inbox is."""
    a, b = fill(inbox, "w1", 2)
    [lease] = inbox.lease("w1")
    inbox.nack(lease.token, delay=30)
    assert ids(inbox.lease("w1", max=10)) == [b]
    assert inbox.lease("w1", max=10) == []
    # a short delay runs out (polled, with a generous bound)
    [c] = fill(inbox, "w1", 1, prefix="c")
    [lease_c] = inbox.lease("w1")
    assert lease_c.envelope_id == c
    inbox.nack(lease_c.token, delay=0.4)
    deadline = time.monotonic() + 15
    while not (back := inbox.lease("w1", max=10)):
        assert time.monotonic() < deadline, "a nack with a 0.4 s delay never came back"
        time.sleep(0.1)
    assert ids(back) == [c] and back[0].attempt == 2
    assert a not in ids(back)


@pytest.mark.parametrize("delay", [-1, 86_401, "1", None])
def test_nack_rejects_a_bad_delay(inbox: EnvelopeStore, delay: Any) -> None:
    """Courier §11: a bad delay is a 400 and the lease stays live."""
    fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1")
    with pytest.raises(InvalidInput):
        inbox.nack(lease.token, delay=delay)
    inbox.ack(lease.token)


def test_expiry_returns_the_envelope_to_the_tail(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: lease expiry returns the envelope too (Courier §6.3 "Timeout: lease
    expiry triggers redelivery (re-enqueue tail)"), recorded as `lease_expired`; the next
    lease carries attempt 2."""
    a, b, c = fill(inbox, "w1", 3)
    [lease] = inbox.lease("w1", ttl=SHORT_TTL)
    assert lease.envelope_id == a
    wait_past([lease])
    again = inbox.lease("w1", max=10, ttl=LONG_TTL)
    assert ids(again) == [b, c, a]
    assert again[2].attempt == 2
    [expired] = events(inbox, "lease_expired", envelope_id=a)
    assert expired.chain == "w1"
    assert inbox.get(a).redeliveries == 1
    assert inbox.stats("w1").expiries == 1


def test_expire_leases_sweeps_every_inbox(store: EnvelopeStore) -> None:
    """Issue 3, Leases: expiry returns envelopes also when nobody leases that inbox again
    (expire_leases sweeps every inbox), each one a `lease_expired` event."""
    topology(store, ["w1", "w2"])
    fill(store, "w1", 1)
    fill(store, "w2", 2)
    leases = store.lease("w1", ttl=SHORT_TTL) + store.lease("w2", max=2, ttl=SHORT_TTL)
    wait_past(leases)
    store.expire_leases()
    assert len(events(store, "lease_expired", ws="w1")) == 1
    assert len(events(store, "lease_expired", ws="w2")) == 2
    assert store.stats("w2").in_flight == 0
    store.expire_leases()  # nothing more to do: no new events
    assert len(events(store, "lease_expired")) == 3
    assert_trail_ok(store)


def test_a_live_lease_is_not_expired(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: only expired leases return; a sweep leaves live ones alone."""
    fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1", ttl=LONG_TTL)
    inbox.expire_leases()
    assert inbox.lease("w1") == []
    inbox.ack(lease.token)
    assert events(inbox, "lease_expired") == []


# -- stale tokens ----------------------------------------------------------------------------


def _stale(store: EnvelopeStore, kind: str) -> tuple[str, str]:
    """A stale token of the given kind, and its envelope id."""
    [eid] = fill(store, "w1", 1)
    if kind == "expired":
        [lease] = store.lease("w1", ttl=SHORT_TTL)
        wait_past([lease])
    elif kind == "expired-and-swept":
        [lease] = store.lease("w1", ttl=SHORT_TTL)
        wait_past([lease])
        store.expire_leases()
    elif kind == "re-leased":
        [lease] = store.lease("w1", ttl=SHORT_TTL)
        wait_past([lease])
        [newer] = store.lease("w1", ttl=LONG_TTL)
        assert newer.attempt == 2 and newer.token != lease.token
    elif kind == "acked":
        [lease] = store.lease("w1")
        store.ack(lease.token)
    elif kind == "nacked":
        [lease] = store.lease("w1")
        store.nack(lease.token)
    elif kind == "nacked-and-re-leased":
        [lease] = store.lease("w1")
        store.nack(lease.token)
        store.lease("w1")
    else:  # dead-lettered
        for _ in range(4):
            [lease] = store.lease("w1")
            store.nack(lease.token)
        assert store.get(eid).status is Status.UNDELIVERABLE
    return lease.token, eid


def _snapshot(store: EnvelopeStore, eid: str) -> tuple[Any, ...]:
    stats = store.stats("w1")
    return (store.get(eid), len(store.trail()), stats.in_flight, stats.acks, stats.nacks,
            stats.redeliveries, stats.dead_lettered, len(store.signals(BOSS)))


STALE_KINDS = ["expired", "expired-and-swept", "re-leased", "acked", "nacked",
               "nacked-and-re-leased", "dead-lettered"]


@pytest.mark.parametrize("kind", STALE_KINDS)
@pytest.mark.parametrize("operation", ["ack", "ack_many", "nack", "heartbeat"])
def test_a_stale_token_is_refused_and_changes_nothing(inbox: EnvelopeStore, kind: str,
                                                      operation: str) -> None:
    """Issue 3, Leases: acking or nacking a stale token (expired, or the envelope re-leased
    since) is refused with a clear error (Courier §11: lease errors are 409s, here LeaseLost,
    a Conflict) and changes nothing: not the envelope, the trail, the counters or the
    signals. Heartbeats on stale tokens are refused the same way."""
    token, eid = _stale(inbox, kind)
    before = _snapshot(inbox, eid)
    calls = {"ack": lambda: inbox.ack(token), "ack_many": lambda: inbox.ack_many([token]),
             "nack": lambda: inbox.nack(token), "heartbeat": lambda: inbox.heartbeat(token)}
    with pytest.raises(LeaseLost) as raised:
        calls[operation]()
    assert isinstance(raised.value, Conflict)
    message = str(raised.value)
    assert "lease" in message.lower() and "\n" not in message, message
    assert _snapshot(inbox, eid) == before


@pytest.mark.parametrize("token", [
    "", "garbage", 42, None, b"bytes",
    "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz.e1", "12345678-1234-1234-1234-123456789012",
])
def test_a_malformed_token_is_invalid_input(inbox: EnvelopeStore, token: Any) -> None:
    """Courier §11: a token that is not one of ours is a 400, not a 409 or a crash."""
    for call in (inbox.ack, inbox.nack, inbox.heartbeat):
        with pytest.raises(InvalidInput):
            call(token)


def test_ack_many_is_all_or_nothing(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: a batch ack with one stale token is refused whole; the live leases in
    it stay live and can be acked afterwards."""
    fill(inbox, "w1", 3)
    live = inbox.lease("w1", max=2, ttl=LONG_TTL)
    stale, _ = _stale(inbox, "acked")
    with pytest.raises(LeaseLost):
        inbox.ack_many([lease.token for lease in live] + [stale])
    for lease in live:
        assert inbox.get(lease.envelope_id).consumed_at is None
    assert inbox.ack_many([lease.token for lease in live]) == 2
    assert inbox.ack_many([]) == 0
    assert len(events(inbox, "envelope_consumed")) == 3


# -- dead letters ----------------------------------------------------------------------------


def _assert_dead_lettered(store: EnvelopeStore, eid: str, leases: int) -> None:
    env = store.get(eid)  # still queryable
    assert env.status is Status.UNDELIVERABLE
    assert env.reason == DEAD_LETTER_REASON
    assert [e.id for e in store.dead_letters("w1")] == [eid]
    failed = [s for s in store.signals(BOSS) if s.signal == "failed" and s.ref == eid]
    assert len(failed) == 1 and failed[0].reason == DEAD_LETTER_REASON, failed
    assert store.lease("w1", max=10) == []
    [undeliverable] = events(store, "envelope_undeliverable", envelope_id=eid)
    assert undeliverable.chain == BOSS
    emitted = [e for e in events(store, "signal_emitted", ws=BOSS)
               if e.envelope_id == eid and e.seq > undeliverable.seq]
    assert emitted, "no signal_emitted for the failed signal in the sender's chain"
    assert len(events(store, "envelope_leased", envelope_id=eid)) == leases
    assert store.stats("w1").dead_lettered == 1


def test_fourth_nack_dead_letters(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: each return counts as a redelivery; after 3 redeliveries the envelope
    is dead-lettered: `envelope_undeliverable` with the reason, a `failed` signal to the
    sender, and it stays queryable."""
    [eid] = fill(inbox, "w1", 1)
    for attempt in range(1, 5):
        [lease] = inbox.lease("w1")
        assert lease.attempt == attempt
        env = inbox.nack(lease.token)
        if attempt < 4:
            assert env.status is Status.ACKNOWLEDGED and env.redeliveries == attempt
    assert env.status is Status.UNDELIVERABLE
    _assert_dead_lettered(inbox, eid, leases=4)
    assert len(events(inbox, "lease_nacked", envelope_id=eid)) == 4


def test_fourth_expiry_dead_letters(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: expiries count as redeliveries the same way; the expiry that exhausts
    them dead-letters the envelope (found by the sweep, with nobody leasing)."""
    [eid] = fill(inbox, "w1", 1)
    for attempt in range(1, 5):
        [lease] = inbox.lease("w1", ttl=SHORT_TTL)
        assert lease.attempt == attempt
        wait_past([lease])
    inbox.expire_leases()
    _assert_dead_lettered(inbox, eid, leases=4)
    assert len(events(inbox, "lease_expired", envelope_id=eid)) == 4


def test_mixed_returns_dead_letter_on_the_fourth(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: nacks and expiries add up (nack, expiry, nack, expiry)."""
    [eid] = fill(inbox, "w1", 1)
    for attempt in range(1, 5):
        if attempt % 2:
            [lease] = inbox.lease("w1")
            inbox.nack(lease.token)
        else:
            [lease] = inbox.lease("w1", ttl=SHORT_TTL)
            wait_past([lease])
    assert inbox.get(eid).status is Status.ACKNOWLEDGED  # the last expiry is not swept yet
    assert inbox.lease("w1", max=10) == []  # ... and leasing sweeps it
    _assert_dead_lettered(inbox, eid, leases=4)


def test_dead_letter_leaves_the_rest_of_the_inbox_alone(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: a dead letter is one envelope's fate; the others, leased meanwhile,
    are acked as usual."""
    first, *rest = fill(inbox, "w1", 3)
    held = inbox.lease("w1", max=10, ttl=LONG_TTL)
    assert ids(held) == [first, *rest]
    inbox.nack(held[0].token)
    for _ in range(3):
        [lease] = inbox.lease("w1", max=10)
        assert lease.envelope_id == first
        inbox.nack(lease.token)
    assert inbox.get(first).status is Status.UNDELIVERABLE
    assert inbox.ack_many([lease.token for lease in held[1:]]) == 2
    assert [e.id for e in inbox.dead_letters("w1")] == [first]
    assert all(inbox.get(eid).consumed_at is not None for eid in rest)


# -- heartbeats ------------------------------------------------------------------------------


def test_heartbeat_extends_a_live_lease(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: optional heartbeats extend a live lease: past the original expiry the
    envelope is neither returned nor leased to anyone else, and the original token acks."""
    [eid] = fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1", ttl=2.0)
    extended = inbox.heartbeat(lease.token, ttl=LONG_TTL)
    assert extended > lease.expires_at + timedelta(seconds=30)
    wait_past([lease], margin=0.2)
    assert inbox.lease("w1", max=10) == []
    inbox.expire_leases()
    assert events(inbox, "lease_expired") == []
    inbox.ack(lease.token)
    assert inbox.get(eid).consumed_at is not None


def test_heartbeat_can_shorten_the_lease(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases: a heartbeat sets the expiry to ttl from now; a short one lets the
    lease run out and the token goes stale."""
    fill(inbox, "w1", 1)
    [lease] = inbox.lease("w1", ttl=LONG_TTL)
    until = inbox.heartbeat(lease.token, ttl=SHORT_TTL)
    assert until < lease.expires_at
    time.sleep(SHORT_TTL + 0.1)
    with pytest.raises(LeaseLost):
        inbox.ack(lease.token)
    [again] = inbox.lease("w1")
    assert again.attempt == 2


# -- idempotency -----------------------------------------------------------------------------


def _courier(eid: str, payload: Any, **extra: Any) -> dict[str, Any]:
    return {"id": eid, "ts": "2025-10-18T19:55:00Z", "from": BOSS, "type": "directive",
            "payload": payload, **extra}


def test_enqueue_is_idempotent_by_envelope_id(inbox: EnvelopeStore, dsn: str) -> None:
    """Issue 3, Leases ("Idempotency") and Courier §6.4: an enqueue with an envelope id
    already seen is a no-op that returns the original, also after the original was consumed
    and from another store (durable, not a per-process cache)."""
    stream = stream_of("w1")
    first = inbox.enqueue(stream, _courier("e-91a", {"wave": "B"}))
    assert first.status is Status.ACKNOWLEDGED and not first.duplicate
    again = inbox.enqueue(stream, _courier("e-91a", {"wave": "C"}))
    assert again.duplicate and again.envelope_id == "e-91a"
    assert again.status is first.status
    [lease] = inbox.lease("w1", max=10)
    assert lease.envelope_id == "e-91a" and '"B"' in (lease.envelope.content or "")
    inbox.ack(lease.token)
    with EnvelopeStore(dsn) as other:
        late = other.enqueue(stream, _courier("e-91a", {"wave": "B"}))
        assert late.duplicate and late.envelope_id == "e-91a"
        assert other.lease("w1", max=10) == [], "a duplicate enqueue was delivered again"
    assert len(events(inbox, "envelope_created", envelope_id="e-91a")) == 1
    assert len(events(inbox, "envelope_delivered", envelope_id="e-91a")) == 1


def test_send_with_a_seen_envelope_id_is_a_no_op(inbox: EnvelopeStore) -> None:
    """Issue 3, Leases ("Idempotency"): the same holds for send(envelope_id=...)."""
    first = inbox.send(BOSS, "w1", "directive", "once", envelope_id="k-1")
    again = inbox.send(BOSS, "w1", "directive", "twice", envelope_id="k-1")
    assert again.duplicate and again.envelope_id == first.envelope_id == "k-1"
    assert [lease.envelope.content for lease in inbox.lease("w1", max=10)] == ["once"]


def test_enqueue_priority_header_orders_the_inbox(inbox: EnvelopeStore) -> None:
    """Courier §4.1 headers.priority maps onto the inbox's priority levels for leasing."""
    stream = stream_of("w1")
    inbox.enqueue(stream, _courier("e-n", {"k": 1}))
    inbox.enqueue(stream, _courier("e-u", {"k": 2}, headers={"priority": "urgent"}))
    assert ids(inbox.lease("w1", max=10)) == ["e-u", "e-n"]


# -- random interleavings (hypothesis) ---------------------------------------------------------


LEVELS = ("urgent", "normal")


@dataclass
class InboxModel:
    """What the inbox must look like: per priority level, groups of envelopes in order (an
    envelope nacked or swept alone is a group of one; several swept by one expiry sweep form a
    group whose inner order is not specified)."""

    level: dict[str, str]
    queues: dict[str, list[set[str]]] = field(default_factory=dict)
    leases: Counter[str] = field(default_factory=Counter)
    returns: Counter[str] = field(default_factory=Counter)
    expired: set[str] = field(default_factory=set)  # expired, not yet swept
    done: dict[str, str] = field(default_factory=dict)  # envelope -> "acked" | "dead"
    events: Counter[str] = field(default_factory=Counter)
    tokens: list[tuple[str, str]] = field(default_factory=list)  # (token, envelope)
    live: set[str] = field(default_factory=set)  # live tokens

    def __post_init__(self) -> None:
        self.queues = {lvl: [{eid} for eid, x in self.level.items() if x == lvl]
                       for lvl in LEVELS}

    def give_back(self, returned: set[str], how: str) -> None:
        """Return envelopes to the tail of their levels (one group per level), dead-lettering
        the ones whose fourth return this is."""
        for eid in returned:
            self.events[how] += 1
            self.returns[eid] += 1
            if self.returns[eid] > 3:
                event("an envelope was dead-lettered")
                self.done[eid] = "dead"
                self.events["envelope_undeliverable"] += 1
        for lvl in LEVELS:
            group = {e for e in returned if self.level[e] == lvl and e not in self.done}
            if group:
                self.queues[lvl].append(group)

    def sweep(self) -> None:
        swept, self.expired = self.expired, set()
        self.give_back(swept, "lease_expired")

    def claim(self, eid: str) -> None:
        """`eid` was leased: it must be at the head of the inbox."""
        head = next((q[0] for lvl in LEVELS if (q := self.queues[lvl])), None)
        assert head is not None and eid in head, f"leased {eid}, the head is {head}"
        head.discard(eid)
        for q in self.queues.values():
            if q and not q[0]:
                q.pop(0)
        self.leases[eid] += 1
        self.events["envelope_leased"] += 1

    def ready(self) -> int:
        return sum(len(g) for q in self.queues.values() for g in q)


# weighted towards leasing and returning, so that envelopes reach their fourth return
OP = st.one_of(
    st.tuples(st.just("lease"), st.integers(1, 3), st.booleans()),  # (max, abandon)
    st.tuples(st.just("nack"), st.integers(-3, -1)),  # one of the latest tokens
    st.tuples(st.sampled_from(["ack", "nack", "heartbeat"]), st.integers(0, 30)),
    st.tuples(st.just("sweep"), st.just(0)),
)


class Interleaving:
    """Runs one random sequence of operations on a fresh inbox and checks it step by step."""

    def __init__(self, store: EnvelopeStore, ws: str, levels: list[str]) -> None:
        self.store, self.ws = store, ws
        sent = store.send_many([{"from": BOSS, "to": ws, "type": "directive",
                                 "content": f"x{i}", "priority": p}
                                for i, p in enumerate(levels)])
        self.model = InboxModel(level={r.envelope_id: p for r, p in zip(sent, levels,
                                                                        strict=True)})

    def lease(self, n: int, abandon: bool) -> None:
        m = self.model
        if m.expired:
            event("lease() found expired leases to return")
        m.sweep()  # lease() returns this inbox's expired leases first
        got = self.store.lease(self.ws, max=n, ttl=0.05 if abandon else LONG_TTL)
        assert len(got) == min(n, m.ready()), (got, m.queues)
        for lease in got:
            m.claim(lease.envelope_id)
            assert lease.attempt == m.leases[lease.envelope_id]
            m.tokens.append((lease.token, lease.envelope_id))
            m.live.add(lease.token)
        if abandon and got:
            wait_past(got, margin=0.02)
            for lease in got:
                m.live.discard(lease.token)
                m.expired.add(lease.envelope_id)

    def settle(self, verb: str, i: int) -> None:
        m = self.model
        if not m.tokens:
            return
        token, eid = m.tokens[i % len(m.tokens)]
        if token not in m.live:
            event(f"a stale token was refused ({verb})")
            with pytest.raises(LeaseLost):
                getattr(self.store, verb)(token)
            return
        if verb == "heartbeat":
            assert self.store.heartbeat(token, ttl=LONG_TTL) > datetime.now(UTC)
            return
        m.live.discard(token)
        if verb == "ack":
            self.store.ack(token)
            m.done[eid] = "acked"
            m.events["envelope_consumed"] += 1
        else:
            m.sweep()  # whether nack sweeps first or not, the model must not guess
            self.store.expire_leases()
            self.store.nack(token)
            m.give_back({eid}, "lease_nacked")

    def run(self, ops: list[tuple[Any, ...]]) -> None:
        for op in ops:
            if op[0] == "lease":
                self.lease(op[1], op[2])
            elif op[0] == "sweep":
                self.store.expire_leases()
                self.model.sweep()
            else:
                self.settle(op[0], op[1])
        self.store.expire_leases()
        self.model.sweep()
        self.check_end()

    def check_end(self) -> None:
        m, store, ws = self.model, self.store, self.ws
        for eid in m.level:
            env = store.get(eid)
            fate = m.done.get(eid)
            if fate == "dead":
                assert env.status is Status.UNDELIVERABLE and env.reason == DEAD_LETTER_REASON
            else:
                assert env.status is Status.ACKNOWLEDGED
                assert (env.consumed_at is not None) == (fate == "acked"), (eid, fate)
        mine = set(m.level)
        counted: Counter[str] = Counter()
        for name in ("envelope_leased", "envelope_consumed", "lease_nacked", "lease_expired"):
            counted[name] = sum(1 for e in events(store, name, ws=ws) if e.envelope_id in mine)
        counted["envelope_undeliverable"] = sum(
            1 for e in events(store, "envelope_undeliverable", ws=BOSS) if e.envelope_id in mine)
        expected = {k: m.events[k] for k in counted}
        assert dict(counted) == expected
        stats = store.stats(ws)
        assert (stats.acks, stats.nacks, stats.expiries, stats.dead_lettered, stats.in_flight) \
            == (m.events["envelope_consumed"], m.events["lease_nacked"],
                m.events["lease_expired"], m.events["envelope_undeliverable"], len(m.live))
        # what is left leases in model order, once each
        rest = store.lease(ws, max=20, ttl=LONG_TTL)
        assert len(rest) == m.ready()
        for lease in rest:
            m.claim(lease.envelope_id)


def test_random_interleavings_keep_the_lease_invariants(dsn: str) -> None:
    """Issue 3, Leases, for all interleavings of lease / ack / nack / heartbeat / expiry on a
    small inbox: leases come in inbox order (tail of the level after a return), never two
    live leases on one envelope, attempts count leases, stale tokens are refused, the fourth
    return dead-letters, and the trail and the counters record exactly what happened."""
    counter = iter(range(10**6))
    with EnvelopeStore(dsn) as store:
        store.create_workspace("coordinator", workspace_id=BOSS)

        @settings(max_examples=150, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate, Phase.shrink],
                  suppress_health_check=[HealthCheck.too_slow])
        @given(levels=st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3),
               ops=st.lists(OP, max_size=24))
        @example(levels=["normal"], ops=[  # nack, expiry (swept by lease), nack, nack: dead
            ("lease", 1, False), ("nack", -1), ("lease", 1, True), ("lease", 1, False),
            ("nack", -1), ("lease", 1, False), ("nack", -1), ("ack", -1), ("lease", 1, False)])
        def run(levels: list[str], ops: list[tuple[Any, ...]]) -> None:
            ws = f"h{next(counter)}"
            store.create_workspace("worker", parent=BOSS, workspace_id=ws)
            Interleaving(store, ws, levels).run(ops)

        run()
        assert_trail_ok(store)


def test_leasable_counts_what_lease_would_take(store: EnvelopeStore) -> None:
    """`leasable(ws)` (what the Airflow trigger counts) follows lease()'s own conditions:
    live leases and nack delays are not counted, the blocking gate holds, and a lease that
    ran out counts again."""
    topology(store)
    fill(store, "w1", 3)
    assert store.leasable("w1") == 3
    [held] = store.lease("w1", max=1, ttl=SHORT_TTL)
    assert store.leasable("w1") == 2
    [delayed] = store.lease("w1", max=1, ttl=LONG_TTL)
    store.nack(delayed.token, delay=LONG_TTL)
    assert store.leasable("w1") == 1
    send(store, "w1", "gate", priority="blocking")
    assert store.leasable("w1") == 1  # only the blocking one while it waits
    time.sleep(SHORT_TTL + 0.1)
    assert store.leasable("w1") == 1  # the expired normal one is behind the gate
    [gate] = store.lease("w1", max=5, ttl=LONG_TTL)
    assert gate.envelope.priority == "blocking"
    store.ack(gate.token)
    assert store.leasable("w1") == 2  # the returned lease and the untouched envelope
    assert held.envelope_id in [x.envelope_id for x in store.lease("w1", max=5)]
