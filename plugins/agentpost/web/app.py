"""The web app the Airflow plugin mounts at ``/agentpost``.

    /                       inboxes (live)            pages/inboxes.py
    /envelopes/{id}         one envelope              pages/envelopes.py
    /marks                  the mark space            pages/marks.py
    /commands[/{id}]        commands and sagas        pages/commands.py
    /routes[/{id}]          actor routes              pages/routes.py
    /agents[/{ws}]          agents' tool calls        pages/agents.py
    /analytics              the Spark jobs' results   pages/analytics.py
    /metrics                Prometheus text           metrics.py (a scrape token or a user)
    /static/...             CSS, JS, the chart library (served from the package)
    /v1/...                 the Courier gateway, with its own capability tokens
    /mcp                    the agent tools over MCP (streamable HTTP), a gateway token
                            fixing the seat (agentpost.mcpserver.http)

Each page module has a router whose every route needs an Airflow user (auth.py); the
human highway's actions need the acting role and a CSRF token as well. Every page route's
path and query parameters are checked here, once, before any reaches the store
(`plain_parameters`); a static file's name is checked where it meets the filesystem.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse

from agentpost.web import errors, metrics
from agentpost.web.auth import Viewer
from agentpost.web.context import WebContext
from agentpost.web.pages import PAGE_ROUTERS

STATIC = Path(__file__).with_name("static")

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


class LazyGateway:
    """The gateway app, built on its first request: building it needs the store, and the
    plugin's app is created when Airflow imports plugins, long before (or without) one. It
    serves the store of the app it is mounted in (``app.state.agentpost``)."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None
        self._context: WebContext | None = None
        self._lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        context: WebContext = scope["app"].state.agentpost
        if self._app is None or self._context is not context:
            async with self._lock:
                if self._app is None or self._context is not context:
                    await self.close()
                    self._app = await asyncio.to_thread(self._build, context)
                    self._context = context
        await self._app(scope, receive, send)

    @staticmethod
    def _build(context: WebContext) -> FastAPI:
        from agentpost.gateway import create_app as gateway_app

        return gateway_app(context.store, require_tokens=True, prefix="")

    async def close(self) -> None:
        if self._app is not None:
            await self._app.state.gateway.close()
            self._app = None


MCPOptions = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


class LazyMCP:
    """The MCP endpoint (`agentpost.mcpserver.http.MCPEndpoint`), imported and built on its
    first request: the `mcp` SDK comes with the ``ai`` extra, and the page works without it.
    Without it the endpoint still refuses anonymous callers (401) and tells the others what
    to install (501). `options` are the endpoint's keyword arguments, or a function returning
    them, called then (the plugin's reads Airflow's configuration); when they are wrong, the
    others get 500 and the reason goes to the log, and the next request tries again."""

    def __init__(self, options: MCPOptions) -> None:
        self.options = options
        self._endpoint: Any = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self._endpoint is None:
            try:
                from agentpost.mcpserver.http import MCPEndpoint
            except ImportError:
                await self._refuse(scope, receive, send, 501, "the MCP endpoint needs the mcp "
                                   "SDK: pip install 'airflow-agentpost[ai]'")
                return
            try:
                options = self.options() if callable(self.options) else self.options
                endpoint = MCPEndpoint(**options)
            except Exception:
                log.exception("agentpost MCP: the endpoint's settings are wrong")
                await self._refuse(scope, receive, send, 500, "the MCP endpoint is "
                                   "misconfigured; see the API server's log")
                return
            self._endpoint = endpoint
        await self._endpoint(scope, receive, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Any, send: Any, code: int, text: str) -> None:
        """`code` and `text` to a caller presenting credentials; 401 to the others."""
        from fastapi.responses import JSONResponse

        signed = any(k.lower() == b"authorization" for k, _ in scope.get("headers", []))
        if not signed:
            code, text = 401, "a token is required: Authorization: Bearer <secret>"
        headers = {} if signed else {"WWW-Authenticate": "Bearer"}
        await JSONResponse({"error": {"code": code, "message": text}}, code,
                           headers=headers)(scope, receive, send)

    async def close(self) -> None:
        if self._endpoint is not None:
            await self._endpoint.close()


