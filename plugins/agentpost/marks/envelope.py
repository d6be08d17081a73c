"""The statistical envelope (spec §9.7): per-agent anomaly detection over write attempts.

Time is cut into tumbling windows of ``window_seconds`` (window ``n`` is ``[n*w, (n+1)*w)``).
Each agent has a detector; when a window closes, its per-type counts feed Welford
accumulators (mean and variance, one per mark type). ``evaluate`` then runs three checks:

1. rate (per type): the current window's count exceeds ``mean + k * stddev``, or the current
   and the previous window together exceed twice that (a burst straddling a boundary);
2. type shift: the current window's type mix is further than ``type_shift_threshold`` (total
   variation distance) from the historical mix;
3. concentration (across agents): ``concentration_threshold`` or more agents wrote to the same
   ``(scope, topic)`` in the current window.

Rate and type shift make the agent RESTRICTED (sticky until ``reset`` with the principal's
token, P40); concentration makes it FLAGGED. A detector that is not ready yet (fewer than
``min_samples`` closed windows, and no declared baseline) always yields NORMAL (P41).

Readings chosen where the spec leaves room:
- The envelope counts *attempts*: every write the guard tries for an agent, including the
  ones a barrier or a rate limit rejects (`record_attempt`, P64), so hammering is visible.
- Closed windows without any write feed zero counts (at most ``max_idle_windows`` of them).
- ``stddev`` is floored at ``std_floor`` (default 1.0), so a perfectly regular agent is not
  flagged for one extra write; the type-shift check needs ``type_shift_min_marks`` writes in
  the window, so the first write of a window cannot look like a shift.
- A *flag* is a new finding: (kind, mark type, scope, window) not reported before for the
  agent. The guard escalates once per flag (P43); later writes in the same window that show
  the same anomaly keep the verdict but do not escalate again.
- The flagged scope of a rate or type-shift finding is the scope the agent wrote the
  triggering type to most in the current window (ties: the smallest name).
- ``reset`` also discards the agent's current-window counts, so the principal's release is
  not undone by the writes it just forgave.
- The statistics live in the guard's process.
"""

from __future__ import annotations

import hmac
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.barrier import PrincipalTokenRejected
from agentpost.marks.core import MarkType

DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_K = 3.5
DEFAULT_MIN_SAMPLES = 5
DEFAULT_TYPE_SHIFT_THRESHOLD = 0.5
DEFAULT_CONCENTRATION_THRESHOLD = 3
SECONDS_PER_HOUR = 3600.0
ALL_TYPES: tuple[MarkType, ...] = tuple(MarkType)


class EnvelopeVerdict(StrEnum):
    NORMAL = "normal"
    FLAGGED = "flagged"
    RESTRICTED = "restricted"


class AnomalyKind(StrEnum):
    RATE = "rate"
    BURST = "burst"
    TYPE_SHIFT = "type_shift"
    CONCENTRATION = "concentration"


class Anomaly(BaseModel):
    """What a detector found in an agent's current window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: AnomalyKind
    mark_type: MarkType
    observed: float
    threshold: float


class Finding(BaseModel):
    """The envelope's answer for one agent at one time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: EnvelopeVerdict
    agent_id: UUID
    window: int
    kind: AnomalyKind | None = None
    scope: str | None = None
    mark_type: MarkType | None = None
    topic: str | None = None
    reason: str = ""
    #: a finding not reported before for this agent: the guard escalates once per flag
    new_flag: bool = False


# Welford's online mean and variance


@dataclass
class Welford:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0

    @property
    def stddev(self) -> float:
        return math.sqrt(max(0.0, self.variance))


@runtime_checkable
class Detector(Protocol):
    """Per-agent anomaly detection; `WelfordDetector` is the default."""

    def record(self, mark_type: MarkType, at: float) -> None: ...

    def advance(self, at: float) -> None: ...

    def is_ready(self) -> bool: ...

    def anomaly(self, at: float) -> Anomaly | None: ...

    def seed_baseline(self, per_window: Mapping[MarkType, float]) -> None: ...

    def discard_current(self) -> None: ...


def window_of(at: float, seconds: float) -> int:
    return math.floor(at / seconds)


