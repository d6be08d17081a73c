"""The Spark audit reads a real streaming standby (a private primary and a ``pg_basebackup -R``
standby on loopback, both stopped afterwards) when given ``--read-dsn``: its snapshot is the
standby's (with replay paused, what the primary wrote since is not in the report), every
check passes there, and the report is saved on the primary. Postgres 15 exports and imports
snapshots on a hot standby, which is what keeps the job's JDBC partitions on one cut."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from agentpost.spark.audit import main as audit_main
from agentpost.spark.audit import run_audit
from agentpost.spark.settings import SparkSettings
from agentpost.store import EnvelopeStore
from standby_support import Pair, primary_and_standby

pytestmark = pytest.mark.slow

DB = "agentpost_spark_standby"
JAR = "/usr/share/java/postgresql.jar"
KEY = os.environ["AGENTPOST_TRAIL_KEY"]


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_and_standby() as made:
        yield made


@pytest.fixture(scope="module")
def dsns(pair: Pair) -> dict[str, str]:
    primary, standby = pair.database(DB)
    with EnvelopeStore(primary) as store:
        store.create_workspace("coordinator", workspace_id="boss")
        store.create_workspace("worker", parent="boss", workspace_id="w1")
        for i in range(5):
            store.send("boss", "w1", "directive", f"task {i}")
        (lease,) = store.lease("w1", max=1, ttl=60.0)
        store.ack(lease.token)
    pair.caught_up()
    return {"primary": primary, "standby": standby}


def _reports(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM agentpost.audit_reports")
            return cur.fetchone()[0]
    finally:
        conn.close()


def test_the_audit_reads_the_standby_and_reports_to_the_primary(
        spark: Any, pair: Pair, dsns: dict[str, str]) -> None:
    with EnvelopeStore(dsns["primary"]) as store:
        before = store.verify_trail().entries
        pair.replay(False)
        try:
            store.send("boss", "w1", "directive", "while the standby is paused")
            assert store.verify_trail().entries > before
            settings = SparkSettings(dsn=dsns["primary"], read_dsn=dsns["standby"],
                                     trail_key=KEY, jdbc_jar=JAR)
            report = run_audit(spark, settings)
            assert report.ok, report.summary()
            assert report.entries == before  # the standby's cut, not the primary's
        finally:
            pair.replay(True)
    pair.caught_up()
    saved = _reports(dsns["primary"])
    assert audit_main(["--dsn", dsns["primary"], "--read-dsn", dsns["standby"],
                       "--jdbc-jar", JAR]) == 0
    assert _reports(dsns["primary"]) == saved + 1


def test_a_read_dsn_jdbc_cannot_use_is_refused_before_any_job() -> None:
    with pytest.raises(Exception, match="Unix socket"):
        SparkSettings(dsn="postgresql://u@127.0.0.1/db", read_dsn="host=/tmp dbname=db",
                      trail_key=KEY, jdbc_jar=JAR)
