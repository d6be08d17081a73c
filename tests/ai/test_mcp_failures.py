"""The MCP server's answer when the store fails under a call: a tool error of one line
naming the kind of failure (no SQL, no DSN, no traceback), logged on the server's side;
the server goes on serving. In-process (the SDK's `Client` on the server object), since a
failing store is easier to make here than in a subprocess."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import psycopg2.extensions
import pytest
from mcp import Client

from agentpost.mcpserver import build_server
from agentpost.store import EnvelopeStore
from agentpost.tools import AgentTools, RunInfo
from dbtools import connect, rows
from mcp_support import error_text, seed


@contextmanager
def database_away(pg_server: Any, dsn: str) -> Iterator[None]:
    """The store's database refusing every connection, its open ones cut, until the end."""
    name = psycopg2.extensions.parse_dsn(dsn)["dbname"]
    admin = connect(pg_server.dsn)
    try:
        rows(admin, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        rows(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                    " AND pid <> pg_backend_pid()", (name,))
        yield
    finally:
        rows(admin, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()


def test_a_store_failure_is_a_one_line_tool_error(pg_server: Any, dsn: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    store = EnvelopeStore(dsn)
    seed(store)
    seat = AgentTools(store, workspace_id="w1", run=RunInfo(by="mcp", ref="mcp:test"))
    server = build_server(seat)

    async def main() -> tuple[str, str]:
        async with Client(server) as client:
            with database_away(pg_server, dsn):  # between the listing and the call
                failed = error_text(await client.call_tool(
                    "send_envelope", {"to": "boss", "type": "query", "content": "x"}))
            refused = error_text(await client.call_tool("read_inbox", {"limit": 0}))
            return failed, refused

    try:
        with caplog.at_level(logging.ERROR, logger="agentpost.mcpserver"):
            failed, refused = anyio.run(main)
    finally:
        store.close()
    assert "\n" not in failed and dsn not in failed
    assert failed.startswith("the agentpost store failed (StoreUnavailable)"), failed
    assert "limit" in refused  # still serving: the next call is answered
    assert any("send_envelope" in r.getMessage() for r in caplog.records)
