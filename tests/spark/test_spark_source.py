"""How the Spark jobs read the store (`agentpost.spark.source`, `.settings`, `.session`):
every JDBC partition in the driver's snapshot, large reads split by id range, windows found
by time, and clear errors for a missing driver jar or an unusable DSN."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentpost.benchmarks.spark_fill import Plan, fill
from agentpost.protocol.errors import ConfigurationError
from agentpost.spark.session import spark_session
from agentpost.spark.settings import SparkSettings
from agentpost.spark.source import MIN_PARTITION_ROWS, Snapshot
from agentpost.store import EnvelopeStore
from dbtools import query

KEY = b"agentpost-test-trail-key"
DAY = datetime(2026, 10, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def big_trail(module_dsn: str) -> str:
    """About 120,000 entries over one day: more than two partitions' worth."""
    fill(module_dsn, KEY, Plan(envelopes=26_000, start_us=int(DAY.timestamp() * 1e6)))
    return module_dsn


def test_a_large_read_is_split_by_id_range_and_reads_every_entry_once(spark,
                                                                        big_trail: str) -> None:
    total, lo, hi = query(big_trail, "SELECT count(*), min(id), max(id) FROM agentpost.trail")[0]
    assert total > 2 * MIN_PARTITION_ROWS
    with Snapshot(spark, SparkSettings(dsn=big_trail, partitions=8)) as snap:
        frame = snap.trail()
        parts = frame.rdd.getNumPartitions()
        ids = frame.select("id").rdd.glom().map(lambda p: [r.id for r in p]).collect()
    assert parts == (hi - lo + 1 + MIN_PARTITION_ROWS - 1) // MIN_PARTITION_ROWS > 1
    flat = [i for part in ids for i in part]
    assert len(flat) == len(set(flat)) == total
    assert sum(1 for part in ids if part) == parts  # every partition read a share


def test_every_partition_reads_the_drivers_snapshot(spark, dsn: str) -> None:
    """Entries committed after the job took its snapshot are not seen by any partition,
    though the partitions open their connections later."""
    with EnvelopeStore(dsn) as store:
        boss = store.create_workspace("coordinator")
        worker = store.create_workspace("worker", parent=boss.id)
        store.send(boss.id, worker.id, "directive", "before")
        before = query(dsn, "SELECT count(*) FROM agentpost.trail")[0][0]
        with Snapshot(spark, SparkSettings(dsn=dsn, partitions=4)) as snap:
            for i in range(20):
                store.send(boss.id, worker.id, "directive", f"after {i}")
            seen = snap.trail().count()
            bounds = snap.table("SELECT id FROM agentpost.trail", partition_column="id").count()
            in_driver = snap.query("SELECT count(*) FROM agentpost.trail")[0][0]
    assert seen == bounds == in_driver == before
    assert query(dsn, "SELECT count(*) FROM agentpost.trail")[0][0] > before + 20


def test_a_window_reads_only_its_entries(spark, big_trail: str) -> None:
    start, end = DAY + timedelta(hours=6), DAY + timedelta(hours=7)
    expected = query(big_trail, "SELECT count(*), min(id), max(id) FROM agentpost.trail "
                                "WHERE at >= %s AND at < %s", (start, end))[0]
    with Snapshot(spark, SparkSettings(dsn=big_trail)) as snap:
        assert snap.trail_bounds(start, end) == expected[1:]
        frame = snap.trail(start=start, end=end)
        assert frame.count() == expected[0] > 1_000
        assert snap.trail_bounds(DAY - timedelta(days=9), DAY - timedelta(days=8)) == (0, 0)
        assert snap.trail(start=DAY - timedelta(days=9), end=DAY - timedelta(days=8)).count() == 0


def test_the_jdbc_url_comes_from_either_dsn_form_without_the_password() -> None:
    url = SparkSettings(dsn="postgresql://ann:s3cr%40t@db.example:6543/store?sslmode=require")
    assert url.jdbc().url == "jdbc:postgresql://db.example:6543/store?sslmode=require"
    assert (url.jdbc().user, url.jdbc().password) == ("ann", "s3cr@t")
    kv = SparkSettings(dsn="host=127.0.0.1 dbname=agentpost user=bob")
    assert kv.jdbc().url == "jdbc:postgresql://127.0.0.1:5432/agentpost"
    assert "password" not in kv.jdbc().options()
    alchemy = SparkSettings(dsn="postgresql+psycopg2://u@h/d")
    assert alchemy.jdbc().url == "jdbc:postgresql://h:5432/d"


@pytest.mark.parametrize(("dsn", "message"), [
    ("host=/var/run/postgresql dbname=x", "cannot use a Unix socket"),
    ("this is = not a dsn", "not a valid Postgres DSN"),
])
def test_an_unusable_dsn_is_a_clear_error(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SparkSettings(dsn=dsn).jdbc()


def test_missing_settings_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTPOST_DSN", raising=False)
    with pytest.raises(ConfigurationError, match="no store configured"):
        SparkSettings.from_env()
    monkeypatch.setenv("AGENTPOST_SPARK_PARTITIONS", "-3")
    with pytest.raises(ConfigurationError, match="bad Spark job configuration"):
        SparkSettings.from_env(dsn="postgresql://h/d")
    missing = SparkSettings(dsn="postgresql://h/d", jdbc_jar="/nonexistent/postgresql.jar")
    with pytest.raises(ConfigurationError, match="libpostgresql-jdbc-java"):
        spark_session("never-started", missing)
