"""The trigger that waits on an SMCL command from Airflow's triggerer: `CommandTrigger`.

A `CommandOperator` defers in two situations, and both are "wait until the command is no
longer waiting": the command stopped at confirmation_required until a person (or agent)
confirms or declines it, or a previous try's worker started it and has not finished (it either
finishes, or its lease runs out and the command is swept to failed). Running the callable in
parallel with that earlier executor would break "at most once", so the task waits instead.

Wake-ups: every change of a command's state (and a decline, which leaves the state as it is)
NOTIFYs ``agentpost_command`` with the command's id, in the transaction that makes the change
(sql/0012_command_events.sql): a confirmation or a decline, the end of an execution, a sweep, a
cancel. The trigger LISTENs on that channel for its command before its first check, re-checks
on each notification, and polls every `poll_interval` seconds in case a notification is lost
(the listener's connection broke; it reconnects and wakes). When the awaited command is started
and its lease has expired, the trigger runs the ledger's sweep (idempotent, decided by the
database's clock) so a task never waits forever for a dead executor because nobody scheduled
the sweep.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import TriggerEvent

from agentpost.hooks import AgentpostHook
from agentpost.protocol.commands import CommandState, CommandView
from agentpost.protocol.errors import InvalidInput, StoreUnavailable
from agentpost.store import EnvelopeStore
from agentpost.store.checks import name as _name
from agentpost.store.checks import ref as _ref
from agentpost.store.commands import CommandLedger
from agentpost.store.listen import AsyncListener
from agentpost.triggers.base import StoreTrigger, TriggerStore, first_check, one_line, positive

#: the classpath serialize() gives: the module this class lived in first, kept importable as
#: an alias, so triggers already stored in a metadata database and new ones load alike
CLASSPATH = "agentpost.command_triggers.CommandTrigger"
#: the channel a command's changes are notified on (payload: the command id)
COMMAND_CHANNEL = "agentpost_command"


class CommandListener(AsyncListener):
    """An `AsyncListener` on ``agentpost_command`` instead of the inbox channel: `wait`
    returns the ids of the watched commands notified since the last call (``"*"`` after a
    reconnect, when notifications may have been missed)."""

    channel = COMMAND_CHANNEL


def waiting(view: CommandView) -> bool:
    """True while the command waits for someone else: a decision (confirmation_required, not
    declined) or a running executor (started)."""
    if view.state is CommandState.STARTED:
        return True
    return view.state is CommandState.CONFIRMATION_REQUIRED and not view.declined


def lease_expired(view: CommandView, now: datetime | None = None) -> bool:
    """A started command whose executor stopped renewing its lease (as the triggerer's clock
    sees it; the sweep itself decides with the database's)."""
    if view.state is not CommandState.STARTED or view.lease_expires_at is None:
        return False
    return view.lease_expires_at < (now or datetime.now(UTC))


class _Watcher(TriggerStore):
    """The trigger's ledger over its store (see TriggerStore: closed once no check runs)."""

    def __init__(self, store: EnvelopeStore, sweep: bool) -> None:
        super().__init__(store)
        self.ledger = CommandLedger(store)
        self.sweep = sweep

    def check(self, command_id: str) -> CommandView:
        with self._lock:
            view = self.ledger.view(command_id)
            if self.sweep and lease_expired(view) and self.ledger.sweep_stuck():
                view = self.ledger.view(command_id)
            return view

    def release(self) -> None:
        self.ledger.close()
        self.store.close()


class CommandTrigger(StoreTrigger):
    """Fires once when command `command_id` no longer waits: it was confirmed, declined, or
    its execution ended (executed, failed, swept to failed, canceled).

    Event payloads: ``{"status": "ready", "command_id", "state", "declined"}``, or
    ``{"status": "error", "command_id", "message"}`` (one line) when the command cannot be
    watched (unknown command, no store configured, a store that never answered). The store is
    found through the Airflow connection `conn_id`, resolved in the triggerer, so no password
    is among the stored kwargs; `dsn` overrides it (tests, scripts).
    """

    def __init__(self, command_id: str, workspace: str, poll_interval: float = 30.0,
                 conn_id: str = AgentpostHook.default_conn_name, dsn: str | None = None,
                 sweep: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command_id = _ref(command_id, "command id")
        if not self.command_id.strip():
            raise InvalidInput("command id must not be empty")
        self.workspace = _name(workspace, "workspace")
        self.poll_interval = positive(poll_interval, "poll_interval")
        self.conn_id = conn_id
        self.dsn = dsn
        self.sweep = bool(sweep)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"command_id": self.command_id, "workspace": self.workspace,
                           "poll_interval": self.poll_interval, "conn_id": self.conn_id,
                           "dsn": self.dsn, "sweep": self.sweep}

    async def wait(self) -> TriggerEvent:
        """Check, then wait for a notification (or the poll interval) and check again, until
        the command no longer waits. Returns the one event `run` yields."""
        try:
            target = await self._target()
            store = await asyncio.to_thread(target.open)
        except Exception as exc:
            return self._error(exc)
        watcher = _Watcher(store, self.sweep)
        listener = CommandListener(store.dsn, [self.command_id])
        try:
            await listener.wait(0)  # LISTEN before the first check: no change slips between
            view = await self._first_check(watcher)
            while view is None or waiting(view):
                await listener.wait(self.poll_interval)  # a notification, or the poll
                view = await self._check(watcher)
        except Exception as exc:
            return self._error(exc)
        finally:
            listener.close()
            watcher.close_soon()
        self.log.info("command %s: %s%s", self.command_id, view.state.value,
                      " (declined)" if view.declined else "")
        return TriggerEvent({"status": "ready", "command_id": self.command_id,
                             "state": view.state.value, "declined": view.declined})

    async def _check(self, watcher: _Watcher) -> CommandView | None:
        """One check; None when the store is away (waited out until the deferral times out)."""
        try:
            return await asyncio.to_thread(watcher.check, self.command_id)
        except StoreUnavailable as exc:
            self.log.warning("command %s: store unavailable, retrying at the next poll: %s",
                             self.command_id, one_line(exc))
            return None

    async def _first_check(self, watcher: _Watcher) -> CommandView:
        """The first check, retried briefly while the store is unreachable."""
        return await first_check(lambda: watcher.check(self.command_id), self.log,
                                 f"command {self.command_id}")

    def _error(self, exc: BaseException) -> TriggerEvent:
        self.log.error("command %s cannot be watched", self.command_id, exc_info=exc)
        return TriggerEvent({"status": "error", "command_id": self.command_id,
                             "message": one_line(exc)})


__all__ = ["COMMAND_CHANNEL", "CommandListener", "CommandTrigger", "lease_expired", "waiting"]
