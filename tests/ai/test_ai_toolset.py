"""AgentpostToolset through a real pydantic-ai Agent: the model is pydantic-ai's own
FunctionModel, scripting the tool calls; the toolset, the store (through the agentpost
connection) and the mark space are real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentpost.ai import AgentpostToolset
from agentpost.store import EnvelopeStore
from ai_support import SCOPES, topology, written
from test_airflow_inbox import CONN_VAR, connection_json


@pytest.fixture
def office(store: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> EnvelopeStore:
    topology(store)
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    return store


def parts(messages: list[ModelMessage], kind: type) -> list[Any]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, kind)]


def scripted(steps: list[list[ToolCallPart]], seen: dict[str, Any]) -> FunctionModel:
    """A model that makes the calls of step n on its n-th turn, then answers "done"; it keeps
    what it was told (tool descriptions, tool returns, retry prompts) in `seen`."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        seen["tools"] = {t.name: t for t in info.function_tools}
        returns = parts(messages, ToolReturnPart)
        # a refusal (ModelRetry) comes back as a return marked "retried"; a validation
        # error of the arguments as a retry prompt
        seen["returns"] = [r for r in returns if getattr(r, "outcome", None) != "retried"]
        seen["retries"] = [*parts(messages, RetryPromptPart),
                           *(r for r in returns if getattr(r, "outcome", None) == "retried")]
        if turn < len(steps):
            return ModelResponse(parts=steps[turn])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def test_an_agent_sends_reads_replies_and_acks_through_the_toolset(
        office: EnvelopeStore, dsn: str) -> None:
    asked = office.send("boss", "w1", "directive", "deploy api").envelope_id
    seen: dict[str, Any] = {}
    steps = [
        [ToolCallPart("read_inbox", {"limit": 5}, tool_call_id="t1")],
        # a recipient w1 may not send to: refused, nothing written, the reason to the model
        [ToolCallPart("send_envelope", {"to": "w2", "type": "query", "content": "psst"},
                      tool_call_id="t2")],
        [ToolCallPart("reply", {"envelope_id": asked, "content": "deployed"},
                      tool_call_id="t3"),
         ToolCallPart("ack", {"envelope_id": asked}, tool_call_id="t4")],
    ]
    toolset = AgentpostToolset("w1", space="ai", scopes=SCOPES, agent="w1-agent")
    agent = Agent(scripted(steps, seen), toolsets=[toolset])
    before_refusal: dict[str, Any] = {}

    original = toolset.execute_tool

    async def watching(name: str, tool_args: dict[str, Any], **kw: Any) -> Any:
        if name == "send_envelope":
            before_refusal.update(written(dsn))
            try:
                return await original(name, tool_args, **kw)
            finally:
                before_refusal["after"] = written(dsn)
        return await original(name, tool_args, **kw)

    toolset.execute_tool = watching  # type: ignore[method-assign]
    result = agent.run_sync("Handle your inbox.")
    assert result.output == "done"

    # the model was told the seat's facts
    assert "boss: query" in seen["tools"]["send_envelope"].description
    assert seen["tools"]["claim"].parameters_json_schema["required"] == [
        "scope", "resource", "action"]
    # the refused call came back as a retry prompt with the reason, and wrote nothing
    retry = [r for r in seen["retries"] if r.tool_name == "send_envelope"]
    assert retry and "may not send to 'w2'" in str(retry[0].content)
    after = before_refusal.pop("after")
    assert after == before_refusal
    # the calls that went through: leased, replied, acked, each with the run on the trail
    returned = {r.tool_name: r.content for r in seen["returns"]}
    assert returned["read_inbox"]["envelopes"][0]["envelope_id"] == asked
    assert returned["ack"] == {"envelope_id": asked, "acked": True}
    reply = office.get(returned["reply"]["envelope_id"])
    assert reply.in_reply_to == asked and reply.to == "boss"
    assert reply.meta["tool_call"]["call_id"] == "t3"
    assert office.get(asked).consumed_at is not None


def test_bad_arguments_are_the_models_to_fix(office: EnvelopeStore) -> None:
    """Arguments the schema refuses (a control character in an id, a huge limit) never reach
    the tools: pydantic-ai sends the validation errors back as a retry prompt."""
    seen: dict[str, Any] = {}
    steps = [[ToolCallPart("read_inbox", {"limit": 10**9}, tool_call_id="a"),
              ToolCallPart("ack", {"envelope_id": "x\u0007y"}, tool_call_id="b")]]
    agent = Agent(scripted(steps, seen), toolsets=[AgentpostToolset("w1")])
    before = len(office.trail(limit=100000))
    assert agent.run_sync("go").output == "done"
    assert {r.tool_name for r in seen["retries"]} == {"read_inbox", "ack"}
    assert len(office.trail(limit=100000)) == before
    # no mark space given: no mark tools offered
    assert "claim" not in seen["tools"] and "send_envelope" in seen["tools"]


