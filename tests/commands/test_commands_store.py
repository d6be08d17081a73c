"""SMCL commands on a real Postgres: the machine enforced in the database, evidence in the
signed trail, the two-call fast path, idempotency (also across racing processes), recovery,
crashed executors and the view."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

from agentpost.protocol.commands import (
    ALLOWED,
    RECOVERY_OPTIONS,
    REQUIRED_CONTEXT,
    CommandKind,
    CommandState,
)
from agentpost.protocol.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    NotFound,
)
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from smcl_support import race

S = CommandState
RACERS = 4
FULL_RUN = ["received→canonicalized", "canonicalized→authz_pending", "authz_pending→authorized",
            "authorized→started", "started→executed"]


@pytest.fixture
def ws(store: EnvelopeStore) -> str:
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    return store.create_workspace("agent", workspace_id="desk").id


def _bodies(ledger: CommandLedger, command_id: str) -> list[dict[str, Any]]:
    return [e.body for e in ledger.evidence(command_id)]


def _transitions(ledger: CommandLedger, command_id: str) -> list[str]:
    return [b["lifecycle"]["transition"] for b in _bodies(ledger, command_id)
            if b["lifecycle"]["evidence_type"] == "state_change"]


def _run(ledger: CommandLedger, ws: str, key: str, fn: Any = lambda: "ok", **kw: Any) -> Any:
    kw = {"action": "book", "mutating": True, "auto_confirm": "low-risk", **kw}
    return ledger.run(ws, key, fn, **kw)


def test_database_table_matches_the_protocol(store: EnvelopeStore) -> None:
    """RFC 'Allowed Transitions' MUST be enforced: the table in Postgres is the RFC's list."""
    rows = store.db.fetchall(
        "SELECT from_state, to_state, required FROM agentpost.command_transitions")
    assert {(S(a), S(b)) for a, b, _ in rows} == ALLOWED
    for a, b, required in rows:
        assert tuple(required) == REQUIRED_CONTEXT.get((S(a), S(b)), ())


def test_database_recovery_options_match_the_protocol(store: EnvelopeStore) -> None:
    """RFC section X 'next allowed recovery options': one table for both sides."""
    rows = store.db.fetchall("SELECT state, kind FROM agentpost.command_recovery")
    assert {(S(a), CommandKind(b)) for a, b in rows} == {
        (state, kind) for state, kinds in RECOVERY_OPTIONS.items() for kind in kinds}


