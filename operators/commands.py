"""An operator that runs a side effect as an SMCL command: at most once per logical command,
however often Airflow retries the task (issue 5).

Airflow's unit of retry is the task try; the ledger's unit of "at most once" is the command,
identified by an idempotency key. The key is derived from what stays the same across tries
(dag_id, task_id, run_id, map_index), never from the try number, so every try of one task
instance asks the ledger about the same command, and the ledger decides:

- executed by an earlier try: the outcome is replayed (returned as XCom), the callable is not
  called;
- failed: a ``retry`` recovery command targeting it runs the callable again, with its own key
  (``<key>/retry-<try_number>``) and its own evidence, linked to the failed command in its
  chain;
- started by an earlier try whose worker died: the task defers until the command ends or its
  lease runs out and it is swept to failed; it never runs in parallel with that executor;
- rejected by the permission matrix, declined by a person, canceled or compensated: the task
  fails without further retries (AirflowFailException), because no retry can change that.

A mutating command without an auto-confirm policy stops at confirmation_required; the task
defers to `CommandTrigger` until a person answers (``agentpost command confirm|decline``), and
the execution itself happens in the worker after the resume, through ``ledger.execute``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from agentpost.hooks import AgentpostHook
from agentpost.operators.common import ClearErrors
from agentpost.protocol.commands import CommandKind, CommandState, CommandView
from agentpost.store.commands import CommandLedger
from agentpost.triggers.commands import CommandTrigger
from agentpost.web.links import LinkSource, links_for

if TYPE_CHECKING:
    from airflow.sdk import Context

#: the trigger's fallback poll (a person's answer is normally notified first)
DEFAULT_POLL_INTERVAL = 30.0
#: the ledger's limit on an idempotency key's length
MAX_KEY = 200
#: states another actor put the command in, that no Airflow retry can change
FINAL = {CommandState.REJECTED: "was rejected", CommandState.CANCELED: "was canceled",
         CommandState.COMPENSATED: "was compensated"}
#: states from which ``ledger.execute`` passes the remaining gates and starts
STARTABLE = frozenset({CommandState.CANONICALIZED, CommandState.CONFIRMED,
                       CommandState.AUTHZ_PENDING, CommandState.AUTHORIZED})


def default_key(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The logical command of a task instance: the same for every try (no try number), so a
    retry finds the command of the try before it. Too long for the ledger, it keeps a readable
    prefix and a hash of the whole."""
    key = f"airflow/{dag_id}/{task_id}/{run_id}"
    if map_index is not None and map_index >= 0:
        key += f"/{map_index}"
    return fit_key(key)


def fit_key(key: str) -> str:
    """`key` if the ledger accepts its length, else a readable prefix and a hash of the
    whole (distinct keys stay distinct)."""
    if len(key) <= MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{key[:MAX_KEY - 33]}#{digest}"


def _jsonable(value: Any) -> Any:
    """The call's arguments as the ledger may record them (they are shown to the person who
    confirms); what JSON cannot hold is recorded as its string."""
    return json.loads(json.dumps(value, default=str))


