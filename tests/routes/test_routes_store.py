"""Asya routes on Postgres (`agentpost.store.routes`, sql/0009_routes.sql): routed envelopes
travel between actor workspaces, their status and progress are queryable per envelope and
per fan-out family, every change is in the trail, and bad input changes nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.protocol.routes import (
    ERROR_END,
    HAPPY_END,
    InvalidRoute,
    Phase,
    RouteEnded,
    RouteStatus,
    StepKind,
    UnknownActor,
    progress,
    status,
)
from agentpost.store.routes import GATEWAY, Hop, RouteStore, _row, wacp_id

ACTORS = ["prep", "infer", "post"]


def _start(rs: RouteStore, eid: str = "abc", **extra: Any) -> None:
    rs.start({"id": eid, "route": {"actors": ACTORS, "current": 0},
              "headers": {"trace_id": "t-1"}, "payload": {"text": "hi"}, **extra})


def _record(rs: RouteStore, ws: str, rows: list[dict[str, Any]]) -> int:
    """agentpost.route_record as the runtime's progress reports call it."""
    return rs.store.db.scalar("SELECT agentpost.route_record(%s, %s::jsonb)",
                              (ws, json.dumps(rows)))


def _hop(rs: RouteStore, actor: str, result: Any, **kw: Any):
    ((lease, env),) = rs.receive(actor)
    return rs.complete(actor, lease, env, result, **kw)


def test_route_runs_to_happy_end_with_status_progress_and_trail(routes: RouteStore) -> None:
    """pending → running → succeeded; progress 0, 1/3, 2/3, 1; a route_progress trail entry
    per change; the trail still verifies."""
    _start(routes)
    view = routes.get("abc")
    assert (view.status, view.progress) == (RouteStatus.PENDING, 0)
    for i, actor in enumerate(ACTORS):
        _hop(routes, actor, {f"by_{actor}": True})
        view = routes.get("abc")
        if i < 2:
            assert view.status is RouteStatus.RUNNING
            assert view.progress == pytest.approx((i + 1) / 3)
    assert (view.status, view.progress, view.route.end) == (RouteStatus.SUCCEEDED, 1, HAPPY_END)
    ((lease, env),) = routes.receive(HAPPY_END)
    assert env.payload == {"text": "hi", "by_prep": True, "by_infer": True, "by_post": True}
    assert env.headers == {"trace_id": "t-1"}
    routes.finish(lease)
    events = [e for e in routes.store.trail() if e.event == "route_progress"]
    assert len(events) == 1 + 3 * 2  # start, then received + routed per actor
    assert routes.store.verify_trail().ok


def test_generated_status_matches_the_pure_rules(routes: RouteStore) -> None:
    """The status table's generated columns follow agentpost.protocol.routes."""
    _start(routes)
    _hop(routes, "prep", [{"k": 1}, {"k": 2}])
    for view in routes.family("abc").members:
        assert view.status is status(view.route, view.phase)
        assert view.progress == pytest.approx(progress(view.route, view.phase))


def test_fan_out_family(routes: RouteStore) -> None:
    """A list fans out: abc keeps its id, abc-1 and abc-2 get parent_id abc; the family is
    running until all ended, then failed if any failed."""
    _start(routes)
    out = _hop(routes, "prep", [{"k": 0}, {"k": 1}, {"k": 2}])
    assert out.kind is StepKind.FAN_OUT
    fam = routes.family("abc")
    assert [(m.id, m.parent_id) for m in fam.members] == [
        ("abc", None), ("abc-1", "abc"), ("abc-2", "abc")]
    assert fam.status is RouteStatus.RUNNING
    assert fam.progress == pytest.approx(1 / 3)
    leases = routes.receive("infer", max=3)
    results = {"abc": None, "abc-1": [], "abc-2": {"error": "boom", "message": "no"}}
    for lease, env in leases:
        routes.complete("infer", lease, env, results[env.id])
    fam = routes.family("abc")
    assert {m.id: m.status for m in fam.members} == {
        "abc": RouteStatus.SUCCEEDED, "abc-1": RouteStatus.SUCCEEDED,
        "abc-2": RouteStatus.FAILED}
    assert fam.status is RouteStatus.FAILED
    failed = routes.get("abc-2")
    assert (failed.route.end, failed.route.current) == (ERROR_END, 1)
    assert failed.error == {"error": "boom", "message": "no", "details": None}
    assert routes.store.verify_trail().ok


