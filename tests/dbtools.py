"""Plain psycopg2 access for tests that look at the store's tables from the outside, and the
throwaway databases of tests/conftest.py's fixtures (here, not in conftest.py: test modules
import them, and `import conftest` is ambiguous once test folders have conftest.py files of
their own)."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg2
from psycopg2 import sql

from agentpost.pg.server import PostgresServer, dsn_for_database, libpq_dsn


def connect(dsn: str, application_name: str = "agentpost-tests") -> Any:
    """An autocommit connection (named apart from the store's `agentpost` sessions, which
    some tests terminate)."""
    conn = psycopg2.connect(libpq_dsn(dsn), application_name=application_name)
    conn.autocommit = True
    return conn


@contextmanager
def inbox_held(dsn: str, workspace_id: str) -> Iterator[Any]:
    """Another consumer in the middle of a lease or ack of `workspace_id`'s inbox: a
    transaction holding the inbox's chain key shared (sql/0083), open until the block ends.
    The store's own leases and acks meanwhile write on a consumer lane; whatever takes the
    chain exclusively (a delivery, a blocking envelope's ack) waits."""
    conn = psycopg2.connect(libpq_dsn(dsn), application_name="agentpost-tests")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT agentpost._lock_inbox_shared(%s)", (workspace_id,))
        yield conn
    finally:
        conn.rollback()
        conn.close()


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


def all_rows(dsn: str) -> dict[str, list[str]]:
    """Every row of every table of the agentpost schema (each as its text form, sorted), by
    table: the store's whole state, to compare before and after a step that must change
    nothing."""
    conn = connect(dsn)
    try:
        tables = [t for (t,) in rows(conn, "SELECT tablename FROM pg_tables"
                                           " WHERE schemaname = 'agentpost' ORDER BY 1")]
        return {t: sorted(r for (r,) in rows(conn, f'SELECT x::text FROM agentpost."{t}" x'))
                for t in tables}
    finally:
        conn.close()


# --------------------------------------------------------------------------- plans


class Plans:
    """auto_explain on one pooled session (`cursor` opens a cursor on it: give the store a
    pool of one): the JSON plan of every statement the store's calls execute, nested ones
    included, as the store issues them (generic plans, real parameters). With `analyze`,
    each node also says how often it ran and how many rows it gave (no timing)."""

    def __init__(self, cursor: Callable[[], AbstractContextManager[Any]],
                 analyze: bool = False) -> None:
        self.notices: list[str] = []
        with cursor() as cur:
            cur.connection.notices = self.notices
            cur.execute("LOAD 'auto_explain'")
            cur.execute("SET auto_explain.log_min_duration = 0;"
                        " SET auto_explain.log_nested_statements = on;"
                        " SET auto_explain.log_format = 'json';"
                        " SET auto_explain.log_level = 'notice';"
                        " SET auto_explain.log_timing = off;"
                        f" SET auto_explain.log_analyze = {'on' if analyze else 'off'}")

    def of(self, call: Callable[[], Any]) -> tuple[Any, list[dict[str, Any]]]:
        """What `call` returned, and the plans of the statements it executed."""
        self.notices.clear()
        result = call()
        plans = []
        for notice in self.notices:
            text = notice.split("plan:", 1)[1] if "plan:" in notice else ""
            if text.strip():
                plans.append(json.loads(text))
        return result, plans


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A plan node and all nodes under it, subplans included, depth first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


def table_reads(plans: list[dict[str, Any]], table: str,
                roots: Mapping[str, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(statement, node type, index, condition) for every read of agentpost.`table`: its
    sequential scans (the table or partition scanned in place of the condition) and its
    scans of an index named after it. With `roots` (`partition_roots`)
    a partition's scan counts as its table's and a partition's index is named by the
    partitioned index it belongs to."""
    roots = roots or {}
    found = []
    for entry in plans:
        query = " ".join(entry["Query Text"].split())[:160]
        for node in plan_nodes(entry["Plan"]):
            index = roots.get(node.get("Index Name", ""), node.get("Index Name", ""))
            relation = roots.get(node.get("Relation Name", ""), node.get("Relation Name"))
            if relation == table and node["Node Type"] == "Seq Scan":
                found.append((query, "Seq Scan", "", node.get("Relation Name", "")))
            elif index.startswith(table):
                found.append((query, node["Node Type"], index, node.get("Index Cond", "")))
    return found


def partition_roots(conn: Any) -> dict[str, str]:
    """Every partition of an agentpost table, and every index of one, by name: the name of
    the partitioned table or index it belongs to (a partition's own primary key, which no
    parent index holds, is named `<table>_pkey`)."""
    found = rows(conn, """
        SELECT c.relname, r.relname, c.relkind
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
         WHERE n.nspname = 'agentpost' AND r.oid <> c.oid""")
    out = {name: root for name, root, _kind in found}
    keys = rows(conn, """
        SELECT i.relname, r.relname
          FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
          JOIN pg_class t ON t.oid = x.indrelid
          JOIN pg_class r ON r.oid = pg_partition_root(t.oid)
          JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = 'agentpost' AND x.indisprimary AND r.oid <> t.oid""")
    out.update({index: f"{root}_pkey" for index, root in keys})
    return out


def unique_db_name(kind: str) -> str:
    return f"agentpost_{kind}_{os.getpid()}_{secrets.token_hex(4)}"


def _admin(admin_dsn: str):
    conn = psycopg2.connect(libpq_dsn(admin_dsn))
    conn.autocommit = True
    return conn


def create_database(admin_dsn: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (from ``template`` if given) and return its DSN."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    conn = _admin(admin_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()
    return dsn_for_database(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` after terminating the connections still open to it."""
    conn = _admin(admin_dsn)
    try:
        with conn.cursor() as cur:
            for attempt in range(20):
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                try:
                    cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
                    return
                except psycopg2.errors.ObjectInUse:
                    # a terminated backend can linger for a moment, or a new one sneaked in
                    if attempt == 19:
                        raise
                    time.sleep(0.1)
    finally:
        conn.close()


def fresh_database(server: PostgresServer, kind: str, template: str | None = None
                   ) -> Iterator[str]:
    """The DSN of a new database (named after `kind`), empty or a copy of `template`,
    dropped afterwards."""
    name = unique_db_name(kind)
    dsn = create_database(server.dsn, name, template=template)
    try:
        yield dsn
    finally:
        drop_database(server.dsn, name)
