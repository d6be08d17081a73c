"""WACP envelope spec §11, the Standard rows: each test is named after the row it covers and
quotes it.

Everything runs against a real Postgres: the `store`/`dsn` fixtures of conftest.py give a fresh
migrated database per test and a store whose acknowledgment timeout is 0.2 s.

Two faults are simulated for real rather than mocked:

- an acknowledgment timeout: another session holds the receiver's trail-chain advisory lock
  (`agentpost._chain_key(<receiver>)`), which the delivery step waits on with
  lock_timeout = the acknowledgment timeout;
- a crash between the two phases of a send: a child process sends while that lock is held, and
  once its `envelope_created` is committed, the child is SIGKILLed and its backend terminated,
  so phase 2 never runs.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentpost.protocol.errors import (
    Conflict,
    Forbidden,
    InboxBlocked,
    InvalidTransition,
)
from agentpost.protocol.models import Right, RightType, TrailEvent
from agentpost.store import EnvelopeStore
from dbtools import connect
from dbtools import rows as query

WAIT_LIMIT = 20.0  # seconds: the bound of every poll in this module


# -- helpers ----------------------------------------------------------------------------------




class ChainLock:
    """Holds a trail chain's advisory lock from its own session: deliveries to that workspace
    cannot complete while it is held (they time out after the acknowledgment timeout)."""

    def __init__(self, dsn: str, chain: str) -> None:
        self.chain = chain
        self.conn = connect(dsn)
        (self.pid,) = query(self.conn, "SELECT pg_backend_pid()")[0]
        query(self.conn, "SELECT pg_advisory_lock(agentpost._chain_key(%s))", (chain,))
        self.held = True

    def release(self) -> None:
        if self.held:
            (released,) = query(self.conn, "SELECT pg_advisory_unlock(agentpost._chain_key(%s))",
                                (self.chain,))[0]
            assert released
            self.held = False

    def close(self) -> None:
        self.conn.close()  # ends the session, and with it a lock still held

    def __enter__(self) -> ChainLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def team(store: EnvelopeStore, workers: int = 1) -> None:
    """A coordinator `coord` with workers `w1`..`wN` as its children."""
    store.create_workspace("coordinator", workspace_id="coord")
    for i in range(1, workers + 1):
        store.create_workspace("worker", parent="coord", workspace_id=f"w{i}")


PATHS = {
    "idle": [],
    "active": ["active"],
    "blocked": ["active", "blocked"],
    "migrating": ["migrating"],
    "suspended": ["suspended"],
    "integrating": ["active", "integrating"],
    "closed": ["closed"],
    "failed": ["failed"],
}


def move(store: EnvelopeStore, ws: str, state: str) -> None:
    """Bring a fresh (idle) workspace to `state` through allowed transitions."""
    for step in PATHS[state]:
        store.transition(ws, step)
    assert store.workspace(ws).state == state


def events(store: EnvelopeStore, event: str, *, chain: str | None = None,
           envelope_id: str | None = None) -> list[TrailEvent]:
    return store.trail(workspace_id=chain, envelope_id=envelope_id, event=event)


def delivered_order(store: EnvelopeStore, ws: str) -> list[str]:
    """Envelope ids in the order the receiver's chain recorded their delivery."""
    return [e.envelope_id for e in sorted(events(store, "envelope_delivered", chain=ws),
                                          key=lambda e: e.seq)]


def acks(store: EnvelopeStore, ws: str) -> list[str]:
    """Refs of the acknowledged signals a workspace received, in emission order."""
    return [s.ref for s in store.signals(ws) if s.signal == "acknowledged"]


def ids(envelopes: Any) -> list[str]:
    return [e.id for e in envelopes]


def db_now(conn: Any) -> datetime:
    return query(conn, "SELECT clock_timestamp()")[0][0]


def wait_until(conn: Any, moment: datetime) -> None:
    """Sleep until the database clock has passed `moment` (bounded)."""
    deadline = time.monotonic() + WAIT_LIMIT
    while db_now(conn) <= moment:
        assert time.monotonic() < deadline, f"database clock never reached {moment}"
        time.sleep(0.02)


def failed_attempts(store: EnvelopeStore, envelope_id: str) -> list[TrailEvent]:
    return sorted(events(store, "envelope_delivery_failed", envelope_id=envelope_id),
                  key=lambda e: e.id)


# -- crash between the two phases of a send ---------------------------------------------------


def _send_and_hang(dsn: str, trail_key: str, drafts: list[dict[str, Any]]) -> None:
    """Child process: send with a long acknowledgment timeout, so phase 2 waits on the held
    chain lock until the parent kills this process."""
    with EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=600) as s:
        s.send_many(drafts)


def crash_between_phases(store: EnvelopeStore, dsn: str, receiver: str,
                         drafts: list[dict[str, Any]]) -> list[str]:
    """Send `drafts` (all to `receiver`) from a child process and kill it, and its database
    backend, after phase 1 committed and while phase 2 waits for the receiver's chain lock.
    Returns the ids of the envelopes left validated-but-undelivered, in creation order."""
    before = max((e.id for e in store.trail()), default=0)
    lock = ChainLock(dsn, receiver)
    watcher = connect(dsn)
    proc = multiprocessing.get_context("spawn").Process(
        target=_send_and_hang, args=(dsn, store.settings.trail_key, drafts), daemon=True)
    try:
        proc.start()
        deadline = time.monotonic() + WAIT_LIMIT
        while True:
            created = sorted(events(store, "envelope_created"), key=lambda e: e.id)
            created = [e for e in created if e.id > before]
            waiting = query(watcher, """
                SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'agentpost'
                   AND pid <> pg_backend_pid() AND %s = ANY (pg_blocking_pids(pid))""",
                            (lock.pid,))
            if len(created) == len(drafts) and len(waiting) == 1:
                backend = waiting[0][0]
                break
            assert proc.is_alive(), f"the sending child exited early ({proc.exitcode})"
            assert time.monotonic() < deadline, "the child never reached phase 2"
            time.sleep(0.05)
        proc.kill()
        proc.join(10)
        assert not proc.is_alive()
        assert query(watcher, "SELECT pg_terminate_backend(%s)", (backend,))[0][0]
        while query(watcher, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)):
            assert time.monotonic() < deadline, "the child's backend did not go away"
            time.sleep(0.02)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        lock.close()
        watcher.close()
    return [e.envelope_id for e in created]


def assert_gap(store: EnvelopeStore, receiver: str, gap: list[str]) -> None:
    """Each envelope passed validation (envelope_created is in the trail) and was never
    delivered: a crash gap (§7.2)."""
    for eid in gap:
        env = store.get(eid)
        assert env.status == "validated"
        assert env.attempts == 0
        assert len(events(store, "envelope_created", envelope_id=eid)) == 1
        assert events(store, "envelope_delivered", envelope_id=eid) == []
        assert events(store, "envelope_delivery_failed", envelope_id=eid) == []
    assert ids(store.queued(receiver)) == gap
    assert store.inbox(receiver) == []


