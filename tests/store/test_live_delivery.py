"""Live delivery and credits (Courier §6.2, §14; issue 3, "Live delivery" and "Credits").

A send commits one NOTIFY per receiving inbox (coalesced over a batch); consumers wait on
LISTEN with polling as the fallback, so how soon a waiting consumer sees an envelope does not
depend on its poll interval. Subscribers get nothing while their credit is 0, each envelope
handed over spends one credit, and several subscribers at credit 1 share a stream fairly.

The only timing assertions are generous upper bounds, far below the 30 s poll interval the
subscribers are given, on "woke up without waiting for the poll interval".
"""

from __future__ import annotations

import asyncio
import select
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import Lease
from agentpost.store import EnvelopeStore
from agentpost.store.consumer import Subscriber
from agentpost.store.listen import INBOX_CHANNEL, AsyncListener, Listener
from dbtools import connect, rows
from test_leases import BOSS, assert_trail_ok, events, fill, send, topology

POLL = 30.0  # the subscribers' poll interval: any wake-up well before it came from NOTIFY
WAKE_BOUND = 6.0  # generous upper bound for "woke up on the notification"


@pytest.fixture
def inboxes(store: EnvelopeStore) -> Iterator[EnvelopeStore]:
    """boss -> w1, w2; the trail must still verify at the end."""
    topology(store, ["w1", "w2"])
    yield store
    assert_trail_ok(store)


@contextmanager
def raw_listen(dsn: str) -> Iterator[Any]:
    """A plain psycopg2 connection LISTENing on the inbox channel."""
    conn = connect(dsn, "agentpost-tests-listen")
    try:
        rows(conn, f"LISTEN {INBOX_CHANNEL}")
        yield conn
    finally:
        conn.close()


def notifications(conn: Any, *, first_within: float = 5.0, settle: float = 0.7) -> list[str]:
    """Payloads of the notifications that arrive: wait up to `first_within` for one, then
    `settle` seconds more for any that follow."""
    got: list[str] = []
    deadline = time.monotonic() + first_within
    settling = False
    while True:
        conn.poll()
        while conn.notifies:
            note = conn.notifies.pop(0)
            assert note.channel == INBOX_CHANNEL
            got.append(note.payload)
        if got and not settling:
            settling, deadline = True, time.monotonic() + settle
        left = deadline - time.monotonic()
        if left <= 0:
            return got
        select.select([conn], [], [], left)


