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


# Every name envelope.py had stays importable from here: the imports below are re-exports.
# ruff: noqa: F401

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
from agentpost.marks.envelope.detectors import (
    _EXPORTED,
    ALL_TYPES,
    DEFAULT_CONCENTRATION_THRESHOLD,
    DEFAULT_GLOBAL_ESCALATION_THRESHOLD,
    DEFAULT_K,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_TYPE_SHIFT_THRESHOLD,
    DEFAULT_WINDOW_SECONDS,
    MAD_TO_STDDEV,
    PACKAGE_MIN_SAMPLES,
    SECONDS_PER_HOUR,
    TRACKED_TYPES,
    Anomaly,
    AnomalyDetector,
    AnomalyKind,
    Detector,
    EnvelopeVerdict,
    Finding,
    Welford,
    WelfordConfig,
    WelfordDetector,
    WindowedDetector,
    _describe,
    _export_accumulators,
    _import_accumulators,
    _ordered,
    _rank,
    _seeded_m2,
    per_window_rates,
    window_of,
)
from agentpost.marks.envelope.windows import (
    _TUNING,
    AgentStats,
    EnvelopeConfig,
    WindowCounts,
    _AgentState,
    _default_detector,
    _WindowCounts,
    _Windows,
)


class StatisticalEnvelope(_Windows):
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
