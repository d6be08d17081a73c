"""Example: the Spark jobs over the trail, scheduled (agentpost.operators.TrailJobOperator,
a SparkSubmitOperator; the `spark_default` connection says where Spark runs: the demo defines
it as `local[*]`, docker/compose.yaml as its standalone master).

- ``agentpost_trail_analytics``, daily at 00:00 UTC: the analytics of the day before (its
  data interval, a whole day: Airflow 3 gives a plain cron schedule an empty one) into the
  analytics tables, which the agentpost page shows (Browse -> Agents -> analytics). A run
  triggered by hand without a logical date (the UI's and the REST API's default) has no data
  interval and analyses the last full UTC day before it was triggered (`trail_window`).
- ``agentpost_trail_audit``, nightly at 02:00: the whole trail audited against the newest
  signed checkpoint the maintenance DAG keeps (AGENTPOST_CHECKPOINT_DIR, as in
  agentpost_maintenance.py; before its first checkpoint, the log warns that the heads were
  checked against none); the task fails when a check fails, and the report is in its log
  and on the analytics page.
- ``agentpost_trail_export``, weekly: entries older than a week copied to Parquet under
  AGENTPOST_TRAIL_ARCHIVE (default ``agentpost-trail-archive`` under AIRFLOW_HOME), which the
  other two then read instead of Postgres for that part of the trail.

Every DAG takes the params ``window_start`` / ``window_end`` (ISO 8601) to run another window
by hand, e.g. a re-run of last Monday (a re-run replaces that window's rows).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, CronTriggerTimetable, Param

from agentpost.operators import TrailJobOperator
from agentpost.operators.spark import trail_window

HOME = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
CHECKPOINTS = os.environ.get("AGENTPOST_CHECKPOINT_DIR") or str(HOME / "agentpost-checkpoints")
ARCHIVE = os.environ.get("AGENTPOST_TRAIL_ARCHIVE") or str(HOME / "agentpost-trail-archive")
#: the run's data interval, or the last full day for a run without one (`trail_window`)
START = "{{ params.window_start or trail_window(dag_run)[0].isoformat() }}"
END = "{{ params.window_end or trail_window(dag_run)[1].isoformat() }}"
PARAMS = {"window_start": Param(None, type=["null", "string"],
                                description="window start, ISO 8601 (default: the run's "
                                            "data interval)"),
          "window_end": Param(None, type=["null", "string"],
                              description="window end, exclusive (default: the run's data "
                                          "interval)")}
COMMON = {"start_date": datetime(2026, 1, 1, tzinfo=UTC), "catchup": False,
          "params": PARAMS, "tags": ["agentpost", "spark"],
          "user_defined_macros": {"trail_window": trail_window},
          "default_args": {"retries": 1, "retry_delay": timedelta(minutes=10)}}

#: midnight, over the day that just ended: a cron string alone would be a CronTriggerTimetable
#: without an interval (Airflow 3's default), whose data interval starts where it ends
DAILY = CronTriggerTimetable("0 0 * * *", timezone="UTC", interval=timedelta(days=1))

with DAG("agentpost_trail_analytics", schedule=DAILY,
         description="agentpost: trail analytics of the day, with Spark", **COMMON):
    TrailJobOperator(task_id="analytics", job="analytics", window_start=START, window_end=END,
                     job_args=["--archive", ARCHIVE], execution_timeout=timedelta(hours=3))

with DAG("agentpost_trail_audit", schedule="0 2 * * *",
         description="agentpost: the whole trail audited nightly, with Spark", **COMMON):
    TrailJobOperator(task_id="audit", job="audit",
                     job_args=["--archive", ARCHIVE, "--checkpoint-dir", CHECKPOINTS,
                               # a fresh install has none until maintenance first ran
                               "--no-checkpoint-ok"],
                     execution_timeout=timedelta(hours=6), retries=0)

with DAG("agentpost_trail_export", schedule="@weekly",
         description="agentpost: trail entries older than a week to Parquet", **COMMON):
    TrailJobOperator(task_id="export", job="export",
                     job_args=["--archive", ARCHIVE, "--before",
                               "{{ (trail_window(dag_run)[1] - macros.timedelta(days=7))"
                               ".strftime('%Y-%m-%dT00:00:00+00:00') }}"],
                     execution_timeout=timedelta(hours=6))
