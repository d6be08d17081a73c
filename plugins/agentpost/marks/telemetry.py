"""Telemetry for the guard (spec §9.11): metrics and structured log events go to a sink, never
into the mark space. Marks are coordination signals between agents; telemetry is operational
data for people.

The sink interface is OpenTelemetry-shaped: a metric is a named instrument reading (counter,
gauge or histogram) with string labels, a log event is a named record with attributes.

P57 (non-interference): the guard emits through `Emitter`, which swallows every sink error, so
a failing sink can never change a verdict, a stored mark or a read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

# The metric names of §9.11.
MARKS_WRITTEN = "markspace.marks.written"
MARKS_READ = "markspace.marks.read"
TOKENS_INPUT = "markspace.tokens.input"
TOKENS_OUTPUT = "markspace.tokens.output"
CONFLICTS_RESOLVED = "markspace.conflicts.resolved"
ACTIVE_MARKS = "markspace.space.active_marks"
TOTAL_MARKS = "markspace.space.total_marks"
BUDGET_REMAINING = "markspace.agent.budget.remaining"
ROUND_DURATION = "markspace.agent.round.duration"
NEEDS_PENDING = "markspace.needs.pending"

# The log events the guard emits (P58: one per write_mark and per execute, accepted or not).
EVENT_WRITE_MARK = "markspace.write_mark"
EVENT_EXECUTE = "markspace.execute"
EVENT_PRE_ACTION = "markspace.pre_action"
EVENT_RESOLVE_DEFERRED = "markspace.resolve_deferred"
EVENT_RESTRICTION = "markspace.restriction"
EVENT_SYSTEM_WRITE_FAILED = "markspace.system_write_failed"
EVENT_ROUND = "markspace.round"


class MetricKind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricPoint(BaseModel):
    """One instrument reading: a counter increment, a gauge value or a histogram sample."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: MetricKind
    value: float
    labels: dict[str, str] = Field(default_factory=dict)
    at: float


class LogEvent(BaseModel):
    """One structured log record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    at: float
    attributes: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class TelemetrySink(Protocol):
    def record_metric(self, point: MetricPoint) -> None: ...

    def log_event(self, event: LogEvent) -> None: ...


class NullSink:
    """Discards everything (the default)."""

    def record_metric(self, point: MetricPoint) -> None:
        return None

    def log_event(self, event: LogEvent) -> None:
        return None


class InMemorySink:
    """Keeps everything, for tests and for inspection in a REPL."""

    def __init__(self) -> None:
        self.metrics: list[MetricPoint] = []
        self.events: list[LogEvent] = []

    def record_metric(self, point: MetricPoint) -> None:
        self.metrics.append(point)

    def log_event(self, event: LogEvent) -> None:
        self.events.append(event)

    def events_named(self, name: str) -> list[LogEvent]:
        return [event for event in self.events if event.name == name]

    def points_named(self, name: str, **labels: str) -> list[MetricPoint]:
        return [
            point
            for point in self.metrics
            if point.name == name and _labels_match(point.labels, labels)
        ]

    def counter_total(self, name: str, **labels: str) -> float:
        """The sum of the increments of counter ``name`` whose labels include ``labels``."""
        return sum(point.value for point in self.points_named(name, **labels))

    def gauge_value(self, name: str, **labels: str) -> float | None:
        """The last reading of gauge ``name`` whose labels include ``labels``."""
        points = self.points_named(name, **labels)
        return points[-1].value if points else None

    def clear(self) -> None:
        self.metrics.clear()
        self.events.clear()


class StructuredLogSink:
    """Writes one JSON object per metric point and per event through Python logging."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self.logger = logger or logging.getLogger("agentpost.marks.telemetry")
        self.level = level

    def record_metric(self, point: MetricPoint) -> None:
        self.logger.log(self.level, _to_json({"metric": point.model_dump(mode="json")}))

    def log_event(self, event: LogEvent) -> None:
        self.logger.log(self.level, _to_json({"event": event.model_dump(mode="json")}))


class FailingSink:
    """Raises on every call: the sink of the P57 tests."""

    def __init__(self, error: type[Exception] = RuntimeError) -> None:
        self.error = error
        self.calls = 0

    def record_metric(self, point: MetricPoint) -> None:
        self.calls += 1
        raise self.error(f"telemetry sink failure ({point.name})")

    def log_event(self, event: LogEvent) -> None:
        self.calls += 1
        raise self.error(f"telemetry sink failure ({event.name})")


class Emitter:
    """The guard's side of a sink: builds points and events and never lets a sink error out
    (P57). ``clock`` is the space's clock, so telemetry times agree with mark times."""

    def __init__(self, sink: TelemetrySink, clock: Any) -> None:
        self.sink = sink
        self._clock = clock
        self.failures = 0

    def count(self, name: str, labels: Mapping[str, object], value: float = 1.0) -> None:
        self._metric(name, MetricKind.COUNTER, value, labels)

    def gauge(self, name: str, labels: Mapping[str, object], value: float) -> None:
        self._metric(name, MetricKind.GAUGE, value, labels)

    def observe(self, name: str, labels: Mapping[str, object], value: float) -> None:
        self._metric(name, MetricKind.HISTOGRAM, value, labels)

    def event(self, name: str, **attributes: Any) -> None:
        try:
            record = LogEvent(name=name, at=self._now(), attributes=_plain(attributes))
            self.sink.log_event(record)
        except Exception:
            self.failures += 1

    def _metric(
        self, name: str, kind: MetricKind, value: float, labels: Mapping[str, object]
    ) -> None:
        try:
            point = MetricPoint(
                name=name,
                kind=kind,
                value=float(value),
                labels={key: str(val) for key, val in labels.items()},
                at=self._now(),
            )
            self.sink.record_metric(point)
        except Exception:
            self.failures += 1

    def _now(self) -> float:
        return float(self._clock())


def _labels_match(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(have.get(key) == str(value) for key, value in want.items())


def _plain(value: Any) -> Any:
    """Attributes made JSON-friendly: UUIDs, enums and other objects become strings."""
    if isinstance(value, Mapping):
        return {str(key): _plain(val) for key, val in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    if isinstance(value, StrEnum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _to_json(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, default=str)
