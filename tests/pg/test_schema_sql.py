"""sql/schema.sql is what migrating an empty database gives, and its table of routines names
the migration that last defined each."""

from __future__ import annotations

import difflib
import functools
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentpost.pg.schema_dump import SCHEMA_FILE, generate, normalise
from agentpost.pg.server import PostgresServer
from dbtools import fresh_database, query

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
# a row of the header's table: last defined in, n, kind, signature
_ROW = re.compile(r"^--   (\d+_\S+\.sql) +(\d+)  (\w+) +(agentpost\.\w+\(.*\))$", re.MULTILINE)
# a migration that defines a routine of the name: creates it, or renames another to it
_DEFINES = (r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE|AGGREGATE)\s+agentpost\.{0}\s*\("
            r"|RENAME\s+TO\s+{0}\b")


@pytest.fixture(scope="module")
def migrated(pg_server: PostgresServer) -> Iterator[tuple[str, str]]:
    """An empty database migrated from sql/ (the files of this tree), and the schema.sql text
    it gives."""
    database = fresh_database(pg_server, "schema")
    dsn = next(database)
    try:
        yield dsn, generate(dsn, SQL_DIR)
    finally:
        database.close()  # drops it


def _table(text: str) -> dict[str, tuple[str, int]]:
    """The header's table: (last defined in, n) by signature."""
    return {row[4]: (row[1], int(row[2])) for row in _ROW.finditer(text)}


@functools.cache
def _migration_texts() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8")
            for path in sorted(SQL_DIR.glob("[0-9]*_*.sql"))}


def _defining_files(name: str) -> list[str]:
    """The migrations that define a routine called ``name``, read as text, in order."""
    pattern = re.compile(_DEFINES.format(re.escape(name)), re.IGNORECASE)
    return [file for file, text in _migration_texts().items() if pattern.search(text)]


def test_schema_sql_is_what_the_migrations_give(migrated: tuple[str, str]) -> None:
    _, generated = migrated
    committed = (SQL_DIR / SCHEMA_FILE).read_text(encoding="utf-8")
    made_on, now_on = (re.search(r"pg_dump of PostgreSQL (\d+)", t) for t in (committed, generated))
    if made_on and now_on and made_on[1] != now_on[1]:
        pytest.fail(f"sql/schema.sql is pg_dump's text of PostgreSQL {made_on[1]}, this server "
                    f"is {now_on[1]}: compare on {made_on[1]}, the version the project runs on",
                    pytrace=False)
    if generated != committed:
        diff = list(difflib.unified_diff(committed.splitlines(), generated.splitlines(),
                                         "sql/schema.sql", "migrated", lineterm="", n=1))
        shown = "\n".join(diff[:60]) + (f"\n... ({len(diff) - 60} more lines)"
                                        if len(diff) > 60 else "")
        pytest.fail("sql/schema.sql differs from the schema the migrations give: run "
                    f"`make schema` and commit the result.\n{shown}", pytrace=False)


def test_every_routine_is_in_the_table(migrated: tuple[str, str]) -> None:
    dsn, generated = migrated
    routines = {signature for (signature,) in query(
        dsn, "SELECT format('%%I.%%I(%%s)', n.nspname, p.proname,"
             " pg_get_function_identity_arguments(p.oid))"
             " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
             " WHERE n.nspname = 'agentpost'")}
    assert len(routines) > 100
    assert set(_table(generated)) == routines


def test_send_names_the_last_of_its_definitions(migrated: tuple[str, str]) -> None:
    """agentpost.send is defined in several migrations: the table names the last of them,
    and counts them all."""
    files = _defining_files("send")
    assert len(files) > 1
    [(last, n)] = [row for signature, row in _table(migrated[1]).items()
                   if signature.startswith("agentpost.send(")]
    assert (last, n) == (files[-1], len(files))


def test_each_routine_names_the_last_file_defining_its_name(migrated: tuple[str, str]) -> None:
    """The table (from the database, migration by migration) agrees with a reading of the
    files for every routine with a name of its own (overloads share their name's files)."""
    table = _table(migrated[1])
    names = Counter(_name(signature) for signature in table)
    wrong = {}
    for signature, (last, _) in table.items():
        files = _defining_files(_name(signature))
        if names[_name(signature)] == 1 and files[-1:] != [last]:
            wrong[signature] = (last, files)
    assert not wrong


def _name(signature: str) -> str:
    return signature.removeprefix("agentpost.").split("(", 1)[0]


def test_normalise_drops_what_differs_between_dumps() -> None:
    """pg_dump's run-to-run and machine-to-machine lines go; the schema stays as printed."""
    dump = (
        "--\n-- PostgreSQL database dump\n--\n\n"
        "\\restrict 6a9mk5D7j1TCPotFb31ijZFfWVwkuad0gSiVUgbn2og5498NC8Ss9bmaN9M4zKX\n\n"
        "-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)\n"
        "-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)\n\n"
        "SET statement_timeout = 0;\nSET client_encoding = 'UTF8';\n"
        "SELECT pg_catalog.set_config('search_path', '', false);\n"
        "SET check_function_bodies = false;\n\n"
        "--\n-- Name: agentpost; Type: SCHEMA; Schema: -; Owner: -\n--\n\n"
        "CREATE SCHEMA agentpost;\n\n\n"
        "SET default_tablespace = '';\n\nSET default_table_access_method = heap;\n\n"
        "CREATE FUNCTION agentpost.f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n"
        "    UPDATE agentpost.t\n       SET x = 1;\nEND $$;\n\n\n"
        "--\n-- PostgreSQL database dump complete\n--\n\n"
        "\\unrestrict 6a9mk5D7j1TCPotFb31ijZFfWVwkuad0gSiVUgbn2og5498NC8Ss9bmaN9M4zKX\n\n"
    )
    assert normalise(dump) == (
        "--\n-- Name: agentpost; Type: SCHEMA; Schema: -; Owner: -\n--\n\n"
        "CREATE SCHEMA agentpost;\n\n"
        "CREATE FUNCTION agentpost.f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n"
        "    UPDATE agentpost.t\n       SET x = 1;\nEND $$;\n"
    )
