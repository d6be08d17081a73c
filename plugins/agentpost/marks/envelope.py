"""The statistical envelope (Markspace §9.7): per-agent anomaly detection over write attempts.

Every agent gets a detector that learns its own baseline from tumbling windows of per-type
write counts (Welford's online mean and variance). ``check`` asks it about the current window:
a rate spike or a type shift makes the agent RESTRICTED (sticky until the principal's
``reset``, P40); three or more agents on one ``(scope, topic)`` make it FLAGGED. A detector
that is not ready yet always yields NORMAL (P41).

Two detection engines, chosen by how the envelope is built:

- The package's (``StatisticalEnvelope()``, ``StatisticalEnvelope(EnvelopeConfig(...),
  clock)``): `AnomalyDetector` detectors (default `WelfordDetector`) fed by the envelope.
  Verdicts and numbers are the package's: a window opens at an agent's first counted write
  and closes at the first write or check after ``window_seconds``; only windows with writes
  are observed; only ``tracked_types`` (observations and warnings) count; the cold-start
  baseline is the median and MAD of the first ``min_samples`` active windows (robust to a
  burst during cold start); stddev is floored at the Poisson bound sqrt(mean). Beyond the
  package, and on by default (``EnvelopeConfig.straddle_check``), §9.7's boundary-straddling
  burst check: ``current + previous > 2 * threshold``, where ``previous`` is the window
  completed just before (empty after a whole idle window, and without the writes a reset
  forgave). Two halves each under the threshold never sum above twice it, so the check
  adds detection only where a window's writes were not judged while it was current (a
  write hook with sparse checks, the package's pattern); the guard judges after every
  attempt, so behind it the check practically never fires. ``straddle_check=False`` gives
  the package's exact verdicts.
- Ours, the windowed reading (any of the keywords ``window_seconds``, ``k``, ``min_samples``,
  ``type_shift_threshold``, ``detector_factory``): `WindowedDetector`, windows aligned on
  multiples of ``window_seconds``, every mark type counted, idle windows fed as zeros (at most
  ``max_idle_windows``), stddev floored at ``std_floor``, the type-shift check as total
  variation distance, and the boundary-straddling burst check of §9.7 (``current + previous >
  2 * threshold``). The Spark analytics mirror it.

Our additions on either engine:
- The envelope counts *attempts*: every write the guard tries for an agent, including the ones
  a barrier or a rate limit rejects (`record_attempt`, P64), so hammering is visible.
- `evaluate` returns a `Finding` (kind, scope, mark type, reason). A *flag* is a new finding:
  (kind, mark type, scope, window) not reported before for the agent; the guard escalates once
  per flag (P43). While restricted the verdict stays RESTRICTED, but the current window is
  still examined, so a flood moved to another scope is a new flag.
- The flagged scope of a rate or type-shift finding is the scope the agent wrote the
  triggering type to most in the current window (ties: the smallest name).
- ``principal_token``: when given, ``reset`` refuses any other token (`PrincipalTokenRejected`);
  without it the caller validates, as in the package.
- The statistics live in the guard's process.
"""

from __future__ import annotations

import hmac
import math
import statistics
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.barrier import PrincipalTokenRejected
from agentpost.marks.core import AnyMark, InvalidArgument, MarkType, Observation, Warning

DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_K = 3.5
DEFAULT_MIN_SAMPLES = 5
DEFAULT_TYPE_SHIFT_THRESHOLD = 0.5
DEFAULT_CONCENTRATION_THRESHOLD = 3
DEFAULT_GLOBAL_ESCALATION_THRESHOLD = 3
#: the package's WelfordDetector: windows of baseline before it judges
PACKAGE_MIN_SAMPLES = 10
SECONDS_PER_HOUR = 3600.0
ALL_TYPES: tuple[MarkType, ...] = tuple(MarkType)
TRACKED_TYPES: frozenset[MarkType] = frozenset({MarkType.OBSERVATION, MarkType.WARNING})
#: MAD -> stddev under normality (1 / the normal quantile at 3/4): a constant, not a knob
MAD_TO_STDDEV = 1.4826


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


# the package's detector protocol and its default detector


