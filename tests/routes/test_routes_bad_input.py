"""Bad input to routes (issue 5, "Bad input": malformed routes, unknown actors, bad indexes,
unknown ids, forged data): a clear typed error from agentpost.protocol.errors, nothing
changed (route rows, envelopes, leases, trail, signals), and the trail still verifies.
Also the gaps of the first draft: self-hops, a forged ``meta.asya``, a start naming a
routed parent, and status and progress per envelope and per family in the trail."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from agentpost.protocol.errors import Conflict, InvalidInput, LeaseLost, NotFound
from agentpost.protocol.routes import (
    HAPPY_END,
    InvalidRoute,
    Member,
    Route,
    RouteRewrite,
    RouteStatus,
    UnknownActor,
    family_progress,
    family_status,
)
from agentpost.store import EnvelopeStore
from agentpost.store.routes import ENVELOPE_TYPE, Hop, RouteStore, decode
from test_routes_atomic import snapshot

ACTORS = ["prep", "infer", "post"]


@pytest.fixture
def routes(routes: RouteStore) -> RouteStore:
    """The folder's RouteStore (tests/routes/conftest.py) with route "abc" started."""
    routes.start({"id": "abc", "route": {"actors": ACTORS}, "payload": {"n": 1}})
    return routes


def _refused(rs: RouteStore, error: type[Exception], call: Callable[[], Any],
             match: str | None = None) -> None:
    before = snapshot(rs.store)
    with pytest.raises(error, match=match):
        call()
    assert snapshot(rs.store) == before
    assert rs.store.verify_trail().ok


def _env(**over: Any) -> dict[str, Any]:
    return {"id": "x", "route": {"actors": ["prep"]}, "payload": {}, **over}


@pytest.mark.parametrize("data, error", [
    (_env(route={"actors": ["prep", HAPPY_END]}), InvalidRoute),  # end actor in a route
    (_env(route={"actors": ["error-end"]}), InvalidRoute),
    (_env(route={"actors": ["prep"], "current": 1}), InvalidRoute),  # bad index
    (_env(route={"actors": ["prep"], "current": -1}), InvalidRoute),
    (_env(route={"actors": ["prep"], "current": "0x"}), InvalidRoute),
    (_env(route={"actors": ["prep", "infer"], "current": "1"}), InvalidRoute),  # not coerced
    (_env(route={"actors": ["prep", "infer"], "current": 1.0}), InvalidRoute),
    (_env(route={"actors": ["prep", "infer"], "current": True}), InvalidRoute),
    (_env(fan_outs="1"), InvalidRoute),
    (_env(route={"actors": ["prep"], "current": 0, "end": HAPPY_END}), InvalidRoute),
    (_env(route={"actors": "prep"}), InvalidRoute),  # not a list
    (_env(route={"actors": []}), InvalidRoute),
    (_env(route={"actors": ["Prep"]}), InvalidRoute),  # not an actor name
    (_env(route={"actors": ["ghost"]}), UnknownActor),
    (_env(route={"actors": ["prep", "ghost"]}), UnknownActor),  # unknown further on
    (_env(route=None), InvalidRoute),
    (_env(id=""), InvalidRoute),
    (_env(id="a b"), InvalidRoute),  # not a WACP id character
    (_env(id="x" * 97), InvalidRoute),  # too long for its hops' WACP ids
    (_env(parent_id="bad id"), InvalidRoute),
    (_env(headers={"trace": {"nested": 1}}), InvalidRoute),  # headers are flat
    (_env(extra=1), InvalidRoute),
    ({"route": {"actors": ["prep"]}, "payload": {}}, InvalidRoute),  # id missing
    ({"id": "x", "route": {"actors": ["prep"]}}, InvalidRoute),  # payload missing
    (["not", "an", "object"], InvalidInput),
])
def test_malformed_starts_change_nothing(routes: RouteStore, data: Any,
                                         error: type[Exception]) -> None:
    """Malformed routes, unknown actors, bad indexes, malformed envelopes: a typed error
    (InvalidRoute / UnknownActor are InvalidInput), nothing recorded or sent."""
    _refused(routes, error, lambda: routes.start(data))
    assert issubclass(error, InvalidInput)


def test_a_start_batch_is_all_or_nothing(routes: RouteStore) -> None:
    """start_many with one bad envelope starts none; the same id twice is refused."""
    _refused(routes, UnknownActor, lambda: routes.start_many(
        [_env(id="ok"), _env(id="bad", route={"actors": ["ghost"]})]))
    _refused(routes, InvalidInput, lambda: routes.start_many([_env(), _env()]))


