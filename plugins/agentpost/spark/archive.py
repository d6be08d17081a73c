"""The trail's Parquet export read by the Spark jobs (the manifest: `store.trail_export`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentpost.store.trail_export import MANIFEST, Batch, Export, load

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MANIFEST", "Batch", "Export", "load", "read"]


def read(export: Export, spark: SparkSession) -> DataFrame:
    """Every listed batch's entries (the trail's columns and `day`)."""
    frames = [spark.read.option("basePath", str(Path(export.path) / b.dir))
              .parquet(str(Path(export.path) / b.dir)) for b in export.batches]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out
