"""The export job: trail entries older than a day boundary copied to Parquet, by day.

`archive` describes the layout and why a batch counts only once the manifest lists it. Each
run exports the entries after the manifest's `upto_id`, up to the last id before the first
entry at or after `--before` (so the ids exported are one contiguous range, all older than
the cut), reading them in id-range partitions in one snapshot. An entry whose transaction is
still open when the export reads could commit later with a lower id than ones exported; the
store's steps are short transactions, so the cut must be at least `MIN_AGE` in the past.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from agentpost.protocol.errors import AgentpostError, InvalidInput
from agentpost.spark import archive, jobargs
from agentpost.spark.settings import SparkSettings
from agentpost.spark.source import TRAIL_SELECT, Snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_AGE = timedelta(hours=1)
DEFAULT_AGE_DAYS = 7


def run_export(spark: SparkSession, settings: SparkSettings,
               before: datetime) -> archive.Batch | None:
    """Export the entries not yet exported and older than `before`; the new batch, or None
    when there was nothing to export."""
    if not settings.archive:
        raise InvalidInput("no export directory: give --archive or set AGENTPOST_TRAIL_ARCHIVE")
    exported = archive.load(settings.archive)
    with Snapshot(spark, settings) as snap:
        if before > snap.taken_at - MIN_AGE:
            raise InvalidInput(f"--before must be at least {MIN_AGE} in the past: entries "
                               "younger than that may still be committing")
        lo = exported.upto_id + 1
        hi = _last_id_before(snap, lo, before)
        if hi < lo:
            return None
        batch_dir = exported.next_dir()
        frame = snap.table(f"{TRAIL_SELECT} WHERE id BETWEEN {lo} AND {hi}",
                           partition_column="id", bounds=(lo, hi))
        from pyspark.sql import functions as F

        (frame.withColumn("day", F.to_date("at")).write.mode("overwrite")
         .partitionBy("day").parquet(f"{settings.archive}/{batch_dir}"))
        rows = snap.query("SELECT count(*) FROM agentpost.trail WHERE id BETWEEN %s AND %s",
                          (lo, hi))[0][0]
    batch = archive.Batch(dir=batch_dir, from_id=lo, to_id=hi, rows=rows, before=before)
    exported.batches.append(batch)
    exported.upto_id = hi
    exported.save()
    return batch


def _last_id_before(snap: Snapshot, lo: int, before: datetime) -> int:
    """The last id of the contiguous run of entries from `lo` that are all older than
    `before`."""
    first_new, last = snap.query(
        "SELECT (SELECT min(id) FROM agentpost.trail WHERE id >= %(lo)s AND at >= %(before)s),"
        " (SELECT max(id) FROM agentpost.trail)", {"lo": lo, "before": before})[0]
    if first_new is not None:
        return first_new - 1
    return last or 0


def default_before(now: datetime | None = None) -> datetime:
    """Midnight UTC `DEFAULT_AGE_DAYS` days ago."""
    now = now or datetime.now(UTC)
    day = (now - timedelta(days=DEFAULT_AGE_DAYS)).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentpost spark export",
                                description="copy old trail entries to Parquet, by day")
    jobargs.add_common(p)
    p.add_argument("--before", type=jobargs.timestamp,
                   help=f"export entries older than this (default: midnight UTC "
                        f"{DEFAULT_AGE_DAYS} days ago)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = jobargs.settings_from(args)
        from agentpost.spark.session import spark_session

        spark = spark_session("agentpost-trail-export", settings, master=args.master)
        batch = run_export(spark, settings, args.before or default_before())
    except AgentpostError as exc:
        print(f"agentpost spark export: {exc}", file=sys.stderr)
        return 2
    if batch is None:
        print("agentpost spark export: nothing to export")
    else:
        print(f"agentpost spark export: {batch.rows:,} entries (ids {batch.from_id}.."
              f"{batch.to_id}) to {settings.archive}/{batch.dir}")
    return 0
