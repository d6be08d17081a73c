"""Trail analytics: what the Spark jobs over the trail (issue 14) computed, per time window.

The jobs write the tables of sql/0061_trail_analytics.sql and sql/0063_more_analytics.sql
(their contract is in docs/ui.md, "Trail analytics") and the audit's reports
(sql/0064_audit_reports.sql); this page reads the latest window of each table, charts the
delivery latency (p50/p95) of the busiest inboxes over the recent windows, and lists the
latest audit reports. It never computes anything over the trail itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from agentpost.pg.queries import load_queries
from agentpost.store import EnvelopeStore
from agentpost.web.auth import require_viewer
from agentpost.web.context import get_store
from agentpost.web.names import page_names
from agentpost.web.render import page, root

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "analytics.sql")
MARK_QUERIES = load_queries("agentpost.web", "marks.sql")
Store = Annotated[EnvelopeStore, Depends(get_store)]

ROWS = 200
CHART_INBOXES = 5
#: mark spaces whose agents' names the agent table may show
NAMED_SPACES = 20
#: the DAG that fills the tables and the one that writes the audit reports (dags/)
ANALYTICS_DAG = "agentpost_trail_analytics"
AUDIT_DAG = "agentpost_trail_audit"
CHART_WINDOWS = 48
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class ResultTable:
    """One result table as the page shows it: the table (schema agentpost), its columns
    after the window, and the order of its rows (a trusted SQL fragment). The names go into
    SQL text, so they must be plain identifiers."""

    table: str
    columns: tuple[str, ...]
    order: str

    def __post_init__(self) -> None:
        bad = [n for n in (self.table, *self.columns) if not _IDENTIFIER.fullmatch(n)]
        if bad:
            raise ValueError(f"not a plain SQL identifier: {bad}")


#: the page's tables, in the page's order; the only source of the latest-window queries
RESULTS: dict[str, ResultTable] = {
    "latency": ResultTable("analytics_inbox_latency",
                           ("inbox", "delivered", "p50_ms", "p95_ms", "p99_ms"),
                           "p95_ms DESC, inbox"),
    "channels": ResultTable("analytics_channel_latency",
                            ("sender", "inbox", "delivered", "p50_ms", "p95_ms", "p99_ms"),
                            "p95_ms DESC, sender, inbox"),
    "outcomes": ResultTable("analytics_delivery_outcomes",
                            ("inbox", "outcome", "reason", "count", "rate"),
                            "rate DESC, count DESC, inbox, outcome, reason"),
    "conflicts": ResultTable("analytics_conflicts", ("scope", "policy", "outcome", "count"),
                             "scope, policy, count DESC, outcome"),
    "commands": ResultTable("analytics_commands",
                            ("workspace", "action", "commands", "executed", "failed",
                             "rejected", "canceled", "compensated", "compensation_rate"),
                            "compensation_rate DESC, commands DESC, workspace, action"),
    "needs": ResultTable("analytics_needs",
                         ("space", "scope", "cluster_key", "opened", "resolved", "still_open",
                          "ttr_p50_s", "ttr_p95_s"),
                         "still_open DESC, opened DESC, space, scope, cluster_key"),
    "agents": ResultTable("analytics_agent_activity",
                          ("agent", "sent", "received", "acked", "nacked", "marks", "commands",
                           "anomaly", "anomaly_score", "anomaly_reason"),
                          "anomaly DESC, anomaly_score DESC NULLS LAST, sent + received DESC,"
                          " agent"),
}
TABLES: dict[str, tuple[str, ...]] = {name: t.columns for name, t in RESULTS.items()}
LATEST: dict[str, str] = {
    name: Q["latest_window"].format(table=t.table, columns=", ".join(t.columns), order=t.order)
    for name, t in RESULTS.items()
}
AUDITS = 10
AUDIT_COLUMNS = ("id", "started_at", "finished_at", "taken_at", "ok", "entries", "failed")


def latest(store: EnvelopeStore, table: str) -> dict[str, Any]:
    """The latest window of one result table: its bounds and its rows."""
    rows = store.db.fetchall(LATEST[table], {"limit": ROWS})
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


def audits(store: EnvelopeStore) -> list[dict[str, Any]]:
    """The latest audit reports, newest first; each check's counts by check name."""
    out = []
    for row in store.db.fetchall(Q["audits"], {"limit": AUDITS}):
        report = dict(zip(AUDIT_COLUMNS, row[:-1], strict=True))
        report["checks"] = [{"check": name, "checked": c.get("checked"),
                             "failed": c.get("failed")}
                            for name, c in sorted((row[-1] or {}).items())]
        out.append(report)
    return out


def analytics(store: EnvelopeStore) -> dict[str, Any]:
    tables = {name: latest(store, name) for name in TABLES}
    runs = store.db.fetchall(Q["runs"], {"limit": 20})
    reports = audits(store)
    return {"tables": tables, "chart": latency_chart(store, tables["latency"]),
            "runs": [dict(zip(("job", "window_start", "window_end", "computed_at",
                               "source_rows"), r, strict=True)) for r in runs],
            "audits": reports,
            "empty": not runs and not reports and not any(t["rows"] for t in tables.values())}


def chart_view(data: dict[str, Any]) -> dict[str, Any]:
    """What the page says around the latency chart: the window length (its x margin) and how
    many inboxes of the latest window the chart leaves out."""
    latency = data["tables"]["latency"]
    if latency["window_start"] is None:
        return {"window_s": 0, "shown": 0, "inboxes": 0}
    return {"window_s": (latency["window_end"] - latency["window_start"]).total_seconds(),
            "shown": len(data["chart"]["series"]) // 2, "inboxes": len(latency["rows"])}


def _spaces(store: EnvelopeStore) -> list[str]:
    return [r[0] for r in store.db.fetchall(MARK_QUERIES["spaces"],
                                            {"cap": 1, "limit": NAMED_SPACES})]


@router.get("/analytics")
def analytics_page(request: Request, store: Store) -> Response:
    data = analytics(store)
    airflow = root(request).removesuffix("/agentpost")
    return page(request, "analytics.html", nav="analytics", columns=TABLES,
                names=page_names(request, store, _spaces(store), data["tables"]),
                chart_view=chart_view(data),
                analytics_dag=ANALYTICS_DAG, audit_dag=AUDIT_DAG, airflow=airflow, **data)


@router.get("/api/analytics")
def analytics_json(store: Store) -> dict[str, Any]:
    return analytics(store)
