"""The fleet file's ``llm:`` block (docs/fleet.md): what it declares, and the clear errors
for what it may not. Pure: no store, no Airflow; the model imports no agent framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpost.fleet import FleetError, fleet_from_dict, load_fleet
from agentpost.fleet.model import DEFAULT_LLM_CONN_ID, LLM_TOOLS

ROOT = Path(__file__).resolve().parents[2]
DESK = ROOT / "dags" / "research_desk.yaml"
STAGING = ROOT / "dags" / "shared_staging.yaml"


def staging(**llm: Any) -> dict[str, Any]:
    """The shared staging fleet, release-a's llm block updated (None removes a key)."""
    data = yaml.safe_load(STAGING.read_text())
    block = data["agents"][0]["llm"]
    for key, value in llm.items():
        if value is None:
            block.pop(key, None)
        else:
            block[key] = value
    return data


def test_the_example_llm_agents_are_read_as_declared() -> None:
    """The examples' llm blocks: prompts, the connection (the documented default),
    tools, limits; a YAML alias shares one block between two agents; the schedule and seat
    are the agent's, as for a code agent."""
    desk = load_fleet(DESK)
    coordinator = desk.agent_def("coordinator")
    assert coordinator.llm is not None and coordinator.callable is None
    assert coordinator.llm.llm_conn_id == DEFAULT_LLM_CONN_ID == "pydanticai_default"
    assert coordinator.llm.tools == ("read_inbox", "send_envelope", "ack")
    assert coordinator.llm.usage_limits is not None
    assert coordinator.llm.usage_limits.model_dump(exclude_none=True) == {
        "request_limit": 20, "tool_calls_limit": 30}
    assert (coordinator.kind, coordinator.inboxes) == ("reactive", ("desk",))
    a, b = desk.agent_def("researcher-a"), desk.agent_def("researcher-b")
    assert a.llm == b.llm and a.workspace != b.workspace
    release = load_fleet(STAGING).agent_def("release-a")
    assert release.kind == "manual" and release.llm is not None
    assert release.llm.model_id is None and release.llm.lease_ttl == 300


def test_a_bad_llm_block_is_a_clear_error() -> None:
    """Each mistake names the file, the agent and the problem on one line."""
    cases = [
        (staging(tools=["claim", "launch_missiles"]), "agents[0] (release-a).llm.tools: "
         "unknown tool 'launch_missiles'; the tools are send_envelope, read_inbox"),
        (staging(tools=["claim", "claim"]), "tool 'claim' is listed twice"),
        (staging(tools=[]), "an empty tool list offers the model nothing"),
        (staging(prompt=None), "agents[0] (release-a).llm.prompt: missing (required)"),
        (staging(prompt=""), "agents[0] (release-a).llm.prompt: String should have at least 1"),
        (staging(temperature=0.2), "agents[0] (release-a).llm.temperature: unknown field"),
        (staging(llm_conn_id="my conn"), "agents[0] (release-a).llm.llm_conn_id: String "
         "should match pattern"),
        (staging(usage_limits={"request_limit": 0}),
         "llm.usage_limits.request_limit: Input should be greater than 0"),
        (staging(usage_limits={"requests": 5}), "llm.usage_limits.requests: unknown field"),
        (staging(usage_limits={"request_limit": "5"}), "Input should be a valid integer"),
        (staging(max_retries=-1), "llm.max_retries: Input should be greater than or equal"),
    ]
    for data, expected in cases:
        with pytest.raises(FleetError) as caught:
            fleet_from_dict(data, "staging.yaml")
        assert str(caught.value).startswith("staging.yaml: "), str(caught.value)
        assert expected in str(caught.value), (expected, str(caught.value))


def test_an_llm_agent_must_agree_with_the_rest_of_its_manifest() -> None:
    """Both a callable and an llm; no workspace for the seat; an inbox input not its own
    (read_inbox reads only the seat's inbox); mark tools in a fleet without
    scopes; write_mark or claim for an agent without write permissions; claim without both
    intent and action permissions (the guard would deny every claim)."""
    def problem(edit: Any, source: Path = STAGING) -> str:
        data = yaml.safe_load(source.read_text())
        edit(data)
        with pytest.raises(FleetError) as caught:
            fleet_from_dict(data, "f.yaml")
        return str(caught.value)

    assert "agents[0] (release-a): declares both callable and llm" in problem(
        lambda d: d["agents"][0].update(callable="mod:fn"))
    assert "an LLM agent needs a workspace" in problem(
        lambda d: d["agents"][0].update(workspace=None, outputs=[]))
    assert ("input inbox 'researcher-a' is not the agent's workspace: an LLM agent reads "
            "only its own inbox ('desk')") in problem(
        lambda d: d["agents"][0].update(inputs=[{"inbox": "researcher-a"}]), DESK)
    assert "llm.tools names 'read_marks' but the fleet defines no scopes" in problem(
        lambda d: d["agents"][0]["llm"].update(tools=["read_inbox", "read_marks"]), DESK)
    assert "llm.tools names 'claim' but the agent may write no marks" in problem(
        lambda d: d["agents"][0].update(scopes={}, outputs=[]))
    assert "no scope lets the agent write both intent and action marks" in problem(
        lambda d: d["agents"][0].update(scopes={"environments": ["intent", "observation"]},
                                        outputs=[]))
    # read_marks alone needs no write permission; every tool (tools left out) is allowed
    data = yaml.safe_load(STAGING.read_text())
    data["agents"][0].update(scopes={}, outputs=[])
    data["agents"][0]["llm"] = {"prompt": "look", "tools": ["read_marks"]}
    data["agents"][1]["llm"] = {"prompt": "do anything"}
    fleet = fleet_from_dict(data, "f.yaml")
    assert fleet.agent_def("release-b").llm.tools is None  # type: ignore[union-attr]


def test_the_fleet_model_imports_no_agent_framework_or_airflow() -> None:
    """Reading a fleet with LLM agents needs neither the ai extra nor Airflow (the fleet
    model is below the Airflow layer)."""
    code = ("import sys\nfrom agentpost.fleet import load_fleet\n"
            f"f = load_fleet({str(DESK)!r})\n"
            "assert f.agent_def('coordinator').llm is not None\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('airflow', 'pydantic_ai')]\nprint(sorted(bad))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_llm_tools_cover_every_agent_tool() -> None:
    """The fleet model's list of tool names (it may not import agentpost.tools) is the
    tools' catalogue."""
    from agentpost.tools import TOOLS

    assert sorted(LLM_TOOLS) == sorted(spec.name for spec in TOOLS)
