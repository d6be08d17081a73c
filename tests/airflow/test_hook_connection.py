"""The `agentpost` connection's Test button and the hook's store check, against real Postgres.

`AgentpostHook.test_connection()` returns ``(ok, message)``; `get_store()` raises a typed
error. Either way a store that cannot be used is named by its connection id and the message
says what is wrong: nothing listens on the port, the server refuses the role or the database,
the database has no agentpost schema, or its schema is behind the package's migrations. The
check never changes the database. The last test runs `airflow connections test` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg2.extensions import make_dsn, parse_dsn

from agentpost.hooks import AgentpostHook
from agentpost.pg.migrations import SchemaBehind, SchemaMissing, load, migrate
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import StoreUnavailable
from agentpost.store import EnvelopeStore
from dbtools import query
from test_airflow_inbox import connection_json  # also gives this process a private AIRFLOW_HOME

CONN_ID = "store_under_test"
CONN_VAR = "AIRFLOW_CONN_STORE_UNDER_TEST"
AIRFLOW = Path(sys.executable).parent / "airflow"


def with_params(dsn: str, **params: object) -> str:
    """`dsn` with some libpq parameters replaced."""
    return make_dsn(libpq_dsn(dsn), **params)


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch):
    """Point the connection CONN_ID at a DSN (as Airflow's JSON form of a connection)."""
    def point(dsn: str) -> AgentpostHook:
        monkeypatch.setenv(CONN_VAR, connection_json(dsn))
        return AgentpostHook(CONN_ID)
    return point


def assert_refused(hook: AgentpostHook, kind: type[Exception], *words: str) -> str:
    """test_connection says no and get_store raises `kind`, both naming the connection."""
    ok, message = hook.test_connection()
    assert not ok
    assert f"agentpost connection {CONN_ID!r}" in message and "\n" not in message, message
    for word in words:
        assert word in message, message
    with pytest.raises(kind) as raised:
        hook.get_store()
    assert str(raised.value) == message
    return message


def test_a_migrated_store_passes(dsn: str, use) -> None:
    hook = use(dsn)
    ok, message = hook.test_connection()
    database = parse_dsn(libpq_dsn(dsn))["dbname"]
    assert ok, message
    assert f"{database!r}" in message and "up to date" in message
    assert load()[-1].name in message
    with hook.get_store() as store:
        assert store.workspaces() == []


def test_nothing_listening(use) -> None:
    """A port on 127.0.0.1 where no server listens: refused at once, not a hang."""
    hook = use("postgresql://postgres@127.0.0.1:1/agentpost")
    assert_refused(hook, StoreUnavailable, "cannot reach", "127.0.0.1", "port 1")


def test_the_server_refuses_the_role(dsn: str, use) -> None:
    """The server answers but refuses the login (on this trust-auth server an unknown role is
    the refusal we can provoke; a wrong password takes the same path)."""
    hook = use(with_params(dsn, user="agentpost_no_such_role"))
    assert_refused(hook, StoreUnavailable, "refused the connection",
                   "agentpost_no_such_role")


def test_no_such_database(dsn: str, use) -> None:
    hook = use(with_params(dsn, dbname="agentpost_no_such_database"))
    assert_refused(hook, StoreUnavailable, "refused the connection",
                   "agentpost_no_such_database", "does not exist")


def test_a_database_without_the_schema(empty_dsn: str, use) -> None:
    database = parse_dsn(libpq_dsn(empty_dsn))["dbname"]
    message = assert_refused(use(empty_dsn), SchemaMissing, repr(database), "agentpost migrate")
    assert "no agentpost schema" in message
    assert query(empty_dsn, "SELECT to_regnamespace('agentpost')") == [(None,)], \
        "the check created something"


def test_a_schema_behind_the_package(empty_dsn: str, use, tmp_path: Path) -> None:
    """Migrated by an older release (here: every migration but the last two)."""
    shipped = load()
    older, newest = shipped[:-2], shipped[-2:]
    for migration in older:
        (tmp_path / migration.name).write_text(migration.sql, encoding="utf-8")
    migrate(empty_dsn, source=tmp_path)
    assert_refused(use(empty_dsn), SchemaBehind, "behind this package", "2 migration(s)",
                   newest[0].name, "agentpost migrate")
    assert len(query(empty_dsn, "SELECT 1 FROM agentpost.schema_migrations")) == len(older)


def test_a_schema_ahead_of_the_package_still_works(dsn: str, use) -> None:
    """A newer release migrated the database: this package's functions are all there, so the
    store is usable, and the message says to upgrade."""
    query(dsn, "INSERT INTO agentpost.schema_migrations (version, name, checksum)"
               " VALUES (9999, '9999_from_the_future.sql', 'x')")
    ok, message = use(dsn).test_connection()
    assert ok, message
    assert "9999_from_the_future.sql" in message and "upgrade the package" in message


def test_the_agentpost_dsn_fallback_says_where_it_came_from(
        empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONN_VAR, raising=False)
    monkeypatch.setenv("AGENTPOST_DSN", empty_dsn)
    with pytest.raises(SchemaMissing, match=f"AGENTPOST_DSN \\(connection {CONN_ID!r} is "
                                            "not defined\\)"):
        AgentpostHook(CONN_ID).get_store()


def test_get_store_checks_once_per_hook(dsn: str, use) -> None:
    """The probe is one short connection of its own (named agentpost-check), on the first
    get_store only; check=False skips it."""
    hook = use(dsn)
    with hook.get_store():
        pass
    query(dsn, "DROP TABLE agentpost.schema_migrations")
    with hook.get_store() as store:  # checked already: the store opens
        assert isinstance(store, EnvelopeStore)
    with AgentpostHook(CONN_ID).get_store(check=False):
        pass
    with pytest.raises(SchemaMissing):
        AgentpostHook(CONN_ID).get_store()


@pytest.mark.slow
def test_airflow_connections_test_uses_the_hook(dsn: str, empty_dsn: str,
                                                tmp_path: Path) -> None:
    """`airflow connections test` (what the form's Test button runs) with the connection in
    the environment: success on a migrated store, the reason on an unmigrated one."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__TEST_CONNECTION": "Enabled", "COLUMNS": "1000"}

    def airflow_test(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(AIRFLOW), "connections", "test", CONN_ID],
                              env={**env, CONN_VAR: connection_json(target)},
                              capture_output=True, text=True, timeout=300, check=False)

    good = airflow_test(dsn)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Connection success!" in good.stdout
    bad = airflow_test(empty_dsn)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Connection failed!" in bad.stdout
    assert "no agentpost schema" in " ".join(bad.stdout.split()), bad.stdout
