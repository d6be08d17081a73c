"""Apply the numbered SQL migrations of the ``agentpost.sql`` package.

A migration is a file named ``<number>_<name>.sql`` (for example ``0001_envelopes.sql``).
Files are applied in numeric order, each in its own transaction, and recorded in
``agentpost.schema_migrations`` (version, name, checksum, applied_at). Rules for the files:

- no transaction control (BEGIN/COMMIT) and nothing that cannot run inside a transaction
  (``CREATE INDEX CONCURRENTLY``, ``VACUUM``, ...);
- the schema ``agentpost`` already exists when they run; qualify names with it
  (``agentpost.envelopes``) since the search_path is left alone;
- a file is never edited once applied anywhere: its checksum is recorded, and a mismatch stops
  ``migrate()`` with a MigrationError. Change the schema with a new, higher-numbered file.
  The one exception is a correction of comments only, listed in ``FORMER_CHECKSUMS``: a
  database that recorded the file's earlier text is accepted as it is.

Every transaction takes the same transaction-scoped advisory lock first, so concurrent
``migrate()`` calls against one database apply each file exactly once.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg2
from psycopg2.extensions import parse_dsn

from agentpost.pg.db import translate
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import ConfigurationError

__all__ = [
    "AppliedMigration",
    "Migration",
    "MigrationError",
    "SchemaBehind",
    "SchemaMissing",
    "SchemaStatus",
    "applied",
    "check_schema",
    "load",
    "migrate",
    "pending",
]

SQL_PACKAGE = "agentpost.sql"
_FILE_NAME = re.compile(r"^(?P<version>\d+)_[^/]+\.sql$")
# Key of the advisory lock every migration transaction takes (a fixed, arbitrary bigint).
LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"agentpost.schema_migrations").digest()[:8], "big", signed=True
)

#: files whose comments (never their SQL) were corrected after release: the checksums of their
#: earlier texts, still accepted when a database recorded them
FORMER_CHECKSUMS: dict[str, frozenset[str]] = {
    # the first comment named a path outside the repository
    "0009_routes.sql": frozenset(
        {"35b559d5fb4b366c5e72ef45d5457452310a4471c26377bf970c356a4f9211d0"}),
}

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS agentpost;
CREATE TABLE IF NOT EXISTS agentpost.schema_migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

Source = str | Path | Traversable | None


class MigrationError(ConfigurationError):
    """The migrations cannot be applied as they are (bad files, edited files, SQL errors)."""


class SchemaMissing(ConfigurationError):
    """The database answers but holds no agentpost schema: nobody ran the migrations."""


class SchemaBehind(ConfigurationError):
    """The database's agentpost schema lacks migrations this package ships: the code would
    call functions or columns that are not there yet."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str  # the file name, e.g. "0001_envelopes.sql"
    sql: str
    checksum: str  # sha256 of the file's bytes, hex


@dataclass(frozen=True)
class AppliedMigration:
    version: int
    name: str
    checksum: str
    applied_at: datetime


