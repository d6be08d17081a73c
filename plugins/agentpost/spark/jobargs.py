"""The command-line arguments every Spark job shares, for spark-submit and `agentpost spark`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from agentpost.spark.results import Window
from agentpost.spark.settings import SparkSettings


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="the store's DSN (default: AGENTPOST_DSN)")
    parser.add_argument("--read-dsn", help="a streaming standby of the store to read from; "
                                           "reports and results are still written to --dsn "
                                           "(default: AGENTPOST_READ_DSN, else --dsn)")
    parser.add_argument("--master", help="Spark master when run in-process (default local[*]; "
                                         "under spark-submit the submission's)")
    parser.add_argument("--jdbc-jar", help="the PostgreSQL JDBC driver jar (default: "
                                           "AGENTPOST_JDBC_JAR or /usr/share/java/postgresql.jar)")
    parser.add_argument("--partitions", type=int,
                        help="JDBC partitions of a large read (default: two per core)")
    parser.add_argument("--archive", help="the trail's Parquet export directory, if any "
                                          "(default: AGENTPOST_TRAIL_ARCHIVE)")


def add_window(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--start", type=timestamp, required=required,
                        help="window start, ISO 8601 (UTC if no zone is given)")
    parser.add_argument("--end", type=timestamp, required=required,
                        help="window end, exclusive, ISO 8601")


def timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def settings_from(args: argparse.Namespace) -> SparkSettings:
    return SparkSettings.from_env(dsn=args.dsn, read_dsn=args.read_dsn, jdbc_jar=args.jdbc_jar,
                                  partitions=args.partitions, archive=args.archive)


def window_from(args: argparse.Namespace) -> Window:
    return Window(start=args.start, end=args.end)