class AnomalyDetector(ABC):
    """One agent's baseline (the package's protocol): the envelope feeds it each completed
    window (`observe`) and asks about the window in progress (`is_anomalous`)."""

    @abstractmethod
    def observe(self, window_counts: dict[MarkType, int]) -> None:
        """Learn from one completed window's per-type counts."""

    @abstractmethod
    def is_ready(self) -> bool:
        """Enough baseline to judge; until then the envelope says NORMAL (P41)."""

    @abstractmethod
    def is_anomalous(self, current_counts: dict[MarkType, int]) -> bool:
        """Whether the in-progress window departs from the baseline."""

    @abstractmethod
    def export_state(self) -> dict[str, Any]:
        """The baseline as plain data (for `import_state`)."""

    @abstractmethod
    def import_state(self, data: dict[str, Any]) -> None:
        """Take a baseline exported by `export_state`."""

    def seed_baseline(self, expected: dict[MarkType, float]) -> None:  # noqa: B027
        """Start from a declared per-window rate (optional; ignored by default)."""


@dataclass
class WelfordConfig:
    """The package's WelfordDetector settings."""

    k_sigma: float = DEFAULT_K
    min_samples: int = PACKAGE_MIN_SAMPLES
    type_shift_threshold: float = DEFAULT_TYPE_SHIFT_THRESHOLD
    tracked_types: frozenset[MarkType] = TRACKED_TYPES


class WelfordDetector(AnomalyDetector):
    """k-sigma rate and type-shift detection over Welford accumulators, as the package.

    Until ``min_samples`` windows with writes were seen (and no baseline was declared or
    imported), windows are buffered; the baseline then starts from their median and MAD, so
    a burst during cold start cannot inflate it. Afterwards each window updates the
    accumulators. The rate threshold is ``mean + k_sigma * max(stddev, sqrt(mean))``: counts
    vary at least as a Poisson process does.
    """

    def __init__(self, config: WelfordConfig | None = None) -> None:
        self.config = config or WelfordConfig()
        self._stats: dict[MarkType, Welford] = {}
        self._completed = 0
        self._active = 0
        self._cold: list[dict[MarkType, int]] | None = []

    # feeding
    def observe(self, window_counts: dict[MarkType, int]) -> None:
        counts = {MarkType(t): int(n) for t, n in window_counts.items()}
        self._completed += 1
        if self._has_marks(counts):
            self._active += 1
        if self._cold is None:
            for mark_type in self.config.tracked_types:
                self._stats.setdefault(mark_type, Welford()).update(float(counts.get(mark_type, 0)))
            return
        self._cold.append(counts)
        if sum(1 for window in self._cold if self._has_marks(window)) >= self.config.min_samples:
            self._start_from_cold()

    def seed_baseline(self, expected: dict[MarkType, float], synthetic_windows: int = 0) -> None:
        """Declared per-window rates as ``synthetic_windows`` windows (default
        ``min_samples``: ready at once), stddev half the mean (§9.7)."""
        n = synthetic_windows or self.config.min_samples
        for mark_type, mean in expected.items():
            mark_type = MarkType(mark_type)
            if mark_type not in self.config.tracked_types:
                continue
            mean = float(mean)
            self._stats[mark_type] = Welford(n=n, mean=mean, m2=_seeded_m2(mean, n))
        self._completed = max(self._completed, n)
        self._active = max(self._active, n)
        self._cold = None

    def _start_from_cold(self) -> None:
        windows = self._cold or []
        for mark_type in self.config.tracked_types:
            values = [float(window.get(mark_type, 0)) for window in windows]
            middle = statistics.median(values)
            spread = MAD_TO_STDDEV * statistics.median(abs(v - middle) for v in values)
            n = len(values)
            self._stats[mark_type] = Welford(
                n=n, mean=middle, m2=spread * spread * (n - 1) if n > 1 else 0.0
            )
        self._cold = None

    # judging
    def is_ready(self) -> bool:
        return self._active >= self.config.min_samples

    def is_anomalous(self, current_counts: dict[MarkType, int]) -> bool:
        return self.explain(current_counts) is not None

    def explain(self, current_counts: Mapping[MarkType, int]) -> Anomaly | None:
        """Ours: what `is_anomalous` found (first the rate, then the type shift)."""
        counts = {MarkType(t): int(n) for t, n in current_counts.items()}
        return self._rate(counts) or self._type_shift(counts)

    def threshold(self, mark_type: MarkType) -> float:
        stats = self._stat(MarkType(mark_type))
        floor = math.sqrt(max(stats.mean, 0.0))
        return stats.mean + self.config.k_sigma * max(stats.stddev, floor)

    def _rate(self, counts: dict[MarkType, int]) -> Anomaly | None:
        for mark_type in _ordered(self.config.tracked_types):
            limit = self.threshold(mark_type)
            observed = counts.get(mark_type, 0)
            if limit > 0 and observed > limit:
                return Anomaly(
                    kind=AnomalyKind.RATE, mark_type=mark_type, observed=observed, threshold=limit
                )
        return None

    def _type_shift(self, counts: dict[MarkType, int]) -> Anomaly | None:
        tracked = _ordered(self.config.tracked_types)
        total = sum(counts.get(t, 0) for t in tracked)
        history = sum(self._stat(t).mean for t in tracked)
        if total == 0 or history == 0:
            return None
        for mark_type in tracked:
            shift = abs(counts.get(mark_type, 0) / total - self._stat(mark_type).mean / history)
            if shift > self.config.type_shift_threshold:
                grown = max(
                    tracked,
                    key=lambda t: counts.get(t, 0) / total - self._stat(t).mean / history,
                )
                return Anomaly(
                    kind=AnomalyKind.TYPE_SHIFT,
                    mark_type=grown,
                    observed=shift,
                    threshold=self.config.type_shift_threshold,
                )
        return None

    # state
    @property
    def completed_windows(self) -> int:
        return self._completed

    def export_state(self) -> dict[str, Any]:
        return _export_accumulators(self._stats, self._completed, self._active)

    def import_state(self, data: dict[str, Any]) -> None:
        """Merge an exported baseline: window counts never go down; the accumulators of the
        exported types are replaced; cold start is over."""
        completed = int(data.get("completed_windows", 0))
        self._completed = max(self._completed, completed)
        self._active = max(self._active, int(data.get("active_windows", completed)))
        _import_accumulators(self._stats, data)
        self._cold = None

    def diagnostic_stats(self) -> dict[str, Any]:
        """A read-only snapshot of the accumulators."""
        return {
            "n": {t: s.n for t, s in self._stats.items()},
            "mean": {t: s.mean for t, s in self._stats.items()},
            "m2": {t: s.m2 for t, s in self._stats.items()},
            "completed_windows": self._completed,
            "active_windows": self._active,
        }

    def _stat(self, mark_type: MarkType) -> Welford:
        """The accumulator of ``mark_type`` (an empty one, not stored, if never fed)."""
        return self._stats.get(mark_type) or Welford()

    def _has_marks(self, counts: Mapping[MarkType, int]) -> bool:
        return any(counts.get(t, 0) > 0 for t in self.config.tracked_types)


