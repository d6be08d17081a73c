"""The Spark DAGs (dags/agentpost_trail_jobs.py) under `dag.test()`: TrailJobOperator, a
SparkSubmitOperator, runs the real jobs with spark-submit in local mode (the `spark_default`
connection the demo defines) against the store of the `agentpost_default` connection.

One private Airflow process runs both DAGs (tests/airflow/test_airflow_examples.py's runner): the
analytics of a chosen window (the DAG's params) fills that window's tables; the audit of a
trail with one edited entry fails its task, and its report names the entry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentpost.benchmarks.spark_fill import Plan, fill
from agentpost.operators import TrailJobOperator
from agentpost.spark.apps import application
from agentpost.standalone import SPARK_LOCAL
from dbtools import query
from test_airflow_examples import RUNNER
from test_airflow_inbox import airflow_env

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime(2026, 11, 1, tzinfo=UTC)
KEY = os.environ["AGENTPOST_TRAIL_KEY"].encode("utf-8")


def test_the_operator_submits_the_jobs_file_with_the_driver_jar_and_a_name() -> None:
    """SparkSubmitOperator's `application`, `name=` and `jars` are set for every job; the
    window becomes the job's arguments."""
    for job in ("analytics", "audit", "export"):
        op = TrailJobOperator(task_id=job, job=job, window_start="a", window_end="b")
        assert op.application == application(job) and Path(op.application).is_file()
        assert op.name == f"agentpost-trail-{job}"
        assert op.jars.endswith("postgresql.jar") and op.job == job
        assert [link.name for link in op.operator_extra_links] == ["Trail analytics"]
        assert op.operator_extra_links[0].get_link(op, ti_key=None).endswith(
            "/agentpost/analytics")
    with pytest.raises(ValueError, match="unknown Spark job"):
        TrailJobOperator(task_id="x", job="nosuchjob")


