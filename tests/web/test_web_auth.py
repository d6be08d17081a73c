"""The agentpost page's gate: every route of the plugin's app needs an Airflow user, only
acting roles may post, and a cookie-authenticated post needs the CSRF token and a same-site
Origin (docs/ui.md, "Where it lives and who may use it").

The routes are enumerated from the mounted app itself, so a page added later is covered
without editing this file, and so are their parameters: a malformed one (a NUL byte in any
path or query parameter, a word for a number) is a 400 on every route (a 404 for a static
file, like any other name that is no file), after the sign-in check, writing nothing.
Runs against Airflow's real API app (auth on, the plugin mounted from its entry point) and a
real store.

Plain ASGI endpoints of the app (routes that are no FastAPI route: the MCP endpoint, which
authenticates gateway capability tokens itself) are enumerated too: each refuses anonymous
callers and unknown tokens with 401 and answers nothing else. What a valid token may do
there is tests/ai/test_mcp_http.py.
"""

from __future__ import annotations

import re
from typing import get_args

import pytest
from fastapi.dependencies.utils import get_flat_dependant
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import Mount, Route

from agentpost.store import EnvelopeStore
from dbtools import all_rows
from web_support import plugin_app

PREFIX = "/agentpost"
GATEWAY = ["/v1/enqueue", "/v1/snapshot", "/v1/stats"]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "no-such-thing", path)


def page_routes() -> list[tuple[str, str]]:
    """(method, path) of every HTTP route of the plugin's app, path params filled in."""
    out = []
    for route in plugin_app().routes:
        if isinstance(route, APIRoute):
            for method in sorted(route.methods - {"HEAD"}):
                out.append((method, _concrete(route.path)))
    return out


def endpoint_routes() -> list[tuple[str, str]]:
    """(method, path) of every plain ASGI endpoint of the plugin's app (a Route that is no
    APIRoute), path params filled in."""
    out = []
    for route in plugin_app().routes:
        if isinstance(route, Route) and not isinstance(route, APIRoute):
            for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
                out.append((method, _concrete(route.path)))
    return out


def bad_parameters() -> list[tuple[str, str, str]]:
    """(method, URL, parameter) for every path and query parameter of every HTTP route: each
    given a NUL byte in turn (the other path parameters filled in), and each integer query
    parameter also a word."""
    out = []
    for route in plugin_app().routes:
        if not isinstance(route, APIRoute):
            continue
        params = get_flat_dependant(route.dependant)
        for method in sorted(route.methods - {"HEAD"}):
            for param in params.path_params:
                path = re.sub(r"\{" + param.name + r"(:path)?\}", "a%00b", route.path)
                out.append((method, _concrete(path), param.name))
            for param in params.query_params:
                url = f"{_concrete(route.path)}?{param.name}="
                out.append((method, url + "%00", param.name))
                annotation = param.field_info.annotation
                if int in (get_args(annotation) or (annotation,)):
                    out.append((method, url + "many", param.name))
    return out


def test_the_app_has_pages_posts_and_the_gateway() -> None:
    routes = page_routes()
    assert ("GET", "/static/no-such-thing") in routes
    mounts = [r.path for r in plugin_app().routes if isinstance(r, Mount)]
    assert mounts == ["/v1"]
    assert {path for _, path in endpoint_routes()} == {"/mcp"}
    assert not [r for r in plugin_app().routes if isinstance(r, APIWebSocketRoute)]


def test_anonymous_gets_401_on_every_route(web) -> None:
    anon = web.client(None)
    checked = 0
    for method, path in page_routes():
        r = anon.request(method, PREFIX + path)
        assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
        assert "Traceback" not in r.text
        checked += 1
    for path in GATEWAY:
        method = "POST" if path.endswith("enqueue") else "GET"
        r = anon.request(method, PREFIX + path)
        assert r.status_code == 401, (path, r.status_code)
        checked += 1
    for method, path in endpoint_routes():
        r = anon.request(method, PREFIX + path, json={"jsonrpc": "2.0", "id": 1,
                                                      "method": "tools/list"})
        assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
        assert r.headers.get("www-authenticate") == "Bearer"
        assert "Traceback" not in r.text and "send_envelope" not in r.text
        checked += 1
    assert checked >= 7


