"""Plain psycopg2 access for tests that look at the store's tables from the outside."""

from __future__ import annotations

from typing import Any

import psycopg2

from agentpost.store.server import libpq_dsn


def connect(dsn: str, application_name: str = "agentpost-tests") -> Any:
    """An autocommit connection (named apart from the store's `agentpost` sessions, which
    some tests terminate)."""
    conn = psycopg2.connect(libpq_dsn(dsn), application_name=application_name)
    conn.autocommit = True
    return conn


def rows(conn: Any, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Run one statement; its rows, or [] when it returns none."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def query(dsn: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own."""
    conn = connect(dsn)
    try:
        return rows(conn, sql, params)
    finally:
        conn.close()