def test_a_store_that_is_away_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentpost.protocol.errors import StoreUnavailable

    monkeypatch.setenv(CONN_VAR, json.dumps({"conn_type": "agentpost", "host": "127.0.0.1",
                                             "port": 1, "login": "postgres",
                                             "schema": "nowhere"}))
    agent = Agent(scripted([], {}), toolsets=[AgentpostToolset("w1")])
    with pytest.raises(StoreUnavailable):
        agent.run_sync("go")


def test_the_toolset_is_templated_like_its_siblings() -> None:
    toolset = AgentpostToolset("{{ params.seat }}", agentpost_conn_id="{{ params.conn }}")
    assert set(toolset.agent_template_fields) >= {"workspace_id", "agentpost_conn_id"}
    with pytest.raises(ValueError, match="unknown tools"):
        AgentpostToolset("w1", tools=["rm_rf"])


def test_outside_a_task_a_mutating_command_waits_in_the_ledger(office: EnvelopeStore
                                                               ) -> None:
    """With no Airflow task to pause (a plain pydantic-ai run), `command_approval="airflow"`
    acts as "ledger": submit_command answers confirmation_required and the run goes on,
    asking nobody; an unknown approval mode is refused when the toolset is built."""
    from agentpost.smcl import CommandLedger

    office.register_type("deploy", ["worker"], ["worker"])
    seen: dict[str, Any] = {}
    steps = [[ToolCallPart("submit_command", {"key": "d1", "action": "deploy",
                                              "mutating": True}, tool_call_id="a")]]
    agent = Agent(scripted(steps, seen), toolsets=[AgentpostToolset("w1")])
    assert agent.run_sync("go").output == "done"
    (returned,) = seen["returns"]
    assert returned.content["state"] == "confirmation_required"
    with CommandLedger(office) as ledger:
        view = ledger.find("w1", "d1")
    assert view is not None and view.state.value == "confirmation_required"
    with pytest.raises(ValueError, match="command_approval must be 'airflow' or 'ledger'"):
        AgentpostToolset("w1", command_approval="email")  # type: ignore[arg-type]


def test_importing_agentpost_ai_without_the_extra_says_how_to_install(tmp_path: Path) -> None:
    import subprocess
    import sys

    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['pydantic_ai'] = None\n")
    import os

    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "import agentpost.ai"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "pip install 'airflow-agentpost[ai]'" in proc.stderr


def test_a_guarded_tool_runs_only_on_allow_and_writes_its_action(office: EnvelopeStore,
                                                                  dsn: str) -> None:
    """A user tool wrapped by `guarded`: on a resource another agent holds (CONFLICT) it is
    not called and the model reads the verdict; on a free one it runs and its action mark is
    written after it, as the seat's agent."""
    from pydantic_ai.toolsets import FunctionToolset

    from agentpost.marks.postgres import PostgresMarkSpace
    from agentpost.tools import AgentTools
    from ai_support import agent as mark_agent

    deployed: list[str] = []

    def deploy(service: str) -> str:
        """Deploy a service."""
        deployed.append(service)
        return f"{service} deployed"

    with PostgresMarkSpace(dsn=dsn, scopes=SCOPES, space="ai") as space:
        rival = AgentTools(office, workspace_id="w2", marks=space, agent=mark_agent("rival"))
        held = rival.call("claim", {"scope": "deploys", "resource": "api",
                                    "action": "deploy", "confidence": 0.9})
        assert held["allowed"]
        rival.guarded_call(lambda: "done", scope="deploys", resource="api",
                           intent_action="deploy", result_action="deployed", confidence=0.9)

        seat = AgentpostToolset("w1", space="ai", scopes=SCOPES, agent="w1-agent")
        guarded = seat.guarded(FunctionToolset([deploy]), scope="deploys",
                               resource=lambda _name, args: args["service"],
                               intent_action="deploy", result_action="deployed",
                               confidence=0.3)
        seen: dict[str, Any] = {}
        steps = [[ToolCallPart("deploy", {"service": "api"}, tool_call_id="d1")],
                 [ToolCallPart("deploy", {"service": "web"}, tool_call_id="d2")]]
        assert Agent(scripted(steps, seen), toolsets=[seat, guarded]).run_sync("go").output \
            == "done"
        assert deployed == ["web"]
        retry = [r for r in seen["retries"] if r.tool_name == "deploy"]
        assert retry and "CONFLICT" in str(retry[0].content) and "'api'" in str(retry[0].content)
        assert [r.content for r in seen["returns"] if r.tool_name == "deploy"] == ["web deployed"]
        actions = [m for m in space.read("deploys", resource="web")
                   if m.mark_type.value == "action"]
        assert [(a.action, a.result) for a in actions] == [("deployed", {"value": "web deployed"})]
        me = seat._agent().id
        assert actions[0].agent_id == me
