"""`agentpost bench agents` runs end to end at a tiny scale and prints, for every tool, the
direct store call beside the tools, the toolset, the agent loop and MCP over stdio and over
HTTP, with the overheads computed and both goals judged; every server it started is gone
afterwards (no child process, no socket, no thread), also when a path fails. Without the
`mcp` SDK it still runs and says that MCP was not measured. No timing is asserted (shared
machines): the goals are the benchmark's business, printed met or MISSED."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentpost.cli import main
from mcp_support import children

#: the pair read_inbox+ack, and each of its two calls alone
TOOLS = ("send_envelope", "read_inbox+ack", "read_inbox", "ack", "read_marks", "write_mark",
         "claim")
NUMBER = r"-?[\d.]+"


def sockets() -> set[str]:
    """The TCP sockets this process holds open, listening or connected (a server's port,
    a client's or a store's connection left open shows here)."""
    mine = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:["):-1])
    tcp = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        tcp.update(line.split()[9] for line in lines if len(line.split()) > 9)
    return mine & tcp


def bench_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.is_alive() and t.name.startswith("agentpost-bench")]


@contextmanager
def nothing_left_behind() -> Iterator[None]:
    before_children, before_sockets = children(), sockets()
    yield
    assert children() <= before_children, "a server process outlived the bench"
    assert sockets() <= before_sockets, "a socket (a server's port) outlived the bench"
    assert bench_threads() == []


def assert_rows(out: str, paths: tuple[str, ...]) -> None:
    for tool in TOOLS:
        assert re.search(rf"{re.escape(tool)}\s+direct\s+p50\s+{NUMBER} ms\s+p95\s+{NUMBER} ms",
                         out), (tool, out)
        for path in paths:
            assert re.search(
                rf"{re.escape(tool)}\s+{re.escape(path)}\s+p50\s+{NUMBER} ms\s+p95\s+{NUMBER} "
                rf"ms\s+over direct: p95 [+-]{NUMBER} ms, p50 x{NUMBER}", out), (tool, path, out)
    assert re.search(r"trail after the run\s+[\d,]+ entries, verified", out)
    assert re.search(r"\[(met|MISSED)\] toolset overhead under 1 ms at p95 over the direct "
                     r"call, every tool call \(read_inbox and ack each alone; worst "
                     rf"[+-]{NUMBER} ms\)", out)


@pytest.mark.slow
def test_bench_agents_prints_every_path_mcp_included_and_stops_its_servers(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with nothing_left_behind():
        assert main(["--dsn", dsn, "bench", "agents", "--scale", "0.03"]) == 0
    out = capsys.readouterr().out
    assert_rows(out, ("tools", "toolset", "agent", "mcp-stdio", "mcp-http"))
    assert "not measured" not in out and "goal not judged" not in out
    assert re.search(
        r"\[(met|MISSED)\] MCP over HTTP \(mcp-http\) p95 under 10 ms for send_envelope and "
        rf"read_inbox: send_envelope {NUMBER} ms, read_inbox {NUMBER} ms \(the read_inbox call "
        rf"alone, timed inside read_inbox\+ack; the pair with its ack: {NUMBER} ms\)", out), out


@pytest.mark.slow
def test_without_the_mcp_sdk_the_bench_runs_and_says_mcp_was_not_measured(
        dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    for name in [m for m in sys.modules if m.startswith(("agentpost.mcpserver",
                                                         "agentpost.benchmarks.agents_mcp"))]:
        monkeypatch.delitem(sys.modules, name)
    with nothing_left_behind():
        assert main(["--dsn", dsn, "bench", "agents", "--scale", "0.03"]) == 0
    out = capsys.readouterr().out
    assert_rows(out, ("tools", "toolset", "agent"))
    assert "mcp-stdio" not in out and "mcp-http" not in out
    assert re.search(r"MCP\s+not measured: the MCP server needs the mcp SDK: "
                     r"pip install 'airflow-agentpost\[ai\]'", out), out
    assert "goal not judged" in out and "MCP over HTTP p95 under 10 ms" in out


def test_a_transport_adds_its_column_judges_the_http_goal_and_is_stopped(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The extension point MCP plugs into: a transport (here a second seat on the same
    workspace, called in process, standing in for an MCP client) gets its own rows and,
    named for HTTP, the HTTP goal is judged; it is left when the bench ends."""
    from agentpost.benchmarks import agents
    from agentpost.marks.postgres import PostgresMarkSpace
    from agentpost.tools import AgentTools

    stopped: list[str] = []

    @contextmanager
    def stand_in(seat: agents.Seat) -> Iterator[agents.Caller]:
        marks = PostgresMarkSpace(dsn=seat.dsn, scopes=[seat.scope], space=seat.space)
        try:
            yield AgentTools(seat.store, workspace_id=seat.workspace, marks=marks,
                             agent=seat.agent).call
        finally:
            marks.close()
            stopped.append(seat.workspace)

    assert agents.run(dsn=dsn, scale=0.03, transports={"stand-in http": stand_in}) == 0
    assert len(stopped) == 1
    out = capsys.readouterr().out
    assert_rows(out, ("tools", "toolset", "agent", "stand-in http"))
    assert "not measured" not in out
    assert re.search(r"\[(met|MISSED)\] MCP over HTTP \(stand-in http\) p95 under 10 ms", out)


def test_a_failing_path_stops_the_mcp_servers_too(dsn: str) -> None:
    """A path that fails in the middle of the bench: the error comes out, and the MCP
    transports opened before it are stopped (their process, port, thread gone)."""
    from agentpost.benchmarks import agents
    from agentpost.benchmarks.agents_mcp import TRANSPORTS

    calls: list[str] = []

    @contextmanager
    def broken(seat: agents.Seat) -> Iterator[agents.Caller]:
        def call(name: str, args: dict[str, object]) -> dict[str, object]:
            calls.append(name)
            raise RuntimeError("the broken transport")
        yield call

    with nothing_left_behind(), pytest.raises(RuntimeError, match="the broken transport"):
        agents.run(dsn=dsn, scale=0.03, transports={**TRANSPORTS, "broken": broken})
    assert calls == ["send_envelope"]  # its first call, during the warm-up
