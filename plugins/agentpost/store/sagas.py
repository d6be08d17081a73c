"""Sagas on the command ledger: a unit of work whose steps are commands, each recording its
compensation as it executes; a failing step compensates the executed ones in reverse order.

The saga's state lives in Postgres (sql/0010_sagas.sql); each change is one server-side
function, which takes the saga's row lock and appends to the saga's trail chain
``saga:<id>``. A step is planned before its command is submitted, naming the command by its
idempotency key ``saga:<saga id>/<step name>``: the compensation counts as recorded exactly
when that command is ``executed`` (a join on the command's state), so nothing has to be
written after the execution for it to be recorded.

Compensations are named handlers with JSON args (``handlers[name](args)``), so another process
can run them after a crash (``SagaRunner.resume``). Attempt ``n`` at compensating a step is the
compensate command ``<step key>/compensate/attempt-<n>`` (``ledger.compensate``); before
attempt n > 1 the runner sleeps ``backoff * 2 ** (n - 2)`` seconds; when ``attempts`` are
spent the saga is escalated and a blocking ``Need`` goes to the mark space. docs/sagas.md has
the decisions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentpost.protocol.commands import CommandState, CommandView
from agentpost.protocol.errors import AgentpostError, Conflict, InvalidInput
from agentpost.store.checks import name as _name
from agentpost.store.checks import ref as _ref
from agentpost.store.checks import text as _text
from agentpost.store.commands import CommandLedger
from agentpost.store.needs import NeedBoard, board

Handler = Callable[[dict[str, Any]], Any]
S = CommandState

#: a step's command that ended without executing: the saga compensates the steps before it
_NOT_EXECUTED = frozenset({S.FAILED, S.REJECTED, S.CANCELED, S.COMPENSATED})
#: a step's command confirmed since it was submitted: the rest of its gates need nobody
_GATES_PASSED = frozenset({S.CONFIRMED, S.AUTHZ_PENDING, S.AUTHORIZED})
#: a compensate command that ended: its attempt can be recorded
_FINISHED = frozenset({S.EXECUTED, S.FAILED, S.REJECTED, S.CANCELED})
#: a gate refused the compensate command: another attempt would be refused too
_REFUSED = frozenset({S.REJECTED, S.CANCELED})
_MAX_ARGS = 16_384
_MAX_ATTEMPTS = 20


class SagaState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    ESCALATED = "escalated"


class StepView(BaseModel):
    """One step: its command and its compensation (``compensation``: pending, not_needed,
    recorded, compensated, escalated, or none when the step has no handler; see
    `SagaView`)."""

    model_config = ConfigDict(frozen=True)

    position: int
    name: str
    command_key: str
    action: str
    command_id: str | None = None
    command_state: CommandState | None = None
    handler: str | None = None
    args: dict[str, Any]
    compensation: str
    attempts: int
    attempt_base: int = 0
    compensation_command_id: str | None = None
    last_error: str | None = None


class SagaView(BaseModel):
    """A saga as stored, with its steps in order.

    A step whose command has not executed has nothing to undo: the database says
    ``pending`` while the step can still execute (a running saga, a command that has not
    ended), and ``not_needed`` once it never will (its command ended without executing, or
    the saga stopped running steps), sql/0076 ``_saga_steps_json``."""

    model_config = ConfigDict(frozen=True)

    saga_id: str
    workspace: str
    key: str
    state: SagaState
    failed_step: str | None = None
    reason: str | None = None
    escalation: dict[str, Any] | None = None
    need_id: str | None = None
    created_at: datetime
    updated_at: datetime
    steps: tuple[StepView, ...] = ()

    def step(self, name: str) -> StepView:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


class SagaAborted(AgentpostError):
    """A step did not execute: the saga compensated (``saga.state`` compensated) or was
    escalated. Raised by ``Saga.step``; also for steps of a saga that already ended so."""

    def __init__(self, saga: SagaView, step: str) -> None:
        self.saga = saga
        self.step = step
        super().__init__(f"saga {saga.key!r} ({saga.saga_id}) is {saga.state.value}: step "
                         f"{saga.failed_step!r} did not execute ({saga.reason})")


class SagaWaiting(Conflict):
    """A step's or a compensation's command waits: at a gate (a confirmation), or started
    by someone else and not finished. Nothing ran; run the saga (or resume it) again later."""

    def __init__(self, saga_id: str, view: CommandView) -> None:
        self.saga_id = saga_id
        self.command = view
        super().__init__(f"saga {saga_id}: command {view.command_id} "
                         f"({view.idempotency_key}) is {view.state.value}")


# --------------------------------------------------------------------------- checks


def _json_object(value: object, what: str) -> dict[str, Any]:
    """A JSON object (a fresh, canonical copy) or InvalidInput."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a JSON object")
    try:
        encoded = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON: {exc}") from None
    if len(encoded) > _MAX_ARGS:
        raise InvalidInput(f"{what} is larger than {_MAX_ARGS} bytes")
    return json.loads(encoded)


