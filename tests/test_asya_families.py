"""Nested fan-outs (Asya §Fan-Out, "Fanout ID semantics"): a fan-out of a fan-out keeps
every branch, whatever the order in which the branches complete."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.protocol.errors import Conflict, LeaseLost
from agentpost.protocol.routes import HAPPY_END, RouteStatus
from agentpost.store import EnvelopeStore
from agentpost.store.routes import Hop, RouteStore

ACTORS = ["a", "b", "c"]


@pytest.fixture
def routes(store: EnvelopeStore) -> Iterator[RouteStore]:
    rs = RouteStore(store)
    rs.setup(ACTORS)
    yield rs


def _leased(rs: RouteStore, actor: str) -> dict[str, Hop]:
    return {h.envelope.id: h for h in rs.receive(actor, max=50)}


def _run_to_the_end(rs: RouteStore) -> list[Any]:
    """Complete every hop at c (a payload) and take everything out of happy-end: the
    payloads that reached happy-end."""
    for hop in _leased(rs, "c").values():
        rs.complete("c", hop.lease, hop.envelope, {"c": True})
    done = rs.receive(HAPPY_END, max=50)
    rs.finish_many(done)
    return [h.envelope.payload for h in done]


def _nested(rs: RouteStore, first: str) -> list[Any]:
    """Route [a, b, c] from X: a returns [p0, p1]; at b, X returns [q0, q1] and X-1 returns
    {"k": "r"}, `first` of the two completed first. Returns what reached happy-end."""
    rs.start({"id": "X", "route": {"actors": ACTORS}, "payload": {}})
    (hop,) = rs.receive("a")
    rs.complete("a", hop.lease, hop.envelope, [{"p": 0}, {"p": 1}])
    at_b = _leased(rs, "b")
    assert set(at_b) == {"X", "X-1"}
    results = {"X": [{"q": 0}, {"q": 1}], "X-1": {"k": "r"}}
    for eid in (first, *(set(at_b) - {first})):
        rs.complete("b", at_b[eid].lease, at_b[eid].envelope, results[eid])
        assert rs.family("X").status is RouteStatus.RUNNING
    return _run_to_the_end(rs)


def _assert_every_branch_ended(rs: RouteStore, ended: list[Any]) -> None:
    """Three leaves (q0, q1 under p0; r under p1) each reached happy-end once; the family
    has the three members it ever had (X, X-1, and X's second fan-out child), all
    succeeded."""
    assert sorted(map(repr, ended)) == sorted(map(repr, [
        {"p": 0, "q": 0, "c": True}, {"p": 0, "q": 1, "c": True},
        {"p": 1, "k": "r", "c": True}]))
    fam = rs.family("X")
    assert len(fam.members) == len({m.id for m in fam.members}) == 3
    assert fam.status is RouteStatus.SUCCEEDED and fam.progress == 1
    assert rs.store.verify_trail().ok


def test_nested_fan_out_parent_first_loses_no_branch(routes: RouteStore) -> None:
    """Asya §Fan-Out: X fans out at a (X, X-1), then X fans out again at b *before* X-1 is
    completed there. X's second fan-out child must not take the row of the waiting X-1 (which
    then could not be completed: "not the current hop"): all three leaves reach happy-end."""
    _assert_every_branch_ended(routes, _nested(routes, "X"))


def test_nested_fan_out_child_first_loses_no_payload(routes: RouteStore) -> None:
    """Asya §Fan-Out: X fans out at a (X, X-1), X-1 is completed at b first, then X fans out
    at b. X's second fan-out child must not be dropped as a duplicate of X-1's hop (its
    payload q1 would be lost while `complete` returns OK)."""
    _assert_every_branch_ended(routes, _nested(routes, "X-1"))


# -- the store refuses what would still collide -----------------------------------------------


def _snapshot(rs: RouteStore) -> tuple[Any, ...]:
    db = rs.store.db
    return (db.fetchall("SELECT id, parent_id, current, end_actor, phase, envelope_id"
                        " FROM agentpost.routes ORDER BY id"),
            db.fetchall("SELECT id, status, consumed_at FROM agentpost.envelopes ORDER BY id"),
            db.scalar("SELECT count(*) FROM agentpost.trail"))


@pytest.mark.parametrize("order", ["parent first", "child first", "one step"])
def test_a_step_reusing_a_routed_id_is_refused(routes: RouteStore, order: str) -> None:
    """Asya §Fan-Out ("Unique envelope identifier"): a step whose fan-out child is named
    like a routed envelope it does not move (a client naming X's second fan-out with the
    spec's scheme alone, or a hop sent before migration 0013) is refused (Conflict) and
    changes nothing, whether that envelope waits at the same actor, has moved on, or is
    completed in the same batch; never a row taken over or a child dropped as a duplicate.
    The lease still holds: the runtime's own naming then completes the hop."""
    routes.start({"id": "X", "route": {"actors": ACTORS}, "payload": {}})
    (hop,) = routes.receive("a")
    routes.complete("a", hop.lease, hop.envelope, [{"p": 0}, {"p": 1}])
    at_b = _leased(routes, "b")
    x, x1 = at_b["X"], at_b["X-1"]
    old = Hop(x.lease, x.envelope.model_copy(update={"fan_outs": 0}))  # spec naming only
    fan_out = [{"q": 0}, {"q": 1}]
    if order == "child first":
        routes.complete("b", x1.lease, x1.envelope, {"k": "r"})
    before = _snapshot(routes)
    with pytest.raises(Conflict, match="X-1"):
        if order == "one step":
            routes.complete_many("b", [(old, fan_out), (x1, {"k": "r"})])
        else:
            routes.complete("b", old.lease, old.envelope, fan_out)
    assert _snapshot(routes) == before
    routes.complete("b", x.lease, x.envelope, fan_out)
    if order != "child first":
        routes.complete("b", x1.lease, x1.envelope, {"k": "r"})
    _assert_every_branch_ended(routes, _run_to_the_end(routes))


def test_a_retried_fan_out_makes_no_second_children(routes: RouteStore) -> None:
    """A retried ``complete`` of the same hop (same lease, same envelope) after its fan-out
    committed is refused as stale (LeaseLost) and changes nothing: no second set of
    children, under any name."""
    routes.start({"id": "X", "route": {"actors": ACTORS}, "payload": {}})
    (hop,) = routes.receive("a")
    routes.complete("a", hop.lease, hop.envelope, [{"p": 0}, {"p": 1}])
    at_b = _leased(routes, "b")
    routes.complete("b", at_b["X"].lease, at_b["X"].envelope, [{"q": 0}, {"q": 1}])
    before = _snapshot(routes)
    for actor, again in (("a", hop), ("b", at_b["X"])):
        with pytest.raises(LeaseLost, match="acknowledged"):
            routes.complete(actor, again.lease, again.envelope, [{"p": 0}, {"p": 1}])
    assert _snapshot(routes) == before
    assert [m.id for m in routes.family("X").members] == ["X", "X-1", "X.1-1"]
