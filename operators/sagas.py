"""Sagas in DAGs: each step a task, its compensation declared beside it, the compensations
visible as tasks (docs/sagas.md has the saga semantics; SagaRunner does the work).

`DagSaga` builds the tasks of one saga in a DAG::

    booking = DagSaga("booking", workspace="travel-desk", handlers=HANDLERS,
                      auto_confirm="policy:trips")
    booking.step("flight", "book", {"item": "flight"}, action="trip.book",
                 compensation=("cancel", {"item": "flight"}))
    booking.step("hotel", ...)
    booking.step("payment", "pay", {...}, action="trip.pay")
    booking.end()

- **a step** is a `SagaStepOperator` task (``flight``, ``hotel``, ...), chained in order. It
  runs ``saga.step`` of `SagaRunner`: the step's command executes at most once per saga (a
  retried task replays it). A failing step compensates the executed steps in reverse order
  *inside that task*, through the runner (attempts, backoff, escalation as a blocking need),
  and the task fails with the saga's reason; its log lists what was compensated. A step
  whose command waits for a person's confirmation defers to `CommandTrigger` on that
  command and runs the step again on the answer: confirmed, it executes; declined, the
  saga compensates as for a failing step (``deferrable=False``: the try fails instead).
- **one compensation task per step** (``undo_<step>``, trigger rule ``all_done``), in reverse
  order after the last step: each finishes a compensation that was interrupted (a worker
  killed mid-way: ``SagaRunner.resume``) and shows its step's outcome: *success* = the step
  was compensated (its compensate command id is the XCom), *skipped* = nothing to undo (the
  saga completed, or the step never executed or has no compensation), *failed* = its
  compensation was escalated to a person (the need's id in the message).
- **the outcome task** (``<saga>_outcome``, ``all_done``) completes the saga when every step
  executed, and otherwise fails with the saga's state and reason, so the DAG run's state says
  whether the unit of work happened.

Handlers are named (``handlers[name](args)``, args JSON): the step and compensation tasks run
in different processes, and a name is what the saga stores for its compensation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from agentpost.hooks import AgentpostHook
from agentpost.operators.commands import DEFAULT_POLL_INTERVAL, WaitsForCommands
from agentpost.operators.common import StoreOperator, fit
from agentpost.protocol.commands import CommandState
from agentpost.protocol.errors import InvalidInput
from agentpost.store.checks import name as checked_name
from agentpost.store.commands import CommandLedger
from agentpost.store.sagas import (
    Saga,
    SagaAborted,
    SagaRunner,
    SagaState,
    SagaView,
    SagaWaiting,
)
from agentpost.web.links import LinkSource, links_for

if TYPE_CHECKING:
    from airflow.sdk import Context

Handler = Callable[[dict[str, Any]], Any]
#: the saga's key limit (sagas.md: a key is at most 100 characters)
MAX_SAGA_KEY = 100


class SagaStepFailed(AirflowFailException):
    """A step did not execute: the saga compensated the steps before it (or escalated)."""


class _SagaTask(WaitsForCommands, StoreOperator):
    """What every task of one saga shares: the saga's workspace and key, the handlers, the
    runner's settings, and how a task waits for a command of the saga.

    :param workspace: the saga's workspace (templated).
    :param saga_key: the saga (templated); default ``airflow/<dag_id>/<run_id>``: one saga per
        DAG run, met again by every task and every retry of that run.
    :param handlers: handler name -> ``fn(args)``, for steps and compensations.
    :param attempts, backoff: the runner's compensation attempts and backoff (docs/sagas.md).
    :param marks_space: a mark space name for an escalation's blocking need (none: the
        escalation is recorded in the saga only).
    :param deferrable: a step or compensation whose command waits (for a person's
        confirmation, or for an execution started elsewhere) defers to `CommandTrigger`
        and runs again when it is answered (the default); otherwise the try fails and a
        later try goes on.
    :param poke_interval: the trigger's fallback poll, seconds.
    :param wait_timeout: how long one wait (a deferral) may last; None: no limit.
    """

    template_fields: Sequence[str] = ("workspace", "saga_key", "agentpost_conn_id")

    def __init__(self, *, workspace: str, handlers: Mapping[str, Handler],
                 saga_key: str | None = None, attempts: int = 3, backoff: float = 0.5,
                 marks_space: str | None = None, deferrable: bool = True,
                 poke_interval: float = DEFAULT_POLL_INTERVAL,
                 wait_timeout: timedelta | float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._wait_settings(deferrable, poke_interval, wait_timeout)
        self.workspace = workspace
        self.saga_key = saga_key
        self.handlers = dict(handlers)
        self.attempts = attempts
        self.backoff = backoff
        self.marks_space = marks_space

    @contextmanager
    def runner(self) -> Iterator[SagaRunner]:
        """A SagaRunner over the store's ledger (and the marks space, if named)."""
        with self.store() as store, CommandLedger(store) as ledger:
            from agentpost.smcl import SagaRunner as MarkSpaceSagaRunner  # adapts the space

            space = None
            if self.marks_space is not None:
                from agentpost.marks import PostgresMarkSpace

                space = PostgresMarkSpace(dsn=AgentpostHook(self.agentpost_conn_id).get_dsn(),
                                          space=self.marks_space)
            try:
                yield MarkSpaceSagaRunner(ledger, self.handlers, space=space,
                                          attempts=self.attempts, backoff=self.backoff)
            finally:
                if space is not None:
                    space.close()

    def saga(self, runner: SagaRunner, context: Context, after: Sequence[str] = ()) -> Saga:
        ti = context["ti"]
        key = self.saga_key or fit(f"airflow/{ti.dag_id}/{ti.run_id}", MAX_SAGA_KEY)
        return runner.begin(self.workspace, key, after=after)

    def wait(self, waiting: SagaWaiting) -> NoReturn:
        """Defer on the command the saga waits for (resumed in `execute_complete`), or,
        not deferrable, fail the try so that a later one goes on."""
        if not self.deferrable:
            raise AirflowException(f"{self.task_id}: {waiting}; a later try goes on")
        self.log.info("saga %s: command %s (%s) is %s: waiting for it", waiting.saga_id,
                      waiting.command.command_id, waiting.command.action,
                      waiting.command.state.value)
        self.defer_on(waiting.command)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """The awaited command was answered (or ended): run the task again, which now
        executes it, or compensates when it was declined, or waits again."""
        self.log.info("command %s no longer waits: running %s again", self.waited_for(event),
                      self.task_id)
        return self.execute(context)

    def log_steps(self, view: SagaView) -> None:
        """The saga's steps and what became of their compensations, one line each."""
        self.log.info("saga %s (%s) is %s%s", view.key, view.saga_id, view.state.value,
                      f": step {view.failed_step!r} failed ({view.reason})"
                      if view.failed_step else "")
        for step in view.steps:
            self.log.info("  step %d %s: command %s %s, compensation %s%s", step.position,
                          step.name, step.command_id,
                          step.command_state.value if step.command_state else "-",
                          step.compensation,
                          f" (command {step.compensation_command_id})"
                          if step.compensation_command_id else "")