def _step_name(value: object) -> str:
    name = _name(value, "step name")
    if "/" in name:
        raise InvalidInput("a step name may not contain '/'")
    return name


def _saga_key(value: object) -> str:
    key = _text(value, "saga key", 100)
    if not key.strip():
        raise InvalidInput("saga key must not be empty")
    return key


def _command(action: object, mutating: object, auto_confirm: object,
             executor: object) -> dict[str, Any]:
    """A step's command settings, checked as the ledger checks them (before it is planned)."""
    if not isinstance(mutating, bool):
        raise InvalidInput("mutating must be true or false")
    if auto_confirm is not None:
        auto_confirm = _text(auto_confirm, "auto_confirm", 200)
        if not auto_confirm.strip():
            raise InvalidInput("auto_confirm names a policy; it must not be empty")
    return {"action": _name(action, "action"), "mutating": mutating,
            "auto_confirm": auto_confirm,
            "executor": None if executor is None else _name(executor, "executor")}


def _handlers(handlers: object) -> dict[str, Handler]:
    if not isinstance(handlers, Mapping):
        raise InvalidInput("handlers must be a mapping of names to callables")
    checked = {}
    for key, fn in handlers.items():
        if not callable(fn):
            raise InvalidInput(f"handler {key!r} is not callable")
        checked[_name(key, "handler name")] = fn
    return checked


def _bound(handler: Handler, args: Mapping[str, Any]) -> Callable[[], Any]:
    """A zero-argument call of a handler with a private copy of its args."""
    return lambda: handler(json.loads(json.dumps(args)))


# --------------------------------------------------------------------------- the runner


