"""`agentpost bench commands` runs end to end at a tiny scale and prints every row and goal
issue 5 asks for: lifecycles and routed hops beside the raw send rate of the same run, with
their cost in sends. No timing is asserted (shared machines): the goals are the benchmark's
business, printed met or MISSED."""

from __future__ import annotations

import re

import pytest

from agentpost.cli import main

RATE_ROWS = {
    "send (single envelope)": "envelopes/s",
    "lifecycle, mutating, auto-confirmed": "commands/s",
    "lifecycle, read-only": "commands/s",
    "routed hops (3 actors, fan-out 10)": "hops/s",
    "routed hops, one per call (streaming)": "hops/s",
}
COST_ROWS = ("cost of a mutating lifecycle", "cost of a read-only lifecycle",
             "cost of a routed hop (batches of 100)", "cost of a routed hop (one per call)")


@pytest.mark.slow
def test_bench_commands_prints_rates_costs_and_goals(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 5 'Performance': full lifecycles (received to executed, with evidence) and hops
    through a 3-actor route with a fan-out of 10, each beside the send rate, with ratios; the
    two goals judged; the trail verifies after the run."""
    assert main(["--dsn", dsn, "bench", "commands", "--scale", "0.05"]) == 0
    out = capsys.readouterr().out
    for row, unit in RATE_ROWS.items():
        assert re.search(rf"{re.escape(row)}\s+[\d,]+ {unit}", out), row
    for row in COST_ROWS:
        assert re.search(rf"{re.escape(row)}\s+[\d.]+ sends", out), row
    assert re.search(r"trail after the run\s+[\d,]+ entries, verified", out)
    assert re.search(r"\[(met|MISSED)\] a full command lifecycle costs <= 3 envelope sends",
                     out)
    assert re.search(r"\[(met|MISSED)\] a routed hop costs <= 1.5 envelope sends", out)
