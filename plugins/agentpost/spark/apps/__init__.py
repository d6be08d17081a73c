"""The files spark-submit runs, one per job (`run_<job>.py`, each two lines that call the
job's `main`). They live apart from the job modules so that running one as a script puts only
this directory, which shadows nothing, at the front of `sys.path`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

from agentpost.spark import install

JOBS = ("analytics", "audit", "export")


def application(job: str) -> str:
    """The path of `job`'s spark-submit application file (SparkSubmitOperator's
    `application`)."""
    if job not in JOBS:
        raise ValueError(f"unknown Spark job {job!r}: one of {', '.join(JOBS)}")
    return str(Path(__file__).with_name(f"run_{job}.py"))


def run(job: str, argv: Sequence[str] | None = None, *, prog: str = "agentpost spark") -> int:
    """Run `job`'s `main` (spark-submit's and `agentpost spark`'s way in), after checking
    that pyspark is there and not mixed: else one line on stderr saying what to install, and
    exit status 2, before pyspark is imported."""
    trouble = install.problem()
    if trouble:
        print(f"{prog} {job}: {trouble}", file=sys.stderr)
        return 2
    main = import_module(f"agentpost.spark.{job}").main
    return main(None if argv is None else list(argv))
