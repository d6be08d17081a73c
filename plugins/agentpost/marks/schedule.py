"""Manifest-driven scheduling of source agents (spec §14): `Scheduler` tracks when each
agent with a `schedule_interval` last ran and says who is due. No marks are involved.

Every method but `start`/`stop` reads time from the injected clock only, so schedules are
testable without real time (`Scheduler(clock=...)`, `set_clock`).

Readings chosen where the spec leaves room:

- `due()` lists agents in registration order. An agent is due when it never ran, or when
  `now - last_activation >= schedule_interval` (so consecutive activations through
  `tick_all` are at least the interval apart: P56). A clock that steps back makes nobody due.
- `mark_activated(agent)` records an activation at the clock's now, whether or not the agent
  was due (the caller ran it); an unregistered agent is ignored.
- `register` of an agent already registered behaves as `update` (keeps the last activation);
  an agent without manifest or interval, or with an interval <= 0, is ignored by `register`
  (which returns False, as the package's) and dropped by `update`.
- `pre_activation_check(agent)` (the package's hook, e.g. budget exhaustion) returns a reason
  to skip the agent, or None: a skipped agent is neither due nor marked activated.
- Agents are identified by `agent.id`; the newest Agent object given is what `due` returns.
- The background loop calls `on_due(agents)` when some are due; an exception from `on_due`
  is logged and the loop keeps going. `start` while running is a no-op and `stop` while
  stopped does nothing (as the package's), also when called from several threads at once.
- The state has the package's attribute names, which its own tests read: `_entries` (agent
  id -> `ScheduleEntry`), `_running` and `_thread`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from agentpost.marks.core import Agent, InvalidArgument
from agentpost.marks.space import ClockSpec, make_clock

log = logging.getLogger(__name__)


def interval_of(agent: Agent) -> float | None:
    """The agent's `schedule_interval`, or None when it is not scheduled (no manifest, no
    interval, or an interval <= 0: §14.1 allows only intervals > 0)."""
    interval = None if agent.manifest is None else agent.manifest.schedule_interval
    return interval if interval is not None and interval > 0 else None


@dataclass
class ScheduleEntry:
    """One scheduled agent: its latest configuration, its interval and when it last ran
    (None: never, so it is due at once)."""

    agent: Agent
    interval_seconds: float
    last_activation: float | None = None

    def is_due(self, now: float) -> bool:
        last = self.last_activation
        return last is None or now - last >= self.interval_seconds


class Scheduler:
    """Which scheduled agents are due, from their manifests and last activations."""

    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        pre_activation_check: Callable[[Agent], str | None] | None = None,
    ) -> None:
        self._clock = make_clock(_clock_of(clock))
        self._pre_activation_check = pre_activation_check
        self._lock = threading.Lock()
        self._entries: dict[UUID, ScheduleEntry] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        #: serializes start and stop (never held while the loop ticks)
        self._lifecycle = threading.Lock()

    def now(self) -> float:
        return float(self._clock())

    def set_clock(self, t: ClockSpec) -> None:
        """Fix time at `t` (or install another clock)."""
        self._clock = make_clock(t)

    def register(self, agent: Agent) -> bool:
        """Schedule `agent` by its manifest's interval; due at once if it never ran. False
        when it has no interval (nothing scheduled)."""
        _check_agent(agent)
        with self._lock:
            self._put(agent, keep_unscheduled=True)
            return interval_of(agent) is not None

    def update(self, agent: Agent) -> None:
        """Take a new configuration of a registered agent, keeping its last activation so
        it is not re-triggered early; without an interval it is no longer scheduled."""
        _check_agent(agent)
        with self._lock:
            self._put(agent, keep_unscheduled=False)

    def _put(self, agent: Agent, keep_unscheduled: bool) -> None:
        interval = interval_of(agent)
        current = self._entries.get(agent.id)
        if interval is None:
            if not keep_unscheduled:
                self._entries.pop(agent.id, None)
            return
        last = None if current is None else current.last_activation
        self._entries[agent.id] = ScheduleEntry(agent, interval, last)

    def unregister(self, agent: Agent) -> None:
        with self._lock:
            self._entries.pop(agent.id, None)

    def scheduled(self) -> list[Agent]:
        with self._lock:
            return [s.agent for s in self._entries.values()]

    def last_activation(self, agent: Agent) -> float | None:
        with self._lock:
            schedule = self._entries.get(agent.id)
            return None if schedule is None else schedule.last_activation

    def due(self) -> list[Agent]:
        """Agents whose interval has elapsed since their last activation (or never ran)."""
        now = self.now()
        with self._lock:
            return [s.agent for s in self._entries.values() if self._ready(s, now)]

    def mark_activated(self, agent: Agent) -> None:
        """Record that `agent` ran now."""
        now = self.now()
        with self._lock:
            schedule = self._entries.get(agent.id)
            if schedule is not None:
                schedule.last_activation = now

    def tick_all(self) -> list[Agent]:
        """`due()` and `mark_activated()` of each, as one step (no agent is handed out
        twice by concurrent ticks)."""
        now = self.now()
        with self._lock:
            due = [s for s in self._entries.values() if self._ready(s, now)]
            for schedule in due:
                schedule.last_activation = now
            return [s.agent for s in due]

    def _ready(self, schedule: ScheduleEntry, now: float) -> bool:
        """Due by time, and not vetoed by the pre-activation check."""
        if not schedule.is_due(now):
            return False
        check = self._pre_activation_check
        return check is None or check(schedule.agent) is None

    def start(
        self,
        poll_interval: float = 1.0,
        on_due: Callable[[list[Agent]], None] | None = None,
    ) -> None:
        """Run `tick_all()` every `poll_interval` seconds of real time in a daemon thread,
        passing due agents to `on_due`. The only part that uses real time."""
        if isinstance(poll_interval, bool) or not poll_interval > 0:
            raise InvalidArgument("poll_interval must be > 0")
        with self._lifecycle:
            if self._running:
                return
            # each run has its own stop event: a loop a timed-out stop() left behind never
            # wakes up again because a later start() cleared the event it watches
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._loop, args=(poll_interval, on_due, self._stop),
                name="marks-scheduler", daemon=True,
            )
            self._running = True
            self._thread.start()

    def stop(self, *, timeout: float | None = 5.0) -> None:
        """Stop the background loop and wait for it (at most `timeout` seconds); nothing
        to do when it is not running."""
        with self._lifecycle:
            self._stop.set()
            self._running = False
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Started, not stopped, and its thread is alive."""
        thread = self._thread
        return self._running and thread is not None and thread.is_alive()

    def _loop(self, poll_interval: float, on_due: Callable[[list[Agent]], None] | None,
              stop: threading.Event) -> None:
        while not stop.is_set():
            agents = self.tick_all()
            if agents and on_due is not None:
                try:
                    on_due(agents)
                except Exception:
                    log.exception("scheduler on_due callback failed")
            stop.wait(poll_interval)


def _clock_of(clock: object) -> ClockSpec:
    """A space (anything with ``now()``) stands for its clock, as the package accepts."""
    now = getattr(clock, "now", None)
    if clock is not None and not callable(clock) and callable(now):
        return now
    return clock  # type: ignore[return-value]


def _check_agent(agent: object) -> None:
    if not isinstance(agent, Agent):
        raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