def test_run_is_the_whole_lifecycle_with_evidence_in_two_calls(
        store: EnvelopeStore, ledger: CommandLedger, ws: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RFC 'Evidence Emission': every transition emits command_id, transition, timestamp and
    evidence_type (plus the fields its decision needs), signed in the trail; the fast path is
    two round trips. RFC 'Security & Privacy': args are redacted in the evidence."""
    calls: list[str] = []
    real = ledger.db.scalar
    monkeypatch.setattr(ledger.db, "scalar", lambda sql, p=(): calls.append(sql) or real(sql, p))
    done = _run(ledger, ws, "book-1", lambda: {"room": 12}, args={"email": "a@b", "n": 2})
    assert len(calls) == 2
    monkeypatch.undo()
    assert done.state is S.EXECUTED and done.outcome == {"room": 12}
    assert done.args == {"email": "a@b", "n": 2}  # the row keeps them for retry/reprocess
    bodies = _bodies(ledger, done.command_id)
    assert [b["lifecycle"]["transition"] for b in bodies] == FULL_RUN
    for body in bodies:
        assert set(body["lifecycle"]) == {"command_id", "transition", "timestamp",
                                          "evidence_type"}
        a, b = body["lifecycle"]["transition"].split("→")
        assert all(body.get(k) for k in REQUIRED_CONTEXT.get((S(a), S(b)), ())), body
        assert body["event"]
    assert bodies[0]["args"] == {"email": "[redacted]", "n": 2}
    assert bodies[3]["confirmation"] == "auto_confirm:low-risk"
    assert store.verify_trail().ok


def test_invalid_transition_is_refused_recorded_and_changes_nothing(
        store: EnvelopeStore, ledger: CommandLedger, ws: str) -> None:
    """RFC 'Invalid Transitions': reject, emit invalid_transition_attempt, keep the state."""
    cid = _run(ledger, ws, "k").command_id
    before = ledger.view(cid)
    for target in (S.STARTED, S.RECEIVED, S.AUTHZ_PENDING):
        with pytest.raises(InvalidTransition, match="transition_not_allowed"):
            ledger.transition(cid, target)
    assert ledger.view(cid) == before
    last = _bodies(ledger, cid)[-3]
    assert last["lifecycle"]["evidence_type"] == "invalid_transition_attempt"
    assert last["lifecycle"]["transition"] == "executed→started"
    assert store.verify_trail().ok


def test_gate_decisions_cannot_be_taken_directly(ledger: CommandLedger, ws: str) -> None:
    """Gates decide (RFC 'Security & Consistency': no bypass): confirmed, authorized, started
    and the execution's ends are refused on the generic path, with nothing changed."""
    cid = ledger.submit(ws, "k", action="book", mutating=True).command_id
    ledger.request_confirmation(cid)
    count = len(_bodies(ledger, cid))
    with pytest.raises(Forbidden, match="confirmation"):
        ledger.transition(cid, S.CONFIRMED, context={"confirmed_by": "me"})
    read = ledger.submit(ws, "r", action="book", mutating=False).command_id
    ledger.transition(read, S.AUTHZ_PENDING)
    with pytest.raises(Forbidden, match="permission matrix"):
        ledger.transition(read, S.AUTHORIZED, context={"decided_by": "me"})
    assert ledger.view(cid).state is S.CONFIRMATION_REQUIRED
    assert ledger.view(read).state is S.AUTHZ_PENDING
    assert len(_bodies(ledger, cid)) == count


def test_mutating_cannot_start_without_confirmation(ledger: CommandLedger, ws: str) -> None:
    """RFC: for any mutating command, started MUST NOT occur unless confirmed occurred (the
    pre-confirm validation path may authorize it, never start it)."""
    cid = ledger.submit(ws, "k", action="book", mutating=True).command_id
    ledger.transition(cid, S.AUTHZ_PENDING)
    assert ledger.authorize(cid).state is S.AUTHORIZED
    with pytest.raises(InvalidTransition, match="not_confirmed"):
        ledger.execute(cid, lambda: 1)
    assert ledger.view(cid).state is S.AUTHORIZED
    waiting = ledger.submit(ws, "w", action="book", mutating=True).command_id
    with pytest.raises(InvalidTransition):
        ledger.execute(waiting, lambda: 1)


def test_auto_confirm_is_recorded(ledger: CommandLedger, ws: str) -> None:
    """RFC: a policy-declared safe auto-confirm MUST be auditable."""
    cid = _run(ledger, ws, "k", auto_confirm="low-risk").command_id
    bodies = _bodies(ledger, cid)
    assert bodies[0]["auto_confirm"] == "low-risk" == bodies[1]["auto_confirm"]


def test_read_only_runs_without_confirmation(ledger: CommandLedger, ws: str) -> None:
    """RFC notes: read-only commands MAY skip confirmation states (S2/S3)."""
    done = _run(ledger, ws, "k", mutating=False, auto_confirm=None)
    assert done.state is S.EXECUTED
    assert _transitions(ledger, done.command_id) == FULL_RUN


def test_bad_input_changes_nothing(store: EnvelopeStore, ledger: CommandLedger,
                                   ws: str) -> None:
    """Bad input: clear errors, nothing changed, the trail still verifies."""
    cid = ledger.submit(ws, "k", action="book", mutating=True).command_id
    count, entries = len(_bodies(ledger, cid)), len(store.trail())
    bad: list[tuple[type[Exception], dict[str, Any]]] = [
        (InvalidInput, {"action": "no-such-type"}),
        (NotFound, {"executor": "no-such-ws"}),
        (InvalidInput, {"mutating": "yes"}),
        (InvalidInput, {"idempotency_key": " "}),
        (InvalidInput, {"auto_confirm": " "}),
        (InvalidInput, {"args": {"x": object()}}),
        (InvalidInput, {"context": {"x": float("nan")}}),
        (InvalidInput, {"kind": "bogus"}),
        (NotFound, {"kind": "retry", "target_command_id": "no-such-command"}),
        (InvalidInput, {"target_command_id": cid}),
    ]
    for error, change in bad:
        args = {"idempotency_key": "k2", "action": "book", "mutating": True, **change}
        with pytest.raises(error):
            ledger.submit(ws, **args)
    with pytest.raises(NotFound):
        ledger.submit("no-such-ws", "k", action="book", mutating=True)
    with pytest.raises(InvalidInput):
        ledger.transition(cid, "bogus")
    with pytest.raises(NotFound):
        ledger.transition("no-such-command", S.CONFIRMED)
    with pytest.raises(NotFound):
        ledger.view("no-such-command")
    with pytest.raises(NotFound):
        ledger.execute("no-such-command", lambda: 1)
    for bad_ttl in (0, -1, True, "60", float("nan")):
        with pytest.raises(InvalidInput):
            CommandLedger(store, lease_ttl=bad_ttl)  # type: ignore[arg-type]
    for bad_limit in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput):
            ledger.sweep_stuck(limit=bad_limit)  # type: ignore[arg-type]
    assert ledger.view(cid).state is S.CANONICALIZED
    assert len(_bodies(ledger, cid)) == count and len(store.trail()) == entries
    assert store.verify_trail().ok


