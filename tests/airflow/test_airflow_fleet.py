"""The fleet's DAGs in real Airflow: the example DAGs of dags/ parse without a store; the
factories refuse a bad fleet at parse time; and, under `dag.test()` against the real store,
deferred resolution works across processes (Markspace §6.2.1, P12, P15, P16, P17), the
parking example allocates every spot once, the source agent observes, the maintenance DAG
checkpoints, and an agent whose fleet was never applied fails with the store's reason.

dag.test() runs in a subprocess with its own AIRFLOW_HOME and SQLite metadata database (the
pattern of tests/airflow/test_airflow_inbox.py); several DAG runs share one subprocess, and the two
subprocesses of the slow test share one metadata database, so Airflow is set up once.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Airflow reads its configuration once, at first import (see
# tests/airflow/test_airflow_commands.py).
if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="agentpost-airflow-home-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import json
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpost.factories.boundary import boundary_dag
from agentpost.factories.fleet import agent_dag, agent_dags
from agentpost.factories.maintenance import checkpoints, maintenance_dag
from agentpost.fleet import FleetError, apply, fleet_from_dict, load_fleet
from agentpost.store import EnvelopeStore
from dbtools import connect, rows
from statsd_support import StatsdReceiver
from test_airflow_inbox import CONN_VAR, airflow_env
from test_fleet import EXAMPLE, _notifications, example

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"

RUNNER = '''
"""Written by tests/airflow/test_airflow_fleet.py: dag.test() the repository's example DAGs in the
order AGENTPOST_TEST_STEPS gives, printing each run's task states and return values."""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ["AGENTPOST_TEST_DAGS"])

from airflow.sdk import DAG

import agentpost_fleet_agents
import agentpost_maintenance
import agentpost_parking

import ghost_agent

dags = {d.dag_id: d for m in (agentpost_fleet_agents, agentpost_parking, agentpost_maintenance,
                              ghost_agent)
        for d in vars(m).values() if isinstance(d, DAG)}

home = Path(os.environ["AIRFLOW_HOME"])
if not (home / "initialized").exists():
    from airflow.utils.db import initdb

    initdb()
    (home / "initialized").touch()

from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

# what a task process does at start (task_runner.main) and dag.test() skips: Airflow's metrics
# as [metrics] configures them (here StatsD to the test's receiver)
from airflow.sdk._shared.observability.metrics import stats
from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

stats.initialize(factory=get_stats_factory(), export_legacy_names=False)

for step in json.loads(os.environ["AGENTPOST_TEST_STEPS"]):
    run = dags[step["dag"]].test(run_conf=step.get("conf"))
    with create_session() as session:
        found = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                   key="return_value")
        xcom = {x.task_id: XComModel.deserialize_value(x) for x in found}
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("AGENTPOST-STEP " + json.dumps({"dag": step["dag"], "run": str(run.state),
                                          "tasks": states, "xcom": xcom}, default=str),
          flush=True)
'''


def private_airflow(tmp_path: Path, dsn: str, **env: str) -> dict[str, str]:
    """airflow_env() with a copy of the repository's dags/ as its DAGs folder (dag.test()
    serializes a DAG from its bundle, the DAGs folder) and the runner beside it."""
    shutil.copytree(DAGS, tmp_path / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "runner.py").write_text(RUNNER)
    environment = airflow_env(tmp_path, dsn)
    environment.update(AGENTPOST_TEST_DAGS=str(tmp_path / "dags"), **env)
    return environment

GHOST_DAG = '''
"""Written by tests/airflow/test_airflow_fleet.py: an Airflow DAG of an agent whose fleet file
(ghost.yaml) was never applied to the store."""
from pathlib import Path

from agentpost.factories.fleet import agent_dag

ghost = agent_dag(Path(__file__).with_name("ghost.yaml"), "ghost", fn=lambda ctx: "never")
'''


def run_steps(environment: dict[str, str], steps: list[dict[str, Any]]
              ) -> tuple[list[dict[str, Any]], str]:
    """Run `steps` ({"dag": id, "conf": {...}}) in one dag.test() subprocess; each step's
    result and the whole output."""
    home = Path(environment["AIRFLOW_HOME"]).parent
    proc = subprocess.run([sys.executable, str(home / "runner.py")],
                          env={**environment, "AGENTPOST_TEST_STEPS": json.dumps(steps)},
                          cwd=home, capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    results = [json.loads(line.removeprefix("AGENTPOST-STEP "))
               for line in proc.stdout.splitlines() if line.startswith("AGENTPOST-STEP ")]
    assert proc.returncode == 0 and len(results) == len(steps), output[-6000:]
    return results, output


# -- parse time -----------------------------------------------------------------------------------


def test_the_example_dags_parse_without_a_store(tmp_path: Path) -> None:
    """Example DAGs must parse in a DagBag with no store configured (no connection, no
    AGENTPOST_DSN): nothing touches the store at parse time. Source agents run on their
    interval, one run at a time, no catchup (P56); the boundary and maintenance DAGs take
    params."""
    script = tmp_path / "bag.py"
    script.write_text(f'''
