"""`agentpost bench ui` at a small scale: it fills the store it is given (trail entries of
envelopes in many inboxes, dead letters among them, marks of every type in one space), times
the pages through the real Airflow app and prints one row and one goal per page, reporting a
page the app does not serve as "page missing" instead of failing.

It runs as the CLI does, in a subprocess: the bench configures a throwaway Airflow before
importing it, which a pytest process that already imported Airflow cannot do.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dbtools import connect, rows

PAGES = ["inbox overview  /agentpost/", "inbox page      /agentpost/inboxes/{ws}",
         "envelope page   /agentpost/envelopes/{id}", "marks page      /agentpost/marks?space=S"]
ROW = re.compile(r"^  (?P<page>.+?)\s{2,}(?P<value>page missing \(404\)|"
                 r"p50 +(?P<p50>[\d.]+) ms +p95 +(?P<p95>[\d.]+) ms)$")
GOAL = re.compile(r"^  \[(met|MISSED)\] (inbox overview|inbox page|envelope page|marks page): "
                  r"p95 under 200 ms \((page missing|p95 [\d.]+ ms)\)$")


@pytest.mark.slow
def test_bench_ui_small_fills_the_store_and_prints_a_row_and_goal_per_page(dsn: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "agentpost.cli", "--dsn", dsn, "bench", "ui",
                           "--scale", "0.01"], capture_output=True, text=True, timeout=600,
                          check=False)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    lines = out[out.index("agentpost bench ui:"):].splitlines()
    assert re.match(r"agentpost bench ui: pages over 1\d,\d{3} trail entries and 1,000 marks "
                    r"\(10 requests each after 5 warm-up, signed-in viewer\)$", lines[0]), lines
    assert re.match(r"  store filled +1\d,\d{3} trail entries, 1,000 marks in 'bench-ui' in "
                    r"[\d.]+ s$", lines[1]), lines
    found = {}
    for line in lines[2:6]:
        match = ROW.match(line)
        assert match, line
        found[match["page"]] = match
    assert list(found) == PAGES
    assert lines[6] == "goals:"
    goals = lines[7:11]
    assert len(goals) == 4 and all(GOAL.match(g) for g in goals), goals
    for (page, match), goal in zip(found.items(), goals, strict=True):
        if match["p95"] is not None:
            assert float(match["p50"]) <= float(match["p95"]), page
            assert goal.startswith("  [met]") == (float(match["p95"]) < 200), goal
        else:
            assert goal.startswith("  [MISSED]") and goal.endswith("(page missing)"), goal

    conn = connect(dsn)
    try:
        (trail,), = rows(conn, "SELECT count(*) FROM agentpost.trail")
        kinds = dict(rows(conn, "SELECT mark_type, count(*) FROM agentpost.marks "
                                "WHERE space = 'bench-ui' GROUP BY 1"))
        dead, = rows(conn, "SELECT count(*) FROM agentpost.envelopes "
                           "WHERE status = 'undeliverable'")
        inboxes, = rows(conn, "SELECT count(DISTINCT recipient) FROM agentpost.envelopes")
    finally:
        conn.close()
    assert f"{trail:,} trail entries" in lines[0]
    assert kinds == {"observation": 400, "action": 300, "intent": 200, "warning": 80,
                     "need": 20}
    assert dead[0] > 0 and inboxes[0] >= 2
