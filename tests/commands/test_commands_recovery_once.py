"""One recovery of a command at a time, on a real Postgres (issue 22, "the human highway acts
once"): a standing retry holds back a compensation and the reverse, nothing starts on a
compensated target, and recoveries racing on one target (threads, and separate processes)
leave exactly one recovery command; the losers are refused and write nothing, neither a
command nor a trail entry nor an envelope."""

from __future__ import annotations

import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agentpost.protocol.commands import CommandKind, CommandState
from agentpost.protocol.errors import Conflict, InvalidTransition
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.highway import recover_as_person
from smcl_support import spawn_together

S = CommandState
RACERS = 4
PEOPLE = ("ann", "bob", "cat", "dan")


@pytest.fixture
def ws(store: EnvelopeStore) -> str:
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    return store.create_workspace("agent", workspace_id="desk").id


def _run(ledger: CommandLedger, ws: str, key: str, fn: Any = lambda: "ok") -> Any:
    return ledger.run(ws, key, fn, action="book", mutating=True, auto_confirm="low-risk")


def _fail() -> None:
    raise RuntimeError("card declined")


def _confirmed(ledger: CommandLedger, cid: str, kind: str, key: str) -> Any:
    """A recovery submitted, its confirmation asked for and given by a person."""
    asked = ledger.request_confirmation(ledger.recover(cid, kind, key).command_id)
    return ledger.confirmation_envelope("alice", asked.command_id)


def _count(store: EnvelopeStore, sql: str, *args: Any) -> int:
    return store.db.scalar(sql, args)


def _written_since(store: EnvelopeStore, trail_id: int) -> list[tuple[str, str]]:
    return [tuple(r) for r in store.db.fetchall(
        "SELECT chain, event FROM agentpost.trail WHERE id > %s ORDER BY id", (trail_id,))]


def _last_trail_id(store: EnvelopeStore) -> int:
    return store.db.scalar("SELECT coalesce(max(id), 0) FROM agentpost.trail")


# ------------------------------------------------------------------ the rules, one at a time


def test_a_waiting_retry_holds_back_a_compensation(store: EnvelopeStore, ledger: CommandLedger,
                                                   ws: str) -> None:
    """A confirmed retry waits for its execution: a compensation of its target is refused
    (Conflict naming the retry) and writes nothing, so what a person declared undone is never
    done again; once the retry ran, the target may be compensated."""
    cid = _run(ledger, ws, "k", _fail).command_id
    retry = _confirmed(ledger, cid, "retry", "again")
    assert retry.state is S.CONFIRMED
    trail, commands = _last_trail_id(store), _count(store, "SELECT count(*) FROM "
                                                           "agentpost.commands")
    undone: list[int] = []
    with pytest.raises(Conflict, match=f"retry {retry.command_id} is confirmed"):
        ledger.compensate(cid, "undo", lambda: undone.append(1), auto_confirm="saga")
    assert undone == [] and ledger.view(cid).state is S.FAILED
    assert _written_since(store, trail) == []
    assert _count(store, "SELECT count(*) FROM agentpost.commands") == commands
    ran: list[int] = []
    assert ledger.execute(retry.command_id, lambda: ran.append(1)).state is S.EXECUTED
    assert ran == [1]
    ledger.compensate(cid, "undo", lambda: "refunded", auto_confirm="saga")
    assert ledger.view(cid).state is S.COMPENSATED
    assert store.verify_trail().ok


def test_a_standing_compensation_holds_back_a_retry(store: EnvelopeStore,
                                                    ledger: CommandLedger, ws: str) -> None:
    """The reverse: a compensation waiting for its confirmation holds back a retry and a
    reprocess; declined, it no longer stands and the retry may go."""
    cid = _run(ledger, ws, "k", _fail).command_id
    undo = ledger.request_confirmation(ledger.recover(cid, "compensate", "undo").command_id)
    for kind in ("retry", "reprocess"):
        with pytest.raises(Conflict, match=f"compensate {undo.command_id} is"
                                           " confirmation_required"):
            ledger.recover(cid, kind, f"{kind}-1", lambda: "again")
    ledger.confirmation_envelope("alice", undo.command_id, "decline")
    retry = ledger.recover(cid, "retry", "retry-2", lambda: "again", auto_confirm="p")
    assert retry.state is S.EXECUTED and ledger.view(cid).state is S.FAILED


