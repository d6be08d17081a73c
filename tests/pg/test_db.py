"""The store's database layer at its API boundary: whatever fails while a connection is being
made comes out as a typed agentpost error, never a SQLAlchemy or psycopg2 exception."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg2
import psycopg2.extensions
import pytest
from sqlalchemy.exc import SQLAlchemyError

from agentpost.pg.db import Database
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import AgentpostError, InvalidInput, StoreError


@pytest.fixture
def restricted_dsn(dsn: str) -> Iterator[str]:
    """A login role on a database where SQLAlchemy's first-connect check (it asks the
    server's version) is refused: the failure then comes from inside the pool's first
    connect, the path a server lost at that moment takes too."""
    role = f"agentpost_restricted_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(libpq_dsn(dsn))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        cur.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.version() FROM PUBLIC")
    try:
        yield psycopg2.extensions.make_dsn(libpq_dsn(dsn), user=role)
    finally:
        with admin.cursor() as cur:
            cur.execute("GRANT EXECUTE ON FUNCTION pg_catalog.version() TO PUBLIC")
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE usename = %s", (role,))
            cur.execute(f"DROP ROLE {role}")
        admin.close()


def test_a_failed_first_connect_check_is_a_typed_error(restricted_dsn: str) -> None:
    """'No leaked tracebacks or database errors at an API boundary': the pool's first-connect
    check failing (here refused; in the wild, a server cut off at that moment) raises an
    AgentpostError with a one-line message, not SQLAlchemy's DBAPIError."""
    db = Database(restricted_dsn, None)
    try:
        with pytest.raises(AgentpostError) as raised:
            db.scalar("SELECT 1")
        assert not isinstance(raised.value, SQLAlchemyError | psycopg2.Error)
        assert "\n" not in str(raised.value) and "version" in str(raised.value)
    finally:
        db.dispose()


@pytest.mark.parametrize("sql, params", [
    ("SELECT %s", ("a\x00b",)),                    # psycopg2 refuses it before sending
    ("SELECT %s", ("lone \ud800 surrogate",)),     # not encodable as UTF-8
    ("SELECT %s::jsonb", ('{"k": "\\u0000"}',)),   # Postgres refuses it (22P05)
])
def test_text_the_store_cannot_hold_is_invalid_input(dsn: str, sql: str, params: tuple) -> None:
    """Whatever boundary a parameter came through (a page's query string, a CLI argument, an
    operator's field), text Postgres cannot hold is the caller's InvalidInput, never a raw
    ValueError (a 500 at the page) or a StoreError (a 503); the connection stays usable."""
    db = Database(libpq_dsn(dsn), None, pool_size=1)
    try:
        with pytest.raises(InvalidInput, match="text the store cannot hold"):
            db.fetchall(sql, params)
        assert db.scalar("SELECT 1") == 1
    finally:
        db.dispose()


def test_a_transaction_lands_whole_or_not_at_all(dsn: str) -> None:
    """`Database.transaction()`: the calling thread's statements inside the block commit
    together (a nested block joins); raising rolls them all back, and so does a statement
    that failed even if the caller swallowed its error; other threads see nothing until the
    commit, and no pooled connection is left inside a transaction."""
    db = Database(libpq_dsn(dsn), None, pool_size=2)

    def numbers() -> list[int]:
        return [n for (n,) in db.fetchall("SELECT n FROM public.tx_probe ORDER BY n")]

    try:
        db.fetchall("CREATE TABLE public.tx_probe (n int) ; SELECT 1")
        with db.transaction():
            db.fetchall("INSERT INTO public.tx_probe VALUES (1) RETURNING n")
            with db.transaction():
                db.fetchall("INSERT INTO public.tx_probe VALUES (2) RETURNING n")
            seen: list[list[int]] = []
            outside = threading.Thread(target=lambda: seen.append(numbers()))
            outside.start()
            outside.join()
            assert seen == [[]] and numbers() == [1, 2]
        assert numbers() == [1, 2]
        with pytest.raises(RuntimeError), db.transaction():
            db.fetchall("INSERT INTO public.tx_probe VALUES (3) RETURNING n")
            raise RuntimeError("the caller gave up")
        with pytest.raises(StoreError, match="rolled back"), db.transaction():
            db.fetchall("INSERT INTO public.tx_probe VALUES (4) RETURNING n")
            with pytest.raises(StoreError):
                db.fetchall("SELECT 1 / 0")
        assert numbers() == [1, 2]
        assert db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                         " current_database() AND state IN ('idle in transaction',"
                         " 'idle in transaction (aborted)')") == 0
    finally:
        db.dispose()