import json
from airflow.dag_processing.dagbag import DagBag

bag = DagBag({str(DAGS)!r})
print("BAG " + json.dumps({{
    "errors": {{k: v.splitlines()[-1] for k, v in bag.import_errors.items()}},
    "dags": {{d.dag_id: [str(d.schedule), d.max_active_runs, d.catchup,
                         sorted(d.params.keys()), [t.task_id for t in d.tasks]]
              for d in bag.dags.values()}}}}))
''')
    environment = airflow_env(tmp_path, "postgresql://nowhere.invalid/none")
    del environment[CONN_VAR]
    proc = subprocess.run([sys.executable, str(script)], env=environment, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BAG ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    bag = json.loads(lines[-1].removeprefix("BAG "))
    assert bag["errors"] == {}
    dags = bag["dags"]
    assert dags["agent_city_driver-a"] == ["0:05:00", 1, False, [], ["activate"]]
    assert dags["agent_city_weather-poller"][:3] == ["0:10:00", 1, False]
    assert dags["agent_city_dispatcher"][1:] == [1, False, [], ["activate"]]  # on its inbox
    assert dags["boundary_city"] == ["0:01:00", 1, False, ["resource", "scopes"], ["resolve"]]
    assert dags["agentpost_maintenance"] == [
        "0:05:00", 1, False, ["checkpoint_dir", "keep", "trail_archive", "trail_retention_days"],
        ["maintain", "verify", "checkpoint", "archive_and_prune"]]
    assert dags["agentpost_command_example"]


def _fleet_file(tmp_path: Path, edit: Any) -> Path:
    data = example()
    edit(data)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_bad_manifest_fails_the_parse_with_a_clear_message(tmp_path: Path) -> None:
    """An unknown role, envelope type or workspace in a manifest fails when the DAG file is
    parsed, naming the file and the entry; so does agent code that cannot be imported, a
    callable for an agent the fleet lacks, and a boundary DAG without a deferred scope."""
    cases = [
        (lambda d: d["agents"][0].update(workspace="nowhere"),
         "agents[0] (driver-a): unknown workspace 'nowhere'"),
        (lambda d: d["workspaces"][1].update(role="pilot"),
         "workspaces[1] (driver-a): unknown role 'pilot'"),
        (lambda d: d["agents"][3]["outputs"][1].update(envelope="weather.upd"),
         "agents[3] (weather-poller): output envelope type 'weather.upd' is not defined"),
        (lambda d: d["agents"][0].update(callable="agentpost_agents.nope:park"),
         "agent 'driver-a': cannot load agentpost_agents.nope:park: No module named"),
    ]
    sys.path.insert(0, str(DAGS))
    try:
        for edit, expected in cases:
            path = _fleet_file(tmp_path, edit)
            with pytest.raises(FleetError) as caught:
                agent_dags(path, kinds=["source"])
            assert str(caught.value).startswith(f"{path}: "), str(caught.value)
            assert expected in str(caught.value)
    finally:
        sys.path.remove(str(DAGS))
    with pytest.raises(FleetError, match="a callable was given for an agent the fleet does"):
        agent_dags(EXAMPLE, callables={"driver-z": print})
    no_deferred = _fleet_file(tmp_path, lambda d: d["scopes"][0].update(deferred=False))
    with pytest.raises(FleetError, match="no scope is deferred"):
        boundary_dag(no_deferred)


def test_a_reactive_agent_is_scheduled_on_its_inbox_asset() -> None:
    """A reactive agent's DAG is scheduled on an Asset watched by InboxEventTrigger on its
    inbox (the reactive factory's asset), one run at a time."""
    from agentpost.triggers import InboxEventTrigger

    dag = agent_dag(EXAMPLE, "dispatcher", fn=print, agentpost_conn_id="city_store")
    (asset,) = dag.schedule.objects
    (watcher,) = asset.watchers
    assert asset.name == "agentpost-inbox-dispatch"
    assert isinstance(watcher.trigger, InboxEventTrigger)
    assert (watcher.trigger.workspace_id, watcher.trigger.agentpost_conn_id) == (
        "dispatch", "city_store")
    assert dag.max_active_runs == 1


def test_factories_take_python_callables_and_dag_arguments() -> None:
    """The agent's code may be given in Python (it wins over the manifest's); DAG arguments
    pass through; the maintenance DAG refuses to keep no checkpoint."""
    dags = agent_dags(EXAMPLE, callables={"weather-poller": print}, kinds=["source"],
                      default_args={"retries": 2}, tags=["city"])
    assert sorted(dags) == ["agent_city_driver-a", "agent_city_driver-b",
                            "agent_city_driver-c", "agent_city_weather-poller"]
    poller = dags["agent_city_weather-poller"]
    assert poller.tags == {"city"} and poller.default_args == {"retries": 2}
    assert poller.schedule == timedelta(minutes=10)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        maintenance_dag(keep=0)


# -- dag.test() against the real store -----------------------------------------------------------


def pre_action_in_a_process(dsn: str, names: list[str], resource: str) -> list[Any]:
    """In another process: each agent asks the guard for `resource` with its confidence
    from the fleet file; (verdict, winner's agent name or None) each."""
    from agentpost.marks import Guard
    from agentpost.marks.postgres import PostgresMarkSpace

    fleet = load_fleet(EXAMPLE)
    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    ids = {fleet.agent(a.name).id: a.name for a in fleet.agents}
    try:
        guard = Guard(space)
        found = []
        for name in names:
            confidence = fleet.agent_def(name).config["confidence"]
            decision = guard.pre_action(fleet.agent(name), "parking", resource, "park",
                                        confidence)
            winner = decision.winning_intent
            found.append((decision.verdict.value,
                          None if winner is None else ids.get(winner.agent_id)))
        return found
    finally:
        space.close()


def in_processes(dsn: str, plans: list[list[str]], resource: str) -> list[list[Any]]:
    """One spawned process per plan (a list of agent names), all at once."""
    with multiprocessing.get_context("spawn").Pool(len(plans)) as pool:
        return pool.starmap(pre_action_in_a_process, [(dsn, p, resource) for p in plans])


@pytest.fixture
def city(store: EnvelopeStore) -> Iterator[EnvelopeStore]:
    apply(store, load_fleet(EXAMPLE))
    yield store


def drivers() -> list[dict[str, str]]:
    return [{"dag": f"agent_city_driver-{k}"} for k in "abc"]


@pytest.mark.slow
def test_fleet_dags_under_dag_test(city: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    with ExitStack() as stack:
        _fleet_dags_under_dag_test(city, dsn, tmp_path, stack)


def _fleet_dags_under_dag_test(city: EnvelopeStore, dsn: str, tmp_path: Path,
                               stack: ExitStack) -> None:
    """Markspace §6.2.1 across processes, then the examples end to end.

    1. Two agents' pre_action in two other processes: BLOCKED, pending (phase 1).
    2. The boundary DAG (dag.test(), a manual trigger with params) resolves: its summary
       names the most confident agent (P15), and each verdict is NOTIFYed (sql/0040).
    3. The same agents in new processes now see ALLOW (the winner) and BLOCKED with the
       winner (the loser): the verdicts are the space's, not the boundary process's (P16,
       P17).
    4. The parking example: three drivers want spot-1..3; activations and scheduled
       boundaries alternate until each holds a different spot, the most confident the
       first; nobody acts without a boundary's ALLOW.
    5. The source agent observes and reports; the maintenance DAG runs twice, the second
       verifying against the first's checkpoint; an agent of a fleet that was never applied
       fails with the store's reason, not a SQL traceback.
    """
    statsd = stack.enter_context(StatsdReceiver())
    environment = private_airflow(tmp_path, dsn,
                                  AGENTPOST_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
                                  **statsd.airflow_env())
    ghost = tmp_path / "dags" / "ghost.yaml"
    ghost.write_text(yaml.safe_dump({
        "name": "ghosts", "workspaces": [{"id": "ghost", "role": "worker"}],
        "agents": [{"name": "ghost", "workspace": "ghost"}]}))
    (tmp_path / "dags" / "ghost_agent.py").write_text(GHOST_DAG)

    first = in_processes(dsn, [["driver-a"], ["driver-c"]], "spot-9")
    assert first == [[("blocked", None)], [("blocked", None)]]

    listener = connect(dsn)
    try:
        rows(listener, "LISTEN agentpost_verdict")
        results, _ = run_steps(environment, [
            {"dag": "boundary_city", "conf": {"resource": "spot-9", "scopes": ["parking"]}}])
        heard = _notifications(listener, 2)
    finally:
        listener.close()
    (boundary,) = results
    assert boundary["run"] == "success", boundary
    assert boundary["xcom"]["resolve"] == [
        {"scope": "parking", "resource": "spot-9", "winner": "driver-c",
         "verdicts": {"driver-a": "blocked", "driver-c": "allow"}}]
    agents = load_fleet(EXAMPLE)
    assert sorted(heard) == sorted(str(agents.agent(n).id) for n in ("driver-a", "driver-c"))

    after = in_processes(dsn, [["driver-a"], ["driver-c"]], "spot-9")
    assert after == [[("blocked", "driver-c")], [("allow", None)]]

    fleet = load_fleet(EXAMPLE)
    boundary_step = {"dag": "boundary_city"}
    steps = [*drivers(), boundary_step, *drivers(), boundary_step, *drivers(), boundary_step,
             *drivers(), {"dag": "agent_city_weather-poller"},
             {"dag": "agentpost_maintenance"}, {"dag": "agentpost_maintenance"},
             {"dag": "agent_ghosts_ghost"}]
    results, output = run_steps(environment, steps)
    outcome = [(r["dag"].removeprefix("agent_city_"), r["xcom"].get("activate"))
               for r in results[:15]]
    assert outcome == [
        ("driver-a", {"waiting": "spot-1"}), ("driver-b", {"waiting": "spot-1"}),
        ("driver-c", {"waiting": "spot-1"}), ("boundary_city", None),
        ("driver-a", {"waiting": "spot-2"}), ("driver-b", {"parked": "spot-1"}),
        ("driver-c", {"waiting": "spot-2"}), ("boundary_city", None),
        ("driver-a", {"waiting": "spot-3"}), ("driver-b", {"parked": "spot-1"}),
        ("driver-c", {"parked": "spot-2"}), ("boundary_city", None),
        ("driver-a", {"parked": "spot-3"}), ("driver-b", {"parked": "spot-1"}),
        ("driver-c", {"parked": "spot-2"}),
    ], output[-6000:]
    assert [r["run"] for r in results[:-1]] == ["success"] * (len(steps) - 1), output[-6000:]
    assert holders(dsn, fleet) == {"spot-1": ["driver-b"], "spot-2": ["driver-c"],
                                   "spot-3": ["driver-a"]}

    reports = sorted(e.type for e in city.inbox("dispatch"))
    assert reports == ["parking.report"] * 3 + ["weather.update"]
    poll = results[15]["xcom"]["activate"]
    assert set(poll) == {"observation"}

    first_maintenance, second_maintenance = results[16], results[17]
    assert first_maintenance["xcom"]["verify"]["anchor"] is None
    kept = checkpoints(tmp_path / "checkpoints")
    assert len(kept) == 2 and second_maintenance["xcom"]["verify"]["anchor"] == kept[0].name
    assert second_maintenance["xcom"]["checkpoint"] == json.loads(kept[1].read_text())

    # Airflow's metrics (StatsD here): the guard's verdicts, the boundaries' durations, and
    # the store's numbers the maintenance runs sent, as the store has them now
    sent = statsd.metrics()
    assert sent.get("airflow.agentpost.guard.verdict.allow", 0) >= 3, sorted(sent)
    assert sent.get("airflow.agentpost.guard.verdict.blocked", 0) >= 1, sorted(sent)
    assert "airflow.agentpost.guard.boundary" in sent
    assert sent["airflow.agentpost.inbox.dispatch.depth"] == len(city.inbox("dispatch")) == 4
    assert sent["airflow.agentpost.depth"] == city.metrics().total.depth
    assert 0 <= sent["airflow.agentpost.trail.verified_age_seconds"] < 600

    ghost_run = results[-1]
    assert (ghost_run["run"], ghost_run["tasks"]) == ("failed", {"activate": "failed"})
    assert ("agent ghost: NotFound: unknown workspace 'ghost' (apply the fleet first: "
            f"agentpost fleet apply {ghost})") in output
    assert "psycopg2" not in output


def holders(dsn: str, fleet: Any) -> dict[str, list[str]]:
    """Who holds each spot: the agents of the live actions on it (P39)."""
    from agentpost.marks.postgres import PostgresMarkSpace

    names = {fleet.agent(a.name).id: a.name for a in fleet.agents}
    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    try:
        return {spot: [names[a.agent_id] for a in space.claims("parking", spot)]
                for spot in ("spot-1", "spot-2", "spot-3")}
    finally:
        space.close()


def test_a_fleet_object_works_where_a_path_does_and_is_checked_the_same() -> None:
    """A DAG file may build its fleet in code: a Fleet object gives the same DAGs, and one
    built directly (bypassing the file's checks) is checked as a file would be."""
    from agentpost.fleet.model import Fleet

    fleet = fleet_from_dict(example(), "in-code")
    assert sorted(agent_dags(fleet, kinds=["source"])) == sorted(
        agent_dags(EXAMPLE, kinds=["source"]))
    data = example()
    data["agents"][0]["workspace"] = "nowhere"
    with pytest.raises(FleetError, match="agents\\[0\\] \\(driver-a\\): unknown workspace"):
        agent_dags(Fleet.model_validate(data))
