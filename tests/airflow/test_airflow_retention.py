"""The maintenance DAG's trail retention (issue 26), under `dag.test()` in a private Airflow:
off by default; set, it archives and drops the months older than the retention, verified since
the checkpoint the same run kept, and the next run still verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentpost.factories.maintenance import maintenance_dag
from agentpost.store import EnvelopeStore
from dbtools import rows
from test_airflow_inbox import airflow_env
from test_trail_anchor import build
from test_trail_prune import age, exists, old_month, partition

DAG_FILE = '''
import json
import os
import sys

from agentpost.factories.maintenance import maintenance_dag

retention = json.loads(os.environ["AGENTPOST_TEST_RETENTION"])
the_dag = maintenance_dag(checkpoint_dir=os.environ["AGENTPOST_TEST_CHECKPOINTS"], keep=5,
                          schedule=None, vacuum=False, trail_retention_days=retention,
                          trail_archive=os.environ["AGENTPOST_TEST_ARCHIVE"])

if __name__ == "__main__":
    from airflow.models.xcom import XComModel
    from airflow.utils.db import initdb
    from airflow.utils.session import create_session

    initdb()
    for _ in range(2):
        run = the_dag.test()
        with create_session() as session:
            found = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                       key="return_value")
            xcom = {x.task_id: XComModel.deserialize_value(x) for x in found}
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        print("AGENTPOST-RESULT " + json.dumps({"run": str(run.state), "tasks": states,
                                                "xcom": xcom}, default=str), flush=True)
'''


def run_maintenance(tmp_path: Path, dsn: str, retention: int | None) -> list[dict[str, Any]]:
    """Two runs of the maintenance DAG with `retention`; each run's result."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "retention_test.py").write_text(DAG_FILE)
    env = airflow_env(tmp_path, dsn)
    env.update(AGENTPOST_TEST_RETENTION=json.dumps(retention),
               AGENTPOST_TEST_CHECKPOINTS=str(tmp_path / "checkpoints"),
               AGENTPOST_TEST_ARCHIVE=str(tmp_path / "archive"))
    proc = subprocess.run([sys.executable, str(dags / "retention_test.py")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    output = proc.stdout + proc.stderr
    results = [json.loads(ln.removeprefix("AGENTPOST-RESULT "))
               for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and len(results) == 2, output[-6000:]
    return results


@pytest.mark.slow
def test_maintenance_dag_archives_and_prunes_the_months_past_retention(
        store: EnvelopeStore, pg: Any, dsn: str, tmp_path: Path) -> None:
    build(store)
    month = old_month()
    aged = age(pg, month)
    first, second = run_maintenance(tmp_path, dsn, retention=30)
    assert first["run"] == second["run"] == "success", (first, second)
    done = first["xcom"]["archive_and_prune"]
    # the aged month, and the empty months after it that ended 30 days ago or earlier
    assert done["pruned"][0] == partition(month) and done["archived"] == aged
    assert done["dropped"] + done["kept"] == aged
    assert not any(exists(pg, name) for name in done["pruned"])
    assert second["xcom"]["archive_and_prune"]["pruned"] == []  # nothing old is left
    assert second["xcom"]["verify"]["ok"]
    assert rows(pg, "SELECT count(*) FROM agentpost.trail_prunes")[0][0] == 1
    assert store.verify_trail().ok


def test_retention_is_off_by_default_and_refuses_half_a_setting() -> None:
    dag = maintenance_dag(checkpoint_dir="/nowhere")
    assert dag.params["trail_retention_days"] is None
    assert [t.task_id for t in dag.tasks][-1] == "archive_and_prune"
    with pytest.raises(ValueError, match="needs a trail_archive"):
        maintenance_dag(checkpoint_dir="/nowhere", trail_retention_days=30)
    with pytest.raises(ValueError, match="at least 1 day"):
        maintenance_dag(checkpoint_dir="/nowhere", trail_retention_days=0,
                        trail_archive="/nowhere")
