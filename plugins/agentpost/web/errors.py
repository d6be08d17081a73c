"""One error shape for the page: a short HTML page for browsers, ``{"error": {"code",
"message"}}`` for JSON callers. agentpost's typed errors keep their person-readable
messages; anything else is logged and answered with a generic 500/503, never a traceback or
a database message."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentpost.gateway import errors as gateway
from agentpost.protocol.errors import AgentpostError, ConfigurationError

log = logging.getLogger("agentpost.web")


def status_of(exc: AgentpostError) -> int:
    """The gateway's status for `exc`, but for two cases the page answers on purpose as it
    does: a store that is not configured is a 503 page naming what to set up (the gateway
    says 500: a fault of its deployment), and an error of no mapped kind (the mark space's
    own) is a 400, about what the person asked."""
    if isinstance(exc, ConfigurationError):
        return 503
    return gateway.status_of(exc, default=400)


def _wants_json(request: Request) -> bool:
    path = request.url.path
    accept = request.headers.get("accept", "")
    return "/api/" in path or ("application/json" in accept and "text/html" not in accept)


def error_response(request: Request, code: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=code)
    from agentpost.web.render import templates

    login = "/auth/login?next=" + request.url.path if code == 401 else None
    return templates.TemplateResponse(
        request, "error.html", {"code": code, "message": message, "login": login,
                                "root": request.scope.get("root_path", "").rstrip("/")},
        status_code=code)


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(request, exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body"))
        return error_response(request, 400, f"{where}: {first.get('msg', 'invalid input')}")

    @app.exception_handler(AgentpostError)
    async def agentpost_error(request: Request, exc: AgentpostError) -> Response:
        code = status_of(exc)
        if code >= 500:
            log.error("agentpost page: %s", exc)
            message = ("the agentpost store is not reachable or not configured; "
                       "see the API server's log")
            if isinstance(exc, ConfigurationError):
                message = str(exc)
            return error_response(request, code, message)
        return error_response(request, code, str(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("agentpost page failed on %s", request.url.path)
        return error_response(request, 500, "internal error; see the API server's log")


__all__ = ["HTMLResponse", "error_response", "install", "status_of"]