def assert_delivered_once(store: EnvelopeStore, sender: str, receiver: str,
                          eids: list[str]) -> None:
    inbox = ids(store.inbox(receiver))
    for eid in eids:
        assert store.get(eid).status == "acknowledged"
        assert len(events(store, "envelope_delivered", envelope_id=eid)) == 1
        assert acks(store, sender).count(eid) == 1
        assert inbox.count(eid) == 1


# -- At-most-once delivery --------------------------------------------------------------------


def test_standard_at_most_once_delivery(store: EnvelopeStore) -> None:
    """At-most-once delivery (Standard): "Runtime MUST deduplicate envelopes by id before
    inbox placement. No duplicate deliveries."""
    team(store)
    res = store.send("coord", "w1", "directive", "do the thing")
    assert res.status == "acknowledged"
    eid = res.envelope_id
    first = store.get(eid)

    for _ in range(3):
        assert store.deliver(eid) == "duplicate"

    redelivered = events(store, "envelope_redelivered", envelope_id=eid)
    assert len(redelivered) == 3
    assert {e.chain for e in redelivered} == {"w1"}
    assert redelivered[0].body["envelope_id"] == eid
    assert (redelivered[0].body["from"], redelivered[0].body["to"]) == ("coord", "w1")
    assert len(events(store, "envelope_delivered", envelope_id=eid)) == 1
    assert acks(store, "coord") == [eid]
    assert ids(store.inbox("w1")) == [eid]
    again = store.get(eid)
    assert (again.status, again.delivered_at, again.attempts) == (
        first.status, first.delivered_at, first.attempts)

    # once consumed, a duplicate is still suppressed: it does not come back to the inbox
    store.consume("w1", eid)
    assert store.deliver(eid) == "duplicate"
    assert store.inbox("w1") == []
    assert len(events(store, "envelope_delivered", envelope_id=eid)) == 1
    assert acks(store, "coord") == [eid]
    assert store.verify_trail().ok


