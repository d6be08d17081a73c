"""Command events and read-only lookups (sql/0012_command_events.sql): every change of a
command's state NOTIFYs ``agentpost_command`` with its id, `CommandTrigger` wakes on that
channel, and `ledger.find` / `ledger.recoveries` read without writing evidence."""

from __future__ import annotations

import os
import shutil
import tempfile

# Airflow reads its configuration once, at first import: point it at a throwaway home before
# anything imports it (the pattern of tests/airflow/test_airflow_commands.py).
if "AIRFLOW_HOME" not in os.environ:
    import atexit

    _home = tempfile.mkdtemp(prefix="agentpost-airflow-home-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import asyncio
import select
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.command_triggers import COMMAND_CHANNEL, CommandTrigger
from agentpost.protocol.commands import CommandKind, CommandState
from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from dbtools import connect, query
from test_airflow_inbox import WAKE_BOUND, in_background, wait_for_listener

S = CommandState
SENTINEL = "--sentinel--"


@pytest.fixture
def desk(store: EnvelopeStore) -> EnvelopeStore:
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="desk")
    store.create_workspace("agent", workspace_id="other")
    return store


@pytest.fixture
def ledger(desk: EnvelopeStore) -> Iterator[CommandLedger]:
    with CommandLedger(desk, lease_ttl=0.3) as ledger:
        yield ledger