def test_duplicate_in_terminal_state_replays(ledger: CommandLedger, ws: str) -> None:
    """RFC 'Idempotency': terminal duplicates MUST replay the outcome and MUST NOT re-enter
    execution; the duplicate is recorded."""
    calls: list[int] = []
    first = _run(ledger, ws, "pay-1", lambda: calls.append(1) or "paid")
    again = _run(ledger, ws, "pay-1", lambda: calls.append(1) or "again")
    assert again.duplicate and again.command_id == first.command_id and again.outcome == "paid"
    assert ledger.execute(first.command_id, lambda: calls.append(1)).state is S.EXECUTED
    assert calls == [1]
    with pytest.raises(Conflict):
        _run(ledger, ws, "pay-1", mutating=False)
    dup = _bodies(ledger, first.command_id)[-1]
    assert dup["lifecycle"]["evidence_type"] == "duplicate_delivery"


def test_duplicate_while_started_is_in_progress(ledger: CommandLedger, ws: str) -> None:
    """RFC 'Idempotency': a duplicate while started MUST return an in_progress view and MUST
    NOT create a parallel execution."""
    inner: list[Any] = []

    def work() -> str:
        inner.append(_run(ledger, ws, "k", lambda: "second"))
        inner.append(ledger.execute(inner[0].command_id, lambda: "third"))
        return "first"

    assert _run(ledger, ws, "k", work).outcome == "first"
    assert all(v.in_progress and v.state is S.STARTED for v in inner)
    assert inner[0].duplicate


def test_failure_then_compensation(store: EnvelopeStore, ledger: CommandLedger,
                                   ws: str) -> None:
    """RFC 'Compensation Model': compensated only after a compensate command executed, in the
    same transaction, with evidence naming it; a failed compensation leaves the target as it
    was; append-only."""
    failed = _run(ledger, ws, "k", lambda: 1 / 0)
    cid = failed.command_id
    assert failed.state is S.FAILED and "ZeroDivisionError" in (failed.reason or "")
    assert CommandKind.COMPENSATE in failed.recovery_options
    with pytest.raises(InvalidTransition, match="compensation_not_proven"):
        ledger.transition(cid, S.COMPENSATED, context={"compensation_command_id": "x"})
    broken = ledger.compensate(cid, "undo-1", lambda: 1 / 0, auto_confirm="saga")
    assert broken.state is S.FAILED and ledger.view(cid).state is S.FAILED
    comp = ledger.compensate(cid, "undo-2", lambda: {"refunded": True}, auto_confirm="saga")
    assert comp.state is S.EXECUTED and comp.target_command_id == cid
    final = ledger.view(cid)
    assert final.terminal_outcome is S.COMPENSATED and final.recovery_options == ()
    assert final.reason == failed.reason  # compensation appends, never rewrites
    last = _bodies(ledger, cid)[-1]
    assert last["lifecycle"]["transition"] == "failed→compensated"
    assert last["compensation_command_id"] == comp.command_id
    links = [b["recovery_command_id"] for b in _bodies(ledger, cid)
             if b["lifecycle"]["evidence_type"] == "recovery_requested"]
    assert links == [broken.command_id, comp.command_id]
    with pytest.raises(Conflict):
        ledger.compensate(cid, "undo-3", lambda: 1, auto_confirm="saga")
    replay = ledger.compensate(cid, "undo-2", lambda: 1, auto_confirm="saga")
    assert replay.duplicate and replay.command_id == comp.command_id
    assert store.verify_trail().ok


def test_compensating_an_executed_command_keeps_its_outcome(ledger: CommandLedger,
                                                             ws: str) -> None:
    """RFC 'Compensation Model': executed -> compensated; compensation MUST be append-only."""
    cid = _run(ledger, ws, "k", lambda: {"booked": 7}).command_id
    ledger.compensate(cid, "undo", lambda: {"released": 7}, auto_confirm="saga")
    final = ledger.view(cid)
    assert final.state is S.COMPENSATED and final.outcome == {"booked": 7}