class SagaStepOperator(_SagaTask):
    """One step of a saga (see the module docstring); returns the step command's outcome
    and pushes ``saga_id`` and ``command_id`` to XCom.

    :param step: the step's name, unique in the saga.
    :param handler: the handler name the step runs with `args` (templated).
    :param action: the envelope type the step's command performs (permission matrix).
    :param compensation: ``(handler name, args)`` undoing the step, or None.
    :param after: the steps before this one, in order (`DagSaga` fills it in).
    :param mutating, auto_confirm, executor_workspace: the command's settings.
    """

    template_fields: Sequence[str] = (*_SagaTask.template_fields, "args")
    template_fields_renderers = {"args": "json"}
    ui_color = "#f2e3d9"
    agentpost_links = {"commands": LinkSource(key="command_id")}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, step: str, handler: str, action: str,
                 args: Mapping[str, Any] | None = None,
                 compensation: tuple[str, Mapping[str, Any] | None] | None = None,
                 after: Sequence[str] = (), mutating: bool = True,
                 auto_confirm: str | None = None, executor_workspace: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in (handler, *(compensation[:1] if compensation else ())):
            if name not in self.handlers:
                raise InvalidInput(f"saga step {step!r}: no handler named {name!r}")
        self.step = checked_name(step, "step name")
        self.handler = handler
        self.action = checked_name(action, "action")
        self.args = dict(args or {})
        self.compensation = tuple(compensation) if compensation else None
        self.after = list(after)
        self.mutating = mutating
        self.auto_confirm = auto_confirm
        self.executor_workspace = executor_workspace

    def execute(self, context: Context) -> Any:
        with self.runner() as runner:
            saga = self.saga(runner, context, self.after)
            context["ti"].xcom_push(key="saga_id", value=saga.saga_id)
            try:
                view = saga.step(self.step, self.handler, self.args, action=self.action,
                                 compensation=self.compensation, mutating=self.mutating,
                                 auto_confirm=self.auto_confirm,
                                 executor=self.executor_workspace)
            except SagaAborted as exc:
                self.log_steps(exc.saga)
                raise SagaStepFailed(f"{self.task_id}: {exc}") from None
            except SagaWaiting as exc:
                self.wait(exc)
        context["ti"].xcom_push(key="command_id", value=view.command_id)
        self.log.info("step %s: command %s executed%s", self.step, view.command_id,
                      " (replayed)" if view.duplicate else "")
        return view.outcome