def test_an_id_is_one_envelope(routes: RouteStore) -> None:
    """Another route under a routed id is a Conflict; the same start again changes nothing
    (a retried start)."""
    _refused(routes, Conflict, lambda: routes.start(
        {"id": "abc", "route": {"actors": ["post"]}, "payload": {}}), match="already routed")
    _refused(routes, Conflict, lambda: routes.start(
        {"id": "abc", "route": {"actors": ACTORS}, "payload": {}, "parent_id": "zz"}))
    before = snapshot(routes.store)
    routes.start({"id": "abc", "route": {"actors": ACTORS}, "payload": {"n": 1}})
    assert snapshot(routes.store) == before


def test_start_refuses_a_routed_parent(routes: RouteStore) -> None:
    """Decision: only the runtime creates children of a routed envelope. A start whose
    parent_id names a routed envelope is a Conflict (it could collide with the fan-out
    child ``{id}-{i}`` later); a parent_id unknown to the routes is the caller's lineage."""
    _refused(routes, Conflict, lambda: routes.start(_env(id="abc-1", parent_id="abc")),
             match="parent")
    view = routes.start(_env(id="free", parent_id="elsewhere"))
    assert (view.parent_id, view.root_id) == ("elsewhere", "free")


def test_rewriting_the_travelled_route_changes_nothing(routes: RouteStore) -> None:
    """"A handler may extend the route but never rewrite the part already travelled":
    RouteRewrite; an unknown actor in the extension: UnknownActor; a malformed one:
    InvalidRoute. The lease holds and the hop completes afterwards."""
    ((lease, env),) = routes.receive("prep")
    for actors, error in ((["infer", "post"], RouteRewrite), (["prep", "ghost"], UnknownActor),
                          (["prep", HAPPY_END], InvalidRoute), ("prep", RouteRewrite),
                          ([], RouteRewrite)):
        _refused(routes, error, lambda a=actors: routes.complete("prep", lease, env, {},
                                                                 actors=a))
    routes.complete("prep", lease, env, {}, actors=["prep", "post"])
    assert routes.get("abc").route.actors == ("prep", "post")


def test_unknown_ids_and_actors(routes: RouteStore) -> None:
    """Unknown envelope ids and actors: NotFound (a clear error), nothing changed."""
    _refused(routes, NotFound, lambda: routes.get("nope"))
    _refused(routes, NotFound, lambda: routes.family("nope"))
    _refused(routes, NotFound, lambda: routes.receive("ghost"))
    assert routes.get_many(["nope", "abc"])[0].id == "abc"
    ((lease, env),) = routes.receive("prep")
    _refused(routes, NotFound, lambda: routes.complete("ghost", lease, env, {}))
    _refused(routes, InvalidInput, lambda: routes.get_many([1]))  # type: ignore[list-item]


def test_bad_leases_and_arguments(routes: RouteStore) -> None:
    """A garbage token, a lease of another actor, the same lease twice, bad max/ttl, a bad
    progress point: typed errors, nothing changed."""
    ((lease, env),) = routes.receive("prep")
    bad = lease.model_copy(update={"token": "not-a-token"})
    _refused(routes, InvalidInput, lambda: routes.complete("prep", bad, env, {}))
    forged = lease.model_copy(update={"token": lease.token.replace(
        lease.token[:8], "00000000")})
    _refused(routes, LeaseLost, lambda: routes.complete("prep", forged, env, {}))
    _refused(routes, Conflict, lambda: routes.complete("infer", lease, env, {}),
             match="not the current hop")
    hop = Hop(lease, env)
    _refused(routes, InvalidInput, lambda: routes.complete_many("prep", [(hop, {}), (hop, {})]))
    _refused(routes, InvalidInput, lambda: routes.complete_many("prep", [hop]))
    _refused(routes, InvalidInput, lambda: routes.complete_many("prep", [(lease, {})]))
    _refused(routes, InvalidInput, lambda: routes.receive("prep", max=0))
    _refused(routes, InvalidInput, lambda: routes.receive("prep", ttl=0))
    _refused(routes, InvalidInput, lambda: routes.report("prep", env, "bogus"))
    _refused(routes, InvalidInput, lambda: routes.report("infer", env, "processing"))
    _refused(routes, InvalidInput, lambda: routes.finish(lease))  # not at an end actor