class SagaRunner:
    """Runs sagas on a CommandLedger with named compensation handlers.

    ``space`` (a NeedBoard, agentpost.store.needs) receives the blocking need of an
    escalation, in ``scope``; `agentpost.smcl.SagaRunner` takes a mark space there instead
    (and the ``agent`` writing the need). Without a space an escalation is still recorded in
    the saga and its trail; ``resume`` with a space writes the need later. ``policy`` is the
    auto-confirm policy name of the compensate commands (recorded in their evidence)."""

    def __init__(self, ledger: CommandLedger, handlers: Mapping[str, Handler], *,
                 space: NeedBoard | None = None, scope: str = "sagas",
                 attempts: int = 3, backoff: float = 0.5,
                 sleep: Callable[[float], Any] = time.sleep,
                 policy: str = "saga-compensation") -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) \
                or not 1 <= attempts <= _MAX_ATTEMPTS:
            raise InvalidInput(f"attempts must be a whole number from 1 to {_MAX_ATTEMPTS}")
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) \
                or not 0 <= backoff <= 3600:
            raise InvalidInput("backoff must be a number of seconds from 0 to 3600")
        self.ledger = ledger
        self.handlers = _handlers(handlers)
        self.attempts = attempts
        self.backoff = float(backoff)
        self.policy = _text(policy, "policy", 200)
        self._sleep = sleep
        self.space = board(space, "space")
        self.scope = scope

    # ----------------------------------------------------------------- SQL

    def _call(self, sql: str, *params: Any) -> SagaView:
        data = self.ledger.db.scalar(sql, params)
        return SagaView.model_validate(data.get("saga", data))

    def _plan(self, saga_id: str, position: int, name: str, command: dict[str, Any],
              handler: str | None, args: dict[str, Any]) -> tuple[str, str | None, SagaView]:
        data = self.ledger.db.scalar(
            "SELECT agentpost.saga_plan_step(%s, %s, %s, %s, %s, %s, %s::jsonb)",
            (saga_id, position, name, command["action"], command["executor"], handler,
             json.dumps(args)))
        return data["status"], data["command_key"], SagaView.model_validate(data["saga"])

    # ----------------------------------------------------------------- public

    def begin(self, workspace: str, key: str, *, after: Sequence[str] = ()) -> Saga:
        """Begin the saga ``key`` of ``workspace``, or meet it again (a re-run after a crash
        or a retry of the whole unit of work: its executed steps replay, never re-execute).
        ``after`` names the steps that come before the next ``step`` call and ran elsewhere
        (one process per step, as in an Airflow DAG), so the next step takes its position."""
        names = [_step_name(n) for n in after]
        if len(set(names)) < len(names):
            raise InvalidInput("a step name comes twice in after")
        view = self._call("SELECT agentpost.saga_begin(%s, %s, %s)", str(uuid.uuid4()),
                          _name(workspace, "workspace"), _saga_key(key))
        saga = Saga(self, view)
        saga._names.extend(names)
        return saga

    def view(self, saga_id: str) -> SagaView:
        return self._call("SELECT agentpost.saga_view(%s)", _ref(saga_id, "saga id"))

    def resume(self, saga_id: str) -> SagaView:
        """Carry on after a crash: a compensating saga compensates what is still recorded. An
        escalated saga without its need (a crash, or no space before) gets it now; once its
        need is resolved in the space, it compensates again with a new budget of attempts.
        A running saga is continued by running its code again (``begin`` with the key)."""
        view = self.view(saga_id)
        if view.state is SagaState.RUNNING:
            raise Conflict(f"saga {view.saga_id} is running: run its steps again with "
                           f"begin({view.workspace!r}, {view.key!r}) to continue it")
        if view.state is SagaState.ESCALATED:
            if view.need_id is None:
                return self._raise_need(view)
            view = self._reopen(view)
        if view.state is SagaState.COMPENSATING:
            return self._compensate(view.saga_id)
        return view

    def _reopen(self, view: SagaView) -> SagaView:
        """An escalated saga whose need was resolved compensates again; else unchanged. The
        resolution is looked up in the ledger's database (a PostgresMarkSpace there)."""
        space = None if self.space is None else self.space.space  # a Postgres space's name
        if not isinstance(space, str) or view.need_id is None:
            return view
        resolved_by = self.ledger.db.scalar("SELECT agentpost.saga_need_resolution(%s, %s)",
                                            (space, view.need_id))
        if resolved_by is None:
            return view
        return self._call("SELECT agentpost.saga_reopen(%s, %s, %s)", view.saga_id,
                          view.need_id, resolved_by)

    # ----------------------------------------------------------------- compensation

    def _compensate(self, saga_id: str) -> SagaView:
        """Compensate the recorded steps of a compensating saga, last first; stop at the
        first step whose compensation is escalated."""
        view = self.view(saga_id)
        if view.state is not SagaState.COMPENSATING:
            raise Conflict(f"saga {view.saga_id} is {view.state.value}, not compensating")
        due = [s for s in reversed(view.steps) if s.compensation == "recorded"]
        for step in due:  # every handler is known before anything runs
            if step.handler not in self.handlers:
                raise InvalidInput(f"saga {view.saga_id}: no handler {step.handler!r} for "
                                   f"the compensation of step {step.name!r}")
        for step in due:
            if not self._compensate_step(view, step):
                return self.view(saga_id)
        return self._call("SELECT agentpost.saga_settle(%s)", view.saga_id)

    def _delay(self, attempt: int) -> float:
        return self.backoff * 2 ** (attempt - 2)

    def _compensate_step(self, saga: SagaView, step: StepView) -> bool:
        """Attempts at one step's compensation; False when it was escalated."""
        assert step.command_id is not None and step.handler is not None
        call = _bound(self.handlers[step.handler], step.args)
        attempt = step.attempts
        while attempt < step.attempt_base + self.attempts:
            attempt += 1
            if attempt > step.attempt_base + 1:
                self._sleep(self._delay(attempt - step.attempt_base))
            done = self.ledger.compensate(
                step.command_id, f"{step.command_key}/compensate/attempt-{attempt}", call,
                auto_confirm=self.policy, args=step.args)
            if done.state not in _FINISHED:
                raise SagaWaiting(saga.saga_id, done)
            self._call("SELECT agentpost.saga_attempt(%s, %s, %s, %s)", saga.saga_id,
                       step.name, attempt, done.command_id)
            if done.state is S.EXECUTED:
                return True
            if done.state in _REFUSED:
                break
        self._raise_need(self._call("SELECT agentpost.saga_escalate(%s, %s)", saga.saga_id,
                                    step.name))
        return False

    def _raise_need(self, view: SagaView) -> SagaView:
        """Write the escalation's blocking need (if there is a space) and record its id."""
        if self.space is None or view.escalation is None:
            return view
        context = view.escalation
        need_id = self.space.ask(self.scope, (
            f"Saga {view.key!r} could not compensate step {context['step']!r} after "
            f"{context['attempts']} attempts ({context['last_error']}). Undo it by hand, then "
            f"resolve this need."), context, priority=1.0)
        return self._call("SELECT agentpost.saga_need(%s, %s)", view.saga_id, str(need_id))