_EXPORTED = (("welford_n", "n", int), ("welford_mean", "mean", float), ("welford_m2", "m2", float))


def _export_accumulators(
    stats: Mapping[MarkType, Welford], completed: int, active: int
) -> dict[str, Any]:
    """Per-type accumulators in the package's export format: one format for both engines'
    detectors (and so for ``export_stats``), written once."""
    return {
        "completed_windows": completed,
        "active_windows": active,
        **{
            column: {t.value: getattr(s, attribute) for t, s in stats.items()}
            for column, attribute, _ in _EXPORTED
        },
    }


def _import_accumulators(stats: dict[MarkType, Welford], data: Mapping[str, Any]) -> None:
    """Replace the accumulators of the types ``data`` (`_export_accumulators`) names; the
    window counts are the caller's, since the engines count windows differently."""
    for column, attribute, kind in _EXPORTED:
        for key, value in data.get(column, {}).items():
            setattr(stats.setdefault(MarkType(key), Welford()), attribute, kind(value))


def _seeded_m2(mean: float, n: int) -> float:
    """M2 for ``n`` synthetic windows with variance 25% of the mean squared (§9.7)."""
    return 0.25 * mean * mean * (n - 1) if n > 1 else 0.0


def _ordered(types: Iterable[MarkType]) -> list[MarkType]:
    """Mark types in the enum's order (deterministic findings)."""
    chosen = set(types)
    return [t for t in ALL_TYPES if t in chosen]


