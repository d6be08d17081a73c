"""``sql/schema.sql``: the agentpost schema as the migrations leave it, written for people.

The numbered migrations are deltas, and many functions are defined in several of them, so no
one file shows what a store runs. This module migrates an empty database one file at a time,
noting which migration last defined each function, dumps the schema with ``pg_dump`` and
normalises the dump so that it is the same on every run and machine of one PostgreSQL major
version. ``make schema`` (``python -m agentpost.pg.schema_dump``) writes the file;
tests/pg/test_schema_sql.py fails when a fresh migration no longer gives it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg2

from agentpost.pg import bootstrap
from agentpost.pg.migrations import Migration, Source, load, migrate
from agentpost.pg.server import (
    PostgresUnavailable,
    discover,
    find_bindir,
    find_repo_root,
    libpq_dsn,
)

__all__ = [
    "SCHEMA_FILE",
    "Routine",
    "dump",
    "find_pg_dump",
    "generate",
    "main",
    "migrate_tracking",
    "normalise",
    "render",
    "scratch_database",
    "server_major",
]

#: the file's name beside the migrations (not a migration: the runner loads only
#: ``<number>_<name>.sql``)
SCHEMA_FILE = "schema.sql"

# What pg_dump writes that is not the schema, or not the same on every run: its banner, the
# server's and its own full versions, the session settings of a restore, and (since 15.14,
# 16.10 and 17.6) the \restrict line pair with a key drawn at random for each dump.
_VOLATILE = re.compile(
    r"^(?:--\n-- PostgreSQL database dump(?: complete)?\n--"
    r"|\\(?:un)?restrict \S+"
    r"|-- Dumped (?:from database|by pg_dump) version .*"
    r"|SET (?:statement_timeout|lock_timeout|idle_in_transaction_session_timeout"
    r"|transaction_timeout|client_encoding|standard_conforming_strings|check_function_bodies"
    r"|xmloption|client_min_messages|row_security|default_tablespace"
    r"|default_table_access_method) = .*;"
    r"|SELECT pg_catalog\.set_config\('search_path', '', false\);)$",
    re.MULTILINE,
)
# The monthly partitions of the trail, the signals and the envelopes (sql/0086 to 0088):
# which months exist depends on the day the migration ran, so each object of one (its table,
# keys, indexes and their attachments) goes.
_MONTHLY = re.compile(r"^--\n-- Name: [^\n]*\b(?:trail|signals|envelopes)_p\d{6}(?!\d)"
                      r"[^\n]*\n--\n"
                      r".*?(?=^--\n-- Name: |\Z)", re.MULTILINE | re.DOTALL)

# Every routine of the schema with a digest of its whole definition, to see which migration
# changed it. pg_get_functiondef refuses aggregates: theirs is their pg_aggregate row.
_ROUTINES = """
SELECT format('%I.%I(%s)', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid)),
       CASE p.prokind WHEN 'f' THEN 'function' WHEN 'p' THEN 'procedure'
                      WHEN 'a' THEN 'aggregate' ELSE 'window' END,
       md5(CASE WHEN p.prokind = 'a'
                THEN (SELECT a::text FROM pg_aggregate a WHERE a.aggfnoid = p.oid)
                     || pg_get_function_result(p.oid)
                ELSE pg_get_functiondef(p.oid) END)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'agentpost'
