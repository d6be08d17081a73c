"""What every agentpost trigger shares: the store behind a trigger (`StoreAccess`,
`TriggerStore`), the trigger that ends a deferral with one event (`StoreTrigger`), the
trigger that watches the store until a check finds something (`WatchTrigger`), and their
helpers (`first_check`, `hold_until`, `one_line`, `positive`, `redact`, `settle_time`).

The concrete triggers live one per module beside this one (`inbox`, `commands`, `replies`,
`needs`, `verdicts`, `events`). Everything that touches the database runs in a worker thread
(`asyncio.to_thread`) or, for LISTEN, waits on the socket from the event loop, so the
triggerer's loop never blocks.
"""

from __future__ import annotations

import abc
import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, TypeVar

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from agentpost.hooks import AgentpostHook, StoreTarget
from agentpost.pg.server import redact_dsn
from agentpost.protocol.errors import InvalidInput, StoreUnavailable
from agentpost.store import EnvelopeStore
from agentpost.store.listen import INBOX_CHANNEL, AsyncListener

T = TypeVar("T")

#: a store that has not answered yet is retried this often, this many seconds apart, before
#: the trigger gives up (a blip is ridden out, a wrong host or port is reported quickly)
FIRST_COUNT_ATTEMPTS = 4
FIRST_COUNT_RETRY_S = 1.0


