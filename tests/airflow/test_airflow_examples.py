"""The example DAGs (dags/agentpost_*.py) run in a real Airflow (``dag.test()``) against a
real Postgres store, and parse in a DagBag with no store configured.

To keep the machine's two cores free, one subprocess (its own AIRFLOW_HOME, a migrated
SQLite metadata database, the store only through the ``agentpost_default`` connection)
migrates Airflow once and runs every DAG of the test in turn; the test then checks the
store. The store starts empty: each example sets up what it needs in its first task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentpost.fleet import apply, load_fleet
from agentpost.store import EnvelopeStore
from test_airflow_inbox import airflow_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("agentpost_booking_saga", "agentpost_route_example",
            "agentpost_coordinator_example", "agentpost_event_driven_example")

RUNNER = '''
"""Written by tests/airflow/test_airflow_examples.py: run DAGs with dag.test(), one after
another."""
import json
import sys

from airflow.dag_processing.dagbag import DagBag
from airflow.utils.db import initdb

initdb()
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
results = {}
for spec in json.loads(sys.argv[2]):
    run = bag.get_dag(spec["dag_id"]).test(run_conf=spec.get("conf"))
    results[spec["name"]] = {
        "run": str(run.state), "run_id": run.run_id,
        "tasks": {f"{ti.task_id}[{ti.map_index}]" if ti.map_index >= 0 else ti.task_id:
                  str(ti.state) for ti in run.get_task_instances()}}
print("AGENTPOST-RESULT " + json.dumps(results), flush=True)
'''


NACK_DAG = '''
"""Written by tests/airflow/test_airflow_examples.py: the consume decorator acks what its function
returned for and nacks what it raised for; a mapped NackOperator delays what is left."""
from datetime import datetime

from airflow.sdk import dag

from agentpost.operators import (DirectiveOperator, LeaseOperator, NackOperator,
                                 TopologyOperator, agentpost_task)


@dag(schedule=None, start_date=datetime(2026, 1, 1))
def agentpost_nack_test():
    setup = TopologyOperator(task_id="setup", workspaces=[("boss-n", "coordinator"),
                                                          ("w-n", "worker", "boss-n")])
    send = DirectiveOperator.partial(task_id="send", sender="boss-n", to="w-n").expand(
        content=["ok", "bad"])

    @agentpost_task.consume(workspace_id="w-n", max=5, nack_delay=0)
    def handle(envelope, suffix):
        if envelope.content == "bad":
            raise ValueError("cannot handle bad")
        return envelope.content + suffix

    left = LeaseOperator(task_id="lease_left", workspace_id="w-n", max=5,
                         trigger_rule="all_done")
    delayed = NackOperator.partial(task_id="delay", delay=3600).expand(lease=left.output)
    setup >> send >> handle("!") >> left >> delayed


agentpost_nack_test()
'''


def run_dags(tmp_path: Path, dsn: str, runs: list[dict[str, Any]],
             extra: dict[str, str] | None = None, examples: tuple[str, ...] = EXAMPLES
             ) -> tuple[dict[str, Any], str]:
    """Copy the `examples` (and `extra` DAG files) into a DAGs folder and run `runs` (each
    ``{"name", "dag_id", "conf"}``) in one private Airflow process."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in examples:
        shutil.copy(ROOT / "dags" / f"{name}.py", dags)
    for name, source in (extra or {}).items():
        (dags / name).write_text(source)
    (tmp_path / "runner.py").write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(dags),
                           json.dumps(runs)], env=airflow_env(tmp_path, dsn), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and found, output[-8000:]
    return json.loads(found[-1].removeprefix("AGENTPOST-RESULT ")), output