"""


@dataclass(frozen=True)
class Routine:
    """A function, procedure or aggregate of the migrated schema."""

    signature: str  # agentpost.name(argument types), as pg_get_function_identity_arguments
    kind: str  # function, procedure, aggregate or window
    defined_in: tuple[str, ...]  # the migrations that created, renamed or changed it

    @property
    def last(self) -> str:
        """The migration whose definition of it is the current one."""
        return self.defined_in[-1]


def generate(dsn: str, source: Source = None) -> str:
    """The text of schema.sql: the migrations of ``source`` applied to the empty database
    at ``dsn``, then dumped, under a header with the table of routines."""
    migrations = load(source)
    routines = migrate_tracking(dsn, migrations)
    return render(migrations, routines, server_major(dsn), dump(dsn))


def migrate_tracking(dsn: str, migrations: Sequence[Migration]) -> list[Routine]:
    """Apply ``migrations`` to the empty database at ``dsn`` one at a time (through
    migrate(), from a directory that gains one file per step), and note after each which
    routines it created, renamed or changed: the database, not a parse of the files, says
    which overload a CREATE OR REPLACE or ALTER ... RENAME TO touched."""
    history: dict[str, list[str]] = {}
    before: dict[str, tuple[str, str]] = {}
    with (tempfile.TemporaryDirectory(prefix="agentpost-schema-") as steps,
          contextlib.closing(psycopg2.connect(libpq_dsn(dsn))) as conn):
        conn.autocommit = True  # no transaction of ours stays open while the files apply
        for migration in migrations:
            # the file's own bytes: migrate() records the checksum of what it applies
            (Path(steps) / migration.name).write_bytes(migration.sql.encode("utf-8"))
            migrate(dsn, source=steps)
            after = _routines(conn)
            for signature, state in after.items():
                if before.get(signature) != state:
                    history.setdefault(signature, []).append(migration.name)
            before = after
    return [Routine(signature, kind, tuple(history[signature]))
            for signature, (kind, _) in sorted(before.items())]


def dump(dsn: str) -> str:
    """The agentpost schema of the database at ``dsn`` as pg_dump prints it, normalised."""
    command = [str(find_pg_dump(server_major(dsn))), "--schema-only", "--schema=agentpost",
               "--no-owner", "--no-privileges", "--encoding=UTF8", f"--dbname={libpq_dsn(dsn)}"]
    proc = subprocess.run(command, capture_output=True, text=True, encoding="utf-8",
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pg_dump failed ({proc.returncode}): {proc.stderr.strip()}")
    return normalise(proc.stdout)


def normalise(text: str) -> str:
    """pg_dump's output without what differs between runs and machines (see _VOLATILE),
    each run of blank lines made one (pg_dump's own two, and the gaps of what went)."""
    text = _VOLATILE.sub("", text)
    text = _MONTHLY.sub("", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def render(migrations: Sequence[Migration], routines: Sequence[Routine], major: int,
           body: str) -> str:
    """The header, with its table of routines, over the normalised dump."""
    latest = migrations[-1].name if migrations else "no migration"
    width = max((len(r.last) for r in routines), default=0)
    lines = [
        f"-- The agentpost schema after every migration (the latest: {latest}),",
        f"-- as pg_dump of PostgreSQL {major} prints it.",
        "--",
        "-- GENERATED by `make schema` (python -m agentpost.pg.schema_dump): never edit it",
        "-- by hand. The numbered files beside it are the migrations, the deltas a store",
        "-- applies once each and that are never edited; this file is their sum, the current",
        "-- truth, to read and to review. Change the schema with a new migration, then run",
        "-- `make schema`: tests/pg/test_schema_sql.py migrates an empty database and fails",
        "-- when the result differs from this file. It is no migration and is never applied",
        "-- (the runner loads only <number>_<name>.sql); a store is made by `agentpost migrate`.",
        "--",
        "-- Every function, procedure and aggregate, by signature, with the migration that last",
        "-- defined it: the last one whose applying created it, renamed another to it or",
        "-- changed its definition; `n` counts the migrations that did one of these.",
        "--",
        f"--   {'last defined in':<{width}}   n  {'kind':<9}  signature",
        *(f"--   {r.last:<{width}}  {len(r.defined_in):>2}  {r.kind:<9}  {r.signature}"
          for r in routines),
    ]
    return "\n".join(lines) + "\n\n" + body


def server_major(dsn: str) -> int:
    """The major version of the server at ``dsn`` (15 for 15.20)."""
    with contextlib.closing(psycopg2.connect(libpq_dsn(dsn))) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int / 10000")
        return cur.fetchone()[0]


def find_pg_dump(major: int) -> Path:
    """A pg_dump of the server's major version: another major prints the same schema
    differently (and an older one refuses a newer server). Looked for beside the server
    binaries discovery uses, then in Debian's directory of that version, then on PATH."""
    candidates: list[Path] = []
    with contextlib.suppress(PostgresUnavailable):
        candidates.append(find_bindir() / "pg_dump")
    candidates.append(Path(f"/usr/lib/postgresql/{major}/bin/pg_dump"))
    on_path = shutil.which("pg_dump")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and _major_of(candidate) == major:
            return candidate
    raise PostgresUnavailable(
        f"no pg_dump of PostgreSQL {major} (the server's version) found; looked at: "
        + ", ".join(str(c) for c in candidates))


def _major_of(pg_dump: Path) -> int | None:
    proc = subprocess.run([str(pg_dump), "--version"], capture_output=True, text=True,
                          check=False)
    found = re.search(r"\) (\d+)", proc.stdout)
    return int(found[1]) if found else None


def _routines(conn) -> dict[str, tuple[str, str]]:
    """Each routine's kind and definition digest, by signature."""
    with conn.cursor() as cur:
        cur.execute(_ROUTINES)
        return {signature: (kind, digest) for signature, kind, digest in cur.fetchall()}


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """The DSN of a new, empty database on the discovered server, dropped afterwards (and a
    private cluster started for it stopped)."""
    server = discover()
    name = f"agentpost_schema_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        yield bootstrap.create_database(server.dsn, name)
    finally:
        with contextlib.suppress(psycopg2.Error):
            bootstrap.drop_database(server.dsn, name)
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``<sql dir>/schema.sql`` from the migrations in that directory."""
    parser = argparse.ArgumentParser(
        prog="python -m agentpost.pg.schema_dump",
        description=f"Regenerate {SCHEMA_FILE} beside the migrations, from a scratch database.")
    parser.add_argument("--sql-dir", type=Path, default=find_repo_root() / "sql",
                        help="the migrations' directory, where the file goes "
                             "(default: %(default)s)")
    sql_dir = parser.parse_args(argv).sql_dir
    with scratch_database() as dsn:
        text = generate(dsn, sql_dir)
    target = sql_dir / SCHEMA_FILE
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
