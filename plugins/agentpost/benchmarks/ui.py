"""`agentpost bench ui`: the agentpost pages in Airflow's UI over a large store.

A scratch store is filled inside SQL with 1,000,000 trail entries (about 200,000 envelopes
across some 200 inboxes: consumed, dead-lettered, rejected and waiting ones, each with the
trail entries the store's own steps write; `growth_fill` says how) and 100,000 marks in one
mark space (observations, intents, actions, warnings and needs over a dozen scopes, written
over a week). Then the pages are requested through the real Airflow API app (auth on, the
plugin mounted from its entry point, a signed-in viewer): the inbox overview, inbox pages
and envelope pages of random inboxes and envelopes, and the marks page; `n` requests each
after a warm-up. The goal is a p95 under 200 ms per page.

``--scale`` multiplies the store's size (``--scale 0.01``: 10,000 entries and 1,000 marks, a
quick run). A page the app does not serve yet is reported as "page missing".
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agentpost.benchmarks import growth_fill
from agentpost.benchmarks.common import Report, percentile, scratch_database
from agentpost.store import EnvelopeStore

TRAIL_EVENTS = 1_000_000
MARKS = 100_000
ENTRIES_PER_ENVELOPE = 5  # growth_fill's history averages a little over 5 entries each
SPACE = "bench-ui"
GOAL_MS = 200.0
REQUESTS = 60
WARMUP = 5
SAMPLE_IDS = 500

# Marks over a week, in write order: 40 % observations, 30 % actions, 20 % intents,
# 8 % warnings, 2 % needs (four in five resolved); 12 scopes, 50 agents, 2,000 resources
# and topics. Columns and fades_at as agentpost.mark_write fills them (sql/0007_marks.sql).
MARK_FILL = """
WITH g AS (
    SELECT i, nextval('agentpost.marks_seq') AS seq,
           CASE WHEN i %% 50 < 20 THEN 'observation' WHEN i %% 50 < 35 THEN 'action'
                WHEN i %% 50 < 45 THEN 'intent' WHEN i %% 50 < 49 THEN 'warning'
                ELSE 'need' END AS kind,
           (ARRAY['calendar', 'calendar/rooms', 'billing', 'billing/cards', 'travel',
                  'travel/hotels', 'travel/flights', 'support', 'support/tickets',
                  'research', 'research/sources', 'ops'])[1 + i %% 12] AS scope,
           extract(epoch FROM now()) - 604800.0 * (%(n)s - i) / %(n)s AS t
      FROM generate_series(1, %(n)s) i
)
INSERT INTO agentpost.marks (id, space, seq, mark_type, agent_id, scope, created_at,
                             initial_strength, resource, action, topic, confidence, source,
                             severity, priority, blocking, resolved_by, failed, half_life, ttl,
                             fades_at, body)
SELECT agentpost.mark_id(seq), %(space)s, seq, kind, md5('bench-agent-' || i %% 50)::uuid,
       scope, t, 1.0,
       CASE WHEN kind IN ('intent', 'action') THEN 'resource-' || i %% 2000 END,
       CASE kind WHEN 'intent' THEN 'book' WHEN 'action' THEN 'booked' END,
       CASE WHEN kind IN ('observation', 'warning') THEN 'topic-' || i %% 2000 END,
       CASE WHEN kind = 'observation' THEN 0.5 + (i %% 5) / 10.0 END,
       CASE WHEN kind = 'observation' THEN 'fleet' END,
       CASE WHEN kind = 'warning' THEN 'high' END,
       CASE WHEN kind = 'need' THEN 0.5 END,
       CASE WHEN kind = 'need' THEN i %% 3 = 0 END,
       CASE WHEN kind = 'need' AND i %% 5 <> 0 THEN md5('resolution-' || i)::uuid END,
       CASE WHEN kind = 'action' THEN i %% 40 = 0 END,
       CASE WHEN kind IN ('observation', 'warning') THEN 3600.0 END,
       CASE WHEN kind = 'intent' THEN 600.0 END,
       CASE WHEN kind IN ('observation', 'warning') THEN agentpost._mark_fades_at(t, 3600.0 * 22)
            WHEN kind = 'intent' THEN agentpost._mark_fades_at(t, 600.0)
            WHEN kind = 'need' AND i %% 5 <> 0 THEN agentpost._mark_fades_at(t, 60.0)
            ELSE 'Infinity'::float8 END,
       json_build_object(
           CASE kind WHEN 'observation' THEN 'content' WHEN 'action' THEN 'result'
                     WHEN 'warning' THEN 'reason' WHEN 'need' THEN 'question'
                     ELSE 'context' END,
           'bench mark ' || i)
  FROM g
 ORDER BY seq
