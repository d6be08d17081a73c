"""Reading the store from Spark: every read of a job in one Postgres snapshot.

The driver opens a REPEATABLE READ transaction and exports its snapshot; every JDBC partition
imports it (`sessionInitStatement`), so a job sees the trail and the rows beside it as of one
moment, however many partitions and executors read them, and while agents go on writing.
With `read_dsn` (AGENTPOST_READ_DSN, ``--read-dsn``) all of it happens on a streaming standby:
Postgres 15 exports and imports snapshots on a hot standby as on a primary (checked by
tests/spark/test_spark_standby.py), so the cut is as consistent there. Large
reads are split by id range into partitions that Spark reads in parallel (never one
single-partition read of a big table). Entries already exported to Parquet (`archive`) are
read from there, and only the live tail from Postgres.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg2

from agentpost.pg.db import translate
from agentpost.protocol.errors import ConfigurationError
from agentpost.spark import archive
from agentpost.spark.settings import SparkSettings
from agentpost.store.trail_export import TRAIL_COLUMNS, TRAIL_SELECT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: a partition holds at least this many ids (fewer, larger partitions for a small trail)
MIN_PARTITION_ROWS = 50_000


class Snapshot:
    """A job's view of the store (a context manager): JDBC reads in one exported snapshot."""

    def __init__(self, spark: SparkSession, settings: SparkSettings) -> None:
        self.spark = spark
        self.settings = settings
        self._conn: Any = None
        self.snapshot_id = ""
        self.taken_at: datetime | None = None

    def __enter__(self) -> Snapshot:
        try:
            self._conn = psycopg2.connect(self.settings.read_libpq,
                                          application_name="agentpost-spark")
            self._conn.autocommit = True
            with self._conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SELECT pg_export_snapshot(), clock_timestamp()")
                self.snapshot_id, self.taken_at = cur.fetchone()
        except psycopg2.Error as exc:
            self.close()
            raise translate(exc) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # ends the transaction: every read must be done by now
            finally:
                self._conn = None

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple]:
        """A small query on the driver, in the same snapshot."""
        if self._conn is None:
            raise ConfigurationError("the snapshot is closed")
        try:
            with self._conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        except psycopg2.Error as exc:
            raise translate(exc) from None

    def table(self, sql: str, *, partition_column: str | None = None,
              bounds: tuple[int, int] | None = None) -> DataFrame:
        """The rows of `sql` (a SELECT) as a DataFrame read in this snapshot; split by
        `partition_column` (a whole number column) into id-range partitions when given, its
        bounds found in the snapshot unless `bounds` (lowest, highest) says."""
        reader = (self.spark.read.format("jdbc")
                  .options(**self.settings.jdbc(read=True).options())
                  .option("dbtable", f"({sql}) AS agentpost_source")
                  .option("fetchsize", str(self.settings.fetch_size))
                  .option("sessionInitStatement",
                          "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
                          f"SET TRANSACTION SNAPSHOT '{self.snapshot_id}'"))
        if partition_column is not None:
            if bounds is None:
                lo, hi = self.query(f"SELECT min({partition_column}), max({partition_column}) "
                                    f"FROM ({sql}) AS agentpost_bounds")[0]
                bounds = (lo or 0, hi or 0)
            lo, hi = bounds
            reader = (reader.option("partitionColumn", partition_column)
                      .option("lowerBound", str(lo)).option("upperBound", str(hi + 1))
                      .option("numPartitions", str(self.partitions(hi - lo + 1))))
        return reader.load()

    def partitions(self, rows: int) -> int:
        """How many partitions a read of about `rows` rows gets: the configured number, or two
        per core Spark has; at least one, and none much smaller than MIN_PARTITION_ROWS."""
        wanted = self.settings.partitions or 2 * self.spark.sparkContext.defaultParallelism
        return max(1, min(wanted, -(-rows // MIN_PARTITION_ROWS)))

    def trail_bounds(self, start: datetime | None = None,
                     end: datetime | None = None) -> tuple[int, int]:
        """The lowest and highest trail id in the snapshot, of entries in [start, end) when
        given ((0, 0): none). Trail ids grow with time, but not strictly across chains, so a
        window's ids are found, not guessed (the BRIN index on `at` keeps this cheap)."""
        where, params = _window_filter(start, end)
        row = self.query(f"SELECT min(id), max(id) FROM agentpost.trail{where}", params)[0]
        return (row[0] or 0, row[1] or 0)

    def trail(self, *, start: datetime | None = None, end: datetime | None = None) -> DataFrame:
        """Trail entries (TRAIL_COLUMNS), of [start, end) when given: those exported to
        Parquet read from there, the rest from Postgres in id-range partitions."""
        upto, old = self._exported(start, end)
        lo, hi = self.trail_bounds(start, end)
        where, params = _window_filter(start, end)
        live_sql = TRAIL_SELECT + _and(where, f"id > {int(upto)}")
        live_sql = self._literal(live_sql, params)
        live = self.table(live_sql, partition_column="id",
                          bounds=(max(lo, upto + 1), max(hi, upto + 1)))
        if old is None:
            return live
        return old.select(*TRAIL_COLUMNS).unionByName(live.select(*TRAIL_COLUMNS))

    def trail_count(self, *, start: datetime | None = None,
                    end: datetime | None = None) -> int:
        """How many trail entries [start, end) holds in the snapshot, exported ones included
        (a count in Postgres, not a read of the entries)."""
        upto, old = self._exported(start, end)
        where, params = _window_filter(start, end)
        live = self.query("SELECT count(*) FROM agentpost.trail"
                          + _and(where, f"id > {int(upto)}"), params)[0][0]
        return live + (old.count() if old is not None else 0)

    def _exported(self, start: datetime | None, end: datetime | None
                  ) -> tuple[int, DataFrame | None]:
        """The highest id exported to Parquet (0: none) and the exported entries of
        [start, end) (None: nothing exported)."""
        exported = archive.load(self.settings.archive) if self.settings.archive else None
        if exported is None:
            return 0, None
        if not exported.batches:
            return exported.upto_id, None
        old = archive.read(exported, self.spark)
        if start is not None:
            old = old.where(old["at"] >= start)
        if end is not None:
            old = old.where(old["at"] < end)
        return exported.upto_id, old

    def _literal(self, sql: str, params: dict[str, Any]) -> str:
        """`sql` with its parameters bound (JDBC sources take SQL text, not parameters)."""
        if not params:
            return sql
        with self._conn.cursor() as cur:
            return cur.mogrify(sql, params).decode("utf-8")


def _window_filter(start: datetime | None, end: datetime | None) -> tuple[str, dict[str, Any]]:
    parts, params = [], {}
    if start is not None:
        parts.append("at >= %(start)s")
        params["start"] = start
    if end is not None:
        parts.append("at < %(end)s")
        params["end"] = end
    return (" WHERE " + " AND ".join(parts) if parts else ""), params


def _and(where: str, condition: str) -> str:
    return f"{where} AND {condition}" if where else f" WHERE {condition}"
