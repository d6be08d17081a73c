"""agentpost.mcpserver: the agent tools (agentpost.tools) as an MCP server, built with the
`mcp` SDK: over stdio (``agentpost mcp serve``) and streamable HTTP (the plugin's app, at
``/agentpost/mcp``, a gateway capability token fixing the seat). See docs/agents.md.

Needs the ``ai`` extra (``pip install 'airflow-agentpost[ai]'``).
"""

try:
    import mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test with the import blocked
    raise ImportError("the MCP server needs the mcp SDK: "
                      "pip install 'airflow-agentpost[ai]'") from exc

from agentpost.mcpserver.seat import TokenSeat, mark_agent, parse_scope
from agentpost.mcpserver.server import build_server, serve_stdio, stdio_run

__all__ = ["TokenSeat", "build_server", "mark_agent", "parse_scope", "serve_stdio", "stdio_run"]
