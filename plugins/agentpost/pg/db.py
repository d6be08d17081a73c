"""Connections to the store's database, and the translation of its errors.

A small SQLAlchemy pool of psycopg2 connections in autocommit mode: every protocol step is a
server-side function or procedure that owns its transaction(s), so the client never holds one
open. Each new connection gets the trail key's HMAC pads as session settings.

The one exception is `Database.transaction()`, for a change made of several steps that must
land whole or not at all (a fleet apply): the steps that are functions run on one connection
pinned to the calling thread, inside one transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg2
import psycopg2.extensions
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


@contextmanager
def _translated() -> Iterator[None]:
    """Database errors (and parameters psycopg2 refused to send) raised in the block, as
    agentpost's typed errors."""
    try:
        yield
    except psycopg2.Error as exc:
        raise translate(exc) from None
    except ValueError as exc:  # refused client-side: nothing was sent
        raise _refused(exc) from None


def _refused(exc: ValueError) -> Exception:
    """InvalidInput for a parameter psycopg2 refused before sending it, because Postgres
    text cannot hold it (a NUL byte, or a str with a lone surrogate); any other ValueError
    as it is. Every caller's parameters pass here, so none of them is a 500 or a traceback,
    whichever boundary it came through."""
    if isinstance(exc, UnicodeEncodeError):
        return InvalidInput(f"text the store cannot hold: not valid Unicode ({exc.reason})")
    if "NUL (0x00)" in str(exc):
        return InvalidInput("text the store cannot hold: a NUL byte (0x00)")
    return exc


class _Pinned(threading.local):
    """The calling thread's open `Database.transaction()` connection, if any."""

    conn: Any = None


class Database:
    """Pooled access to one Postgres database."""

    def __init__(self, dsn: str, trail_key: bytes | None, *, pool_size: int = 4) -> None:
        """``trail_key`` None: sessions that never sign trail entries (the mark space); a
        trail write on them fails for want of the key instead of signing with a wrong one."""
        self.dsn = dsn
        self._pinned = _Pinned()
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
        """A cursor on a pooled connection (on this thread's `transaction()` connection while
        one is open); database errors come out translated, and a connection that broke is
        dropped from the pool."""
        if self._pinned.conn is not None:
            with self._pinned.conn.cursor() as cur, _translated():
                yield cur
            return
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
            raise _refused(exc) from None
        finally:
            if broken or fairy.driver_connection.closed:
                fairy.invalidate()
            fairy.close()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One transaction for the block: every statement this thread runs through this
        Database inside it (the store's steps that are functions: defining roles and types,
        creating workspaces, sending) runs on one connection, and the lot commits when the
        block ends, or rolls back if it raises or a statement in it failed. Nested, it joins
        the open one. Yields the psycopg2 connection, for a component with a pool of its own
        on the same database to join (`PostgresMarkSpace.joined`). Procedures that commit
        themselves (CALL ...) cannot run inside."""
        if self._pinned.conn is not None:
            yield self._pinned.conn
            return
        with self.cursor() as cur:
            conn = cur.connection
            cur.execute("BEGIN")
            self._pinned.conn = conn
            try:
                yield conn
            except BaseException:
                self._pinned.conn = None
                with suppress(psycopg2.Error):  # a lost connection rolls back by itself
                    cur.execute("ROLLBACK")
                raise
            finally:
                self._pinned.conn = None
            status = conn.info.transaction_status
            if status == psycopg2.extensions.TRANSACTION_STATUS_INERROR:
                cur.execute("ROLLBACK")
                raise StoreError("a statement inside the transaction failed: it was rolled "
                                 "back, nothing of it was written")
            cur.execute("COMMIT")

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
