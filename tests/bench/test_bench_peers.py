"""Smoke test of `agentpost bench peers` at a tiny scale: it runs end to end through the CLI
against the real Postgres and prints, for agentpost and every installed peer (pgmq,
pgqueuer, Procrastinate), every workload row, every ratio agentpost ÷ peer and the goals;
afterwards nothing it started is left (no process, socket, thread or scratch database). No
timing is asserted (shared machines): the goals are the benchmark's business, printed met or
MISSED.

CI installs only the dev extra, so the peers are usually absent there: the end-to-end test
then checks that each is said not measured with the install hint; the report's own test
covers both forms on made-up numbers wherever the tests run.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import psycopg2
import pytest

from agentpost.benchmarks import peers
from agentpost.benchmarks.peers_systems import PEERS, RawTable
from agentpost.cli import main
from mcp_support import children
from test_bench_agents import sockets

NUMBER = r"-?[\d,.]+"
SPAN = rf"{NUMBER}  \(range {NUMBER} – {NUMBER}"
WORKLOADS = ("1. single send, one commit each", "2. batch of 500 in one call",
             "3. consume, batch 100, 1 consumer", "4. consume, batch 100, 4 consumers, one queue")


def bench_children() -> set[int]:
    """This process's children, but multiprocessing's resource tracker: Python starts it
    with the first spawned process and keeps it, shared, until the interpreter exits."""
    out = set()
    for pid in children():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline:
            out.add(pid)
    return out


def scratch_databases(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE "
                        "'agentpost\\_bench\\_peers\\_%%'")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def assert_rows(out: str, measured: list[str], peer_names: list[str], own_wal: bool) -> None:
    for workload in WORKLOADS:
        for name in measured:
            assert re.search(rf"{re.escape(workload)}: {re.escape(name)}\s+{SPAN}\) msgs/s",
                             out), (workload, name)
        for name in peer_names:
            assert re.search(rf"{re.escape(workload)}: agentpost ÷ {name}\s+{SPAN}\)", out), \
                (workload, name)
    for name in measured:
        assert re.search(rf"4 ÷ 1 consumers: {re.escape(name)}\s+{SPAN}\)", out), name
    for name in ["agentpost", *peer_names]:
        assert re.search(rf"5\. send → consumer at 50/s: {name}\s+p50 {NUMBER} ms, "
                         rf"p95 {NUMBER} ms; p95 by round {SPAN}\) ms", out), name
    for name in peer_names:
        assert re.search(rf"5\. send → consumer at 50/s: agentpost ÷ {name}, p95\s+{SPAN}\)",
                         out), name
    sources = ("own records", "server LSN diff") if own_wal else ("server LSN diff",)
    for what in ("per send", "per consumed message"):
        for source in sources:
            for name in measured:
                assert re.search(rf"6\. WAL {what}, {source}: {re.escape(name)}\s+{SPAN}"
                                 r"(, \d of 3 rounds)?\) bytes", out), (what, source, name)
            for name in [*peer_names, RawTable.name]:
                assert re.search(rf"6\. WAL {what}, {source}: agentpost ÷ {re.escape(name)}"
                                 rf"\s+{SPAN}", out), (what, source, name)
    assert re.search(r"pg-boss, graphile-worker\s+skipped: ", out)
    assert re.search(r"versions\s+PostgreSQL \d+", out)
    for workload in WORKLOADS:
        assert re.search(rf"\[(met|MISSED)\] {re.escape(workload)}: agentpost >= 1\.0x the "
                         r"fastest of pgmq, pgqueuer and Procrastinate \(", out), workload
    assert re.search(r"\[(met|MISSED)\] agentpost: 4 consumers >= 1\.5x one consumer", out)
    assert re.search(r"\[(met|MISSED)\] send → consumer p95 no worse than the best "
                     r"LISTEN/NOTIFY peer's", out)
    assert re.search(r"\[(met|MISSED)\] WAL per send <= 2x a raw INSERT", out)


@pytest.mark.slow
def test_bench_peers_prints_every_workload_and_leaves_nothing(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: one run prints each workload for agentpost and each installed peer, with
    median and range, the ratios and the goals; every process, connection and scratch
    database it made is gone afterwards."""
    before_children, before_sockets = bench_children(), sockets()
    code = main(["--dsn", dsn, "bench", "peers", "--scale", "0.01"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert bench_children() <= before_children, "a bench process outlived the bench"
    assert sockets() <= before_sockets, "a connection outlived the bench"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("agentpost-bench")]
    assert scratch_databases(dsn) == []
    installed = [cls.name for cls in PEERS if cls.installed()]
    assert_rows(out, ["agentpost", *installed, RawTable.name], installed,
                own_wal="6. WAL per send, own records" in out)
    for cls in PEERS:
        if not cls.installed():
            assert f"{cls.name}  " in out and f"not measured ({peers.INSTALL_HINT}" in out


def test_bench_peers_report_with_and_without_peers(capsys: pytest.CaptureFixture[str]):
    """The report on made-up numbers: with every peer, each ratio is computed round by round
    and each goal judged (some met, some missed); without a peer, it is said not measured
    and no ratio against it is printed."""
    res = peers.Results()
    rates = {"agentpost": 1_000.0, "pgmq": 2_000.0, "pgqueuer": 500.0, "procrastinate": 100.0,
             "raw INSERT": 4_000.0}
    for round_ in (1, 2, 3):
        res.round = round_
        for name, rate in rates.items():
            for cell in peers.TITLES:
                res.add(name, cell, rate * (2 if cell == "consume 4" and name == "agentpost"
                                            else 1))
            res.add(name, "wal send", 3_000.0 if name == "agentpost" else 1_000.0)
            res.add(name, "wal consume", 500.0)
            if name != "raw INSERT":
                res.add(name, "p95 round", 5.0)
                res.latency.setdefault(name, []).extend([1.0, 5.0])
    measured = [cls for cls in peers.SYSTEMS]
    peers._report(peers.Counts.at(0.01), res, measured, [], "15.0", "off", inspect=False)
    out = capsys.readouterr().out
    assert re.search(r"1\. single send, one commit each: agentpost ÷ pgmq\s+0\.50  "
                     r"\(range 0\.50 – 0\.50\)", out)
    assert re.search(r"4 ÷ 1 consumers: agentpost\s+2\.00", out)
    assert "[MISSED] 1. single send, one commit each: agentpost >= 1.0x the fastest of pgmq, " \
           "pgqueuer and Procrastinate (0.50x pgmq)" in out
    assert "[met] agentpost: 4 consumers >= 1.5x one consumer (2.00x)" in out
    assert "[met] send → consumer p95 no worse than the best LISTEN/NOTIFY peer's" in out
    assert "[MISSED] WAL per send <= 2x a raw INSERT of the same payload (3.00x, " \
           "server LSN diff)" in out
    assert "6. WAL, own records" in out and "not measured (pg_walinspect" in out

    without = [cls for cls in measured if cls.name != "pgqueuer"]
    missing = [cls for cls in PEERS if cls.name == "pgqueuer"]
    peers._report(peers.Counts.at(0.01), res, without, missing, "15.0", "off", inspect=False)
    out = capsys.readouterr().out
    assert re.search(rf"pgqueuer\s+not measured \({re.escape(peers.INSTALL_HINT)}, or pip "
                     r"install pgqueuer\)", out)
    assert "÷ pgqueuer" not in out
