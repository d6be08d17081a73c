"""WAL written by a benchmark cell, two ways.

- The server's: `pg_wal_lsn_diff` of `pg_current_wal_lsn()` after and before. Cheap, but the
  LSN is the whole server's: another session writing meanwhile (a test suite creating
  databases, autovacuum elsewhere) is counted too.
- The system's own, when the contrib extension pg_walinspect can be created: the WAL records
  between the two LSNs that touch a relation of the system's database (their block
  references name its OID), plus every other record of the same transactions (their commit
  records). It is installed in a scratch database of its own, dropped at the end; its
  functions read the server's WAL whatever database they live in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors

from agentpost.pg.bootstrap import create_database, drop_database
from agentpost.pg.server import libpq_dsn

FLUSH_PATIENCE = 5.0  # seconds to wait for asynchronous commits to reach the flushed WAL

ATTRIBUTED = """
WITH r AS (
    SELECT xid::text AS xid, record_length, fpi_length, block_ref ~ %(mine)s AS mine
    FROM pg_get_wal_records_info(%(start)s, %(end)s))
SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r
WHERE mine OR (xid <> '0' AND xid IN (SELECT xid FROM r WHERE mine))
"""


@dataclass(frozen=True)
class Wal:
    """One cell's WAL in bytes: the server's LSN diff; the system's own records and the
    full-page images among them (None without pg_walinspect). A page's first change after a
    checkpoint is logged whole, so a cell a checkpoint falls into writes more."""

    server: float
    own: float | None = None
    fpi: float | None = None

    def record(self, out: Any, name: str, what: str, count: int) -> None:
        out.add(name, f"wal {what}", self.server / count)
        if self.own is not None and self.fpi is not None:
            out.add(name, f"wal {what} own", self.own / count)
            out.add(name, f"wal {what} fpi", self.fpi / count)


class WalMeter:
    """The LSN before a cell, and what was written since; close() drops its database."""

    def __init__(self, admin_dsn: str, databases: dict[str, str]) -> None:
        self.admin_dsn = libpq_dsn(admin_dsn)
        self.db = f"agentpost_bench_peers_wal_{os.getpid()}"
        self.conn = psycopg2.connect(create_database(self.admin_dsn, self.db, fresh=True))
        self.conn.autocommit = True
        self.inspect = self._create_extension()
        self.oids = {name: self._oid(dsn) for name, dsn in databases.items()}

    def _create_extension(self) -> bool:
        try:
            with self.conn.cursor() as cur:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            return True
        except psycopg2.Error:
            return False

    @staticmethod
    def _oid(dsn: str) -> int:
        conn = psycopg2.connect(libpq_dsn(dsn))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def _one(self, query: str, params: dict[str, Any] | None = None) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchone()[0]

    def mark(self) -> str:
        return str(self._one("SELECT pg_current_wal_lsn()"))

    def since(self, start: str, name: str | None) -> Wal:
        """The WAL since `start`; the own records of system `name` too (when given and
        pg_walinspect is there, and the segments are still on disk: a checkpoint during
        a busy cell may have recycled them, and then that cell has no own figure)."""
        end = str(self._one("SELECT pg_current_wal_lsn()"))
        server = float(self._one("SELECT pg_wal_lsn_diff(%(end)s, %(start)s)",
                                 {"end": end, "start": start}))
        if name is None or not self.inspect:
            return Wal(server)
        deadline = time.monotonic() + FLUSH_PATIENCE
        while not self._one("SELECT pg_current_wal_flush_lsn() >= %(end)s::pg_lsn",
                            {"end": end}) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            with self.conn.cursor() as cur:
                cur.execute(ATTRIBUTED, {"start": start, "end": end,
                                         "mine": rf"rel \d+/{self.oids[name]}/"})
                own, fpi = cur.fetchone()
        except psycopg2.errors.UndefinedFile:  # "requested WAL segment ... removed"
            return Wal(server)
        return Wal(server, float(own), float(fpi))

    def setting(self, name: str) -> str:
        """A server setting, for the report (server_version, autovacuum)."""
        return str(self._one("SELECT current_setting(%(name)s)", {"name": name}))

    def close(self) -> None:
        self.conn.close()
        drop_database(self.admin_dsn, self.db)