def test_examples_parse_without_a_store(tmp_path: Path) -> None:
    """Example DAGs must parse in a DagBag with no store configured (no store access at
    parse time)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW_CONN_", "AGENTPOST_DSN"))}
    code = ("from airflow.dag_processing.dagbag import DagBag; import sys, json; "
            "bag = DagBag(dag_folder=sys.argv[1]); "
            "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()}, "
            "'dags': sorted(bag.dag_ids)}))")
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in EXAMPLES:
        shutil.copy(ROOT / "dags" / f"{name}.py", dags)
    env["AIRFLOW_HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code, str(dags)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == {"errors": {}, "dags": sorted(EXAMPLES)}


@pytest.mark.slow
def test_the_examples_run(store: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """Every example and the nack test DAG in one Airflow process, on the store set up by
    the fleet file (as the demo does); each check below says what it asserts."""
    apply(store, load_fleet(ROOT / "dags" / "fleet.yaml"))
    triage = store.send("dispatch", "triage", "triage.request", {"incident": "blocked"},
                        format="json").envelope_id
    results, _ = run_dags(tmp_path, dsn, [
        {"name": "declined", "dag_id": "agentpost_booking_saga"},
        {"name": "accepted", "dag_id": "agentpost_booking_saga",
         "conf": {"decline_card": False}},
        {"name": "route", "dag_id": "agentpost_route_example"},
        {"name": "coordinator", "dag_id": "agentpost_coordinator_example"},
        {"name": "nack", "dag_id": "agentpost_nack_test"},
        {"name": "arrival", "dag_id": "agentpost_event_driven_example",
         "conf": {"arrivals": [{"envelope_id": triage}]}},
        {"name": "bad arrival", "dag_id": "agentpost_event_driven_example",
         "conf": {"arrivals": [{"id": triage}]}},
    ], extra={"agentpost_nack_test.py": NACK_DAG})
    check_booking_saga(store, results)
    check_route(store, results["route"])
    check_coordinator(store, results["coordinator"])
    check_nacks(store, results["nack"])
    check_event_driven(store, results, triage)


def check_event_driven(store: EnvelopeStore, results: dict[str, Any], envelope_id: str) -> None:
    """A manual run of the event-driven example handles the arrivals of its conf (the
    headless demo's way in, with no triggerer): the envelope is consumed. Arrivals without
    an envelope id fail the run instead of passing as "nothing arrived"."""
    assert results["arrival"] == {**results["arrival"], "run": "success",
                                  "tasks": {"handle_arrivals": "success"}}
    assert store.get(envelope_id).consumed_at is not None
    assert store.inbox("triage") == []
    assert (results["bad arrival"]["run"], results["bad arrival"]["tasks"]) == (
        "failed", {"handle_arrivals": "failed"})


def check_booking_saga(store: EnvelopeStore, results: dict[str, Any]) -> None:
    """The booking saga fails at its third step and compensates the second and the first,
    in that order (the saga's trail), visible as tasks; with the card accepted it
    completes and every undo task is skipped."""
    from agentpost.store.commands import CommandLedger
    from agentpost.store.sagas import SagaRunner

    declined = results["declined"]
    assert declined["run"] == "failed"
    assert declined["tasks"] == {
        "setup": "success", "flight": "success", "hotel": "success", "payment": "failed",
        "undo_payment": "skipped", "undo_hotel": "success", "undo_flight": "success",
        "booking_outcome": "failed"}, declined
    accepted = results["accepted"]
    assert accepted["run"] == "success", accepted
    assert accepted["tasks"]["booking_outcome"] == "success"
    assert {accepted["tasks"][f"undo_{s}"] for s in ("flight", "hotel", "payment")} == \
        {"skipped"}
    with CommandLedger(store) as ledger:
        runner = SagaRunner(ledger, {})
        key = f"airflow/agentpost_booking_saga/{declined['run_id']}"
        saga = runner.begin("travel-desk", key).view()
        assert (saga.state.value, saga.failed_step) == ("compensated", "payment")
        assert [(s.name, s.compensation) for s in saga.steps] == [
            ("flight", "compensated"), ("hotel", "compensated"), ("payment", "not_needed")]
        trail = [e.event for e in store.trail(workspace_id=f"saga:{saga.saga_id}")]
        compensated = [e.body["step"] for e in store.trail(workspace_id=f"saga:{saga.saga_id}")
                       if e.event == "saga_step_compensated"]
        assert compensated == ["hotel", "flight"]  # reverse order
        assert trail[-1] == "saga_compensated"
        done = runner.begin("travel-desk",
                            f"airflow/agentpost_booking_saga/{accepted['run_id']}").view()
        assert done.state.value == "completed"


def check_route(store: EnvelopeStore, result: dict[str, Any]) -> None:
    """Three actors, `split` fans out to three words: `shout` and `count` run as three
    mapped tasks each; the family succeeded, each word enriched by both actors."""
    from agentpost.factories.routes import root_ids
    from agentpost.store.routes import RouteStore

    assert result["run"] == "success", result
    tasks = result["tasks"]
    assert [t for t in tasks if t.startswith("split[")] == ["split[0]"]
    assert sorted(t for t in tasks if t.startswith("shout[")) == [f"shout[{i}]" for i in range(3)]
    assert sorted(t for t in tasks if t.startswith("count[")) == [f"count[{i}]" for i in range(3)]
    assert set(tasks.values()) == {"success"}, tasks
    (root,) = root_ids("agentpost_route_example", result["run_id"], 1)
    family = RouteStore(store).family(root)
    assert family.status.value == "succeeded" and len(family.members) == 3
    words = sorted(store.get(m.envelope_id).content for m in family.members)
    # enrichment: each actor's result is merged onto its input (docs/asya.md)
    text = {"text": "route me please"}
    assert sorted((json.loads(w) for w in words), key=lambda p: p["word"]) == [
        {**text, "word": "ME", "length": 2}, {**text, "word": "PLEASE", "length": 6},
        {**text, "word": "ROUTE", "length": 5}]


def check_coordinator(store: EnvelopeStore, result: dict[str, Any]) -> None:
    """Directives to both workers, a query in reply to worker-a's, feedback in reply to the
    query; every inbox consumed (the query acked by its mapped AckOperator, the directives
    and the feedback by the workers' consume tasks)."""
    assert result["run"] == "success", result
    assert set(result["tasks"].values()) == {"success"}, result["tasks"]
    directives = {e.to: e for e in (store.get(i) for i in _ids(store, "directive"))
                  if e.from_ == "coordinator-1"}
    (query,) = [store.get(i) for i in _ids(store, "query")]
    (feedback,) = [store.get(i) for i in _ids(store, "feedback")]
    assert set(directives) == {"worker-a", "worker-b"}
    assert query.in_reply_to == directives["worker-a"].id
    assert (feedback.to, feedback.in_reply_to) == ("worker-a", query.id)
    for envelope in (*directives.values(), query, feedback):
        assert envelope.consumed_at is not None, envelope
    for ws in ("coordinator-1", "worker-a", "worker-b"):
        assert store.inbox(ws) == []


def _ids(store: EnvelopeStore, kind: str) -> list[str]:
    """Ids of every envelope of type `kind`, from the trail."""
    return sorted({e.envelope_id for e in store.trail(event="envelope_created")
                   if store.get(e.envelope_id).type == kind})


def check_nacks(store: EnvelopeStore, result: dict[str, Any]) -> None:
    """`handle` acked "ok" (its return value is the XCom) and nacked "bad", failing the try
    with the handler's error; the mapped NackOperator gave "bad" back with an hour's delay."""
    assert result["tasks"] == {"setup": "success", "send[0]": "success",
                               "send[1]": "success", "handle": "failed",
                               "lease_left": "success", "delay[0]": "success"}, result
    ok, bad = _by_content(store, "w-n")
    assert ok.consumed_at is not None
    assert bad.consumed_at is None and store.leasable("w-n") == 0
    assert store.next_due("w-n") > 3000  # held back by the nack's delay
    nacks = [e for e in store.trail(envelope_id=bad.id) if "nack" in e.event]
    assert len(nacks) == 2, [e.event for e in store.trail(envelope_id=bad.id)]


def _by_content(store: EnvelopeStore, ws: str) -> tuple[Any, Any]:
    found = {store.get(i).content: store.get(i) for i in _ids(store, "directive")
             if store.get(i).to == ws}
    return found["ok"], found["bad"]
