"""The LLM examples of dags/ (the research desk, the shared staging environment, the refund
desk): they parse without a store or a model, and their flows run under `dag.test()` against
the real store.

The DAGs run are the examples' fleet files built by the fleet factory, as the example DAG
files build them, with one difference: `agent_dags(..., agent_operator_class=...)` gets an
AgentOperator subclass whose `llm_hook` returns a PydanticAIHook whose model is a
FunctionModel (tests/ai/test_ai_agent_operator.py's seam). Each scripted model behaves as the
example's prompt asks, from what its tools return: it reads, decides by the envelope types
and verdicts it sees, and acts through the tools. One subprocess (its own AIRFLOW_HOME and
SQLite metadata database, the store through `agentpost_default`) runs every step in turn.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentpost.fleet import apply, load_fleet
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from test_airflow_inbox import CONN_VAR, airflow_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"agentpost_research_desk": "research_desk.yaml",
            "agentpost_shared_staging": "shared_staging.yaml",
            "agentpost_refund_desk": "refund_desk.yaml"}

SCRIPTED = r'''
"""Written by tests/ai/test_ai_examples.py: the LLM examples' fleets with scripted models,
run with dag.test() in the order the command line gives."""
from __future__ import annotations

import json
import sys
from functools import cached_property
from pathlib import Path

from airflow.models.xcom import XComModel
from airflow.providers.common.ai.hooks.pydantic_ai import PydanticAIHook
from airflow.providers.common.ai.operators.agent import AgentOperator
from airflow.utils.session import create_session
from pydantic_ai.messages import (ModelRequest, ModelResponse, RetryPromptPart, TextPart,
                                  ToolCallPart, ToolReturnPart)
from pydantic_ai.models.function import FunctionModel

from agentpost.factories.fleet import agent_dags

HERE = Path(__file__).parent


def turn(messages):
    return sum(isinstance(m, ModelResponse) for m in messages)


def returned(messages, tool):
    """What `tool` returned (its successful calls), oldest first."""
    return [p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart) and p.tool_name == tool]


def refused(messages):
    return [str(p.content) for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, RetryPromptPart)]


def call(tool, args, n):
    return ToolCallPart(tool, args, tool_call_id=f"{tool}-{n}")


def done(messages, **said):
    said["refused"] = refused(messages)
    return ModelResponse(parts=[TextPart(json.dumps(said))])


def coordinator(messages, info):
    """Ask both researchers about each request; report the answers to the newsroom."""
    if turn(messages) == 0:
        return ModelResponse(parts=[call("read_inbox", {"limit": 10}, 0)])
    if turn(messages) == 1:
        inbox = returned(messages, "read_inbox")[0]["envelopes"]
        calls, answers = [], []
        for i, env in enumerate(inbox):
            if env["type"] == "research.request":
                calls += [call("send_envelope", {"to": f"researcher-{part}",
                                                 "type": "research.ask",
                                                 "content": f"{env['content']} (part {part})"},
                               f"{i}{part}") for part in "ab"]
            elif env["type"] == "research.answer":
                answers.append(env)
            calls.append(call("ack", {"envelope_id": env["envelope_id"]}, i))
        if answers:
            calls.append(call("send_envelope", {
                "to": "newsroom", "type": "research.report",
                "content": {"answers": [{"by": a["sender"], "text": a["content"],
                                         "answers": a["in_reply_to"]} for a in answers]}},
                "report"))
        if calls:  # an empty inbox (an earlier run took it): nothing to do
            return ModelResponse(parts=calls)
    sent = returned(messages, "send_envelope")
    return done(messages, sent=[s["type"] for s in sent],
                acked=len(returned(messages, "ack")))


def researcher(name):
    def answer(messages, info):
        if turn(messages) == 0:
            return ModelResponse(parts=[call("read_inbox", {"limit": 10}, 0)])
        if turn(messages) == 1:
            calls = []
            for i, env in enumerate(returned(messages, "read_inbox")[0]["envelopes"]):
                if env["type"] == "research.ask":
                    calls.append(call("reply", {"envelope_id": env["envelope_id"],
                                                "type": "research.answer",
                                                "content": f"{name} on: {env['content']}"}, i))
                calls.append(call("ack", {"envelope_id": env["envelope_id"]}, i))
            if calls:
                return ModelResponse(parts=calls)
        return done(messages, replied=len(returned(messages, "reply")))
    return answer


def release(name):
    def deploy(messages, info):
        if turn(messages) == 0:
            return ModelResponse(parts=[call("claim", {
                "scope": "environments", "resource": "staging", "action": "deploy",
                "confidence": 0.6}, 0)])
        claim = returned(messages, "claim")[0]
        if turn(messages) == 1 and claim["verdict"] == "ALLOW":
            return ModelResponse(parts=[call("write_mark", {
                "kind": "observation", "scope": "environments", "topic": "deployment",
                "content": f"{name} deploys its release candidate to staging",
                "confidence": 0.9}, 1)])
        if turn(messages) == 1:
            return ModelResponse(parts=[call("read_marks", {"scope": "environments",
                                                            "topic": "deployment"}, 1)])
        seen = [m["fields"].get("content") for r in returned(messages, "read_marks")
                for m in r["marks"]]
        return done(messages, verdict=claim["verdict"], winner=claim["winning_agent"],
                    reason=claim["reason"],
                    deferred_to=seen, deployed=claim["allowed"])
    return deploy


def refunds(messages, info):
    """Submit each requested refund as a command (the call waits for a person); tell the
    customer what the person decided."""
    if turn(messages) == 0:
        return ModelResponse(parts=[call("read_inbox", {"limit": 10}, 0)])
    inbox = [e for e in returned(messages, "read_inbox")[0]["envelopes"]
             if e["type"] == "refund.request"]
    if turn(messages) == 1 and not inbox:  # an earlier run took it: nothing to do
        return done(messages, commands=[])
    if turn(messages) == 1:
        return ModelResponse(parts=[call("submit_command", {
            "key": f"refund/{e['content']['order']}", "action": "refund",
            "executor": "payments", "mutating": True,
            "args": {"order": e["content"]["order"], "amount": e["content"]["amount"]}}, i)
            for i, e in enumerate(inbox)])
    submitted = returned(messages, "submit_command")
    if turn(messages) == 2:
        calls = []
        for i, (env, command) in enumerate(zip(inbox, submitted, strict=True)):
            if isinstance(command, str):  # the person rejected the call: its reason
                status, command_id = "declined", None
            else:
                status = {"confirmed": "approved"}.get(command["state"], command["state"])
                command_id = command["command_id"]
            calls += [call("reply", {"envelope_id": env["envelope_id"], "type": "refund.status",
                                     "content": {"order": env["content"]["order"],
                                                 "status": status,
                                                 "command_id": command_id}}, i),
                      call("ack", {"envelope_id": env["envelope_id"]}, i)]
        return ModelResponse(parts=calls)
    return done(messages, commands=[[c["command_id"], c["state"]] if isinstance(c, dict)
                                    else [None, c] for c in submitted])


SCRIPTS = {"agent_desk_coordinator": coordinator,
           "agent_desk_researcher-a": researcher("researcher-a"),
           "agent_desk_researcher-b": researcher("researcher-b"),
           "agent_releases_release-a": release("release-a"),
           "agent_releases_release-b": release("release-b"),
           "agent_shop_refunds": refunds}


class ScriptedHook(PydanticAIHook):
    def __init__(self, script, **kwargs):
        super().__init__(**kwargs)
        self.script = script

    def get_conn(self):
        return FunctionModel(self.script)


class ScriptedAgentOperator(AgentOperator):
    @cached_property
    def llm_hook(self):
        return ScriptedHook(SCRIPTS[self.dag_id], llm_conn_id=self.llm_conn_id)


dags = {}
for fleet in ("research_desk.yaml", "shared_staging.yaml", "refund_desk.yaml"):
    dags.update(agent_dags(HERE / fleet, agent_operator_class=ScriptedAgentOperator))

def approve_as(person, stop, answered):
    """A person approving, through Airflow's own HITL handler (the REST API's), every
    approval request a task parks on."""
    import time

    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.datamodels.hitl import UpdateHITLDetailPayload
    from airflow.api_fastapi.core_api.routes.public.hitl import update_hitl_detail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState

    while not stop.is_set():
        with create_session() as session:
            ti = session.query(TaskInstance).filter_by(
                state=TaskInstanceState.AWAITING_INPUT).first()
            if ti is not None:
                update_hitl_detail(
                    dag_id=ti.dag_id, dag_run_id=ti.run_id, task_id=ti.task_id,
                    update_hitl_detail_payload=UpdateHITLDetailPayload(
                        chosen_options=["Approve"]),
                    user=SimpleAuthManagerUser(username=person, role="admin"),
                    session=session, map_index=ti.map_index)
                answered.append(ti.dag_id)
        time.sleep(0.3)


if __name__ == "__main__":
    import threading

    from airflow.utils.db import initdb

    initdb()
    stop, answered = threading.Event(), []
    threading.Thread(target=approve_as, args=("alice", stop, answered), daemon=True).start()
    for dag_id in json.loads(sys.argv[1]):
        run = dags[dag_id].test()
        with create_session() as session:
            found = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                       task_id="agent", key="return_value")
            output = [XComModel.deserialize_value(x) for x in found]
        said = output[0] if output else None
        print("AGENTPOST-STEP " + json.dumps({
            "dag": dag_id, "run": str(run.state), "run_id": run.run_id,
            "tasks": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
            "said": json.loads(said) if isinstance(said, str) else said,
            "approved": answered.count(dag_id)}), flush=True)
    stop.set()
'''


def test_the_llm_examples_parse_without_a_store_or_a_model(tmp_path: Path) -> None:
    """The example DAG files parse in a DagBag with no store and no model connection: one
    DAG per agent of each fleet file, its one task an AgentOperator on the documented model
    connection, seated as the agent's workspace (and, where the fleet has scopes, its
    mark-space agent), offered the tools its manifest names; the reactive ones scheduled on
    their inbox assets, the release agents on demand."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for module, fleet in EXAMPLES.items():
        shutil.copy(ROOT / "dags" / f"{module}.py", dags)
        shutil.copy(ROOT / "dags" / fleet, dags)
    script = tmp_path / "bag.py"
    script.write_text(f'''
import json
from airflow.dag_processing.dagbag import DagBag

bag = DagBag({str(dags)!r})
out = {{"errors": {{k: v.splitlines()[-1] for k, v in bag.import_errors.items()}}, "dags": {{}}}}
for d in bag.dags.values():
    (task,) = d.tasks
    (seat,) = task.toolsets
    agent = seat.agent
    out["dags"][d.dag_id] = {{
        "operator": type(task).__name__, "task": task.task_id, "conn": task.llm_conn_id,
        "workspace": seat.workspace_id, "space": seat.space, "tools": seat.tools,
        "agent": getattr(agent, "name", agent), "limits": task.usage_limits,
        "schedule": sorted(a.name for a in getattr(d.schedule, "objects", ())) or
                    (None if d.schedule is None else str(d.schedule)),
        "tags": sorted(d.tags)}}
print("BAG " + json.dumps(out))
''')
    env = airflow_env(tmp_path, "postgresql://nowhere.invalid/none")
    del env[CONN_VAR]
    env = {k: v for k, v in env.items() if not k.startswith(("OPENAI", "ANTHROPIC"))}
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BAG ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    bag = json.loads(lines[-1].removeprefix("BAG "))
    assert bag["errors"] == {}
    found = bag["dags"]
    assert sorted(found) == [
        "agent_desk_coordinator", "agent_desk_researcher-a", "agent_desk_researcher-b",
        "agent_releases_release-a", "agent_releases_release-b", "agent_shop_refunds"]
    for dag in found.values():
        assert (dag["operator"], dag["task"], dag["conn"]) == (
            "AgentOperator", "agent", "pydanticai_default")
        assert dag["tags"] == ["agent", "agentpost", "llm-example"]
    assert found["agent_desk_coordinator"] | {"limits": None} == {
        **found["agent_desk_coordinator"], "workspace": "desk", "space": None,
        "tools": ["read_inbox", "send_envelope", "ack"], "agent": None,
        "schedule": ["agentpost-inbox-desk"], "limits": None}
    assert found["agent_desk_coordinator"]["limits"] == {"request_limit": 20,
                                                         "tool_calls_limit": 30}
    assert found["agent_desk_researcher-b"]["schedule"] == ["agentpost-inbox-researcher-b"]
    assert found["agent_desk_researcher-b"]["tools"] == ["read_inbox", "reply", "ack"]
    assert {k: found["agent_releases_release-a"][k] for k in
            ("workspace", "space", "agent", "schedule", "tools")} == {
        "workspace": "release-a", "space": "releases", "agent": "release-a",
        "schedule": None, "tools": ["claim", "read_marks", "write_mark"]}
    assert found["agent_shop_refunds"]["schedule"] == ["agentpost-inbox-support"]
    assert "submit_command" in found["agent_shop_refunds"]["tools"]


