"""The trail analytics page (issue 13) on a real Airflow API app: the result tables of
sql/0061 filled directly, as the Spark jobs (issue 14) will, window by window."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import psycopg2.errors
import pytest

from agentpost.web.pages.analytics import ResultTable
from web_support import Web

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


class Db:
    """Statements as a job would send them; `transaction()` commits a block at once."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(sql, args)


@pytest.fixture(scope="module")
def db(module_dsn: str) -> Iterator[Db]:
    d = Db(module_dsn)
    yield d
    d.conn.close()


def _replace_window(db: Db, start: datetime,
                    latency: list[tuple[str, int, float, float, float]]) -> None:
    """What a job does for one window: delete its rows, insert the new ones, record the run,
    in one transaction."""
    end = start + HOUR
    with db.conn, db.conn.cursor() as cur:
        cur.execute("DELETE FROM agentpost.analytics_inbox_latency"
                    " WHERE window_start = %s AND window_end = %s", (start, end))
        for inbox, delivered, p50, p95, p99 in latency:
            cur.execute("INSERT INTO agentpost.analytics_inbox_latency VALUES"
                        " (%s, %s, %s, %s, %s, %s, %s)",
                        (start, end, inbox, delivered, p50, p95, p99))
        cur.execute("INSERT INTO agentpost.analytics_runs (job, window_start, window_end,"
                    " source_rows) VALUES ('inbox_latency', %s, %s, %s)"
                    " ON CONFLICT (job, window_start, window_end) DO UPDATE"
                    " SET computed_at = clock_timestamp(), source_rows = excluded.source_rows",
                    (start, end, sum(r[1] for r in latency)))


def test_empty_tables_say_how_to_fill_them(web: Web) -> None:
    page = web.client("viewer").get("/agentpost/analytics")
    assert page.status_code == 200
    assert 'id="analytics-empty"' in page.text and "analytics DAG" in page.text
    # the empty state names the DAG to trigger (and links to it in Airflow's UI)
    assert 'href="/dags/agentpost_trail_analytics" target="_top"' in page.text
    body = web.client("viewer").get("/agentpost/api/analytics").json()
    assert body["empty"] is True and body["chart"] == {"series": [], "data": [[]]}


