"""Getting a migrated database on whatever Postgres discovery finds (CLI, demo, benchmarks)."""

from __future__ import annotations

import sys
from typing import Any

import psycopg2
from psycopg2 import sql

from agentpost.pg.db import translate
from agentpost.pg.migrations import migrate
from agentpost.pg.server import (
    PostgresServer,
    PostgresUnavailable,
    discover,
    dsn_for_database,
    redact_dsn,
)
from agentpost.protocol.errors import Conflict, StoreUnavailable


def find_server() -> PostgresServer:
    """Discovery, starting the private cluster when needed. A cluster started here is left
    running, and how to stop it goes to stderr."""
    try:
        server = discover()
    except PostgresUnavailable as exc:
        raise StoreUnavailable(f"no Postgres found or started: {exc}") from None
    if server.started_here and server.stop_command:
        print(f"agentpost: started a private Postgres; stop it with: {server.stop_command}",
              file=sys.stderr)
    return server


def create_database(admin_dsn: str, name: str, *, fresh: bool = False) -> str:
    """Create database `name` on the server of `admin_dsn` (dropping it first if `fresh`);
    returns its DSN. A fresh start never drops a database another process is connected to
    (a running demo, its Airflow, a CLI): that is a Conflict, and nothing changes."""
    try:
        conn = psycopg2.connect(admin_dsn)
    except psycopg2.Error as exc:
        raise translate(exc) from None
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            if fresh:
                _drop_unused(cur, admin_dsn, name)
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()
    return dsn_for_database(admin_dsn, name)


def _drop_unused(cur: Any, admin_dsn: str, name: str) -> None:
    """DROP DATABASE without FORCE: Postgres itself refuses while anyone is connected, so
    there is no window between a check and the drop."""
    try:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    except psycopg2.errors.ObjectInUse:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,))
        users = cur.fetchone()[0]
        raise Conflict(
            f"database {name!r} on {redact_dsn(admin_dsn)} is in use ({users} connection(s)): "
            "another demo or process is working on it, and it is not dropped under it; stop "
            "that first, or point this one at another database") from None


def drop_database(admin_dsn: str, name: str) -> None:
    conn = psycopg2.connect(admin_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    finally:
        conn.close()


def ensure_database(name: str, *, fresh: bool = False) -> str:
    """The DSN of a migrated database `name` on the discovered server."""
    dsn = create_database(find_server().dsn, name, fresh=fresh)
    migrate(dsn)
    return dsn