@dataclass
class WelfordDetector:
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    k: float = DEFAULT_K
    min_samples: int = DEFAULT_MIN_SAMPLES
    type_shift_threshold: float = DEFAULT_TYPE_SHIFT_THRESHOLD
    std_floor: float = 1.0
    type_shift_min_marks: int = 5
    max_idle_windows: int = 288
    stats: dict[MarkType, Welford] = field(default_factory=dict)
    windows_completed: int = 0
    current_index: int | None = None
    current: Counter[MarkType] = field(default_factory=Counter)
    previous: Counter[MarkType] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")
        for mark_type in ALL_TYPES:
            self.stats.setdefault(mark_type, Welford())

    # feeding
    def record(self, mark_type: MarkType, at: float) -> None:
        self.advance(at)
        self.current[MarkType(mark_type)] += 1

    def advance(self, at: float) -> None:
        index = window_of(at, self.window_seconds)
        if self.current_index is None:
            self.current_index = index
            return
        if index <= self.current_index:
            return  # same window, or a clock that stepped back: stay in the current one
        self._close(self.current)
        idle = index - self.current_index - 1
        for _ in range(min(idle, self.max_idle_windows)):
            self._close(Counter())
        self.previous = self.current if idle == 0 else Counter()
        self.current = Counter()
        self.current_index = index

    def _close(self, counts: Counter[MarkType]) -> None:
        for mark_type in ALL_TYPES:
            self.stats[mark_type].update(float(counts.get(mark_type, 0)))
        self.windows_completed += 1

    def seed_baseline(self, per_window: Mapping[MarkType, float]) -> None:
        """Pre-load declared per-window rates as ``min_samples`` synthetic windows, with
        stddev = half the mean (variance = 25% of the mean squared)."""
        samples = max(self.min_samples, 2)
        for mark_type in ALL_TYPES:
            mean = float(per_window.get(mark_type, 0.0))
            variance = 0.25 * mean * mean
            self.stats[mark_type] = Welford(n=samples, mean=mean, m2=variance * (samples - 1))
        self.windows_completed = max(self.windows_completed, samples)

    def discard_current(self) -> None:
        self.current = Counter()
        self.previous = Counter()

    # checks
    def is_ready(self) -> bool:
        return self.windows_completed >= self.min_samples

    def threshold(self, mark_type: MarkType) -> float:
        stats = self.stats[mark_type]
        return stats.mean + self.k * max(stats.stddev, self.std_floor)

    def anomaly(self, at: float) -> Anomaly | None:
        self.advance(at)
        return self._rate_anomaly() or self._type_shift()

    def _rate_anomaly(self) -> Anomaly | None:
        for mark_type in ALL_TYPES:
            count = self.current.get(mark_type, 0)
            if count == 0:
                continue
            limit = self.threshold(mark_type)
            if count > limit:
                return Anomaly(
                    kind=AnomalyKind.RATE, mark_type=mark_type, observed=count, threshold=limit
                )
            straddle = count + self.previous.get(mark_type, 0)
            if straddle > 2 * limit:
                return Anomaly(
                    kind=AnomalyKind.BURST,
                    mark_type=mark_type,
                    observed=straddle,
                    threshold=2 * limit,
                )
        return None

    def _type_shift(self) -> Anomaly | None:
        total = sum(self.current.values())
        history = sum(self.stats[mark_type].mean for mark_type in ALL_TYPES)
        if total < self.type_shift_min_marks or history <= 0:
            return None
        deviations = {
            mark_type: self.current.get(mark_type, 0) / total - self.stats[mark_type].mean / history
            for mark_type in ALL_TYPES
        }
        distance = 0.5 * sum(abs(value) for value in deviations.values())
        if distance <= self.type_shift_threshold:
            return None
        grown = max(ALL_TYPES, key=lambda mark_type: (deviations[mark_type], -_rank(mark_type)))
        return Anomaly(
            kind=AnomalyKind.TYPE_SHIFT,
            mark_type=grown,
            observed=distance,
            threshold=self.type_shift_threshold,
        )


def _rank(mark_type: MarkType) -> int:
    return ALL_TYPES.index(mark_type)


def per_window_rates(
    expected_activity: Mapping[str, float], window_seconds: float
) -> dict[MarkType, float]:
    """Declared marks-per-hour, converted to expected counts per envelope window."""
    return {
        MarkType(name): float(rate) * window_seconds / SECONDS_PER_HOUR
        for name, rate in expected_activity.items()
    }


@dataclass
class _AgentState:
    detector: Detector
    window: int | None = None
    scope_counts: Counter[tuple[MarkType, str]] = field(default_factory=Counter)
    seen_flags: set[tuple[Any, ...]] = field(default_factory=set)
    restricted: Finding | None = None


