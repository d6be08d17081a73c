"""The MCP server over streamable HTTP, for the plugin's app at ``/agentpost/mcp``.

Every request presents a gateway capability token (``Authorization: Bearer <secret>``,
`agentpost.gateway.tokens`): without one, or with an unknown or revoked one, it gets 401
before anything of MCP answers. Then it spends one token of the token's bucket, as on the
gateway's routes (`agentpost.gateway.ratelimit`: the token's own rate, else `token_rate` and
`token_burst` here); an empty bucket is 429 with Retry-After, again before any MCP. The
endpoint keeps its own buckets, apart from the gateway's. The token fixes the seat
(`TokenSeat`): its one
``senders:<workspace>:send`` scope names the workspace it acts as (a token naming none, or
several, or a wildcard gets 403), and its ``streams`` scopes bound whom it may send to and
whether it may read that workspace's inbox. No tool argument can name another seat.

One SDK server serves every token: it is built once (`build_server`) with a function that
reads the seat this endpoint put into the request's ASGI scope after authenticating it, so
the tools listed and every call are the token's own. The SDK's `StreamableHTTPSessionManager`
runs stateless (each POST a fresh transport: no MCP session a second token could join) and
answers JSON. It needs a running task group: started here on the first request, in the
serving event loop, and stopped by `close()` (the app's lifespan), because the plugin's app
is built when Airflow imports plugins, long before (or without) a loop.

A token's seat (its lease book included) lives as long as the endpoint: envelopes it read
and did not acknowledge go back to the inbox at `close()`, or when their leases end.

A token the store has confirmed live is taken as live for `token_cache` seconds after (1 by
default; 0: every request asks the store), per secret (by its hash): a request within that
time is served without a store round trip or a thread hop. Revocation is therefore honoured
within `token_cache` seconds, not at once; an unknown or revoked answer is never cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse

from agentpost.gateway.core import GatewayConfig, bearer, charge, token_limit
from agentpost.gateway.errors import GatewayError
from agentpost.gateway.ratelimit import Clock, Limit, RateLimiter
from agentpost.gateway.tokens import TokenInfo, TokenStore, hash_secret
from agentpost.marks import Scope
from agentpost.mcpserver.seat import TokenSeat, mark_agent, token_workspace
from agentpost.mcpserver.server import build_server
from agentpost.protocol.errors import AgentpostError, NotFound, StoreError
from agentpost.tools import RunInfo

log = logging.getLogger(__name__)

#: where the authenticated request carries its seat (an ASGI scope key of ours)
SEAT_KEY = "agentpost.mcp.seat"
#: how long (seconds) a token the store confirmed live is taken as live without asking again
TOKEN_CACHE = 1.0
#: at most this many tokens remembered (the expired ones go first, then the oldest)
TOKEN_CACHE_SIZE = 1024


def http_run(token: TokenInfo, workspace: str) -> RunInfo:
    """The run a token's calls record: the token (its id and name), over HTTP."""
    return RunInfo(by="mcp", ref=f"mcp:http:{token.id}",
                   attrs={"transport": "http", "token_id": token.id,
                          "token_name": token.name[:100], "workspace": workspace})


def _seat_of(ctx: ServerRequestContext[Any, Any]) -> TokenSeat:
    request = ctx.request
    seat = getattr(request, "scope", {}).get(SEAT_KEY) if request is not None else None
    if seat is None:  # only requests that came through MCPEndpoint reach the server
        raise RuntimeError("no authenticated seat on this request")
    return seat


