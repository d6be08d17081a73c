"""The MCP endpoint of the plugin's app (``/agentpost/mcp``, streamable HTTP) served by a
real uvicorn on 127.0.0.1, driven by the `mcp` SDK's own client: a gateway capability token
fixes the seat; anonymous and unknown callers get 401 before any MCP; a token for w1 acts as
w1 and nothing else; the same tools and refusals as over stdio."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agentpost.gateway.tokens import TokenStore
from agentpost.mcpserver import TokenSeat, mark_agent
from agentpost.store import EnvelopeStore
from agentpost.web.app import create_app
from agentpost.web.mcpconfig import KEYS
from agentpost.web.plugin import plugin_app
from ai_support import SCOPES, written
from mcp_support import (
    SCOPE_ARG,
    SPACE,
    TOOLS,
    call_every_tool,
    check_refusals,
    error_text,
    result_json,
    seed,
)

W1 = ["senders:w1:send", "streams:agents/*/inbox:enqueue", "streams:agents/w1/inbox:subscribe"]
W2 = ["senders:w2:send", "streams:agents/*/inbox:enqueue", "streams:agents/w2/inbox:subscribe"]
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "0"}}}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


class Served:
    def __init__(self, url: str, store: EnvelopeStore, dsn: str) -> None:
        self.url = url
        self.store = store
        self.dsn = dsn
        self.tokens = TokenStore(store)

    def token(self, name: str, scopes: list[str]) -> tuple[str, str]:
        info, secret = self.tokens.create(name, scopes)
        return info.id, secret


def mounted(plugin: FastAPI) -> FastAPI:
    """`plugin` at /agentpost of an outer app, its lifespan run by the outer one's, as
    Airflow's API server mounts plugin apps."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with plugin.router.lifespan_context(plugin):
            yield

    outer = FastAPI(lifespan=lifespan)
    outer.mount("/agentpost", plugin)
    return outer


@contextmanager
def serve(plugin: FastAPI, store: EnvelopeStore, dsn: str) -> Iterator[Served]:
    """The plugin's app `plugin` on a free loopback port (lifespan on), stopped afterwards;
    the port is closed again when the block ends."""
    app = mounted(plugin)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield Served(f"http://127.0.0.1:{port}/agentpost/mcp", store, dsn)
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.fixture
def served(store: EnvelopeStore, dsn: str) -> Iterator[Served]:
    """The plugin's app, with a mark space, served (`serve`) for the test."""
    with serve(create_app(dsn, mcp_space=SPACE, mcp_scopes=SCOPES), store, dsn) as served:
        yield served


def session_with(served: Served, secret: str, body: Any) -> Any:
    """Run `body(session)` in an SDK client session authenticated by `secret`."""

    async def main() -> Any:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {secret}"})
        async with client, streamable_http_client(served.url, http_client=client) as (
                read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)

    return anyio.run(main)


@pytest.mark.parametrize("authorization", [None, "Bearer apgw_not-a-real-token-at-all",
                                           "Basic dXNlcjpwYXNz", "Bearer x"])
