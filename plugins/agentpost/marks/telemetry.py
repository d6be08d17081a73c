"""Telemetry for the guard (Markspace §9.11): metrics and structured log events go to a sink,
never into the mark space. Marks are coordination signals between agents; telemetry is
operational data for people.

The sink interface is the package's `TelemetrySink` ABC, OpenTelemetry-shaped: counters, gauges
and histograms with string labels (`record_counter`, `record_gauge`, `record_histogram`), and
one structured `TelemetryEvent` per guard decision (`emit_event`). A sink written against the
package plugs into our guard unchanged.

P57 (non-interference): the guard emits through `Emitter`, which swallows every sink error, so
a failing sink can never change a verdict, a stored mark or a read.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The metric names of §9.11 (package names: METRIC_*).
MARKS_WRITTEN = METRIC_MARKS_WRITTEN = "markspace.marks.written"
MARKS_READ = METRIC_MARKS_READ = "markspace.marks.read"
TOKENS_INPUT = METRIC_TOKENS_INPUT = "markspace.tokens.input"
TOKENS_OUTPUT = METRIC_TOKENS_OUTPUT = "markspace.tokens.output"
CONFLICTS_RESOLVED = METRIC_CONFLICTS_RESOLVED = "markspace.conflicts.resolved"
ACTIVE_MARKS = METRIC_SPACE_ACTIVE_MARKS = "markspace.space.active_marks"
TOTAL_MARKS = METRIC_SPACE_TOTAL_MARKS = "markspace.space.total_marks"
BUDGET_REMAINING = METRIC_BUDGET_REMAINING = "markspace.agent.budget.remaining"
ROUND_DURATION = METRIC_ROUND_DURATION = "markspace.agent.round.duration"
NEEDS_PENDING = METRIC_NEEDS_PENDING = "markspace.needs.pending"

# The log events the guard emits (P58: one per write_mark and per execute, accepted or not).
EVENT_WRITE_MARK = "markspace.write_mark"
EVENT_EXECUTE = "markspace.execute"
EVENT_PRE_ACTION = "markspace.pre_action"
EVENT_RESOLVE_DEFERRED = "markspace.resolve_deferred"
EVENT_RESTRICTION = "markspace.restriction"
EVENT_SYSTEM_WRITE_FAILED = "markspace.system_write_failed"
EVENT_ROUND = "markspace.round"
_EVENT_PREFIX = "markspace."


class MetricKind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricPoint(BaseModel):
    """One instrument reading, as `InMemorySink.metrics` keeps it (ours, beside the
    package's ``counters``/``gauges``/``histograms`` tuples)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: MetricKind
    value: float
    labels: dict[str, str] = Field(default_factory=dict)


@dataclass
class TelemetryEvent:
    """One structured record per guard decision (P58). The fields up to ``extra`` are the
    package's; ``name`` (the full event name, e.g. ``markspace.write_mark``) and
    ``attributes`` (everything the guard reported, JSON-friendly) are ours."""

    timestamp: float = field(default_factory=time.time)
    agent_id: str = ""
    operation: str = ""
    scope: str = ""
    mark_type: str = ""
    verdict: str = ""
    conflict_check: bool = False
    conflict_found: bool = False
    envelope_status: str = ""
    barrier_restricted: bool = False
    input_tokens_this_round: int = 0
    output_tokens_this_round: int = 0
    budget_remaining_input: int = -1
    budget_remaining_output: int = -1
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def at(self) -> float:
        return self.timestamp

    @classmethod
    def from_attributes(
        cls, name: str, at: float, attributes: Mapping[str, Any]
    ) -> TelemetryEvent:
        """Build the package-shaped event from the guard's named attributes: the ones the
        package has a field for fill it, the rest go to ``extra``."""
        plain = _plain(dict(attributes))
        typed = {f.name: f.type for f in fields(cls)}
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in plain.items():
            target = known if key in _EVENT_FIELDS and value is not None else extra
            target[key] = _as_field(typed[key], value) if target is known else value
        if plain.get("verdict") == "conflict":
            known.setdefault("conflict_found", True)
        return cls(
            timestamp=float(at),
            operation=name.removeprefix(_EVENT_PREFIX),
            extra=extra,
            name=name,
            attributes=plain,
            **known,
        )


_EVENT_FIELDS = frozenset(
    f.name
    for f in fields(TelemetryEvent)
    if f.name not in {"timestamp", "operation", "extra", "name", "attributes"}
)


def _as_field(annotation: Any, value: Any) -> Any:
    kind = {"str": str, "bool": bool, "int": int}.get(str(annotation))
    try:
        return kind(value) if kind is not None else value
    except (TypeError, ValueError):
        return value


class TelemetrySink(ABC):
    """Where telemetry goes (§9.11). Implementations must be thread-safe; the guard never
    lets one of their errors through (P57)."""

    @abstractmethod
    def emit_event(self, event: TelemetryEvent) -> None:
        """One structured event."""

    @abstractmethod
    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Add ``value`` to counter ``name``."""

    @abstractmethod
    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Set gauge ``name`` to ``value``."""

    @abstractmethod
    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        """One sample of histogram ``name``."""

    def flush(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Push out anything buffered (optional)."""

    # ours: one entry point for every kind of reading
    def record_metric(self, point: MetricPoint) -> None:
        record = {
            MetricKind.COUNTER: self.record_counter,
            MetricKind.GAUGE: self.record_gauge,
            MetricKind.HISTOGRAM: self.record_histogram,
        }[point.kind]
        record(point.name, point.value, dict(point.labels))

    def log_event(self, event: TelemetryEvent) -> None:
        """Our earlier name of `emit_event` (deprecated)."""
        self.emit_event(event)


class NullSink(TelemetrySink):
    """Discards everything (the default)."""

    def emit_event(self, event: TelemetryEvent) -> None:
        return None

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        return None

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        return None

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        return None


class InMemorySink(TelemetrySink):
    """Keeps everything, for tests and for inspection in a REPL. ``events``, ``counters``,
    ``gauges`` and ``histograms`` as the package; ``metrics`` and the query helpers are ours."""

    def __init__(self) -> None:
        self.events: list[TelemetryEvent] = []
        self.counters: list[tuple[str, float, dict[str, str]]] = []
        self.gauges: list[tuple[str, float, dict[str, str]]] = []
        self.histograms: list[tuple[str, float, dict[str, str]]] = []
        self.metrics: list[MetricPoint] = []

    def emit_event(self, event: TelemetryEvent) -> None:
        self.events.append(event)

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._keep(self.counters, MetricKind.COUNTER, name, value, labels)

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._keep(self.gauges, MetricKind.GAUGE, name, value, labels)

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._keep(self.histograms, MetricKind.HISTOGRAM, name, value, labels)

    def _keep(
        self,
        into: list[tuple[str, float, dict[str, str]]],
        kind: MetricKind,
        name: str,
        value: float,
        labels: dict[str, str],
    ) -> None:
        into.append((name, value, labels))
        self.metrics.append(MetricPoint(name=name, kind=kind, value=value, labels=dict(labels)))

    def events_named(self, name: str) -> list[TelemetryEvent]:
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
        for kept in (self.events, self.counters, self.gauges, self.histograms, self.metrics):
            kept.clear()


class StructuredLogSink(TelemetrySink):
    """One JSON object per event (at INFO) and per metric reading (at ``metric_level``, DEBUG
    as the package) through Python logging, for log collectors."""

    def __init__(
        self,
        logger_name: str = "markspace.telemetry",
        *,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
        metric_level: int = logging.DEBUG,
    ) -> None:
        self.logger = logger or logging.getLogger(logger_name)
        self.level = level
        self.metric_level = metric_level

    def emit_event(self, event: TelemetryEvent) -> None:
        self.logger.log(self.level, _to_json(asdict(event)))

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._metric(MetricKind.COUNTER, name, value, labels)

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._metric(MetricKind.GAUGE, name, value, labels)

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._metric(MetricKind.HISTOGRAM, name, value, labels)

    def _metric(self, kind: MetricKind, name: str, value: float, labels: dict[str, str]) -> None:
        payload = {"metric": name, "type": kind.value, "value": value, **labels}
        self.logger.log(self.metric_level, _to_json(payload))


class FailingSink(TelemetrySink):
    """Raises on every call: the sink of the P57 tests."""

    def __init__(self, *, error: type[Exception] = RuntimeError) -> None:
        self.error = error
        self.calls = 0

    def emit_event(self, event: TelemetryEvent) -> None:
        self._fail(getattr(event, "name", "event"))

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._fail(name)

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._fail(name)

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        self._fail(name)

    def _fail(self, what: str) -> None:
        self.calls += 1
        raise self.error(f"telemetry sink failure ({what})")


class Emitter:
    """The guard's side of a sink: builds readings and events and never lets a sink error
    out (P57). ``clock`` is the space's clock, so event times agree with mark times."""

    def __init__(self, sink: TelemetrySink, clock: Any) -> None:
        self.sink = sink
        self._clock = clock
        self.failures = 0

    def count(self, name: str, labels: Mapping[str, object], value: float = 1.0) -> None:
        self._metric(self.sink.record_counter, name, value, labels)

    def gauge(self, name: str, labels: Mapping[str, object], value: float) -> None:
        self._metric(self.sink.record_gauge, name, value, labels)

    def observe(self, name: str, labels: Mapping[str, object], value: float) -> None:
        self._metric(self.sink.record_histogram, name, value, labels)

    def event(self, name: str, **attributes: Any) -> None:
        try:
            self.sink.emit_event(TelemetryEvent.from_attributes(name, self._now(), attributes))
        except Exception:
            self.failures += 1

    def _metric(
        self, record: Any, name: str, value: float, labels: Mapping[str, object]
    ) -> None:
        try:
            record(name, float(value), {key: str(val) for key, val in labels.items()})
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