def test_a_recovery_never_starts_on_a_compensated_target(store: EnvelopeStore,
                                                         ledger: CommandLedger,
                                                         ws: str) -> None:
    """SMCL target_not_recoverable for every kind: a retry confirmed before its target was
    compensated never starts (fn not called, refusal recorded, the retry stays authorized).
    The ledger no longer lets a compensation in while a retry stands, so the target is
    compensated here the way a version before that rule could leave it: directly."""
    cid = _run(ledger, ws, "k", _fail).command_id
    retry = _confirmed(ledger, cid, "retry", "again")
    store.db.scalar("UPDATE agentpost.commands SET state = 'compensated' WHERE id = %s"
                    " RETURNING id",
                    (cid,))
    ran: list[int] = []
    with pytest.raises(InvalidTransition, match="target_not_recoverable"):
        ledger.execute(retry.command_id, lambda: ran.append(1))
    assert ran == [] and ledger.view(retry.command_id).state is S.AUTHORIZED
    last = ledger.evidence(retry.command_id)[-1].body
    assert (last["lifecycle"]["evidence_type"], last["refusal"]) == (
        "invalid_transition_attempt", "target_not_recoverable")


def test_a_recovery_that_can_never_start_does_not_stand(store: EnvelopeStore,
                                                        ledger: CommandLedger,
                                                        ws: str) -> None:
    """A cancel asked for while its target ran, confirmed after the target ended, can never
    start (the target offers no cancel any more): it does not hold back a compensation."""
    cid = ledger.submit(ws, "k", action="book", mutating=True, auto_confirm="p").command_id
    asked: list[str] = []

    def work() -> str:
        asked.append(ledger.recover(cid, "cancel", "stop").command_id)
        return "done"

    assert ledger.execute(cid, work).state is S.EXECUTED
    cancel = ledger.confirmation_envelope(
        "alice", ledger.request_confirmation(asked[0]).command_id)
    assert cancel.state is S.CONFIRMED
    undo = ledger.compensate(cid, "undo", lambda: "released", auto_confirm="saga")
    assert undo.state is S.EXECUTED and ledger.view(cid).state is S.COMPENSATED
    with pytest.raises(InvalidTransition, match="target_not_recoverable"):
        ledger.execute(cancel.command_id, lambda: "stop")


# ------------------------------------------------------------------ racing recoveries