class Background:
    """Runs `fn` in a thread and keeps its result or exception, and when it finished."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # re-raised by join()
            self.error = exc
        finally:
            self.finished_at = time.monotonic()

    def join(self, timeout: float) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result


# -- NOTIFY ------------------------------------------------------------------------------------


def test_a_send_notifies_the_receiving_inbox(inboxes: EnvelopeStore, dsn: str) -> None:
    """Issue 3, Live delivery: a send commits a NOTIFY for the receiving inbox (payload: the
    workspace id) and none for other inboxes."""
    with raw_listen(dsn) as conn:
        send(inboxes, "w1", "hello")
        got = notifications(conn)
    assert got.count("w1") == 1, got
    assert "w2" not in got


def test_a_batch_of_500_to_one_inbox_is_one_notification(inboxes: EnvelopeStore,
                                                         dsn: str) -> None:
    """Issue 3, Live delivery: notifications are coalesced, never one NOTIFY per row in a
    batch: send_many of 500 envelopes to one inbox gives a raw LISTEN connection exactly one
    notification for it."""
    with raw_listen(dsn) as conn:
        fill(inboxes, "w1", 500)
        got = notifications(conn, settle=1.5)
    assert got.count("w1") == 1, f"{got.count('w1')} notifications for one batch"


def test_a_batch_to_two_inboxes_notifies_each_once(inboxes: EnvelopeStore, dsn: str) -> None:
    """Issue 3, Live delivery: one notification per receiving inbox of a batch."""
    with raw_listen(dsn) as conn:
        inboxes.send_many([{"from": BOSS, "to": ws, "type": "directive", "content": str(i)}
                           for i in range(100) for ws in ("w1", "w2")])
        got = notifications(conn, settle=1.5)
    assert (got.count("w1"), got.count("w2")) == (1, 1), got


def test_nack_and_expiry_notify_the_inbox(inboxes: EnvelopeStore, dsn: str) -> None:
    """courier-api, Live delivery: the channel is notified whenever an inbox gains leasable
    envelopes: a nack and an expired lease (returned by the sweep) as well as a delivery."""
    fill(inboxes, "w1", 2)
    first, second = inboxes.lease("w1", max=2, ttl=0.3)
    with raw_listen(dsn) as conn:
        inboxes.nack(first.token)
        assert notifications(conn).count("w1") == 1
        time.sleep(0.4)
        inboxes.expire_leases()
        assert notifications(conn).count("w1") == 1
    assert second.envelope_id in {lease.envelope_id for lease in inboxes.lease("w1", max=5)}


# -- Listener ----------------------------------------------------------------------------------


def test_listener_wakes_for_its_workspaces_only(inboxes: EnvelopeStore, dsn: str) -> None:
    """Issue 3, Live delivery: a Listener for w1 reports w1's deliveries, not w2's."""
    with Listener(dsn, ["w1"]) as listener:
        assert listener.wait(0.05) == set()
        send(inboxes, "w2", "not for you")
        assert listener.wait(0.5) == set()
        send(inboxes, "w1", "for you")
        assert listener.wait(WAKE_BOUND) == {"w1"}


def test_listener_survives_termination_of_its_connection(inboxes: EnvelopeStore,
                                                         dsn: str) -> None:
    """Issue 3, Live delivery: a Listener survives pg_terminate_backend of its connection and
    reports "*" (re-check everything: notifications may have been missed); afterwards it
    hears notifications again."""
    admin = connect(dsn)
    try:
        with Listener(dsn, ["w1"]) as listener:
            assert listener.wait(0.05) == set()
            killed = rows(admin, """
                SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'agentpost-listen'""")
            assert killed, "the listener's backend was not found"
            send(inboxes, "w1", "while reconnecting")  # lost with the connection, or not
            woke = listener.wait(WAKE_BOUND)
            assert "*" in woke, woke
            listener.wait(0.3)  # the delivery's own notification, if it was not lost
            send(inboxes, "w1", "after")
            assert listener.wait(WAKE_BOUND) == {"w1"}
    finally:
        admin.close()


def test_async_listener_wakes_without_blocking_the_loop(inboxes: EnvelopeStore,
                                                        dsn: str) -> None:
    """Issue 3, Live delivery: AsyncListener's `await wait()` returns on the notification and
    lets other tasks run meanwhile."""

    async def scenario() -> tuple[set[str], int]:
        listener = AsyncListener(dsn, ["w1"])
        try:
            assert await listener.wait(0.05) == set()
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            tick_task = asyncio.create_task(ticker())
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, lambda: send(inboxes, "w1", "async"))
            woke = await listener.wait(WAKE_BOUND)
            tick_task.cancel()
            return woke, ticks
        finally:
            listener.close()

    woke, ticks = asyncio.run(scenario())
    assert woke == {"w1"}
    assert ticks >= 5, "the event loop was blocked while waiting"


# -- Subscriber: waking up ---------------------------------------------------------------------


def _take_in_background(store: EnvelopeStore, timeout: float) -> tuple[Subscriber, Background]:
    sub = Subscriber(store, "w1", ttl=30.0, poll_interval=POLL)
    sub.grant(1)
    return sub, Background(lambda: sub.take(timeout=timeout))


def test_subscriber_wakes_on_a_send_not_on_its_poll_interval(inboxes: EnvelopeStore) -> None:
    """Issue 3, Live delivery: a Subscriber with poll_interval=30 receives a sent envelope
    within a couple of seconds (it waits on LISTEN, polling is only the fallback)."""
    sub, waiting = _take_in_background(inboxes, timeout=20)
    try:
        time.sleep(1.0)  # the subscriber is waiting now
        sent_at = time.monotonic()
        eid = send(inboxes, "w1", "wake up")
        leases = waiting.join(25)
        assert [lease.envelope_id for lease in leases] == [eid]
        assert waiting.finished_at is not None
        assert waiting.finished_at - sent_at < WAKE_BOUND, "woke by polling, not by NOTIFY"
    finally:
        sub.close()


def test_subscriber_does_not_miss_a_send_racing_its_first_wait(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 3, Live delivery: no lost wake-up. An envelope delivered between a fresh
    subscriber's empty look at the inbox and its first wait must still wake it: here a
    concurrent sender (another store) delivers right after the subscriber's first (empty)
    lease() call returns."""
    other = EnvelopeStore(dsn)
    real_lease = inboxes.lease
    raced: list[str] = []

    def lease_then_race(*args: Any, **kwargs: Any) -> list[Lease]:
        got = real_lease(*args, **kwargs)
        if not got and not raced:
            raced.append(send(other, "w1", "in the window"))
        return got

    monkeypatch.setattr(inboxes, "lease", lease_then_race)
    sub = Subscriber(inboxes, "w1", ttl=30.0, poll_interval=POLL)
    try:
        sub.grant(1)
        started = time.monotonic()
        leases = sub.take(timeout=10)
        assert raced and [lease.envelope_id for lease in leases] == raced
        assert time.monotonic() - started < WAKE_BOUND, \
            "the subscriber slept through a delivery made before it started listening"
    finally:
        sub.close()
        other.close()


