"""``/agentpost/metrics``: the store's numbers as Prometheus text, for the tools on-call
people already watch.

Readable with the scrape token (``[agentpost] metrics_token``, or AGENTPOST_METRICS_TOKEN, as
``Authorization: Bearer <token>``) or by any Airflow user who may view the agentpost page;
401 otherwise. Each scrape reads one snapshot of the store (`EnvelopeStore.metrics`: the
deepest ``[agentpost] metrics_inboxes`` inboxes named, default 20, the rest summed under
``inbox="_others"``; ``all`` names every inbox) and this process's counts of the gateway's and
the MCP endpoint's responses by status. The text is made by the `prometheus_client` library
(a custom collector: nothing is kept between scrapes but the request counts).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.registry import Collector

from agentpost.protocol.errors import InvalidInput
from agentpost.store.metrics import DEFAULT_TOP, StoreMetrics
from agentpost.web.auth import can_view, current_user
from agentpost.web.context import get_store

PREFIX = "agentpost"
OTHERS = "_others"
#: the surfaces whose responses are counted, by path prefix under the app
SURFACES = (("/v1", "gateway"), ("/mcp", "mcp"))
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter()


class RequestCounts:
    """This process's responses of the gateway and the MCP endpoint, by status code."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(f"{PREFIX}_http_requests", "Responses of the gateway (/v1) "
                                "and the MCP endpoint (/mcp) of this process, by status",
                                ["surface", "status"], registry=self.registry)



class CountResponses:
    """ASGI middleware: each response of a counted surface, into `counts`."""

    def __init__(self, app: Any, counts: RequestCounts) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        surface = _surface(scope)
        if surface is None:
            await self.app(scope, receive, send)
            return

        async def seen(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                self.counts.requests.labels(surface, str(message.get("status", 0))).inc()
            await send(message)
        await self.app(scope, receive, seen)


def _surface(scope: dict[str, Any]) -> str | None:
    if scope.get("type") != "http":
        return None
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return next((name for prefix, name in SURFACES
                 if path == prefix or path.startswith(prefix + "/")), None)


class StoreCollector(Collector):
    """The snapshot as metric families (made on each collect, i.e. each scrape)."""

    def __init__(self, snapshot: StoreMetrics) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot
        rows = [(m.inbox or OTHERS, m) for m in snap.inboxes]
        for name, doc, value in (
                ("inbox_depth", "Envelopes waiting in the inbox (delivered, not consumed)",
                 lambda m: m.depth),
                ("inbox_in_flight", "Envelopes of the inbox under a live lease",
                 lambda m: m.in_flight),
                ("inbox_oldest_waiting_seconds", "Age of the oldest envelope waiting",
                 lambda m: m.oldest_waiting_s or 0.0)):
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["inbox"])
            for inbox, m in rows:
                family.add_metric([inbox], value(m))
            yield family
        for name, doc, value in (
                ("inbox_redeliveries", "Redeliveries so far (lease expiries, nacks, timeouts)",
                 lambda m: m.redeliveries),
                ("inbox_dead_letters", "Envelopes that became undeliverable so far",
                 lambda m: m.dead_letters)):
            counter = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["inbox"])
            for inbox, m in rows:
                counter.add_metric([inbox], value(m))
            yield counter
        total = snap.total
        yield _gauge("inboxes_unnamed", "Inboxes summed under inbox=\"_others\"",
                     snap.others_count)
        yield _gauge("depth", "Envelopes waiting in every inbox", total.depth)
        yield _gauge("in_flight", "Envelopes under a live lease, every inbox", total.in_flight)
        yield _gauge("oldest_waiting_seconds", "Age of the oldest envelope waiting anywhere",
                     total.oldest_waiting_s or 0.0)
        latency = GaugeHistogramMetricFamily(
            f"{PREFIX}_delivery_latency_seconds", "Enqueue to first lease of the most recent "
            "deliveries of the named inboxes (a window, not a running total)",
            buckets=[(_le(b), float(n)) for b, n in snap.latency_buckets],
            gsum_value=snap.latency_sum)
        yield latency
        yield _labelled(CounterMetricFamily, "rejections", "Envelopes rejected, by reason",
                        "reason", snap.rejections)
        yield _labelled(GaugeMetricFamily, "commands", "Commands by state", "state",
                        snap.commands)
        yield _gauge("event_claim_backlog", "Arrivals claimed by an asset watcher and not yet "
                     "confirmed handled", snap.event_claim_backlog)
        if snap.verified_age_s is not None:
            yield _gauge("trail_verified_age_seconds", "Seconds since the trail last verified "
                         "(the maintenance DAG's verify task)", snap.verified_age_s)
        if snap.last_verification_ok is not None:
            yield _gauge("trail_last_verification_ok", "1 when the newest verification "
                         "passed, 0 when it failed", 1.0 if snap.last_verification_ok else 0.0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _labelled(kind: type, name: str, doc: str, label: str, values: dict[str, int]) -> Any:
    family = kind(f"{PREFIX}_{name}", doc, labels=[label])
    for key, n in sorted(values.items()):
        family.add_metric([key], n)
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def inboxes_setting(text: str | None) -> int | None:
    """``[agentpost] metrics_inboxes``: how many inboxes are named (default 20), or ``all``."""
    if text is None or not text.strip():
        return DEFAULT_TOP
    value = text.strip().lower()
    if value == "all":
        return None
    if not value.isdigit():
        raise InvalidInput(f"[agentpost] metrics_inboxes is a whole number of inboxes or "
                           f"'all', not {text!r}")
    return int(value)


def _setting(key: str) -> str | None:
    env = os.environ.get(f"AGENTPOST_{key.upper()}")
    if env is not None:
        return env
    try:
        from airflow.configuration import conf

        return conf.get("agentpost", key, fallback=None)
    except Exception:  # no Airflow configuration here (a bare app): the default
        return None


async def _allowed(request: Request) -> bool:
    token = _setting("metrics_token")
    auth = request.headers.get("authorization", "")
    if token and auth.lower().startswith("bearer ") and hmac.compare_digest(
            auth[7:].strip().encode(), token.encode()):
        return True
    try:
        user = await current_user(request)
    except HTTPException:
        return False
    return can_view(user)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    if not await _allowed(request):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            "the metrics need the scrape token or an Airflow user",
                            headers={"WWW-Authenticate": "Bearer"})
    top = inboxes_setting(_setting("metrics_inboxes"))
    store = get_store(request)
    from starlette.concurrency import run_in_threadpool

    snapshot = await run_in_threadpool(store.metrics, top=top)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(snapshot))
    counts: RequestCounts | None = getattr(request.app.state, "agentpost_requests", None)
    text = generate_latest(registry)
    if counts is not None:
        text += generate_latest(counts.registry)
    return Response(text, media_type=CONTENT_TYPE)
