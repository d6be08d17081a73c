"""`agentpost bench marks` runs end to end at a tiny scale on both backends and prints every
row and goal the issue asks for (the numbers themselves are the benchmark's business, not a
test's)."""

from __future__ import annotations

import pytest

from agentpost.cli import main

ROWS = ("write_many", "write (single)", "read (scope, topic) p50/p95",
        "read (scope, resource) p50/p95", "pre_action p50/p95", "resolve_deferred x",
        "resolve_deferred_many over")


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
    # the package beside ours, same workload, ratios and both goals against it
    for row in ("read (scope, topic) p50", "read (scope, resource) p50", "pre_action p50",
                "write (single)"):
        assert f"vs markspace 0.2.0b0, 1,000 marks: {row}" in out, (row, out)
    assert "markspace / memory" in out and "markspace / Postgres" in out
    assert "in memory, reads at 1,000 marks >= 100x the package's" in out
    assert "Postgres reads at 1,000 marks faster than the package's in-memory reads" in out


def test_bench_marks_says_how_to_install_markspace_when_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The package is test-only: without it the bench skips the comparison and says how to
    install it (agentpost never imports it at runtime)."""
    import sys

    from agentpost.benchmarks import marks
    from agentpost.benchmarks.common import Report

    monkeypatch.setitem(sys.modules, "markspace", None)  # import markspace -> ImportError
    assert marks._package() is None
    report = Report("t")
    marks._compare(report, [], [], None)
    assert report.rows == [("markspace comparison", marks.PACKAGE_HINT)]
    assert "uv pip install" in marks.PACKAGE_HINT and "markspace==0.2.0b0" in marks.PACKAGE_HINT