class SagaCompensationOperator(_SagaTask):
    """Shows (and, after an interruption, finishes) the compensation of one step; see the
    module docstring. Returns the compensate command's id."""

    ui_color = "#f2d9d9"
    agentpost_links = {"commands": LinkSource()}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, step: str, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.step = step

    def execute(self, context: Context) -> str:
        with self.runner() as runner:
            view = self.saga(runner, context).view()
            if view.state is SagaState.COMPENSATING:
                try:
                    view = runner.resume(view.saga_id)
                except SagaWaiting as exc:
                    self.wait(exc)
        return self._judge(view)

    def _judge(self, view: SagaView) -> str:
        step = next((s for s in view.steps if s.name == self.step), None)
        if step is None:
            raise AirflowSkipException(f"step {self.step!r} was never planned: nothing to undo")
        if step.compensation == "compensated":
            self.log.info("step %s was compensated by command %s", self.step,
                          step.compensation_command_id)
            return str(step.compensation_command_id)
        if step.compensation == "escalated":
            raise AirflowFailException(
                f"{self.task_id}: the compensation of step {self.step!r} was escalated after "
                f"{step.attempts} attempts ({step.last_error}); need {view.need_id} waits "
                "for a person")
        if view.state in (SagaState.RUNNING, SagaState.COMPLETED):
            raise AirflowSkipException(f"saga is {view.state.value}: nothing to compensate")
        if step.compensation in ("pending", "not_needed", "none"):
            raise AirflowSkipException(f"step {self.step!r}: nothing to undo "
                                       f"(compensation {step.compensation})")
        raise AirflowFailException(f"{self.task_id}: step {self.step!r} is not compensated: "
                                   f"saga {view.state.value}, a later step's compensation "
                                   "was escalated first")


class SagaOutcomeOperator(_SagaTask):
    """Completes the saga when every step executed; otherwise fails with its state and
    reason. Returns ``{"saga_id", "state"}``."""

    ui_color = "#f2e3d9"

    def __init__(self, *, steps: Sequence[str], **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.steps = list(steps)

    def execute(self, context: Context) -> dict[str, str]:
        with self.runner() as runner:
            saga = self.saga(runner, context)
            view = saga.view()
            executed = [s.name for s in view.steps
                        if s.command_state is CommandState.EXECUTED]
            if view.state is SagaState.RUNNING and executed == self.steps:
                view = saga.complete()
        self.log_steps(view)
        if view.state is not SagaState.COMPLETED:
            missing = [s for s in self.steps if s not in executed]
            why = (f"step {view.failed_step!r} failed ({view.reason})" if view.failed_step
                   else f"steps {missing} have not executed")
            raise AirflowFailException(f"{self.task_id}: saga {view.key!r} is "
                                       f"{view.state.value}: {why}")
        return {"saga_id": view.saga_id, "state": view.state.value}


class DagSaga:
    """Builds the tasks of one saga in the current DAG (see the module docstring).

    :param name: the saga's name in the DAG (the outcome task is ``<name>_outcome``).
    :param auto_confirm: the default auto-confirm policy of the steps (None: each step
        waits for a person's confirmation, its task deferred until then).
    Other keyword arguments (workspace, handlers, saga_key, attempts, backoff, marks_space,
    deferrable, poke_interval, wait_timeout, agentpost_conn_id) are passed to every task.
    """

    def __init__(self, name: str, *, auto_confirm: str | None = None, **shared: Any) -> None:
        self.name = checked_name(name, "saga name")
        self.auto_confirm = auto_confirm
        self.shared = shared
        self.steps: list[SagaStepOperator] = []
        self.ended = False

    def step(self, name: str, handler: str, args: Mapping[str, Any] | None = None, *,
             action: str, compensation: tuple[str, Mapping[str, Any] | None] | None = None,
             **kwargs: Any) -> SagaStepOperator:
        """The next step, a task ``name`` after the previous step."""
        if self.ended:
            raise InvalidInput(f"saga {self.name!r} has ended: no step after end()")
        kwargs.setdefault("auto_confirm", self.auto_confirm)
        op = SagaStepOperator(task_id=kwargs.pop("task_id", name), step=name,
                              handler=handler, args=args, action=action,
                              compensation=compensation,
                              after=[s.step for s in self.steps], **self.shared, **kwargs)
        if self.steps:
            self.steps[-1] >> op
        self.steps.append(op)
        return op

    def end(self) -> SagaOutcomeOperator:
        """The compensation tasks, last step first, and the outcome task after them."""
        if not self.steps:
            raise InvalidInput(f"saga {self.name!r} has no steps")
        self.ended = True
        previous: Any = self.steps[-1]
        for step in reversed(self.steps):
            undo = SagaCompensationOperator(task_id=f"undo_{step.task_id}", step=step.step,
                                            **self.shared)
            previous >> undo
            previous = undo
        outcome = SagaOutcomeOperator(task_id=f"{self.name}_outcome",
                                      steps=[s.step for s in self.steps], **self.shared)
        previous >> outcome
        return outcome


__all__ = ["DagSaga", "SagaCompensationOperator", "SagaOutcomeOperator", "SagaStepFailed",
           "SagaStepOperator"]
