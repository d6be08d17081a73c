"""The envelope's per-agent state (`EnvelopeConfig`, `AgentStats`, the window counts) and its
internals: rotating windows, evaluating them (the package's engine and the windowed one),
flagging a finding. A mixin of `StatisticalEnvelope` (`agentpost.marks.envelope`).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from agentpost.marks.core import MarkType
from agentpost.marks.envelope.detectors import (
    DEFAULT_CONCENTRATION_THRESHOLD,
    DEFAULT_GLOBAL_ESCALATION_THRESHOLD,
    DEFAULT_WINDOW_SECONDS,
    TRACKED_TYPES,
    Anomaly,
    AnomalyDetector,
    AnomalyKind,
    EnvelopeVerdict,
    Finding,
    WelfordDetector,
    WindowedDetector,
    _describe,
    _ordered,
    window_of,
)

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


class _Windows:
    """The windows and evaluation section of `StatisticalEnvelope`."""

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