def test_handler_extends_route(routes: RouteStore) -> None:
    """A handler may extend the route with known actors, never rewrite the travelled part."""
    routes.setup(["audit"])
    _start(routes)
    ((lease, env),) = routes.receive("prep")
    before = len(routes.store.trail())
    with pytest.raises(InvalidRoute):
        routes.complete("prep", lease, env, {"x": 1}, actors=["other", "infer"])
    with pytest.raises(UnknownActor):
        routes.complete("prep", lease, env, {"x": 1}, actors=["prep", "ghost"])
    # the refused steps changed nothing, and the lease still holds
    assert routes.get("abc").route.current == 0
    assert len(routes.store.trail()) == before
    routes.complete("prep", lease, env, {"x": 1}, actors=["prep", "audit"])
    assert routes.get("abc").route.actor == "audit"


def test_extension_is_routed(routes: RouteStore) -> None:
    """An extended route is followed to the appended actor."""
    routes.setup(["audit"])
    _start(routes)
    _hop(routes, "prep", {"x": 1}, actors=[*ACTORS, "audit"])
    _hop(routes, "infer", {})
    _hop(routes, "post", {})
    assert routes.get("abc").route.actor == "audit"
    _hop(routes, "audit", {})
    assert routes.get("abc").status is RouteStatus.SUCCEEDED


@pytest.mark.parametrize("data, error", [
    ({"id": "x", "route": {"actors": ["prep", HAPPY_END]}, "payload": {}}, InvalidRoute),
    ({"id": "x", "route": {"actors": ["prep"], "current": 4}, "payload": {}}, InvalidRoute),
    ({"id": "x", "route": {"actors": ["nobody"]}, "payload": {}}, UnknownActor),
    ({"id": "x", "route": {"actors": []}, "payload": {}}, InvalidRoute),
    ({"route": {"actors": ["prep"]}, "payload": {}}, InvalidRoute),
])
def test_bad_routes_change_nothing(routes: RouteStore, data: dict[str, Any],
                                   error: type[Exception]) -> None:
    """Malformed routes, unknown actors, bad indexes: a typed error, nothing recorded."""
    before = len(routes.store.trail())
    with pytest.raises(error):
        routes.start(data)
    with pytest.raises(NotFound):
        routes.get("x")
    assert len(routes.store.trail()) == before
    assert routes.store.verify_trail().ok


def test_start_is_idempotent_but_ids_are_not_reused(routes: RouteStore) -> None:
    """Starting the same envelope twice sends one hop; another route under the same id is a
    Conflict."""
    _start(routes)
    _start(routes)
    assert len(routes.store.inbox("prep")) == 1
    with pytest.raises(Conflict):
        routes.start({"id": "abc", "route": {"actors": ["post"]}, "payload": {}})


def test_end_actors_never_advance(routes: RouteStore) -> None:
    """"end actors never advance the index": an envelope at an end actor is not routed
    again, in Python (RouteEnded) or in the table (route_record refuses to move it)."""
    _start(routes)
    _hop(routes, "prep", None)
    ((lease, env),) = routes.receive(HAPPY_END)
    with pytest.raises(RouteEnded):
        routes.complete(HAPPY_END, lease, env, {"x": 1})
    moved = _row(env.model_copy(update={"route": env.route.model_copy(update={"end": None})}),
                 None, Phase.QUEUED)
    with pytest.raises(Conflict, match="end actors never advance"):
        _record(routes, GATEWAY, [moved])
    assert routes.get("abc").route.end == HAPPY_END
    assert wacp_id(env) == "asya:abc:0:happy-end"
    routes.finish(lease)
    assert routes.store.verify_trail().ok


def test_unknown_envelope(routes: RouteStore) -> None:
    with pytest.raises(NotFound):
        routes.get("nope")
    with pytest.raises(NotFound):
        routes.family("nope")
    with pytest.raises(InvalidInput):
        routes.store.db.scalar("SELECT agentpost.route_record(%s, %s::jsonb)",
                               (GATEWAY, '{"id": 1}'))


def test_nested_fan_out_stays_in_the_family(routes: RouteStore) -> None:
    """A fan-out child that fans out again: its children join the family of the first
    envelope (root_id), found by one indexed query."""
    _start(routes)
    _hop(routes, "prep", [{"k": 0}, {"k": 1}])
    for lease, env in routes.receive("infer", max=2):
        routes.complete("infer", lease, env, [{"j": 0}, {"j": 1}] if env.id == "abc-1" else {})
    fam = routes.family("abc")
    assert [(m.id, m.parent_id, m.root_id) for m in fam.members] == [
        ("abc", None, "abc"), ("abc-1", "abc", "abc"), ("abc-1-1", "abc-1", "abc")]
    assert fam.status is RouteStatus.RUNNING
    assert fam.progress == pytest.approx(2 / 3)


