"""The trail's Parquet export read by the Spark jobs (the manifest: `store.trail_export`), and
the rows its cuts copied before a prune dropped them (`store.month_rows`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentpost.protocol import named_rows as nr
from agentpost.store.trail_export import MANIFEST, Batch, Export, load

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MANIFEST", "Batch", "Export", "archived_keys", "load", "read", "with_archived"]


def read(export: Export, spark: SparkSession) -> DataFrame:
    """Every listed batch's entries (the trail's columns and `day`)."""
    frames = [spark.read.option("basePath", str(Path(export.path) / b.dir))
              .parquet(str(Path(export.path) / b.dir)) for b in export.batches]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def with_archived(export: Export, spark: SparkSession, live: DataFrame,
                  table: str) -> DataFrame:
    """`live` (the rows of `table`, envelopes or routes, in Postgres: the audit's columns)
    and, for every id not among them, its row from the newest cut that copied it: the rows
    a prune dropped."""
    cuts = sorted((c for c in export.cuts if getattr(c, table)), key=lambda c: c.cut,
                  reverse=True)
    out = live
    for cut in cuts:
        path = str(Path(export.path) / getattr(cut, table))
        old = spark.read.parquet(path).select(*live.columns)
        out = out.unionByName(old.join(out.select("id"), "id", "left_anti"))
    return out


def archived_keys(export: Export, spark: SparkSession) -> list[DataFrame]:
    """The sagas and saga steps the cuts copied, as the audit's `rows_exist` looks for rows:
    (kind, key, sub), sub a step's name, else ''."""
    from pyspark.sql import functions as F

    out = []
    for cut in export.cuts:
        if cut.sagas:
            out.append(spark.read.parquet(str(Path(export.path) / cut.sagas)).select(
                F.lit(nr.SAGA).alias("kind"), F.col("id").alias("key"), F.lit("").alias("sub")))
        if cut.saga_steps:
            out.append(spark.read.parquet(str(Path(export.path) / cut.saga_steps)).select(
                F.lit(nr.SAGA_STEP).alias("kind"), F.col("saga_id").alias("key"),
                F.col("name").alias("sub")))
    return out
