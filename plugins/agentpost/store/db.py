"""Connections to the store's database, and the translation of its errors.

A small SQLAlchemy pool of psycopg2 connections in autocommit mode: every protocol step is a
server-side function or procedure that owns its transaction(s), so the client never holds one
open. Each new connection gets the trail key's HMAC pads as session settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg2
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool

from agentpost.protocol.errors import (
    AgentpostError,
    ConfigurationError,
    Conflict,
    Forbidden,
    InboxBlocked,
    InvalidInput,
    InvalidTransition,
    LeaseLost,
    NotFound,
    StoreError,
    StoreUnavailable,
)
from agentpost.protocol.trail import key_pads

_ERRORS: dict[str, type[AgentpostError]] = {
    "AP400": InvalidInput,
    "AP403": Forbidden,
    "AP404": NotFound,
    "AP409": Conflict,
    "APT09": InvalidTransition,
    "APB09": InboxBlocked,
    "APL09": LeaseLost,
    "AP500": ConfigurationError,
}


def one_line(text: str, limit: int = 300) -> str:
    """A message on one line and of bounded length, whatever values it quotes."""
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def translate(exc: psycopg2.Error) -> AgentpostError:
    """A typed agentpost error for a database error, with a message fit for a person."""
    code = getattr(exc, "pgcode", None)
    diag = getattr(exc, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(exc).strip()
    message = one_line(message)
    if code in _ERRORS:
        return _ERRORS[code](message)
    if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError) and code is None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "connection lost"
        if "FATAL:" in first:  # the server answered and said no (login, database, limits)
            return StoreUnavailable(f"the agentpost store refused the connection: "
                                    f"{one_line(first)}")
        return StoreUnavailable(f"cannot reach the agentpost store: {first}")
    if code == "3F000" or code == "42P01":
        return ConfigurationError("the agentpost schema is missing: run `agentpost migrate`")
    if code == "22P05":  # untranslatable_character: a \u0000 in jsonb, say
        return InvalidInput(f"text the store cannot hold: {message}")
    return StoreError(f"the agentpost store failed ({code or 'no code'}): {message}")


def unstorable(exc: ValueError) -> InvalidInput | None:
    """InvalidInput for a parameter psycopg2 refused before sending it, because Postgres
    text cannot hold it (a NUL byte, or a str with a lone surrogate); None for any other
    ValueError. Every caller's parameters pass here, so none of them is a 500 or a
    traceback, whichever boundary it came through."""
    if isinstance(exc, UnicodeEncodeError):
        return InvalidInput(f"text the store cannot hold: not valid Unicode ({exc.reason})")
    if "NUL (0x00)" in str(exc):
        return InvalidInput("text the store cannot hold: a NUL byte (0x00)")
    return None


class Database:
    """Pooled access to one Postgres database."""

    def __init__(self, dsn: str, trail_key: bytes | None, *, pool_size: int = 4) -> None:
        """``trail_key`` None: sessions that never sign trail entries (the mark space); a
        trail write on them fails for want of the key instead of signing with a wrong one."""
        self.dsn = dsn
        self._pads = None if trail_key is None else tuple(p.hex() for p in key_pads(trail_key))
        self._engine = create_engine(
            "postgresql+psycopg2://", creator=self._connect, poolclass=QueuePool,
            pool_size=pool_size, max_overflow=16, pool_reset_on_return=None)

    def _connect(self) -> Any:
        try:
            conn = psycopg2.connect(self.dsn, application_name="agentpost")
        except psycopg2.Error as exc:
            raise translate(exc) from None
        conn.autocommit = True
        # The server-side steps run the same short statements over and over with different
        # parameters: generic plans, planned once per session, beat re-planning each call,
        # and compiling them (JIT) never pays off.
        pads = ("" if self._pads is None else
                "set_config('agentpost.mac_ipad', %s, false),"
                " set_config('agentpost.mac_opad', %s, false),")
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {pads}"
                            " set_config('plan_cache_mode', 'force_generic_plan', false),"
                            " set_config('jit', 'off', false)",
                            self._pads or ())
        except psycopg2.Error as exc:  # the new connection was cut while being set up
            conn.close()
            raise translate(exc) from None
        return conn

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        """A cursor on a pooled connection; database errors come out translated, and a
        connection that broke is dropped from the pool."""
        try:
            fairy = self._engine.raw_connection()
        except AgentpostError:
            raise
        except psycopg2.Error as exc:
            raise translate(exc) from None
        except DBAPIError as exc:  # SQLAlchemy's first-connect checks, cut by a lost server
            if isinstance(exc.orig, psycopg2.Error):
                raise translate(exc.orig) from None
            raise
        broken = False
        try:
            with fairy.driver_connection.cursor() as cur:
                yield cur
        except psycopg2.Error as exc:
            broken = fairy.driver_connection.closed != 0 or isinstance(
                exc, psycopg2.OperationalError | psycopg2.InterfaceError)
            raise translate(exc) from None
        except ValueError as exc:  # refused client-side: nothing was sent
            refused = unstorable(exc)
            if refused is None:
                raise
            raise refused from None
        finally:
            if broken:
                fairy.invalidate()
            fairy.close()

    def fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        with self.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def fetchone(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        with self.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()

    def scalar(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        row = self.fetchone(sql, params)
        return None if row is None else row[0]

    def dispose(self) -> None:
        self._engine.dispose()