def test_latest_window_rows_and_latency_chart(web: Web, db: Db) -> None:
    """Three windows; the page shows the latest one's rows, the chart p50/p95 of its busiest
    inboxes across the windows (null where an inbox had no row)."""
    _replace_window(db, T0, [("desk", 10, 5.0, 20.0, 40.0)])
    _replace_window(db, T0 + HOUR, [("desk", 30, 6.0, 25.0, 50.0),
                                    ("till", 5, 1.0, 2.0, 3.0)])
    _replace_window(db, T0 + 2 * HOUR, [("desk", 40, 7.0, 30.0, 60.0),
                                        ("till", 50, 2.0, 4.0, 8.0)])
    db.execute("INSERT INTO agentpost.analytics_delivery_outcomes VALUES"
               " (%s, %s, 'desk', 'dead_lettered', 'max_redeliveries', 2, 0.05)",
               (T0 + 2 * HOUR, T0 + 3 * HOUR))
    db.execute("INSERT INTO agentpost.analytics_agent_activity (window_start, window_end,"
               " agent, sent, received, anomaly, anomaly_score, anomaly_reason) VALUES"
               " (%s, %s, 'quiet', 1, 1, false, 0.1, NULL),"
               " (%s, %s, 'loud', 900, 2, true, 4.2, 'sent 40x its median')",
               (T0 + 2 * HOUR, T0 + 3 * HOUR) * 2)
    body = web.client("viewer").get("/agentpost/api/analytics").json()
    assert body["empty"] is False
    latency = body["tables"]["latency"]
    assert latency["window_start"].startswith("2026-11-24T12:00:00")
    assert [(r["inbox"], r["p95_ms"]) for r in latency["rows"]] == [("desk", 30.0),
                                                                    ("till", 4.0)]
    chart = body["chart"]
    assert chart["series"] == ["till p50", "till p95", "desk p50", "desk p95"]
    hours = [(T0 + i * HOUR).timestamp() for i in range(3)]
    assert chart["data"] == [hours, [None, 1.0, 2.0], [None, 2.0, 4.0], [5.0, 6.0, 7.0],
                             [20.0, 25.0, 30.0]]
    assert [r["agent"] for r in body["tables"]["agents"]["rows"]] == ["loud", "quiet"]
    assert body["tables"]["outcomes"]["rows"] == [{
        "inbox": "desk", "outcome": "dead_lettered", "reason": "max_redeliveries",
        "count": 2, "rate": 0.05}]
    assert body["tables"]["conflicts"]["rows"] == []
    assert [r["job"] for r in body["runs"]] == ["inbox_latency"] * 3

    page = web.client("viewer").get("/agentpost/analytics").text
    data = re.search(r'<script type="application/json" id="latency-data">(.*?)</script>',
                     page, re.S)
    assert data and json.loads(data.group(1)) == chart
    assert "uPlot.iife.min.js" in page
    assert 'data-anomaly="true"' in page and "sent 40x its median" in page
    rows = page.split('id="analytics-latency"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td>(\w+)</td>", rows) == ["desk", "till"]


def test_a_rerun_replaces_its_window(web: Web, db: Db) -> None:
    """Re-running the latest window replaces its rows: one row per inbox, new values."""
    _replace_window(db, T0 + 2 * HOUR, [("desk", 41, 8.0, 31.0, 61.0)])
    body = web.client("viewer").get("/agentpost/api/analytics").json()
    assert [(r["inbox"], r["delivered"], r["p50_ms"]) for r in
            body["tables"]["latency"]["rows"]] == [("desk", 41, 8.0)]
    assert body["chart"]["data"][1] == [5.0, 6.0, 8.0]


@pytest.mark.parametrize(("sql", "args"), [
    ("INSERT INTO agentpost.analytics_inbox_latency VALUES (%s, %s, 'x', 1, 5, 4, 6)",
     (T0, T0 + HOUR)),  # p95 below p50
    ("INSERT INTO agentpost.analytics_delivery_outcomes VALUES"
     " (%s, %s, 'x', 'lost', '', 1, 0.1)", (T0, T0 + HOUR)),  # unknown outcome
    ("INSERT INTO agentpost.analytics_commands (window_start, window_end, workspace, action,"
     " commands, compensation_rate) VALUES (%s, %s, 'w', 'a', 1, 1.5)", (T0, T0 + HOUR)),
    ("INSERT INTO agentpost.analytics_conflicts VALUES (%s, %s, 's', 'p', 'won', 1)",
     (T0, T0)),  # empty window
])
def test_the_tables_refuse_rows_outside_the_contract(db: Db, sql: str,
                                                     args: tuple[Any, ...]) -> None:
    with pytest.raises(psycopg2.errors.CheckViolation):
        db.execute(sql, args)


def test_anonymous_is_401(web: Web) -> None:
    assert web.client(None).get("/agentpost/api/analytics").status_code == 401


@pytest.mark.parametrize(("table", "columns"), [
    ("analytics_x; DROP TABLE agentpost.trail", ("inbox",)),
    ("analytics_inbox_latency", ("inbox", "p50_ms) FROM pg_shadow --")),
    ("Analytics", ("inbox",)),
])
def test_a_result_table_takes_plain_identifiers_only(table: str,
                                                     columns: tuple[str, ...]) -> None:
    """The latest-window queries are SQL text made from RESULTS: a name that is not a plain
    lowercase identifier is refused where it is declared."""
    with pytest.raises(ValueError, match="not a plain SQL identifier"):
        ResultTable(table, columns, "inbox")


def test_channel_latency_needs_and_audit_reports(web: Web, db: Db) -> None:
    """The tables of sql/0063 (latest window) and the latest audit reports of sql/0064,
    newest first, each check's failed / checked counts out of its report."""
    w = (T0 + 5 * HOUR, T0 + 6 * HOUR)
    db.execute("INSERT INTO agentpost.analytics_channel_latency VALUES"
               " (%s, %s, 'boss', 'desk', 3, 1.0, 2.0, 3.0),"
               " (%s, %s, 'boss', 'till', 1, 7.0, 9.0, 9.5)", w * 2)
    db.execute("INSERT INTO agentpost.analytics_channel_latency VALUES"
               " (%s, %s, 'old', 'desk', 1, 1.0, 1.0, 1.0)", (T0, T0 + HOUR))
    db.execute("INSERT INTO agentpost.analytics_needs VALUES"
               " (%s, %s, 'main', 'ops', 'rotate the keys', 2, 1, 1, 30.0, 30.0),"
               " (%s, %s, 'main', 'lot', 'open the gate', 1, 0, 1, NULL, NULL)", w * 2)
    for n, (ok, failed) in enumerate([(True, 0), (False, 2)]):
        report = {"ok": ok, "checks": {"chain_links": {"checked": 10, "failed": failed,
                                                       "first": ["7"] if failed else []},
                                       "macs": {"checked": 10, "failed": 0, "first": []}}}
        db.execute("INSERT INTO agentpost.audit_reports (started_at, finished_at, taken_at, ok,"
                   " entries, failed, report) VALUES (%s, %s, %s, %s, 10, %s, %s)",
                   (T0 + n * HOUR, T0 + n * HOUR + timedelta(minutes=1), T0 + n * HOUR, ok,
                    failed, json.dumps(report)))
    body = web.client("viewer").get("/agentpost/api/analytics").json()
    channels = body["tables"]["channels"]
    assert channels["window_start"].startswith("2026-11-24T15:00:00")
    assert [(r["sender"], r["inbox"], r["p95_ms"]) for r in channels["rows"]] == [
        ("boss", "till", 9.0), ("boss", "desk", 2.0)]
    assert [(r["cluster_key"], r["still_open"], r["ttr_p50_s"])
            for r in body["tables"]["needs"]["rows"]] == [("rotate the keys", 1, 30.0),
                                                          ("open the gate", 1, None)]
    audits = body["audits"]
    assert [(a["ok"], a["failed"]) for a in audits] == [(False, 2), (True, 0)]
    assert audits[0]["checks"] == [{"check": "chain_links", "checked": 10, "failed": 2},
                                   {"check": "macs", "checked": 10, "failed": 0}]
    page = web.client("viewer").get("/agentpost/analytics").text
    table = page.split('id="analytics-audits"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr data-audit=") == 2 and "FAILED" in table
    assert 'data-check="chain_links">chain_links 2 / 10' in table
    assert 'id="analytics-channels"' in page and 'id="analytics-needs"' in page


#: per page table: its result table, the columns the rows below give, rows in an order the
#: page must change, and the page's order of them (by the leading columns of the rows);
#: every key of the table's order decides somewhere where the later keys would not
ORDERED: dict[str, tuple[str, str, list[tuple[Any, ...]], list[tuple[Any, ...]]]] = {
    "latency": ("analytics_inbox_latency", "inbox, delivered, p50_ms, p95_ms, p99_ms",
                [("a", 1, 1.0, 5.0, 6.0), ("c", 1, 1.0, 9.0, 9.0), ("b", 1, 1.0, 9.0, 9.0)],
                [("b",), ("c",), ("a",)]),
    "outcomes": ("analytics_delivery_outcomes", "inbox, outcome, reason, count, rate",
                 [("desk", "rejected", "", 1, 0.5), ("desk", "dead_lettered", "x", 3, 0.5),
                  ("box", "redelivered", "y", 3, 0.5), ("box", "redelivered", "a", 3, 0.5),
                  ("box", "dead_lettered", "y", 3, 0.5), ("zed", "rejected", "", 1, 0.9),
                  ("abc", "rejected", "", 1, 0.5)],
                 [("zed", "rejected", ""), ("box", "dead_lettered", "y"),
                  ("box", "redelivered", "a"), ("box", "redelivered", "y"),
                  ("desk", "dead_lettered", "x"), ("abc", "rejected", ""),
                  ("desk", "rejected", "")]),
    "conflicts": ("analytics_conflicts", "scope, policy, outcome, count",
                  [("s2", "p1", "won", 1), ("s1", "p2", "won", 5), ("s1", "p1", "lost", 2),
                   ("s1", "p1", "won", 9), ("s1", "p1", "deferred", 2)],
                  [("s1", "p1", "won"), ("s1", "p1", "deferred"), ("s1", "p1", "lost"),
                   ("s1", "p2", "won"), ("s2", "p1", "won")]),
    "commands": ("analytics_commands", "workspace, action, commands, compensation_rate",
                 [("w", "a", 1, 0.5), ("w", "b", 4, 0.1), ("v", "c", 4, 0.1),
                  ("v", "a", 4, 0.1), ("x", "z", 9, 0.0), ("a", "a", 2, 0.1)],
                 [("w", "a"), ("v", "a"), ("v", "c"), ("w", "b"), ("a", "a"), ("x", "z")]),
    "agents": ("analytics_agent_activity",
               "agent, sent, received, anomaly, anomaly_score, anomaly_reason",
               [("ant", 1, 1, False, None, None), ("busy", 10, 0, False, None, None),
                ("also", 5, 5, False, None, None), ("mild", 0, 0, False, 5.0, None),
                ("odd", 1, 1, True, 2.0, "odd"), ("odder", 1, 1, True, 3.0, "odder")],
               [("odder",), ("odd",), ("mild",), ("also",), ("busy",), ("ant",)]),
    "channels": ("analytics_channel_latency",
                 "sender, inbox, delivered, p50_ms, p95_ms, p99_ms",
                 [("b", "x", 1, 1.0, 9.0, 9.0), ("a", "y", 1, 1.0, 9.0, 9.0),
                  ("a", "x", 1, 1.0, 9.0, 9.0), ("0", "x", 1, 1.0, 1.0, 1.0)],
                 [("a", "x"), ("a", "y"), ("b", "x"), ("0", "x")]),
    "needs": ("analytics_needs",
              "space, scope, cluster_key, opened, resolved, still_open, ttr_p50_s, ttr_p95_s",
              [("a", "ops", "k1", 9, 9, 0, 1.0, 1.0), ("a", "ops", "k2", 3, 0, 3, None, None),
               ("m", "lot", "k3", 4, 1, 3, 1.0, 1.0), ("a", "ops", "k4", 4, 0, 3, None, None),
               ("a", "ops", "k0", 4, 0, 3, None, None), ("a", "lot", "k5", 4, 0, 3, None, None)],
              [("a", "lot", "k5"), ("a", "ops", "k0"), ("a", "ops", "k4"), ("m", "lot", "k3"),
               ("a", "ops", "k2"), ("a", "ops", "k1")]),
}


def test_each_table_shows_its_latest_window_in_its_order(web: Web, db: Db) -> None:
    """Every result table, with older windows around (an earlier start; the same start but
    an earlier end): the page shows only the latest window (latest start, then latest end),
    its rows in the table's order. Its windows are later than every other test's, so they
    are deleted at the end: the tests of this module may run in any order."""
    start = T0 + 20 * HOUR
    try:
        _latest_window_shown_in_order(web, db, start)
    finally:
        for table, *_ in ORDERED.values():
            db.execute(f"DELETE FROM agentpost.{table} WHERE window_start >= %s",
                       (start - HOUR,))


def _latest_window_shown_in_order(web: Web, db: Db, start: datetime) -> None:
    latest = (start, start + 2 * HOUR)
    for table, columns, rows, _ in ORDERED.values():
        marks = ", ".join(["%s"] * (len(rows[0]) + 2))
        insert = (f"INSERT INTO agentpost.{table} (window_start, window_end, {columns})"
                  f" VALUES ({marks})")
        for row in rows:
            db.execute(insert, (*latest, *row))
        for older in [(start - HOUR, start), (start, start + HOUR)]:
            db.execute(insert, (*older, *rows[0]))
    tables = web.client("viewer").get("/agentpost/api/analytics").json()["tables"]
    for name, (_, columns, _, expected) in ORDERED.items():
        shown = tables[name]
        bounds = (shown["window_start"], shown["window_end"])
        assert tuple(map(datetime.fromisoformat, bounds)) == latest, name
        keys = columns.split(", ")[:len(expected[0])]
        assert [tuple(r[k] for k in keys) for r in shown["rows"]] == expected, name


def test_chart_says_what_it_leaves_out_and_agents_are_named(web: Web, db: Db,
                                                            module_dsn: str) -> None:
    """Seven inboxes in the latest window, five charted: the page says two are not (the
    legend has every charted series). An agent's row names it when the store knows the
    name (an operator's agent named after a workspace), and keeps an unknown id."""
    from agentpost.operators.marks import stable_agent
    from agentpost.store import EnvelopeStore

    start = T0 + 30 * HOUR
    with EnvelopeStore(module_dsn) as st:
        st.create_workspace("coordinator", workspace_id="an-dispatch")
    known = str(stable_agent("an-dispatch", {}).id)
    unknown = "5f0c2a6e-4b1d-4c8e-9a3f-2d7e8b1c0a94"
    try:
        _replace_window(db, start, [(f"in-{k}", 10 + k, 1.0, 2.0, 3.0) for k in range(7)])
        db.execute("INSERT INTO agentpost.analytics_agent_activity (window_start, window_end,"
                   " agent, sent) VALUES (%s, %s, %s, 3), (%s, %s, %s, 2)",
                   (start, start + HOUR, known, start, start + HOUR, unknown))
        page = web.client("viewer").get("/agentpost/analytics").text
        note = re.search(r'<p class="muted" id="latency-chart-note">(.*?)</p>', page, re.S)
        assert note and "2 of its 7 inboxes are not charted" in " ".join(note[1].split())
        assert 'data-window-s="3600.0"' in page
        agents = page.split('id="analytics-agents"', 1)[1].split("</table>", 1)[0]
        assert f'<span class="agent" data-agent-id="{known}"' in agents
        assert ">an-dispatch</span>" in agents and f"<td>{unknown}</td>" in agents
    finally:
        for table in ("analytics_inbox_latency", "analytics_agent_activity",
                      "analytics_runs"):
            db.execute(f"DELETE FROM agentpost.{table} WHERE window_start >= %s", (start,))
