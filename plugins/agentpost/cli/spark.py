"""`agentpost spark`: a Spark job over the trail in this process. pyspark is imported only
when a job runs, never to parse the arguments."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentpost.cli.common import EXIT_USAGE


def cmd_spark(args: argparse.Namespace) -> int:
    """A Spark job in this process (local mode unless --master says otherwise); the same
    `main` spark-submit runs. `check` only says whether the jobs can run here."""
    from agentpost.spark import install
    from agentpost.spark.apps import run

    if args.job == "check":
        trouble = install.problem()
        print(f"agentpost spark check: {trouble}" if trouble else install.summary(),
              file=sys.stderr if trouble else sys.stdout)
        return EXIT_USAGE if trouble else 0
    job_args = list(args.job_args)
    if args.dsn and "--dsn" not in job_args:
        job_args = ["--dsn", args.dsn, *job_args]
    return run(args.job, job_args)


def register(sub: Any) -> None:
    spark = sub.add_parser("spark", help="run a Spark job over the trail in this process: "
                                         "analytics, audit or export (--help after the job "
                                         "lists its options); check: can the jobs run here")
    spark.add_argument("job", choices=["analytics", "audit", "export", "check"])
    spark.add_argument("job_args", nargs=argparse.REMAINDER,
                       help="the job's options (e.g. --start ... --end ...)")
    spark.set_defaults(func=cmd_spark)
