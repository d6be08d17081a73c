"""The MCP server of the agent tools, on the SDK's low-level `Server`.

One server serves one seat (stdio) or a seat per caller (HTTP): `build_server` takes a
function of the request context returning the caller's `AgentTools`. Each request asks it
again, so the tools listed (their descriptions carry the seat's facts) and every call are
the caller's own. The low-level server is used rather than `MCPServer` because the tools'
input schemas are the argument models' (`spec.args.model_json_schema()`), the arguments are
validated once, by `AgentTools.call`, and the list depends on the seat.

A call answers:

- its result, as JSON text and as structured content;
- a refusal (`ToolRefused`: bad arguments, permission, not found, ...) as a tool error,
  ``is_error=True`` with the reason as text: nothing was written;
- anything else (the store away, a database failure, a bug) as a tool error with one line
  naming the kind of failure, logged with its traceback on the server's side only.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from agentpost.protocol.errors import ConfigurationError, StoreError
from agentpost.tools import TOOLS, AgentTools, RunInfo, ToolRefused

log = logging.getLogger(__name__)

SERVER_NAME = "agentpost"
SeatOf = Callable[[ServerRequestContext[Any, Any]], AgentTools]


def _text(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=error)


def failure_line(exc: BaseException) -> str:
    """What a caller is told of a failure that is not a refusal: its kind, no details (no
    SQL, no DSN, no traceback); the server's log has the rest."""
    if isinstance(exc, StoreError):
        return (f"the agentpost store failed ({type(exc).__name__}); the call may not have "
                "taken effect; try again later")
    if isinstance(exc, ConfigurationError):
        return "the agentpost server is misconfigured; ask its operator"
    return f"internal error in the agentpost MCP server ({type(exc).__name__})"


#: each tool's input schema (its argument model's JSON schema), made once: the same for
#: every seat (the seat changes the descriptions and which tools are listed, not the schemas)
INPUT_SCHEMAS: dict[str, dict[str, Any]] = {spec.name: spec.args.model_json_schema()
                                            for spec in TOOLS}


def input_schema(name: str) -> dict[str, Any] | None:
    """The input schema of the tool `name` (None: no such tool), for the SDK's per-request
    protocol (2026-07-28), which checks a call's ``Mcp-Param-*`` headers against it; without
    it the SDK would list the caller's tools on every call to find it."""
    return INPUT_SCHEMAS.get(name)


def build_server(seat_of: SeatOf | AgentTools, *, name: str = SERVER_NAME) -> Server[Any]:
    """An MCP server offering the agent tools of the seat `seat_of` returns for each
    request (or of the one seat given)."""
    fixed = seat_of if isinstance(seat_of, AgentTools) else None

    def seat(ctx: ServerRequestContext[Any, Any]) -> AgentTools:
        return fixed if fixed is not None else seat_of(ctx)  # type: ignore[operator]

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        specs = await anyio.to_thread.run_sync(seat(ctx).specs)
        return types.ListToolsResult(tools=[
            types.Tool(name=spec.name, description=spec.description,
                       input_schema=INPUT_SCHEMAS.get(spec.name) or spec.args.model_json_schema())
            for spec in specs])

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        call_id = None if ctx.request_id is None else f"mcp:{ctx.request_id}"
        try:
            tools = seat(ctx)
            result = await anyio.to_thread.run_sync(
                lambda: tools.call(params.name, params.arguments or {}, call_id=call_id))
        except ToolRefused as exc:
            return _text(exc.reason, error=True)
        except Exception as exc:
            log.exception("agentpost MCP tool %r failed", params.name)
            return _text(failure_line(exc), error=True)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
            structured_content=result, is_error=False)

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=input_schema)


def stdio_run(workspace_id: str) -> RunInfo:
    """The run a stdio server records: this process, one run per server."""
    ref = f"mcp:stdio:{workspace_id}:{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return RunInfo(by="mcp", ref=ref[:200], attrs={"transport": "stdio",
                                                   "workspace": workspace_id,
                                                   "pid": os.getpid()})


async def serve_stdio(seat: AgentTools) -> None:
    """Serve `seat` over this process's stdin and stdout until the client closes them;
    the envelopes it read and did not acknowledge go back to the inbox then."""
    from mcp.server.stdio import stdio_server

    server = build_server(seat)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await anyio.to_thread.run_sync(seat.release)
