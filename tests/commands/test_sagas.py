"""Sagas on a real Postgres (issue 5, "Sagas"): a sequence of commands in one unit of work
records its compensations as each step executes; when a later step fails, the compensations
of the executed steps run in reverse order, each itself a command with evidence; a failing
compensation is retried with backoff and, when exhausted, escalated as a blocking need.

Each test's docstring names the part of that requirement it holds."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentpost.marks import Action, Agent, MarkType, Need, PostgresMarkSpace, Scope
from agentpost.protocol.commands import CommandKind, CommandState
from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.smcl import SagaRunner
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.sagas import SagaAborted, SagaState, SagaWaiting
from dbtools import connect, query, rows

S = CommandState
TRIP = [("flight", "book"), ("hotel", "book"), ("car", "book")]
RACERS = 4


class World:
    """The side effects the handlers cause, in order, and the failures they are told to have."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []
        self.failures: dict[str, int] = {}  # handler name -> failures left

    def _effect(self, kind: str) -> Callable[[dict[str, Any]], Any]:
        def handler(args: dict[str, Any]) -> dict[str, Any]:
            if self.failures.get(kind, 0) > 0:
                self.failures[kind] -= 1
                raise RuntimeError(f"{kind} of {args['item']} is down")
            self.done.append((kind, args["item"]))
            return {"ok": args["item"]}
        return handler

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        return {"book": self._effect("book"), "cancel": self._effect("cancel"),
                "pay": self._effect("pay")}


@pytest.fixture
def ws(store: EnvelopeStore) -> str:
    store.define_role("agent")
    store.register_type("book", senders=["agent"], receivers=["agent"])
    store.register_type("pay", senders=["agent"], receivers=["agent"])
    return store.create_workspace("agent").id


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def runner(ledger: CommandLedger, world: World, sleeps: list[float]) -> SagaRunner:
    return SagaRunner(ledger, world.handlers(), sleep=sleeps.append)


@pytest.fixture
def space(dsn: str) -> Iterator[PostgresMarkSpace]:
    with PostgresMarkSpace(dsn=dsn, scopes=[Scope(name="sagas")], space="saga-tests") as space:
        yield space


def _trip(runner: SagaRunner, ws: str, key: str, *, fail_at: str | None = None) -> Any:
    """Book flight, hotel and car (each compensated by `cancel`), then pay; `fail_at` names
    the step whose command fails."""
    saga = runner.begin(ws, key)
    for item, handler in TRIP:
        fn: Any = handler if item != fail_at else _boom
        saga.step(item, fn, {"item": item}, action="book",
                  compensation=("cancel", {"item": item}), auto_confirm="test-policy")
    saga.step("payment", "pay" if fail_at != "payment" else _boom, {"item": "payment"},
              action="pay", auto_confirm="test-policy")
    return saga.complete()


def _boom() -> None:
    raise RuntimeError("no seats left")


def _saga_events(store: EnvelopeStore, saga_id: str) -> list[str]:
    return [e.event for e in store.trail(workspace_id=f"saga:{saga_id}")]


def _snapshot(dsn: str) -> tuple[Any, ...]:
    """What a refused call must leave unchanged: commands, sagas, steps and the trail."""
    return query(dsn, """
        SELECT (SELECT string_agg(id || state, ',' ORDER BY id) FROM agentpost.commands),
               (SELECT string_agg(id || state || coalesce(need_id, ''), ',' ORDER BY id)
                  FROM agentpost.sagas),
               (SELECT string_agg(saga_id || name || attempts || escalated, ','
                                  ORDER BY saga_id, position) FROM agentpost.saga_steps),
               (SELECT count(*) FROM agentpost.trail)""")[0]


# --------------------------------------------------------------------------- the happy path


def test_steps_execute_in_order_as_commands_and_record_their_compensations(
        store: EnvelopeStore, ledger: CommandLedger, runner: SagaRunner, world: World,
        ws: str) -> None:
    """Sagas: a sequence of commands in one unit of work, each step a command of the ledger
    executed in order; its compensation is recorded as it executes."""
    view = _trip(runner, ws, "trip-1")
    assert view.state is SagaState.COMPLETED
    assert world.done == [("book", "flight"), ("book", "hotel"), ("book", "car"),
                          ("pay", "payment")]
    assert [s.name for s in view.steps] == ["flight", "hotel", "car", "payment"]
    assert [s.compensation for s in view.steps] == ["recorded"] * 3 + ["none"]
    for step in view.steps:
        command = ledger.view(step.command_id)
        assert command.state is S.EXECUTED and command.kind is CommandKind.PRIMARY
        assert command.idempotency_key == f"saga:{view.saga_id}/{step.name}"
    started = [query(store.db.dsn, "SELECT created_at FROM agentpost.commands WHERE id = %s",
                     (s.command_id,))[0][0] for s in view.steps]
    assert started == sorted(started)
    assert _saga_events(store, view.saga_id) == (
        ["saga_begun"] + ["saga_step_planned"] * 4 + ["saga_completed"])
    assert store.verify_trail().ok