def _report(racer: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "ok", racer().command_id
    except Conflict as exc:
        return "conflict", str(exc)
    except BaseException:
        return "error", traceback.format_exc()


def _compensate_fast(dsn: str, cid: str, i: int) -> Any:
    """The fast path: submit, auto-confirm, authorize, start and execute in two calls."""
    with CommandLedger(dsn) as ledger:
        return ledger.compensate(cid, f"undo-{i}", lambda: time.sleep(0.3) or {"by": i},
                                 auto_confirm="saga")


def _compensate_as_person(dsn: str, cid: str, i: int) -> Any:
    """The human highway: a person's compensation, confirmed by their envelope."""
    with CommandLedger(dsn) as ledger:
        return recover_as_person(ledger, cid, "compensate", f"highway-{i}", PEOPLE[i],
                                 perform=lambda: time.sleep(0.3) or {"by": PEOPLE[i]})


RACES = {"fast": _compensate_fast, "person": _compensate_as_person}


def _racer(race: str, dsn: str, cid: str, i: int, barrier: Any, results: Any) -> None:
    barrier.wait(timeout=60)
    results.put(_report(lambda: RACES[race](dsn, cid, i)))


def _race_threads(race: str, dsn: str, cid: str) -> list[tuple[str, str]]:
    barrier, results = threading.Barrier(RACERS), queue.Queue()
    threads = [threading.Thread(target=_racer, args=(race, dsn, cid, i, barrier, results))
               for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [results.get_nowait() for _ in threads]


def _race_processes(race: str, dsn: str, cid: str) -> list[tuple[str, str]]:
    return spawn_together(_racer, [(race, dsn, cid, i) for i in range(RACERS)])


@pytest.mark.parametrize("race", sorted(RACES))
@pytest.mark.parametrize("how", ["threads", "processes"])
def test_racing_compensations_leave_one_command(store: EnvelopeStore, dsn: str, ws: str,
                                                race: str, how: str) -> None:
    """Compensations of one command racing (threads, or separate processes, on one
    database): the target is compensated once by exactly one compensate command; every
    loser is refused (Conflict) and wrote nothing: no command, no trail entry (neither in
    its own chains nor in the target's), no confirmation envelope."""
    with CommandLedger(store) as ledger:
        cid = _run(ledger, ws, "booked").command_id
    trail = _last_trail_id(store)
    reports = (_race_threads if how == "threads" else _race_processes)(race, dsn, cid)
    assert not [r for r in reports if r[0] == "error"], reports
    winners = [r[1] for r in reports if r[0] == "ok"]
    assert len(winners) == 1, reports
    assert all(r[0] == "conflict" for r in reports if r[0] != "ok")
    rows = store.db.fetchall("SELECT id, state FROM agentpost.commands WHERE "
                             "target_command_id = %s", (cid,))
    assert [tuple(r) for r in rows] == [(winners[0], "executed")]
    with CommandLedger(store) as ledger:
        assert ledger.view(cid).state is S.COMPENSATED
    written = _written_since(store, trail)
    chains = {c for c, _ in written}
    allowed = {f"command:{winners[0]}", f"command:{cid}"}
    if race == "person":  # the winner's confirmation envelope: its sender's chain and the inbox
        allowed |= {f"human:{p}" for p in PEOPLE} | {ws}
        assert len({c for c in chains if c.startswith("human:")}) == 1
        assert _count(store, "SELECT count(*) FROM agentpost.envelopes WHERE type = "
                             "'command.confirmation'") == 1
    assert chains <= allowed, written
    assert not [e for _, e in written if e in ("command_invalid_transition_attempt",
                                               "command_duplicate_delivery")], written
    assert [e for c, e in written if c == f"command:{cid}"] == [
        "command_recovery_requested", "command_state_change"]
    assert store.verify_trail().ok


def test_a_replayed_person_recovery_lands_on_the_same_command(store: EnvelopeStore,
                                                              ledger: CommandLedger,
                                                              ws: str) -> None:
    """One person's confirmation posted several times at once (a double click) and again
    later: every call answers with the same recovery, one confirmation envelope is sent, and
    nothing is recorded twice (no duplicate or refused evidence)."""
    cid = _run(ledger, ws, "k", _fail).command_id
    barrier, results = threading.Barrier(RACERS), queue.Queue()

    def click() -> None:
        with CommandLedger(store) as mine:
            barrier.wait(timeout=60)
            results.put(_report(lambda: recover_as_person(
                mine, cid, CommandKind.RETRY, "highway:retry/once", "ann")))

    threads = [threading.Thread(target=click) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    reports = [results.get_nowait() for _ in threads]
    assert {r[0] for r in reports} == {"ok"} and len({r[1] for r in reports}) == 1, reports
    again = recover_as_person(ledger, cid, "retry", "highway:retry/once", "ann")
    assert again.command_id == reports[0][1] and again.state is S.CONFIRMED
    assert [r.command_id for r in ledger.recoveries(cid)] == [again.command_id]
    assert _count(store, "SELECT count(*) FROM agentpost.envelopes WHERE type = "
                         "'command.confirmation'") == 1
    events = [e.body["lifecycle"]["evidence_type"] for e in ledger.evidence(again.command_id)]
    assert events == ["state_change"] * 3
    with pytest.raises(Conflict, match="was used for command"):
        recover_as_person(ledger, cid, "compensate", "highway:retry/once", "ann")


def _submit_compensation(ledger: CommandLedger, cid: str, ws: str, key: str) -> dict[str, Any]:
    """command_submit of a compensation, without advancing it."""
    return ledger.db.scalar(
        "SELECT agentpost.command_submit(%s, %s, %s, 'compensate', %s, true, 'saga', 'book',"
        " %s, '{}'::jsonb, '{}'::jsonb, false, 30000)",
        (str(uuid.uuid4()), ws, key, cid, ws))


def test_a_recovery_replayed_while_its_first_submission_commits_is_a_duplicate(
        store: EnvelopeStore, ledger: CommandLedger, dsn: str, ws: str) -> None:
    """The same recovery (one idempotency key: saga resumers racing on one step) submitted
    while its first submission holds the target's lock: the replay waits, then answers with
    the first's command as a duplicate, not a Conflict with it (sql/0077); a recovery under
    another key is still refused."""
    cid = _run(ledger, ws, "booked").command_id
    answers: queue.Queue[Any] = queue.Queue()

    def replay() -> None:
        with CommandLedger(dsn) as other:
            try:
                answers.put(("ok", _submit_compensation(other, cid, ws, "undo")))
            except Conflict as exc:
                answers.put(("conflict", str(exc)))

    with CommandLedger(dsn) as first, first.db.transaction():
        created = _submit_compensation(first, cid, ws, "undo")
        waiter = threading.Thread(target=replay)
        waiter.start()
        time.sleep(0.5)  # the replay is now waiting for the target's row lock
        assert waiter.is_alive() and answers.empty()
    waiter.join(timeout=60)
    answer = answers.get(timeout=1)
    assert answer[0] == "ok", answer
    assert answer[1]["status"] == "duplicate"
    assert answer[1]["view"]["command_id"] == created["view"]["command_id"]
    assert [r.command_id for r in ledger.recoveries(cid)] == [created["view"]["command_id"]]
    with pytest.raises(Conflict, match="already has a recovery standing"):
        ledger.compensate(cid, "another", lambda: None, auto_confirm="saga")
