"""Spark jobs over the trail as Airflow tasks: SparkSubmitOperator with agentpost's jobs.

`TrailJobOperator` is a SparkSubmitOperator (the Apache Spark provider's: the `spark_default`
connection says where the master is) that fills in what each of agentpost's jobs needs:
- `application`: the job's file in the installed package (`agentpost.spark.apps`);
- `name`: `agentpost-trail-<job>` unless given;
- `jars`: the PostgreSQL JDBC driver (AGENTPOST_JDBC_JAR, else Debian's
  /usr/share/java/postgresql.jar);
- the store, from the `agentpost_default` connection (or AGENTPOST_DSN) at run time, handed
  to spark-submit's environment with the trail key, never in its command line (which the
  task log shows);
- the driver's Python and spark-submit of the worker's own environment, so a job runs with
  the agentpost and pyspark the worker has, without PATH set by hand;
- `application_args`: the window (`window_start`, `window_end`, templated: the DAG passes
  its data interval) and `job_args`.
The job's report is printed by the job into the task log, and the task's "Trail analytics"
link opens the agentpost page's analytics view (the analytics' tables, the audit's reports).
A job that fails (an audit check among them) exits non-zero, and the task fails.

The Spark provider comes with the `spark` extra; without it, importing this module raises an
ImportError that says what to install (a DAG file using it shows that as its import error).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from agentpost.spark.install import INSTALL

try:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError as exc:  # the `spark` extra is not installed
    raise ImportError(f"TrailJobOperator needs the Apache Spark provider and pyspark: "
                      f"{INSTALL}", name=exc.name) from exc

from agentpost.spark.apps import application
from agentpost.spark.settings import DEFAULT_JDBC_JAR
from agentpost.web.links import TrailAnalyticsLink

Job = Literal["analytics", "audit", "export"]


def trail_window(dag_run: Any) -> tuple[datetime, datetime]:
    """The window a run of a trail job covers by default: its data interval, or, for a run
    that has none (triggered by hand with no logical date: the REST API's
    ``logical_date: null``, the UI's trigger without a date), the last full UTC day before
    it was triggered. A DAG makes it a macro (``user_defined_macros``) for its templates."""
    start, end = dag_run.data_interval_start, dag_run.data_interval_end
    if start is not None and end is not None:
        return start, end
    after = dag_run.run_after.astimezone(UTC)
    midnight = after.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight - timedelta(days=1), midnight


class TrailJobOperator(SparkSubmitOperator):
    """Submit one of agentpost's Spark jobs (`job`) over the store of `agentpost_conn_id`."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "window_start",
                                      "window_end", "job_args")
    ui_color = "#f4d9b1"
    operator_extra_links = (TrailAnalyticsLink(),)

    def __init__(self, *, job: Job, agentpost_conn_id: str = "agentpost_default",
                 window_start: str | None = None, window_end: str | None = None,
                 job_args: Sequence[str] = (), name: str | None = None,
                 jars: str | None = None, **kwargs: Any) -> None:
        super().__init__(application=application(job), name=name or f"agentpost-trail-{job}",
                         jars=jars or os.environ.get("AGENTPOST_JDBC_JAR") or DEFAULT_JDBC_JAR,
                         **kwargs)
        self.job = job
        self.agentpost_conn_id = agentpost_conn_id
        self.window_start = window_start
        self.window_end = window_end
        self.job_args = list(job_args)

    def execute(self, context: Any) -> Any:
        from agentpost.hooks import AgentpostHook

        target = AgentpostHook(self.agentpost_conn_id).get_target()
        bin_dir = str(Path(sys.executable).parent)
        env = {"AGENTPOST_DSN": target.dsn, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
        if target.trail_key:
            env["AGENTPOST_TRAIL_KEY"] = target.trail_key
        self.env_vars = {**env, **(self.env_vars or {})}
        window = []
        if self.window_start:
            window += ["--start", str(self.window_start)]
        if self.window_end:
            window += ["--end", str(self.window_end)]
        self.application_args = [*window, *self.job_args, *(self.application_args or [])]
        return super().execute(context)