def _seconds_until(moment: datetime) -> float:
    return (moment - datetime.now(UTC)).total_seconds()


def test_subscriber_wakes_when_a_dead_consumers_lease_expires(inboxes: EnvelopeStore,
                                                              dsn: str) -> None:
    """Issue 3, Live delivery ("delivery latency does not depend on a poll interval") with
    Leases ("lease expiry returns it"): the envelope of a consumer that died holding a 1 s
    lease reaches a subscriber waiting with poll_interval=30 soon after the expiry, not at
    its next poll (nor at the end of its 10 s wait)."""
    [eid] = fill(inboxes, "w1", 1)
    with EnvelopeStore(dsn) as dead:
        [abandoned] = dead.lease("w1", ttl=1.0)  # and never acked
    sub, waiting = _take_in_background(inboxes, timeout=10)
    expiry = time.monotonic() + _seconds_until(abandoned.expires_at)
    try:
        leases = waiting.join(20)
        assert [lease.envelope_id for lease in leases] == [eid]
        assert leases[0].attempt == 2
        assert waiting.finished_at is not None
        assert waiting.finished_at - expiry < WAKE_BOUND, \
            f"redelivered {waiting.finished_at - expiry:.1f} s after the lease expired"
    finally:
        sub.close()


def test_subscriber_wakes_when_a_nack_delay_runs_out(inboxes: EnvelopeStore) -> None:
    """Issue 3, Live delivery with Leases ("nack(token, delay) returns it ... after delay"):
    a subscriber waiting with poll_interval=30 gets an envelope nacked with a 1 s delay soon
    after the delay, not at its next poll (nor at the end of its 10 s wait)."""
    [eid] = fill(inboxes, "w1", 1)
    [lease] = inboxes.lease("w1")
    inboxes.nack(lease.token, delay=1.0)
    due = time.monotonic() + 1.0
    sub, waiting = _take_in_background(inboxes, timeout=10)
    try:
        leases = waiting.join(20)
        assert [x.envelope_id for x in leases] == [eid]
        assert waiting.finished_at is not None
        assert waiting.finished_at - due < WAKE_BOUND, \
            f"redelivered {waiting.finished_at - due:.1f} s after the nack's delay ran out"
    finally:
        sub.close()


