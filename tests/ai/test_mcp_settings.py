"""The MCP endpoint's settings in Airflow's configuration (`agentpost.web.mcpconfig`): each
setting read as documented, and a wrong one refused with a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentpost.marks import ConflictPolicy, Scope
from agentpost.protocol.errors import ConfigurationError
from agentpost.web.mcpconfig import KEYS, airflow_mcp_options, options_from
from test_mcp_http import FLEET


def test_nothing_set_is_no_options() -> None:
    assert options_from({}) == {}
    assert options_from(dict.fromkeys(KEYS)) == {}


def test_a_space_and_its_scopes_as_on_the_command_line() -> None:
    options = options_from({"mcp_space": "ops",
                            "mcp_scopes": "deploys:deploy,redeploy:deployed\n  reviews"})
    assert options == {"space": "ops", "scopes": [
        Scope(name="deploys", allowed_intent_verbs=("deploy", "redeploy"),
              allowed_action_verbs=("deployed",)),
        Scope(name="reviews")]}
    assert options_from({"mcp_space": "ops"}) == {"space": "ops", "scopes": []}


def test_a_fleet_gives_its_space_and_its_scopes_whole(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    options = options_from({"mcp_fleet": str(path)})
    assert options["space"] == "releases"
    [scope] = options["scopes"]
    assert scope.name == "environments" and scope.conflict_policy is ConflictPolicy.FIRST_WRITER
    path.write_text("version: 1\nname: bare\nspace: quiet\n")
    assert options_from({"mcp_fleet": str(path)}) == {}  # no scopes: no mark tools


def test_the_rate_limit() -> None:
    assert options_from({"mcp_token_rate": "2.5", "mcp_token_burst": "7"}) == {
        "token_rate": 2.5, "token_burst": 7}
    assert options_from({"mcp_token_rate": "OFF"}) == {"token_rate": None}


def test_the_token_cache() -> None:
    assert options_from({"mcp_token_cache": "0.5"}) == {"token_cache": 0.5}
    assert options_from({"mcp_token_cache": "0"}) == {"token_cache": 0.0}


@pytest.mark.parametrize(("settings", "named"), [
    ({"mcp_scopes": "deploys"}, "mcp_scopes needs mcp_space"),
    ({"mcp_space": "ops", "mcp_scopes": "deploys :deploy"}, "mcp_scopes: bad --scope"),
    ({"mcp_fleet": "fleet.yaml", "mcp_space": "ops"}, "leave mcp_space and mcp_scopes"),
    ({"mcp_fleet": "/nonexistent/fleet.yaml"}, "mcp_fleet: /nonexistent/fleet.yaml"),
    ({"mcp_token_rate": "0"}, "mcp_token_rate = '0'"),
    ({"mcp_token_rate": "-1"}, "mcp_token_rate"),
    ({"mcp_token_rate": "nan"}, "mcp_token_rate"),
    ({"mcp_token_rate": "fast"}, "mcp_token_rate"),
    ({"mcp_token_burst": "0"}, "mcp_token_burst = '0'"),
    ({"mcp_token_burst": "1.5"}, "mcp_token_burst"),
    ({"mcp_token_cache": "-1"}, "mcp_token_cache = '-1'"),
    ({"mcp_token_cache": "inf"}, "mcp_token_cache"),
    ({"mcp_token_cache": "soon"}, "mcp_token_cache"),
])
def test_a_wrong_setting_is_refused_by_name(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^\[agentpost\] ") as caught:
        options_from(settings)
    assert named in str(caught.value)


def test_airflow_configuration_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in KEYS:
        monkeypatch.delenv(f"AIRFLOW__AGENTPOST__{key.upper()}", raising=False)
    assert airflow_mcp_options() == {}
    monkeypatch.setenv("AIRFLOW__AGENTPOST__MCP_SPACE", " ops ")
    monkeypatch.setenv("AIRFLOW__AGENTPOST__MCP_SCOPES", "deploys:deploy")
    monkeypatch.setenv("AIRFLOW__AGENTPOST__MCP_TOKEN_BURST", "3")
    assert airflow_mcp_options() == {
        "space": "ops", "scopes": [Scope(name="deploys", allowed_intent_verbs=("deploy",))],
        "token_burst": 3}
