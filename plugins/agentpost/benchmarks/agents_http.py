"""The server process of `agentpost bench agents`' ``mcp-http`` path: the plugin's web app,
mounted at ``/agentpost`` as Airflow's API server mounts it, under uvicorn, in a process of
its own, as Airflow's API server is one (`agentpost.benchmarks.agents_mcp` starts it):

    python -m agentpost.benchmarks.agents_http --fd N --space NAME --scope SCOPE

It serves the listening socket `--fd` its parent opened (on a free port of 127.0.0.1) and
handed over, and stops, lifespan included, on SIGTERM or SIGINT. The store is
``AGENTPOST_DSN`` (from the environment, not the command line, where a password would
show); `--space` and `--scope` (``NAME[:INTENT_VERBS[:ACTION_VERBS]]``, repeatable) give the
endpoint its mark space, as `mcp_space` and `mcp_scopes` do. The loggers that say a line per
request at INFO are held at WARNING, as the bench holds them in its own process.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

#: loggers that say a line per request at INFO (the HTTP client, the SDK, uvicorn)
CHATTY = ("httpx2", "httpx", "mcp", "uvicorn")


def mounted(plugin: Any) -> Any:
    """`plugin` at /agentpost of an outer app whose lifespan runs the plugin's, as Airflow's
    API server mounts plugin apps."""
    from fastapi import FastAPI

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with plugin.router.lifespan_context(plugin):
            yield

    outer = FastAPI(lifespan=lifespan)
    outer.mount("/agentpost", plugin)
    return outer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentpost.benchmarks.agents_http")
    parser.add_argument("--fd", type=int, required=True,
                        help="a listening TCP socket, inherited from the parent")
    parser.add_argument("--space", required=True, help="the mark space of the MCP endpoint")
    parser.add_argument("--scope", action="append", default=[], help="a scope of that space")
    args = parser.parse_args(argv)
    dsn = os.environ.get("AGENTPOST_DSN")
    if not dsn:
        parser.error("AGENTPOST_DSN is not set")

    import uvicorn

    from agentpost.mcpserver.seat import parse_scope
    from agentpost.web.app import create_app

    for name in CHATTY:  # after the imports: importing Airflow configures logging
        if logging.getLogger(name).getEffectiveLevel() < logging.WARNING:
            logging.getLogger(name).setLevel(logging.WARNING)
    app = mounted(create_app(dsn, mcp_space=args.space,
                             mcp_scopes=[parse_scope(text) for text in args.scope]))
    sock = socket.socket(fileno=args.fd)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning",
                                           access_log=False, lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1  # it did not start: the reason is on stderr


if __name__ == "__main__":
    sys.exit(main())