def load(source: Source = None) -> list[Migration]:
    """The migrations in ``source`` (a directory; default: the ``agentpost.sql`` package),
    sorted by number. Files not named ``<number>_<name>.sql`` are ignored."""
    root: Traversable
    if source is None:
        root = importlib.resources.files(SQL_PACKAGE)
    elif isinstance(source, str | Path):
        root = Path(source)
    else:
        root = source
    if not root.is_dir():
        raise MigrationError(f"migration source {root} is not a directory")
    found: dict[int, Migration] = {}
    for entry in root.iterdir():
        match = _FILE_NAME.match(entry.name)
        if not match or not entry.is_file():
            continue
        data = entry.read_bytes()
        version = int(match["version"])
        if version in found:
            raise MigrationError(
                f"two migrations numbered {version}: {found[version].name} and {entry.name}"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MigrationError(f"{entry.name} is not UTF-8: {exc}") from None
        found[version] = Migration(version, entry.name, text, hashlib.sha256(data).hexdigest())
    return [found[v] for v in sorted(found)]


def _connect(dsn: str, **options: object):
    try:
        return psycopg2.connect(libpq_dsn(dsn), **options)
    except psycopg2.Error as exc:
        raise translate(exc) from None


def migrate(dsn: str, *, source: Source = None) -> list[str]:
    """Apply the migrations not yet applied to the database at ``dsn``.

    Returns the names of the files this call applied, in order (empty when up to date).
    Raises MigrationError when an applied file has changed, or when a migration fails (its
    transaction is rolled back; the ones before it stay applied).
    """
    migrations = load(source)
    newly_applied: list[str] = []
    conn = _connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            _lock(cur)
            cur.execute(_BOOTSTRAP)
            _check(migrations, _recorded(cur))
        for migration in migrations:
            with conn, conn.cursor() as cur:
                _lock(cur)
                recorded = _recorded(cur)
                if migration.version in recorded:  # applied by us earlier or by someone else
                    _check([migration], recorded)
                    continue
                try:
                    cur.execute(migration.sql)
                except psycopg2.Error as exc:
                    raise MigrationError(
                        f"migration {migration.name} failed: {str(exc).strip()}"
                    ) from exc
                cur.execute(
                    "INSERT INTO agentpost.schema_migrations (version, name, checksum)"
                    " VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
            newly_applied.append(migration.name)
    finally:
        conn.close()
    return newly_applied


def applied(dsn: str) -> list[AppliedMigration]:
    """The migrations recorded in the database at ``dsn``, by version (empty if none)."""
    conn = _connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            return _applied(cur) or []
    finally:
        conn.close()


def _applied(cur) -> list[AppliedMigration] | None:
    """The recorded migrations; None when there is no agentpost schema at all."""
    cur.execute("SELECT to_regclass('agentpost.schema_migrations') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    cur.execute("SELECT version, name, checksum, applied_at"
                " FROM agentpost.schema_migrations ORDER BY version")
    return [AppliedMigration(*row) for row in cur.fetchall()]


@dataclass(frozen=True)
class SchemaStatus:
    """What `check_schema` found: a store the package can work with."""

    database: str
    server_version: str
    applied: int  # migrations recorded
    latest: str  # the newest migration this package ships
    newer: tuple[str, ...] = ()  # recorded migrations this package does not ship

    def summary(self) -> str:
        text = (f"database {self.database!r} on PostgreSQL {self.server_version}: agentpost "
                f"schema up to date ({self.applied} migrations, latest {self.latest})")
        if self.newer:
            text += (f"; it also has {len(self.newer)} migration(s) newer than this package "
                     f"({self.newer[-1]}): upgrade the package")
        return text


def check_schema(dsn: str, *, connect_timeout: int = 10,
                 source: Source = None) -> SchemaStatus:
    """Connect once and check that the database at ``dsn`` holds the agentpost schema with
    every migration this package ships (a read-only probe; it never migrates).

    Raises StoreUnavailable (cannot connect: host down, wrong password, no such database),
    SchemaMissing, or SchemaBehind, each with a one-line message that says what to do.
    ``connect_timeout`` applies unless the DSN sets its own.
    """
    options: dict[str, object] = {"application_name": "agentpost-check"}
    if "connect_timeout" not in _dsn_keys(dsn):
        options["connect_timeout"] = connect_timeout
    shipped = load(source)
    conn = _connect(dsn, **options)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT current_database(), current_setting('server_version')")
            database, version = cur.fetchone()
            recorded = _applied(cur)
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()
    if recorded is None:
        raise SchemaMissing(f"database {database!r} has no agentpost schema: run "
                            "`agentpost migrate` against it")
    done = {m.version for m in recorded}
    missing = [m.name for m in shipped if m.version not in done]
    if missing:
        raise SchemaBehind(
            f"the agentpost schema in database {database!r} is behind this package: "
            f"{len(missing)} migration(s) not applied (first {missing[0]}): run "
            "`agentpost migrate`")
    known = {m.version for m in shipped}
    return SchemaStatus(database=database, server_version=version, applied=len(recorded),
                        latest=shipped[-1].name if shipped else "-",
                        newer=tuple(m.name for m in recorded if m.version not in known))


def pending(dsn: str, *, source: Source = None) -> list[str]:
    """Names of the migrations in ``source`` that the database at ``dsn`` has not recorded."""
    done = {m.version for m in applied(dsn)}
    return [m.name for m in load(source) if m.version not in done]


def _dsn_keys(dsn: str) -> set[str]:
    """The options a DSN sets (none when libpq cannot parse it: connecting will say why)."""
    try:
        return set(parse_dsn(libpq_dsn(dsn)))
    except psycopg2.Error:
        return set()


def _lock(cur) -> None:
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))


def _recorded(cur) -> dict[int, tuple[str, str]]:
    cur.execute("SELECT version, name, checksum FROM agentpost.schema_migrations")
    return {version: (name, checksum) for version, name, checksum in cur.fetchall()}


def _check(migrations: Iterable[Migration], recorded: dict[int, tuple[str, str]]) -> None:
    problems = []
    for migration in migrations:
        if migration.version not in recorded:
            continue
        name, checksum = recorded[migration.version]
        if name != migration.name:
            problems.append(
                f"migration {migration.version} was applied as {name} but the file is now "
                f"{migration.name}"
            )
        elif checksum != migration.checksum and checksum not in FORMER_CHECKSUMS.get(
                migration.name, ()):
            problems.append(
                f"{migration.name} changed after it was applied (recorded checksum "
                f"{checksum[:12]}…, file {migration.checksum[:12]}…)"
            )
    if problems:
        raise MigrationError(
            "applied migrations no longer match their files; add a new migration instead of "
            "editing an applied one:\n  " + "\n  ".join(problems)
        )