def test_an_unknown_or_airflow_credential_is_no_token_on_the_endpoints(web) -> None:
    """The endpoints take gateway tokens only: an unknown one, and a signed-in Airflow
    user's own credentials, are refused with 401 and list nothing."""
    anon = web.client(None)
    user = web.client("admin")
    for method, path in endpoint_routes():
        for client, headers in ((anon, {"authorization": "Bearer apgw_unknown-token-xyz"}),
                                (user, {}), (anon, web.bearer("admin"))):
            r = client.request(method, PREFIX + path, headers=headers,
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
            assert "send_envelope" not in r.text


@pytest.mark.parametrize("path", ["/v1/subscribe?stream=gw-b", "/v1/live?view=latestPerAgent"])
def test_anonymous_websockets_are_closed_with_4401(web, path: str) -> None:
    from starlette.websockets import WebSocketDisconnect

    with web.client(None).websocket_connect(PREFIX + path) as ws:
        frame = ws.receive_json()
        assert frame["error"]["code"] == 401, frame
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 4401


def test_a_bad_parameter_is_a_400_on_every_route_and_changes_nothing(
        web, module_dsn: str) -> None:
    """Every route, every parameter: a NUL byte (which Postgres text cannot hold, nor a file
    name) answers 400 naming the parameter, never a 500; a static file's name answers 404.
    Anonymous callers still get 401 first. Posts are made as an acting role, so each gets as
    far as its parameters; nothing is written."""
    user = web.client(None, raise_server_exceptions=False)
    anon = web.client(None, raise_server_exceptions=False)
    asked = {**web.bearer("user"), "accept": "application/json"}
    cases = bad_parameters()
    assert {url for _, url, _ in cases} >= {"/?after=%00", "/api/inboxes?after=%00",
                                            "/static/a%00b", "/marks?before=many"}
    before = all_rows(module_dsn)
    for method, url, name in cases:
        r = user.request(method, PREFIX + url, headers=asked)
        expected = 404 if url.startswith("/static/") else 400
        assert r.status_code == expected, (method, url, r.status_code, r.text[:300])
        message = r.json()["error"]["message"]
        assert expected == 404 or message.startswith(f"{name}: "), (method, url, message)
        assert anon.request(method, PREFIX + url).status_code == 401, (method, url)
    page = user.get(PREFIX + "/?after=%00", headers={**web.bearer("user"), "accept": "text/html"})
    assert page.status_code == 400 and "NUL byte" in page.text and "Traceback" not in page.text
    assert all_rows(module_dsn) == before


def test_a_forged_or_expired_token_is_refused_everywhere(web) -> None:
    forged = web.client(None)
    forged.cookies.set("_token", "not-a-jwt")
    for method, path in page_routes():
        assert forged.request(method, PREFIX + path).status_code in (401, 403), (method, path)


def test_anonymous_html_401_links_to_airflow_login(web) -> None:
    r = web.client(None).get(PREFIX + "/static/agentpost.css", headers={"accept": "text/html"})
    assert r.status_code == 401
    assert "/auth/login?next=/agentpost/static/agentpost.css" in r.text


@pytest.mark.parametrize("role", ["viewer", "user", "admin"])
def test_every_role_may_look(web, role: str) -> None:
    client = web.client(role)
    for method, path in page_routes():
        if method != "GET":
            continue
        r = client.get(PREFIX + path)
        assert r.status_code not in (401, 403), (role, path, r.status_code, r.text[:200])


def _posts() -> list[str]:
    posts = [path for method, path in page_routes() if method == "POST"]
    assert posts, "the app has no actions to check"
    return posts


def test_a_viewer_may_not_act(web) -> None:
    viewer = web.client("viewer")
    for path in _posts():
        r = viewer.post(PREFIX + path, data={"csrf_token": web.csrf("viewer")})
        assert r.status_code == 403, (path, r.status_code)
        assert "may look" in r.text


@pytest.mark.parametrize("role", ["user", "admin"])
def test_acting_roles_need_the_csrf_token(web, role: str) -> None:
    client = web.client(role)
    for path in _posts():
        missing = client.post(PREFIX + path, data={})
        assert missing.status_code == 403 and "CSRF" in missing.text, (path, missing.text[:200])
        wrong = client.post(PREFIX + path, data={"csrf_token": web.csrf("viewer")})
        assert wrong.status_code == 403, path
        ok = client.post(PREFIX + path, data={"csrf_token": web.csrf(role)})
        assert ok.status_code not in (401, 403), (path, ok.status_code, ok.text[:300])


def test_a_cross_site_origin_is_refused_even_with_the_token(web) -> None:
    client = web.client("user")
    for path in _posts():
        r = client.post(PREFIX + path, data={"csrf_token": web.csrf("user")},
                        headers={"origin": "https://evil.example"})
        assert r.status_code == 403 and "cross-site" in r.text, path


def test_a_bearer_caller_needs_no_csrf_token_but_the_role(web) -> None:
    anon = web.client(None)
    for path in _posts():
        as_user = anon.post(PREFIX + path, data={}, headers=web.bearer("user"))
        assert as_user.status_code not in (401, 403), (path, as_user.status_code)
        as_viewer = anon.post(PREFIX + path, data={}, headers=web.bearer("viewer"))
        assert as_viewer.status_code == 403, path


def test_the_csrf_token_is_per_user(web) -> None:
    assert len({web.csrf(r) for r in ("viewer", "user", "op", "admin")}) == 4


def test_the_gateway_answers_under_the_page_with_its_own_tokens(web, module_dsn: str) -> None:
    from agentpost.gateway.tokens import TokenStore

    store = EnvelopeStore(module_dsn)
    try:
        store.define_role("peer")
        store.register_type("note", senders=["peer"], receivers=["peer"])
        store.create_workspace("peer", workspace_id="gw-a")
        store.create_workspace("peer", parent="gw-a", workspace_id="gw-b")
        _, secret = TokenStore(store).create("ui-test", ["streams:*:enqueue", "views:*:read",
                                                         "senders:*:send", "stats:*:read"])
    finally:
        store.close()
    client = web.client(None)
    auth = {"Authorization": f"Bearer {secret}"}
    sent = client.post(PREFIX + "/v1/enqueue", headers=auth, json={
        "to": "agents/gw-b/inbox", "envelope": {
            "id": "ui-gw-1", "ts": "2026-11-24T12:00:00Z", "from": "gw-a", "type": "note",
            "payload": {"hello": 1}}})
    assert sent.status_code == 200, sent.text
    assert sent.json()["status"] == "acknowledged"
    stats = client.get(PREFIX + "/v1/stats?stream=gw-b", headers=auth)
    assert stats.status_code == 200 and stats.json()["depth"] == 1
    # a NUL byte in a parameter is refused like any other malformed one, never a 500
    nul = client.get(PREFIX + "/v1/stats?stream=gw%00b", headers=auth)
    assert nul.status_code == 400 and "NUL" in nul.json()["error"]["message"], nul.text
    view = client.get(PREFIX + "/v1/snapshot?view=latest%00", headers=auth)
    assert view.status_code == 404 and "unknown view" in view.json()["error"]["message"]
    # an Airflow user's token is not a gateway token
    assert client.get(PREFIX + "/v1/stats", headers=web.bearer("admin")).status_code == 401
