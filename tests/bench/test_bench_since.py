"""Smoke test of `agentpost bench since` at a tiny scale: it runs end to end through the CLI,
prints the run since a checkpoint with and without row digests, the digests' query, the run
after a deletion, and the plan of every new query, none of which reads the trail whole. No
timing is asserted (shared machines)."""

from __future__ import annotations

import re

import pytest

from agentpost.cli import main
from agentpost.store.queries import QUERIES


@pytest.mark.slow
def test_bench_since_prints_both_runs_and_every_plan(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--dsn", dsn, "bench", "since", "--scale", "0.01"])
    out = capsys.readouterr().out
    assert code == 0, out
    for label in ("since, version 2 (row digests)", "since, version 1 (new entries' rows)",
                  "row digests query alone", "checkpoint()",
                  "since, version 2, one envelope deleted"):
        assert re.search(rf"{re.escape(label)}\s+[\d.]+ s", out), label
    for name in ("row_digests", "route_entries", "registry_before", "envelopes_gone",
                 "routes_gone", "rights_gone", "saga_steps_gone", "system_entries"):
        assert name in QUERIES and f"-- {name}\n" in out, name
    assert "READS THE TRAIL WHOLE" not in out
