"""Trail analytics: what the Spark jobs over the trail (issue 14) computed, per time window.

The jobs write the tables of sql/0061_trail_analytics.sql (their contract is in docs/ui.md,
"Trail analytics"); this page reads the latest window of each and charts the delivery latency
(p50/p95) of the busiest inboxes over the recent windows. It never computes anything over the
trail itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from agentpost.store import EnvelopeStore
from agentpost.store.queries import load_queries
from agentpost.web.auth import require_viewer
from agentpost.web.context import get_store
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "analytics.sql")
Store = Annotated[EnvelopeStore, Depends(get_store)]

ROWS = 200
CHART_INBOXES = 5
CHART_WINDOWS = 48
TABLES: dict[str, tuple[str, ...]] = {
    "latency": ("inbox", "delivered", "p50_ms", "p95_ms", "p99_ms"),
    "outcomes": ("inbox", "outcome", "reason", "count", "rate"),
    "conflicts": ("scope", "policy", "outcome", "count"),
    "commands": ("workspace", "action", "commands", "executed", "failed", "rejected",
                 "canceled", "compensated", "compensation_rate"),
    "agents": ("agent", "sent", "received", "acked", "nacked", "marks", "commands",
               "anomaly", "anomaly_score", "anomaly_reason"),
}


def latest(store: EnvelopeStore, table: str) -> dict[str, Any]:
    """The latest window of one result table: its bounds and its rows."""
    rows = store.db.fetchall(Q[table], {"limit": ROWS})
    if not rows:
        return {"window_start": None, "window_end": None, "rows": []}
    return {"window_start": rows[0][0], "window_end": rows[0][1],
            "rows": [dict(zip(TABLES[table], r[2:], strict=True)) for r in rows]}


def latency_chart(store: EnvelopeStore, current: dict[str, Any]) -> dict[str, Any]:
    """uPlot columns: window starts (unix s), then p50 and p95 of the busiest inboxes of the
    latest window, over up to CHART_WINDOWS windows of the latest window's length."""
    if not current["rows"]:
        return {"series": [], "data": [[]]}
    busiest = sorted(current["rows"], key=lambda r: (-r["delivered"], r["inbox"]))
    inboxes = [r["inbox"] for r in busiest[:CHART_INBOXES]]
    start: datetime = current["window_start"]
    since = start - (current["window_end"] - start) * (CHART_WINDOWS - 1)
    rows = store.db.fetchall(Q["latency_history"], {
        "since": since, "inboxes": inboxes, "limit": CHART_WINDOWS * CHART_INBOXES * 4})
    xs = sorted({r[0] for r in rows})
    at = {x: i for i, x in enumerate(xs)}
    columns: list[list[float | None]] = [[None] * len(xs) for _ in range(2 * len(inboxes))]
    for when, inbox, p50, p95 in rows:
        k = inboxes.index(inbox)
        columns[2 * k][at[when]], columns[2 * k + 1][at[when]] = p50, p95
    names = [f"{inbox} {p}" for inbox in inboxes for p in ("p50", "p95")]
    return {"series": names, "data": [[x.timestamp() for x in xs], *columns]}


def analytics(store: EnvelopeStore) -> dict[str, Any]:
    tables = {name: latest(store, name) for name in TABLES}
    runs = store.db.fetchall(Q["runs"], {"limit": 20})
    return {"tables": tables, "chart": latency_chart(store, tables["latency"]),
            "runs": [dict(zip(("job", "window_start", "window_end", "computed_at",
                               "source_rows"), r, strict=True)) for r in runs],
            "empty": not runs and not any(t["rows"] for t in tables.values())}


@router.get("/analytics")
def analytics_page(request: Request, store: Store) -> Response:
    return page(request, "analytics.html", nav="analytics", columns=TABLES,
                **analytics(store))


@router.get("/api/analytics")
def analytics_json(store: Store) -> dict[str, Any]:
    return analytics(store)
