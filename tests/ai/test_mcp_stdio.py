"""`agentpost mcp serve` over stdio, driven by the `mcp` SDK's own client: the server is the
real CLI in a subprocess against a throwaway database; every tool is listed and called once,
refusals arrive as tool errors with nothing written, and the process is gone afterwards."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentpost.store import EnvelopeStore
from ai_support import written
from mcp_support import (
    ROOT,
    SCOPE_ARG,
    SPACE,
    call_every_tool,
    check_refusals,
    children,
    error_text,
    seed,
    subprocess_env,
)


def params(dsn: str, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "agentpost.cli", "mcp", "serve", *args],
                                 env=subprocess_env(dsn), cwd=str(ROOT))


SEAT = ("--workspace", "w1", "--space", SPACE, "--scope", SCOPE_ARG)


def test_every_tool_over_stdio_then_the_refusals(store: EnvelopeStore, dsn: str) -> None:
    waiting = seed(store)
    before = children()

    results: dict[str, Any] = {}

    async def main() -> None:
        async with stdio_client(params(dsn, *SEAT)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            results.update(await call_every_tool(session, store, waiting))
            await check_refusals(session, dsn)

    anyio.run(main)
    assert children() <= before
    # the run is this server process: on the envelope (covered by the trail) and the lease
    run = store.get(results["send_envelope"]["envelope_id"]).meta["tool_call"]["run"]
    assert run["attrs"]["transport"] == "stdio" and run["ref"].startswith("mcp:stdio:w1:")
    leased = store.trail(envelope_id=waiting, event="envelope_leased")
    assert leased[0].body["holder"] == run["ref"]
    assert store.verify_trail().ok


def test_the_seat_is_fixed_by_the_command_line(store: EnvelopeStore, dsn: str) -> None:
    """w1's server cannot act as w2: `from` is no argument, and w2's inbox is not its."""
    seed(store)
    for_w2 = store.send("boss", "w2", "directive", "w2's job").envelope_id

    async def main() -> None:
        async with stdio_client(params(dsn, "--workspace", "w1")) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            listed = {t.name for t in (await session.list_tools()).tools}
            assert listed == {"send_envelope", "read_inbox", "reply", "ack", "submit_command"}
            before = written(dsn)
            text = error_text(await session.call_tool(
                "send_envelope", {"to": "boss", "type": "query", "content": "x",
                                  "sender": "w2"}))
            assert "sender" in text
            text = error_text(await session.call_tool("reply", {"envelope_id": for_w2,
                                                                "content": "x"}))
            assert "not found" in text
            text = error_text(await session.call_tool("claim", {"scope": "deploys",
                                                                "resource": "api",
                                                                "action": "deploy"}))
            assert "unknown tool" in text
            assert written(dsn) == before

    anyio.run(main)


def test_an_unknown_workspace_is_refused_before_serving(dsn: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "agentpost.cli", "mcp", "serve",
                           "--workspace", "ghost"], env=subprocess_env(dsn), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "ghost" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["--scope", "deploys"], ["--space", "s", "--scope", "a b:x"]])
def test_bad_seat_options_are_one_line(dsn: str, argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "agentpost.cli", "mcp", "serve",
                           "--workspace", "w1", *argv], env=subprocess_env(dsn), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_without_the_mcp_sdk_it_says_what_to_install(dsn: str) -> None:
    blocker = ("import sys; sys.modules['mcp'] = None; "
               "from agentpost.cli import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", blocker, "mcp", "serve", "--workspace", "w1"],
                          env=subprocess_env(dsn), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 3, proc.stderr
    assert "pip install 'airflow-agentpost[ai]'" in proc.stderr
    assert "Traceback" not in proc.stderr