@runtime_checkable
class Detector(Protocol):
    """Our windowed detector protocol: the detector keeps its own windows (`record` with
    the time of each attempt); `WindowedDetector` is the default."""

    def record(self, mark_type: MarkType, at: float) -> None: ...

    def advance(self, at: float) -> None: ...

    def is_ready(self) -> bool: ...

    def anomaly(self, at: float) -> Anomaly | None: ...

    def seed_baseline(self, per_window: Mapping[MarkType, float]) -> None: ...

    def export_state(self) -> dict[str, Any]:
        """The accumulators in the package's export format."""
        return _export_accumulators(self.stats, self.windows_completed, self.windows_completed)

    def import_state(self, data: Mapping[str, Any]) -> None:
        self.windows_completed = max(self.windows_completed, int(data.get("completed_windows", 0)))
        _import_accumulators(self.stats, data)

    def discard_current(self) -> None: ...


def window_of(at: float, seconds: float) -> int:
    return math.floor(at / seconds)


@dataclass
class WindowedDetector:
    """Our §9.7 reading (see the module doc): windows aligned on ``window_seconds``, every
    mark type counted, idle windows fed as zeros, the straddling-burst check."""

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

    def export_state(self) -> dict[str, Any]:
        """The accumulators in the package's export format."""
        return _export_accumulators(self.stats, self.windows_completed, self.windows_completed)

    def import_state(self, data: Mapping[str, Any]) -> None:
        self.windows_completed = max(self.windows_completed, int(data.get("completed_windows", 0)))
        _import_accumulators(self.stats, data)

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


# the envelope


def _default_detector(agent_id: uuid.UUID) -> AnomalyDetector:
    return WelfordDetector()


@dataclass
class EnvelopeConfig:
    """The package's envelope settings; ``detector_factory(agent_id)`` builds one detector per
    agent, so each learns its own baseline."""

    window_seconds: float = DEFAULT_WINDOW_SECONDS
    detector_factory: Callable[[uuid.UUID], AnomalyDetector] = field(
        default_factory=lambda: _default_detector
    )
    tracked_types: frozenset[MarkType] = TRACKED_TYPES
    concentration_threshold: int = DEFAULT_CONCENTRATION_THRESHOLD
    global_escalation_threshold: int = DEFAULT_GLOBAL_ESCALATION_THRESHOLD
    exempt_agents: set[uuid.UUID] = field(default_factory=set)
    #: ours: §9.7's boundary-straddling burst check, which the package leaves out; False
    #: gives the package's exact verdicts
    straddle_check: bool = field(default=True, kw_only=True)


@dataclass
class _WindowCounts:
    """Per-type counts of one window and when it opened (None: at the next counted write)."""

    counts: dict[MarkType, int] = field(default_factory=dict)
    start: float | None = 0.0


#: public name of a window's counts (the package keeps it private)
WindowCounts = _WindowCounts


@dataclass
class AgentStats:
    """A read-only view of one agent's envelope state (the package's diagnostics)."""

    current_window: _WindowCounts = field(default_factory=_WindowCounts)
    previous_window: _WindowCounts = field(default_factory=_WindowCounts)
    welford_n: dict[MarkType, int] = field(default_factory=dict)
    welford_mean: dict[MarkType, float] = field(default_factory=dict)
    welford_m2: dict[MarkType, float] = field(default_factory=dict)
    completed_windows: int = 0
    restricted: bool = False


@dataclass
class _AgentState:
    detector: Any
    window: int | None = None
    current: _WindowCounts = field(default_factory=lambda: _WindowCounts(start=None))
    #: the package engine: the last completed window, empty after an idle gap (§9.7 straddle)
    previous: _WindowCounts = field(default_factory=_WindowCounts)
    #: counts of the current window a reset forgave: they never become ``previous``
    forgiven: dict[MarkType, int] = field(default_factory=dict)
    scope_counts: Counter[tuple[MarkType, str]] = field(default_factory=Counter)
    seen_flags: set[tuple[Any, ...]] = field(default_factory=set)
    restricted: Finding | None = None


_TUNING = ("window_seconds", "k", "min_samples", "type_shift_threshold", "detector_factory")


