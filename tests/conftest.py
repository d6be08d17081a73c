"""Shared fixtures: a Postgres server and throwaway, migrated databases.

- ``pg_server`` (session): the PostgresServer from ``discover()``; a private cluster started
  for this session is stopped at its end.
- ``template_db`` (session): the name of a database migrated with ``migrate()``, used as the
  template of the per-test databases.
- ``dsn`` (function) / ``module_dsn`` (module): the DSN of a fresh database copied from the
  template, dropped afterwards.
- ``empty_dsn`` (function): the DSN of a fresh database with no migrations applied.
- ``pg`` (function): a plain autocommit connection to ``dsn``'s database.
- ``store`` (function): an EnvelopeStore on ``dsn`` with a short acknowledgment timeout
  (0.2 s), closed afterwards.
- ``spark`` (session): a local Spark session (tests/spark, tests/bench).

A folder's own fixtures are in its conftest.py (tests/web: ``web``, the agentpost page in
Airflow's API app; tests/marks: the mark spaces; tests/commands: ``ledger``; tests/routes:
``routes``).

Database names carry the process id and a random suffix, so concurrent runs against one
server don't collide.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from agentpost.pg.migrations import migrate
from agentpost.pg.server import PostgresServer, discover
from agentpost.store import EnvelopeStore
from dbtools import connect, create_database, drop_database, fresh_database, unique_db_name

# Airflow reads its configuration once, at first import: tests that import it get a throwaway
# home (an AIRFLOW_HOME given by the caller is respected), set before any test module loads.
# Each pytest-xdist worker gets its own: workers inherit the controller's environment, and two
# workers migrating one SQLite metadata database at once collide ("table ... already exists").
_worker = os.environ.get("PYTEST_XDIST_WORKER")
_ours = os.environ.get("AGENTPOST_TEST_AIRFLOW_HOME")
if "AIRFLOW_HOME" not in os.environ or (_worker and _ours == os.environ["AIRFLOW_HOME"]):
    _home = tempfile.mkdtemp(prefix=f"agentpost-airflow-home-{_worker or 'main'}-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
    os.environ["AGENTPOST_TEST_AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

# Tests sign the trail with their own key (and so never warn about the development key).
os.environ.setdefault("AGENTPOST_TRAIL_KEY", "agentpost-test-trail-key")

# CI replays the same examples every run (a red CI must be reproducible); a developer's run
# explores new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    server = discover()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_server: PostgresServer) -> Iterator[str]:
    name = unique_db_name("tmpl")
    dsn = create_database(pg_server.dsn, name)
    try:
        migrate(dsn)
        yield name
    finally:
        drop_database(pg_server.dsn, name)


@pytest.fixture
def dsn(pg_server: PostgresServer, template_db: str) -> Iterator[str]:
    yield from fresh_database(pg_server, "test", template=template_db)


@pytest.fixture(scope="module")
def module_dsn(pg_server: PostgresServer, template_db: str) -> Iterator[str]:
    yield from fresh_database(pg_server, "test", template=template_db)


@pytest.fixture
def empty_dsn(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh database without any migrations applied."""
    yield from fresh_database(pg_server, "empty")


@pytest.fixture
def pg(dsn: str) -> Iterator[Any]:
    """A plain autocommit connection to ``dsn``'s database: the database owner's own access,
    for reads the API does not offer and for tampering as an owner could."""
    conn = connect(dsn)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def store(dsn: str) -> Iterator[EnvelopeStore]:
    with EnvelopeStore(dsn, ack_timeout=0.2) as s:
        yield s


@pytest.fixture(scope="session")
def spark():
    """A local Spark session (two cores) with the JDBC driver, shared by a worker's tests;
    stopped at the end (its JVM with it)."""
    from agentpost.spark.session import spark_session
    from agentpost.spark.settings import SparkSettings

    settings = SparkSettings(dsn="postgresql://localhost/unused")
    session = spark_session("agentpost-tests", settings, master="local[2]")
    try:
        yield session
    finally:
        session.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a slow test run first (by name), the rest after them, most tests first.

    `make test` runs `-n 3 --dist loadfile --no-loadscope-reorder`: workers take whole
    modules in this order. pytest-xdist's own order (most tests first) left the one-test
    slow modules, several of them waiting on timers or servers more than on the CPU, for
    the end, where they ran alone on an otherwise idle machine; started first, they overlap
    with the many short modules instead. The order within a module is kept."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(entry: tuple[str, list[pytest.Item]]) -> tuple[bool, int, str]:
        name, tests = entry
        slow = any(t.get_closest_marker("slow") for t in tests)
        return (not slow, 0 if slow else -len(tests), name)

    items[:] = [t for _, tests in sorted(modules.items(), key=weight) for t in tests]