class MCPEndpoint:
    """The ASGI app at ``/agentpost/mcp``: authenticate, fix the seat, hand over to the
    SDK. It serves the store of the app it is mounted in (``app.state.agentpost``).

    :param space: a mark space (a `PostgresMarkSpace` in the store's database) for the mark
        tools; None: no mark tools. Each token's mark-space agent is named after its
        workspace.
    :param scopes: that space's scopes.
    :param token_rate: requests per second of a token's bucket, when the token has no rate
        of its own (None: no limit); `token_burst` its size. The gateway's defaults.
    :param token_cache: seconds a token the store confirmed live is taken as live without
        asking it again (so a revoked token is refused within that time); 0: ask every time.
    """

    def __init__(self, *, space: str | None = None, scopes: Sequence[Scope] = (),
                 lease_ttl: float = 300.0,
                 token_rate: float | None = GatewayConfig.token_rate,
                 token_burst: int = GatewayConfig.token_burst,
                 token_cache: float = TOKEN_CACHE,
                 clock: Clock = time.monotonic) -> None:
        self.space = space
        self.scopes = list(scopes)
        self.lease_ttl = lease_ttl
        self.token_rate = token_rate
        self.token_burst = token_burst
        if token_rate is not None:  # a bad setting fails here, not on some request
            Limit("token", token_rate, token_burst)
        if not (isinstance(token_cache, int | float) and 0 <= token_cache < float("inf")):
            raise ValueError(f"token_cache must be a number of seconds, 0 or more "
                             f"(not {token_cache!r})")
        self.token_cache = float(token_cache)
        self.clock = clock
        self.limiter = RateLimiter(clock)
        self.server = build_server(_seat_of)
        self._runner: tuple[Any, asyncio.Task[None], asyncio.Event, asyncio.Future[Any]] | None
        self._runner = None
        self._seats: dict[str, TokenSeat] = {}
        #: sha256 of a secret -> (its token, until when it is taken as live); the loop's only
        self._live: dict[bytes, tuple[TokenInfo, float]] = {}
        self._context: Any = None
        self._marks: Any = None
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # pragma: no cover - a Route passes only http here
            return
        authorization = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                              if k.lower() == b"authorization"), None)
        try:
            context = scope["app"].state.agentpost
            if self._context is not context:  # the first request (or another app's store)
                await self._in_store(self._adopt, context)
            token = await self._authenticate(context, authorization)
            charge(self.limiter, token_limit(token, self.token_rate, self.token_burst),
                   what=f"token {token.name}")
            seat = self._known_seat(context, token)
            if seat is None:  # the token's first request (of this endpoint)
                seat = await self._in_store(self._new_seat, context, token)
        except GatewayError as exc:
            await JSONResponse(exc.body(), exc.code, headers=exc.headers())(scope, receive, send)
            return
        manager = await self._manager()
        await manager.handle_request({**scope, SEAT_KEY: seat}, receive, send)

    # ---- the token and its seat ---------------------------------------------------------

    async def _authenticate(self, context: Any, authorization: str | None) -> TokenInfo:
        """The live token of `authorization`: from the store, or, within `token_cache`
        seconds of the store saying so, from memory; 401 without one."""
        secret = bearer(authorization)
        if secret is None:
            raise GatewayError(401, "a token is required: Authorization: Bearer <secret>")
        key = hash_secret(secret)
        now = self.clock()
        known = self._live.get(key)
        if known is not None and now < known[1]:
            return known[0]
        token = await self._in_store(lambda: TokenStore(context.store).authenticate(secret))
        if token is None:
            self._live.pop(key, None)
            raise GatewayError(401, "unknown or revoked token")
        if self.token_cache > 0:
            self._remember(key, token, now + self.token_cache, now)
        return token

    def _remember(self, key: bytes, token: TokenInfo, until: float, now: float) -> None:
        live = self._live
        live.pop(key, None)
        if len(live) >= TOKEN_CACHE_SIZE:
            for old in [k for k, (_, end) in live.items() if end <= now]:
                del live[old]
            while len(live) >= TOKEN_CACHE_SIZE:  # all live: the oldest go
                del live[next(iter(live))]
        live[key] = (token, until)

    @staticmethod
    async def _in_store(fn: Any, *args: Any) -> Any:
        """`fn(*args)` in a thread; a store failure is 503 (the details to the log only)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError as exc:
            log.warning("agentpost MCP: the store failed while authenticating: %s", exc)
            raise GatewayError(503, "the agentpost store is unavailable; try again "
                                    "later") from None

    def _adopt(self, context: Any) -> None:
        """Serve `context`'s store: what was remembered of another's is dropped (in a
        thread: the seats give their envelopes back)."""
        with self._lock:
            if self._context is not context:
                self._forget()
                self._context = context

    def _known_seat(self, context: Any, token: TokenInfo) -> TokenSeat | None:
        """The token's seat if it has one already (no store call: in the loop); 403 for a
        token that acts as no single workspace."""
        if token_workspace(token) is None:
            raise GatewayError(403, f"token {token.name!r} acts as no single workspace: an "
                                    "MCP token needs exactly one senders:<workspace>:send "
                                    "scope naming its workspace")
        with self._lock:
            return self._seats.get(token.id) if self._context is context else None

    def _new_seat(self, context: Any, token: TokenInfo) -> TokenSeat:
        """The token's seat, made on its first request (the workspace checked in the store);
        in a thread."""
        store = context.store
        workspace = token_workspace(token)
        assert workspace is not None  # _known_seat refused the others
        self._adopt(context)
        with self._lock:
            seat = self._seats.get(token.id)
        if seat is not None:
            return seat
        try:
            store.workspace(workspace)
        except NotFound:
            raise GatewayError(403, f"token {token.name!r} names workspace {workspace!r}, "
                                    "which does not exist") from None
        except AgentpostError as exc:
            raise GatewayError(403, f"token {token.name!r}: {exc}") from None
        marks = self._space(context)
        seat = TokenSeat(store, token=token, marks=marks,
                         agent=mark_agent(workspace, self.scopes) if marks is not None else None,
                         run=http_run(token, workspace), lease_ttl=self.lease_ttl)
        with self._lock:
            return self._seats.setdefault(token.id, seat)

    def _space(self, context: Any) -> Any:
        if self.space is None:
            return None
        with self._lock:
            if self._marks is None:
                from agentpost.marks.postgres import PostgresMarkSpace

                self._marks = PostgresMarkSpace(dsn=context.dsn, scopes=self.scopes,
                                                space=self.space)
            return self._marks

    def _forget(self) -> None:
        """Drop every seat (their unacknowledged envelopes back to the inbox), the tokens
        taken as live, and the mark space; the lock is held."""
        seats, self._seats = list(self._seats.values()), {}
        marks, self._marks = self._marks, None
        self._live = {}
        for seat in seats:
            try:
                seat.release()
            except Exception:  # the store may be gone: the leases then simply run out
                log.warning("agentpost MCP: could not return a token's envelopes",
                            exc_info=True)
        if marks is not None:
            marks.close()

    # ---- the SDK's session manager --------------------------------------------------------

    async def _manager(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self._runner is None or self._runner[0] is not loop:
            manager = StreamableHTTPSessionManager(app=self.server, stateless=True,
                                                   json_response=True)
            ready: asyncio.Future[Any] = loop.create_future()
            stop = asyncio.Event()

            async def run() -> None:
                try:
                    async with manager.run():
                        ready.set_result(manager)
                        await stop.wait()
                except BaseException as exc:
                    if not ready.done():
                        ready.set_exception(exc)
                    raise

            self._runner = (loop, loop.create_task(run()), stop, ready)
        return await asyncio.shield(self._runner[3])

    async def close(self) -> None:
        """Stop the session manager (when running in this loop) and drop every seat."""
        runner, self._runner = self._runner, None
        if runner is not None and runner[0] is asyncio.get_running_loop():
            runner[2].set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await runner[1]
        with self._lock:
            await asyncio.to_thread(self._forget)
            self._context = None
