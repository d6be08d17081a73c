"""``agentpost mcp serve``: the agent tools of one seat as an MCP server over stdio.

    agentpost mcp serve --workspace W [--space S --scope NAME[:INTENTS[:ACTIONS]] ...]
                        [--agent NAME] [--lease-ttl SECONDS]

An MCP client (Claude Desktop, an IDE, the SDK's `stdio_client`) starts it as a subprocess
and talks MCP on its stdin and stdout; nothing else is written to stdout (notes and logs go
to stderr). The seat is fixed here, by whoever configures the client: the workspace, and with
``--space`` the mark space, its scopes and the mark-space agent (default: the workspace id).
The `mcp` SDK comes with the ``ai`` extra; without it the command says what to install.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from agentpost.cli.common import open_store, store_dsn
from agentpost.protocol.errors import ConfigurationError, InvalidInput, NotFound


def cmd_mcp_serve(args: argparse.Namespace) -> int:
    try:
        import anyio

        from agentpost.mcpserver import mark_agent, parse_scope, serve_stdio, stdio_run
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from None
    from agentpost.tools import AgentTools, ToolRefused

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="agentpost mcp: %(levelname)s %(name)s: %(message)s")
    scopes = [parse_scope(text) for text in args.scope]
    if scopes and args.space is None:
        raise InvalidInput("--scope needs --space (the mark space the scopes are of)")
    with open_store(args) as store:
        marks = agent = None
        if args.space is not None:
            from agentpost.marks.postgres import PostgresMarkSpace

            marks = PostgresMarkSpace(dsn=store_dsn(args), scopes=scopes, space=args.space)
            agent = mark_agent(args.agent or args.workspace, scopes)
        try:
            seat = AgentTools(store, workspace_id=args.workspace, marks=marks, agent=agent,
                              run=stdio_run(args.workspace), lease_ttl=args.lease_ttl)
            try:
                seat.specs()  # the seat must exist before a client is told anything
            except ToolRefused as exc:
                raise NotFound(f"cannot serve workspace {args.workspace!r}: "
                               f"{exc.reason}") from None
            anyio.run(serve_stdio, seat)
        finally:
            if marks is not None:
                marks.close()
    return 0


def register(sub: Any) -> None:
    """Add the `mcp` command to the main parser's subparsers."""
    parser = sub.add_parser("mcp", help="serve the agent tools to MCP clients")
    actions = parser.add_subparsers(dest="action", required=True)
    serve = actions.add_parser("serve", help="serve one seat over stdio (an MCP client "
                                             "starts this as its server process)")
    serve.add_argument("--workspace", required=True, help="the workspace the tools act as")
    serve.add_argument("--space", help="a mark space (in the store's database): adds "
                                       "read_marks, write_mark and claim")
    serve.add_argument("--scope", action="append", default=[],
                       help="a scope of the mark space, NAME[:INTENT_VERBS[:ACTION_VERBS]] "
                            "with comma-separated verbs, e.g. deploys:deploy:deployed "
                            "(repeatable)")
    serve.add_argument("--agent", help="the mark-space agent's name (default: the workspace)")
    serve.add_argument("--lease-ttl", type=float, default=300.0,
                       help="seconds a read_inbox lease lasts (default 300)")
    serve.set_defaults(func=cmd_mcp_serve)
