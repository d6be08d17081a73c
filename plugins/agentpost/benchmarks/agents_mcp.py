"""The MCP transports of `agentpost bench agents`: the agent tools called through the `mcp`
SDK's own client, as an MCP client would call them.

- ``mcp-stdio``: ``agentpost mcp serve`` as a subprocess (this interpreter, this code, the
  bench's database and the environment of this process), through the SDK's `stdio_client`;
- ``mcp-http``: the plugin's web app, mounted at ``/agentpost`` as Airflow's API server
  mounts it, with the bench's mark space, served by uvicorn on a free loopback port in a
  thread of this process; a gateway token fixes the seat, and the SDK's
  `streamable_http_client` calls ``/agentpost/mcp``.

Each keeps one `ClientSession` open for the whole bench, on an event loop of its own in a
background thread, so a call from the (synchronous) bench blocks until its answer is in.
Leaving a transport closes the session and stops what it started: the SDK's stdio client
closes the server's stdin and ends its process group if it lingers; uvicorn is shut down,
its thread joined and its socket closed; the token is revoked.

Importing this module needs the ``ai`` extra (the `mcp` SDK): an ImportError otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from agentpost.benchmarks.agents import Caller, Seat, Transport
from agentpost.mcpserver import mark_agent  # without the mcp SDK: an ImportError saying so

log = logging.getLogger(__name__)

#: loggers that say a line per request at INFO (the HTTP client, the SDK): quiet during the
#: bench, so that the latencies are not the log's (Airflow's logging, when imported, is INFO)
CHATTY = ("httpx2", "httpx", "mcp", "uvicorn")
#: how long starting a server (and its session) may take, and one call, in seconds
START_TIMEOUT = 60.0
CALL_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


@contextmanager
def mcp_stdio(seat: Seat) -> Iterator[Caller]:
    """``agentpost mcp serve`` for the seat, in a subprocess, called over stdio."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    _check_agent(seat, seat.agent.name)
    scope = seat.scope
    scope_arg = (f"{scope.name}:{','.join(scope.allowed_intent_verbs)}"
                 f":{','.join(scope.allowed_action_verbs)}")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentpost.cli", "mcp", "serve", "--workspace", seat.workspace,
              "--space", seat.space, "--scope", scope_arg, "--agent", seat.agent.name],
        env=_server_env(seat.dsn))

    # the server's stderr (notes, warnings, the reason it failed) to a file, then to ours:
    # a subprocess needs a file descriptor, which sys.stderr may not have (under pytest)
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:

        @asynccontextmanager
        async def session() -> AsyncIterator[Any]:
            async with (stdio_client(params, errlog=errlog) as (read, write),
                        ClientSession(read, write) as client):
                yield client

        try:
            with _quiet(), _calling(session, "mcp-stdio") as call:
                yield call
        finally:
            errlog.seek(0)
            sys.stderr.write("".join(f"mcp-stdio server: {line}\n"
                                     for line in errlog.read().splitlines()))


@contextmanager
def mcp_http(seat: Seat) -> Iterator[Caller]:
    """The plugin's app under uvicorn on loopback, called over streamable HTTP with a
    gateway token for the seat's workspace."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from agentpost.gateway.tokens import TokenStore
    from agentpost.protocol.leases import stream_of
    from agentpost.web.app import create_app

    _check_agent(seat, seat.workspace)  # the endpoint names each token's agent after its seat
    tokens = TokenStore(seat.store)
    token, secret = tokens.create(
        f"bench-{seat.workspace}",
        [f"senders:{seat.workspace}:send", f"streams:{stream_of(seat.lead)}:enqueue",
         f"streams:{stream_of(seat.workspace)}:subscribe"])
    app = _mounted(create_app(seat.dsn, mcp_space=seat.space, mcp_scopes=[seat.scope]))
    try:
        with _quiet(), _uvicorn(app) as base:
            url = f"{base}/agentpost/mcp"

            @asynccontextmanager
            async def session() -> AsyncIterator[Any]:
                http = create_mcp_http_client(headers={"Authorization": f"Bearer {secret}"})
                async with (http, streamable_http_client(url, http_client=http) as (read, write),
                            ClientSession(read, write) as client):
                    yield client

            with _calling(session, "mcp-http") as call:
                yield call
    finally:
        tokens.revoke(token.id)


#: the MCP transports `agentpost bench agents` runs by default
TRANSPORTS: dict[str, Transport] = {"mcp-stdio": mcp_stdio, "mcp-http": mcp_http}


# ---- the pieces ---------------------------------------------------------------------------

def _check_agent(seat: Seat, name: str) -> None:
    """The server derives its mark-space agent from `name`: it must be the seat's, or the
    marks and claims would be another agent's than the ones the bench expects."""
    served = mark_agent(name, [seat.scope])
    if (served.id, served.name) != (seat.agent.id, seat.agent.name):
        raise ValueError(f"the MCP server's mark-space agent {served.name!r} ({served.id}) is "
                         f"not the bench's {seat.agent.name!r} ({seat.agent.id})")