def test_standard_at_most_once_delivery_under_concurrent_attempts(store: EnvelopeStore) -> None:
    """At-most-once delivery (Standard): "Runtime MUST deduplicate envelopes by id before
    inbox placement. No duplicate deliveries." — delivery attempts racing the resume of a
    suspended workspace (transport retries, recovery, the resume itself) deliver each envelope
    exactly once."""
    team(store)
    move(store, "w1", "suspended")
    sent = [r.envelope_id for r in store.send_many(
        [{"from": "coord", "to": "w1", "type": "directive", "content": f"job {i}"}
         for i in range(12)])]
    assert ids(store.queued("w1")) == sent

    outcomes: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def hammer() -> None:
        try:
            start.wait(timeout=10)
            for _ in range(3):
                for eid in sent:
                    outcomes.append(store.deliver(eid))
                store.recover()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait(timeout=10)
    store.transition("w1", "active")
    for t in threads:
        t.join(WAIT_LIMIT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    assert delivered_order(store, "w1") == sent
    assert acks(store, "coord") == sent
    assert ids(store.inbox("w1")) == sent
    # every suppressed duplicate is on record, and nothing else is
    assert len(events(store, "envelope_redelivered", chain="w1")) == outcomes.count("duplicate")
    assert store.verify_trail().ok


# -- Redelivery on timeout --------------------------------------------------------------------


def test_standard_redelivery_on_timeout_exhausts_with_linear_backoff(
        store: EnvelopeStore, dsn: str, pg: Any) -> None:
    """Redelivery on timeout (Standard): "If no acknowledgment arrives within the transport
    timeout, the runtime MUST redeliver per §7.1 (3 attempts, linear backoff)." — 4 attempts
    in all, attempt k followed by a wait of k × the base timeout, then envelope_undeliverable
    and a `failed` signal with reason delivery_exhausted."""
    team(store)
    base = store.settings.ack_timeout
    with ChainLock(dsn, "w1") as lock:
        res = store.send("coord", "w1", "directive", "nobody home")
        assert res.status == "validated"
        eid = res.envelope_id
        tries = failed_attempts(store, eid)
        assert [t.body["attempt"] for t in tries] == [1]

        for k in (1, 2, 3):
            due = datetime.fromisoformat(tries[-1].body["next_attempt_at"])
            backoff = (due - tries[-1].at).total_seconds()
            assert k * base - 0.1 < backoff <= k * base + 0.01, (k, backoff)
            assert store.get(eid).attempts == k
            # not retried before its backoff has passed
            if db_now(pg) < due - timedelta(seconds=0.05):
                assert store.redeliver()["recipients"] == 0
                assert len(failed_attempts(store, eid)) == k
            wait_until(pg, due)
            store.redeliver()
            tries = failed_attempts(store, eid)
            assert [t.body["attempt"] for t in tries] == list(range(1, k + 2))
            assert (tries[k].at - tries[k - 1].at).total_seconds() >= k * base

        assert tries[3].body["next_attempt_at"] is None
        env = store.get(eid)
        assert (env.status, env.reason, env.attempts) == ("undeliverable", "delivery_exhausted", 4)
        undeliverable = events(store, "envelope_undeliverable", envelope_id=eid)
        assert len(undeliverable) == 1
        assert undeliverable[0].chain == "coord"
        assert undeliverable[0].body["reason"] == "delivery_exhausted"
        failed = [s for s in store.signals("coord") if s.signal == "failed"]
        assert [(s.ref, s.reason) for s in failed] == [(eid, "delivery_exhausted")]
        lock.release()

    # the receiver comes back: nothing is delivered any more
    store.redeliver()
    store.recover()
    assert store.get(eid).status == "undeliverable"
    assert store.inbox("w1") == []
    assert events(store, "envelope_delivered", envelope_id=eid) == []
    assert acks(store, "coord") == []
    assert store.verify_trail().ok


def test_standard_redelivery_on_timeout_third_attempt_delivers(
        store: EnvelopeStore, dsn: str, pg: Any) -> None:
    """Redelivery on timeout (Standard): "If no acknowledgment arrives within the transport
    timeout, the runtime MUST redeliver per §7.1 (3 attempts, linear backoff)." — two failed
    attempts, then the receiver answers and the third attempt delivers, once."""
    team(store)
    with ChainLock(dsn, "w1") as lock:
        eid = store.send("coord", "w1", "directive", "slow receiver").envelope_id
        assert store.get(eid).status == "validated"
        wait_until(pg, datetime.fromisoformat(
            failed_attempts(store, eid)[-1].body["next_attempt_at"]))
        store.redeliver()
        tries = failed_attempts(store, eid)
        assert [t.body["attempt"] for t in tries] == [1, 2]
        lock.release()

    # the receiver answers again, but the envelope is still backing off: a new send in the
    # same channel must not overtake it, and redelivery must wait for the backoff
    due = datetime.fromisoformat(tries[-1].body["next_attempt_at"])
    later = store.send("coord", "w1", "feedback", "and this").envelope_id
    store.redeliver()
    if db_now(pg) < due - timedelta(seconds=0.05):
        assert store.get(eid).status == "validated"
        assert store.get(later).status == "validated"
        assert store.inbox("w1") == []
    wait_until(pg, due)
    store.redeliver()

    env = store.get(eid)
    assert (env.status, env.attempts) == ("acknowledged", 3)
    (delivered,) = events(store, "envelope_delivered", envelope_id=eid)
    assert delivered.body["attempt"] == 3
    assert len(failed_attempts(store, eid)) == 2
    assert delivered_order(store, "w1") == [eid, later]
    assert acks(store, "coord") == [eid, later]
    assert ids(store.inbox("w1")) == [eid, later]
    assert [s for s in store.signals("coord") if s.signal == "failed"] == []
    assert store.verify_trail().ok


# -- Redelivery on recovery -------------------------------------------------------------------


def test_standard_redelivery_on_recovery(store: EnvelopeStore, dsn: str) -> None:
    """Redelivery on recovery (Standard): "After runtime failure, validated-but-undelivered
    envelopes MUST be redelivered per §7.2."""
    team(store)
    gap = crash_between_phases(store, dsn, "w1", [
        {"from": "coord", "to": "w1", "type": "directive", "content": "cut off"}])
    assert len(gap) == 1
    assert_gap(store, "w1", gap)
    assert acks(store, "coord") == []

    result = store.recover()
    assert result == {"delivered": 1, "undeliverable": 0, "still_queued": 0, "rules_sent": 0}
    assert_delivered_once(store, "coord", "w1", gap)
    assert ids(store.inbox("w1")) == gap

    # a second recovery finds nothing left to do
    assert store.recover()["delivered"] == 0
    assert len(events(store, "envelope_delivered", envelope_id=gap[0])) == 1
    verification = store.verify_trail()
    assert verification.ok, verification


def test_standard_redelivery_on_recovery_respects_migrating_target(
        store: EnvelopeStore, dsn: str) -> None:
    """Redelivery on recovery (Standard): "After runtime failure, validated-but-undelivered
    envelopes MUST be redelivered per §7.2." — §7.2: a target now migrating keeps the envelope
    queued; it is delivered when migration completes."""
    team(store)
    gap = crash_between_phases(store, dsn, "w1", [
        {"from": "coord", "to": "w1", "type": "directive", "content": "cut off"}])
    assert_gap(store, "w1", gap)
    store.transition("w1", "migrating")

    result = store.recover()
    assert (result["delivered"], result["undeliverable"], result["still_queued"]) == (0, 0, 1)
    assert_gap(store, "w1", gap)

    assert store.transition("w1", "active")["delivered"] == 1
    assert_delivered_once(store, "coord", "w1", gap)
    assert store.verify_trail().ok


# -- Redelivery ordering ----------------------------------------------------------------------


def test_standard_redelivery_ordering_recover_then_new_send(
        store: EnvelopeStore, dsn: str) -> None:
    """Redelivery ordering (Standard): "Redelivered envelopes in the same channel MUST be
    delivered in original creation order." — several crash-gap envelopes in one channel are
    recovered in creation order; a new send afterwards comes after all of them."""
    team(store)
    gap = crash_between_phases(store, dsn, "w1", [
        {"from": "coord", "to": "w1", "type": "directive", "content": f"gap {i}"}
        for i in range(4)])
    assert len(gap) == 4
    assert_gap(store, "w1", gap)
    created = [store.get(eid) for eid in gap]
    assert [e.seq for e in created] == sorted(e.seq for e in created)
    assert [e.timestamp for e in created] == sorted(e.timestamp for e in created)

    assert store.recover()["delivered"] == 4
    new = store.send("coord", "w1", "feedback", "new").envelope_id

    assert delivered_order(store, "w1") == [*gap, new]
    assert acks(store, "coord") == [*gap, new]
    assert ids(store.inbox("w1")) == [*gap, new]
    assert_delivered_once(store, "coord", "w1", [*gap, new])
    assert store.verify_trail().ok


def test_standard_redelivery_ordering_new_send_before_recover(
        store: EnvelopeStore, dsn: str) -> None:
    """Redelivery ordering (Standard): "Redelivered envelopes in the same channel MUST be
    delivered in original creation order." — §7.2: a new envelope sent into the channel before
    recovery ran is not delivered ahead of the older, cut-off ones."""
    team(store)
    gap = crash_between_phases(store, dsn, "w1", [
        {"from": "coord", "to": "w1", "type": "directive", "content": f"gap {i}"}
        for i in range(3)])
    assert_gap(store, "w1", gap)

    new = store.send("coord", "w1", "feedback", "new")
    assert new.status == "acknowledged"
    store.recover()

    assert delivered_order(store, "w1") == [*gap, new.envelope_id]
    delivered_at = [store.get(eid).delivered_at for eid in [*gap, new.envelope_id]]
    assert delivered_at == sorted(delivered_at)
    assert_delivered_once(store, "coord", "w1", [*gap, new.envelope_id])
    assert store.verify_trail().ok


# -- Bounded redelivery -----------------------------------------------------------------------


def test_standard_bounded_redelivery(store: EnvelopeStore, dsn: str, pg: Any) -> None:
    """Bounded redelivery (Standard): "Redelivery attempts MUST NOT exceed 3 (protocol
    constant). Exhaustion MUST be recorded in the trail." — however often redelivery runs, no
    envelope gets a fifth attempt, and each exhaustion is one envelope_undeliverable entry."""
    team(store)
    with ChainLock(dsn, "w1") as lock:
        sent = [r.envelope_id for r in store.send_many(
            [{"from": "coord", "to": "w1", "type": "directive", "content": f"job {i}"}
             for i in range(2)])]
        deadline = time.monotonic() + WAIT_LIMIT
        while any(store.get(eid).status == "validated" for eid in sent):
            assert time.monotonic() < deadline, "redelivery never gave up"
            store.redeliver()
            time.sleep(0.05)
        for _ in range(3):  # keep calling it after exhaustion, receiver still unreachable
            store.redeliver()
        lock.release()
    for _ in range(2):  # and once the receiver is reachable again
        store.redeliver()
        store.recover()

    for eid in sent:
        env = store.get(eid)
        assert (env.status, env.reason, env.attempts) == ("undeliverable", "delivery_exhausted", 4)
        assert [t.body["attempt"] for t in failed_attempts(store, eid)] == [1, 2, 3, 4]
        (entry,) = events(store, "envelope_undeliverable", envelope_id=eid)
        assert (entry.chain, entry.body["reason"]) == ("coord", "delivery_exhausted")
    failed = [(s.ref, s.reason) for s in store.signals("coord") if s.signal == "failed"]
    assert sorted(failed) == sorted((eid, "delivery_exhausted") for eid in sent)
    assert events(store, "envelope_delivered", chain="w1") == []
    assert store.inbox("w1") == []
    assert store.verify_trail().ok


# -- Workspace state interaction --------------------------------------------------------------


@pytest.mark.parametrize("state", ["idle", "active", "blocked"])
def test_standard_workspace_state_interaction_accepting_states_deliver(
        store: EnvelopeStore, state: str) -> None:
    """Workspace state interaction (Standard): "Runtime MUST enforce the inbox acceptance rules
    per workspace state (§4): queued during migrating; sealed during integrating and terminal
    states." — idle, active and blocked accept and deliver."""
    team(store)
    move(store, "w1", state)
    sent = [store.send("coord", "w1", "directive", "first"),
            store.send("coord", "w1", "feedback", "second"),
            store.inject("alice", "w1", "directive", "from a person")]
    assert [r.status for r in sent] == ["acknowledged"] * 3
    eids = [r.envelope_id for r in sent]
    assert ids(store.inbox("w1")) == eids
    assert store.queued("w1") == []
    assert delivered_order(store, "w1") == eids
    assert acks(store, "coord") == eids[:2]


@pytest.mark.parametrize(("state", "resume"), [
    ("migrating", "active"), ("migrating", "idle"), ("migrating", "blocked"),
    ("suspended", "idle"), ("suspended", "active"), ("suspended", "blocked"),
])
def test_standard_workspace_state_interaction_queueing_states_queue_then_deliver(
        store: EnvelopeStore, state: str, resume: str) -> None:
    """Workspace state interaction (Standard): "Runtime MUST enforce the inbox acceptance rules
    per workspace state (§4): queued during migrating; sealed during integrating and terminal
    states." — migrating and suspended queue what is validated (nothing reaches the inbox) and
    deliver it in order when the workspace resumes."""
    team(store)
    move(store, "w1", state)
    sent = [store.send("coord", "w1", "directive", "one"),
            store.send("coord", "w1", "feedback", "two", priority="urgent"),
            store.inject("alice", "w1", "directive", "three"),
            store.send("coord", "w1", "feedback", "four")]
    assert [r.status for r in sent] == ["validated"] * 4
    eids = [r.envelope_id for r in sent]
    assert ids(store.queued("w1")) == eids
    assert store.inbox("w1") == []
    assert events(store, "envelope_delivered", chain="w1") == []
    assert acks(store, "coord") == []
    # neither timeout redelivery nor recovery delivers into a frozen inbox, nor counts attempts
    store.redeliver()
    store.recover()
    assert [store.get(e).status for e in eids] == ["validated"] * 4
    assert [store.get(e).attempts for e in eids] == [0] * 4
    assert events(store, "envelope_delivery_failed", chain="coord") == []

    assert store.transition("w1", resume)["delivered"] == 4
    assert store.queued("w1") == []
    assert delivered_order(store, "w1") == eids
    assert acks(store, "coord") == [eids[0], eids[1], eids[3]]
    # inbox: urgent first, then creation order
    assert ids(store.inbox("w1")) == [eids[1], eids[0], eids[2], eids[3]]


@pytest.mark.parametrize("state", ["integrating", "closed", "failed"])
def test_standard_workspace_state_interaction_sealed_states_reject(
        store: EnvelopeStore, state: str) -> None:
    """Workspace state interaction (Standard): "Runtime MUST enforce the inbox acceptance rules
    per workspace state (§4): queued during migrating; sealed during integrating and terminal
    states." — integrating, closed and failed reject new envelopes with target_terminal."""
    team(store)
    move(store, "w1", state)
    res = store.send("coord", "w1", "directive", "too late")
    human = store.inject("alice", "w1", "directive", "too late too")
    for r in (res, human):
        assert (r.status, r.reason) == ("rejected", "target_terminal")
        (entry,) = events(store, "envelope_rejected", envelope_id=r.envelope_id)
        assert entry.body["reason"] == "target_terminal"
        assert events(store, "envelope_created", envelope_id=r.envelope_id) == []
    rejected = [(s.ref, s.reason) for s in store.signals("coord") if s.signal == "rejected"]
    assert rejected == [(res.envelope_id, "target_terminal")]
    assert store.queued("w1") == []
    assert store.inbox("w1") == []
    assert events(store, "envelope_delivered", chain="w1") == []


@pytest.mark.parametrize(("hold", "seal"), [
    ("suspended", "closed"), ("suspended", "failed"), ("migrating", "failed"),
    ("gated", "integrating"),
])
def test_standard_workspace_state_interaction_queued_become_undeliverable_when_sealed(
        store: EnvelopeStore, hold: str, seal: str) -> None:
    """Workspace state interaction (Standard): "Runtime MUST enforce the inbox acceptance rules
    per workspace state (§4): queued during migrating; sealed during integrating and terminal
    states." — §6: envelopes validated but still queued when the target is sealed are recorded
    undeliverable and their sender gets a `failed` signal."""
    team(store)
    delivered: list[str] = []
    if hold == "gated":  # active, but the inbox is held by a blocking envelope
        move(store, "w1", "active")
        delivered.append(store.send("coord", "w1", "directive", "first", priority="blocking")
                         .envelope_id)
    else:
        move(store, "w1", hold)
    queued = [store.send("coord", "w1", "directive", f"queued {i}").envelope_id
              for i in range(2)]
    assert ids(store.queued("w1")) == queued

    result = store.transition("w1", seal)
    assert result["undeliverable"] == 2

    for eid in queued:
        env = store.get(eid)
        assert (env.status, env.reason) == ("undeliverable", f"target_{seal}")
        (entry,) = events(store, "envelope_undeliverable", envelope_id=eid)
        assert (entry.chain, entry.body["reason"]) == ("coord", f"target_{seal}")
        assert events(store, "envelope_delivered", envelope_id=eid) == []
    failed = [(s.ref, s.reason) for s in store.signals("coord") if s.signal == "failed"]
    assert failed == [(eid, f"target_{seal}") for eid in queued]
    assert store.queued("w1") == []
    assert delivered_order(store, "w1") == delivered
    store.recover()
    assert [store.get(e).status for e in queued] == ["undeliverable"] * 2
    assert store.verify_trail().ok


INVALID_TRANSITIONS = [
    ("idle", "integrating"), ("idle", "blocked"), ("active", "idle"),
    ("blocked", "integrating"), ("migrating", "suspended"), ("migrating", "closed"),
    ("suspended", "integrating"), ("suspended", "migrating"), ("integrating", "active"),
    ("closed", "active"), ("closed", "failed"), ("failed", "idle"),
]


def test_standard_workspace_state_interaction_invalid_transitions_change_nothing(
        store: EnvelopeStore, pg: Any) -> None:
    """Workspace state interaction (Standard): "Runtime MUST enforce the inbox acceptance rules
    per workspace state (§4): queued during migrating; sealed during integrating and terminal
    states." — the states those rules hang off only change along allowed transitions; a
    refused transition raises InvalidTransition and changes nothing."""
    store.create_workspace("coordinator", workspace_id="coord")
    for state, target in INVALID_TRANSITIONS:
        ws = f"w-{state}-{target}"
        store.create_workspace("worker", parent="coord", workspace_id=ws)
        move(store, ws, state)
        envelope = store.send("coord", ws, "directive", "waiting").envelope_id

        def snapshot(ws: str = ws, envelope: str = envelope) -> tuple[Any, ...]:
            return (store.workspace(ws), store.get(envelope), store.queued(ws), store.inbox(ws),
                    query(pg, "SELECT count(*), max(id) FROM agentpost.trail"),
                    query(pg, "SELECT count(*) FROM agentpost.signals"))

        before = snapshot()
        with pytest.raises(InvalidTransition):
            store.transition(ws, target)
        assert snapshot() == before, (state, target)


# -- Blocking priority ------------------------------------------------------------------------


def test_standard_blocking_priority_inbox_order(store: EnvelopeStore) -> None:
    """Blocking priority (Standard): "blocking envelopes MUST be placed at the front of the
    inbox. Subsequent deliveries MUST pause until the blocking envelope is consumed." — inbox
    order is blocking > urgent > normal, creation order within a level; a waiting blocking
    envelope holds back the rest."""
    team(store)
    n1, u1, n2, u2 = (r.envelope_id for r in store.send_many([
        {"from": "coord", "to": "w1", "type": "directive", "content": "n1"},
        {"from": "coord", "to": "w1", "type": "directive", "content": "u1",
         "priority": "urgent"},
        {"from": "coord", "to": "w1", "type": "feedback", "content": "n2"},
        {"from": "coord", "to": "w1", "type": "feedback", "content": "u2",
         "priority": "urgent"},
    ]))
    u3 = store.inject("alice", "w1", "directive", "u3", priority="urgent").envelope_id
    assert ids(store.inbox("w1")) == [u1, u2, u3, n1, n2]

    b1 = store.send("coord", "w1", "feedback", "stop", priority="blocking")
    assert b1.status == "acknowledged"
    assert ids(store.inbox("w1")) == [b1.envelope_id]
    for other in (n1, u1, u3):
        with pytest.raises(InboxBlocked):
            store.consume("w1", other)
        assert store.get(other).consumed_at is None
    assert events(store, "envelope_consumed", chain="w1") == []

    store.consume("w1", b1.envelope_id)
    assert ids(store.inbox("w1")) == [u1, u2, u3, n1, n2]
    store.consume("w1", n2)  # no gate any more: any envelope may be consumed
    assert ids(store.inbox("w1")) == [u1, u2, u3, n1]


def test_standard_blocking_priority_pauses_delivery(store: EnvelopeStore) -> None:
    """Blocking priority (Standard): "blocking envelopes MUST be placed at the front of the
    inbox. Subsequent deliveries MUST pause until the blocking envelope is consumed." — what
    arrives while a blocking envelope waits stays queued and is delivered, in order, when it is
    consumed."""
    team(store, 2)
    before = store.send("coord", "w1", "directive", "already there").envelope_id
    gate = store.send("coord", "w1", "feedback", "answer me first", priority="blocking")
    assert gate.status == "acknowledged"
    later = [store.send("coord", "w1", "directive", "later 1"),
             store.send("coord", "w1", "feedback", "later 2", priority="urgent"),
             store.inject("alice", "w1", "directive", "later 3")]
    assert [r.status for r in later] == ["validated"] * 3
    later_ids = [r.envelope_id for r in later]
    assert ids(store.queued("w1")) == later_ids
    assert ids(store.inbox("w1")) == [gate.envelope_id]
    assert acks(store, "coord") == [before, gate.envelope_id]
    # other channels to other workspaces are not held up
    assert store.send("coord", "w2", "directive", "elsewhere").status == "acknowledged"
    # retries neither deliver behind the gate nor spend attempts
    store.redeliver()
    store.recover()
    assert ids(store.queued("w1")) == later_ids
    assert [store.get(e).attempts for e in later_ids] == [0, 0, 0]
    with pytest.raises(InboxBlocked):
        store.consume("w1", before)

    store.consume("w1", gate.envelope_id)
    assert store.queued("w1") == []
    assert delivered_order(store, "w1") == [before, gate.envelope_id, *later_ids]
    assert ids(store.inbox("w1")) == [later_ids[1], before, later_ids[0], later_ids[2]]


def test_standard_blocking_priority_two_blocking_in_channel_order(store: EnvelopeStore) -> None:
    """Blocking priority (Standard): "blocking envelopes MUST be placed at the front of the
    inbox. Subsequent deliveries MUST pause until the blocking envelope is consumed." — §6: two
    blocking envelopes are processed in channel order among themselves."""
    team(store)
    b1, n1, b2, n2 = (r.envelope_id for r in store.send_many([
        {"from": "coord", "to": "w1", "type": "directive", "content": "b1",
         "priority": "blocking"},
        {"from": "coord", "to": "w1", "type": "directive", "content": "n1"},
        {"from": "coord", "to": "w1", "type": "feedback", "content": "b2",
         "priority": "blocking"},
        {"from": "coord", "to": "w1", "type": "feedback", "content": "n2"},
    ]))
    assert ids(store.inbox("w1")) == [b1]
    assert ids(store.queued("w1")) == [n1, b2, n2]
    with pytest.raises(Conflict):
        store.consume("w1", b2)  # not delivered yet

    store.consume("w1", b1)
    assert ids(store.inbox("w1")) == [b2]
    assert ids(store.queued("w1")) == [n2]
    with pytest.raises(InboxBlocked):
        store.consume("w1", n1)

    store.consume("w1", b2)
    assert store.queued("w1") == []
    assert ids(store.inbox("w1")) == [n1, n2]
    assert delivered_order(store, "w1") == [b1, n1, b2, n2]
    consumed = [e.envelope_id for e in events(store, "envelope_consumed", chain="w1")]
    assert consumed == [b1, b2]


def test_standard_blocking_priority_queued_blocking_released_on_resume(
        store: EnvelopeStore) -> None:
    """Blocking priority (Standard): "blocking envelopes MUST be placed at the front of the
    inbox. Subsequent deliveries MUST pause until the blocking envelope is consumed." — a
    blocking envelope queued behind a suspension is delivered on resume and holds back what
    was created after it."""
    team(store)
    move(store, "w1", "suspended")
    n1, b1, n2 = (store.send("coord", "w1", "directive", c, priority=p).envelope_id
                  for c, p in (("n1", "normal"), ("b1", "blocking"), ("n2", "normal")))
    assert store.transition("w1", "active")["delivered"] == 2
    assert ids(store.inbox("w1")) == [b1]
    assert ids(store.queued("w1")) == [n2]
    store.consume("w1", b1)
    assert ids(store.inbox("w1")) == [n1, n2]


# -- Taxonomy validation ----------------------------------------------------------------------


def test_standard_taxonomy_validation_unregistered_type(store: EnvelopeStore) -> None:
    """Taxonomy validation (Standard): "Runtime MUST reject envelope types not registered in
    the taxonomy.\""""
    team(store)
    for sender, to in (("coord", "w1"), ("w1", "coord")):
        res = store.send(sender, to, "report", "not a registered type")
        assert (res.status, res.reason) == ("rejected", "invalid_type")
        (entry,) = events(store, "envelope_rejected", envelope_id=res.envelope_id)
        assert (entry.chain, entry.body["reason"]) == (sender, "invalid_type")
        assert [(s.ref, s.reason) for s in store.signals(sender) if s.signal == "rejected"] \
            == [(res.envelope_id, "invalid_type")]
    human = store.inject("alice", "w1", "Directive", "case matters")
    assert (human.status, human.reason) == ("rejected", "invalid_type")
    assert store.inbox("w1") == [] and store.inbox("coord") == []
    # base types are registered
    assert store.send("coord", "w1", "directive", "ok").status == "acknowledged"


def test_standard_taxonomy_validation_required_fields(store: EnvelopeStore) -> None:
    """Taxonomy validation (Standard): "Runtime MUST reject envelope types not registered in
    the taxonomy." — a registered type's required payload fields are checked (§2)."""
    team(store)
    assert store.send("coord", "w1", "review_request", {"task": "t"}, format="json") \
        .reason == "invalid_type"
    store.register_type("review_request", ["coordinator"], ["worker"],
                        required_fields=["task", "deadline"])
    (registered,) = events(store, "type_registered", chain="system")
    assert registered.body["type"] == "review_request"

    missing = store.send("coord", "w1", "review_request", {"task": "t"}, format="json")
    assert (missing.status, missing.reason) == ("rejected", "invalid_structure")
    not_json = store.send("coord", "w1", "review_request", "task: t, deadline: d")
    assert (not_json.status, not_json.reason) == ("rejected", "invalid_structure")
    a_list = store.send("coord", "w1", "review_request", ["task", "deadline"], format="json")
    assert (a_list.status, a_list.reason) == ("rejected", "invalid_structure")
    ok = store.send("coord", "w1", "review_request",
                    {"task": "t", "deadline": "friday", "extra": 1}, format="json")
    assert ok.status == "acknowledged"
    assert ids(store.inbox("w1")) == [ok.envelope_id]
    # the permission row is the registered direction only
    assert store.send("w1", "coord", "review_request", {"task": "t", "deadline": "d"},
                      format="json").reason == "permission_denied"


def test_a_missing_required_field_is_named_in_the_rejection(store: EnvelopeStore) -> None:
    """§9 invalid_structure for a payload without its type's required fields says which
    fields (it said nothing: `detail` was null), on every way in: one send, a batch, the
    Courier enqueue and the human highway."""
    team(store)
    store.register_type("review_request", ["coordinator"], ["worker"],
                        required_fields=["task", "deadline"])
    missing = "missing required field(s) of type 'review_request': "
    one = store.send("coord", "w1", "review_request", {"task": "t"}, format="json")
    assert (one.reason, one.detail) == ("invalid_structure", missing + "deadline")
    prose = store.send("coord", "w1", "review_request", "task: t, deadline: d")
    assert (prose.reason, prose.detail) == (
        "invalid_structure", "type 'review_request' requires the field(s) task, deadline: "
        "send a JSON object with format json")
    batch = store.send_many([
        {"from": "coord", "to": "w1", "type": "review_request", "content": {},
         "format": "json", "envelope_id": "rr-1"},
        {"from": "coord", "to": "w1", "type": "review_request", "content": {"task": 1},
         "format": "json"}])
    assert [r.detail for r in batch] == [missing + "task, deadline", missing + "deadline"]
    queued = store.enqueue("agents/w1/inbox", {
        "id": "rr-2", "ts": "2026-11-24T12:00:00Z", "from": "coord",
        "type": "review_request", "payload": {"deadline": "friday"}})
    assert (queued.reason, queued.detail) == ("invalid_structure", missing + "task")
    human = store.inject("alice", "w1", "review_request", {"task": "t"}, format="json")
    assert (human.reason, human.detail) == ("invalid_structure", missing + "deadline")
    # a draft malformed in itself keeps its own detail, and a good one has none
    bad = store.send("coord", "w1", "review_request", "{", format="json")
    assert bad.detail == "content declared as json does not parse"
    ok = store.send("coord", "w1", "review_request", {"task": "t", "deadline": "d"},
                    format="json")
    assert (ok.status, ok.detail) == ("acknowledged", None)


def test_standard_taxonomy_validation_derived_role(store: EnvelopeStore) -> None:
    """Taxonomy validation (Standard): "Runtime MUST reject envelope types not registered in
    the taxonomy." — §2: a derived role `reviewer` sends a taxonomy-registered `report` to the
    coordinator, and holds every row of the role it inherits."""
    store.define_role("reviewer", inherits="worker")
    team(store)
    store.create_workspace("reviewer", parent="coord", workspace_id="rev")
    assert store.workspace("rev").lineage == ("reviewer", "worker")

    before = store.send("rev", "coord", "report", "verdict: ok")
    assert (before.status, before.reason) == ("rejected", "invalid_type")
    store.register_type("report", ["reviewer"], ["coordinator"])
    report = store.send("rev", "coord", "report", "verdict: ok")
    assert report.status == "acknowledged"
    assert ids(store.inbox("coord")) == [report.envelope_id]

    # inherited worker rows, both ways
    assert store.send("rev", "coord", "query", "a question").status == "acknowledged"
    assert store.send("coord", "rev", "directive", "review this").status == "acknowledged"
    # the row is the reviewer's, not the worker's, and only towards a coordinator
    assert store.send("w1", "coord", "report", "me too").reason == "permission_denied"
    assert store.send("coord", "rev", "report", "backwards").reason == "permission_denied"


def test_standard_taxonomy_validation_delegation_scope(store: EnvelopeStore) -> None:
    """Taxonomy validation (Standard): "Runtime MUST reject envelope types not registered in
    the taxonomy." — §2 delegation extends the base types within the delegate's subtree only:
    directive/feedback to its own children, query from them; not to a sibling's children."""
    team(store)
    store.create_workspace("worker", parent="coord", workspace_id="delegate", delegation=True)
    store.create_workspace("worker", parent="delegate", workspace_id="child")
    store.create_workspace("worker", parent="coord", workspace_id="sibling", delegation=True)
    store.create_workspace("worker", parent="sibling", workspace_id="nephew")

    for kind in ("directive", "feedback"):
        assert store.send("delegate", "child", kind, kind).status == "acknowledged"
    assert store.send("child", "delegate", "query", "?").status == "acknowledged"
    assert len(store.inbox("child")) == 2
    assert len(store.inbox("delegate")) == 1

    # wrong direction for each type
    assert store.send("delegate", "child", "query", "?").reason == "permission_denied"
    assert store.send("child", "delegate", "directive", "!").reason == "permission_denied"
    # a sibling's subtree is out of scope, both ways
    assert store.send("delegate", "nephew", "directive", "!").reason == "permission_denied"
    assert store.send("nephew", "delegate", "query", "?").reason == "permission_denied"
    # a delegate that is a worker gains nothing upward or sideways
    assert store.send("delegate", "sibling", "directive", "!").reason == "permission_denied"
    assert store.send("w1", "child", "directive", "!").reason == "permission_denied"
    assert store.inbox("nephew") == []


# -- Originator field -------------------------------------------------------------------------


def test_standard_originator_field_human_injection(store: EnvelopeStore) -> None:
    """Originator field (Standard): "Envelopes resulting from human highway injections MUST
    carry originator: user_id (PROTOCOL §4.8). originator MUST be immutable once set.\""""
    team(store)
    res = store.inject("alice", "w1", "directive", "from me", priority="urgent")
    assert res.status == "acknowledged"
    env = store.get(res.envelope_id)
    assert (env.origin, env.originator, env.from_) == ("human", "alice", "human:alice")
    (created,) = events(store, "envelope_created", envelope_id=res.envelope_id)
    assert (created.body["originator"], created.body["origin"]) == ("alice", "human")
    assert acks(store, "human:alice") == [res.envelope_id]

    # agents' envelopes are origin agent with the workspace's originator
    agent = store.get(store.send("coord", "w1", "directive", "x").envelope_id)
    assert (agent.origin, agent.originator) == ("agent", "system")

    # an agent cannot set the originator (or the origin) itself
    for field, value in (("originator", "alice"), ("origin", "human")):
        (forged,) = store.send_many([{"from": "coord", "to": "w1", "type": "directive",
                                      "content": "x", field: value}])
        assert (forged.status, forged.reason) == ("rejected", "invalid_structure")
    assert ids(store.inbox("w1")) == [res.envelope_id, agent.id]


def test_standard_originator_field_propagates_to_children(store: EnvelopeStore) -> None:
    """Originator field (Standard): "Envelopes resulting from human highway injections MUST
    carry originator: user_id (PROTOCOL §4.8). originator MUST be immutable once set." — a
    workspace's originator propagates to its children and to their envelopes."""
    store.create_workspace("coordinator", workspace_id="coord", originator="alice")
    child = store.create_workspace("worker", parent="coord", workspace_id="w1")
    assert child.originator == "alice"
    same = store.create_workspace("worker", parent="coord", workspace_id="w2",
                                  originator="alice")
    assert same.originator == "alice"
    store.create_workspace("worker", parent="w1", workspace_id="grandchild", delegation=True)
    assert store.workspace("grandchild").originator == "alice"

    down = store.get(store.send("coord", "w1", "directive", "go").envelope_id)
    up = store.get(store.send("w1", "coord", "query", "?").envelope_id)
    assert (down.originator, up.originator) == ("alice", "alice")
    (created,) = events(store, "envelope_created", envelope_id=up.id)
    assert created.body["originator"] == "alice"
    # a human injecting is the originator of what they inject, whoever owns the workspace
    assert store.get(store.inject("bob", "w1", "feedback", "hi").envelope_id).originator == "bob"


def test_standard_originator_field_conflicting_originator_refused(store: EnvelopeStore,
                                                                  pg: Any) -> None:
    """Originator field (Standard): "Envelopes resulting from human highway injections MUST
    carry originator: user_id (PROTOCOL §4.8). originator MUST be immutable once set." — a
    child of a user-originated workspace cannot be created with another originator."""
    store.create_workspace("coordinator", workspace_id="coord", originator="alice")
    trail_before = query(pg, "SELECT count(*) FROM agentpost.trail")
    with pytest.raises(Conflict):
        store.create_workspace("worker", parent="coord", workspace_id="w1", originator="bob")
    assert [w.id for w in store.workspaces()] == ["coord"]
    assert query(pg, "SELECT count(*) FROM agentpost.trail") == trail_before
    assert query(pg, "SELECT count(*) FROM agentpost.port_rights") == [(0,)]


def test_standard_originator_field_caused_by_inherits(store: EnvelopeStore) -> None:
    """Originator field (Standard): "Envelopes resulting from human highway injections MUST
    carry originator: user_id (PROTOCOL §4.8). originator MUST be immutable once set." — §3:
    workspaces created because of an originator-bearing envelope inherit its originator, and
    so do their envelopes."""
    team(store)
    injected = store.inject("carol", "coord", "query", "please handle this").envelope_id
    child = store.create_workspace("worker", parent="coord", workspace_id="helper",
                                   caused_by=injected)
    assert child.originator == "carol"
    env = store.get(store.send("helper", "coord", "query", "on it").envelope_id)
    assert env.originator == "carol"
    grandchild = store.create_workspace("worker", parent="helper", workspace_id="helper2")
    assert grandchild.originator == "carol"
    with pytest.raises(Conflict):
        store.create_workspace("worker", parent="coord", caused_by=injected, originator="dave")
    # a directive from a carol-owned workspace carries carol on to what it causes
    store.create_workspace("coordinator", workspace_id="sub", originator="carol")
    store.create_workspace("worker", parent="sub", workspace_id="sub-w")
    directive = store.send("sub", "sub-w", "directive", "split it").envelope_id
    assert store.create_workspace("worker", parent="sub-w", caused_by=directive) \
        .originator == "carol"


def test_standard_originator_field_caused_by_cannot_override_parent(store: EnvelopeStore) -> None:
    """Originator field (Standard): "Envelopes resulting from human highway injections MUST
    carry originator: user_id (PROTOCOL §4.8). originator MUST be immutable once set." — naming
    a system-originated causing envelope must not let a child of alice's workspace take an
    arbitrary originator."""
    store.create_workspace("coordinator", workspace_id="root")
    store.create_workspace("worker", parent="root", workspace_id="alices", originator="alice",
                           delegation=True)
    directive = store.send("root", "alices", "directive", "split the work").envelope_id
    assert store.get(directive).originator == "system"
    with pytest.raises(Conflict):
        store.create_workspace("worker", parent="alices", workspace_id="sub",
                               originator="bob", caused_by=directive)


# -- Port right transfer ----------------------------------------------------------------------


def rights_of(store: EnvelopeStore, ws: str, **kw: Any) -> list[tuple[str, str, str]]:
    return [(r.target, r.kind.value, r.state) for r in store.rights(ws, **kw)]


def test_standard_port_right_transfer_rights_created_with_workspace(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — the rights that transfers start from: send rights along
    the parent edge, per the matrix, each with a port_right_created entry."""
    team(store)
    store.create_workspace("observer", parent="coord", workspace_id="obs")
    (down,) = store.rights("coord")
    (up,) = store.rights("w1")
    assert (down.holder, down.target, down.kind, down.state, down.created_by) == (
        "coord", "w1", "send", "live", "runtime")
    assert (up.holder, up.target, up.kind) == ("w1", "coord", "send")
    created = {e.body["right_id"]: e.body for e in events(store, "port_right_created")}
    assert set(created) == {down.id, up.id}
    assert created[down.id] == {"right_id": down.id, "right_type": "send", "holder": "coord",
                                "target": "w1", "created_by": "runtime"}
    assert {e.chain for e in events(store, "port_right_created")} == {"w1"}
    # the matrix has no observer rows: no rights either way
    assert store.rights("obs") == []
    assert [r.target for r in store.rights("coord")] == ["w1"]
    assert store.send("coord", "obs", "directive", "x").reason == "permission_denied"


def test_standard_port_right_transfer_send_once_consumed(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — a send_once right is spent by its first use."""
    team(store, 2)
    store.register_type("peer_note", ["worker"], ["worker"])
    assert store.send("w1", "w2", "peer_note", "hi").reason == "no_send_right"
    with pytest.raises(Forbidden):
        store.grant_right("w1", "w1", "w2", "send_once")  # neither the target nor a coordinator
    rid = store.grant_right("coord", "w1", "w2", "send_once")
    (granted,) = [e for e in events(store, "port_right_created", chain="w1")
                  if e.body["right_id"] == rid]
    assert (granted.body["right_type"], granted.body["created_by"]) == ("send_once", "coord")

    first = store.send("w1", "w2", "peer_note", "once")
    assert first.status == "acknowledged"
    (right,) = [r for r in store.rights("w1", include_ended=True) if r.id == rid]
    assert (right.state, right.via_envelope) == ("consumed", first.envelope_id)
    (consumed,) = events(store, "port_right_consumed", envelope_id=first.envelope_id)
    assert consumed.chain == "w1"
    assert consumed.body == {"right_id": rid, "holder": "w1", "target": "w2",
                             "via_envelope": first.envelope_id}

    second = store.send("w1", "w2", "peer_note", "twice")
    assert (second.status, second.reason) == ("rejected", "no_send_right")
    assert ids(store.inbox("w2")) == [first.envelope_id]
    assert len(events(store, "port_right_consumed")) == 1


def test_standard_port_right_transfer_send_right_via_rights_field(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — a send right carried in `rights` is granted to the
    receiver on delivery, with a port_right_transferred entry."""
    team(store, 2)
    store.register_type("peer_note", ["worker"], ["worker"])
    assert store.send("w1", "w2", "peer_note", "hi").reason == "no_send_right"

    res = store.send("coord", "w1", "directive", "talk to w2",
                     rights=[{"type": "send", "target": "w2"}])
    assert res.status == "acknowledged"
    assert store.get(res.envelope_id).rights == (Right(type=RightType.SEND, target="w2"),)
    (granted,) = [r for r in store.rights("w1") if r.target == "w2"]
    assert (granted.kind, granted.state, granted.via_envelope) == (
        "send", "live", res.envelope_id)
    (moved,) = events(store, "port_right_transferred", envelope_id=res.envelope_id)
    assert moved.chain == "w1"
    assert moved.body == {"right_id": granted.id, "right_type": "send", "from_holder": "coord",
                          "to_holder": "w1", "target": "w2", "via_envelope": res.envelope_id}
    # a send right is copied: the sender keeps its own
    assert ("w2", "send", "live") in rights_of(store, "coord")

    note = store.send("w1", "w2", "peer_note", "hello, peer")
    assert note.status == "acknowledged"
    assert ids(store.inbox("w2")) == [note.envelope_id]
    # the right lets w1 reach w2, the matrix still decides what it may send
    assert store.send("w1", "w2", "directive", "do it").reason == "permission_denied"


def test_standard_port_right_transfer_send_once_moves(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — a transferred send_once right moves to the receiver (the
    sender loses it) and is then spent by one send."""
    team(store, 2)
    store.register_type("peer_note", ["worker"], ["worker"])
    rid = store.grant_right("coord", "coord", "w2", "send_once")

    res = store.send("coord", "w1", "directive", "one message to w2 for you",
                     rights=[{"type": "send_once", "target": "w2"}])
    assert res.status == "acknowledged"
    assert rid not in [r.id for r in store.rights("coord")]
    (moved,) = [r for r in store.rights("w1") if r.id == rid]
    assert (moved.holder, moved.kind, moved.state) == ("w1", "send_once", "live")
    (entry,) = events(store, "port_right_transferred", envelope_id=res.envelope_id)
    assert (entry.body["right_id"], entry.body["right_type"]) == (rid, "send_once")
    assert (entry.body["from_holder"], entry.body["to_holder"]) == ("coord", "w1")

    assert store.send("w1", "w2", "peer_note", "once").status == "acknowledged"
    assert store.send("w1", "w2", "peer_note", "twice").reason == "no_send_right"
    assert [r.state for r in store.rights("w1", include_ended=True) if r.id == rid] == [
        "consumed"]


def test_standard_port_right_transfer_of_unheld_right_rejected(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — only rights the sender holds can travel; a rejected
    envelope spends nothing."""
    team(store, 3)
    store.register_type("peer_note", ["worker"], ["worker"])
    for right in ({"type": "send", "target": "w2"}, {"type": "send_once", "target": "w2"}):
        res = store.send("w1", "coord", "query", "here is w2", rights=[right])
        assert (res.status, res.reason) == ("rejected", "no_send_right")
    # a send_once cannot be passed on as a send right
    once = store.grant_right("coord", "w1", "w2", "send_once")
    res = store.send("w1", "coord", "query", "escalate", rights=[{"type": "send", "target": "w2"}])
    assert res.reason == "no_send_right"
    # using the send_once while also transferring a right not held: all or nothing
    res = store.send("w1", "w2", "peer_note", "and w3",
                     rights=[{"type": "send_once", "target": "w3"}])
    assert res.reason == "no_send_right"
    assert [(r.id, r.state) for r in store.rights("w1") if r.target == "w2"] == [(once, "live")]
    assert events(store, "port_right_transferred") == []
    assert events(store, "port_right_consumed") == []
    assert store.inbox("coord") == [] and store.inbox("w2") == []
    assert [r.target for r in store.rights("coord")] == ["w1", "w2", "w3"]


def test_standard_port_right_transfer_revocation(store: EnvelopeStore) -> None:
    """Port right transfer (Standard): "The rights field MUST be processed on delivery:
    transferred rights are granted to the receiver, send-once rights are consumed. Transfers
    MUST be recorded in the trail." — a coordinator revokes a right (port_right_revoked) and
    the holder can no longer send with it; a worker cannot revoke."""
    team(store)
    (right,) = store.rights("coord")
    with pytest.raises(Forbidden):
        store.revoke_right(right.id, "w1", "not mine to take")
    assert rights_of(store, "coord") == [("w1", "send", "live")]
    assert events(store, "port_right_revoked") == []

    store.revoke_right(right.id, "coord", "reassigned")
    (entry,) = events(store, "port_right_revoked")
    assert entry.chain == "coord"
    assert entry.body == {"right_id": right.id, "right_type": "send", "holder": "coord",
                          "target": "w1", "revoked_by": "coord", "reason": "reassigned"}
    assert store.rights("coord") == []
    assert rights_of(store, "coord", include_ended=True) == [("w1", "send", "revoked")]
    res = store.send("coord", "w1", "directive", "still there?")
    assert (res.status, res.reason) == ("rejected", "no_send_right")
    assert store.inbox("w1") == []
    with pytest.raises(Conflict):
        store.revoke_right(right.id, "coord")
    # the other direction is untouched
    assert store.send("w1", "coord", "query", "hello?").status == "acknowledged"
