"""The envelope's detectors (spec §9.6): verdicts and findings, Welford's online statistics,
the package's `AnomalyDetector` protocol with its default `WelfordDetector`, and the
windowed detector of our reading. `agentpost.marks.envelope` re-exports every name.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import MarkType

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
