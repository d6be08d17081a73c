"""`agentpost bench agents` runs end to end at a tiny scale and prints, for every tool, the
direct store call beside the tools, the toolset and the agent loop, with the overheads
computed, the toolset goal judged and MCP said to be unmeasured. No timing is asserted
(shared machines): the goals are the benchmark's business, printed met or MISSED."""

from __future__ import annotations

import re

import pytest

from agentpost.cli import main

TOOLS = ("send_envelope", "read_inbox+ack", "read_marks", "write_mark", "claim")
NUMBER = r"-?[\d.]+"


@pytest.mark.slow
def test_bench_agents_prints_every_tool_and_path_with_overheads(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "bench", "agents", "--scale", "0.03"]) == 0
    out = capsys.readouterr().out
    for tool in TOOLS:
        assert re.search(rf"{re.escape(tool)}\s+direct\s+p50\s+{NUMBER} ms\s+p95\s+{NUMBER} ms",
                         out), (tool, out)
        for path in ("tools", "toolset", "agent"):
            assert re.search(
                rf"{re.escape(tool)}\s+{path}\s+p50\s+{NUMBER} ms\s+p95\s+{NUMBER} ms\s+"
                rf"over direct: p95 [+-]{NUMBER} ms, p50 x{NUMBER}", out), (tool, path, out)
    assert "MCP" in out and "not measured in this build" in out
    assert re.search(r"trail after the run\s+[\d,]+ entries, verified", out)
    assert re.search(r"\[(met|MISSED)\] toolset overhead under 1 ms at p95 over the direct "
                     rf"call, every tool \(worst [+-]{NUMBER} ms\)", out)
    assert "goal not judged" in out and "MCP over HTTP p95 under 10 ms" in out


def test_a_transport_adds_its_column_and_judges_the_http_goal(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The extension point MCP plugs into: a transport (here a second seat on the same
    workspace, called in process, standing in for an MCP client) gets its own rows and,
    named for HTTP, the HTTP goal is judged instead of reported as not measured."""
    from agentpost.benchmarks import agents
    from agentpost.marks.postgres import PostgresMarkSpace
    from agentpost.store import EnvelopeStore
    from agentpost.tools import AgentTools

    opened: list[object] = []

    def stand_in(workspace: str, space: str, agent: object) -> agents.Caller:
        store = EnvelopeStore(dsn)
        marks = PostgresMarkSpace(dsn=dsn, scopes=[agents.SCOPE], space=space)
        opened.extend([marks, store])
        return AgentTools(store, workspace_id=workspace, marks=marks, agent=agent).call

    try:
        assert agents.run(dsn=dsn, scale=0.03, transports={"stand-in http": stand_in}) == 0
    finally:
        for thing in opened:
            thing.close()
    out = capsys.readouterr().out
    for tool in TOOLS:
        assert re.search(rf"{re.escape(tool)}\s+stand-in http\s+p50\s+{NUMBER} ms", out), tool
    assert "not measured in this build" not in out
    assert re.search(r"\[(met|MISSED)\] MCP over HTTP \(stand-in http\) p95 under 10 ms", out)