# --------------------------------------------------------------------------- one saga


class Saga:
    """One run of a saga's code: ``step`` each command in order, then ``complete``."""

    def __init__(self, runner: SagaRunner, view: SagaView) -> None:
        self._runner = runner
        self.saga_id = view.saga_id
        self.workspace = view.workspace
        self.key = view.key
        self._names: list[str] = []

    def view(self) -> SagaView:
        return self._runner.view(self.saga_id)

    def step(self, name: str, fn: Callable[[], Any] | str, args: Mapping[str, Any] | None = None,
             *, action: str, compensation: tuple[str, Mapping[str, Any] | None] | None = None,
             mutating: bool = True, auto_confirm: str | None = None,
             executor: str | None = None) -> CommandView:
        """Run the next step as a command (``ledger.run``, key ``saga:<id>/<name>``): ``fn`` is
        a zero-argument callable or a handler name (called with ``args``). ``compensation``
        is ``(handler name, args)``, recorded when the command executes. Returns the executed
        command's view (replayed on a re-run); a step that fails, is rejected, canceled or
        declined compensates the executed steps and raises SagaAborted; a step waiting at a
        gate or in progress elsewhere raises SagaWaiting (a confirmed one runs on a re-run)."""
        name = _step_name(name)
        if name in self._names:
            raise InvalidInput(f"step {name!r} comes twice in saga {self.key!r}")
        call, args = self._call_of(fn, args)
        command = _command(action, mutating, auto_confirm, executor)
        handler, comp_args = self._compensation(compensation)
        status, key, saga = self._runner._plan(self.saga_id, len(self._names) + 1, name,
                                               command, handler, comp_args)
        self._names.append(name)
        if status == "closed" or key is None:
            raise SagaAborted(saga, name)
        view = self._runner.ledger.run(self.workspace, key, call, args=args, **command)
        return self._outcome(name, view, call)

    def complete(self) -> SagaView:
        """End the saga: every step executed (a re-run completes again as a no-op)."""
        return self._runner._call("SELECT agentpost.saga_complete(%s)", self.saga_id)

    def _call_of(self, fn: object, args: object) -> tuple[Callable[[], Any], dict[str, Any]]:
        checked = _json_object(args, "step args")
        if isinstance(fn, str):
            handler = self._runner.handlers.get(fn)
            if handler is None:
                raise InvalidInput(f"no handler named {fn!r}")
            return _bound(handler, checked), checked
        if not callable(fn):
            raise InvalidInput("a step runs a callable or a handler name")
        return fn, checked

    def _compensation(self, compensation: object) -> tuple[str | None, dict[str, Any]]:
        if compensation is None:
            return None, {}
        if not isinstance(compensation, tuple | list) or len(compensation) != 2:
            raise InvalidInput("compensation is a (handler name, args) pair")
        handler, args = compensation
        if not isinstance(handler, str) or handler not in self._runner.handlers:
            raise InvalidInput(f"no compensation handler named {handler!r}")
        return handler, _json_object(args, "compensation args")

    def _outcome(self, name: str, view: CommandView, call: Callable[[], Any]) -> CommandView:
        if view.state in _GATES_PASSED and not view.declined:  # a person confirmed it since
            view = self._runner.ledger.execute(view.command_id, call)  # at most once
        if view.state is S.EXECUTED:
            return view
        if view.state not in _NOT_EXECUTED and not view.declined:
            raise SagaWaiting(self.saga_id, view)
        saga = self._runner._call("SELECT agentpost.saga_step_failed(%s, %s)",
                                  self.saga_id, name)
        if saga.state is SagaState.COMPENSATING:
            saga = self._runner._compensate(self.saga_id)
        raise SagaAborted(saga, name)


__all__ = ["Saga", "SagaAborted", "SagaRunner", "SagaState", "SagaView", "SagaWaiting",
           "StepView"]