def test_anonymous_and_unknown_callers_get_401_and_no_tools(served: Served,
                                                            authorization: str | None) -> None:
    seed(served.store)
    headers = {"accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["authorization"] = authorization
    before = written(served.dsn)
    for body in (INITIALIZE, LIST):
        r = httpx.post(served.url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, (r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "send_envelope" not in r.text and "Traceback" not in r.text
    assert httpx.get(served.url, headers=headers, timeout=10).status_code == 401
    assert written(served.dsn) == before


@pytest.mark.parametrize("scopes", [["senders:*:send", "streams:*:enqueue"],
                                    ["senders:w1:send", "senders:w2:send"],
                                    ["streams:agents/w1/inbox:subscribe"],
                                    ["senders:ghost:send"],
                                    ["senders:human:w1:send",
                                     "streams:agents/w1/inbox:subscribe"]])
def test_a_token_naming_no_single_workspace_gets_403(served: Served,
                                                     scopes: list[str]) -> None:
    seed(served.store)
    _, secret = served.token("vague", scopes)
    r = httpx.post(served.url, json=INITIALIZE, timeout=10,
                   headers={"authorization": f"Bearer {secret}",
                            "accept": "application/json, text/event-stream"})
    assert r.status_code == 403, r.text
    assert "workspace" in r.json()["error"]["message"]


def test_a_token_for_w1_uses_every_tool_as_w1_and_is_refused_like_stdio(
        served: Served) -> None:
    waiting = seed(served.store)
    token_id, secret = served.token("w1-agent", W1)

    async def body(session: Any) -> dict[str, Any]:
        results = await call_every_tool(session, served.store, waiting)
        await check_refusals(session, served.dsn)
        return results

    results = session_with(served, secret, body)
    run = served.store.get(results["send_envelope"]["envelope_id"]).meta["tool_call"]["run"]
    assert run == {"by": "mcp", "ref": f"mcp:http:{token_id}",
                   "attrs": {"transport": "http", "token_id": token_id,
                             "token_name": "w1-agent", "workspace": "w1"}}
    leased = served.store.trail(envelope_id=waiting, event="envelope_leased")
    assert leased[0].body["holder"] == f"mcp:http:{token_id}"
    assert served.store.verify_trail().ok


def test_a_client_of_the_per_request_protocol_acts_as_its_token_with_no_listing_per_call(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's 2026-07-28 protocol (one self-contained POST per request, no handshake) is
    served too, with the token's seat; a call does not make the server list the caller's
    tools to find the called one's schema (`input_schema` gives it)."""
    seed(served.store)
    _, secret = served.token("w1-agent", W1)
    listed: list[str] = []
    specs = TokenSeat.specs

    def counted(self: TokenSeat) -> Any:
        listed.append(self.workspace_id)
        return specs(self)

    monkeypatch.setattr(TokenSeat, "specs", counted)

    async def main() -> tuple[set[str], int, dict[str, Any]]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {secret}"})
        async with http, Client(streamable_http_client(served.url, http_client=http),
                                mode="2026-07-28") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            before = len(listed)
            sent = result_json(await client.call_tool(
                "send_envelope", {"to": "boss", "type": "query", "content": "status?"}))
            return names, len(listed) - before, sent

    names, listings, sent = anyio.run(main)
    assert names == TOOLS and listed == ["w1"] and listings == 0
    assert served.store.get(sent["envelope_id"]).sender == "w1"


def test_a_token_for_w1_cannot_act_as_w2(served: Served) -> None:
    seed(served.store)
    for_w2 = served.store.send("boss", "w2", "directive", "w2's job").envelope_id
    _, w1_secret = served.token("w1-agent", W1)
    _, w2_secret = served.token("w2-agent", W2)

    async def as_w1(session: Any) -> None:
        before = written(served.dsn)
        for args in ({"to": "boss", "type": "query", "content": "x", "from": "w2"},
                     {"to": "boss", "type": "query", "content": "x", "sender": "w2"},
                     {"to": "boss", "type": "query", "content": "x", "workspace_id": "w2"}):
            assert "invalid arguments" in error_text(await session.call_tool("send_envelope",
                                                                             args))
        text = error_text(await session.call_tool("reply", {"envelope_id": for_w2,
                                                            "content": "mine now"}))
        assert "not found" in text
        inbox = result_json(await session.call_tool("read_inbox", {"limit": 50}))
        assert for_w2 not in {e["envelope_id"] for e in inbox["envelopes"]}
        assert all(e["sender"] == "boss" for e in inbox["envelopes"])
        text = error_text(await session.call_tool("ack", {"envelope_id": for_w2}))
        assert "not taken by this run" in text
        assert written(served.dsn) != before  # the lease on w1's own envelope, nothing else
        assert "'w1'" in {t.name: t for t in (await session.list_tools()).tools}[
            "send_envelope"].description

    session_with(served, w1_secret, as_w1)
    assert served.store.trail(envelope_id=for_w2, event="envelope_leased") == []

    async def as_w2(session: Any) -> list[str]:
        inbox = result_json(await session.call_tool("read_inbox", {"limit": 50}))
        return [e["envelope_id"] for e in inbox["envelopes"]]

    assert session_with(served, w2_secret, as_w2) == [for_w2]


def test_the_token_bounds_the_seat_rights(served: Served) -> None:
    """A token that may enqueue to nobody's inbox and not read its own: read_inbox and ack
    are not listed and refused; a send the matrix allows is refused by the token."""
    seed(served.store)
    _, secret = served.token("w1-mute", ["senders:w1:send",
                                         "streams:agents/nobody/inbox:enqueue"])

    async def body(session: Any) -> None:
        names = {t.name for t in (await session.list_tools()).tools}
        assert "read_inbox" not in names and "ack" not in names and "send_envelope" in names
        before = written(served.dsn)
        text = error_text(await session.call_tool("read_inbox", {}))
        assert "streams:agents/w1/inbox:subscribe" in text
        text = error_text(await session.call_tool(
            "send_envelope", {"to": "boss", "type": "query", "content": "x"}))
        assert "may not send to 'boss'" in text
        text = error_text(await session.call_tool(
            "submit_command", {"key": "k", "action": "query", "executor": "boss",
                               "mutating": False}))
        assert "streams:agents/boss/inbox:enqueue" in text
        assert written(served.dsn) == before

    session_with(served, secret, body)


def test_a_revoked_token_is_refused_once_the_token_cache_has_run_out(
        store: EnvelopeStore, dsn: str) -> None:
    """The endpoint takes a token the store confirmed live as live for `token_cache` seconds
    (1 by default): revoked within them, it still serves; past them, 401, for good (a
    refusal is not remembered, the store is asked again)."""
    now = [1000.0]
    app = create_app(dsn, mcp_options={"clock": lambda: now[0]})
    with serve(app, store, dsn) as served:
        seed(store)
        token_id, secret = served.token("w1-agent", W1)
        assert [post(served, secret, LIST).status_code for _ in range(3)] == [200] * 3
        served.tokens.revoke(token_id)
        now[0] += 0.9
        assert post(served, secret, LIST).status_code == 200  # within the cache's second
        now[0] += 0.2
        r = post(served, secret, LIST)
        assert r.status_code == 401 and "revoked" in json.dumps(r.json())
        assert post(served, secret, LIST).status_code == 401


def test_within_the_token_cache_the_store_is_not_asked_and_a_refusal_is_not_remembered(
        store: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    authenticate = TokenStore.authenticate

    def counted(self: TokenStore, secret: object) -> Any:
        asked.append(str(secret)[:8])
        return authenticate(self, secret)

    monkeypatch.setattr(TokenStore, "authenticate", counted)
    now = [1000.0]
    with serve(create_app(dsn, mcp_options={"clock": lambda: now[0]}), store, dsn) as served:
        seed(store)
        _, secret = served.token("w1-agent", W1)
        assert [post(served, secret, LIST).status_code for _ in range(5)] == [200] * 5
        assert len(asked) == 1
        now[0] += 1.0
        assert post(served, secret, LIST).status_code == 200
        assert len(asked) == 2
        unknown = "apgw_" + "0" * 43
        assert [post(served, unknown, LIST).status_code for _ in range(2)] == [401, 401]
        assert len(asked) == 4


def test_without_the_token_cache_a_revoked_token_is_refused_at_once(
        store: EnvelopeStore, dsn: str) -> None:
    with serve(create_app(dsn, mcp_options={"token_cache": 0}), store, dsn) as served:
        seed(served.store)
        token_id, secret = served.token("w1-agent", W1)

        async def body(session: Any) -> int:
            return len((await session.list_tools()).tools)

        assert session_with(served, secret, body) == 5
        served.tokens.revoke(token_id)
        r = post(served, secret, LIST)
        assert r.status_code == 401 and "revoked" in json.dumps(r.json())


def test_without_the_mcp_sdk_the_endpoint_still_refuses_anonymous_callers(
        monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    """The page works without the `ai` extra; its MCP endpoint then answers 401 to anonymous
    callers and 501, naming the extra, to the others."""
    import sys

    from fastapi.testclient import TestClient

    monkeypatch.setitem(sys.modules, "mcp", None)
    for name in [m for m in sys.modules if m.startswith("agentpost.mcpserver")]:
        monkeypatch.delitem(sys.modules, name)
    with TestClient(mounted(create_app(dsn))) as client:
        r = client.post("/agentpost/mcp", json=LIST)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = client.post("/agentpost/mcp", json=LIST, headers={"authorization": "Bearer abc"})
        assert r.status_code == 501, r.text
        assert "pip install 'airflow-agentpost[ai]'" in r.json()["error"]["message"]


def post(served: Served, secret: str, body: Any) -> httpx.Response:
    return httpx.post(served.url, json=body, timeout=10,
                      headers={"authorization": f"Bearer {secret}",
                               "accept": "application/json, text/event-stream"})


def test_a_token_over_its_rate_gets_429_before_any_mcp_and_other_tokens_go_on(
        store: EnvelopeStore, dsn: str) -> None:
    """A bucket of 2 that refills once in 1000 s: a token's third request is 429 with
    Retry-After, and its tool call writes nothing; another token has a bucket of its own; a
    token's own rate (``token create --rate``) replaces the endpoint's."""
    send = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "send_envelope",
                       "arguments": {"to": "boss", "type": "query", "content": "x"}}}
    app = create_app(dsn, mcp_options={"token_rate": 0.001, "token_burst": 2})
    with serve(app, store, dsn) as served:
        seed(store)
        _, first = served.token("w1-agent", W1)
        _, second = served.token("w1-other", W1)
        _, own = served.tokens.create("w1-own", W1, rate=0.002, burst=5)
        for body in (INITIALIZE, LIST):
            r = post(served, first, body)
            assert r.status_code == 200, r.text
        before = written(dsn)
        r = post(served, first, send)
        assert r.status_code == 429, r.text
        assert 900 <= int(r.headers["retry-after"]) <= 1000
        error = r.json()["error"]
        assert error["code"] == 429 and "rate limit of token w1-agent" in error["message"]
        assert "result" not in r.json()
        assert written(dsn) == before

        r = post(served, second, send)
        assert r.status_code == 200 and not r.json()["result"]["isError"], r.text
        assert post(served, second, LIST).status_code == 200
        assert post(served, second, LIST).status_code == 429
        assert [post(served, own, LIST).status_code for _ in range(6)] == [200] * 5 + [429]


# ---- the app as the plugin mounts it: settings from Airflow's configuration ---------------

MARK_TOOLS = {"read_marks", "write_mark", "claim"}
FLEET = """
version: 1
name: staging
space: releases
scopes:
  - name: environments
    conflict_policy: first_writer
    allowed_intent_verbs: [deploy]
    allowed_action_verbs: [deployed]
"""


@pytest.fixture
def airflow_settings(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set ``[agentpost]`` options of Airflow's configuration (as AIRFLOW__AGENTPOST__*);
    every MCP option not given is unset."""

    def settle(**values: str) -> None:
        for key in KEYS:
            name = f"AIRFLOW__AGENTPOST__{key.upper()}"
            if key in values:
                monkeypatch.setenv(name, values[key])
            else:
                monkeypatch.delenv(name, raising=False)

    return settle


def tool_names(served: Served, secret: str) -> set[str]:
    async def body(session: Any) -> set[str]:
        return {t.name for t in (await session.list_tools()).tools}

    return session_with(served, secret, body)


def claim(served: Served, secret: str, args: dict[str, Any]) -> dict[str, Any]:
    async def body(session: Any) -> dict[str, Any]:
        return result_json(await session.call_tool("claim", args))

    return session_with(served, secret, body)


def test_the_plugin_app_offers_no_mark_tools_without_a_space(
        store: EnvelopeStore, dsn: str, airflow_settings: Any) -> None:
    airflow_settings()
    with serve(plugin_app(dsn), store, dsn) as served:
        seed(store)
        _, secret = served.token("w1-agent", W1)
        assert tool_names(served, secret) == TOOLS - MARK_TOOLS


def test_the_plugin_app_with_mcp_space_offers_the_mark_tools_and_claims_go_through_the_guard(
        store: EnvelopeStore, dsn: str, airflow_settings: Any) -> None:
    airflow_settings(mcp_space=SPACE, mcp_scopes=f"{SCOPE_ARG}\n  reviews:review")
    with serve(plugin_app(dsn), store, dsn) as served:
        seed(store)
        _, secret = served.token("w1-agent", W1)
        assert tool_names(served, secret) == TOOLS
        result = claim(served, secret, {"scope": "deploys", "resource": "api",
                                        "action": "deploy"})
        assert result["verdict"] == "ALLOW" and result["allowed"] is True
        result = claim(served, secret, {"scope": "reviews", "resource": "pr-7",
                                        "action": "review"})
        assert result["verdict"] == "ALLOW"
        before = written(dsn)

        async def refused(session: Any) -> str:
            return error_text(await session.call_tool(
                "claim", {"scope": "deploys", "resource": "api", "action": "delete"}))

        assert "not 'delete'" in session_with(served, secret, refused)
        assert written(dsn) == before


def test_the_plugin_app_with_mcp_fleet_uses_the_fleets_space_and_scopes(
        store: EnvelopeStore, dsn: str, airflow_settings: Any, tmp_path: Any) -> None:
    """The fleet's scope is first-writer: a second claim loses though more confident."""
    fleet = tmp_path / "staging.yaml"
    fleet.write_text(FLEET)
    airflow_settings(mcp_fleet=str(fleet))
    with serve(plugin_app(dsn), store, dsn) as served:
        seed(store)
        _, w1 = served.token("w1-agent", W1)
        _, w2 = served.token("w2-agent", W2)
        assert tool_names(served, w1) == TOOLS
        first = claim(served, w1, {"scope": "environments", "resource": "staging",
                                   "action": "deploy", "confidence": 0.2})
        assert first["verdict"] == "ALLOW"
        second = claim(served, w2, {"scope": "environments", "resource": "staging",
                                    "action": "deploy", "confidence": 0.9})
        assert second["verdict"] == "CONFLICT"
        assert second["winning_agent"] == str(mark_agent("w1", []).id)
    marks = store.db.fetchall("SELECT DISTINCT space FROM agentpost.marks")
    assert [tuple(m) for m in marks] == [("releases",)]


def test_the_plugin_app_rate_limit_is_a_setting(store: EnvelopeStore, dsn: str,
                                               airflow_settings: Any) -> None:
    airflow_settings(mcp_token_rate="0.001", mcp_token_burst="1")
    with serve(plugin_app(dsn), store, dsn) as served:
        seed(store)
        _, secret = served.token("w1-agent", W1)
        _, other = served.token("w1-other", W1)
        assert [post(served, secret, LIST).status_code for _ in range(2)] == [200, 429]
        assert post(served, other, LIST).status_code == 200


def test_a_wrong_setting_fails_the_endpoint_alone_until_it_is_fixed(
        store: EnvelopeStore, dsn: str, airflow_settings: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    airflow_settings(mcp_scopes=SCOPE_ARG)  # scopes of no space
    with serve(plugin_app(dsn), store, dsn) as served:
        seed(store)
        _, secret = served.token("w1-agent", W1)
        r = post(served, secret, LIST)
        assert r.status_code == 500, r.text
        assert "misconfigured" in r.json()["error"]["message"]
        assert "mcp_scopes" not in r.text
        assert "mcp_scopes needs mcp_space" in caplog.text
        r = httpx.post(served.url, json=LIST, timeout=10,
                       headers={"accept": "application/json, text/event-stream"})
        assert r.status_code == 401
        airflow_settings(mcp_space=SPACE, mcp_scopes=SCOPE_ARG)
        assert tool_names(served, secret) == TOOLS
