"""A primary and its streaming standby on loopback, for tests: a private cluster (initdb, trust,
a free port), a standby of it made by ``pg_basebackup -R`` on another free port, both stopped
(``pg_ctl stop -m fast``) when the block ends, whatever happened in it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2

from agentpost.pg.server import (
    LOCAL_HOST,
    PostgresServer,
    _as_user,
    _cluster_user,
    _free_port,
    _private_cluster,
    _run,
    _wait_until_answers,
    find_bindir,
)


@dataclass
class Pair:
    primary: PostgresServer
    standby_dsn: str  #: the standby's postgres database (an admin DSN, as the primary's)
    standby_port: int
    standby_data: Path

    def database(self, name: str) -> tuple[str, str]:
        """A new, migrated database `name` on the primary; its DSN there and on the
        standby."""
        from agentpost.pg.migrations import migrate
        from agentpost.pg.server import dsn_for_database

        admin = psycopg2.connect(self.primary.dsn)
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {name}")
        finally:
            admin.close()
        primary = dsn_for_database(self.primary.dsn, name)
        migrate(primary)
        return primary, dsn_for_database(self.standby_dsn, name)

    def replay(self, run: bool) -> None:
        """Pause (False) or resume (True) the standby's replay of what it receives."""
        conn = psycopg2.connect(self.standby_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_wal_replay_resume()" if run
                            else "SELECT pg_wal_replay_pause()")
        finally:
            conn.close()

    def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until the standby has replayed everything the primary wrote so far (to the
        WAL insert position: an asynchronous commit, as agentpost's acks are by default, is
        not yet written when it returns)."""
        with psycopg2.connect(self.primary.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()")
            (target,) = cur.fetchone()
        conn.close()
        deadline = time.monotonic() + timeout
        while True:
            standby = psycopg2.connect(self.standby_dsn)
            try:
                with standby.cursor() as cur:
                    cur.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
                    if cur.fetchone()[0]:
                        return
            finally:
                standby.close()
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not catch up")
            time.sleep(0.1)


@contextmanager
def primary_and_standby() -> Iterator[Pair]:
    base = Path(tempfile.mkdtemp(prefix="agentpost-standby-"))
    run_as = _cluster_user()
    if run_as:  # root: the clusters belong to the postgres user, who must reach them
        shutil.chown(base, run_as, run_as)
    bindir = find_bindir()
    primary = _private_cluster(base / "primary", start=True)
    standby_data = base / "standby" / "data"
    started = False
    try:
        (base / "standby").mkdir()
        run_dir = base / "primary" / "run"
        if run_as:
            shutil.chown(base / "standby", run_as, run_as)
            (base / "standby").chmod(0o700)
        port = int(primary.dsn.rsplit(":", 1)[1].split("/")[0])
        _run(_as_user(run_as, [str(bindir / "pg_basebackup"), "-h", LOCAL_HOST, "-p", str(port),
                               "-U", "postgres", "-D", str(standby_data), "-R",
                               "--wal-method=stream", "--no-sync"]))
        standby_port = _free_port()
        _run(_as_user(run_as, [
            str(bindir / "pg_ctl"), "start", "-D", str(standby_data), "-w", "-t", "60",
            "-l", str(base / "standby" / "postgres.log"),
            "-o", f"-c listen_addresses={LOCAL_HOST} -p {standby_port} -k {run_dir}"]))
        started = True
        dsn = f"postgresql://postgres@{LOCAL_HOST}:{standby_port}/postgres"
        if not _wait_until_answers(dsn, timeout=60):
            raise RuntimeError("the standby does not answer")
        yield Pair(primary=primary, standby_dsn=dsn, standby_port=standby_port,
                   standby_data=standby_data)
    finally:
        if started:
            subprocess.run(_as_user(run_as, [str(bindir / "pg_ctl"), "stop", "-D",
                                             str(standby_data), "-m", "fast", "-w"]),
                           capture_output=True, check=False, cwd="/")
        primary.stop()
        shutil.rmtree(base, ignore_errors=True)
