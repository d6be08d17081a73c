"""agentpost.pg.server: DSN helpers and a real private cluster in a temporary directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from psycopg2.extensions import parse_dsn

from agentpost.pg.server import (
    DSN_ENV,
    PostgresUnavailable,
    discover,
    dsn_for_database,
    find_repo_root,
    libpq_dsn,
)


@pytest.mark.parametrize(
    ("admin", "expected"),
    [
        ("postgresql://postgres@127.0.0.1:5432/postgres", "postgresql://postgres@127.0.0.1:5432/x"),
        ("postgresql://u:p%40ss@db:6543", "postgresql://u:p%40ss@db:6543/x"),
        (
            "postgresql+psycopg2://u@db/postgres?sslmode=disable&dbname=postgres",
            "postgresql+psycopg2://u@db/x?sslmode=disable",
        ),
        ("postgres://u@db/postgres", "postgres://u@db/x"),
    ],
)
def test_dsn_for_database_uri(admin: str, expected: str) -> None:
    assert dsn_for_database(admin, "x") == expected


def test_dsn_for_database_key_value() -> None:
    result = dsn_for_database("host=127.0.0.1 port=5432 user=postgres dbname=postgres", "x")
    assert parse_dsn(result) == {
        "host": "127.0.0.1",
        "port": "5432",
        "user": "postgres",
        "dbname": "x",
    }
    assert parse_dsn(dsn_for_database("host=db user=u", "y"))["dbname"] == "y"


def test_libpq_dsn_strips_the_sqlalchemy_driver() -> None:
    assert libpq_dsn("postgresql+psycopg2://u@h/d") == "postgresql://u@h/d"
    assert libpq_dsn("postgresql://u@h/d") == "postgresql://u@h/d"
    assert libpq_dsn("host=h dbname=d") == "host=h dbname=d"


def test_find_repo_root(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "airflow-agentpost"\n')
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert find_repo_root(nested) == tmp_path.resolve()
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert find_repo_root(other) == tmp_path.resolve()


def test_repo_root_of_this_checkout() -> None:
    root = find_repo_root(Path(__file__).parent)
    assert (root / "plugins" / "agentpost").is_dir()


def test_env_dsn_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, "postgresql://someone@elsewhere/agentpost")
    server = discover()
    assert server.source == "env"
    assert server.dsn == "postgresql://someone@elsewhere/agentpost"
    assert not server.started_here
    assert server.stop_command is None
    server.stop()  # nothing to stop


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: when we are root the cluster runs as `postgres`, which cannot
    # enter the private /tmp/pytest-of-root tree.
    path = Path(tempfile.mkdtemp(prefix="agentpost-pg-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _answers(dsn: str) -> bool:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=2)
    except psycopg2.OperationalError:
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW server_encoding")
            return cur.fetchone()[0] == "UTF8"
    finally:
        conn.close()


def test_private_cluster_lifecycle(cluster_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, "postgresql://ignored@nowhere/x")  # private_only skips it

    with pytest.raises(PostgresUnavailable, match="start=False"):
        discover(cluster_dir=cluster_dir, private_only=True, start=False)

    first = discover(cluster_dir=cluster_dir, private_only=True)
    try:
        assert first.source == "private"
        assert first.started_here
        assert first.dsn.startswith("postgresql://postgres@127.0.0.1:")
        assert first.pgdata == cluster_dir.resolve() / "data"
        assert (cluster_dir / "data" / "PG_VERSION").is_file()
        assert _answers(first.dsn)
        assert "pg_ctl" in first.stop_command and "stop" in first.stop_command

        # a second discovery finds the running cluster and does not own it
        second = discover(cluster_dir=cluster_dir, private_only=True, start=False)
        assert second.dsn == first.dsn
        assert not second.started_here
        second.stop()
        assert _answers(first.dsn)
    finally:
        first.stop()
    assert not _answers(first.dsn)
    first.stop()  # idempotent

    # the existing cluster starts again without a new initdb
    again = discover(cluster_dir=cluster_dir, private_only=True)
    try:
        assert again.started_here
        assert _answers(again.dsn)
    finally:
        again.stop()
    assert not _answers(again.dsn)