def test_a_target_is_compensated_once(store: EnvelopeStore, ledger: CommandLedger,
                                      ws: str) -> None:
    """A second compensate command submitted while the first stands is refused (Conflict)
    and writes nothing, so a compensation never runs twice and no second command is left
    stranded; once the first executed, the target offers no compensation at all."""
    cid = _run(ledger, ws, "k").command_id
    first = ledger.recover(cid, "compensate", "u1", auto_confirm="saga")
    trail = store.db.scalar("SELECT count(*) FROM agentpost.trail")
    with pytest.raises(Conflict, match=f"compensate {first.command_id} is canonicalized"):
        ledger.recover(cid, "compensate", "u2", auto_confirm="saga")
    assert store.db.scalar("SELECT count(*) FROM agentpost.trail") == trail
    assert ledger.find(ws, "u2") is None
    ran: list[str] = []
    ledger.execute(first.command_id, lambda: ran.append("first"))
    with pytest.raises(Conflict, match="cannot target a command in state compensated"):
        ledger.compensate(cid, "u3", lambda: ran.append("third"), auto_confirm="saga")
    assert ran == ["first"] and ledger.view(cid).state is S.COMPENSATED
    assert [r.command_id for r in ledger.recoveries(cid)] == [first.command_id]


def test_recovery_commands_are_gated_like_primaries(ledger: CommandLedger, ws: str) -> None:
    """RFC 'Recovery-Command Rules': same FSM, target_command_id, gated (a mutating recovery
    without an auto-confirm policy waits for a confirmation)."""
    cid = _run(ledger, ws, "k", lambda: 1 / 0).command_id
    ran: list[int] = []
    retry = ledger.recover(cid, "retry", "again", lambda: ran.append(1))
    assert retry.state is S.CONFIRMATION_REQUIRED and ran == []
    assert retry.target_command_id == cid and retry.kind is CommandKind.RETRY
    retry = ledger.confirmation_envelope("alice", retry.command_id)
    assert ledger.execute(retry.command_id, lambda: "worked").state is S.EXECUTED
    assert ledger.view(cid).state is S.FAILED  # a retry is its own command
    assert _transitions(ledger, retry.command_id)[-1] == "started→executed"


def test_retry_and_reprocess_inherit_action_executor_and_args(ledger: CommandLedger,
                                                              ws: str) -> None:
    """The row keeps the args so a retry or reprocess can run the same request again."""
    cid = _run(ledger, ws, "k", lambda: 1 / 0, args={"room": 3}).command_id
    retry = ledger.recover(cid, "retry", "r", lambda: "ok", auto_confirm="retry-policy")
    assert (retry.action, retry.executor, retry.args) == ("book", "desk", {"room": 3})
    reprocess = ledger.recover(cid, "reprocess", "p", lambda: "ok", auto_confirm="p")
    assert reprocess.state is S.EXECUTED


def test_cancel_of_a_started_command(store: EnvelopeStore, ledger: CommandLedger,
                                     ws: str) -> None:
    """RFC started -> canceled through a cancel command; the executor's late end is refused
    and recorded; the target keeps canceled."""
    seen: list[Any] = []

    def work() -> str:
        seen.append(ledger.cancel(seen_id[0], "stop", auto_confirm="ops"))
        return "finished anyway"

    seen_id: list[str] = []
    cid = ledger.submit(ws, "k", action="book", mutating=True, auto_confirm="x").command_id
    seen_id.append(cid)
    end = ledger.execute(cid, work)
    assert seen[0].state is S.EXECUTED and seen[0].kind is CommandKind.CANCEL
    assert end.state is S.CANCELED and end.reason == f"canceled_by:{seen[0].command_id}"
    bodies = _bodies(ledger, cid)
    canceled = next(b for b in bodies if b["lifecycle"]["transition"] == "started→canceled")
    assert canceled["cancel_command_id"] == seen[0].command_id
    assert bodies[-1]["lifecycle"]["evidence_type"] == "invalid_transition_attempt"
    assert bodies[-1]["lifecycle"]["transition"] == "canceled→executed"
    assert store.verify_trail().ok


def test_a_live_executor_keeps_its_lease(store: EnvelopeStore, ws: str) -> None:
    """A long execution in a live process is not swept: the ledger renews its lease."""
    with CommandLedger(store, lease_ttl=0.3) as ledger:
        swept: list[list[str]] = []

        def slow() -> str:
            time.sleep(1.0)
            swept.append(ledger.sweep_stuck())
            return "done"

        assert _run(ledger, ws, "k", slow).state is S.EXECUTED
        assert swept == [[]]


def _executor(dsn: str, ws: str, started: Any) -> None:
    with CommandLedger(dsn, lease_ttl=0.5) as ledger:
        ledger.run(ws, "crash", lambda: started.set() or time.sleep(600), action="book",
                   mutating=True, auto_confirm="low-risk")


