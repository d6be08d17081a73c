"""The HTTP/WebSocket gateway (Courier §7.2, §9, §11, §12) as a FastAPI application.

    POST /v1/enqueue                        {"to": stream, "envelope": {...}} -> {"id", "status",
                                            "duplicate"}
    GET  /v1/snapshot?view=latestPerAgent   the latestPerAgent view
    GET  /v1/stats[?stream=...]             one stream's stats, or every readable stream's
    WS   /v1/subscribe?stream=...[&ttl=s]   credit / ack / nack frames, deliveries (subscribe.py)
    WS   /v1/live?view=latestPerAgent       the view, then deltas (live.py)

Every request authenticates with ``Authorization: Bearer <secret>`` (tokens.py) and spends one
token of its capability token's bucket; an enqueue also spends one of the stream's bucket.
Errors have one shape, ``{"error": {"code", "message"}}``; see docs/gateway.md for the table.

The blocking store calls run in threads (`asyncio.to_thread`), so the event loop only ever
waits on sockets.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentpost.gateway.core import Gateway, GatewayConfig, canonical_stream
from agentpost.gateway.errors import GatewayError, from_exception
from agentpost.gateway.live import checked_view, serve_live, view_snapshot
from agentpost.gateway.ratelimit import Clock, RateLimiter
from agentpost.gateway.subscribe import serve_subscribe
from agentpost.gateway.tokens import TokenInfo, TokenStore
from agentpost.protocol.errors import AgentpostError
from agentpost.protocol.leases import stream_of
from agentpost.store import EnvelopeStore

__all__ = ["GatewayConfig", "create_app"]


# -- HTTP ---------------------------------------------------------------------------------


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, refusing bodies over `limit` bytes before reading them."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise GatewayError(413, f"the body exceeds {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise GatewayError(400, "the body is not JSON") from None


def parse_enqueue(body: Any) -> tuple[object, dict[str, Any]]:
    """(to, envelope) of an enqueue body ``{"to": stream, "envelope": {...}}``; `to` may be
    left to the envelope's own `to`."""
    if not isinstance(body, dict):
        raise GatewayError(400, 'the body is {"to": stream, "envelope": {...}}')
    unknown = sorted(k for k in body if k not in ("to", "envelope"))
    if unknown:
        raise GatewayError(400, f"unknown field {unknown[0][:60]!r}: the body is "
                                '{"to": stream, "envelope": {...}}')
    envelope = body.get("envelope")
    if not isinstance(envelope, dict):
        raise GatewayError(400, "envelope must be a JSON object")
    return body.get("to", envelope.get("to")), envelope


def sender_of(envelope: dict[str, Any]) -> str | None:
    """The workspace (or human:<user>) an envelope names as its sender, as the store reads
    it: the token must be allowed to send as it, or any token could speak for anyone."""
    sender = envelope.get("from")
    if not isinstance(sender, str):
        return None
    match = re.match(r"^agents/([^/]+)/(?:outbox|inbox)$", sender)
    return match.group(1) if match else sender


def _host(request: Request | WebSocket) -> str | None:
    return request.client.host if request.client else None


def _routes(app: FastAPI, gw: Gateway, prefix: str) -> None:
    @app.post(f"{prefix}/enqueue")
    async def enqueue(request: Request) -> JSONResponse:
        who = await gw.authenticate(request.headers.get("authorization"), _host(request))
        to, envelope = parse_enqueue(await read_json(request, gw.config.max_body_bytes))
        stream, _ = canonical_stream(to)
        gw.require(who, "streams", stream, "enqueue")
        sender = sender_of(envelope)
        if sender is not None:  # (a missing or odd `from` is the store's 400)
            gw.require(who, "senders", sender, "send")
        await gw.existing_stream(stream)
        gw.limit_stream(stream)
        result = await gw.call(gw.store.enqueue, stream, envelope)
        body: dict[str, Any] = {"id": result.envelope_id, "status": result.status.value,
                                "duplicate": result.duplicate}
        if result.accepted:
            return JSONResponse(body)
        body.update(reason=result.reason, detail=result.detail,
                    error={"code": 422, "message": f"envelope rejected: {result.reason}"})
        return JSONResponse(body, status_code=422)

    @app.get(f"{prefix}/snapshot")
    async def snapshot(request: Request) -> JSONResponse:
        who = await gw.authenticate(request.headers.get("authorization"), _host(request))
        view = checked_view(gw, who, request.query_params.get("view"))
        return JSONResponse(await view_snapshot(gw, view))

    @app.get(f"{prefix}/stats")
    async def stats(request: Request) -> JSONResponse:
        who = await gw.authenticate(request.headers.get("authorization"), _host(request))
        asked = request.query_params.get("stream")
        if asked is None:
            return JSONResponse({"streams": await gw.call(_readable_stats, gw.store, who)})
        stream, workspace = canonical_stream(asked)
        gw.require(who, "stats", stream, "read")
        await gw.existing_stream(stream)
        found = await gw.call(gw.store.stats, workspace)
        return JSONResponse(found.model_dump(mode="json"))

    @app.websocket(f"{prefix}/subscribe")
    async def subscribe(websocket: WebSocket) -> None:
        await serve_subscribe(gw, websocket)

    @app.websocket(f"{prefix}/live")
    async def live(websocket: WebSocket) -> None:
        await serve_live(gw, websocket)


def _readable_stats(store: EnvelopeStore, who: TokenInfo) -> list[dict[str, Any]]:
    streams = [w.id for w in store.workspaces() if who.allows("stats", stream_of(w.id), "read")]
    return [store.stats(ws).model_dump(mode="json") for ws in streams]


def _error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.code, headers=error.headers())


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(AgentpostError)
    async def agentpost_error(request: Request, exc: AgentpostError) -> JSONResponse:
        return _error_response(from_exception(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(GatewayError(400, "malformed request"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = GatewayError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code,
                            headers={**(exc.headers or {}), **error.headers()})

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(from_exception(exc))


def create_app(store_or_dsn: EnvelopeStore | str, *, require_tokens: bool = True,
               config: GatewayConfig | None = None, tokens: TokenStore | None = None,
               clock: Clock = time.monotonic, prefix: str = "/v1",
               **overrides: Any) -> FastAPI:
    """The gateway on a store (or a DSN, for which it opens and later closes a store).

    `require_tokens=True` (the default) refuses every request without a valid bearer token.
    `require_tokens=False` is the opt-in localhost mode of Courier §7.2 ("if absent, allow
    localhost"): a request *without* a token is served with every scope when it comes from a
    loopback address, and refused (401) from anywhere else; a request that presents a token
    is checked as usual. Keyword `overrides` replace fields of `config` (GatewayConfig).
    `prefix` is where the routes live in this app: "" when the app is itself mounted at
    ``.../v1`` (the Airflow plugin mounts it at ``/agentpost/v1``).
    """
    cfg = dataclasses.replace(config or GatewayConfig(), **overrides)
    owns = isinstance(store_or_dsn, str)
    store = EnvelopeStore(store_or_dsn) if isinstance(store_or_dsn, str) else store_or_dsn
    gw = Gateway(store, tokens or TokenStore(store), cfg, require_tokens=require_tokens,
                 limiter=RateLimiter(clock), owns_store=owns)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await gw.close()

    app = FastAPI(title="agentpost gateway", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.gateway = gw
    _routes(app, gw, prefix)
    _handlers(app)
    return app