class StatisticalEnvelope:
    """Per-agent write-pattern monitoring; the guard consults it on every write. Built the
    package's way it runs the package's detection; our tuning keywords select our windowed
    reading (module doc)."""

    def __init__(
        self,
        config: EnvelopeConfig | None = None,
        clock: Callable[[], float] | None = None,
        *,
        window_seconds: float | None = None,
        k: float | None = None,
        min_samples: int | None = None,
        type_shift_threshold: float | None = None,
        concentration_threshold: int | None = None,
        detector_factory: Callable[[], Detector] | None = None,
        exempt_agents: Iterable[UUID] = (),
        principal_token: str | None = None,
    ) -> None:
        given = dict(
            zip(
                _TUNING,
                (window_seconds, k, min_samples, type_shift_threshold, detector_factory),
                strict=True,
            )
        )
        tuning = {name: value for name, value in given.items() if value is not None}
        if config is not None and tuning:
            raise InvalidArgument(
                f"give an EnvelopeConfig or the windowed keywords, not both: {sorted(tuning)}"
            )
        self.config = config or EnvelopeConfig()
        self.windowed = bool(tuning)
        self.window_seconds = float(tuning.get("window_seconds", self.config.window_seconds))
        if not self.window_seconds > 0:
            raise InvalidArgument("window_seconds must be > 0")
        self.concentration_threshold = (
            self.config.concentration_threshold
            if concentration_threshold is None
            else concentration_threshold
        )
        self.exempt_agents: set[UUID] = self.config.exempt_agents
        self.exempt_agents.update(exempt_agents)
        self._clock = clock or time.time
        self._principal_token = principal_token
        self._windowed_factory = detector_factory or (
            lambda: WindowedDetector(
                window_seconds=self.window_seconds,
                k=DEFAULT_K if k is None else k,
                min_samples=DEFAULT_MIN_SAMPLES if min_samples is None else min_samples,
                type_shift_threshold=(
                    DEFAULT_TYPE_SHIFT_THRESHOLD
                    if type_shift_threshold is None
                    else type_shift_threshold
                ),
            )
        )
        self._agents: dict[UUID, _AgentState] = {}
        # the package engine: (scope, topic) -> agents whose current window wrote there
        self._recent_writers: dict[tuple[str, str], set[UUID]] = {}
        # the windowed engine: the same, per aligned window
        self._topics_window: int | None = None
        self._topic_writers: dict[tuple[str, str], set[UUID]] = {}
        self._agent_topics: dict[UUID, set[tuple[str, str]]] = {}
        self._reported_concentration: set[tuple[int, str, str]] = set()
        self._lock = threading.RLock()

    # the package's API
    @property
    def global_escalation_threshold(self) -> int:
        """Flags before the guard's global restriction (P43)."""
        return self.config.global_escalation_threshold

    def add_exempt_agent(self, agent_id: uuid.UUID) -> None:
        """Stop counting ``agent_id`` (its state, if any, is kept)."""
        with self._lock:
            self.exempt_agents.add(agent_id)

    def seed_baseline(
        self,
        agent_id: uuid.UUID,
        expected_per_hour: dict[MarkType, float],
    ) -> None:
        """Declared marks per hour, converted to per-window counts, seed the agent's detector
        (no cold-start blind spot, §9.7 declared baselines)."""
        per_window = {
            MarkType(t): float(rate) * self.window_seconds / SECONDS_PER_HOUR
            for t, rate in expected_per_hour.items()
        }
        with self._lock:
            state = self._state(agent_id, opens_at=self._clock())
            state.detector.seed_baseline(per_window)

    def record(self, agent_id: uuid.UUID, mark: AnyMark, *, at: float | None = None) -> None:
        """Count a written mark; the signature of a space write hook (``as_write_hook``).
        ``at`` (ours) is the write's time, for a mark counted before the space stamps it
        (the guard); default: the mark's ``created_at`` in our windowed reading, the
        clock in the package's."""
        if self.windowed and at is None:
            at = mark.created_at if mark.created_at is not None else 0.0
        topic = mark.topic if isinstance(mark, Observation | Warning) else None
        self._record(agent_id, mark.mark_type, mark.scope, at, topic)

    def record_attempt(
        self,
        agent_id: uuid.UUID,
        mark_type: MarkType,
        *,
        scope: str | None = None,
        at: float | None = None,
        topic: str | None = None,
    ) -> None:
        """Count one write attempt that was refused (P64): a rejected attempt is activity
        as much as a write (`record`). ``scope`` names the flagged scope of a finding,
        ``topic`` (with ``scope``) feeds the concentration check, ``at`` is the attempt's
        time (default: the clock)."""
        self._record(agent_id, mark_type, scope, at, topic)

    def _record(
        self, agent_id: uuid.UUID, mark_type: MarkType, scope: str | None, at: float | None,
        topic: str | None,
    ) -> None:
        if agent_id in self.exempt_agents:
            return
        mark_type = MarkType(mark_type)
        now = float(self._clock() if at is None else at)
        with self._lock:
            if self.windowed:
                self._count_windowed(agent_id, mark_type, scope, now, topic)
            else:
                self._count(agent_id, mark_type, scope, now, topic)

    def check(self, agent_id: uuid.UUID, at: float | None = None) -> EnvelopeVerdict:
        return self.evaluate(agent_id, at).verdict

    def get_stats(self, agent_id: uuid.UUID) -> AgentStats | None:
        """The agent's window and accumulators, or None for an agent never seen."""
        with self._lock:
            state = self._agents.get(agent_id)
            return None if state is None else self._stats_of(state)

    def reset(self, agent_id: uuid.UUID, principal_token: Any) -> bool:
        """Lift a restriction; True if there was one. With a configured ``principal_token``
        any other token raises `PrincipalTokenRejected`; otherwise the caller validates."""
        expected = self._principal_token
        if expected is not None and not hmac.compare_digest(
            str(principal_token).encode(), expected.encode()
        ):
            raise PrincipalTokenRejected(
                f"envelope reset refused for agent {agent_id}: not the principal's token"
            )
        with self._lock:
            state = self._agents.get(agent_id)
            if state is None:
                return False
            if self.windowed:  # ours: the release is not undone by the writes it forgave
                state.detector.discard_current()
                state.scope_counts.clear()
            lifted, state.restricted = state.restricted is not None, None
            if lifted and not self.windowed:  # the window stays (package); its writes are
                # forgiven as a later window's straddle ``previous``
                state.previous = _WindowCounts()
                state.forgiven = dict(state.current.counts)
            return lifted

    def export_stats(self) -> dict[str, Any]:
        """Every agent's baseline and restriction, as plain data."""
        with self._lock:
            return {
                str(agent_id): {
                    **state.detector.export_state(),
                    "restricted": state.restricted is not None,
                }
                for agent_id, state in self._agents.items()
            }

    def import_stats(self, data: dict[str, Any]) -> None:
        """Merge exported stats (additive; the restriction flag is taken as exported)."""
        with self._lock:
            for key, exported in data.items():
                agent_id = uuid.UUID(str(key))
                state = self._state(agent_id, opens_at=self._clock())
                state.detector.import_state(exported)
                state.restricted = (
                    Finding(
                        verdict=EnvelopeVerdict.RESTRICTED,
                        agent_id=agent_id,
                        window=window_of(self._clock(), self.window_seconds),
                        reason="restricted in the imported stats",
                    )
                    if exported.get("restricted", False)
                    else None
                )

    # ours: registration and exemption
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
        """Exempt ``agent_id`` and forget what was counted for it."""
        with self._lock:
            self.exempt_agents.add(agent_id)
            self._agents.pop(agent_id, None)

    def is_exempt(self, agent_id: UUID) -> bool:
        return agent_id in self.exempt_agents

    def detector_for(self, agent_id: UUID) -> Any:
        with self._lock:
            return self._state(agent_id).detector

    def is_restricted(self, agent_id: UUID) -> bool:
        with self._lock:
            state = self._agents.get(agent_id)
            return state is not None and state.restricted is not None

    def as_write_hook(self) -> Callable[[UUID, Any], None]:
        """For deployments whose writes bypass the guard. Do not combine with a guard that
        records into the same envelope, or every write counts twice."""
        return self.record

    # ours: the finding behind the verdict
    def evaluate(self, agent_id: UUID, at: float | None = None) -> Finding:
        now = float(self._clock() if at is None else at)
        window = window_of(now, self.window_seconds)
        normal = Finding(verdict=EnvelopeVerdict.NORMAL, agent_id=agent_id, window=window)
        with self._lock:
            if not self.windowed:  # an exempt agent has no new counts; old ones still judge
                return self._evaluate(agent_id, window, now) or normal
            if agent_id in self.exempt_agents:
                return normal
            return self._evaluate_windowed(agent_id, window, now) or normal

    # internals: the package engine
    def _state(self, agent_id: UUID, opens_at: float | None = None) -> _AgentState:
        state = self._agents.get(agent_id)
        if state is None:
            detector = (
                self._windowed_factory()
                if self.windowed
                else self.config.detector_factory(agent_id)
            )
            state = _AgentState(detector=detector, current=_WindowCounts(start=opens_at))
            self._agents[agent_id] = state
        return state

    def _count(
        self, agent_id: UUID, mark_type: MarkType, scope: str | None, now: float, topic: str | None
    ) -> None:
        if mark_type not in self.config.tracked_types:
            return
        state = self._state(agent_id, opens_at=now)
        self._rotate(agent_id, state, now)
        counts = state.current.counts
        counts[mark_type] = counts.get(mark_type, 0) + 1
        if scope is not None:
            state.scope_counts[(mark_type, scope)] += 1
            if topic is not None:
                self._recent_writers.setdefault((scope, topic), set()).add(agent_id)

    def _rotate(self, agent_id: UUID, state: _AgentState, now: float) -> None:
        """Close the window once ``window_seconds`` passed since it opened: a window with
        writes feeds the detector (idle time does not); the next opens now."""
        start = state.current.start
        if start is None:
            state.current.start = now
            return
        if now < start + self.window_seconds:
            return
        closed = state.current
        if closed.counts:
            state.detector.observe(dict(closed.counts))
        state.previous = (
            self._carried(closed, state.forgiven)
            if now < start + 2 * self.window_seconds
            else _WindowCounts()  # a whole idle window between: nothing straddles
        )
        state.forgiven = {}
        state.current = _WindowCounts(start=now)
        state.scope_counts.clear()
        for writers in self._recent_writers.values():
            writers.discard(agent_id)

    def _evaluate(self, agent_id: UUID, window: int, now: float) -> Finding | None:
        state = self._agents.get(agent_id)
        if state is None:
            return None
        if state.restricted is None and state.current.start is not None:
            self._rotate(agent_id, state, now)  # a restricted agent's window stays (package)
        anomaly = self._explain(state)
        if anomaly is not None:
            return self._flag(state, agent_id, window, anomaly)
        if state.restricted is not None:  # P40: sticky until reset
            return self._still_restricted(state, window)
        if not state.detector.is_ready():  # P41
            return None
        return self._crowd(agent_id, window)

    @staticmethod
    def _carried(closed: _WindowCounts, forgiven: Mapping[MarkType, int]) -> _WindowCounts:
        """The closed window as the next one's ``previous``, minus what a reset forgave."""
        counts = {t: n - forgiven.get(t, 0) for t, n in closed.counts.items()}
        return _WindowCounts({t: n for t, n in counts.items() if n > 0}, closed.start)

    def _explain(self, state: _AgentState) -> Anomaly | None:
        if not state.detector.is_ready():
            return None  # P41
        return self._detector_anomaly(state) or self._straddle(state)

    def _straddle(self, state: _AgentState) -> Anomaly | None:
        """§9.7 check 1, second half: a burst split across a window boundary (``current +
        previous > 2 * threshold``) whose current half is under the threshold. It fires when
        the earlier half was never judged while current (counted through the write hook
        with no check in its window, or before the detector was ready): two judged halves
        are each <= threshold. Needs the detector's per-type ``threshold`` (WelfordDetector
        has one); a current window without the type cannot straddle."""
        threshold = getattr(state.detector, "threshold", None)
        if not self.config.straddle_check or not callable(threshold):
            return None
        current, previous = state.current.counts, state.previous.counts
        for mark_type in _ordered(self.config.tracked_types):
            count = current.get(mark_type, 0)
            if count == 0:
                continue
            limit = 2 * threshold(mark_type)
            both = count + previous.get(mark_type, 0)
            if limit > 0 and both > limit:
                return Anomaly(
                    kind=AnomalyKind.BURST, mark_type=mark_type, observed=both, threshold=limit
                )
        return None

    def _detector_anomaly(self, state: _AgentState) -> Anomaly | None:
        """What the detector itself finds in the current window (rate, type shift)."""
        detector = state.detector
        counts = dict(state.current.counts)
        explain = getattr(detector, "explain", None)
        if callable(explain):
            return explain(counts)
        if not detector.is_anomalous(counts):
            return None
        busiest = max(_ordered(counts), key=lambda t: counts[t], default=MarkType.OBSERVATION)
        return Anomaly(
            kind=AnomalyKind.RATE,
            mark_type=busiest,
            observed=counts.get(busiest, 0),
            threshold=0.0,
        )

    def _crowd(self, agent_id: UUID, window: int) -> Finding | None:
        crowded = sorted(
            key
            for key, writers in self._recent_writers.items()
            if agent_id in writers and len(writers) >= self.concentration_threshold
        )
        if not crowded:
            return None
        return self._concentration_finding(
            agent_id, window, crowded[0], len(self._recent_writers[crowded[0]])
        )

    # internals: the windowed engine
    def _count_windowed(
        self, agent_id: UUID, mark_type: MarkType, scope: str | None, now: float, topic: str | None
    ) -> None:
        state = self._state(agent_id)
        self._roll_agent(state, now)
        state.detector.record(mark_type, now)
        if scope is None:
            return
        state.scope_counts[(mark_type, scope)] += 1
        if topic is not None:
            self._roll_topics(now)
            self._topic_writers.setdefault((scope, topic), set()).add(agent_id)
            self._agent_topics.setdefault(agent_id, set()).add((scope, topic))

    def _evaluate_windowed(self, agent_id: UUID, window: int, now: float) -> Finding | None:
        state = self._state(agent_id)
        self._roll_agent(state, now)
        detector = state.detector
        if detector.is_ready():
            anomaly = detector.anomaly(now)
            if anomaly is not None:
                return self._flag(state, agent_id, window, anomaly)
        if state.restricted is not None:
            return self._still_restricted(state, window)
        if not detector.is_ready():
            return None
        self._roll_topics(now)
        crowded = sorted(
            key
            for key in self._agent_topics.get(agent_id, ())
            if len(self._topic_writers.get(key, ())) >= self.concentration_threshold
        )
        if not crowded:
            return None
        return self._concentration_finding(
            agent_id, window, crowded[0], len(self._topic_writers[crowded[0]])
        )

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

    # internals: findings and views, both engines
    def _flag(self, state: _AgentState, agent_id: UUID, window: int, anomaly: Anomaly) -> Finding:
        """RESTRICTED; a new (kind, type, scope, window) is a new flag for the guard."""
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
    def _still_restricted(state: _AgentState, window: int) -> Finding:
        assert state.restricted is not None
        return state.restricted.model_copy(update={"new_flag": False, "window": window})

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

    def _concentration_finding(
        self, agent_id: UUID, window: int, where: tuple[str, str], writers: int
    ) -> Finding:
        scope, topic = where
        report_key = (window, scope, topic)
        new_flag = report_key not in self._reported_concentration
        self._reported_concentration.add(report_key)
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

    def _stats_of(self, state: _AgentState) -> AgentStats:
        detector = state.detector
        restricted = state.restricted is not None
        if isinstance(detector, WindowedDetector):
            start = (detector.current_index or 0) * self.window_seconds
            return AgentStats(
                current_window=_WindowCounts(dict(detector.current), start),
                previous_window=_WindowCounts(dict(detector.previous), start - self.window_seconds),
                welford_n={t: s.n for t, s in detector.stats.items()},
                welford_mean={t: s.mean for t, s in detector.stats.items()},
                welford_m2={t: s.m2 for t, s in detector.stats.items()},
                completed_windows=detector.windows_completed,
                restricted=restricted,
            )
        stats = AgentStats(
            current_window=_WindowCounts(dict(state.current.counts), state.current.start),
            previous_window=_WindowCounts(dict(state.previous.counts), state.previous.start),
            restricted=restricted,
        )
        diagnostics = getattr(detector, "diagnostic_stats", None)
        if callable(diagnostics):
            found = diagnostics()
            stats.welford_n, stats.welford_mean = dict(found["n"]), dict(found["mean"])
            stats.welford_m2 = dict(found["m2"])
            stats.completed_windows = int(found["completed_windows"])
        return stats


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
