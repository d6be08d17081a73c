"""The agents page (issue 24, page part) on a real Airflow API app and tool calls made
through real `AgentTools` seats: one run as an Airflow task instance (mapped, its run id
with a UTC offset, as Airflow writes them), one over MCP. Every call must show on its
seat's page in order, linked to the task instance that made it, also a lease and an ack
recorded on a consumer lane; an envelope an agent sent links back to its task."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.store import EnvelopeStore
from agentpost.tools import AgentTools, RunInfo
from agentpost.web.links import parse_af_ref, run_link
from ai_support import SCOPES, agent
from dbtools import inbox_held
from web_support import Web, airflow_web

RUN_ID = "manual__2026-11-27T10:00:00+00:00"
AF = RunInfo(by="airflow", ref=f"af:desk:agent:{RUN_ID}:3",
             attrs={"dag_id": "desk", "task_id": "agent", "run_id": RUN_ID, "map_index": 3,
                    "try_number": 1})
MCP = RunInfo(by="mcp", ref="mcp:stdio:w2:4242-abcd",
              attrs={"transport": "stdio", "workspace": "w2", "pid": 4242})
TI_URL = ("/dags/desk/runs/manual__2026-11-27T10%3A00%3A00%2B00%3A00/tasks/agent/mapped/3")


@pytest.fixture(scope="module")
def calls(module_dsn: str) -> Iterator[dict[str, Any]]:
    """boss directs w1; w1's Airflow run reads its inbox, acks, sends a query back,
    submits a command, writes an observation and claims a resource (an intent); w2's MCP
    run sends one envelope. What each call returned."""
    with (EnvelopeStore(module_dsn) as store,
          PostgresMarkSpace(dsn=module_dsn, scopes=SCOPES, space="desk") as space):
        store.create_workspace("coordinator", workspace_id="boss")
        store.create_workspace("worker", parent="boss", workspace_id="w1")
        store.create_workspace("worker", parent="boss", workspace_id="w2")
        boss = AgentTools(store, workspace_id="boss")
        w1 = AgentTools(store, workspace_id="w1", run=AF)
        w2 = AgentTools(store, workspace_id="w2", run=MCP)
        directive = boss.call("send_envelope", {"to": "w1", "type": "directive",
                                                "content": "look into it"})
        # another consumer of w1's inbox mid-lease: the read and the ack are recorded on
        # one of its consumer lanes (sql/0083), which the page reads as w1's own
        with inbox_held(module_dsn, "w1"):
            read = w1.call("read_inbox", {"limit": 5}, call_id="c1")
            w1.call("ack", {"envelope_id": directive["envelope_id"]}, call_id="c2")
        assert {e.chain[:5] for e in store.trail(envelope_id=directive["envelope_id"])
                if e.event in ("envelope_leased", "envelope_consumed")} == {"lane:"}
        query = w1.call("send_envelope", {"to": "boss", "type": "query",
                                          "content": {"q": "which?"}}, call_id="c3")
        command = w1.call("submit_command", {"key": "k1", "action": "query",
                                             "executor": "boss", "mutating": False},
                          call_id="c4")
        marker = AgentTools(store, workspace_id="w1", marks=space, agent=agent("w1-agent"),
                            run=AF)
        seen = marker.call("write_mark", {"kind": "observation", "scope": "deploys",
                                          "topic": "health", "content": "green",
                                          "confidence": 0.8}, call_id="c5")
        claim = marker.call("claim", {"scope": "deploys", "resource": "api",
                                      "action": "deploy"}, call_id="c6")
        over_mcp = w2.call("send_envelope", {"to": "boss", "type": "query",
                                             "content": "from mcp"}, call_id="mcp:7")
        yield {"directive": directive, "read": read, "query": query, "command": command,
               "mcp": over_mcp, "seen": seen, "claim": claim}


@pytest.fixture(scope="module")
def web(module_dsn: str, calls: dict[str, Any]) -> Iterator[Web]:
    with airflow_web(module_dsn) as page:
        yield page


def _rows(page: str) -> list[dict[str, str]]:
    body = page.split('<table id="calls">', 1)[1].split("</table>", 1)[0]
    return [{"kind": m[0], "tool": m[1], "ref": html.unescape(m[2]), "row": m[3]}
            for m in re.findall(r'<tr data-kind="([^"]*)" data-tool="([^"]*)" '
                                r'data-ref="([^"]*)">(.*?)</tr>', body, re.S)]


def test_a_seat_shows_its_tool_calls_newest_first_linked_to_the_task(
        web: Web, calls: dict[str, Any]) -> None:
    response = web.client("viewer").get("/agentpost/agents/w1")
    assert response.status_code == 200
    rows = _rows(response.text)
    assert [(r["kind"], r["tool"]) for r in rows] == [
        ("mark", "claim"), ("mark", "write_mark"), ("command", "submit_command"),
        ("envelope", "send_envelope"), ("ack", "ack"), ("lease", "read_inbox")]
    assert {r["ref"] for r in rows} == {AF.ref}
    for r in rows:
        assert f'href="{TI_URL}"' in r["row"], r
    assert calls["claim"]["verdict"] == "ALLOW" and calls["claim"]["intent_id"]
    assert f'href="/agentpost/marks/{calls["claim"]["intent_id"]}?space=desk"' in rows[0]["row"]
    assert "intent in deploys" in rows[0]["row"] and "api" in rows[0]["row"]
    assert f'href="/agentpost/marks/{calls["seen"]["mark_id"]}?space=desk"' in rows[1]["row"]
    assert "observation in deploys" in rows[1]["row"]
    rows = rows[2:]
    query = calls["query"]["envelope_id"]
    directive = calls["directive"]["envelope_id"]
    assert f'href="/agentpost/envelopes/{query}"' in rows[1]["row"]
    assert f'href="/agentpost/envelopes/{directive}"' in rows[2]["row"]
    assert f'href="/agentpost/envelopes/{directive}"' in rows[3]["row"]
    assert f'href="/agentpost/commands/{calls["command"]["command_id"]}"' in rows[0]["row"]
    # boss made its call from a plain Python seat: no tool call of a run shows under w1
    assert "tools:boss" not in response.text


def test_an_mcp_run_shows_its_transport_and_no_task_link(web: Web) -> None:
    rows = _rows(web.client("viewer").get("/agentpost/agents/w2").text)
    assert [(r["kind"], r["ref"]) for r in rows] == [("envelope", MCP.ref)]
    assert "MCP (stdio)" in rows[0]["row"]
    assert "/dags/" not in rows[0]["row"]


def test_the_limit_keeps_the_newest(web: Web) -> None:
    rows = _rows(web.client("viewer").get("/agentpost/agents/w1?limit=3").text)
    assert [r["tool"] for r in rows] == ["claim", "write_mark", "submit_command"]
    data = web.client("viewer").get("/agentpost/api/agents/w1?limit=1").json()
    assert [(c["kind"], c["tool"]) for c in data["calls"]] == [("mark", "claim")]
    assert data["calls"][0]["run"]["url"] == TI_URL


def test_the_index_lists_seats_with_their_latest_call(web: Web) -> None:
    page = web.client("viewer").get("/agentpost/agents").text
    assert 'href="/agentpost/agents"' in page and 'aria-current="page">Agents' in page
    w1 = re.search(r'<tr data-workspace="w1">(.*?)</tr>', page, re.S)[1]
    assert "claim" in w1 and f'href="{TI_URL}"' in w1
    w2 = re.search(r'<tr data-workspace="w2">(.*?)</tr>', page, re.S)[1]
    assert "MCP (stdio)" in w2
    boss = re.search(r'<tr data-workspace="boss">(.*?)</tr>', page, re.S)[1]
    assert "send_envelope" in boss and "tools:boss:" in boss  # a plain Python run, no link
    assert "/dags/" not in boss
    later = web.client("viewer").get("/agentpost/api/agents?after=boss").json()
    assert [s["workspace_id"] for s in later["seats"]] == ["w1", "w2"]


def test_an_envelope_sent_by_a_task_links_back_to_it(web: Web, calls: dict[str, Any]
                                                      ) -> None:
    page = web.client("viewer").get(f"/agentpost/envelopes/{calls['query']['envelope_id']}"
                                    ).text
    sent_by = re.search(r'<td class="tool-call" id="tool-call">(.*?)</td>', page, re.S)[1]
    assert "send_envelope" in sent_by and f'href="{TI_URL}"' in sent_by
    assert 'href="/agentpost/agents/w1"' in sent_by
    mcp = web.client("viewer").get(f"/agentpost/envelopes/{calls['mcp']['envelope_id']}").text
    assert "MCP (stdio)" in mcp and "/dags/" not in mcp


@pytest.mark.parametrize("path", ["/agentpost/agents/w1?limit=0",
                                  "/agentpost/agents/w1?limit=501",
                                  "/agentpost/agents/w1?limit=many",
                                  "/agentpost/api/agents/w1?limit=-1",
                                  "/agentpost/agents?after=" + "x" * 300])
def test_bad_parameters_are_a_400(web: Web, path: str) -> None:
    response = web.client("viewer").get(path)
    assert response.status_code == 400, response.text
    assert "limit" in response.text or "after" in response.text


def test_an_unknown_seat_is_a_404(web: Web) -> None:
    assert web.client("viewer").get("/agentpost/agents/nobody").status_code == 404


def test_anonymous_callers_are_refused(web: Web) -> None:
    for path in ("/agentpost/agents", "/agentpost/agents/w1", "/agentpost/api/agents/w1"):
        assert web.client(None).get(path).status_code == 401


def test_an_af_ref_is_read_without_its_attrs() -> None:
    assert parse_af_ref(AF.ref) == {"dag_id": "desk", "task_id": "agent", "run_id": RUN_ID,
                                    "map_index": 3}
    assert parse_af_ref(f"af:desk:agent:{RUN_ID}")["map_index"] is None  # "+00:00" is no map
    assert parse_af_ref("af:desk:agent:r:0")["map_index"] == 0
    assert parse_af_ref("mcp:stdio:w1:1-2") is None
    assert run_link(None, AF.ref)["url"] == TI_URL  # a lease holder: only the ref
    assert run_link(None, "bench-tail")["url"] is None