async def plain_parameters(request: Request, user: Viewer) -> None:
    """400 for a path or query parameter holding a NUL byte, which no id, name or cursor of
    the store can hold (Postgres text refuses it): one check for every page route, after the
    sign-in check (an anonymous caller still gets 401), before any handler runs."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if "\x00" in name or "\x00" in str(value):
            shown = name.replace("\x00", "%00")
            raise HTTPException(400, f"{shown}: a parameter may not contain a NUL byte (%00)")


def static_file(base: Path, path: str) -> Path | None:
    """The file `path` names under `base`, or None: outside it, no such file, or a name no
    file can have (a NUL byte)."""
    try:
        target = (base / path).resolve()
        return target if target.is_relative_to(base) and target.is_file() else None
    except (ValueError, OSError):
        return None


def _static_router() -> APIRouter:
    """CSS, scripts and the chart library, for signed-in users like every other route."""
    router = APIRouter()
    base = STATIC.resolve()

    @router.get("/static/{path:path}", name="static")
    def static(path: str, user: Viewer) -> FileResponse:
        target = static_file(base, path)
        if target is None:
            raise HTTPException(404, "no such file")
        return FileResponse(target, headers={"Cache-Control": "private, max-age=3600"})

    return router


def create_app(dsn: str | None = None, *, read_dsn: str | None = None,
               mcp_space: str | None = None,
               mcp_scopes: Sequence[Any] = (), mcp_options: MCPOptions | None = None
               ) -> FastAPI:
    """The agentpost page. `dsn`: the store; by default the Airflow connection
    ``agentpost_default``, else AGENTPOST_DSN, looked up on the first request. `read_dsn`: a
    streaming standby the pages read from (default: the connection ``agentpost_read``, else
    AGENTPOST_READ_DSN, else none: the primary).
    `mcp_space`, `mcp_scopes`: the mark space (and its scopes) whose tools the MCP endpoint
    offers; none by default. `mcp_options`: the endpoint's keyword arguments
    (`MCPEndpoint`: ``space``, ``scopes``, ``token_rate``, ``token_burst``, ``lease_ttl``),
    or a function returning them, called on its first request; the plugin passes
    `agentpost.web.mcpconfig.airflow_mcp_options` (the ``[agentpost]`` section of
    Airflow's configuration). A space goes either here or in `mcp_space`, not both."""
    if mcp_options is not None and (mcp_space is not None or mcp_scopes):
        raise TypeError("give the MCP endpoint's mark space in mcp_options or as mcp_space "
                        "and mcp_scopes, not both")
    context = WebContext(dsn, read_dsn=read_dsn)
    gateway = LazyGateway()
    mcp = LazyMCP(mcp_options if mcp_options is not None else
                  {"space": mcp_space, "scopes": mcp_scopes})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        try:
            await mcp.close()
            await gateway.close()
        finally:
            app.state.agentpost.close()

    app = FastAPI(title="agentpost", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.agentpost = context
    errors.install(app)
    for router in PAGE_ROUTERS:
        app.include_router(router, dependencies=[Depends(plain_parameters)])
    app.include_router(_static_router())
    app.include_router(metrics.router)
    app.state.agentpost_requests = counts = metrics.RequestCounts()
    app.add_middleware(metrics.CountResponses, counts=counts)
    app.mount("/v1", gateway, name="gateway")
    # a Route, not a Mount: /agentpost/mcp itself is the endpoint (no redirect to /mcp/)
    app.add_route("/mcp", mcp, methods=["GET", "POST", "DELETE"], name="mcp")
    return app
