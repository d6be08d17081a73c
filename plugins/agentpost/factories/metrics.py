"""agentpost's numbers through Airflow's own metrics (`Stats`: StatsD or OpenTelemetry, as
Airflow's ``[metrics]`` section configures them), so a deployment that ships Airflow's
metrics gets ours with no set-up of its own.

- `emit_store_metrics`: the store's snapshot (`EnvelopeStore.metrics`) as gauges, sent by the
  maintenance DAG's ``maintain`` task on every run;
- `AirflowStatsSink`: the guard's telemetry (Markspace §9.11) as counters and timers, with
  ``agentpost.guard.verdict.<verdict>`` per decision; the guards the factories build use it;
- `boundary_timer`: a resolution boundary's duration, ``agentpost.guard.boundary``.

Names: ``agentpost.<what>`` for totals, ``agentpost.inbox.<inbox>.<what>`` for each inbox the
snapshot names (the `top` deepest: a bounded set; plain StatsD has no tags, so the inbox is
in the name, and in the ``inbox`` tag for backends that keep tags).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentpost.marks.telemetry import EVENT_PRE_ACTION, TelemetryEvent, TelemetrySink
from agentpost.store.metrics import InboxMetrics, StoreMetrics

PREFIX = "agentpost"


def _stats() -> Any:
    from airflow.sdk.observability.stats import Stats

    return Stats


def _name(*parts: str) -> str:
    from airflow.sdk.observability.stats import normalize_name_for_stats

    return normalize_name_for_stats(".".join((PREFIX, *parts)), log_warning=False)


def emit_store_metrics(snapshot: StoreMetrics) -> int:
    """Send `snapshot` as gauges; returns how many were sent."""
    stats = _stats()
    sent = 0

    def gauge(name: str, value: float, tags: dict[str, str] | None = None) -> None:
        nonlocal sent
        stats.gauge(name, float(value), tags=tags)
        sent += 1

    _inbox_gauges(gauge, _name, None, snapshot.total)
    for inbox in snapshot.inboxes:
        key = inbox.inbox or "_others"
        _inbox_gauges(gauge, lambda *p, k=key: _name("inbox", k, *p), key, inbox)
    for reason, n in snapshot.rejections.items():
        gauge(_name("rejections", reason), n, {"reason": reason})
    for state, n in snapshot.commands.items():
        gauge(_name("commands", state), n, {"state": state})
    gauge(_name("event_claim_backlog"), snapshot.event_claim_backlog)
    if snapshot.verified_age_s is not None:
        gauge(_name("trail", "verified_age_seconds"), snapshot.verified_age_s)
    return sent


def _inbox_gauges(gauge: Any, name: Any, key: str | None, m: InboxMetrics) -> None:
    tags = None if key is None else {"inbox": key}
    gauge(name("depth"), m.depth, tags)
    gauge(name("in_flight"), m.in_flight, tags)
    gauge(name("oldest_waiting_seconds"), m.oldest_waiting_s or 0.0, tags)
    gauge(name("redeliveries"), m.redeliveries, tags)
    gauge(name("dead_letters"), m.dead_letters, tags)


class AirflowStatsSink(TelemetrySink):
    """The guard's telemetry through Airflow's `Stats`. Metric names keep the guard's
    (``markspace.*``) under ``agentpost.``; each pre_action decision also counts as
    ``agentpost.guard.verdict.<verdict>``. The guard swallows a sink's errors (P57)."""

    def emit_event(self, event: TelemetryEvent) -> None:
        if event.name == EVENT_PRE_ACTION and event.verdict:
            _stats().incr(_name("guard", "verdict", event.verdict.lower()),
                          tags={"verdict": event.verdict.lower(), "scope": event.scope})

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        _stats().incr(_name(name), int(value), tags=dict(labels))

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        _stats().gauge(_name(name), float(value), tags=dict(labels))

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        _stats().timing(_name(name), float(value), tags=dict(labels))


@contextmanager
def boundary_timer(scope_count: int) -> Iterator[None]:
    """Time a resolution boundary (ms) as ``agentpost.guard.boundary``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _stats().timing(_name("guard", "boundary"), (time.perf_counter() - start) * 1000,
                        tags={"scopes": str(scope_count)})
