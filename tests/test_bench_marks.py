"""`agentpost bench marks` runs end to end at a tiny scale on both backends and prints every
row and goal the issue asks for (the numbers themselves are the benchmark's business, not a
test's)."""

from __future__ import annotations

import pytest

from agentpost.cli import main

ROWS = ("write_many", "write (single)", "read (scope, topic) p50/p95",
        "read (scope, resource) p50/p95", "pre_action p50/p95", "resolve_deferred x")


@pytest.mark.slow
def test_bench_marks_prints_every_row_for_both_backends(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "bench", "marks", "--scale", "0.002"]) == 0
    out = capsys.readouterr().out
    for backend in ("memory", "postgres"):
        for row in ROWS:
            assert f"{backend}, 1,000 marks: {row}" in out, (backend, row, out)
    assert "Postgres read p95 < 3 ms" in out and "pre_action p95 < 5 ms" in out
    assert "in memory, read p95" in out
