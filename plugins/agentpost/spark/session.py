"""The Spark session of a job: the JDBC driver on its class path, UTC, quiet consoles.

Under spark-submit the master, the resources and any `--jars` come from the submission; the
driver jar is added to them if missing. In-process (tests, `agentpost spark ...`) the master
is `master` (default `local[*]`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from agentpost.spark.settings import SparkSettings

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import DataFrame, SparkSession


_SHUFFLE = "spark.sql.shuffle.partitions"
_ADAPTIVE = "spark.sql.adaptive.enabled"
_SORT_MERGE = "spark.sql.join.preferSortMergeJoin"
#: rows per shuffle partition, and the most partitions, unless settings.partitions says
SHUFFLE_ROWS = 200_000
MAX_SHUFFLE = 2_000


def shuffle_partitions(rows: int, settings: SparkSettings) -> int:
    """A job's shuffle partitions: the configured number, else one per SHUFFLE_ROWS rows
    (Spark's default of 200 costs seconds of empty tasks on a small input)."""
    return settings.partitions or max(1, min(MAX_SHUFFLE, -(-rows // SHUFFLE_ROWS)))


@contextmanager
def sized_shuffles(spark: SparkSession, rows: int, settings: SparkSettings, *,
                   hash_joins: bool = False) -> Iterator[int]:
    """Shuffle partitions sized to a job's `rows` for its duration (the session's settings
    restored after). With one partition adaptive execution is off: there is nothing to
    coalesce or split, and it would only cut the plan into three times as many jobs, run one
    after another (measured: 43 jobs against 18 for a small audit). With `hash_joins`,
    joins of shuffled sides hash the smaller side where it fits rather than sort both (the
    audit joins aggregates, a row per envelope, chain or named row, with one another: a
    sort per side costs more than a hash table)."""
    saved = {name: spark.conf.get(name) for name in (_SHUFFLE, _ADAPTIVE, _SORT_MERGE)}
    partitions = shuffle_partitions(rows, settings)
    try:
        spark.conf.set(_SHUFFLE, str(partitions))
        if hash_joins:
            spark.conf.set(_SORT_MERGE, "false")
        if partitions == 1:
            spark.conf.set(_ADAPTIVE, "false")
        yield partitions
    finally:
        for name, value in saved.items():
            spark.conf.set(name, value)


def _app_name(conf: SparkConf, default: str) -> str:
    """spark-submit's `--name` (TrailJobOperator's `agentpost-trail-<job>`, which the
    master's UI lists), else `default`: without `--name` spark-submit names the application
    after its file (`run_audit.py`)."""
    given = conf.get("spark.app.name")
    return given if given and not given.endswith(".py") else default


def spark_session(app_name: str, settings: SparkSettings, *, master: str | None = None,
                  driver_memory: str | None = None) -> SparkSession:
    """A session for `app_name` that can read the store over JDBC. `driver_memory` (e.g.
    "4g"; in local mode the driver's JVM runs the executors too) applies in-process only:
    under spark-submit, `--driver-memory` sets it before the JVM starts."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    jar = settings.require_jar()
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # under spark-submit: its JVM runs, SparkConf() holds the submission's settings
        SparkContext._ensure_initialized()
        conf = SparkConf()
    else:
        # in-process: the JVM starts with the builder's settings (the driver jar must be on
        # the class path at launch, not added later)
        conf = SparkConf(loadDefaults=False)
    jars = [j for j in (conf.get("spark.jars") or "").split(",") if j]
    builder = SparkSession.builder.appName(_app_name(conf, app_name))
    if not conf.contains("spark.master"):
        builder = builder.master(master or "local[*]")
    if driver_memory and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = builder.config("spark.driver.memory", driver_memory)
    if not any(j.endswith("postgresql.jar") or "postgresql" in j.rsplit("/", 1)[-1]
               for j in jars):
        builder = (builder.config("spark.jars", ",".join([*jars, jar]))
                   .config("spark.driver.extraClassPath", jar))
    builder = (builder.config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    if not conf.contains("spark.ui.enabled"):
        builder = builder.config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def literal_rows(spark: SparkSession, rows: Sequence[Sequence[object]],
                 columns: Mapping[str, str]) -> DataFrame:
    """A small table of the driver's values (`columns`: name -> Spark SQL type), built from
    literals in the plan. `createDataFrame` of a Python list goes through a Python RDD, so
    every executor would start a Python worker; the jobs' executors need no Python."""
    from pyspark.sql import functions as F

    typed = list(columns.items())
    if not rows:
        return spark.range(0).select(*[F.lit(None).cast(t).alias(n) for n, t in typed])
    structs = [F.struct(*[F.lit(value).cast(t).alias(n) for value, (n, t) in zip(row, typed,
                                                                                strict=True)])
               for row in rows]
    return spark.range(1).select(F.inline(F.array(*structs)))