def test_a_step_waiting_for_confirmation_holds_the_saga(
        ledger: CommandLedger, runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas: a step's command follows the machine's gates: a mutating step without an
    auto-confirm policy waits for a person, the saga does not go on (and cannot complete)."""
    saga = runner.begin(ws, "needs-a-human")
    with pytest.raises(SagaWaiting) as waiting:
        saga.step("flight", "book", {"item": "flight"}, action="book",
                  compensation=("cancel", {"item": "flight"}))
    assert waiting.value.command.state in (S.CANONICALIZED, S.CONFIRMATION_REQUIRED)
    assert world.done == []
    with pytest.raises(Conflict):
        saga.complete()
    view = runner.view(saga.saga_id)
    assert view.state is SagaState.RUNNING
    # the step may still execute: its compensation is pending, not "not needed"
    assert view.step("flight").compensation == "pending"


def test_a_second_run_never_executes_a_step_in_progress(
        runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas (idempotency while started): the same saga run again while one of its steps is
    executing (a retried task overlapping the first) gets SagaWaiting for that step and
    never executes it in parallel."""
    seen: list[BaseException] = []

    def book_flight() -> dict[str, str]:
        try:
            _trip(runner, ws, "overlap")
        except SagaWaiting as exc:
            seen.append(exc)
        world.done.append(("book", "flight"))
        return {"ok": "flight"}

    saga = runner.begin(ws, "overlap")
    saga.step("flight", book_flight, {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="test-policy")
    assert len(seen) == 1 and seen[0].command.state is S.STARTED
    assert world.done == [("book", "flight")]
    assert runner.view(saga.saga_id).step("flight").command_state is S.EXECUTED


def _gated_trip(runner: SagaRunner, ws: str, key: str) -> Any:
    """Flight (auto-confirmed), then a hotel that a person must confirm, then complete."""
    saga = runner.begin(ws, key)
    saga.step("flight", "book", {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="test-policy")
    saga.step("hotel", "book", {"item": "hotel"}, action="book",
              compensation=("cancel", {"item": "hotel"}))
    return saga.complete()


@pytest.mark.parametrize("decision", ["confirm", "decline"])
def test_a_person_decides_a_gated_step_and_the_rerun_follows(
        ledger: CommandLedger, runner: SagaRunner, world: World, ws: str, decision: str) -> None:
    """Sagas through the gates: a step waiting for confirmation holds the saga; confirmed by a
    person (human-highway envelope), the re-run executes it once and completes; declined, the
    re-run compensates the executed steps."""
    with pytest.raises(SagaWaiting) as waiting:
        _gated_trip(runner, ws, f"gated-{decision}")
    ledger.confirmation_envelope("alice", waiting.value.command.command_id, decision)
    if decision == "confirm":
        assert _gated_trip(runner, ws, f"gated-{decision}").state is SagaState.COMPLETED
        assert world.done == [("book", "flight"), ("book", "hotel")]
        _gated_trip(runner, ws, f"gated-{decision}")
        assert world.done == [("book", "flight"), ("book", "hotel")]
        return
    with pytest.raises(SagaAborted) as aborted:
        _gated_trip(runner, ws, f"gated-{decision}")
    assert aborted.value.saga.state is SagaState.COMPENSATED
    assert aborted.value.saga.reason == "confirmation_declined"
    assert world.done == [("book", "flight"), ("cancel", "flight")]


# --------------------------------------------------------------------------- compensation


def test_a_failing_step_compensates_the_executed_steps_in_reverse_order(
        store: EnvelopeStore, ledger: CommandLedger, runner: SagaRunner, world: World,
        ws: str) -> None:
    """Sagas: when a later step fails, the compensations of the executed steps run in reverse
    order, each itself a compensate command in `executed` with evidence; the targets are
    `compensated` and the trail verifies."""
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-2", fail_at="payment")
    view = aborted.value.saga
    assert view.state is SagaState.COMPENSATED and view.failed_step == "payment"
    assert "no seats left" in view.reason
    assert world.done == [("book", "flight"), ("book", "hotel"), ("book", "car"),
                          ("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    payment = view.step("payment")
    assert payment.command_state is S.FAILED and payment.compensation == "not_needed"
    order = []
    for step in view.steps[:3]:
        assert step.compensation == "compensated" and step.attempts == 1
        target = ledger.view(step.command_id)
        assert target.state is S.COMPENSATED and target.outcome == {"ok": step.name}
        comp = ledger.view(step.compensation_command_id)
        assert comp.kind is CommandKind.COMPENSATE and comp.state is S.EXECUTED
        assert comp.target_command_id == step.command_id
        assert comp.idempotency_key == f"{step.command_key}/compensate/attempt-1"
        transitions = [e.body["lifecycle"]["transition"] for e in ledger.evidence(comp.command_id)]
        assert transitions[0] == "received→canonicalized" and transitions[-1] == "started→executed"
        proof = [e.body for e in ledger.evidence(step.command_id)
                 if e.body["lifecycle"]["transition"] == "executed→compensated"]
        assert [p["compensation_command_id"] for p in proof] == [comp.command_id]
        order.append(query(store.db.dsn, "SELECT updated_at FROM agentpost.commands "
                                         "WHERE id = %s", (comp.command_id,))[0][0])
    assert order == sorted(order, reverse=True)  # car, then hotel, then flight
    assert _saga_events(store, view.saga_id)[-5:] == [
        "saga_compensating", "saga_step_compensated", "saga_step_compensated",
        "saga_step_compensated", "saga_compensated"]
    assert store.verify_trail().ok


def _stored_compensations(dsn: str, saga_id: str) -> dict[str, str]:
    """Each step's compensation as the database's saga_view says it (what the page, the
    JSON API, the CLI and SagaView read)."""
    (view,), = query(dsn, "SELECT agentpost.saga_view(%s)", (saga_id,))
    return {step["name"]: step["compensation"] for step in view["steps"]}


def test_the_database_says_a_step_that_will_never_execute_is_not_needed(
        store: EnvelopeStore, ledger: CommandLedger, runner: SagaRunner, ws: str) -> None:
    """sql/0076: saga_view itself says `pending` only for a running saga's step that can
    still execute, and `not_needed` for a step whose command failed or was declined, and
    for a step still waiting at its gate when the saga stopped (another process's step
    failed); SagaView reads the same."""
    dsn = store.db.dsn
    saga = runner.begin(ws, "split-trip")
    saga.step("flight", "book", {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="test-policy")
    with pytest.raises(SagaWaiting):
        saga.step("hotel", "book", {"item": "hotel"}, action="book",
                  compensation=("cancel", {"item": "hotel"}))
    assert _stored_compensations(dsn, saga.saga_id) == {"flight": "recorded",
                                                        "hotel": "pending"}
    elsewhere = runner.begin(ws, "split-trip", after=["flight", "hotel"])
    with pytest.raises(SagaAborted):
        elsewhere.step("car", _boom, action="book", compensation=("cancel", {"item": "car"}),
                       auto_confirm="test-policy")
    stored = _stored_compensations(dsn, saga.saga_id)
    assert stored == {"flight": "compensated", "hotel": "not_needed", "car": "not_needed"}
    assert {s.name: s.compensation for s in runner.view(saga.saga_id).steps} == stored

    gated = runner.begin(ws, "declined-trip")
    with pytest.raises(SagaWaiting) as waiting:
        gated.step("hotel", "book", {"item": "hotel"}, action="book",
                   compensation=("cancel", {"item": "hotel"}))
    ledger.confirmation_envelope("alice", waiting.value.command.command_id, "decline")
    assert runner.view(gated.saga_id).state is SagaState.RUNNING  # until a run notices
    assert _stored_compensations(dsn, gated.saga_id) == {"hotel": "not_needed"}


def test_a_failing_first_step_has_nothing_to_compensate(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas: only executed steps are compensated; a saga whose first step fails is
    compensated at once, without a compensate command."""
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-3", fail_at="flight")
    assert aborted.value.saga.state is SagaState.COMPENSATED
    assert world.done == []
    (n,), = query(store.db.dsn, "SELECT count(*) FROM agentpost.commands WHERE kind = 'compensate'")
    assert n == 0
    assert store.verify_trail().ok


def test_a_failing_compensation_is_retried_with_backoff(
        store: EnvelopeStore, ledger: CommandLedger, runner: SagaRunner, world: World,
        sleeps: list[float], ws: str) -> None:
    """Sagas: a failing compensation is retried with backoff (the sleeps are recorded); the
    failed attempt is a failed compensate command, attempt 2 a new one that succeeds."""
    world.failures["cancel"] = 1  # the first cancel (of the car) fails once
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-4", fail_at="payment")
    view = aborted.value.saga
    assert view.state is SagaState.COMPENSATED
    assert sleeps == [0.5]
    assert world.done[3:] == [("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    car = view.step("car")
    assert car.attempts == 2 and car.compensation == "compensated"
    first = ledger.view(_command_id(store, f"{car.command_key}/compensate/attempt-1"))
    assert first.state is S.FAILED and "down" in first.reason
    second = ledger.view(car.compensation_command_id)
    assert second.idempotency_key.endswith("/attempt-2") and second.state is S.EXECUTED
    assert ledger.view(car.command_id).state is S.COMPENSATED
    events = _saga_events(store, view.saga_id)
    assert events.index("saga_compensation_failed") < events.index("saga_step_compensated")
    assert store.verify_trail().ok


def _command_id(store: EnvelopeStore, key: str) -> str:
    return query(store.db.dsn, "SELECT id FROM agentpost.commands WHERE idempotency_key = %s",
                 (key,))[0][0]


def test_an_exhausted_compensation_is_escalated_as_a_blocking_need(
        store: EnvelopeStore, ledger: CommandLedger, world: World, sleeps: list[float],
        space: PostgresMarkSpace, ws: str) -> None:
    """Sagas: a compensation that fails every attempt (backoff doubling between them) is
    escalated as a blocking need in the mark space, with the saga, step, command and last
    error in its context; the saga is escalated and the step's command is still executed."""
    runner = SagaRunner(ledger, world.handlers(), space=space, attempts=4, sleep=sleeps.append)
    world.failures["cancel"] = 4
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-5", fail_at="payment")
    view = aborted.value.saga
    assert view.state is SagaState.ESCALATED
    assert sleeps == [0.5, 1.0, 2.0]
    car = view.step("car")
    assert car.compensation == "escalated" and car.attempts == 4
    assert ledger.view(car.command_id).state is S.EXECUTED
    # escalation stops the compensation: the earlier steps stay recorded, untouched
    assert [view.step(n).compensation for n in ("flight", "hotel")] == ["recorded"] * 2
    assert world.done[3:] == []
    needs = space.read("sagas", mark_type=MarkType.NEED)
    assert len(needs) == 1
    need = needs[0]
    assert isinstance(need, Need) and need.blocking and need.resolved_by is None
    assert str(need.id) == view.need_id
    assert need.context["saga"] == view.saga_id and need.context["step"] == "car"
    assert need.context["command_id"] == car.command_id
    assert need.context["compensate_command_id"] == car.compensation_command_id
    assert "down" in need.context["last_error"]
    assert _saga_events(store, view.saga_id)[-2:] == ["saga_escalated", "saga_need_raised"]
    assert store.verify_trail().ok


def test_an_escalation_without_a_space_is_recorded_and_resume_raises_the_need(
        ledger: CommandLedger, world: World, space: PostgresMarkSpace, ws: str) -> None:
    """Sagas: escalation as a blocking need: a runner without a mark space still records the
    escalation (saga and trail); resuming with a space writes the blocking need, once."""
    world.failures["cancel"] = 3
    runner = SagaRunner(ledger, world.handlers(), sleep=lambda s: None)
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-6", fail_at="car")
    view = aborted.value.saga
    assert view.state is SagaState.ESCALATED and view.need_id is None
    assert view.escalation["step"] == "hotel"
    with_space = SagaRunner(ledger, world.handlers(), space=space)
    after = with_space.resume(view.saga_id)
    assert after.need_id is not None
    assert with_space.resume(view.saga_id).need_id == after.need_id
    assert len(space.read("sagas", mark_type=MarkType.NEED)) == 1


def test_a_resolved_escalation_lets_resume_finish_the_compensation(
        store: EnvelopeStore, ledger: CommandLedger, world: World, sleeps: list[float],
        space: PostgresMarkSpace, ws: str) -> None:
    """Sagas: the escalation is a *blocking* need: resume() does nothing while it is open;
    once a principal resolves it, the escalated step gets a new budget of attempts (keys go
    on: attempt-4) and the remaining steps are compensated in reverse order."""
    runner = SagaRunner(ledger, world.handlers(), space=space, sleep=sleeps.append)
    world.failures["cancel"] = 3
    with pytest.raises(SagaAborted) as aborted:
        _trip(runner, ws, "trip-13", fail_at="payment")
    saga_id = aborted.value.saga.saga_id
    before = _snapshot(store.db.dsn)
    assert runner.resume(saga_id).state is SagaState.ESCALATED
    assert _snapshot(store.db.dsn) == before and world.done[3:] == []
    principal = Agent(name="ops", scopes={"sagas": (MarkType.ACTION,)})
    fixed = space.write(principal, Action(scope="sagas", action="checked-the-car-desk"))
    space.resolve(uuid.UUID(aborted.value.saga.need_id), fixed)
    view = runner.resume(saga_id)
    assert view.state is SagaState.COMPENSATED
    assert world.done[3:] == [("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    car = view.step("car")
    assert car.attempts == 4 and car.attempt_base == 3
    assert ledger.view(car.compensation_command_id).idempotency_key.endswith("/attempt-4")
    assert sleeps == [0.5, 1.0]  # the go-ahead is not backed off
    assert "saga_reopened" in _saga_events(store, saga_id)
    assert store.verify_trail().ok


# --------------------------------------------------------------------------- re-runs


def test_rerunning_a_completed_saga_executes_nothing_again(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas (and idempotency): running a completed saga's code again replays every step's
    outcome and executes nothing."""
    first = _trip(runner, ws, "trip-7")
    before = _snapshot(store.db.dsn)[:3]
    again = _trip(runner, ws, "trip-7")
    assert again.saga_id == first.saga_id and again.state is SagaState.COMPLETED
    assert len(world.done) == 4
    assert _snapshot(store.db.dsn)[:3] == before
    assert store.verify_trail().ok


def test_a_rerun_after_a_crash_replays_executed_steps_and_goes_on(
        runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas: a saga's code run again after it stopped half-way (a crashed worker) replays the
    executed steps without executing them twice, then runs the rest."""
    saga = runner.begin(ws, "trip-8")
    saga.step("flight", "book", {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="test-policy")
    # ... the worker dies here; the task is retried and runs the whole saga again
    view = _trip(runner, ws, "trip-8")
    assert view.state is SagaState.COMPLETED
    assert world.done == [("book", "flight"), ("book", "hotel"), ("book", "car"),
                          ("pay", "payment")]


def test_rerunning_a_compensated_saga_executes_nothing(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str) -> None:
    """Sagas: a saga that failed and compensated stays so: running its code again executes
    no step and no compensation."""
    with pytest.raises(SagaAborted):
        _trip(runner, ws, "trip-9", fail_at="car")
    done, before = list(world.done), _snapshot(store.db.dsn)[:3]
    with pytest.raises(SagaAborted) as again:
        _trip(runner, ws, "trip-9")
    assert again.value.saga.state is SagaState.COMPENSATED
    assert world.done == done and _snapshot(store.db.dsn)[:3] == before


class Crash(BaseException):
    """What a process dying looks like to the code after it: nothing more runs."""


def test_resume_continues_an_interrupted_compensation(
        store: EnvelopeStore, ledger: CommandLedger, world: World, ws: str) -> None:
    """Sagas: a compensation interrupted between attempts (the runner dies while backing off)
    is carried on by resume() with the handlers looked up by name: the next attempt, then the
    remaining steps in reverse order."""
    world.failures["cancel"] = 1

    def die(seconds: float) -> None:
        raise Crash

    with pytest.raises(Crash):
        _trip(SagaRunner(ledger, world.handlers(), sleep=die), ws, "trip-10",
              fail_at="payment")
    saga_id = query(store.db.dsn, "SELECT id FROM agentpost.sagas WHERE saga_key = 'trip-10'")[0][0]
    runner = SagaRunner(ledger, world.handlers(), sleep=lambda s: None)
    assert runner.view(saga_id).state is SagaState.COMPENSATING
    view = runner.resume(saga_id)
    assert view.state is SagaState.COMPENSATED
    assert world.done[3:] == [("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    assert view.step("car").attempts == 2
    assert store.verify_trail().ok


# -- a real process killed mid-compensation (spawned; see tests/store/test_crash_safety.py) --


def _doomed_workspace(store: EnvelopeStore) -> None:
    store.define_role("agent")
    store.register_type("book", senders=["agent"], receivers=["agent"])
    store.register_type("pay", senders=["agent"], receivers=["agent"])
    store.create_workspace("agent", workspace_id="w-doomed")


def _doomed_worker(dsn: str, backing_off: Any) -> None:
    """Run a trip whose payment fails; the car's cancel fails and the worker hangs in its
    backoff (it is killed there)."""
    world = World()
    world.failures["cancel"] = 1

    def hang(seconds: float) -> None:
        backing_off.set()
        time.sleep(120)

    with CommandLedger(dsn) as ledger:
        _trip(SagaRunner(ledger, world.handlers(), sleep=hang), "w-doomed", "trip-11",
              fail_at="payment")


def test_resume_after_a_killed_process_finishes_the_compensation(
        store: EnvelopeStore, ledger: CommandLedger, world: World, dsn: str) -> None:
    """Sagas: a process killed (SIGKILL) in the middle of compensating leaves a saga that
    another process resumes: no executed step is compensated twice, every one is compensated
    once, in reverse order, and the trail verifies."""
    _doomed_workspace(store)
    ctx = multiprocessing.get_context("spawn")
    backing_off = ctx.Event()
    worker = ctx.Process(target=_doomed_worker, args=(dsn, backing_off), daemon=True)
    worker.start()
    try:
        assert backing_off.wait(60), "the worker never reached its backoff"
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
    assert worker.exitcode == -signal.SIGKILL
    saga_id = query(dsn, "SELECT id FROM agentpost.sagas WHERE saga_key = 'trip-11'")[0][0]
    runner = SagaRunner(ledger, world.handlers(), sleep=lambda s: None)
    view = runner.resume(saga_id)
    assert view.state is SagaState.COMPENSATED
    assert world.done == [("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    attempts = {s.name: s.attempts for s in view.steps}
    assert attempts == {"flight": 1, "hotel": 1, "car": 2, "payment": 0}
    (n,), = query(dsn, "SELECT count(*) FROM agentpost.commands WHERE kind = 'compensate'"
                       " AND state = 'executed'")
    assert n == 3
    assert store.verify_trail().ok


def _worker_dying_in_a_handler(dsn: str, inside: Any) -> None:
    """Run a trip whose payment fails; the car's cancel hangs (the worker is killed in it,
    its compensate command left started)."""
    world = World()
    handlers = world.handlers()

    def hanging_cancel(args: dict[str, Any]) -> None:
        inside.set()
        time.sleep(120)

    handlers["cancel"] = hanging_cancel
    with CommandLedger(dsn, lease_ttl=0.3) as ledger:
        _trip(SagaRunner(ledger, handlers), "w-doomed", "trip-14", fail_at="payment")


def test_a_process_killed_inside_a_compensation_is_resumed_after_its_lease(
        store: EnvelopeStore, ledger: CommandLedger, world: World, sleeps: list[float],
        dsn: str) -> None:
    """Sagas: a process killed (SIGKILL) while a compensation's handler runs leaves that
    compensate command started: resume() never runs it in parallel (SagaWaiting); once the
    ledger's sweep fails it (executor_lost), resume() records the failed attempt and goes on
    with attempt 2, after the backoff, then the earlier steps."""
    _doomed_workspace(store)
    ctx = multiprocessing.get_context("spawn")
    inside = ctx.Event()
    worker = ctx.Process(target=_worker_dying_in_a_handler, args=(dsn, inside), daemon=True)
    worker.start()
    try:
        assert inside.wait(60), "the worker never reached the compensation"
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
    saga_id = query(dsn, "SELECT id FROM agentpost.sagas WHERE saga_key = 'trip-14'")[0][0]
    runner = SagaRunner(ledger, world.handlers(), sleep=sleeps.append)
    with pytest.raises(SagaWaiting) as waiting:
        runner.resume(saga_id)
    assert waiting.value.command.state is S.STARTED and world.done == []
    deadline = time.monotonic() + 10
    while not ledger.sweep_stuck() and time.monotonic() < deadline:
        time.sleep(0.1)
    view = runner.resume(saga_id)
    assert view.state is SagaState.COMPENSATED
    assert world.done == [("cancel", "car"), ("cancel", "hotel"), ("cancel", "flight")]
    car = view.step("car")
    assert car.attempts == 2 and "executor_lost" in (ledger.view(
        _command_id(store, f"{car.command_key}/compensate/attempt-1")).reason or "")
    assert sleeps == [0.5]
    assert store.verify_trail().ok


def _racing_resumer(dsn: str, saga_id: str, go: Any, results: Any) -> None:
    """Resume the saga when `go` is set; each effect of `cancel` is a row in saga_effects."""
    conn = connect(dsn, "saga-racer")

    def cancel(args: dict[str, Any]) -> dict[str, Any]:
        rows(conn, "INSERT INTO public.saga_effects (item) VALUES (%s)", (args["item"],))
        time.sleep(0.05)
        return {"ok": args["item"]}

    with CommandLedger(dsn) as ledger:
        runner = SagaRunner(ledger, {"cancel": cancel}, sleep=lambda s: None)
        go.wait(60)
        try:
            results.put(runner.resume(saga_id).state.value)
        except SagaWaiting:
            results.put("waiting")


def test_racing_resumes_compensate_each_step_exactly_once(
        store: EnvelopeStore, ledger: CommandLedger, world: World, ws: str, dsn: str) -> None:
    """Sagas: compensations are commands with idempotency keys, so processes resuming one
    saga at the same time never compensate a step twice: every executed step is compensated
    exactly once, and the saga ends compensated."""

    def die(seconds: float) -> None:
        raise Crash

    world.failures["cancel"] = 1
    with pytest.raises(Crash):
        _trip(SagaRunner(ledger, world.handlers(), sleep=die), ws, "trip-15", fail_at="payment")
    saga_id = query(dsn, "SELECT id FROM agentpost.sagas WHERE saga_key = 'trip-15'")[0][0]
    query(dsn, "CREATE TABLE public.saga_effects (item text NOT NULL)")
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    racers = [ctx.Process(target=_racing_resumer, args=(dsn, saga_id, go, results), daemon=True)
              for _ in range(RACERS)]
    for racer in racers:
        racer.start()
    time.sleep(1.0)  # let them import and connect
    go.set()
    outcomes = sorted(results.get(timeout=60) for _ in racers)
    for racer in racers:
        racer.join(10)
    assert "compensated" in outcomes and set(outcomes) <= {"compensated", "waiting"}
    effects = query(dsn, "SELECT item, count(*) FROM public.saga_effects GROUP BY item")
    assert dict(effects) == {"car": 1, "hotel": 1, "flight": 1}
    view = SagaRunner(ledger, world.handlers()).resume(saga_id)
    assert view.state is SagaState.COMPENSATED and world.done[3:] == []
    assert store.verify_trail().ok


# --------------------------------------------------------------------------- bad input


def _planned(runner: SagaRunner, ws: str) -> Any:
    saga = runner.begin(ws, "bad-input")
    saga.step("flight", "book", {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="test-policy")
    return saga


@pytest.mark.parametrize("case", [
    "unknown step handler", "unknown compensation handler", "duplicate step name",
    "non-JSON args", "NaN in compensation args", "args not an object", "slash in step name",
    "compensation not a pair", "empty step name", "mutating not a bool",
    "empty auto-confirm policy"])
def test_bad_step_input_is_a_typed_error_and_changes_nothing(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str, case: str) -> None:
    """Bad input (issue 5): an unknown handler name, a duplicate step name, non-JSON args and
    other malformed steps raise InvalidInput; nothing changes and the trail still verifies."""
    saga = _planned(runner, ws)
    before = _snapshot(store.db.dsn)
    calls: dict[str, Callable[[], Any]] = {
        "unknown step handler": lambda: saga.step("x", "teleport", {"item": "x"}, action="book"),
        "unknown compensation handler": lambda: saga.step(
            "x", "book", {"item": "x"}, action="book", compensation=("undo-magic", {})),
        "duplicate step name": lambda: saga.step("flight", "book", {"item": "flight"},
                                                 action="book",
                                                 compensation=("cancel", {"item": "flight"})),
        "non-JSON args": lambda: saga.step("x", "book", {"item": object()}, action="book"),
        "NaN in compensation args": lambda: saga.step(
            "x", "book", {"item": "x"}, action="book",
            compensation=("cancel", {"item": float("nan")})),
        "args not an object": lambda: saga.step("x", "book", ["x"], action="book"),
        "slash in step name": lambda: saga.step("a/b", "book", {"item": "x"}, action="book"),
        "compensation not a pair": lambda: saga.step("x", "book", {"item": "x"}, action="book",
                                                     compensation="cancel"),
        "empty step name": lambda: saga.step(" ", "book", {"item": "x"}, action="book"),
        "mutating not a bool": lambda: saga.step("x", "book", {"item": "x"}, action="book",
                                                 mutating="yes"),
        "empty auto-confirm policy": lambda: saga.step("x", "book", {"item": "x"},
                                                       action="book", auto_confirm=" "),
    }
    with pytest.raises(InvalidInput):
        calls[case]()
    assert _snapshot(store.db.dsn) == before
    assert world.done == [("book", "flight")]
    assert store.verify_trail().ok


def test_an_unknown_action_or_executor_is_not_found_and_plans_nothing(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str) -> None:
    """Bad input: a step whose action is not a registered type, or whose executor is no
    workspace, raises NotFound before the step is planned; nothing changes."""
    saga = _planned(runner, ws)
    before = _snapshot(store.db.dsn)
    with pytest.raises(NotFound):
        saga.step("x", "book", {"item": "x"}, action="teleport", auto_confirm="test-policy")
    with pytest.raises(NotFound):
        saga.step("x", "book", {"item": "x"}, action="book", executor="nobody",
                  auto_confirm="test-policy")
    assert _snapshot(store.db.dsn) == before and world.done == [("book", "flight")]


def test_unknown_saga_id_is_not_found(store: EnvelopeStore, runner: SagaRunner) -> None:
    """Bad input: an unknown saga id (view, resume) raises NotFound and changes nothing."""
    before = _snapshot(store.db.dsn)
    for call in (runner.view, runner.resume):
        with pytest.raises(NotFound):
            call("no-such-saga")
    with pytest.raises(InvalidInput):
        runner.view("bad\x00id")
    assert _snapshot(store.db.dsn) == before


def test_bad_runner_and_saga_arguments_are_typed_errors(
        store: EnvelopeStore, ledger: CommandLedger, world: World, ws: str) -> None:
    """Bad input: handlers that are not callables, a bad attempt count or backoff, an empty
    saga key, an unknown workspace: typed errors, nothing stored."""
    before = _snapshot(store.db.dsn)
    for kwargs in ({"attempts": 0}, {"attempts": True}, {"backoff": -1}, {"backoff": "1"}):
        with pytest.raises(InvalidInput):
            SagaRunner(ledger, world.handlers(), **kwargs)
    with pytest.raises(InvalidInput):
        SagaRunner(ledger, {"book": "not callable"})
    runner = SagaRunner(ledger, world.handlers())
    with pytest.raises(InvalidInput):
        runner.begin(ws, "")
    with pytest.raises(NotFound):
        runner.begin("no-such-workspace", "trip")
    assert _snapshot(store.db.dsn) == before


def test_a_rerun_with_steps_in_another_order_is_a_conflict(
        store: EnvelopeStore, runner: SagaRunner, world: World, ws: str) -> None:
    """Bad input: running a saga's code again with different steps (another order, another
    compensation) is a Conflict and executes nothing."""
    _planned(runner, ws)
    before = _snapshot(store.db.dsn)
    saga = runner.begin(ws, "bad-input")
    with pytest.raises(Conflict):
        saga.step("hotel", "book", {"item": "hotel"}, action="book",
                  compensation=("cancel", {"item": "hotel"}), auto_confirm="test-policy")
    saga = runner.begin(ws, "bad-input")
    with pytest.raises(Conflict):
        saga.step("flight", "book", {"item": "flight"}, action="book",
                  compensation=("cancel", {"item": "elsewhere"}), auto_confirm="test-policy")
    assert _snapshot(store.db.dsn) == before
    assert world.done == [("book", "flight")]


def test_resume_without_the_compensation_handler_changes_nothing(
        store: EnvelopeStore, ledger: CommandLedger, world: World, ws: str) -> None:
    """Bad input: resuming a compensation with a runner that lacks a handler the saga names
    raises InvalidInput before any compensate command is submitted; a running saga cannot be
    resumed (its code runs again instead)."""

    def die(seconds: float) -> None:
        raise Crash

    world.failures["cancel"] = 1
    with pytest.raises(Crash):
        _trip(SagaRunner(ledger, world.handlers(), sleep=die), ws, "trip-12", fail_at="payment")
    saga_id = query(store.db.dsn, "SELECT id FROM agentpost.sagas WHERE saga_key = 'trip-12'")[0][0]
    before = _snapshot(store.db.dsn)
    with pytest.raises(InvalidInput):
        SagaRunner(ledger, {"book": world.handlers()["book"]}).resume(saga_id)
    assert _snapshot(store.db.dsn) == before
    running = SagaRunner(ledger, world.handlers()).begin(ws, "still-running")
    with pytest.raises(Conflict):
        SagaRunner(ledger, world.handlers()).resume(running.saga_id)