def run_steps(tmp_path: Path, dsn: str, steps: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Run the DAGs `steps` (dag ids, in order) in one private Airflow; each DAG's runs."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for fleet in EXAMPLES.values():
        shutil.copy(ROOT / "dags" / fleet, dags)
    (dags / "scripted_examples.py").write_text(SCRIPTED)
    proc = subprocess.run([sys.executable, str(dags / "scripted_examples.py"),
                           json.dumps(steps)], env=airflow_env(tmp_path, dsn), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    results = [json.loads(line.removeprefix("AGENTPOST-STEP "))
               for line in proc.stdout.splitlines() if line.startswith("AGENTPOST-STEP ")]
    assert proc.returncode == 0 and len(results) == len(steps), output[-8000:]
    runs: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        assert (result["run"], result["tasks"]) == ("success", {"agent": "success"}), \
            (result, output[-6000:])
        runs.setdefault(result["dag"], []).append(result)
    return runs


@pytest.mark.slow
def test_the_llm_examples_run(store: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """The three fleets applied, a research request and a refund request sent; then the desk
    (coordinator, both researchers, coordinator again), the two release agents and the
    refund agent, each a dag.test() run of its fleet DAG. Each check says what it asserts."""
    for fleet in EXAMPLES.values():
        apply(store, load_fleet(ROOT / "dags" / fleet))
    request = store.send("newsroom", "desk", "research.request",
                         "What limits battery life in the cold?").envelope_id
    refund = store.send("customers", "support", "refund.request",
                        {"order": "A-1001", "amount": 42}, format="json").envelope_id
    runs = run_steps(tmp_path, dsn, [
        "agent_desk_coordinator", "agent_desk_researcher-a", "agent_desk_researcher-b",
        "agent_desk_coordinator", "agent_releases_release-a", "agent_releases_release-b",
        "agent_shop_refunds"])
    check_research_desk(store, runs, request)
    check_shared_staging(store, dsn, runs)
    check_refund(store, runs, refund)
    assert store.verify_trail().ok


def _created(store: EnvelopeStore, etype: str) -> list[Any]:
    ids = {e.envelope_id for e in store.trail(event="envelope_created")}
    return sorted((e for e in map(store.get, ids) if e.type == etype), key=lambda e: e.to)


def check_research_desk(store: EnvelopeStore, runs: dict[str, Any], request: str) -> None:
    """The coordinator's first run asked each researcher once and acked the request; each
    researcher answered its question in reply and acked it; the second run reported both
    answers to the newsroom and acked them. Every desk inbox is empty, and each envelope an
    agent sent records the run (dag and run id) that sent it."""
    first, second = runs["agent_desk_coordinator"]
    assert first["said"] == {"sent": ["research.ask"] * 2, "acked": 1, "refused": []}
    assert second["said"] == {"sent": ["research.report"], "acked": 2, "refused": []}
    asks = _created(store, "research.ask")
    assert [(a.from_, a.to) for a in asks] == [("desk", "researcher-a"),
                                               ("desk", "researcher-b")]
    answers = _created(store, "research.answer")
    assert {a.in_reply_to: a.from_ for a in answers} == {
        asks[0].id: "researcher-a", asks[1].id: "researcher-b"}
    (report,) = _created(store, "research.report")
    assert (report.from_, report.to) == ("desk", "newsroom")
    reported = json.loads(report.content)["answers"]
    assert sorted((r["by"], r["answers"]) for r in reported) == [
        ("researcher-a", asks[0].id), ("researcher-b", asks[1].id)]
    assert all("What limits battery life" in r["text"] for r in reported)
    for envelope in (store.get(request), *asks, *answers):
        assert envelope.consumed_at is not None, envelope
    for ws in ("desk", "researcher-a", "researcher-b"):
        assert store.inbox(ws) == []
    for envelope, dag in ((asks[0], "agent_desk_coordinator"),
                          (answers[0], f"agent_desk_{answers[0].from_}"),
                          (report, "agent_desk_coordinator")):
        run = envelope.meta["tool_call"]["run"]
        assert run["attrs"]["dag_id"] == dag
        assert run["attrs"]["run_id"] in {r["run_id"] for r in runs[dag]}
    assert [e.id for e in store.inbox("newsroom")] == [report.id]


def check_shared_staging(store: EnvelopeStore, dsn: str, runs: dict[str, Any]) -> None:
    """release-a claimed staging first and was ALLOWed; it recorded its deployment as an
    observation. release-b's claim got CONFLICT naming release-a's agent (its fleet id),
    so it deployed nothing and read release-a's observation instead. In the mark space:
    one intent per agent on staging, and one observation, release-a's."""
    from agentpost.marks.postgres import PostgresMarkSpace

    fleet = load_fleet(ROOT / "dags" / "shared_staging.yaml")
    a, b = fleet.agent("release-a"), fleet.agent("release-b")
    (won,) = runs["agent_releases_release-a"]
    (lost,) = runs["agent_releases_release-b"]
    assert won["said"] | {"deferred_to": None, "reason": None} == {
        "verdict": "ALLOW", "winner": None, "deployed": True, "refused": [], "reason": None,
        "deferred_to": None}
    assert (lost["said"]["verdict"], lost["said"]["deployed"]) == ("CONFLICT", False)
    assert lost["said"]["winner"] == str(a.id)
    assert lost["said"]["deferred_to"] == ["release-a deploys its release candidate to staging"]
    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    try:
        marks = space.read(scope="environments", reader=b)
    finally:
        space.close()
    by_kind: dict[str, list[Any]] = {}
    for mark in marks:
        by_kind.setdefault(mark.mark_type.value, []).append(mark)
    assert sorted(m.agent_id for m in by_kind["intent"]) == sorted([a.id, b.id])
    assert {m.resource for m in by_kind["intent"]} == {"staging"}
    assert [m.agent_id for m in by_kind["observation"]] == [a.id]


def check_refund(store: EnvelopeStore, runs: dict[str, Any], refund: str) -> None:
    """The refund agent submitted one command `refund` for payments, keyed by the order, with
    the order's arguments, and its task paused for a person (common-ai's tool approval). A
    person, alice, approved the call in Airflow (its HITL handler): the command was confirmed
    in the ledger with alice as the confirming person (the human highway: a
    command.confirmation envelope from human:alice), before the approved call returned. The
    customer got a refund.status reply saying approved and naming the command; the request
    was acked by the resumed run (the lease the paused half took)."""
    (run,) = runs["agent_shop_refunds"]
    assert run["approved"] == 1, run
    ((command_id, state),) = run["said"]["commands"]
    assert state == "confirmed" and run["said"]["refused"] == [], run
    with CommandLedger(store) as ledger:
        view = ledger.find("support", "refund/A-1001")
        assert view is not None and view.command_id == command_id
        assert (view.state.value, view.confirmed_by) == ("confirmed", "human:alice"), view
        evidence = ledger.evidence(command_id)
        submitted = evidence[0].body
        assert submitted["action"] == "refund" and submitted["executor"] == "payments"
        assert submitted["context"]["tool_call"]["run"]["attrs"]["dag_id"] == \
            "agent_shop_refunds"
        (status,) = store.inbox("customers")
        assert (status.type, status.in_reply_to) == ("refund.status", refund)
        assert json.loads(status.content) == {"order": "A-1001", "status": "approved",
                                              "command_id": command_id}
        assert store.get(refund).consumed_at is not None