def test_the_daily_analytics_covers_the_day_before() -> None:
    """A scheduled analytics run's data interval (its default window) is the whole previous
    day. A plain "@daily" gave Airflow 3's CronTriggerTimetable without an interval, whose
    window starts where it ends: the job refused it, and every scheduled run failed."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    dag = DagBag(dag_folder=str(ROOT / "dags" / "agentpost_trail_jobs.py")).dags[
        "agentpost_trail_analytics"]
    info = coerce_to_core_timetable(dag.timetable).next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=dag.start_date, latest=None, catchup=False))
    assert info is not None
    end = info.data_interval.end
    assert (end.hour, end.minute, end.second) == (0, 0, 0) and end == info.run_after
    assert info.data_interval.start == end - timedelta(days=1)


@pytest.mark.slow
def test_analytics_and_audit_dags_run_the_jobs_with_spark_submit(dsn: str,
                                                                 tmp_path: Path) -> None:
    fill(dsn, KEY, Plan(envelopes=400, start_us=int(DAY.timestamp() * 1e6)), parts=1)
    edited = query(dsn, "SELECT min(id) FROM agentpost.trail "
                        "WHERE event = 'envelope_delivered'")[0][0]
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / "agentpost_trail_jobs.py", dags)
    (tmp_path / "runner.py").write_text(RUNNER)
    env = airflow_env(tmp_path, dsn)
    env.update({"AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
                "AGENTPOST_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
                "AGENTPOST_TRAIL_ARCHIVE": str(tmp_path / "archive")})
    window = {"window_start": DAY.isoformat(), "window_end": (DAY + timedelta(days=1)).isoformat()}
    # the edit comes between the two runs: the runner runs them in order, so tamper first
    # and audit last; the analytics reads entries, not their hashes
    query(dsn, "UPDATE agentpost.trail SET record = replace(record, '\"attempt\": 1', "
               "'\"attempt\": 2') WHERE id = %s", (edited,))
    runs = [{"name": "analytics", "dag_id": "agentpost_trail_analytics", "conf": window},
            {"name": "audit", "dag_id": "agentpost_trail_audit"}]
    proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(dags),
                           json.dumps(runs)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, check=False)
    output = proc.stdout + proc.stderr
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and found, output[-8000:]
    results = json.loads(found[-1].removeprefix("AGENTPOST-RESULT "))

    assert results["analytics"]["tasks"] == {"analytics": "success"}, output[-8000:]
    runs_rows = query(dsn, "SELECT job, window_start, window_end, source_rows "
                          "FROM agentpost.analytics_runs")
    assert runs_rows == [("analytics", DAY, DAY + timedelta(days=1), runs_rows[0][3])]
    assert runs_rows[0][3] > 1_000
    inboxes = query(dsn, "SELECT count(*), sum(delivered) FROM agentpost.analytics_inbox_latency "
                        "WHERE window_start = %s", (DAY,))[0]
    # the window's deliveries (the synthetic day's last one lands just after midnight)
    assert inboxes[0] > 10 and inboxes[1] == query(
        dsn, "SELECT count(*) FROM agentpost.trail WHERE event = 'envelope_delivered' "
             "AND at >= %s AND at < %s", (DAY, DAY + timedelta(days=1)))[0][0]

    assert results["audit"]["tasks"] == {"audit": "failed"}, output[-8000:]
    report = query(dsn, "SELECT ok, report FROM agentpost.audit_reports")
    assert len(report) == 1 and report[0][0] is False
    assert str(edited) in report[0][1]["checks"]["entry_hash"]["first"]
    assert "spark-submit" in output and "agentpost-trail-audit" in output
    # a fresh install: no checkpoint yet, which the nightly DAG accepts with a warning
    assert "no checkpoint in" in output


TRIGGER_AND_RENDER = '''
"""Written by tests/spark/test_spark_airflow.py: trigger DAGs through Airflow's REST API with
``logical_date: null`` (the UI's trigger without a date), then render each run's task as the
task runner does (`airflow tasks render DAG TASK RUN_ID`, in this process)."""
import contextlib
import io
import json
import sys

from airflow.utils.db import initdb

initdb()
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.cli.cli_parser import get_parser
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
from fastapi.testclient import TestClient

manager = DagBundlesManager()
manager.sync_bundles_to_db()
for bundle in manager.get_all_dag_bundles():
    bundle.initialize()
    bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, bundle.name, bundle.version)
client = TestClient(create_app("core"))
token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
parser = get_parser()
results = {}
for dag_id, task_id in json.loads(sys.argv[1]):
    response = client.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None},
                           headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    run = response.json()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            args = parser.parse_args(["tasks", "render", dag_id, task_id, run["dag_run_id"]])
            args.func(args)
        code = 0
    except Exception as exc:  # the failure to show, as the task log would
        code, out = 1, io.StringIO(f"{type(exc).__name__}: {exc}")
    results[dag_id] = {"run": run, "code": code, "out": out.getvalue()}
print("AGENTPOST-RESULT " + json.dumps(results), flush=True)
'''


@pytest.mark.slow
def test_a_run_triggered_without_a_date_covers_the_last_full_day(tmp_path: Path) -> None:
    """Issue 22: a run of the analytics DAG triggered through the REST API with
    ``logical_date: null`` has no data interval; its window is the last full UTC day before
    it was triggered (it failed: "'data_interval_start' is undefined"), and the weekly
    export's cut-off is a week before that day's end. Rendered as the task runner renders
    the run Airflow created, no Spark needed to show it."""
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / "agentpost_trail_jobs.py", dags)
    (tmp_path / "trigger.py").write_text(TRIGGER_AND_RENDER)
    env = airflow_env(tmp_path, "postgresql://unused@127.0.0.1:1/unused")
    env["AIRFLOW__CORE__AUTH_MANAGER"] = (
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    wanted = [["agentpost_trail_analytics", "analytics"], ["agentpost_trail_export", "export"]]
    proc = subprocess.run([sys.executable, str(tmp_path / "trigger.py"), json.dumps(wanted)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          check=False)
    output = proc.stdout + proc.stderr
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and found, output[-8000:]
    results = json.loads(found[-1].removeprefix("AGENTPOST-RESULT "))
    for dag_id, result in results.items():
        run = result["run"]
        assert run["logical_date"] is None and run["data_interval_start"] is None, run
        assert result["code"] == 0, f"{dag_id}: {result['out'][-4000:]}"
    after = datetime.fromisoformat(results["agentpost_trail_analytics"]["run"]["run_after"])
    end = after.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    analytics = rendered_fields(results["agentpost_trail_analytics"]["out"])
    assert analytics["window_start"] == (end - timedelta(days=1)).isoformat(), analytics
    assert analytics["window_end"] == end.isoformat(), analytics
    export = rendered_fields(results["agentpost_trail_export"]["out"])
    after = datetime.fromisoformat(results["agentpost_trail_export"]["run"]["run_after"])
    end = after.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert f"'--before', '{(end - timedelta(days=7)).isoformat()}'" in export["job_args"], \
        export


def rendered_fields(text: str) -> dict[str, str]:
    """`airflow tasks render`'s output: each ``# property: NAME`` and the value after it."""
    fields: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("# property: "):
            name = line.removeprefix("# property: ").strip()
        elif name is not None and not line.startswith("# ---") and line.strip():
            fields.setdefault(name, line.strip())
    return fields
