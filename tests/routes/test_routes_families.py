"""Nested fan-outs (Asya §Fan-Out, "Fanout ID semantics"): a fan-out of a fan-out keeps
every branch, whatever the order in which the branches complete, and a family is succeeded
only once every member it ever had has ended (docs/asya.md, "Fan-out ids", "Families").
The two orders of the review's example, the store's refusal of a colliding step, then random
trees in random orders (hypothesis) and concurrent completers in several processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentpost.pg.server import PostgresServer
from agentpost.protocol.errors import AgentpostError, Conflict, LeaseLost
from agentpost.protocol.routes import HAPPY_END, RouteStatus
from agentpost.store import EnvelopeStore
from agentpost.store.routes import Hop, RouteStore
from dbtools import create_database, drop_database, query, unique_db_name

ACTORS = ["a", "b", "c"]


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


# -- random trees, random orders -----------------------------------------------------------


@pytest.fixture(scope="module")
def routed_template(pg_server: PostgresServer, template_db: str) -> Iterator[str]:
    """A migrated database with the actors set up, as the template of one database per
    hypothesis example (no connection may stay open to it)."""
    name = unique_db_name("routes")
    dsn = create_database(pg_server.dsn, name, template=template_db)
    try:
        with EnvelopeStore(dsn) as store:
            RouteStore(store).setup(ACTORS)
        yield name
    finally:
        drop_database(pg_server.dsn, name)


@contextmanager
def _fresh(pg_server: PostgresServer, template: str) -> Iterator[RouteStore]:
    name = unique_db_name("example")
    dsn = create_database(pg_server.dsn, name, template=template)
    try:
        with EnvelopeStore(dsn) as store:
            yield RouteStore(store)
    finally:
        drop_database(pg_server.dsn, name)


def _items(path: str, width: int) -> Any:
    """An actor's result for the item at `path`: `width` items (one: a plain payload)."""
    items = [{"path": f"{path}.{j}"} for j in range(width)]
    return items if width > 1 else items[0]


class Tally:
    """What a run made and what reached where: item paths per stage (0..2 the actors,
    3 happy-end), and the members the family ever had."""

    def __init__(self, root: str) -> None:
        self.produced = [Counter([root]), Counter(), Counter(), Counter()]
        self.handled = [Counter(), Counter(), Counter(), Counter()]
        self.members = 1

    def handle(self, stage: int, path: str, width: int) -> Any:
        self.handled[stage][path] += 1
        self.produced[stage + 1].update(f"{path}.{j}" for j in range(width))
        self.members += width - 1
        return _items(path, width)

    @property
    def ended(self) -> int:
        return sum(self.produced[3].values())


def _assert_conserved(rs: RouteStore, root: str, tally: Tally) -> None:
    """Every item reached the next actor (and the last, and happy-end) exactly once; the
    family has every member it ever had, each with its own id, all succeeded."""
    for stage in range(1, 4):
        assert tally.handled[stage] == tally.produced[stage], stage
        assert set(tally.handled[stage].values()) <= {1}
    fam = rs.family(root)
    assert len(fam.members) == len({m.id for m in fam.members}) == tally.members
    assert {m.status for m in fam.members} == {RouteStatus.SUCCEEDED}
    assert (fam.status, fam.progress) == (RouteStatus.SUCCEEDED, 1)
    assert rs.store.verify_trail().ok


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_random_fan_out_trees_in_random_orders_lose_nothing(
        pg_server: PostgresServer, routed_template: str, data: st.DataObject) -> None:
    """Asya §Fan-Out over random trees (each hop a payload or a fan-out of 2-3, at every
    actor) completed in random orders, one hop or a batch of an actor's hops at a time:
    every item reaches the next actor exactly once (the leaves the last actor, then
    happy-end), the family's member count is 1 + the children its fan-outs named, and the
    family is succeeded exactly when every one of them has ended."""
    with _fresh(pg_server, routed_template) as rs:
        tally = Tally("X")
        rs.start({"id": "X", "route": {"actors": ACTORS}, "payload": {"path": "X"}})
        pool: list[tuple[int, Hop]] = []
        while True:
            for stage, actor in enumerate([*ACTORS, HAPPY_END]):
                pool += [(stage, h) for h in rs.receive(actor, max=50)]
            if not pool:
                break
            stage, _ = pool[data.draw(st.integers(0, len(pool) - 1), label="next")]
            batch = [p for p in pool if p[0] == stage]
            if not data.draw(st.booleans(), label="batch"):
                batch = batch[:1]
            pool = [p for p in pool if p not in batch]
            hops = [h for _, h in batch]
            if stage == 3:
                tally.handled[3].update(h.envelope.payload["path"] for h in hops)
                rs.finish_many(hops)
                continue
            rs.complete_many(ACTORS[stage], [(h, tally.handle(
                stage, h.envelope.payload["path"], data.draw(st.integers(1, 3), label="width")))
                for h in hops])
            fam = rs.family("X")
            assert (fam.status is RouteStatus.SUCCEEDED) == (tally.ended == tally.members)
        _assert_conserved(rs, "X", tally)


