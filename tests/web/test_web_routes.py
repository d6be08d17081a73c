"""The routes page (issue 13) on a real Airflow API app and real routes: envelopes routed
through actors with RouteStore (leases, results, a fan-out, an actor error), shown hop by
hop and as a family."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.routes import RouteStore
from web_support import Web, airflow_web

ACTORS = ["prep", "infer", "post"]


@pytest.fixture(scope="module")
def routes(module_dsn: str) -> Iterator[RouteStore]:
    store = EnvelopeStore(module_dsn)
    rs = RouteStore(store)
    rs.setup(ACTORS)
    yield rs
    store.close()


@pytest.fixture(scope="module")
def web(module_dsn: str, routes: RouteStore) -> Iterator[Web]:
    with airflow_web(module_dsn) as web:
        yield web


def _start(rs: RouteStore, eid: str) -> None:
    rs.start({"id": eid, "route": {"actors": ACTORS, "current": 0},
              "payload": {"text": "hi"}})


def _hop(rs: RouteStore, actor: str, result: Any) -> None:
    ((lease, env),) = rs.receive(actor)
    rs.complete(actor, lease, env, result)


@pytest.fixture(scope="module")
def fanned(routes: RouteStore) -> str:
    """`fan` went through prep, which fanned out into fan, fan-1, fan-2; at infer, fan
    ended empty (happy-end), fan-1 continued to post, fan-2 failed (error-end)."""
    _start(routes, "fan")
    _hop(routes, "prep", [{"k": 0}, {"k": 1}, {"k": 2}])
    results = {"fan": None, "fan-1": {"more": 1}, "fan-2": {"error": "boom"}}
    for lease, env in routes.receive("infer", max=3):
        routes.complete("infer", lease, env, results[env.id])
    return "fan"


def test_recent_routes_newest_first(web: Web, routes: RouteStore, fanned: str) -> None:
    _start(routes, "solo")
    client = web.client("viewer")
    page = client.get("/agentpost/routes").text
    listed = re.findall(r'<tr data-route="([^"]+)" data-status="(\w+)"', page)
    assert listed[0] == ("solo", "pending")
    assert {("fan", "succeeded"), ("fan-1", "running"), ("fan-2", "failed")} <= set(listed)
    body = client.get("/agentpost/api/routes", params={"limit": 2}).json()
    assert body["routes"][0]["id"] == "solo" and len(body["routes"]) == 2
    assert client.get("/agentpost/api/routes", params={"limit": 0}).status_code == 400


def test_route_hops_with_phases_and_times(web: Web, fanned: str) -> None:
    """fan-1: hop 0 (prep) was made under the parent's id; hop 1 (infer) is its own,
    consumed, with its reported phases; hop 2 (post) is in post's inbox, queued."""
    body = web.client("viewer").get("/agentpost/api/routes/fan-1").json()
    assert body["route"]["status"] == "running" and body["route"]["parent_id"] == "fan"
    hops = body["hops"]
    assert [(h["index"], h["actor"], h["where"]) for h in hops] == [
        (0, "prep", "via parent"), (1, "infer", "here"), (2, "post", "here")]
    infer, post = hops[1], hops[2]
    assert infer["envelope_id"] == "asya:fan-1:1"
    assert infer["status"] == "acknowledged" and infer["consumed_at"] is not None
    assert [p["phase"] for p in infer["phases"]] == ["queued", "received"]
    assert post["status"] == "acknowledged" and post["consumed_at"] is None
    assert [p["phase"] for p in post["phases"]] == ["queued"]
    assert post["sent_at"] >= infer["delivered_at"]
    assert body["parent"]["id"] == "fan"


def test_family_parent_children_and_states(web: Web, fanned: str) -> None:
    client = web.client("viewer")
    body = client.get("/agentpost/api/routes/fan").json()
    assert [(m["id"], m["parent_id"], m["status"]) for m in body["family"]] == [
        ("fan", None, "succeeded"), ("fan-1", "fan", "running"), ("fan-2", "fan", "failed")]
    assert [c["id"] for c in body["children"]] == ["fan-1", "fan-2"]
    assert body["parent"] is None
    hops = body["hops"]
    assert [(h["actor"], h["where"]) for h in hops] == [
        ("prep", "here"), ("infer", "here"), ("post", "not reached"),
        ("happy-end", "here")]
    page = client.get("/agentpost/routes/fan-2").text
    assert re.findall(r'<tr data-route="([^"]+)" data-status="(\w+)"', page) == [
        ("fan", "succeeded"), ("fan-1", "running"), ("fan-2", "failed")]
    assert 'id="route" data-status="failed"' in page and "boom" in page
    assert re.findall(r'data-hop="(\d)" data-actor="([\w-]+)" data-where="([\w ]+)"',
                      page)[-1] == ("1", "error-end", "here")


def test_unknown_route_is_404_and_bad_id_400(web: Web) -> None:
    client = web.client("viewer")
    r = client.get("/agentpost/api/routes/nope")
    assert r.status_code == 404 and r.json()["error"]["message"] == \
        "no routed envelope 'nope'"
    assert client.get("/agentpost/routes/nope").status_code == 404
    assert client.get("/agentpost/api/routes/" + "x" * 300).status_code == 400
    assert web.client(None).get("/agentpost/api/routes").status_code == 401