class Notes:
    """A connection LISTENing on the command channel. `since()` returns the payloads notified
    since the last call, in commit order: it sends a sentinel notification and reads up to
    it, so "nothing was notified" is checked without waiting for a timeout."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = connect(dsn)
        with self.conn.cursor() as cur:
            cur.execute(f"LISTEN {COMMAND_CHANNEL}")

    def since(self) -> list[str]:
        query(self.dsn, "SELECT pg_notify(%s, %s)", (COMMAND_CHANNEL, SENTINEL))
        got: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.conn.poll()
            while self.conn.notifies:
                payload = self.conn.notifies.pop(0).payload
                if payload == SENTINEL:
                    return got
                got.append(payload)
            select.select([self.conn], [], [], 0.2)
        raise AssertionError(f"the sentinel never arrived (got {got})")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def notes(dsn: str) -> Iterator[Notes]:
    listening = Notes(dsn)
    yield listening
    listening.close()


def trail_rows(dsn: str) -> int:
    return query(dsn, "SELECT count(*) FROM agentpost.trail")[0][0]


def _run(ledger: CommandLedger, key: str, fn: Any = lambda: "ok", **kw: Any) -> Any:
    kw = {"action": "book", "mutating": True, "auto_confirm": "low-risk", **kw}
    return ledger.run("desk", key, fn, **kw)


# -- the notifications ---------------------------------------------------------------------------


def test_every_state_change_notifies_the_command_id(ledger: CommandLedger,
                                                    notes: Notes) -> None:
    """Submit, confirmation request, confirmation, start and end, a decline (no state change
    but a waiter's answer), a direct transition, a cancel (two commands in one transaction)
    and a sweep each notify the ids they changed; a lease renewal and a duplicate notify
    nothing. One transaction notifies one id once (the fast path's several steps)."""
    fast = _run(ledger, "fast")
    assert fast.state is S.EXECUTED
    # submit..started in one statement (one notification), executed in another
    assert notes.since() == [fast.command_id, fast.command_id]

    _run(ledger, "fast")  # duplicate: duplicate_delivery evidence, no change
    assert notes.since() == []

    asked = _run(ledger, "asked", auto_confirm=None)  # submit, then request_confirmation
    assert asked.state is S.CONFIRMATION_REQUIRED
    assert notes.since() == [asked.command_id, asked.command_id]
    ledger.confirmation_envelope("alice", asked.command_id, "confirm")
    assert notes.since() == [asked.command_id]
    assert ledger.execute(asked.command_id, lambda: 1).state is S.EXECUTED
    assert notes.since() == [asked.command_id, asked.command_id]  # started; executed

    declined = _run(ledger, "declined", auto_confirm=None)
    notes.since()
    ledger.confirmation_envelope("bob", declined.command_id, "decline")
    assert ledger.view(declined.command_id).declined
    assert notes.since() == [declined.command_id]

    step = ledger.submit("desk", "step", action="book", mutating=False)
    assert notes.since() == [step.command_id]
    ledger.transition(step.command_id, S.AUTHZ_PENDING)
    assert notes.since() == [step.command_id]
    ledger.authorize(step.command_id)
    assert notes.since() == [step.command_id]

    release = threading.Event()
    with in_background(lambda: _run(ledger, "long", lambda: release.wait(10))) as long:
        deadline = time.monotonic() + 10
        while ledger.find("desk", "long") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        target = ledger.find("desk", "long")
        assert target is not None and target.state is S.STARTED
        assert notes.since() == [target.command_id]
        time.sleep(0.3)  # heartbeats renew the lease meanwhile: no notification
        assert notes.since() == []
        cancel = ledger.cancel(target.command_id, "cancel-long", auto_confirm="ops")
        release.set()
    assert long.result(timeout=10).state is S.CANCELED
    assert ledger.view(target.command_id).state is S.CANCELED
    # the cancel's submit..started; its end with the target's move (one transaction, two ids);
    # the target's late finish changes nothing
    assert notes.since() == [cancel.command_id, cancel.command_id, target.command_id]

    with pytest.raises(SystemExit):  # the executor dies inside its side effect
        _run(ledger, "dies", lambda: sys.exit(1))
    dead = ledger.find("desk", "dies")
    assert dead is not None and dead.state is S.STARTED
    assert notes.since() == [dead.command_id]
    time.sleep(0.4)
    assert ledger.sweep_stuck() == [dead.command_id]
    assert notes.since() == [dead.command_id]
    assert ledger.view(dead.command_id).reason == "executor_lost"


# -- read-only lookups -------------------------------------------------------------------------


def test_find_reads_without_evidence(ledger: CommandLedger, dsn: str) -> None:
    """find returns the command of a key (not marked duplicate), None for a key never used,
    and writes no trail entry, unlike a duplicate run."""
    done = _run(ledger, "k1")
    before = trail_rows(dsn)
    found = ledger.find("desk", "k1")
    assert found is not None
    assert (found.command_id, found.state, found.outcome, found.duplicate) == (
        done.command_id, S.EXECUTED, "ok", False)
    assert ledger.find("desk", "never-used") is None
    assert ledger.find("other", "k1") is None, "keys are per workspace"
    assert trail_rows(dsn) == before
    _run(ledger, "k1")
    assert trail_rows(dsn) == before + 1, "a duplicate run records duplicate_delivery"


def test_recoveries_oldest_first_without_evidence(ledger: CommandLedger, dsn: str) -> None:
    """recoveries lists the recovery commands targeting a command, oldest first, optionally
    of one kind; a command without recoveries has none; nothing is written."""
    primary = _run(ledger, "p", lambda: 1 / 0)
    assert primary.state is S.FAILED
    first = ledger.recover(primary.command_id, CommandKind.RETRY, "p/retry-1", lambda: 1 / 0,
                           auto_confirm="low-risk")
    second = ledger.recover(primary.command_id, CommandKind.RETRY, "p/retry-2", lambda: 2,
                            auto_confirm="low-risk")
    other = _run(ledger, "unrelated", lambda: 1 / 0)
    ledger.recover(other.command_id, CommandKind.RETRY, "u/retry-1", lambda: 3,
                   auto_confirm="low-risk")
    undo = ledger.compensate(primary.command_id, "p/undo", lambda: "undone",
                             auto_confirm="low-risk")
    before = trail_rows(dsn)
    ids = [v.command_id for v in ledger.recoveries(primary.command_id)]
    assert ids == [first.command_id, second.command_id, undo.command_id]
    retries = ledger.recoveries(primary.command_id, "retry")
    assert [(v.command_id, v.state, v.kind) for v in retries] == [
        (first.command_id, S.FAILED, CommandKind.RETRY),
        (second.command_id, S.EXECUTED, CommandKind.RETRY)]
    assert all(str(v.target_command_id) == primary.command_id for v in retries)
    assert [v.command_id for v in ledger.recoveries(primary.command_id,
                                                    CommandKind.COMPENSATE)] == [
        undo.command_id]
    assert ledger.recoveries(primary.command_id, CommandKind.CANCEL) == []
    assert ledger.recoveries(second.command_id) == []
    assert trail_rows(dsn) == before


def test_lookups_refuse_bad_input(ledger: CommandLedger, dsn: str) -> None:
    """Bad input is InvalidInput, an unknown workspace or command NotFound; nothing is
    written either way."""
    done = _run(ledger, "k")
    before = trail_rows(dsn)
    for workspace, key in (("desk", ""), ("desk", "   "), ("desk", "k" * 201), ("", "k"),
                           (5, "k"), ("desk", None), ("desk", "a\x00b")):
        with pytest.raises(InvalidInput):
            ledger.find(workspace, key)  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="unknown workspace"):
        ledger.find("no-such-desk", "k")
    with pytest.raises(NotFound, match="unknown command"):
        ledger.recoveries("00000000-0000-4000-8000-000000000000")
    for bad in (5, None, "x" * 10_000):
        with pytest.raises(InvalidInput):
            ledger.recoveries(bad)  # type: ignore[arg-type]
    for kind in ("primary", "undo", CommandKind.PRIMARY):
        with pytest.raises(InvalidInput):
            ledger.recoveries(done.command_id, kind)
    assert trail_rows(dsn) == before


# -- the trigger ---------------------------------------------------------------------------------


def run_trigger(trigger: CommandTrigger, limit: float = 60.0) -> tuple[dict[str, Any], float]:
    async def first() -> Any:
        return await asyncio.wait_for(anext(trigger.run()), limit)

    started = time.monotonic()
    event = asyncio.run(first())
    return event.payload, time.monotonic() - started


def test_trigger_wakes_when_the_execution_ends(ledger: CommandLedger, dsn: str) -> None:
    """A task waiting for an earlier try's running execution resumes when it ends, on the
    command channel (nothing is delivered to an inbox), long before its 30 s poll; changes of
    other commands do not end the wait."""
    release = threading.Event()
    with in_background(lambda: _run(ledger, "running", lambda: release.wait(20) and "done")
                       ) as running:
        deadline = time.monotonic() + 10
        while ledger.find("desk", "running") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        view = ledger.find("desk", "running")
        assert view is not None and view.state is S.STARTED

        def elsewhere_then_end() -> None:
            wait_for_listener(dsn)
            _run(ledger, "elsewhere")  # another command's changes: no wake-up for ours
            time.sleep(0.5)
            release.set()

        trigger = CommandTrigger(command_id=view.command_id, workspace="desk",
                                 poll_interval=30, dsn=dsn)
        with in_background(elsewhere_then_end) as ending:
            payload, took = run_trigger(trigger)
            ending.result(timeout=10)
    assert running.result(timeout=10).state is S.EXECUTED
    assert payload == {"status": "ready", "command_id": view.command_id, "state": "executed",
                       "declined": False}
    assert took < WAKE_BOUND, f"took {took:.1f} s: the trigger waited for its poll"


def test_trigger_wakes_on_a_decline(ledger: CommandLedger, dsn: str) -> None:
    """A decline leaves the state at confirmation_required; it is notified all the same, and
    the trigger fires with declined = true."""
    view = _run(ledger, "to-decline", auto_confirm=None)
    assert view.state is S.CONFIRMATION_REQUIRED

    def decline_later() -> Any:
        wait_for_listener(dsn)
        time.sleep(0.3)
        return ledger.confirmation_envelope("bob", view.command_id, "decline")

    trigger = CommandTrigger(command_id=view.command_id, workspace="desk", poll_interval=30,
                             dsn=dsn)
    with in_background(decline_later) as declining:
        payload, took = run_trigger(trigger)
        assert declining.result(timeout=10).declined
    assert payload == {"status": "ready", "command_id": view.command_id,
                       "state": "confirmation_required", "declined": True}
    assert took < WAKE_BOUND
