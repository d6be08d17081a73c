"""The MCP transports of `agentpost bench agents`: the agent tools called through the `mcp`
SDK's own client, as an MCP client would call them.

- ``mcp-stdio``: ``agentpost mcp serve`` as a subprocess (this interpreter, this code, the
  bench's database and the environment of this process), through the SDK's `stdio_client`;
- ``mcp-http``: the plugin's web app, mounted at ``/agentpost`` as Airflow's API server
  mounts it, with the bench's mark space, served by uvicorn in a process of its own, as
  Airflow's API server is (`agentpost.benchmarks.agents_http`: this interpreter, this code,
  the bench's database and environment), on a free port of 127.0.0.1; a gateway token fixes
  the seat, and the SDK's `streamable_http_client` calls ``/agentpost/mcp``.

Each keeps one `ClientSession` open for the whole bench, on an event loop of its own that a
call from the (synchronous) bench runs until its answer is in, in the bench's thread: no
hop to another thread, as in an agent whose client runs on its own loop.
Leaving a transport closes the session and stops what it started: the SDK's stdio client
closes the server's stdin and ends its process group if it lingers; the HTTP server, started
in a process group of its own, is sent SIGTERM (uvicorn's shutdown, the app's lifespan
included) and waited for, its group killed if it lingers; its port closes with it; the token
is revoked.

Importing this module needs the ``ai`` extra (the `mcp` SDK): an ImportError otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from agentpost.benchmarks.agents import Caller, Seat, Transport
from agentpost.benchmarks.agents_http import CHATTY
from agentpost.mcpserver import mark_agent  # without the mcp SDK: an ImportError saying so

log = logging.getLogger(__name__)

# CHATTY: loggers that say a line per request at INFO (the HTTP client, the SDK): quiet during
# the bench, so that the latencies are not the log's (Airflow's logging, when imported, is INFO)
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
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentpost.cli", "mcp", "serve", "--workspace", seat.workspace,
              "--space", seat.space, "--scope", _scope_arg(seat), "--agent", seat.agent.name],
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
    """The plugin's app under uvicorn on loopback, in a server process of its own, called
    over streamable HTTP with a gateway token for the seat's workspace."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from agentpost.gateway.tokens import TokenStore
    from agentpost.protocol.leases import stream_of

    _check_agent(seat, seat.workspace)  # the endpoint names each token's agent after its seat
    tokens = TokenStore(seat.store)
    token, secret = tokens.create(
        f"bench-{seat.workspace}",
        [f"senders:{seat.workspace}:send", f"streams:{stream_of(seat.lead)}:enqueue",
         f"streams:{stream_of(seat.workspace)}:subscribe"])
    try:
        with _quiet(), _http_server(seat) as base:
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


def _scope_arg(seat: Seat) -> str:
    """The seat's scope as ``--scope`` takes it (``NAME:INTENT_VERBS:ACTION_VERBS``)."""
    scope = seat.scope
    return (f"{scope.name}:{','.join(scope.allowed_intent_verbs)}"
            f":{','.join(scope.allowed_action_verbs)}")


@contextmanager
def _http_server(seat: Seat) -> Iterator[str]:
    """The plugin's app for the seat (`agentpost.benchmarks.agents_http`) in a process of its
    own, in a process group of its own, serving a socket opened here on a free port of
    127.0.0.1 and handed to it; its base URL once it answers. Leaving sends the group SIGTERM
    and waits (SIGKILL if it lingers), so that no process and no port outlives the bench;
    its stderr goes to ours then."""
    with (tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog,
          socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock):
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentpost.benchmarks.agents_http",
                 "--fd", str(sock.fileno()), "--space", seat.space, "--scope", _scope_arg(seat)],
                env=_server_env(seat.dsn), pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL,
                stdout=errlog, stderr=errlog, start_new_session=True)
            sock.close()  # the server's now: the port closes when it ends
            _wait_until_served(proc, port, "/agentpost/mcp")
            yield f"http://127.0.0.1:{port}"
        finally:
            try:
                if proc is not None:
                    _stop_group(proc)
            finally:
                errlog.seek(0)
                sys.stderr.write("".join(f"mcp-http server: {line}\n"
                                         for line in errlog.read().splitlines()))


def _wait_until_served(proc: subprocess.Popen[bytes], port: int, path: str) -> None:
    """Until the endpoint at `path` answers (401 to an anonymous POST: the app is mounted
    and its endpoint built); an error if the server ends first, or takes over
    START_TIMEOUT."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the MCP HTTP server stopped before serving (exit code "
                               f"{proc.returncode}; its stderr follows)")
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        try:
            probe.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
            if probe.getresponse().status == 401:
                return
        except OSError:  # not answering yet (refused, reset, timed out)
            pass
        finally:
            probe.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the MCP HTTP server did not answer within {START_TIMEOUT:g} s")
        time.sleep(0.05)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group `proc` leads, a wait, SIGKILL to what is left."""
    pgid = proc.pid  # start_new_session: the server leads a group of its own
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        log.warning("agentpost bench: the MCP HTTP server did not stop within %g s; killed",
                    STOP_TIMEOUT)
    with contextlib.suppress(ProcessLookupError):  # it, if it lingers, and any straggler
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(STOP_TIMEOUT)


@contextmanager
def _calling(open_session: Callable[[], AbstractAsyncContextManager[Any]],
             what: str) -> Iterator[Caller]:
    """A blocking caller over one MCP session. The session is held open by one task (the
    SDK's task groups must be left by the task that entered them) on an event loop of this
    thread, which runs while a call is made: the call awaits its answer on the loop that
    holds the session, as an agent's own client would, with no hop to another thread.
    Leaving closes the session, then the loop."""
    loop = asyncio.new_event_loop()
    opened: asyncio.Future[Any] = loop.create_future()
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

    held = loop.create_task(hold())
    try:
        session = loop.run_until_complete(asyncio.wait_for(asyncio.shield(opened),
                                                           START_TIMEOUT))

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            result = loop.run_until_complete(asyncio.wait_for(session.call_tool(name, args),
                                                              CALL_TIMEOUT))
            text = next((c.text for c in result.content if getattr(c, "text", None)), "")
            if result.is_error:
                raise RuntimeError(f"{what}: {name} failed: {text}")
            if isinstance(result.structured_content, dict):
                return result.structured_content
            return json.loads(text)

        yield call
    finally:
        stop.set()
        try:
            loop.run_until_complete(asyncio.wait_for(asyncio.shield(held), STOP_TIMEOUT))
        except TimeoutError:
            held.cancel()  # the SDK's own shutdown still ends the server process
            try:
                loop.run_until_complete(asyncio.wait_for(held, STOP_TIMEOUT))
            except BaseException:  # cancelled, or its own failure: the session is gone
                log.warning("agentpost bench: the %s session did not close cleanly", what)
        except Exception:
            if opened.done() and opened.exception() is None:  # else: raised above already
                log.warning("agentpost bench: closing the %s session failed", what,
                            exc_info=True)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
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
