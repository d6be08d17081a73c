"""AgentOperator(toolsets=[AgentpostToolset(...)]) in a real Airflow: `dag.test()` in a
subprocess with its own AIRFLOW_HOME and SQLite metadata database (tests/airflow's pattern),
the store reached through the `agentpost_default` connection.

The model is the one stand-in, pydantic-ai's FunctionModel. AgentOperator takes no model
object: it builds its agent with `self.llm_hook.create_agent(...)`, and the hook's `get_conn()`
is the model. The seam used here is that one: a `PydanticAIHook` whose `get_conn` returns the
FunctionModel, given by an `AgentOperator` subclass overriding `llm_hook`. Everything else
(rendering the toolset's templated fields, masking, the agent loop, tool retries) is
AgentOperator's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentpost.store import EnvelopeStore
from ai_support import topology
from test_airflow_commands import run_dag

DAG = r'''
from __future__ import annotations

import json
import os
from functools import cached_property

import pendulum
from airflow.providers.common.ai.hooks.pydantic_ai import PydanticAIHook
from airflow.providers.common.ai.operators.agent import AgentOperator
from airflow.sdk import DAG
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from agentpost.ai import AgentpostToolset
from agentpost.marks import Scope


def script(messages, info):
    """read the inbox; send to a workspace it may not reach (refused); reply to each
    envelope, ack it and claim the resource it names; then report what it saw."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart)]
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("read_inbox", {"limit": 5}, tool_call_id="r1")])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart(
            "send_envelope", {"to": "w2", "type": "query", "content": "psst"},
            tool_call_id="s1")])
    if turn == 2:
        inbox = next(r.content for r in returns if r.tool_name == "read_inbox")
        calls = []
        for i, env in enumerate(inbox["envelopes"]):
            calls += [ToolCallPart("reply", {"envelope_id": env["envelope_id"],
                                             "content": "on it"}, tool_call_id=f"p{i}"),
                      ToolCallPart("ack", {"envelope_id": env["envelope_id"]},
                                   tool_call_id=f"a{i}"),
                      ToolCallPart("claim", {"scope": "deploys", "resource": env["content"],
                                             "action": "deploy", "confidence": 0.8},
                                   tool_call_id=f"c{i}")]
        return ModelResponse(parts=calls)
    refused = [r.content for r in returns if r.tool_name == "send_envelope"]
    claims = [r.content["verdict"] for r in returns if r.tool_name == "claim"]
    return ModelResponse(parts=[TextPart(json.dumps({"refused": refused, "claims": claims}))])


class ScriptedHook(PydanticAIHook):
    def get_conn(self):
        return FunctionModel(script)


class ScriptedAgentOperator(AgentOperator):
    @cached_property
    def llm_hook(self):
        return ScriptedHook(llm_conn_id=self.llm_conn_id)


with DAG("agent_dag", schedule=None, start_date=pendulum.datetime(2026, 1, 1),
         params={"seat": "w1"}) as the_dag:
    ScriptedAgentOperator(
        task_id="agent", llm_conn_id="unused", prompt="Handle your inbox.",
        toolsets=[AgentpostToolset("{{ params.seat }}", space="ops",
                                   scopes=[Scope(name="deploys", allowed_intent_verbs=("deploy",),
                                                 allowed_action_verbs=("deployed",))],
                                   agent="deployer")])

if __name__ == "__main__":
    from airflow.utils.db import initdb

    initdb()
    run = the_dag.test()
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    out = {"run": str(run.state), "run_id": run.run_id,
           "tasks": {t: str(ti.state) for t, ti in tis.items()},
           "output": tis["agent"].xcom_pull(task_ids="agent")}
    print("AGENTPOST-RESULT " + json.dumps(out), flush=True)
'''


@pytest.mark.slow
def test_agent_operator_with_the_toolset_in_dag_test(store: EnvelopeStore, dsn: str,
                                                      tmp_path: Path) -> None:
    topology(store)
    asked = store.send("boss", "w1", "directive", "api").envelope_id
    result, output = run_dag(tmp_path, dsn, DAG, "agent_dag.py")
    assert result["tasks"] == {"agent": "success"}, output[-4000:]
    said = result["output"]
    if isinstance(said, str):  # the agent's text; AgentOperator may hand on parsed JSON
        said = json.loads(said)
    # the refused send reached the model as its reason; the claim was allowed
    assert len(said["refused"]) == 1 and "may not send to 'w2'" in said["refused"][0]
    assert said["claims"] == ["ALLOW"]
    # the reply carries the task instance as the run; the lease and ack name it as holder
    reply = next(e for e in store.inbox("boss") if e.in_reply_to == asked)
    run = reply.meta["tool_call"]["run"]
    assert run["by"] == "airflow"
    assert run["attrs"]["dag_id"] == "agent_dag" and run["attrs"]["task_id"] == "agent"
    assert run["attrs"]["run_id"] == result["run_id"]
    holder = run["ref"]
    assert holder == f"af:agent_dag:agent:{result['run_id']}"
    events = {e.event: e for e in store.trail(envelope_id=asked)}
    assert events["envelope_leased"].body["holder"] == holder
    assert events["envelope_consumed"].body["holder"] == holder
    # the refused send wrote nothing: w2's inbox and trail chain are empty
    assert store.inbox("w2") == []
    assert store.trail(workspace_id="w2", event="envelope_delivered") == []
    assert store.verify_trail().ok
