"""Triggers that wait on the envelope store from Airflow's triggerer.

`InboxTrigger` fires when an inbox holds enough envelopes a consumer could lease. It waits on
LISTEN (the store NOTIFYs ``agentpost_inbox`` whenever an inbox gains leasable envelopes) with
polling as the fallback, so a deferred sensor wakes as soon as an envelope is delivered, not
at its next poll (issue 3, "Live delivery"). Notifications are only hints: every wake-up
re-counts in the store.

Everything that touches the database runs in a worker thread (`asyncio.to_thread`) or, for
LISTEN, waits on the socket from the event loop, so the triggerer's loop never blocks.
"""

from __future__ import annotations

import abc
import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from agentpost.hooks import AgentpostHook, StoreTarget
from agentpost.protocol.errors import InvalidInput, StoreUnavailable
from agentpost.protocol.leases import workspace_of
from agentpost.store import EnvelopeStore
from agentpost.store.listen import AsyncListener

T = TypeVar("T")

CLASSPATH = "agentpost.triggers.InboxTrigger"
#: a store that has not answered yet is retried this often, this many seconds apart, before
#: the trigger gives up (a blip is ridden out, a wrong host or port is reported quickly)
FIRST_COUNT_ATTEMPTS = 4
FIRST_COUNT_RETRY_S = 1.0


def available(store: EnvelopeStore, workspace_id: str) -> int:
    """Envelopes of the inbox a lease could take now (lease's own conditions, the blocking
    gate included). Blocking, synchronous: call it in a thread from async code."""
    return store.leasable(workspace_id)


def one_line(exc: BaseException) -> str:
    """An error as one short line for a TriggerEvent (events are stored and shown in the UI;
    a traceback belongs in the log)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return message if len(message) <= 300 else message[:299] + "…"


def redact(dsn: str | None) -> str | None:
    """A DSN without its password, for logs and reprs."""
    if dsn is None:
        return None
    dsn = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{what} must be a positive number")
    return float(value)


def _at_least_one(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{what} must be a whole number of at least 1")
    return value


class TriggerStore:
    """A trigger's store, used from worker threads one call at a time. A trigger cancelled
    while a call runs in its thread must not close the pool under that thread (the
    connection would be orphaned and stay open): the store is closed once no call runs, by
    a short-lived thread, so the event loop never waits for it. Subclasses make their calls
    under `_lock`."""

    def __init__(self, store: EnvelopeStore) -> None:
        self.store = store
        self._lock = threading.Lock()

    def close_soon(self) -> None:
        threading.Thread(target=self._close, name="agentpost-trigger-close", daemon=True).start()

    def _close(self) -> None:
        with self._lock:
            self.release()

    def release(self) -> None:
        """Close what the calls used (the lock is held)."""
        self.store.close()


class _Counter(TriggerStore):
    def count(self, workspace_id: str) -> int:
        with self._lock:
            return available(self.store, workspace_id)


async def first_check(check: Callable[[], T], log: Any, what: str) -> T:
    """A trigger's first look at the store, in a worker thread, retried briefly while the
    store is unreachable (a triggerer restarting with the database): later looks wait for
    the next poll instead, but without a first answer there is nothing to wait on."""
    attempt = 1
    while True:
        try:
            return await asyncio.to_thread(check)
        except StoreUnavailable as exc:
            if attempt >= FIRST_COUNT_ATTEMPTS:
                raise
            log.warning("%s: store unavailable (attempt %d): %s", what, attempt, one_line(exc))
        attempt += 1
        await asyncio.sleep(FIRST_COUNT_RETRY_S)


class StoreTrigger(BaseTrigger):
    """What the agentpost triggers share: the store is found through the Airflow connection
    `conn_id`, resolved in the triggerer (no password among the stored kwargs), unless `dsn`
    overrides it; the repr hides the DSN's password; `run` yields the one event `wait`
    returns."""

    conn_id: str
    dsn: str | None

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()
        return self.repr(classpath, {**kwargs, "dsn": redact(self.dsn)})

    async def _target(self) -> StoreTarget:
        if self.dsn:
            return StoreTarget(dsn=self.dsn, source="dsn")
        return await AgentpostHook(agentpost_conn_id=self.conn_id).aget_target()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield await self.wait()

    @abc.abstractmethod
    async def wait(self) -> TriggerEvent:
        """Wait for what the trigger watches; the one event `run` yields."""


class InboxTrigger(StoreTrigger):
    """Fires once when at least `min_envelopes` envelopes of `workspace_id`'s inbox are
    available to lease.

    The store is found through the Airflow connection `conn_id` (resolved in the triggerer,
    so no password travels in the trigger's kwargs, which Airflow stores and logs), or
    through `dsn` when one is given explicitly.

    Event payloads: ``{"status": "ready", "workspace_id", "available"}``, or
    ``{"status": "error", "workspace_id", "message"}`` (one line) when the inbox cannot be
    watched: unknown workspace, no store configured, a store that does not answer the first
    few attempts. A store that answered once and then drops (a restart, a failover) is waited
    out: every poll tries again, until the deferral's timeout.
    """

    def __init__(self, workspace_id: str, min_envelopes: int = 1, poll_interval: float = 30.0,
                 conn_id: str = AgentpostHook.default_conn_name, dsn: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workspace_id = workspace_of(workspace_id)
        self.min_envelopes = _at_least_one(min_envelopes, "min_envelopes")
        self.poll_interval = positive(poll_interval, "poll_interval")
        self.conn_id = conn_id
        self.dsn = dsn

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "workspace_id": self.workspace_id,
            "min_envelopes": self.min_envelopes,
            "poll_interval": self.poll_interval,
            "conn_id": self.conn_id,
            "dsn": self.dsn,
        }

    async def wait(self) -> TriggerEvent:
        """Count, then wait for a notification (or the poll interval) and count again, until
        enough envelopes are available. Returns the one event `run` yields."""
        ws = self.workspace_id
        try:
            target = await self._target()
            store = await asyncio.to_thread(target.open)
        except Exception as exc:
            return self._error(exc)
        counter = _Counter(store)
        listener = AsyncListener(store.dsn, [ws])
        try:
            # LISTEN before the first count: a delivery between the two is then either
            # counted or notified, never missed until the poll
            await listener.wait(0)
            n = await self._first_count(counter)
            while n < self.min_envelopes:
                woke = await listener.wait(self.poll_interval)
                self.log.debug("inbox %s: %s", ws, "notified" if woke else "poll interval passed")
                try:
                    n = await asyncio.to_thread(counter.count, ws)
                except StoreUnavailable as exc:
                    self.log.warning("inbox %s: store unavailable, retrying at the next poll: "
                                     "%s", ws, one_line(exc))
                    n = -1
        except Exception as exc:
            return self._error(exc)
        finally:
            listener.close()
            counter.close_soon()
        self.log.info("inbox %s: %d envelope(s) available", ws, n)
        return TriggerEvent({"status": "ready", "workspace_id": ws, "available": n})

    async def _first_count(self, counter: _Counter) -> int:
        """The first count, retried briefly while the store is unreachable."""
        return await first_check(lambda: counter.count(self.workspace_id), self.log,
                                 f"inbox {self.workspace_id}")

    def _error(self, exc: BaseException) -> TriggerEvent:
        self.log.error("inbox %s cannot be watched", self.workspace_id, exc_info=exc)
        return TriggerEvent({"status": "error", "workspace_id": self.workspace_id,
                             "message": one_line(exc)})