def test_progress_points(routes: RouteStore) -> None:
    """"Sidecars report progress ... received, processing, completed": completed counts the
    current actor as done (1/3 at prep)."""
    _start(routes)
    ((_lease, env),) = routes.receive("prep")
    assert routes.report("prep", env, "processing").status is RouteStatus.RUNNING
    assert routes.report("prep", env, Phase.COMPLETED).progress == pytest.approx(1 / 3)
    with pytest.raises(InvalidInput):
        routes.report("infer", env, Phase.RECEIVED)
    with pytest.raises(InvalidInput, match="phase"):
        routes.report("prep", env, "bogus")


def test_fan_out_id_collision_is_refused(routes: RouteStore) -> None:
    """A fan-out child may not take over an envelope routed on its own under the same id:
    Conflict before anything is sent; the lease still holds."""
    _start(routes)
    _start(routes, eid="abc-1")
    ((lease, env),) = routes.receive("prep", max=1)
    assert env.id == "abc"
    with pytest.raises(Conflict):
        routes.complete("prep", lease, env, [{"k": 0}, {"k": 1}])
    assert routes.get("abc-1").parent_id is None
    assert routes.store.inbox("infer") == []
    routes.complete("prep", lease, env, {"k": 0})


def test_stale_reports_are_dropped(routes: RouteStore) -> None:
    """A report about a hop that already moved on does not move the envelope back."""
    _start(routes)
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, {"x": 1})
    assert _record(routes, "prep", [_row(env, None, Phase.RECEIVED)]) == 0
    assert routes.get("abc").route.current == 1


def test_dead_lettered_hop_goes_to_error_end(routes: RouteStore) -> None:
    """"error-end ... Automatically routed on timeout": a hop whose redelivery is exhausted
    is swept to error-end with the index kept and error ``timeout``."""
    _start(routes)
    for _ in range(4):
        ((lease, _env),) = routes.receive("prep")
        routes.store.nack(lease.token)
    assert routes.receive("prep") == []
    assert routes.sweep_timeouts() == ["abc"]
    view = routes.get("abc")
    assert (view.status, view.route.current, view.route.end) == (
        RouteStatus.FAILED, 0, ERROR_END)
    assert view.error is not None and view.error["error"] == "timeout"
    ((lease, env),) = routes.receive(ERROR_END)
    assert env.payload == {"text": "hi"}
    routes.finish(lease)
    assert routes.sweep_timeouts() == []
    assert routes.store.verify_trail().ok


def test_streaming_completes_and_leases_in_one_call(routes: RouteStore) -> None:
    """complete_and_receive: the hop is routed and the next hop of the same actor leased
    (and reported received) by one call; finish_and_receive does the same at an end actor,
    and only there."""
    for eid in ("s1", "s2"):
        routes.start({"id": eid, "route": {"actors": ["prep"]}, "payload": {}})
    (first,) = routes.receive("prep")
    steps, (second,) = routes.complete_and_receive("prep", [(first, {"a": 1})])
    assert steps[0].kind is StepKind.ADVANCE
    assert (first.envelope.id, second.envelope.id) == ("s1", "s2")
    assert routes.get("s2").phase is Phase.RECEIVED
    assert second.lease.holder == "asya-prep" and second.lease.attempt == 1
    _, nothing = routes.complete_and_receive("prep", [(second, {"a": 2})])
    assert nothing == []
    ended = routes.receive(HAPPY_END)
    with pytest.raises(InvalidInput, match="not an end actor"):
        routes.finish_and_receive("prep", ended)
    rest = routes.finish_and_receive(HAPPY_END, ended, max=5)
    assert [h.envelope.id for h in [*ended, *rest]] == ["s1", "s2"]
    assert routes.finish_and_receive(HAPPY_END, rest) == []
    assert routes.store.inbox(HAPPY_END) == []
    assert routes.store.verify_trail().ok


def test_streaming_leaves_expired_leases_to_a_lease_of_their_own(routes: RouteStore) -> None:
    """complete_and_receive never returns expired leases inside the step (that would lock the
    senders' chains while the actor's is held): it leases apart, and the expired hop comes
    back, counted as a redelivery."""
    for eid in ("s1", "s2"):
        routes.start({"id": eid, "route": {"actors": ["prep"]}, "payload": {}})
    (first,) = routes.receive("prep")
    (late,) = routes.receive("prep", ttl=0.05)
    time.sleep(0.1)
    apart: list[str] = []
    receive = routes.receive

    def spy(actor: str, **kw: Any) -> list[Hop]:
        apart.append(actor)
        return receive(actor, **kw)

    routes.receive = spy  # type: ignore[method-assign]
    _, (again,) = routes.complete_and_receive("prep", [(first, {})])
    assert apart == ["prep"]  # the step left the expired lease alone
    assert again.envelope.id == late.envelope.id == "s2" and again.lease.attempt == 2
    assert [e.event for e in routes.store.trail(envelope_id="asya:s2:0")].count(
        "lease_expired") == 1
    assert routes.store.verify_trail().ok