def one_line(exc: BaseException) -> str:
    """An error as one short line for a TriggerEvent (events are stored and shown in the UI;
    a traceback belongs in the log)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return message if len(message) <= 300 else message[:299] + "…"


def redact(dsn: str | None) -> str | None:
    """A DSN without its password, for logs and reprs."""
    return None if dsn is None else redact_dsn(dsn)


def positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{what} must be a positive number")
    return float(value)


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


async def hold_until(not_before: float | None, log: Any) -> None:
    """Wait until the wall-clock time `not_before` (epoch seconds) if it is still ahead.

    Why: a deferred task's trigger may fire before the scheduler has processed the executor's
    report that the deferring worker exited. Airflow then sees a stale "success" for a task
    instance it has already queued again, and fails it ("finished with state success, but
    the task instance's state attribute is queued"; docs/airflow.md, "Sensors and
    triggers"). Holding an early event until a settle time after the deferral lets that
    report be processed while the task instance is still deferred."""
    if not_before is None:
        return
    delay = not_before - time.time()
    if delay > 0:
        log.info("holding the event %.1f s, until the deferral has settled", delay)
        await asyncio.sleep(delay)


class StoreAccess:
    """How a trigger reaches the store: through the Airflow connection `conn_id`, resolved
    in the triggerer (no password among the stored kwargs), unless `dsn` overrides it; the
    repr hides the DSN's password."""

    conn_id: str
    dsn: str | None

    def __repr__(self) -> str:
        classpath, kwargs = self.serialize()  # type: ignore[attr-defined]
        return self.repr(classpath, {**kwargs, "dsn": redact(self.dsn)})  # type: ignore[attr-defined]

    async def _target(self) -> StoreTarget:
        if self.dsn:
            return StoreTarget(dsn=self.dsn, source="dsn")
        return await AgentpostHook(agentpost_conn_id=self.conn_id).aget_target()


class StoreTrigger(StoreAccess, BaseTrigger):
    """What the agentpost triggers that end a deferral share: the store through
    `StoreAccess`; `run` yields the one event `wait` returns, not before `not_before` (see
    `hold_until`). Running `run` again (a triggerer restart) waits again from the start:
    waiting changes nothing in the store.

    With `end_task`, an event that is not an error ends the task instance from the
    triggerer (Airflow's ``TaskSuccessEvent``; the sensor's ``end_from_trigger``): its
    XCom ``return_value`` is the payload, or the payload's `result_key` entry, and no
    worker resumes the task. That event is never held: a task instance that goes from
    deferred straight to success cannot meet the race `hold_until` dodges (docs/airflow.md,
    "The deferral race").

    `links`: the sensor's extra links (``agentpost.web.links.trigger_links``); an event
    that ends the task adds their ``_link_*`` XComs, which no worker will compute."""

    not_before: float | None = None
    end_task: bool = False
    result_key: str | None = None

    def __init__(self, *, links: list[list[Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if links is not None and not (isinstance(links, list)
                                      and all(isinstance(x, list) and len(x) == 5
                                              for x in links)):
            raise InvalidInput("links must be a list of [xcom_key, kind, path, space, "
                               "space_path] lists")
        self.links = links or []

    def _settle_kwargs(self) -> dict[str, Any]:
        """`not_before`, `end_task` and `result_key` for serialize(), each only when set
        (kwargs stored by an older version lack them)."""
        kwargs: dict[str, Any] = {} if self.not_before is None else {
            "not_before": self.not_before}
        if self.end_task:
            kwargs["end_task"] = True
        if self.result_key is not None:
            kwargs["result_key"] = self.result_key
        if self.links:
            kwargs["links"] = self.links
        return kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        event = await self.wait()
        payload = event.payload
        if self.end_task and isinstance(payload, dict) and payload.get("status") != "error":
            value = payload if self.result_key is None else payload[self.result_key]
            yield TaskSuccessEvent(xcoms={"return_value": value, **self._link_xcoms(value)})
            return
        await hold_until(self.not_before, self.log)
        yield event

    def _link_xcoms(self, value: Any) -> dict[str, str]:
        """The extra links' XComs for the task's result (none without `links`)."""
        if not self.links:
            return {}
        from agentpost.web.links import link_xcoms

        return link_xcoms(self.links, value)

    @abc.abstractmethod
    async def wait(self) -> TriggerEvent:
        """Wait for what the trigger watches; the one event `run` yields."""


def settle_time(value: object) -> float | None:
    """A `not_before` argument: None, or epoch seconds."""
    if value is None:
        return None
    return positive(value, "not_before")


class _Checks(TriggerStore):
    """A trigger's check over its store, one call at a time (see TriggerStore)."""

    def __init__(self, store: EnvelopeStore,
                 check: Callable[[EnvelopeStore], dict[str, Any] | None]) -> None:
        super().__init__(store)
        self._check = check

    def run(self) -> dict[str, Any] | None:
        with self._lock:
            return self._check(self.store)


class WatchTrigger(StoreTrigger):
    """A trigger that waits until `check` finds what it watches: it LISTENs on `channel`
    for `listen_keys()` before its first check (a change between the two is either seen or
    notified), re-checks on every notification, and every `poll_interval` seconds in case
    one was lost. The first check is retried briefly while the store is unreachable; later
    ones wait for the next poll. Whatever makes watching impossible ends in an error event
    ``{"status": "error", **subject(), "message": <one line>}``."""

    channel: ClassVar[str] = INBOX_CHANNEL
    poll_interval: float

    def _reach(self, poll_interval: float, conn_id: str, dsn: str | None,
               not_before: float | None, end_task: bool = False,
               result_key: str | None = None) -> None:
        """Keep (checked) what every watch trigger takes besides its subject."""
        self.poll_interval = positive(poll_interval, "poll_interval")
        self.conn_id = conn_id
        self.dsn = dsn
        self.not_before = settle_time(not_before)
        if not isinstance(end_task, bool):
            raise InvalidInput("end_task must be true or false")
        if result_key is not None and not (isinstance(result_key, str) and result_key):
            raise InvalidInput("result_key must be a non-empty string")
        self.end_task, self.result_key = end_task, result_key

    def _reach_kwargs(self) -> dict[str, Any]:
        """Those arguments for serialize() (the settle and end arguments only when set)."""
        return {"poll_interval": self.poll_interval, "conn_id": self.conn_id,
                "dsn": self.dsn, **self._settle_kwargs()}

    @abc.abstractmethod
    def listen_keys(self) -> Sequence[str]:
        """The notification payloads that concern this trigger."""

    @abc.abstractmethod
    def check(self, store: EnvelopeStore) -> dict[str, Any] | None:
        """The event's payload once what is watched is there, else None. Blocking."""

    @abc.abstractmethod
    def subject(self) -> dict[str, Any]:
        """What the trigger watches, as it appears in its events."""

    def label(self) -> str:
        return " ".join(f"{k} {v}" for k, v in self.subject().items())

    async def wait(self) -> TriggerEvent:
        try:
            target = await self._target()
            store = await asyncio.to_thread(target.open)
        except Exception as exc:
            return self._error(exc)
        checks = _Checks(store, self.check)
        listener = AsyncListener(store.dsn, self.listen_keys())
        listener.channel = self.channel
        try:
            await listener.wait(0)
            payload = await first_check(checks.run, self.log, self.label())
            while payload is None:
                woke = await listener.wait(self.poll_interval)
                self.log.debug("%s: %s", self.label(), "notified" if woke else "poll")
                payload = await self._recheck(checks)
        except Exception as exc:
            return self._error(exc)
        finally:
            listener.close()
            checks.close_soon()
        self.log.info("%s: %s", self.label(), payload.get("status"))
        return TriggerEvent(payload)

    async def _recheck(self, checks: _Checks) -> dict[str, Any] | None:
        """One check after the first; None while the store is away (waited out until the
        deferral's timeout)."""
        try:
            return await asyncio.to_thread(checks.run)
        except StoreUnavailable as exc:
            self.log.warning("%s: store unavailable, retrying at the next poll: %s",
                             self.label(), one_line(exc))
            return None

    def _error(self, exc: BaseException) -> TriggerEvent:
        self.log.error("%s cannot be watched", self.label(), exc_info=exc)
        return TriggerEvent({"status": "error", **self.subject(), "message": one_line(exc)})
