"""What the gateway's routes and WebSocket sessions share: configuration, authentication,
rate limits, the LISTEN hub, and the names of streams."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentpost.gateway.errors import GatewayError
from agentpost.gateway.hub import InboxHub
from agentpost.gateway.ratelimit import Limit, RateLimiter
from agentpost.gateway.tokens import ALL_SCOPES, TokenInfo, TokenStore
from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.protocol.leases import stream_of, workspace_of
from agentpost.store import EnvelopeStore

T = TypeVar("T")

_MAX_STREAM = 300


@dataclass(frozen=True)
class GatewayConfig:
    """Tunables. Rates are requests per second; None switches that limit off."""

    #: default bucket of a token without its own rate (also the localhost mode's one bucket)
    token_rate: float | None = 50.0
    token_burst: int = 100
    #: bucket of each stream, shared by every token enqueueing to it
    stream_rate: float | None = 200.0
    stream_burst: int = 400
    #: lease time of a delivery over /v1/subscribe when the client names no ttl
    lease_ttl: float = 30.0
    #: a subscriber with credit re-checks its inbox this often without a notification
    poll_interval: float = 1.0
    #: a live view re-reads the whole view this often without a notification
    live_poll_interval: float = 5.0
    #: the LISTEN connection's wait between checks of its own health
    listen_timeout: float = 5.0
    #: credit plus unacknowledged deliveries a subscription may hold
    max_credit: int = 1000
    max_body_bytes: int = 1 << 20
    max_frame_bytes: int = 64 << 10


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header (None when absent)."""
    if authorization is None:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise GatewayError(401, "use Authorization: Bearer <token secret>")
    return secret.strip()


def canonical_stream(value: object) -> tuple[str, str]:
    """(stream name, workspace id) of a stream given as ``agents/<ws>/inbox`` or ``<ws>``."""
    if not isinstance(value, str) or not value:
        raise InvalidInput("name the stream: agents/<workspace>/inbox")
    if len(value) > _MAX_STREAM:
        raise InvalidInput(f"a stream name has at most {_MAX_STREAM} characters")
    workspace = workspace_of(value)
    return stream_of(workspace), workspace


def token_limit(who: TokenInfo, rate: float | None, burst: int) -> Limit | None:
    """The bucket of a token: its own rate and burst (``agentpost token create --rate``),
    else `rate` and `burst` (an endpoint's default); None when neither sets a limit."""
    if who.rate is not None and who.burst is not None:
        return Limit(f"token:{who.id}", who.rate, who.burst)
    if rate is None:
        return None
    return Limit(f"token:{who.id}", rate, burst)


def charge(limiter: RateLimiter, limit: Limit | None, *, what: str) -> None:
    """Take one token of `limit`'s bucket; 429 (with the wait) when it is empty."""
    wait = limiter.acquire(limit)
    if wait > 0:
        raise GatewayError(429, f"rate limit of {what} exceeded; retry later",
                           retry_after=wait)


class Gateway:
    """What the routes and sessions share: the store, the tokens, the limits, the hub."""

    def __init__(self, store: EnvelopeStore, tokens: TokenStore, config: GatewayConfig, *,
                 require_tokens: bool, limiter: RateLimiter, owns_store: bool) -> None:
        self.store = store
        self.tokens = tokens
        self.config = config
        self.require_tokens = require_tokens
        self.limiter = limiter
        self.owns_store = owns_store
        self.hub = InboxHub(store.dsn, wait_timeout=config.listen_timeout)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking store call off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def authenticate(self, authorization: str | None, host: str | None) -> TokenInfo:
        """The caller's token (401 without a live one), charged one request (429 when its
        bucket is empty). Without `require_tokens`, a caller on a loopback address who
        presents no token acts with every scope; a presented token is always checked.

        Every loopback address is this host, so the anonymous caller is one caller with one
        bucket: a bucket per address would give a full one to each of 127.0.0.2, 127.0.0.3..."""
        secret = bearer(authorization)
        if secret is None:
            if self.require_tokens or not is_loopback(host):
                raise GatewayError(401, "a token is required: Authorization: Bearer <secret>")
            who = TokenInfo(id="anonymous@localhost", name="localhost", scopes=ALL_SCOPES)
        else:
            found = await self.call(self.tokens.authenticate, secret)
            if found is None:
                raise GatewayError(401, "unknown or revoked token")
            who = found
        self.limit(self._token_limit(who), what=f"token {who.name}")
        return who

    def _token_limit(self, who: TokenInfo) -> Limit | None:
        return token_limit(who, self.config.token_rate, self.config.token_burst)

    def limit_stream(self, stream: str) -> None:
        if self.config.stream_rate is not None:
            self.limit(Limit(f"stream:{stream}", self.config.stream_rate,
                             self.config.stream_burst), what=f"stream {stream}")

    def limit(self, limit: Limit | None, *, what: str) -> None:
        charge(self.limiter, limit, what=what)

    @staticmethod
    def require(who: TokenInfo, kind: str, resource: str, action: str) -> None:
        if not who.allows(kind, resource, action):
            raise GatewayError(403, f"token {who.name!r} lacks a scope granting "
                                    f"{kind}:{resource}:{action}")

    async def existing_stream(self, value: object) -> tuple[str, str]:
        """A stream that exists (404 otherwise), after its name was checked."""
        stream, workspace = canonical_stream(value)
        try:
            await self.call(self.store.workspace, workspace)
        except NotFound:
            raise GatewayError(404, f"unknown stream {stream!r}") from None
        return stream, workspace

    async def close(self) -> None:
        await self.hub.close()
        if self.owns_store:
            self.store.close()
