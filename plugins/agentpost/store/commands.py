"""SMCL commands on Postgres: ``CommandLedger``.

Each step is one server-side function of sql/0008_commands.sql, which checks the machine under
the command's row lock and appends the evidence to the trail (chain ``command:<id>``). The fast
path is two calls: ``run`` submits, passes every gate that needs no human (auto-confirm policy,
the permission matrix) and starts in one; the end of the execution is the other.

Gates decide, not callers: confirmation comes from an auto-confirm policy named at submit, a
resolved blocking need (``confirm_from_need``) or a human-highway envelope
(``confirm_from_envelope``); authorization from the permission matrix. A refused transition
commits its ``invalid_transition_attempt`` evidence and this class raises InvalidTransition.

A started command holds a lease that a background thread renews while the process runs it;
``sweep_stuck`` fails the commands whose executor died (reason ``executor_lost``). Context and
args are redacted by the ledger's RedactionPolicy before they reach the trail (the row keeps
the args, for retry and reprocess).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from agentpost.pg.db import Database
from agentpost.protocol.commands import (
    CONFIRMATION_TYPE,
    CommandKind,
    CommandState,
    CommandView,
    Decision,
    RedactionPolicy,
)
from agentpost.protocol.errors import Conflict, InvalidInput, InvalidTransition
from agentpost.protocol.models import TrailEvent
from agentpost.store.checks import name as _name
from agentpost.store.checks import ref as _ref
from agentpost.store.checks import text as _text
from agentpost.store.envelopes import EnvelopeStore
from agentpost.store.needs import MarkView, NeedBoard, board

_MAX_JSON = 16_384
_SUBMIT = ("SELECT agentpost.command_submit(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb,"
           " %s::jsonb, %s, %s)")


def _json(value: Any, what: str) -> str | None:
    if value is None:
        return None
    try:
        encoded = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON: {exc}") from None
    if len(encoded) > _MAX_JSON:
        raise InvalidInput(f"{what} is larger than {_MAX_JSON} bytes")
    return encoded


def _state(value: object) -> CommandState:
    try:
        return CommandState(value)
    except ValueError:
        raise InvalidInput(f"unknown command state {value!r}") from None


def _kind(value: object) -> CommandKind:
    try:
        return CommandKind(value)
    except ValueError:
        raise InvalidInput(f"unknown command kind {value!r}") from None


def _decision(value: object) -> Decision:
    try:
        return Decision(value)
    except ValueError:
        raise InvalidInput(f"a decision is 'confirm' or 'decline', not {value!r}") from None


def _view(data: Mapping[str, Any]) -> CommandView:
    return CommandView.model_validate(data)


def _refused(data: Mapping[str, Any], to: str) -> InvalidTransition:
    view = _view(data["view"])
    return InvalidTransition(f"command {view.command_id}: {view.state.value}→{to} refused"
                             f" ({data['refusal']})")


class _Heartbeats:
    """Renews the leases of the commands this ledger is executing, from one daemon thread
    (started on first use), so a live executor keeps its lease and a dead one loses it."""

    def __init__(self, db: Database, ttl_ms: int) -> None:
        self._db, self._ttl_ms = db, ttl_ms
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, command_id: str) -> None:
        with self._lock:
            self._ids.add(command_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="agentpost-command-heartbeats")
                self._thread.start()

    def discard(self, command_id: str) -> None:
        with self._lock:
            self._ids.discard(command_id)

    def _loop(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            with self._lock:
                ids = sorted(self._ids)
            if ids:
                try:
                    self._db.scalar("SELECT agentpost.command_heartbeat(%s, %s)",
                                    (ids, self._ttl_ms))
                except Exception:  # the store is away: try again next beat
                    continue

    def close(self) -> None:
        self._stop.set()


class CommandLedger:
    """Commands of the SMCL lifecycle, with idempotent submit, gates and signed evidence.

    ``marks``: a NeedBoard (agentpost.store.needs) on which confirmation needs are posted
    (scope ``need_scope``); `agentpost.smcl.CommandLedger` takes a mark space there instead.
    ``lease_ttl``: seconds a started command stays in progress without a heartbeat."""

    def __init__(self, store_or_dsn: EnvelopeStore | str, *,
                 redaction: RedactionPolicy | None = None, marks: NeedBoard | None = None,
                 need_scope: str = "commands", lease_ttl: float = 60.0) -> None:
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float) or not (
                0.05 <= lease_ttl <= 86_400):
            raise InvalidInput("lease_ttl must be between 0.05 and 86400 seconds")
        marks = board(marks, "marks")
        self._owned = isinstance(store_or_dsn, str)
        self.store = EnvelopeStore(store_or_dsn) if self._owned else store_or_dsn
        self.db: Database = self.store.db
        self.redaction = redaction or RedactionPolicy()
        self.marks = marks
        self.need_scope = need_scope
        self._lease_ms = int(lease_ttl * 1000)
        self._beats = _Heartbeats(self.db, self._lease_ms)

    def close(self) -> None:
        self._beats.close()
        if self._owned:
            self.store.close()

    def __enter__(self) -> CommandLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- submit and run

    def submit(self, workspace: str, idempotency_key: str, *, action: str, mutating: bool,
               kind: CommandKind | str = CommandKind.PRIMARY,
               target_command_id: str | None = None, auto_confirm: str | None = None,
               executor: str | None = None, args: Any = None,
               context: Mapping[str, Any] | None = None) -> CommandView:
        """Submit a command (received -> canonicalized). A duplicate key in the workspace
        returns the existing command (``duplicate=True``) and never executes anything.
        ``action`` is a registered envelope type, authorized by the permission matrix from the
        workspace to ``executor`` (default: the workspace); ``auto_confirm`` names the policy
        that confirms this mutating command (recorded in its evidence)."""
        data = self._submit(workspace, idempotency_key, action=action, mutating=mutating,
                            kind=kind, target_command_id=target_command_id,
                            auto_confirm=auto_confirm, executor=executor, args=args,
                            context=context, advance=False)
        return _view(data["view"])

    def run(self, workspace: str, idempotency_key: str, fn: Callable[[], Any], *,
            action: str, mutating: bool, auto_confirm: str | None = None,
            executor: str | None = None, args: Any = None,
            kind: CommandKind | str = CommandKind.PRIMARY,
            target_command_id: str | None = None,
            context: Mapping[str, Any] | None = None) -> CommandView:
        """Submit, pass the gates and run ``fn`` as the execution: one call up to ``started``,
        one to record ``executed`` (fn's JSON result) or ``failed`` (its exception). A
        duplicate key replays the command's view and never calls fn; so does a command stopped
        at a gate (rejected by the matrix, or waiting for a confirmation, which is requested
        here: a blocking need when the ledger has a mark space)."""
        data = self._submit(workspace, idempotency_key, action=action, mutating=mutating,
                            kind=kind, target_command_id=target_command_id,
                            auto_confirm=auto_confirm, executor=executor, args=args,
                            context=context, advance=True)
        return self._after_advance(data, fn)

    def _submit(self, workspace: str, idempotency_key: str, *, action: str, mutating: bool,
                kind: CommandKind | str, target_command_id: str | None,
                auto_confirm: str | None, executor: str | None, args: Any,
                context: Mapping[str, Any] | None, advance: bool) -> dict[str, Any]:
        if not isinstance(mutating, bool):
            raise InvalidInput("mutating must be true or false")
        kind = _kind(kind)
        target = None if target_command_id is None else _ref(target_command_id,
                                                             "target_command_id")
        policy = None if auto_confirm is None else _text(auto_confirm, "auto_confirm", 200)
        if policy is not None and not policy.strip():
            raise InvalidInput("auto_confirm names a policy; it must not be empty")
        key = _text(idempotency_key, "idempotency_key", 200)
        if not key.strip():
            raise InvalidInput("idempotency_key must not be empty")
        ws = _name(workspace, "workspace")
        evidence = {"context": self._redacted(context, "context"),
                    "args": self.redaction.redact(args)}
        return self.db.scalar(_SUBMIT, (
            str(uuid.uuid4()), ws, key, kind.value, target, mutating, policy,
            _name(action, "action"), ws if executor is None else _name(executor, "executor"),
            _json(args, "args"), _json(evidence, "context"), advance, self._lease_ms))

    def _redacted(self, context: Mapping[str, Any] | None, what: str) -> Any:
        if context is not None and not isinstance(context, Mapping):
            raise InvalidInput(f"{what} must be a mapping")
        return self.redaction.redact(dict(context or {}))

    def _after_advance(self, data: Mapping[str, Any], fn: Callable[[], Any]) -> CommandView:
        status, view = data["status"], _view(data["view"])
        if status == "started":
            return self._execute_started(view, fn)
        if status == "refused":
            raise _refused(data, CommandState.STARTED.value)
        if status == "needs_confirmation" and view.state is CommandState.CANONICALIZED:
            return self.request_confirmation(view.command_id)
        return view  # duplicate, rejected, declined, waiting for confirmation

    def execute(self, command_id: str, fn: Callable[[], Any]) -> CommandView:
        """Run ``fn`` as the execution of a command submitted (and confirmed) earlier: the
        remaining gates and the start in one call, at most once. A command in progress or
        terminal is returned as it is; one waiting for a confirmation raises
        InvalidTransition (not_confirmed or confirmation_declined), recorded."""
        data = self.db.scalar("SELECT agentpost.command_advance(%s, %s)",
                              (_ref(command_id, "command id"), self._lease_ms))
        return self._after_advance(data, fn)

    def _execute_started(self, view: CommandView, fn: Callable[[], Any]) -> CommandView:
        self._beats.add(view.command_id)
        try:
            try:
                result = fn()
                outcome = _json(result, "the command's result")
            except Exception as exc:  # the failure is the command's outcome
                return self._finish(view.command_id, CommandState.FAILED, None,
                                    f"{type(exc).__name__}: {exc}"[:500])
            return self._finish(view.command_id, CommandState.EXECUTED, outcome, None)
        finally:
            self._beats.discard(view.command_id)

    def _finish(self, command_id: str, to: CommandState, outcome: str | None,
                reason: str | None) -> CommandView:
        """started -> executed|failed. A command swept or canceled meanwhile keeps its state
        (the late attempt is recorded) and is returned as it is."""
        data = self.db.scalar("SELECT agentpost.command_finish(%s, %s, %s::jsonb, %s)",
                              (command_id, to.value, outcome, reason))
        return _view(data["view"])

    # ----------------------------------------------------------------- recovery

    def recover(self, target_command_id: str, kind: CommandKind | str, idempotency_key: str,
                fn: Callable[[], Any] | None = None, *, mutating: bool = True,
                auto_confirm: str | None = None, args: Any = None,
                context: Mapping[str, Any] | None = None) -> CommandView:
        """A recovery command (retry, cancel, reprocess, compensate) against a target: the
        same machine and gates as a primary, authorized for the target's action and executor.
        With ``fn`` it runs like ``run``; without, it is only submitted. An executed cancel
        moves the target to canceled, an executed compensate to compensated."""
        kind = _kind(kind)
        if kind is CommandKind.PRIMARY:
            raise InvalidInput("a recovery command is retry, cancel, reprocess or compensate")
        target = self.view(target_command_id)
        common = {"action": target.action, "mutating": mutating, "kind": kind,
                  "target_command_id": target.command_id, "auto_confirm": auto_confirm,
                  "executor": target.executor,
                  "args": target.args if args is None else args, "context": context}
        if fn is None:
            return self.submit(target.workspace, idempotency_key, **common)
        return self.run(target.workspace, idempotency_key, fn, **common)

    def compensate(self, target_command_id: str, idempotency_key: str, fn: Callable[[], Any],
                   *, auto_confirm: str | None = None, mutating: bool = True,
                   args: Any = None) -> CommandView:
        """Run ``fn`` as a compensate command of the target; when it executes, the target
        moves to compensated in the same transaction (evidence names this command). A failed
        compensation leaves the target as it was; try again with a new key."""
        return self.recover(target_command_id, CommandKind.COMPENSATE, idempotency_key, fn,
                            auto_confirm=auto_confirm, mutating=mutating, args=args)

    def cancel(self, target_command_id: str, idempotency_key: str, *,
               auto_confirm: str | None = None, reason: str = "canceled") -> CommandView:
        """Cancel a started command through a cancel command: executed, it moves the target
        to canceled (the target's executor finds it canceled when it ends)."""
        return self.recover(target_command_id, CommandKind.CANCEL, idempotency_key,
                            lambda: {"reason": reason}, auto_confirm=auto_confirm)

    # ----------------------------------------------------------------- gates

    def authorize(self, command_id: str) -> CommandView:
        """The authorization gate alone: authz_pending -> authorized or rejected, decided by
        the permission matrix and recorded (decided_by, roles, action, reason)."""
        data = self.db.scalar("SELECT agentpost.command_authorize(%s)",
                              (_ref(command_id, "command id"),))
        if data["status"] == "refused":
            raise _refused(data, CommandState.AUTHZ_PENDING.value)
        return _view(data["view"])

    def request_confirmation(self, command_id: str, question: str | None = None) -> CommandView:
        """canonicalized -> confirmation_required. With a mark space, a blocking Need asks
        for the decision first (context: command_id, action, workspace, confirm_with) and its
        id is recorded in the evidence; a person may also answer with a
        ``command.confirmation`` envelope."""
        view = self.view(command_id)
        need_id = None
        if (self.marks is not None and view.state is CommandState.CANONICALIZED
                and view.mutating and view.auto_confirm is None):
            need_id = self._post_need(view, question)
        data = self.db.scalar("SELECT agentpost.command_request_confirmation(%s, %s)",
                              (view.command_id, need_id))
        if data["status"] == "refused":
            if need_id is not None:  # the command moved on meanwhile: withdraw the question
                self._resolve_need(need_id, {"decision": "withdrawn", "refusal": data[
                    "refusal"], "command_id": view.command_id})
            raise _refused(data, CommandState.CONFIRMATION_REQUIRED.value)
        return _view(data["view"])

    def _post_need(self, view: CommandView, question: str | None) -> str:
        assert self.marks is not None
        text = question or f"Confirm command {view.command_id}: {view.action}?"
        return str(self.marks.ask(self.need_scope, _text(text, "question", 2000), {
            "command_id": view.command_id, "action": view.action,
            "workspace": view.workspace, "executor": view.executor,
            "args": self.redaction.redact(view.args),
            "confirm_with": {"decision": "confirm | decline"}}, priority=0.9))

    def confirm_from_need(self, command_id: str, resolution_id: Any = None) -> CommandView:
        """Decide the confirmation from the command's resolved need: the resolving Action's
        result ``{"decision": "confirm"|"decline"}``; confirmed_by (or declined_by) is
        ``agent:<its agent id>``. ``resolution_id`` is what ``space.resolve`` returned; without
        it the resolution is looked up (a Postgres mark space in this database)."""
        view = self.view(command_id)
        if self.marks is None or view.need_id is None:
            raise Conflict(f"command {view.command_id} has no confirmation need")
        resolution = self._resolution(view.need_id, resolution_id)
        action = self.marks.mark(resolution.resolved_by)
        if action is None or action.failed or action.mark_type != "action":
            raise InvalidInput(f"need {view.need_id} was resolved by {resolution.resolved_by},"
                               " which is not a successful action")
        decision = _decision(dict(action.result).get("decision"))
        data = self.db.scalar("SELECT agentpost.command_confirm(%s, %s, %s, %s::jsonb)", (
            view.command_id, decision.value, f"agent:{action.agent_id}",
            _json({"need_id": view.need_id, "resolution_id": str(resolution.id),
                   "action_id": str(action.id)}, "source")))
        return _view(data)

    def _resolution(self, need_id: str, resolution_id: Any) -> MarkView:
        assert self.marks is not None
        if resolution_id is None:
            resolution_id = self._find_resolution(need_id)
        mark = self.marks.mark(uuid.UUID(str(resolution_id)))
        if (mark is None or str(mark.supersedes) != need_id
                or mark.resolved_by is None):
            raise Conflict(f"{resolution_id} is not a resolution of need {need_id}")
        return mark

    def _find_resolution(self, need_id: str) -> str:
        space = None if self.marks is None else self.marks.space
        if not isinstance(space, str):
            raise InvalidInput("pass resolution_id: only a Postgres mark space is searched")
        found = self.db.scalar("SELECT agentpost.command_need_resolution(%s, %s::uuid)",
                               (space, need_id))
        if found is None:
            raise Conflict(f"need {need_id} is not resolved yet")
        return found

    def confirm_from_envelope(self, envelope_id: str) -> CommandView:
        """Decide a confirmation from a human-highway envelope: ``store.inject(user, to=<the
        command's workspace>, type="command.confirmation", content={"command_id": ...,
        "decision": "confirm"|"decline"}, format="json")``. Forged ones (not from a person,
        wrong workspace, stale, reused, unknown command) raise and change nothing. The
        envelope that decided is consumed in the same transaction: it was acted on, and left
        in the workspace's inbox it would look like a request nobody answered; decided but
        not consumed (a crash between two commits) it would look the same."""
        with self.db.transaction():
            data = self.db.scalar("SELECT agentpost.command_confirm_envelope(%s)",
                                  (_ref(envelope_id, "envelope id"),))
            view = _view(data)
            self.store.consume(view.workspace, envelope_id)
        self._close_need(view, envelope_id)
        return view

    def _close_need(self, view: CommandView, envelope_id: str) -> None:
        """A person answered by envelope: resolve the command's open need with an Action
        recording that answer, so nobody is asked again."""
        if self.marks is None or view.need_id is None:
            return
        decision = Decision.DECLINE if view.declined else Decision.CONFIRM
        self._resolve_need(view.need_id, {"decision": decision.value,
                                          "command_id": view.command_id,
                                          "envelope_id": envelope_id})

    def _resolve_need(self, need_id: str, result: dict[str, Any]) -> None:
        assert self.marks is not None
        # False: resolved meanwhile by someone else; the command's decision stands
        self.marks.answer(self.need_scope, need_id, CONFIRMATION_TYPE, result)

    def confirmation_envelope(self, user_id: str, command_id: str,
                              decision: Decision | str = Decision.CONFIRM, *,
                              envelope_id: str | None = None) -> CommandView:
        """Inject a person's decision through the human highway and apply it. `envelope_id`
        (the send's idempotency key) makes a repeated call send nothing new."""
        view = self.view(command_id)
        extra = {} if envelope_id is None else {"envelope_id": envelope_id}
        sent = self.store.inject(user_id, view.workspace, CONFIRMATION_TYPE,
                                 {"command_id": view.command_id,
                                  "decision": _decision(decision).value}, format="json",
                                 **extra)
        if sent.status == "rejected":
            raise InvalidInput(f"the confirmation envelope was rejected: {sent.reason}")
        return self.confirm_from_envelope(sent.envelope_id)

    # ----------------------------------------------------------------- generic, maintenance

    def transition(self, command_id: str, to: CommandState | str, *,
                   context: Mapping[str, Any] | None = None) -> CommandView:
        """Attempt a transition directly. What the machine forbids raises InvalidTransition,
        recorded as evidence with the state unchanged; a transition that only a gate or an
        execution may take raises Forbidden and changes nothing."""
        target = _state(to)
        data = self.db.scalar("SELECT agentpost.command_transition(%s, %s, %s::jsonb)", (
            _ref(command_id, "command id"), target.value,
            _json(self._redacted(context, "context"), "context")))
        if data["status"] != "ok":
            raise _refused(data, target.value)
        return _view(data["view"])

    def heartbeat(self, command_id: str) -> bool:
        """Renew a started command's lease now; False if it is no longer started."""
        return bool(self.db.scalar("SELECT agentpost.command_heartbeat(%s, %s)",
                                   ([_ref(command_id, "command id")], self._lease_ms)))

    def sweep_stuck(self, limit: int = 1000) -> list[str]:
        """Fail the started commands whose lease expired (their executor died): reason
        ``executor_lost``, with evidence. Returns their ids. Schedule it."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise InvalidInput("limit must be a whole number from 1 to 100000")
        return list(self.db.scalar("SELECT agentpost.command_sweep(%s)", (limit,)))

    def view(self, command_id: str) -> CommandView:
        """The observability view: state, last transition time, terminal outcome, reason,
        next recovery options, in progress."""
        return _view(self.db.scalar("SELECT agentpost.command_view(%s)",
                                    (_ref(command_id, "command id"),)))

    def find(self, workspace: str, idempotency_key: str) -> CommandView | None:
        """The command of ``idempotency_key`` in ``workspace``, or None: a read that records
        nothing (a duplicate ``submit``/``run`` records duplicate_delivery). An unknown
        workspace raises NotFound."""
        key = _text(idempotency_key, "idempotency_key", 200)
        if not key.strip():
            raise InvalidInput("idempotency_key must not be empty")
        data = self.db.scalar("SELECT agentpost.command_find(%s, %s)",
                              (_name(workspace, "workspace"), key))
        return None if data is None else _view(data)

    def recoveries(self, command_id: str, kind: CommandKind | str | None = None
                   ) -> list[CommandView]:
        """The recovery commands targeting ``command_id`` (only those of ``kind`` if given),
        oldest first; a read that records nothing. An unknown command raises NotFound."""
        wanted = None if kind is None else _kind(kind)
        if wanted is CommandKind.PRIMARY:
            raise InvalidInput("a recovery command is retry, cancel, reprocess or compensate")
        data = self.db.scalar("SELECT agentpost.command_recoveries(%s, %s)", (
            _ref(command_id, "command id"), None if wanted is None else wanted.value))
        return [_view(item) for item in data]

    def evidence(self, command_id: str) -> list[TrailEvent]:
        """The command's evidence, in order: its trail chain ``command:<id>``."""
        view = self.view(command_id)
        return self.store.trail(workspace_id=f"command:{view.command_id}")


__all__ = ["CommandLedger"]
