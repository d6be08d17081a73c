"""One error shape for HTTP bodies and WebSocket frames (Courier §7.2, §11):
``{"error": {"code": <HTTP status>, "message": "..."}}``.

agentpost's typed errors map onto HTTP statuses; anything else is a 5xx whose details go to
the gateway's log only, so no traceback or database message ever reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from agentpost.gateway.ratelimit import retry_after_header
from agentpost.protocol.errors import (
    AgentpostError,
    ConfigurationError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger("agentpost.gateway")

#: first match wins (LeaseLost and friends are Conflicts)
_STATUS: tuple[tuple[type[AgentpostError], int], ...] = (
    (InvalidInput, 400),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (StoreUnavailable, 503),
    (ConfigurationError, 500),
    (StoreError, 503),
)
_SERVER_MESSAGES = {
    500: "the gateway failed; see its log",
    503: "the store is unavailable; try again later",
}


class GatewayError(Exception):
    """An error to report to the client: HTTP status `code`, a message for a person, and for
    429 the seconds to wait."""

    def __init__(self, code: int, message: str, *, retry_after: float | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, **self.extra}
        if self.retry_after is not None:
            error["retry_after"] = round(self.retry_after, 3)
        return {"error": error}

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = retry_after_header(self.retry_after)
        if self.code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    @property
    def close_code(self) -> int:
        """The WebSocket close code for an error that ends a session: 4000 + the status."""
        return 4000 + self.code


def status_of(exc: AgentpostError, default: int = 500) -> int:
    """The HTTP status of an agentpost error (the first kind of `_STATUS` it is), `default`
    when it is none of them. The agentpost page maps its errors with this too."""
    return next((status for kind, status in _STATUS if isinstance(exc, kind)), default)


def from_exception(exc: BaseException) -> GatewayError:
    """The client-facing form of any exception raised while serving a request."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, AgentpostError):
        code = status_of(exc)
        if code < 500:
            return GatewayError(code, str(exc) or type(exc).__name__)
        log.warning("store error: %s", exc)
        return GatewayError(code, _SERVER_MESSAGES[code])
    log.error("unexpected error in the gateway", exc_info=exc)
    return GatewayError(500, _SERVER_MESSAGES[500])