def test_a_result_too_big_to_travel_changes_nothing(routes: RouteStore) -> None:
    """A result the store cannot carry (larger than its content limit) is refused before
    anything is sent: InvalidInput, the lease still holds."""
    ((lease, env),) = routes.receive("prep")
    huge = {"blob": "x" * (routes.store.settings.max_content_bytes + 1)}
    _refused(routes, InvalidInput, lambda: routes.complete("prep", lease, env, huge))
    routes.complete("prep", lease, env, {"small": 1})


def test_forged_meta_on_a_plain_envelope_is_not_a_route(routes: RouteStore) -> None:
    """An envelope that is not of the route type but carries a ``meta.asya`` does not decode
    (InvalidInput), and `receive` hands it to nobody."""
    routes.store.register_type("note", ["asya-actor"], ["asya-actor"])
    meta = {"asya": {"id": "abc", "parent_id": None,
                     "route": {"actors": ACTORS, "current": 0, "end": None}}}
    routes.store.send("asya-gateway", "infer", "note", '{"a": 1}', format="json",
                      envelope_id="plain-1", meta=meta)
    assert routes.receive("infer") == []
    (lease,) = routes.store.lease("infer")
    with pytest.raises(InvalidInput, match="not a routed envelope"):
        decode(lease)
    routes.store.send("asya-gateway", "infer", ENVELOPE_TYPE, '{"a": 1}', format="json",
                      envelope_id="bad-meta", meta={"asya": {"id": "abc", "route": "x"}})
    (lease,) = routes.store.lease("infer", max=2)[-1:]
    with pytest.raises(InvalidRoute):
        decode(lease)
    assert routes.store.verify_trail().ok


def test_self_hops(routes: RouteStore) -> None:
    """A route may name an actor twice in a row (["prep", "prep"]): the actor sends the hop
    to its own inbox and handles it again."""
    routes.start({"id": "self", "route": {"actors": ["prep", "prep"]}, "payload": {"n": 0}})
    for n in (1, 2):
        hops = [h for h in routes.receive("prep", max=5) if h.envelope.id == "self"]
        ((lease, env),) = hops
        assert env.route.current == n - 1
        routes.complete("prep", lease, env, {"n": n})
    view = routes.get("self")
    assert (view.status, view.route.current, view.route.end) == (
        RouteStatus.SUCCEEDED, 2, HAPPY_END)
    assert routes.store.verify_trail().ok


def test_status_and_progress_are_in_the_trail(routes: RouteStore) -> None:
    """"Status ... and progress ... per envelope and per fan-out family, queryable cheaply
    and recorded in the trail": every change writes a route_progress entry whose status and
    progress are the row's; the family's status and progress, recomputed from the last entry
    of each member in the trail, are the family view's."""
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, [{"k": 0}, {"k": 1}, {"k": 2}])
    hops = routes.receive("infer", max=3)
    routes.complete_many("infer", [(h, None if h.envelope.id == "abc" else {"x": 1})
                                   for h in hops])
    last: dict[str, dict[str, Any]] = {}
    for event in routes.store.trail(event="route_progress"):
        last[event.body["id"]] = event.body
    fam = routes.family("abc-2")  # any member finds its family
    assert fam.root_id == "abc"
    for view in fam.members:
        body = last[view.id]
        assert (body["status"], body["progress"], body["current"]) == (
            view.status, pytest.approx(view.progress), view.route.current)
    members = [Member(id=b["id"], parent_id=b["parent_id"], phase=b["phase"],
                      route=Route(actors=tuple(b["actors"]), current=b["current"],
                                  end=b["end"])) for b in last.values()]
    assert family_status(members) is fam.status is RouteStatus.RUNNING
    assert family_progress(members) == pytest.approx(fam.progress)


