"""Capability tokens of the gateway (Courier §12).

A token is a random secret shown once, when it is created; the store keeps only its SHA-256
hash (`agentpost.gateway_tokens`, sql/0006_gateway.sql), so reading the table never yields a
usable secret. The secrets carry 256 random bits, so a fast hash is enough: there is nothing
to brute-force, unlike a password.

A scope is ``<kind>:<pattern>:<action>``:

- ``streams:<pattern>:enqueue`` / ``streams:<pattern>:subscribe``, the pattern matched against
  the canonical stream name ``agents/<workspace>/inbox``;
- ``views:<pattern>:read``, matched against the view name (``latestPerAgent``);
- ``stats:<pattern>:read``, matched against the stream name.

Patterns are shell-style (`fnmatch`, case-sensitive); ``*`` also matches ``/``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentpost.protocol.errors import ConfigurationError, InvalidInput, NotFound
from agentpost.store.checks import name as _name

#: what each kind of scope can grant
ACTIONS: dict[str, frozenset[str]] = {
    "streams": frozenset({"enqueue", "subscribe"}),
    # whom an enqueue may name in `from`: a workspace id, or human:<user>
    "senders": frozenset({"send"}),
    "views": frozenset({"read"}),
    "stats": frozenset({"read"}),
}
#: every right there is (what the localhost mode grants)
ALL_SCOPES = ("streams:*:enqueue", "senders:*:send", "streams:*:subscribe", "views:*:read",
              "stats:*:read")

SECRET_PREFIX = "apgw_"
MAX_SCOPES = 50
MAX_SCOPE_LENGTH = 200
_PATTERN = re.compile(r"^[!-~]+$")  # printable ASCII, no spaces
_SECRET = re.compile(r"^[!-~]{16,200}$")
_ID = re.compile(r"^tok_[0-9a-f]{12}$")


@dataclass(frozen=True)
class Scope:
    kind: str
    pattern: str
    action: str

    @classmethod
    def parse(cls, text: object) -> Scope:
        """A scope from ``kind:pattern:action``; anything else is invalid input."""
        if not isinstance(text, str) or not 0 < len(text) <= MAX_SCOPE_LENGTH:
            raise InvalidInput(f"a scope is kind:pattern:action of at most "
                               f"{MAX_SCOPE_LENGTH} characters")
        kind, _, rest = text.partition(":")
        pattern, _, action = rest.rpartition(":")
        if kind not in ACTIONS:
            raise InvalidInput(f"unknown scope kind in {text!r}: use one of "
                               f"{', '.join(sorted(ACTIONS))}")
        if action not in ACTIONS[kind]:
            raise InvalidInput(f"unknown action in {text!r}: {kind} scopes allow "
                               f"{', '.join(sorted(ACTIONS[kind]))}")
        if not _PATTERN.match(pattern):
            raise InvalidInput(f"scope {text!r} needs a pattern of printable characters")
        return cls(kind, pattern, action)

    def allows(self, kind: str, resource: str, action: str) -> bool:
        return (kind == self.kind and action == self.action
                and fnmatch.fnmatchcase(resource, self.pattern))

    def __str__(self) -> str:
        return f"{self.kind}:{self.pattern}:{self.action}"


@dataclass(frozen=True)
class TokenInfo:
    """A token as stored, without its secret. `rate`/`burst` override the gateway's default
    per-token limit when set."""

    id: str
    name: str
    scopes: tuple[str, ...]
    rate: float | None = None
    burst: int | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    _parsed: tuple[Scope, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._parsed:
            object.__setattr__(self, "_parsed", tuple(Scope.parse(s) for s in self.scopes))

    def allows(self, kind: str, resource: str, action: str) -> bool:
        return any(scope.allows(kind, resource, action) for scope in self._parsed)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "scopes": list(self.scopes),
                "rate": self.rate, "burst": self.burst,
                "created_at": self.created_at.isoformat() if self.created_at else None,
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None}


def hash_secret(secret: str) -> bytes:
    """What the table stores instead of the secret."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def check_scopes(scopes: Iterable[object]) -> tuple[str, ...]:
    """The scopes, each parsed once to refuse bad ones at creation rather than at use."""
    if isinstance(scopes, str | bytes):
        raise InvalidInput("scopes must be a list")
    listed = list(scopes)
    if not listed:
        raise InvalidInput("a token needs at least one scope")
    if len(listed) > MAX_SCOPES:
        raise InvalidInput(f"at most {MAX_SCOPES} scopes per token")
    return tuple(dict.fromkeys(str(Scope.parse(s)) for s in listed))