def _server_env(dsn: str) -> dict[str, str]:
    """This process's environment (its trail key, ...), the bench's database (in the
    environment, not on the command line, where a password would show), and the agentpost
    package this process runs first on the path."""
    import agentpost

    code = str(Path(agentpost.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "AGENTPOST_DSN": dsn, "PYTHONPATH": path}


def _mounted(plugin: Any) -> Any:
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


@contextmanager
def _uvicorn(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free port of 127.0.0.1, in a thread; its base URL.
    Leaving shuts the server down (lifespan included), joins the thread, closes the port."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="agentpost-bench-uvicorn", daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn stopped before serving the MCP endpoint")
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start within {START_TIMEOUT:g} s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT)
        if thread.is_alive():  # a connection that would not close: stop without waiting
            server.force_exit = True
            thread.join(STOP_TIMEOUT)
        sock.close()
        if thread.is_alive():
            log.warning("agentpost bench: uvicorn did not stop within %g s", 2 * STOP_TIMEOUT)


@contextmanager
def _calling(open_session: Callable[[], AbstractAsyncContextManager[Any]],
             what: str) -> Iterator[Caller]:
    """A blocking caller over one MCP session, the session held open by one task on an
    event loop in a thread of its own (the SDK's task groups must be left by the task that
    entered them); leaving closes the session, then the loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=f"agentpost-bench-{what}",
                              daemon=True)
    thread.start()
    opened: concurrent.futures.Future[Any] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def hold() -> None:
        try:
            async with open_session() as session:
                await session.initialize()
                await session.list_tools()  # as a client does; the SDK caches the schemas
                opened.set_result(session)
                await stop.wait()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            raise

    held = asyncio.run_coroutine_threadsafe(hold(), loop)
    try:
        session = opened.result(START_TIMEOUT)

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            result = asyncio.run_coroutine_threadsafe(session.call_tool(name, args),
                                                      loop).result(CALL_TIMEOUT)
            text = next((c.text for c in result.content if getattr(c, "text", None)), "")
            if result.is_error:
                raise RuntimeError(f"{what}: {name} failed: {text}")
            if isinstance(result.structured_content, dict):
                return result.structured_content
            return json.loads(text)

        yield call
    finally:
        loop.call_soon_threadsafe(stop.set)
        try:
            held.result(STOP_TIMEOUT)
        except concurrent.futures.TimeoutError:
            held.cancel()  # the SDK's own shutdown still ends the server process
            try:
                held.result(STOP_TIMEOUT)
            except BaseException:  # cancelled, or its own failure: the session is gone
                log.warning("agentpost bench: the %s session did not close cleanly", what)
        except Exception:
            if opened.done() and opened.exception() is None:  # else: raised above already
                log.warning("agentpost bench: closing the %s session failed", what,
                            exc_info=True)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT)
            if not thread.is_alive():
                loop.close()


@contextmanager
def _quiet(names: tuple[str, ...] = CHATTY) -> Iterator[None]:
    """These loggers at WARNING at least, restored on leaving."""
    before = {name: logging.getLogger(name).level for name in names}
    for name, level in before.items():
        if level < logging.WARNING:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