def test_queries_match_their_indexes(routes: RouteStore) -> None:
    """Cheap queries: an envelope's status is a primary-key probe, a family an index scan
    of routes_family, the timeout sweep walks routes_open (the server runs without
    autovacuum: the plans are checked with sequential scans made expensive)."""
    plans = {}
    with routes.store.db.cursor() as cur:
        cur.execute("SET enable_seqscan = off")
        for name, sql in (
                ("get", "SELECT * FROM agentpost.routes r WHERE r.id = ANY (ARRAY['abc'])"),
                ("family", "SELECT * FROM agentpost.routes r WHERE r.root_id = 'abc'"
                           " ORDER BY r.root_id, r.id"),
                ("open", "SELECT * FROM agentpost.routes r WHERE r.end_actor IS NULL")):
            cur.execute("EXPLAIN " + sql)
            plans[name] = " ".join(r[0] for r in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    # every month (sql/0090) probed by its own index, none read whole, the family in order
    assert _each_month_by(plans["get"], "pkey")
    assert _each_month_by(plans["family"], "root_id_id_idx")
    assert not re.search(r"(^|->)\s*Sort\b", plans["family"])
    assert _each_month_by(plans["open"], "envelope_id_idx")


def _each_month_by(plan: str, index: str) -> bool:
    """Every partition of the routes in `plan` is scanned through its own `index`."""
    scans = re.findall(r"Scan (?:using (\S+) )?on (routes_\w+)", plan)
    return bool(scans) and all(used == f"{part}_{index}" for used, part in scans)


def _scans_without_index(plan: dict[str, Any], table: str) -> list[str]:
    """The scans of `table` in a JSON plan that do not probe an index by a condition."""
    bad = []
    if plan.get("Relation Name") == table:
        kind = plan["Node Type"]
        if kind == "Seq Scan" or (kind in ("Index Scan", "Index Only Scan")
                                  and "Index Cond" not in plan):
            bad.append(f"{kind} on {table}")
    for child in plan.get("Plans", []):
        bad += _scans_without_index(child, table)
    return bad


def test_a_hop_probes_the_routes_table_by_index(dsn: str) -> None:
    """Every statement a hop runs on ``agentpost.routes`` (start, lease + received, step,
    report, status, family) probes it by an index condition, whatever the table's size: the
    server runs without autovacuum and sessions use generic plans, so a join the planner
    turns into a scan of the whole table would make every hop slower than the last. Checked
    on the plans actually run (auto_explain, nested statements), with 3,000 rows analyzed."""
    with EnvelopeStore(dsn, pool_size=1) as store:
        rs = RouteStore(store)
        rs.setup(ACTORS)
        rs.start_many([{"id": f"r{i}", "route": {"actors": ACTORS}, "payload": {}}
                       for i in range(3000)])
        with store.db.cursor() as cur:
            cur.execute("ANALYZE agentpost.routes")
            notices: deque[str] = deque()  # (a list would be cut to the last 50)
            cur.connection.notices = notices
            cur.execute("LOAD 'auto_explain'")
            for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"),
                                   ("log_format", "json"), ("log_level", "notice")):
                cur.execute(f"SET auto_explain.{setting} = {value}")
        rs.start({"id": "abc", "route": {"actors": ACTORS}, "payload": {}})
        hops = rs.receive("prep", max=2)
        rs.report("prep", hops[0].envelope, "processing")
        rs.complete_and_receive("prep", [(h, [{"k": 0}, {"k": 1}]) for h in hops], max=1)
        rs.get("abc")
        rs.family("abc")
    plans = [json.loads(n[n.index("{"):]) for n in notices if "{" in n]
    assert len(plans) > 20
    bad = [scan for p in plans for scan in _scans_without_index(p["Plan"], "routes")]
    assert bad == [], [p["Query Text"] for p in plans
                       if _scans_without_index(p["Plan"], "routes")]


def test_a_forged_status_in_the_trail_is_detected(routes: RouteStore) -> None:
    """The route_progress entries are part of the signed, hash-chained trail: rewriting the
    status an entry recorded (claiming success) makes verify_trail fail at that entry."""
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, {"x": 1})
    assert routes.store.verify_trail().ok
    forged = routes.store.db.scalar(
        "UPDATE agentpost.trail SET record = replace(record, '\"status\": \"running\"',"
        " '\"status\": \"succeeded\"') WHERE id = (SELECT max(id) FROM agentpost.trail"
        " WHERE event = 'route_progress') RETURNING id")
    check = routes.store.verify_trail()
    assert not check.ok and check.failure_id == forged


def test_a_route_row_edited_outside_the_store_is_detected(routes: RouteStore) -> None:
    """Status 'recorded in the trail': the status row must be where its last route_progress
    entry left it, so claiming success in the table alone (no signed entry) fails
    verify_trail, naming the envelope."""
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, {"x": 1})
    assert routes.store.verify_trail().ok
    routes.store.db.scalar("UPDATE agentpost.routes SET end_actor = 'happy-end',"
                           " current = 3 WHERE id = 'abc' RETURNING 1")
    check = routes.store.verify_trail()
    assert not check.ok and check.failure_chain == "route:abc"
    assert "happy-end" in (check.failure or "")