def test_a_killed_executor_is_swept_to_failed(store: EnvelopeStore, ledger: CommandLedger,
                                              dsn: str, ws: str) -> None:
    """A crashed executor (SIGKILL) leaves a started command; while its lease lives a
    duplicate is in progress, and once it expired sweep_stuck fails it (executor_lost) with
    evidence, so a command is never in progress forever; recovery may follow."""
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_executor, args=(dsn, ws, started), daemon=True)
    proc.start()
    try:
        assert started.wait(60)
        dup = _run(ledger, ws, "crash")
        assert dup.duplicate and dup.in_progress
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join(30)
    assert ledger.sweep_stuck() == []  # the lease is still running
    time.sleep(0.8)
    [cid] = ledger.sweep_stuck()
    view = ledger.view(cid)
    assert view.state is S.FAILED and view.reason == "executor_lost"
    assert not view.in_progress and CommandKind.RETRY in view.recovery_options
    last = _bodies(ledger, cid)[-1]
    assert (last["lifecycle"]["transition"], last["reason"]) == ("started→failed",
                                                                 "executor_lost")
    assert ledger.sweep_stuck() == []
    assert store.verify_trail().ok


def test_processes_racing_one_key_execute_once(store: EnvelopeStore, dsn: str,
                                               ws: str) -> None:
    """RFC 'Idempotency': never a parallel execution, also when processes race on one key."""
    request = {"workspace": ws, "idempotency_key": "race-key", "action": "book",
               "mutating": True, "auto_confirm": "low-risk"}
    reports = race(dsn, request, RACERS, pause=0.2)
    assert len({r[1] for r in reports}) == 1
    assert sum(r[2] for r in reports) == 1
    assert {r[3] for r in reports} <= {"started", "executed"}
    assert store.verify_trail().ok


def test_forged_command_evidence_is_detected(store: EnvelopeStore, ledger: CommandLedger,
                                             ws: str) -> None:
    """RFC 'Security': evidence artifacts MUST be signed and tamper-evident."""
    cid = ledger.submit(ws, "k", action="book", mutating=True).command_id
    ledger.request_confirmation(cid)
    ledger.confirmation_envelope("alice", cid)
    assert store.verify_trail().ok
    store.db.scalar(
        "UPDATE agentpost.trail SET record = replace(record, 'human:alice', 'human:mallory')"
        " WHERE chain = %s RETURNING 1", (f"command:{cid}",))
    result = store.verify_trail()
    assert not result.ok and result.failure_chain == f"command:{cid}"


def test_a_command_row_edited_outside_the_ledger_is_detected(
        store: EnvelopeStore, ledger: CommandLedger, ws: str) -> None:
    """RFC 'Security' (tamper-evident) and 'terminal-state protection': a command's row must
    be where its last signed state_change left it, so marking a failed command executed in
    the table, or cutting its last artifact off the chain, fails verify_trail."""
    cid = _run(ledger, ws, "k", fn=_fails).command_id
    assert store.verify_trail().ok
    store.db.scalar("UPDATE agentpost.commands SET state = 'executed' WHERE id = %s"
                    " RETURNING 1", (cid,))
    check = store.verify_trail()
    assert not check.ok and check.failure_chain == f"command:{cid}"
    store.db.scalar("UPDATE agentpost.commands SET state = 'failed' WHERE id = %s"
                    " RETURNING 1", (cid,))
    assert store.verify_trail().ok
    store.db.scalar("DELETE FROM agentpost.trail WHERE chain = %s AND chain_seq ="
                    " (SELECT max(chain_seq) FROM agentpost.trail WHERE chain = %s)"
                    " RETURNING 1", (f"command:{cid}", f"command:{cid}"))
    check = store.verify_trail()
    assert not check.ok and check.failure_chain == f"command:{cid}"


def _fails() -> None:
    raise RuntimeError("the room is taken")


def test_replayed_command_evidence_is_detected(store: EnvelopeStore, ledger: CommandLedger,
                                               ws: str) -> None:
    """Replayed evidence: an old, validly signed artifact appended again breaks the chain."""
    cid = _run(ledger, ws, "k").command_id
    store.db.scalar(
        "INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record,"
        " prev_hash, hash, mac) SELECT chain, 99, event, envelope_id, at, record, prev_hash,"
        " hash, mac FROM agentpost.trail WHERE chain = %s AND chain_seq = 2 RETURNING 1",
        (f"command:{cid}",))
    result = store.verify_trail()
    assert not result.ok and result.failure_chain == f"command:{cid}"
