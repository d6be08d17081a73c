"""Airflow's own metadata database on Postgres works with the locked dependencies.

`airflow db migrate` against Postgres opens an async engine beside the sync one, whose driver
is asyncpg: the `postgres` extra brings it and `make test` installs it (docs/airflow.md,
"Installing"). Run in a subprocess with a private AIRFLOW_HOME, against a fresh database on
the test server, so nothing of this process's Airflow configuration is involved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg2.extensions import parse_dsn

from agentpost.pg.server import PostgresServer, libpq_dsn
from dbtools import fresh_database, query

AIRFLOW = Path(sys.executable).parent / "airflow"


@pytest.fixture
def metadata_dsn(pg_server: PostgresServer) -> Iterator[str]:
    yield from fresh_database(pg_server, "airflow")


def sqlalchemy_url(dsn: str) -> str:
    """Airflow's form of the test database's DSN: postgresql+psycopg2://user@host:port/db."""
    p = parse_dsn(libpq_dsn(dsn))
    auth = p.get("user", "postgres") + (f":{p['password']}" if p.get("password") else "")
    return (f"postgresql+psycopg2://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}"
            f"/{p['dbname']}")


@pytest.mark.slow
def test_airflow_db_migrate_on_a_fresh_postgres_database(metadata_dsn: str,
                                                         tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy_url(metadata_dsn)}
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", None)  # derived: asyncpg
    proc = subprocess.run([str(AIRFLOW), "db", "migrate"], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    [(revision,)] = query(metadata_dsn, "SELECT version_num FROM alembic_version")
    assert revision
    tables = {t for (t,) in query(metadata_dsn, "SELECT table_name FROM information_schema.tables"
                                                " WHERE table_schema = 'public'")}
    assert {"dag", "dag_run", "task_instance", "connection"} <= tables
