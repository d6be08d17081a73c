"""The fleet factory's LLM agents (agentpost.factories.fleet): the DAG of an agent with an
``llm:`` block is one AgentOperator seated as the agent, scheduled as a code agent would be;
the operator class is replaceable only by a subclass; a fleet of code agents needs no ai
extra, and an LLM agent without it fails naming it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Airflow reads its configuration once, at first import (tests/airflow/test_airflow_fleet.py)
if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="agentpost-airflow-home-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentpost.factories.fleet import agent_dag, agent_dags
from agentpost.fleet import FleetError, fleet_from_dict

ROOT = Path(__file__).resolve().parents[2]
STAGING = ROOT / "dags" / "shared_staging.yaml"
DESK = ROOT / "dags" / "research_desk.yaml"


def test_an_llm_agent_dag_is_an_agent_operator_seated_as_the_agent() -> None:
    """The task gets the manifest's prompts, connection, model and limits; its one toolset
    is the agent's workspace, the fleet's space and scopes, and the agent's Markspace Agent
    (the fleet's id and write permissions), offering the manifest's tools; the agentpost
    connection given to the factory reaches the toolset."""
    from airflow.providers.common.ai.operators.agent import AgentOperator

    from agentpost.ai import AgentpostToolset

    data = yaml.safe_load(STAGING.read_text())
    data["agents"][0]["llm"].update(model_id="openai:gpt-5", max_retries=2, lease_ttl=60)
    fleet = fleet_from_dict(data, str(STAGING))
    dag = agent_dag(fleet, "release-a", agentpost_conn_id="releases_store")
    (task,) = dag.tasks
    assert type(task) is AgentOperator and task.task_id == "agent"
    spec = fleet.agent_def("release-a").llm
    assert spec is not None
    assert (task.prompt, task.system_prompt, task.llm_conn_id, task.model_id) == (
        spec.prompt, spec.system_prompt, "pydanticai_default", "openai:gpt-5")
    assert task.usage_limits == {"request_limit": 10}
    (seat,) = task.toolsets
    assert isinstance(seat, AgentpostToolset)
    assert (seat.workspace_id, seat.agentpost_conn_id, seat.space) == (
        "release-a", "releases_store", "releases")
    assert [s.name for s in seat.scopes] == ["environments"]
    assert seat.agent == fleet.agent("release-a")
    assert seat.tools == ["claim", "read_marks", "write_mark"]
    assert (seat.lease_ttl, seat._max_retries) == (60.0, 2)
    assert dag.schedule is None and "llm" in dag.tags  # on demand, as in the file


def test_how_an_llm_agent_waits_for_a_person_is_the_fleets_to_say() -> None:
    """By default a mutating command pauses the agent for Airflow's tool approval with no
    time limit; `command_approval: ledger` lets it go on, `approval_timeout` becomes the
    operator's tool_approval_timeout; anything else is refused naming the field."""
    from datetime import timedelta

    data = yaml.safe_load(STAGING.read_text())
    fleet = fleet_from_dict(data, str(STAGING))
    (task,) = agent_dag(fleet, "release-a").tasks
    (seat,) = task.toolsets
    assert (seat.command_approval, task.tool_approval_timeout) == ("airflow", None)
    data["agents"][0]["llm"].update(command_approval="ledger", approval_timeout=3600)
    (task,) = agent_dag(fleet_from_dict(data, str(STAGING)), "release-a").tasks
    (seat,) = task.toolsets
    assert (seat.command_approval, task.tool_approval_timeout) == (
        "ledger", timedelta(hours=1))
    for bad in ({"command_approval": "email"}, {"approval_timeout": 0},
                {"approval_timeout": "soon"}):
        data["agents"][0]["llm"].update(command_approval="airflow", approval_timeout=None)
        data["agents"][0]["llm"].update(bad)
        with pytest.raises(FleetError, match=next(iter(bad))):
            fleet_from_dict(data, str(STAGING))


def test_a_reactive_llm_agent_runs_on_its_inbox_asset_like_a_code_agent() -> None:
    """Reactive LLM agents are scheduled on the same inbox asset (InboxEventTrigger) as
    code agents, one run at a time; a fleet without scopes gives its seat no mark space."""
    from agentpost.triggers import InboxEventTrigger

    dags = agent_dags(DESK, agentpost_conn_id="desk_store")
    coordinator = dags["agent_desk_coordinator"]
    (asset,) = coordinator.schedule.objects
    (watcher,) = asset.watchers
    assert asset.name == "agentpost-inbox-desk"
    assert isinstance(watcher.trigger, InboxEventTrigger)
    assert (watcher.trigger.workspace_id, watcher.trigger.agentpost_conn_id) == (
        "desk", "desk_store")
    assert coordinator.max_active_runs == 1 and coordinator.catchup is False
    (seat,) = coordinator.get_task("agent").toolsets
    assert (seat.space, seat.scopes, seat.agent) == (None, [], None)
    assert agent_dags(DESK, kinds=["source"]) == {}


def test_the_operator_class_seam_takes_only_a_subclass() -> None:
    """`agent_operator_class` replaces AgentOperator by a subclass (kwargs unchanged);
    anything else is refused, and so is a callable for an LLM agent (code agents keep
    theirs)."""
    from airflow.providers.common.ai.operators.agent import AgentOperator

    class Mine(AgentOperator):
        pass

    dags = agent_dags(DESK, agent_operator_class=Mine)
    assert {type(d.get_task("agent")) for d in dags.values()} == {Mine}
    with pytest.raises(TypeError, match="agent_operator_class must be AgentOperator or a "
                                        "subclass of it"):
        agent_dags(DESK, agent_operator_class=dict)
    with pytest.raises(FleetError, match=r"'coordinator'.*is an LLM agent \(llm:\): it runs "
                                         r"its model, not a callable"):
        agent_dags(DESK, callables={"coordinator": print})
    city = agent_dags(ROOT / "dags" / "fleet.yaml", callables={"dispatcher": print},
                      kinds=["reactive"], agent_operator_class=Mine)
    assert [t.task_id for t in city["agent_city_dispatcher"].tasks] == ["activate"]


def test_without_the_ai_extra_only_llm_agents_fail_naming_it(tmp_path: Path) -> None:
    """With pydantic-ai not importable: the code agents of dags/fleet.yaml still build; an
    LLM agent's DAG fails with an ImportError naming the fleet file, the agent and
    `pip install 'airflow-agentpost[ai]'`."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pydantic_ai'] = None\n")
    code = f'''
import sys
sys.path.insert(0, {str(ROOT / "dags")!r})
from agentpost.factories.fleet import agent_dags
print("CITY", sorted(agent_dags({str(ROOT / "dags" / "fleet.yaml")!r})))
try:
    agent_dags({str(DESK)!r})
except ImportError as exc:
    print("DESK", exc)
'''
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("CITY ", "DESK ")))
    assert "agent_city_dispatcher" in lines["CITY"]
    assert lines["DESK"].startswith(f"{DESK}: agent 'coordinator' is an LLM agent (llm:)")
    assert "pip install 'airflow-agentpost[ai]'" in lines["DESK"]

