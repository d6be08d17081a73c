"""The files spark-submit runs, one per job (`run_<job>.py`, each two lines that call the
job's `main`). They live apart from the job modules so that running one as a script puts only
this directory, which shadows nothing, at the front of `sys.path`."""

from __future__ import annotations

from pathlib import Path

JOBS = ("analytics", "audit", "export")


def application(job: str) -> str:
    """The path of `job`'s spark-submit application file (SparkSubmitOperator's
    `application`)."""
    if job not in JOBS:
        raise ValueError(f"unknown Spark job {job!r}: one of {', '.join(JOBS)}")
    return str(Path(__file__).with_name(f"run_{job}.py"))
