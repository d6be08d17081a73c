"""InboxEventTrigger's claims in two steps (sql/0045, sql/0046) against real Postgres, with
Airflow 3.3's own SharedStreamManager driving the trigger in ack mode.

`Triggerer` below is the part of Airflow's TriggerRunner that touches a shared stream
(run_trigger's subscribe / filter / bind_pending_event loop) plus its supervisor's part
(store each event, then report its seq through confirm_persisted on the next sync); the
manager, the ack bookkeeping and the advance pump are Airflow's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg2
from airflow.triggers.shared_stream import SharedStreamManager

import test_airflow_inbox  # noqa: F401  (sets up a private AIRFLOW_HOME before Airflow loads)
from agentpost.store import EnvelopeStore
from agentpost.store.event_claims import ClaimSession, drop_event_watchers, prune_event_claims
from agentpost.store.maintenance import maintain
from agentpost.triggers import InboxEventTrigger
from test_leases import send, topology

SYNC = 0.2  # the runner's state sync with its supervisor (about 1 s in Airflow)


class Triggerer:
    """One triggerer: runs event triggers on a real SharedStreamManager; its supervisor
    "stores" each event (records its envelope id) and confirms it `SYNC` s later, unless
    `storing` is off (the process dies before the supervisor stores anything)."""

    def __init__(self, storing: bool = True) -> None:
        self.manager = SharedStreamManager(ack_timeout=300.0)
        self.storing = storing
        self.stored: list[str] = []
        self.yielded: list[str] = []
        self._outbound: list[tuple[str, int | None]] = []
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self, trigger: InboxEventTrigger, trigger_id: int) -> None:
        self._tasks.append(asyncio.create_task(self._run_trigger(trigger, trigger_id)))
        if len(self._tasks) == 1:
            self._tasks.append(asyncio.create_task(self._supervisor()))

    async def _run_trigger(self, trigger: InboxEventTrigger, trigger_id: int) -> None:
        key = trigger.shared_stream_key()
        raw = self.manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        try:
            async for event in trigger.filter_shared_stream(raw):
                seq = self.manager.bind_pending_event(trigger_id=trigger_id, key=key)
                self.yielded.append(event.payload["envelope_id"])
                self._outbound.append((event.payload["envelope_id"], seq))
        finally:
            await self.manager.unsubscribe(trigger_id, key)

    async def _supervisor(self) -> None:
        while True:
            await asyncio.sleep(SYNC)
            if not self.storing:
                continue
            batch, self._outbound = self._outbound, []
            self.stored.extend(envelope_id for envelope_id, _ in batch)
            await asyncio.sleep(SYNC)  # the confirmation comes back with the next sync
            self.manager.confirm_persisted(seq for _, seq in batch if seq is not None)

    async def stop(self) -> None:
        """Stop like a killed process: nothing more is stored or confirmed, the producer's
        database session ends (its advisory lock with it)."""
        self.storing = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.manager.stop_all()
        await asyncio.sleep(0.2)  # the producer's session closes from a short-lived thread


def watcher(dsn: str, **kwargs: Any) -> InboxEventTrigger:
    return InboxEventTrigger("w1", watcher="dag:a", poll_interval=0.5, min_interval=0.05,
                             dsn=dsn, **kwargs)


async def until(check: Callable[[], bool], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def claims(dsn: str) -> list[tuple[str, bool, int]]:
    """(envelope id, confirmed, reports) of every claim, in claim order."""
    conn = psycopg2.connect(dsn.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT envelope_id, confirmed_at IS NOT NULL, reports"
                        " FROM agentpost.event_claims ORDER BY claimed_at, envelope_id")
            return cur.fetchall()
    finally:
        conn.close()


def started(dsn: str) -> Callable[[], Awaitable[None]]:
    """Make the watcher's first claim (arrivals count from it) with a session closed at
    once."""
    async def go() -> None:
        session = ClaimSession(dsn, "dag:a", "w1")
        try:
            assert session.claim()[0] == []
        finally:
            session.close()
    return go


def claim_soon(session: ClaimSession, max: int = 1, within: float = 5.0
               ) -> tuple[list[str], int]:
    """The first non-empty claim within `within` s (a closed session's backend lets go of
    its lock a moment after the client closed)."""
    deadline = time.monotonic() + within
    while True:
        ids, owner = session.claim(max=max)
        if ids or time.monotonic() > deadline:
            return ids, owner
        time.sleep(0.05)


def test_an_arrival_whose_event_was_never_stored_is_reported_again(
        store: EnvelopeStore, dsn: str) -> None:
    """No lost run: a triggerer killed after yielding an arrival's event and before Airflow
    stored it leaves the claim pending; the next triggerer reports the arrival again (the
    old code had made the claim final before the yield, and nobody reported it again)."""
    topology(store, ["w1"])

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        await started(dsn)()
        first = Triggerer(storing=False)
        first.start(watcher(dsn), 1)
        sent = send(store, "w1", "m")
        await until(lambda: first.yielded == [sent])
        await first.stop()  # killed before the supervisor stored the event
        second = Triggerer()
        second.start(watcher(dsn), 1)
        await until(lambda: second.stored == [sent])
        await until(lambda: claims(dsn) == [(sent, True, 2)])
        await second.stop()
        return [sent], first.stored, second.stored

    sent, lost, stored = asyncio.run(scenario())
    assert lost == [] and stored == sent


def test_a_pending_claim_of_a_live_owner_is_reported_again_after_the_timeout(
        store: EnvelopeStore, dsn: str) -> None:
    """A claim whose confirmation never comes while its owner's session lives (a host lost
    without closing its connection) is left alone until `claim_timeout`, then another
    instance reports it."""
    topology(store, ["w1"])

    async def scenario() -> None:
        await started(dsn)()
        stuck = Triggerer(storing=False)
        stuck.start(watcher(dsn), 1)
        sent = send(store, "w1", "m")
        await until(lambda: stuck.yielded == [sent])
        other = Triggerer()
        other.start(watcher(dsn, claim_timeout=3.0), 2)
        await asyncio.sleep(1.5)
        assert other.yielded == [], "a live owner's pending claim was taken before its timeout"
        await until(lambda: other.stored == [sent], within=10.0)
        await until(lambda: claims(dsn) == [(sent, True, 2)])
        await other.stop()
        await stuck.stop()

    asyncio.run(scenario())


def test_a_confirmed_claim_is_never_reported_again_also_after_pruning(
        store: EnvelopeStore, dsn: str) -> None:
    """Once Airflow stored an arrival's event its claim is final: no later instance reports
    it, before or after maintenance pruned the claims; arrivals after pruning still are."""
    topology(store, ["w1"])

    async def run_until_stored(expected: list[str]) -> list[str]:
        triggerer = Triggerer()
        triggerer.start(watcher(dsn), 1)
        await until(lambda: len(triggerer.stored) >= len(expected))
        await until(lambda: all(c for _, c, _ in claims(dsn)) and len(claims(dsn)) > 0)
        await asyncio.sleep(1.0)  # time enough to report anything twice
        await triggerer.stop()
        return triggerer.stored

    asyncio.run(started(dsn)())
    sent = [send(store, "w1", f"m{i}") for i in range(3)]
    assert asyncio.run(run_until_stored(sent)) == sent
    assert [c[0] for c in claims(dsn)] == sent
    assert prune_event_claims(store, margin=0) == 3
    assert claims(dsn) == []
    assert "event_claims_pruned" in maintain(store, vacuum=False)
    late = send(store, "w1", "after pruning")
    assert asyncio.run(run_until_stored([late])) == [late]


def test_two_live_triggerers_never_report_one_arrival_twice(
        store: EnvelopeStore, dsn: str) -> None:
    """Two triggerers running the same watcher at once (Airflow reassigning a trigger
    while the old triggerer still runs) split the arrivals: a pending claim keeps the other
    off, even while confirmations are slow; every arrival is reported, once."""
    topology(store, ["w1"])

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        await started(dsn)()
        a, b = Triggerer(), Triggerer()
        a.start(watcher(dsn), 1)
        b.start(watcher(dsn), 1)
        sent = [send(store, "w1", f"m{i}") for i in range(12)]
        await until(lambda: len(a.stored) + len(b.stored) >= len(sent))
        await asyncio.sleep(1.5)  # anything reported twice would be by now
        await a.stop()
        await b.stop()
        return sent, a.yielded, b.yielded

    sent, from_a, from_b = asyncio.run(scenario())
    assert sorted(from_a + from_b) == sorted(sent)
    assert all(confirmed and reports == 1 for _, confirmed, reports in claims(dsn))


def test_pending_claims_belong_to_a_live_session(store: EnvelopeStore, dsn: str) -> None:
    """The claim query's rules, on sessions: another session never takes a live owner's
    pending claim (before the timeout); once the owner's session ends it does; a confirmed
    claim is taken by nobody and cannot be released."""
    topology(store, ["w1"])
    a, b = ClaimSession(dsn, "dag:a", "w1"), ClaimSession(dsn, "dag:a", "w1")
    try:
        a.claim()
        sent = send(store, "w1", "m")
        ids, owner_a = a.claim()
        assert ids == [sent]
        assert b.claim()[0] == [] and a.claim()[0] == []  # its own is not taken again
        a.close()  # its backend ends (and drops the lock) a moment later
        ids, owner_b = claim_soon(b)
        assert ids == [sent] and owner_b != owner_a
        assert b.confirm([sent]) == 1
        assert b.release([sent], owner_b) == 0
        b.close()
        assert ClaimSession(dsn, "dag:a", "w1").claim()[0] == []
    finally:
        a.close()
        b.close()


def test_pruning_keeps_the_claims_table_small_and_stops_at_a_gap(
        store: EnvelopeStore, dsn: str) -> None:
    """Over many arrivals the table holds only what could still be reported: confirmed
    claims behind the cursor go; a pending claim stops the cursor, so it and what follows
    stay, and it is still reported again once its owner is gone; nothing pruned is ever
    reported again."""
    topology(store, ["w1"])
    session = ClaimSession(dsn, "dag:a", "w1")
    try:
        session.claim()
        for round in range(6):
            for i in range(50):
                send(store, "w1", f"m{round}.{i}")
            ids, _ = session.claim(max=100)
            assert len(ids) == 50
            session.confirm(ids)
            assert prune_event_claims(store, margin=0) == 50
            assert claims(dsn) == []
        gap = send(store, "w1", "left pending")
        assert session.claim()[0] == [gap]
        after = [send(store, "w1", f"after {i}") for i in range(3)]
        ids, _ = session.claim(max=10)
        session.confirm(ids)
        assert prune_event_claims(store, margin=0) == 0
        assert sorted(c[0] for c in claims(dsn)) == sorted([gap, *after])
    finally:
        session.close()
    other = ClaimSession(dsn, "dag:a", "w1")
    try:
        assert claim_soon(other, max=500)[0] == [gap]  # only the orphaned one, never a pruned one
        other.confirm([gap])
        assert prune_event_claims(store, margin=0) == 4 and claims(dsn) == []
    finally:
        other.close()


def test_idle_watchers_are_dropped_only_when_asked(store: EnvelopeStore, dsn: str) -> None:
    """maintain() never drops a watcher by itself; with drop_watchers_idle it drops those
    no trigger asked for that long, claims included, and keeps the others."""
    topology(store, ["w1"])
    for name in ("dag:old", "dag:new"):
        session = ClaimSession(dsn, name, "w1")
        session.claim()
        session.close()
    conn = psycopg2.connect(dsn.replace("postgresql+psycopg2://", "postgresql://"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("UPDATE agentpost.event_watchers SET seen_at = now() - interval '40 days'"
                    " WHERE watcher = 'dag:old'")
    assert "event_watchers_dropped" not in maintain(store, vacuum=False)
    assert drop_event_watchers(store, idle=100 * 86400) == []
    done = maintain(store, vacuum=False, drop_watchers_idle=30 * 86400)
    assert done["event_watchers_dropped"] == ["dag:old"]
    with conn.cursor() as cur:
        cur.execute("SELECT watcher FROM agentpost.event_watchers")
        assert cur.fetchall() == [("dag:new",)]
    conn.close()