class StatisticalEnvelope:
    """Per-agent write-pattern monitoring; the guard consults it on every write."""

    def __init__(
        self,
        *,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        k: float = DEFAULT_K,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        type_shift_threshold: float = DEFAULT_TYPE_SHIFT_THRESHOLD,
        concentration_threshold: int = DEFAULT_CONCENTRATION_THRESHOLD,
        detector_factory: Callable[[], Detector] | None = None,
        exempt_agents: Iterable[UUID] = (),
        principal_token: str | None = None,
    ) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        self.window_seconds = float(window_seconds)
        self.concentration_threshold = concentration_threshold
        self.exempt_agents: set[UUID] = set(exempt_agents)
        self._principal_token = principal_token
        self._factory = detector_factory or (
            lambda: WelfordDetector(
                window_seconds=self.window_seconds,
                k=k,
                min_samples=min_samples,
                type_shift_threshold=type_shift_threshold,
            )
        )
        self._agents: dict[UUID, _AgentState] = {}
        self._topics_window: int | None = None
        self._topic_writers: dict[tuple[str, str], set[UUID]] = {}
        self._agent_topics: dict[UUID, set[tuple[str, str]]] = {}
        self._reported_concentration: set[tuple[int, str, str]] = set()
        self._lock = threading.RLock()

    # registration
    def register(self, agent: Any) -> bool:
        """Start monitoring ``agent``, seeding its declared baseline (manifest
        ``expected_activity``). Returns False if it was known already or is exempt."""
        with self._lock:
            if agent.id in self.exempt_agents or agent.id in self._agents:
                return False
            state = self._state(agent.id)
            manifest = getattr(agent, "manifest", None)
            expected = getattr(manifest, "expected_activity", None) if manifest else None
            if expected:
                state.detector.seed_baseline(per_window_rates(expected, self.window_seconds))
            return True

    def exempt(self, agent_id: UUID) -> None:
        with self._lock:
            self.exempt_agents.add(agent_id)
            self._agents.pop(agent_id, None)

    def is_exempt(self, agent_id: UUID) -> bool:
        return agent_id in self.exempt_agents

    def detector_for(self, agent_id: UUID) -> Detector:
        with self._lock:
            return self._state(agent_id).detector

    # feeding
    def record_attempt(
        self,
        agent_id: UUID,
        scope: str,
        mark_type: MarkType,
        at: float,
        topic: str | None = None,
    ) -> None:
        """Count one write attempt (stored or rejected)."""
        if agent_id in self.exempt_agents:
            return
        mark_type = MarkType(mark_type)
        with self._lock:
            state = self._state(agent_id)
            self._roll_agent(state, at)
            state.detector.record(mark_type, at)
            state.scope_counts[(mark_type, scope)] += 1
            if topic is not None:
                self._roll_topics(at)
                self._topic_writers.setdefault((scope, topic), set()).add(agent_id)
                self._agent_topics.setdefault(agent_id, set()).add((scope, topic))

    def record(self, agent_id: UUID, mark: Any) -> None:
        """Count a stored mark; the signature of a space write hook (``as_write_hook``)."""
        at = mark.created_at if mark.created_at is not None else 0.0
        self.record_attempt(agent_id, mark.scope, mark.mark_type, at, getattr(mark, "topic", None))

    def as_write_hook(self) -> Callable[[UUID, Any], None]:
        """For deployments whose writes bypass the guard. Do not combine with a guard that
        records into the same envelope, or every write counts twice."""
        return self.record

    # checking
    def check(self, agent_id: UUID, at: float) -> EnvelopeVerdict:
        return self.evaluate(agent_id, at).verdict

    def evaluate(self, agent_id: UUID, at: float) -> Finding:
        with self._lock:
            window = window_of(at, self.window_seconds)
            if agent_id in self.exempt_agents:
                return Finding(verdict=EnvelopeVerdict.NORMAL, agent_id=agent_id, window=window)
            state = self._state(agent_id)
            self._roll_agent(state, at)
            individual = self._individual(state, agent_id, window, at)
            if individual is not None:
                return individual
            if state.restricted is not None:
                return state.restricted.model_copy(update={"new_flag": False, "window": window})
            if not state.detector.is_ready():
                return Finding(verdict=EnvelopeVerdict.NORMAL, agent_id=agent_id, window=window)
            return self._concentration(agent_id, window, at) or Finding(
                verdict=EnvelopeVerdict.NORMAL, agent_id=agent_id, window=window
            )

    def is_restricted(self, agent_id: UUID) -> bool:
        with self._lock:
            state = self._agents.get(agent_id)
            return state is not None and state.restricted is not None

    def reset(self, agent_id: UUID, principal_token: str) -> None:
        """Lift a restriction (principal only)."""
        expected = self._principal_token
        if expected is None or not hmac.compare_digest(
            str(principal_token).encode(), expected.encode()
        ):
            raise PrincipalTokenRejected(
                f"envelope reset refused for agent {agent_id}: not the principal's token"
            )
        with self._lock:
            state = self._agents.get(agent_id)
            if state is None:
                return
            state.restricted = None
            state.detector.discard_current()
            state.scope_counts.clear()

    # internals
    def _state(self, agent_id: UUID) -> _AgentState:
        state = self._agents.get(agent_id)
        if state is None:
            state = _AgentState(detector=self._factory())
            self._agents[agent_id] = state
        return state

    def _roll_agent(self, state: _AgentState, at: float) -> None:
        window = window_of(at, self.window_seconds)
        if state.window is None or window > state.window:
            state.window = window
            state.scope_counts.clear()

    def _roll_topics(self, at: float) -> None:
        window = window_of(at, self.window_seconds)
        if self._topics_window is None or window > self._topics_window:
            self._topics_window = window
            self._topic_writers.clear()
            self._agent_topics.clear()
            self._reported_concentration = {
                key for key in self._reported_concentration if key[0] >= window
            }

    def _individual(
        self, state: _AgentState, agent_id: UUID, window: int, at: float
    ) -> Finding | None:
        detector = state.detector
        if not detector.is_ready():
            return None
        anomaly = detector.anomaly(at)
        if anomaly is None:
            return None
        scope = self._dominant_scope(state, anomaly.mark_type)
        key = (anomaly.kind, anomaly.mark_type, scope, window)
        new_flag = key not in state.seen_flags
        state.seen_flags.add(key)
        finding = Finding(
            verdict=EnvelopeVerdict.RESTRICTED,
            agent_id=agent_id,
            window=window,
            kind=anomaly.kind,
            scope=scope,
            mark_type=anomaly.mark_type,
            reason=_describe(anomaly, scope),
            new_flag=new_flag,
        )
        if state.restricted is None or new_flag:
            state.restricted = finding
        return finding

    @staticmethod
    def _dominant_scope(state: _AgentState, mark_type: MarkType) -> str | None:
        candidates = [
            (count, scope)
            for (counted_type, scope), count in state.scope_counts.items()
            if counted_type == mark_type
        ]
        if not candidates:
            return None
        best = max(count for count, _ in candidates)
        return min(scope for count, scope in candidates if count == best)

    def _concentration(self, agent_id: UUID, window: int, at: float) -> Finding | None:
        self._roll_topics(at)
        crowded = sorted(
            key
            for key in self._agent_topics.get(agent_id, ())
            if len(self._topic_writers.get(key, ())) >= self.concentration_threshold
        )
        if not crowded:
            return None
        scope, topic = crowded[0]
        report_key = (window, scope, topic)
        new_flag = report_key not in self._reported_concentration
        self._reported_concentration.add(report_key)
        writers = len(self._topic_writers[(scope, topic)])
        return Finding(
            verdict=EnvelopeVerdict.FLAGGED,
            agent_id=agent_id,
            window=window,
            kind=AnomalyKind.CONCENTRATION,
            scope=scope,
            topic=topic,
            reason=f"{writers} agents wrote to ({scope!r}, {topic!r}) in one window",
            new_flag=new_flag,
        )


def _describe(anomaly: Anomaly, scope: str | None) -> str:
    where = f" in scope {scope!r}" if scope else ""
    if anomaly.kind is AnomalyKind.TYPE_SHIFT:
        return (
            f"type mix shifted toward {anomaly.mark_type.value}{where} "
            f"(distance {anomaly.observed:.2f} > {anomaly.threshold:.2f})"
        )
    label = "burst across a window boundary" if anomaly.kind is AnomalyKind.BURST else "rate"
    return (
        f"{anomaly.mark_type.value} {label}{where}: {anomaly.observed:g} writes "
        f"> threshold {anomaly.threshold:.2f}"
    )