def check_rate(rate: object, burst: object) -> tuple[float | None, int | None]:
    """(rate, burst) of a token's own limit; a rate alone gets a burst of one second's worth."""
    if rate is None:
        if burst is not None:
            raise InvalidInput("a burst needs a rate")
        return None, None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not (
            math.isfinite(rate) and 0 < rate <= 1e6):
        raise InvalidInput("rate must be a positive number of requests per second")
    if burst is None:
        burst = max(1, math.ceil(rate))
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
        raise InvalidInput("burst must be a whole number of requests, at least 1")
    return float(rate), burst


_COLUMNS = "id, name, scopes, rate, burst, created_at, revoked_at"


def _info(row: Sequence[Any]) -> TokenInfo:
    tid, name, scopes, rate, burst, created_at, revoked_at = row
    return TokenInfo(id=tid, name=name, scopes=tuple(scopes), rate=rate, burst=burst,
                     created_at=created_at, revoked_at=revoked_at)


class TokenStore:
    """The gateway's tokens, in the store's database (through the store's connection pool).

    Built from an `EnvelopeStore` (or anything with its `db`). Creating and revoking tokens
    is for operators (the CLI); the gateway only calls `authenticate`.
    """

    def __init__(self, store: Any) -> None:
        self.db = getattr(store, "db", store)

    def create(self, name: str, scopes: Iterable[str], *, rate: float | None = None,
               burst: int | None = None) -> tuple[TokenInfo, str]:
        """A new token and its secret. The secret is not stored and cannot be shown again."""
        checked_name = _name(name, "token name")
        checked = check_scopes(scopes)
        rate, burst = check_rate(rate, burst)
        secret = new_secret()
        row = self.db.fetchone(
            f"INSERT INTO agentpost.gateway_tokens (id, name, secret_hash, scopes, rate, burst)"
            f" VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
            ("tok_" + secrets.token_hex(6), checked_name, hash_secret(secret), list(checked),
             rate, burst))
        return _info(row), secret

    def tokens(self, *, include_revoked: bool = True) -> list[TokenInfo]:
        """Every token, oldest first (never their secrets)."""
        rows = self.db.fetchall(
            f"SELECT {_COLUMNS} FROM agentpost.gateway_tokens"
            " WHERE %s OR revoked_at IS NULL ORDER BY created_at, id", (include_revoked,))
        return [_info(r) for r in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke a token (for good; revoking it again changes nothing)."""
        if not isinstance(token_id, str) or not _ID.match(token_id):
            raise NotFound(f"no gateway token {str(token_id)[:40]!r}")
        row = self.db.fetchone(
            "UPDATE agentpost.gateway_tokens SET revoked_at = coalesce(revoked_at, now())"
            f" WHERE id = %s RETURNING {_COLUMNS}", (token_id,))
        if row is None:
            raise NotFound(f"no gateway token {token_id!r}")
        return _info(row)

    def authenticate(self, secret: object) -> TokenInfo | None:
        """The live token whose secret this is, or None (unknown, revoked, malformed)."""
        if not isinstance(secret, str) or not _SECRET.match(secret):
            return None
        row = self.db.fetchone(
            f"SELECT {_COLUMNS} FROM agentpost.gateway_tokens"
            " WHERE secret_hash = %s AND revoked_at IS NULL", (hash_secret(secret),))
        return None if row is None else _info(row)

    def check(self) -> None:
        """Raise ConfigurationError when the token table is missing (not migrated)."""
        if not self.db.scalar("SELECT to_regclass('agentpost.gateway_tokens') IS NOT NULL"):
            raise ConfigurationError("the gateway token table is missing: run "
                                     "`agentpost migrate`")
