"""Getting a migrated database on whatever Postgres discovery finds (CLI, demo, benchmarks)."""

from __future__ import annotations

import sys

import psycopg2
from psycopg2 import sql

from agentpost.protocol.errors import StoreUnavailable
from agentpost.store.db import translate
from agentpost.store.migrations import migrate
from agentpost.store.server import PostgresServer, PostgresUnavailable, discover, dsn_for_database


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
    returns its DSN."""
    try:
        conn = psycopg2.connect(admin_dsn)
    except psycopg2.Error as exc:
        raise translate(exc) from None
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            if fresh:
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()
    return dsn_for_database(admin_dsn, name)


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