# -- concurrent completers ------------------------------------------------------------------


def _width(seed: int, stage: int, path: str) -> int:
    """The fan-out width of the item at `path` at `stage`: the same in every process."""
    return random.Random(f"{seed}:{stage}:{path}").randint(1, 3)


def _completer(dsn: str, trail_key: str, seed: int, stop: Any, errors: Any) -> None:
    """A runtime in a process of its own: leases 1-3 hops of a random actor (or of
    happy-end) and completes them one by one or as one batch, until stopped. Reports every
    error (none is expected: leases outlive the test)."""
    rng = random.Random(f"{seed}:{os.getpid()}")
    with EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=5.0) as store:
        rs = RouteStore(store)
        while not stop.is_set():
            stage = rng.randrange(4)
            try:
                hops = rs.receive([*ACTORS, HAPPY_END][stage], max=rng.randint(1, 3))
                if stage == 3 or not hops:
                    rs.finish_many(hops)
                    time.sleep(0 if hops else 0.005)
                    continue
                outcomes = [(h, _items(h.envelope.payload["path"], _width(
                    seed, stage, h.envelope.payload["path"]))) for h in hops]
                if rng.random() < 0.5:
                    rs.complete_many(ACTORS[stage], outcomes)
                else:
                    for outcome in outcomes:
                        rs.complete_many(ACTORS[stage], [outcome])
            except AgentpostError as exc:
                errors.put(f"{type(exc).__name__}: {exc}")


def _expected(seed: int, root: str) -> Tally:
    """The tally the tree of `root` must come to (widths by `_width`)."""
    tally = Tally(root)
    for stage in range(3):
        for path in sorted(tally.produced[stage]):
            tally.handle(stage, path, _width(seed, stage, path))
    return tally


def _paths(dsn: str, recipient: str) -> Counter[str]:
    return Counter(json.loads(c)["path"] for (c,) in query(
        dsn, "SELECT content FROM agentpost.envelopes WHERE recipient = %s", (recipient,)))


@pytest.mark.parametrize("seed, processes", [(1, 2), (2, 3), (3, 4)])
def test_concurrent_completers_lose_no_branch(dsn: str, store: EnvelopeStore, seed: int,
                                              processes: int) -> None:
    """Asya §Fan-Out with concurrent completers: 2-4 runtimes in processes of their own
    complete the hops of three random fan-out trees in whatever order they lease them.
    Every item reaches each next actor exactly once, every leaf happy-end once, each family
    has every member it ever had, all succeeded; the trail verifies."""
    rs = RouteStore(store)
    rs.setup(ACTORS)
    roots = [f"t{seed}-{i}" for i in range(3)]
    rs.start_many([{"id": r, "route": {"actors": ACTORS}, "payload": {"path": r}}
                   for r in roots])
    tallies = {r: _expected(seed, r) for r in roots}
    leaves = sum(t.ended for t in tallies.values())
    ctx = multiprocessing.get_context("spawn")
    stop, errors = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_completer, daemon=True, args=(
        dsn, os.environ["AGENTPOST_TRAIL_KEY"], seed, stop, errors)) for _ in range(processes)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and errors.empty() and query(
                dsn, "SELECT count(*) FROM agentpost.envelopes WHERE recipient = 'happy-end'"
                     " AND consumed_at IS NOT NULL")[0][0] < leaves:
            time.sleep(0.05)
    finally:
        stop.set()
        for proc in procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    for stage, actor in enumerate([*ACTORS, HAPPY_END][1:], start=1):
        assert _paths(dsn, actor) == sum((t.produced[stage] for t in tallies.values()),
                                         Counter()), actor
    for root, tally in tallies.items():
        tally.handled = tally.produced  # (what reached each actor is checked above)
        _assert_conserved(rs, root, tally)