# -- credits -----------------------------------------------------------------------------------


def test_nothing_is_pushed_without_credit(inboxes: EnvelopeStore) -> None:
    """Issue 3, Credits (Courier §6.2): subscribers start with credit 0 and nothing is pushed
    to them while it is 0: take() leases nothing, even with envelopes waiting."""
    fill(inboxes, "w1", 3)
    with Subscriber(inboxes, "w1", poll_interval=0.1) as sub:
        assert sub.credit == 0
        assert sub.take(timeout=0.5) == []
    assert events(inboxes, "envelope_leased") == []
    assert inboxes.stats("w1").in_flight == 0


def test_each_delivery_spends_one_credit(inboxes: EnvelopeStore) -> None:
    """Issue 3, Credits: each delivery spends one credit; at 0 the subscriber stops getting
    envelopes until it grants more."""
    sent = fill(inboxes, "w1", 5)
    with Subscriber(inboxes, "w1", poll_interval=0.1) as sub:
        assert sub.grant(2) == 2
        first = sub.take(timeout=1)
        assert [x.envelope_id for x in first] == sent[:2] and sub.credit == 0
        assert sub.take(timeout=0.3) == []
        assert sub.grant(10) == 10
        rest = sub.take(timeout=1)
        assert [x.envelope_id for x in rest] == sent[2:] and sub.credit == 7
        for lease in first + rest:
            sub.ack(lease)
    assert len(events(inboxes, "envelope_leased")) == 5
    assert len(events(inboxes, "envelope_consumed")) == 5


@pytest.mark.parametrize("credit", [-1, 1.5, True, "3", None])
def test_grant_takes_a_whole_number_of_credits(inboxes: EnvelopeStore, credit: Any) -> None:
    """Courier §11: a bad credit frame is invalid input and changes nothing."""
    with Subscriber(inboxes, "w1") as sub:
        with pytest.raises(InvalidInput):
            sub.grant(credit)
        assert sub.credit == 0


def test_subscribers_at_credit_one_share_a_stream_fairly(dsn: str) -> None:
    """Issue 3, Credits and Courier §14: with N subscribers at credit 1 on one stream,
    delivery is fair and no subscriber starves. Four subscribers (a store each) grant one
    credit at a time while a producer sends; the spread of what each got is measured: every
    one gets at least a quarter of its fair share, and each envelope is acked exactly once."""
    n_subs, total = 4, 240
    with EnvelopeStore(dsn) as setup:
        topology(setup)
    done = threading.Event()
    got: list[list[str]] = [[] for _ in range(n_subs)]

    def subscriber(slot: int) -> None:
        with EnvelopeStore(dsn) as store, Subscriber(store, "w1", ttl=30.0,
                                                      poll_interval=POLL) as sub:
            while not done.is_set():
                if sub.credit == 0:
                    sub.grant(1)
                for lease in sub.take(timeout=0.5):
                    time.sleep(0.002)  # a little work
                    sub.ack(lease)
                    got[slot].append(lease.envelope_id)
                    if sum(map(len, got)) >= total:
                        done.set()

    workers = [Background(lambda i=i: subscriber(i)) for i in range(n_subs)]
    with EnvelopeStore(dsn) as producer:
        for batch in range(total // 8):
            fill(producer, "w1", 8, prefix=f"b{batch}-")
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        for worker in workers:
            worker.join(30)
        counts = [len(x) for x in got]
        everything = [eid for x in got for eid in x]
        assert len(everything) == len(set(everything)) == total, counts
        fair = total / n_subs
        spread = (min(counts), statistics.pstdev(counts), max(counts))
        print(f"fairness: counts {counts}, (min, stdev, max) = {spread}")
        assert min(counts) >= fair / 4, f"a subscriber starved: counts {counts}, " \
                                        f"(min, stdev, max) = {spread}"
        assert len(events(producer, "envelope_consumed", ws="w1")) == total
        assert_trail_ok(producer)