"""


@dataclass
class Page:
    """One page to time: its name, and the path of its i-th request."""

    name: str
    path: Callable[[int], str]


@dataclass
class Timed:
    """What requesting a page gave: latencies (ms), or why there are none."""

    latencies: list[float]
    missing: bool = False
    error: str | None = None


def fill(dsn: str, scale: float) -> tuple[int, int, float]:
    """Fill the store; returns (trail entries, marks, seconds)."""
    started = time.perf_counter()
    envelopes = max(1_000, math.ceil(TRAIL_EVENTS * scale / ENTRIES_PER_ENVELOPE))
    marks = max(100, round(MARKS * scale))
    with EnvelopeStore(dsn) as store, store.db.cursor() as cur:
        growth_fill.install_helpers(cur)
        growth_fill.grow(cur, growth_fill.Filled(), envelopes)
        cur.execute(MARK_FILL, {"n": marks, "space": SPACE})
        cur.execute("ANALYZE")
        cur.execute("SELECT count(*) FROM agentpost.trail")
        entries = cur.fetchone()[0]
    return entries, marks, time.perf_counter() - started


def sample_ids(dsn: str) -> tuple[list[str], list[str]]:
    """Random inboxes with history and random envelope ids to request (untimed)."""
    with EnvelopeStore(dsn) as store, store.db.cursor() as cur:
        cur.execute("SELECT id FROM agentpost.workspaces WHERE id LIKE 'hist-r-%%' "
                    "ORDER BY random() LIMIT %s", (SAMPLE_IDS,))
        inboxes = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT id FROM agentpost.envelopes TABLESAMPLE SYSTEM (5) LIMIT %s",
                    (SAMPLE_IDS,))
        envelopes = [r[0] for r in cur.fetchall()]
        if not envelopes:  # a small table's 5% of pages can be none: then sort it whole
            cur.execute("SELECT id FROM agentpost.envelopes ORDER BY random() LIMIT %s",
                        (SAMPLE_IDS,))
            envelopes = [r[0] for r in cur.fetchall()]
    random.shuffle(envelopes)
    return inboxes, envelopes


@contextmanager
def airflow_client(dsn: str) -> Iterator[Any]:
    """A TestClient on the real Airflow API app (simple auth manager, the plugin from its
    entry point), signed in as a viewer, with the plugin's app on `dsn`. Airflow runs in a
    throwaway home with its own SQLite metadata, so no Airflow of the caller's is touched."""
    if "airflow.settings" in sys.modules:
        raise RuntimeError("bench ui must configure Airflow before it is imported")
    home = tempfile.mkdtemp(prefix="agentpost-bench-ui-")
    saved = dict(os.environ)
    os.environ.update({
        "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                       "simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viewer:viewer",
        # no access log line per timed request
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"})
    try:
        yield _signed_in(dsn)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(home, ignore_errors=True)


def _signed_in(dsn: str) -> Any:
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.utils.db import initdb
    from fastapi.testclient import TestClient

    from agentpost.web.context import WebContext
    from agentpost.web.plugin import AgentpostPlugin

    initdb()
    app = create_app("all")
    AgentpostPlugin.fastapi_apps[0]["app"].state.agentpost = WebContext(dsn)
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="viewer",
                                                                  role="VIEWER"))
    client = TestClient(app, base_url="http://bench", follow_redirects=False)
    client.cookies.set("_token", token)
    return client


def time_page(client: Any, page: Page, n: int) -> Timed:
    """`n` timed GETs of `page` after a warm-up; a 404 on the first request is a page the
    app does not have (yet): the ids asked for exist. Any other failure is an error."""
    first = client.get(page.path(0))
    if first.status_code == 404:
        return Timed([], missing=True)
    if first.status_code != 200:
        return Timed([], error=f"HTTP {first.status_code}")
    for i in range(1, WARMUP):
        client.get(page.path(i))
    latencies = []
    for i in range(n):
        started = time.perf_counter()
        response = client.get(page.path(WARMUP + i))
        latencies.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            return Timed(latencies, error=f"HTTP {response.status_code} on {page.path(i)}")
    return Timed(latencies)


def pages(inboxes: list[str], envelopes: list[str]) -> list[Page]:
    return [
        Page("inbox overview  /agentpost/", lambda i: "/agentpost/"),
        Page("inbox page      /agentpost/inboxes/{ws}",
             lambda i: f"/agentpost/inboxes/{inboxes[i % len(inboxes)]}"),
        Page("envelope page   /agentpost/envelopes/{id}",
             lambda i: f"/agentpost/envelopes/{envelopes[i % len(envelopes)]}"),
        Page("marks page      /agentpost/marks?space=S",
             lambda i: f"/agentpost/marks?space={SPACE}"),
    ]


def report(entries: int, marks: int, seconds: float, n: int,
           results: list[tuple[Page, Timed]]) -> Report:
    out = Report(f"agentpost bench ui: pages over {entries:,} trail entries and {marks:,} "
                 f"marks ({n} requests each after {WARMUP} warm-up, signed-in viewer)")
    out.add("store filled", f"{entries:,} trail entries, {marks:,} marks in '{SPACE}' in "
                            f"{seconds:.1f} s")
    for page, timed in results:
        name = page.name.split()[0] + " " + page.name.split()[1]
        if timed.missing:
            out.add(page.name, "page missing (404)")
            out.goal(f"{name}: p95 under {GOAL_MS:.0f} ms (page missing)", False)
            continue
        if timed.error:
            out.add(page.name, f"error: {timed.error}")
            out.goal(f"{name}: p95 under {GOAL_MS:.0f} ms ({timed.error})", False)
            continue
        p50, p95 = percentile(timed.latencies, 0.5), percentile(timed.latencies, 0.95)
        out.add(page.name, f"p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
        out.goal(f"{name}: p95 under {GOAL_MS:.0f} ms (p95 {p95:.1f} ms)", p95 < GOAL_MS)
    return out


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    """Fill, time, print; exit 1 when a page failed (an error, not a missed goal)."""
    n = REQUESTS if scale >= 1 else max(10, round(REQUESTS * scale ** 0.5))
    with scratch_database(dsn, "agentpost_bench_ui") as bench_dsn:
        entries, marks, seconds = fill(bench_dsn, scale)
        inboxes, envelopes = sample_ids(bench_dsn)
        with airflow_client(bench_dsn) as client:
            try:
                results = [(page, time_page(client, page, n))
                           for page in pages(inboxes, envelopes)]
            finally:
                client.close()
    report(entries, marks, seconds, n, results).print()
    return 1 if any(timed.error for _, timed in results) else 0