class _Call:
    """The callable as the ledger's ``fn``: remembers the exception it raised, because the
    ledger records a failure as the command's outcome and does not re-raise it, and the task
    log should still show the callable's traceback."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.error: BaseException | None = None
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        try:
            return self.fn(*self.args, **self.kwargs)
        except Exception as exc:
            self.error = exc
            raise


class WaitsForCommands:
    """Deferring a task on a command that waits for someone else (a person's answer, the
    end of an earlier try's execution) through `CommandTrigger`, and resuming: what
    `CommandOperator` and the saga tasks (operators/sagas.py) share. Mixed into a
    BaseOperator that has ``agentpost_conn_id``."""

    task_id: str
    agentpost_conn_id: str
    deferrable: bool
    poke_interval: float
    wait_timeout: timedelta | float | None

    def _wait_settings(self, deferrable: bool, poke_interval: float,
                       wait_timeout: timedelta | float | None) -> None:
        """Check and keep how the task waits (parse time: a bad value changes nothing)."""
        if not isinstance(deferrable, bool):
            raise ValueError("deferrable must be True or False")
        if isinstance(poke_interval, bool) or not isinstance(poke_interval, int | float) \
                or not poke_interval > 0:
            raise ValueError("poke_interval must be a positive number of seconds")
        self.deferrable = deferrable
        self.poke_interval = float(poke_interval)
        self.wait_timeout = wait_timeout

    def defer_on(self, view: CommandView) -> NoReturn:
        """Defer until `view`'s command no longer waits; resume in ``execute_complete``."""
        timeout = self.wait_timeout
        trigger = CommandTrigger(command_id=view.command_id, workspace=view.workspace,
                                 poll_interval=self.poke_interval,
                                 conn_id=self.agentpost_conn_id)
        self.defer(trigger=trigger,  # type: ignore[attr-defined]  (BaseOperator's)
                   method_name="execute_complete",
                   timeout=timedelta(seconds=timeout) if isinstance(timeout, int | float)
                   else timeout)

    def waited_for(self, event: dict[str, Any] | None) -> str:
        """The command a resumed task waited for (its trigger's event); a malformed event
        or the trigger's error fails the try with its message."""
        if not isinstance(event, dict) or event.get("status") not in ("ready", "error"):
            raise AirflowException(f"{self.task_id}: unexpected trigger event {event!r}")
        if event["status"] == "error":
            raise AirflowException(f"{self.task_id}: cannot watch command "
                                   f"{event.get('command_id')}: {event.get('message')}")
        return str(event["command_id"])


class CommandOperator(WaitsForCommands, BaseOperator):
    """Runs `python_callable(*op_args, **op_kwargs)` as one SMCL command of `workspace`, at
    most once per `idempotency_key`; returns the command's outcome (its JSON result) as XCom,
    and pushes the command's id under the XCom key ``command_id``.

    :param python_callable: the side effect; its return value must be JSON.
    :param action: the envelope type the command performs (authorized by the permission
        matrix from `workspace` to `executor_workspace`).
    :param workspace: the requesting workspace (templated).
    :param mutating: whether the command changes the world (then it needs a confirmation).
    :param auto_confirm: the policy that confirms a mutating command without a person
        (recorded in the evidence); without it the task waits for a person's answer.
    :param executor_workspace: the executing workspace (default: `workspace`); the ledger's
        ``executor``, renamed because BaseOperator's ``executor`` names the Airflow executor.
    :param idempotency_key: the logical command (templated); default
        ``airflow/<dag_id>/<task_id>/<run_id>[/<map_index>]``, the same on every try.
    :param op_args, op_kwargs: arguments of the callable (templated); recorded with the
        command, so the person who confirms sees them (redacted in the trail).
    :param agentpost_conn_id: the ``agentpost`` connection (else AGENTPOST_DSN).
    :param deferrable: wait in the triggerer (the default); otherwise a command that waits
        fails the try (Airflow retries it later).
    :param poke_interval: the trigger's fallback poll, seconds.
    :param wait_timeout: how long one wait (a deferral) may last; None: no limit.
    """

    template_fields: Sequence[str] = ("workspace", "idempotency_key", "op_args", "op_kwargs",
                                      "executor_workspace", "agentpost_conn_id")
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    agentpost_links = {"commands": LinkSource(key="command_id")}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#f2e3d9"

    def __init__(self, python_callable: Callable[..., Any], action: str, *, workspace: str,
                 mutating: bool = True, auto_confirm: str | None = None,
                 executor_workspace: str | None = None, idempotency_key: str | None = None,
                 op_args: Collection[Any] | None = None,
                 op_kwargs: Mapping[str, Any] | None = None,
                 agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 deferrable: bool = True, poke_interval: float = DEFAULT_POLL_INTERVAL,
                 wait_timeout: timedelta | float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(python_callable):
            raise ValueError("python_callable must be callable")
        if not isinstance(action, str) or not action.strip():
            raise ValueError("action must name an envelope type")
        if not isinstance(mutating, bool):
            raise ValueError("mutating must be True or False")
        if auto_confirm is not None and (not isinstance(auto_confirm, str)
                                         or not auto_confirm.strip()):
            raise ValueError("auto_confirm names a policy; it must be a non-empty string")
        self._wait_settings(deferrable, poke_interval, wait_timeout)
        self.python_callable = python_callable
        self.action = action
        self.workspace = workspace
        self.mutating = mutating
        self.auto_confirm = auto_confirm
        self.executor_workspace = executor_workspace
        self.idempotency_key = idempotency_key
        self.op_args = list(op_args or ())
        self.op_kwargs = dict(op_kwargs or {})
        self.agentpost_conn_id = agentpost_conn_id

    # -- Airflow's entry points -----------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Submit (or find) the task instance's command and act on its state."""
        with self._ledger() as ledger, self._clear_errors():
            call = self._call()
            view = ledger.run(self.workspace, self._key(context), call, **self._spec(),
                              args=self._args(), context=self._evidence(context))
            return self._settle(ledger, context, view, call, ran=not view.duplicate)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resumes after `CommandTrigger` fired: act on the command's state now."""
        command_id = self.waited_for(event)
        with self._ledger() as ledger, self._clear_errors():
            view = ledger.view(command_id)
            return self._settle(ledger, context, view, self._call(), ran=False)

    # -- the decision ---------------------------------------------------------------------

    def _settle(self, ledger: CommandLedger, context: Context, view: CommandView, call: _Call,
                ran: bool) -> Any:
        """Move the command on until it executed (return its outcome) or must be waited for
        (defer) or cannot succeed in this try (raise). `ran`: this try executed `view`."""
        for _ in range(4):  # every pass makes progress; four are more than any path needs
            state = view.state
            if state is CommandState.EXECUTED:
                return self._done(context, view, replayed=not ran)
            if state in FINAL:
                raise AirflowFailException(self._why(view, FINAL[state]))
            if state is CommandState.CONFIRMATION_REQUIRED and view.declined:
                raise AirflowFailException(self._why(view, "was declined"))
            if state in (CommandState.CONFIRMATION_REQUIRED, CommandState.STARTED):
                self._wait(view)
            if state in STARTABLE:
                view, ran = ledger.execute(view.command_id, call), True
            elif state is CommandState.FAILED and ran:
                raise AirflowException(self._why(view, "failed")) from call.error
            elif state is CommandState.FAILED:
                view, ran = self._retry(ledger, context, view, call)
        raise AirflowException(self._why(view, "did not settle"))

    def _retry(self, ledger: CommandLedger, context: Context, failed: CommandView,
               call: _Call) -> tuple[CommandView, bool]:
        """The command to act on after a failure of an earlier try: a retry of the primary
        that is still alive (executed, running, waiting), else a new one for this try."""
        primary = failed if failed.kind is CommandKind.PRIMARY else ledger.view(
            str(failed.target_command_id))
        latest = self._latest_retry(ledger, primary)
        if latest is not None and latest.state is not CommandState.FAILED:
            return latest, False
        key = fit_key(f"{self._key(context)}/retry-{context['ti'].try_number}")
        self.log.info("command %s failed (%s): retrying it as a recovery command, key %r",
                      primary.command_id, (latest or primary).reason, key)
        view = ledger.recover(primary.command_id, CommandKind.RETRY, key, call,
                              mutating=self.mutating, auto_confirm=self.auto_confirm,
                              context=self._evidence(context))
        return view, not view.duplicate or view.state is CommandState.FAILED

    @staticmethod
    def _latest_retry(ledger: CommandLedger, primary: CommandView) -> CommandView | None:
        """The newest retry of `primary` (a read that records nothing)."""
        retries = ledger.recoveries(primary.command_id, CommandKind.RETRY)
        return retries[-1] if retries else None

    def _wait(self, view: CommandView) -> None:
        """Defer until the command no longer waits (a person's answer, the end of an earlier
        try's execution or its sweep)."""
        what = ("a confirmation" if view.state is CommandState.CONFIRMATION_REQUIRED
                else "the execution started by an earlier try")
        if not self.deferrable:
            raise AirflowException(self._why(view, f"is waiting for {what}"))
        self.log.info("command %s (%s): waiting for %s", view.command_id, view.state.value,
                      what)
        self.defer_on(view)

    def _done(self, context: Context, view: CommandView, replayed: bool) -> Any:
        context["ti"].xcom_push(key="command_id", value=view.command_id)
        if replayed:
            self.log.info("command %s already executed: replaying its outcome, the callable "
                          "is not called again", view.command_id)
        else:
            self.log.info("command %s executed", view.command_id)
        return view.outcome

    def _why(self, view: CommandView, what: str) -> str:
        reason = f": {view.reason}" if view.reason else ""
        return f"{self.task_id}: command {view.command_id} ({view.action}) {what}{reason}"

    # -- plumbing -------------------------------------------------------------------------

    @contextmanager
    def _ledger(self) -> Iterator[CommandLedger]:
        """A ledger on a store of the connection (with its trail key), closed after use."""
        with self._clear_errors():
            store = AgentpostHook(agentpost_conn_id=self.agentpost_conn_id).get_store()
        try:
            with CommandLedger(store) as ledger:
                yield ledger
        finally:
            store.close()

    def _clear_errors(self) -> ClearErrors:
        return ClearErrors(self.task_id)

    def _call(self) -> _Call:
        return _Call(self.python_callable, self.op_args, self.op_kwargs)

    def _key(self, context: Context) -> str:
        if self.idempotency_key is not None:
            return self.idempotency_key
        ti = context["ti"]
        return default_key(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)

    def _spec(self) -> dict[str, Any]:
        return {"action": self.action, "mutating": self.mutating,
                "auto_confirm": self.auto_confirm, "executor": self.executor_workspace}

    def _args(self) -> Any:
        return _jsonable({"op_args": self.op_args, "op_kwargs": self.op_kwargs})

    @staticmethod
    def _evidence(context: Context) -> dict[str, Any]:
        """Which task try asked: recorded in the command's evidence."""
        ti = context["ti"]
        return {"airflow": {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
                            "map_index": ti.map_index, "try_number": ti.try_number}}


__all__ = ["CommandOperator", "WaitsForCommands", "default_key"]
