"""Airflow for real: `airflow standalone` through `AirflowRuntime`, end to end.

One standalone start: the runtime brings Airflow up on its own metadata database beside the
test's store, the health endpoint reports every component, the example DAG is unpaused,
triggered and awaited over the REST API (its confirmation answered by the demo's person
through the human highway), the trail holds the commands it ran, and `stop()` leaves no
process, no listening port and no metadata database behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil
import pytest

from agentpost.airflow_demo import DemoPerson, apply_demo_fleet, run_headless_demo
from agentpost.airflow_runtime import (
    COMPONENTS,
    AirflowClient,
    AirflowError,
    AirflowRuntime,
    Credentials,
    port_open,
)
from agentpost.store import CommandLedger, EnvelopeStore
from agentpost.store.server import libpq_dsn
from dbtools import query

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "agentpost_command_example"


def listening_addresses(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def command_views(store: EnvelopeStore) -> dict[str, object]:
    """Every command on the trail, by action."""
    ids = {e.body["lifecycle"]["command_id"] for e in store.trail(event="command_state_change")}
    with CommandLedger(store) as ledger:
        views = [ledger.view(i) for i in ids]
    return {v.action: v for v in views}


def databases(dsn: str, name: str) -> list[tuple[str]]:
    return query(libpq_dsn(dsn), "SELECT datname FROM pg_database WHERE datname = %s", (name,))


@pytest.mark.slow
def test_standalone_runs_an_example_dag_and_stops_without_a_trace(dsn: str,
                                                                  tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / f"{EXAMPLE}.py", dags)
    with EnvelopeStore(dsn) as store:
        apply_demo_fleet(store)
    runtime = AirflowRuntime(dsn, dags_folder=dags, home=tmp_path / "home", drop_metadata=True)
    try:
        runtime.start()
        started = _run_the_example(runtime, dsn)
    finally:
        runtime.stop()
    assert started, "standalone started no processes"
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert runtime.processes() == []
    for port in runtime.ports:
        assert not port_open(port), f"port {port} is still open"
    assert "standalone | Complete" in runtime.log_path.read_text(), \
        "standalone did not stop cleanly on SIGINT"
    assert databases(dsn, runtime.metadata_db) == [], "the metadata database was left"


def _run_the_example(runtime: AirflowRuntime, dsn: str) -> list[psutil.Process]:
    """Everything between start and stop; the processes running before the stop."""
    with AirflowClient(runtime.url) as anonymous:
        health = anonymous.health()
    assert all(health[c]["status"] == "healthy" for c in COMPONENTS), health
    assert listening_addresses(runtime.port) == {"127.0.0.1"}
    assert databases(dsn, runtime.metadata_db), "Airflow's metadata is not on the store's server"
    with AirflowClient(runtime.url, Credentials("admin", "wrong")) as intruder, \
            pytest.raises(AirflowError, match="login failed \\(401\\)"):
        intruder.dag_ids()

    with runtime.client() as client, EnvelopeStore(dsn) as store:
        client.wait_for_dag(EXAMPLE)
        assert client.dag_ids(prefix="agentpost_", tag="example") == [EXAMPLE]
        client.unpause(EXAMPLE)
        run_id = client.trigger(EXAMPLE)
        person = DemoPerson(store)
        try:
            state = client.wait_for_run(EXAMPLE, run_id, timeout=300, tick=person.answer)
        finally:
            person.close()
        tasks = {ti["task_id"]: ti["state"] for ti in client.task_instances(EXAMPLE, run_id)}
        assert (state, tasks) == ("success", {"book_room": "success", "charge_card": "success",
                                              "receipt": "success"}), runtime.log_tail()
        views = command_views(store)
        assert {a: v.state.value for a, v in views.items()} == {"room.book": "executed",
                                                                "card.charge": "executed"}
        assert views["card.charge"].confirmed_by == "human:dana"
        assert store.verify_trail().ok
    return runtime.processes()


FAILING_EXAMPLE = '''
"""An example that fails: the headless demo must say so with its exit code."""
from datetime import datetime

from airflow.sdk import dag, task


@dag(dag_id="agentpost_failing_example", schedule=None, start_date=datetime(2026, 1, 1),
     tags=["example"])
def failing():
    @task(retries=0)
    def boom():
        raise RuntimeError("this example fails")

    boom()


failing()
'''


@pytest.mark.slow
def test_headless_demo_runs_the_examples_with_dag_test(dsn: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """`make demo-headless`: the example DAG's dag.test(), its confirmation answered by the
    demo's person, succeeds; a failing example makes the exit code 1."""
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / f"{EXAMPLE}.py", dags)
    assert run_headless_demo(dsn, dags_folder=dags) == 0
    out = capsys.readouterr().out
    assert (f"{EXAMPLE}: success (book_room=success, charge_card=success, receipt=success)"
            in out), out
    assert "dana confirms command" in out and ", verified" in out

    (dags / "agentpost_failing_example.py").write_text(FAILING_EXAMPLE)
    assert run_headless_demo(dsn, dags_folder=dags) == 1
    out = capsys.readouterr().out
    assert "agentpost_failing_example: failed (boom=failed)" in out, out
