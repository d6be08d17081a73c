"""A hop is atomic (issue 5, Routes): acking the lease, accepting the envelopes the result
routes on and recording where each stands commit together or not at all
(``agentpost.route_step``). Deterministic failures in the middle of a step (a refused
child, a stale lease, a forged hop), a runner killed inside the step's transaction and
between its phases, and (slow) runners killed at random points: afterwards every route
reaches its end exactly once and the trail verifies."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import AgentpostError, Conflict, LeaseLost
from agentpost.protocol.routes import ERROR_END, HAPPY_END, RouteStatus
from agentpost.store import EnvelopeStore
from agentpost.store.routes import ENVELOPE_TYPE, RouteStore
from dbtools import connect
from dbtools import rows as _rows

ACTORS = ["prep", "infer", "post"]
APP = "agentpost"  # the application_name of every store connection


def snapshot(store: EnvelopeStore) -> tuple[Any, ...]:
    """Everything a step could change: route rows, envelopes (status, consumption, lease),
    the trail's length, signals."""
    db = store.db
    return (db.fetchall("SELECT id, actors, current, end_actor, phase, envelope_id, error"
                        " FROM agentpost.routes ORDER BY id"),
            db.fetchall("SELECT id, status, consumed_at, lease_token FROM agentpost.envelopes"
                        " ORDER BY id"),
            db.scalar("SELECT count(*) FROM agentpost.trail"),
            db.scalar("SELECT count(*) FROM agentpost.signals"))


def _start(rs: RouteStore, eid: str, actors: list[str] = ACTORS) -> None:
    rs.start({"id": eid, "route": {"actors": actors}, "payload": {"n": 1}})


def test_a_refused_child_undoes_the_whole_hop(routes: RouteStore) -> None:
    """A failure in the middle of a hop (the route rows are written, then the next actor
    refuses the envelope: it is sealed) changes nothing: no row moved, no trail entry, the
    lease still live; once the actor reopens, the same lease completes the hop."""
    _start(routes, "abc")
    ((lease, env),) = routes.receive("prep")
    routes.store.transition("infer", "closed")
    before = snapshot(routes.store)
    with pytest.raises(Conflict, match="refused"):
        routes.complete("prep", lease, env, {"x": 1})
    assert snapshot(routes.store) == before
    assert routes.store.verify_trail().ok
    routes.store.heartbeat(lease.token, 30)  # the lease is still live
    routes.complete("prep", lease, env, {"x": 1}, actors=["prep", "post"])
    assert routes.get("abc").route.actor == "post"


def test_a_batch_of_hops_is_all_or_nothing(routes: RouteStore) -> None:
    """complete_many: one refused hop undoes the others of the batch."""
    _start(routes, "one", ["prep", "infer"])
    _start(routes, "two", ["prep", "post"])
    hops = routes.receive("prep", max=2)
    routes.store.transition("post", "closed")
    before = snapshot(routes.store)
    with pytest.raises(Conflict):
        routes.complete_many("prep", [(h, {"ok": True}) for h in hops])
    assert snapshot(routes.store) == before
    assert routes.store.verify_trail().ok


def test_a_stale_lease_changes_nothing(routes: RouteStore) -> None:
    """A hop whose lease ran out is refused (LeaseLost) after its rows were written: all of
    it is undone; the envelope is redelivered and the next lease completes it."""
    _start(routes, "abc")
    ((lease, env),) = routes.receive("prep", ttl=0.05)
    time.sleep(0.1)
    before = snapshot(routes.store)
    with pytest.raises(LeaseLost):
        routes.complete("prep", lease, env, {"x": 1})
    assert snapshot(routes.store) == before
    ((again, env2),) = routes.receive("prep")
    assert again.attempt == 2 and env2 == env
    routes.complete("prep", again, env2, {"x": 1})
    assert routes.get("abc").route.current == 1
    assert routes.store.verify_trail().ok


def test_a_lease_overtaken_by_another_runtime_is_stale(routes: RouteStore) -> None:
    """A runtime whose lease ran out while another runtime completed the hop gets LeaseLost
    (its lease is stale), not a complaint about the route; nothing changes."""
    _start(routes, "abc")
    ((slow, env),) = routes.receive("prep", ttl=0.05)
    time.sleep(0.1)
    ((fast, _),) = routes.receive("prep")
    routes.complete("prep", fast, env, {"by": "fast"})
    before = snapshot(routes.store)
    with pytest.raises(LeaseLost, match="acknowledged"):
        routes.complete("prep", slow, env, {"by": "slow"})
    assert snapshot(routes.store) == before


def test_a_forged_hop_is_not_routed(routes: RouteStore) -> None:
    """An envelope that claims to be a hop (type asya.envelope, a ``meta.asya`` naming a
    routed envelope) but is not its current hop: `receive` gives it back instead of
    handing it out, and a step on its lease is refused (Conflict), nothing changed."""
    _start(routes, "abc")
    forged_meta = {"asya": {"id": "abc", "parent_id": None,
                            "route": {"actors": ACTORS, "current": 0, "end": None}}}
    routes.store.send("asya-gateway", "prep", ENVELOPE_TYPE, '{"evil": true}',
                      format="json", envelope_id="forged-1", meta=forged_meta)
    ((lease, env),) = routes.receive("prep", max=5)
    assert lease.envelope.id == "asya:abc:0"
    assert routes.store.get("forged-1").redeliveries == 1  # given back
    (forged,) = routes.store.lease("prep")
    assert forged.envelope.id == "forged-1"
    before = snapshot(routes.store)
    with pytest.raises(Conflict, match="not the current hop"):
        routes.complete("prep", forged, env, {"x": 1})
    assert snapshot(routes.store) == before
    assert routes.store.verify_trail().ok


# -- real crashes ----------------------------------------------------------------------------


def _runner(dsn: str, trail_key: str, seed: int, ready: Any, go: Any, plan: str) -> None:
    """A route runtime in a process of its own: every actor handles what it can lease, the
    first fanning out to three; until killed. `plan` "one-hop" completes a single hop of
    prep and then waits."""
    rng = random.Random(seed)
    store = EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=30.0)
    rs = RouteStore(store)
    while True:
        try:  # the test cuts every store backend while the next runner starts up
            rs.known(ACTORS)
            break
        except AgentpostError:
            continue
    ready.set()
    if not go.wait(120):
        return
    if plan == "one-hop":
        ((lease, env),) = rs.receive("prep", ttl=1.0)
        rs.complete("prep", lease, env, [{"k": i} for i in range(3)])
        time.sleep(60)
        return
    while True:
        try:
            for i, actor in enumerate(ACTORS):
                hops = rs.receive(actor, max=rng.randint(1, 5), ttl=1.0)
                if hops:
                    rs.complete_many(actor, [(h, [{"k": k} for k in range(3)] if i == 0
                                              else {actor: True}) for h in hops])
            done = rs.receive(HAPPY_END, max=rng.randint(1, 5), ttl=1.0)
            if done:
                rs.finish_many(done)
        except AgentpostError:
            continue  # the backend was terminated under us: the pool reconnects


class Runner:
    def __init__(self, ctx: Any, dsn: str, seed: int, plan: str) -> None:
        self.ready, self._go = ctx.Event(), ctx.Event()
        self.proc = ctx.Process(target=_runner, daemon=True, args=(
            dsn, os.environ["AGENTPOST_TRAIL_KEY"], seed, self.ready, self._go, plan))
        self.proc.start()

    def go(self) -> None:
        if not self.ready.wait(60):
            pytest.fail(f"the runner did not start (exit code {self.proc.exitcode})")
        self._go.set()

    def kill(self) -> None:
        assert self.proc.is_alive(), f"the runner died on its own ({self.proc.exitcode})"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for runner in started:
        if runner.proc.is_alive():
            runner.proc.kill()
        runner.proc.join(5)


def _terminate_store_backends(admin: Any) -> int:
    return len(_rows(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE"
                            " datname = current_database() AND application_name = %s"
                            " AND pid <> pg_backend_pid()", (APP,)))


def _wait_for_no_store_backends(admin: Any) -> None:
    deadline = time.monotonic() + 30
    while _rows(admin, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                       " AND application_name = %s", (APP,)):
        if time.monotonic() > deadline:
            _terminate_store_backends(admin)
            deadline = time.monotonic() + 30
        time.sleep(0.05)


def _kill_and_cut(runner: Runner, admin: Any, store: EnvelopeStore) -> None:
    """SIGKILL the runner and terminate every store backend (the test's own store closes
    its pooled connections first, and reconnects on its next call)."""
    store.db.dispose()
    runner.kill()
    _terminate_store_backends(admin)
    _wait_for_no_store_backends(admin)


def _hold_lock(dsn: str, key_sql: str, arg: str) -> Any:
    """An open transaction holding an advisory lock (a concurrent step would wait on it)."""
    conn = psycopg2.connect(libpq_dsn(dsn), application_name="agentpost-crash-holder")
    with conn.cursor() as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock({key_sql})", (arg,))
    return conn


def _wait_for_lock_wait(admin: Any) -> None:
    deadline = time.monotonic() + 30
    while not _rows(admin, "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                           " AND wait_event_type = 'Lock' AND datname = current_database()",
                    (APP,)):
        assert time.monotonic() < deadline, "the runner never reached the lock"
        time.sleep(0.02)


def _drain(rs: RouteStore, roots: list[str] | None = None, seconds: float = 60.0) -> None:
    """Run every route to its end in this process (what a restarted runtime does): pass
    after pass, and while a family of `roots` is not over, on past an empty pass (a hop
    whose lease has yet to run out, or delayed by a nack, comes back later), for up to
    `seconds`. A hop that never comes back still fails the test's assertions after that."""
    deadline = time.monotonic() + seconds
    while True:
        busy = False
        for i, actor in enumerate(ACTORS):
            for hop in rs.receive(actor, max=50):
                busy = True
                rs.complete(actor, hop.lease, hop.envelope,
                            [{"k": k} for k in range(3)] if i == 0 else {actor: True})
        if done := rs.receive(HAPPY_END, max=50):
            busy = True
            rs.finish_many(done)
        if busy:
            continue
        if time.monotonic() > deadline or all(
                rs.family(r).status is RouteStatus.SUCCEEDED for r in roots or ()):
            return
        time.sleep(0.2)


def assert_every_route_ended_once(admin: Any, rs: RouteStore, roots: list[str]) -> None:
    """After recovery: every envelope of every family succeeded, each reached happy-end by
    exactly one envelope, every hop is consumed, and the trail verifies."""
    for root in roots:
        fam = rs.family(root)
        assert fam.status is RouteStatus.SUCCEEDED, fam
        assert {m.id for m in fam.members} == {root, f"{root}-1", f"{root}-2"}
    ended = _rows(admin, "SELECT meta->'asya'->>'id', count(*) FROM agentpost.envelopes"
                         " WHERE recipient = 'happy-end' GROUP BY 1")
    assert sorted(ended) == sorted((f"{r}{s}", 1) for r in roots for s in ("", "-1", "-2"))
    left = _rows(admin, "SELECT id, status FROM agentpost.envelopes"
                        " WHERE consumed_at IS NULL OR status <> 'acknowledged'")
    assert left == []
    assert rs.store.verify_trail().ok


def test_killed_inside_the_hop_transaction_leaves_nothing(
        dsn: str, store: EnvelopeStore, runners: list[Runner]) -> None:
    """The runner's step has written its route rows and trail entries and waits (inside its
    transaction) to accept the first child; it is killed and its backend terminated. Nothing
    of the hop is left: the row is where the lease put it, no child exists, the hop is
    redelivered when its lease runs out, and the route then completes once."""
    rs = RouteStore(store)
    rs.setup(ACTORS)
    _start(rs, "abc")
    admin = connect(dsn, "agentpost-crash-test")
    holder = _hold_lock(dsn, "hashtextextended('agentpost.id:' || %s, 0)", "asya:abc:1")
    try:
        runner = Runner(multiprocessing.get_context("spawn"), dsn, 0, "one-hop")
        runners.append(runner)
        runner.go()
        _wait_for_lock_wait(admin)
        before = snapshot(store)
        _kill_and_cut(runner, admin, store)
    finally:
        holder.rollback()
        holder.close()
    assert snapshot(store) == before
    view = rs.get("abc")
    assert (view.route.current, view.phase) == (0, "received")
    assert _rows(admin, "SELECT id FROM agentpost.envelopes WHERE id LIKE %s",
                 ("asya:abc%:1",)) == []
    time.sleep(1.1)  # the dead runner's lease runs out
    _drain(rs)
    assert_every_route_ended_once(admin, rs, ["abc"])
    admin.close()


def test_killed_between_the_phases_the_hop_is_whole(
        dsn: str, store: EnvelopeStore, runners: list[Runner]) -> None:
    """The hop committed (lease acked, three children accepted, rows recorded) and the
    delivery to the next actor waits for its chain; the runner is killed. The hop is whole:
    recover() delivers the children once, and the route completes."""
    rs = RouteStore(store)
    rs.setup(ACTORS)
    _start(rs, "abc")
    admin = connect(dsn, "agentpost-crash-test")
    holder = _hold_lock(dsn, "hashtextextended('agentpost.trail:' || %s, 0)", "infer")
    try:
        runner = Runner(multiprocessing.get_context("spawn"), dsn, 0, "one-hop")
        runners.append(runner)
        runner.go()
        _wait_for_lock_wait(admin)
        _kill_and_cut(runner, admin, store)
    finally:
        holder.rollback()
        holder.close()
    assert _rows(admin, "SELECT status FROM agentpost.envelopes WHERE recipient = 'infer'"
                        " ORDER BY id") == [("validated",)] * 3
    assert {m.id: m.route.current for m in rs.family("abc").members} == {
        "abc": 1, "abc-1": 1, "abc-2": 1}
    assert store.get("asya:abc:0").consumed_at is not None
    store.recover()
    _drain(rs)
    assert_every_route_ended_once(admin, rs, ["abc"])
    admin.close()


@pytest.mark.slow
def test_runners_killed_at_random_points_lose_and_duplicate_nothing(
        dsn: str, store: EnvelopeStore, runners: list[Runner]) -> None:
    """Route runtimes killed (SIGKILL, and their backends terminated) at random points of
    their work, round after round; then recover() and a fresh runtime. Every route reaches
    happy-end exactly once per envelope, nothing is left undelivered or unconsumed, the
    trail verifies."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    rs = RouteStore(store)
    rs.setup(ACTORS)
    roots = [f"r{i}" for i in range(40)]
    rs.start_many([{"id": r, "route": {"actors": ACTORS}, "payload": {"n": i}}
                   for i, r in enumerate(roots)])
    admin = connect(dsn, "agentpost-crash-test")
    ctx = multiprocessing.get_context("spawn")
    upcoming = Runner(ctx, dsn, rng.randrange(2**32), "random")
    runners.append(upcoming)
    for _ in range(12):
        current, upcoming = upcoming, Runner(ctx, dsn, rng.randrange(2**32), "random")
        runners.append(upcoming)
        current.go()
        time.sleep(rng.uniform(0.02, 0.3))
        _kill_and_cut(current, admin, store)
    upcoming.proc.kill()
    _wait_for_no_store_backends(admin)
    store.recover()
    time.sleep(1.1)  # leases of the killed runners run out
    _drain(rs, roots)
    print(f"seed {seed}")
    print("not consumed:", _rows(
        admin, "SELECT id, recipient, status, delivered_at, lease_until, next_attempt_at, leases"
               " FROM agentpost.envelopes WHERE consumed_at IS NULL"))
    assert_every_route_ended_once(admin, rs, roots)
    admin.close()


def _streamer(dsn: str, trail_key: str, seed: int, seconds: float, errors: Any) -> None:
    """A streaming runtime for the actors "prep" and "infer", which send to each other
    (routes prep → infer → prep → infer): handlers sometimes outlive their 0.5 s leases, so
    leases expire while other steps run. Reports every unexpected error."""
    rng = random.Random(seed)
    store = EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=5.0)
    rs = RouteStore(store)
    hops = {actor: [] for actor in ("prep", "infer")}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for actor in hops:
            try:
                if not hops[actor]:
                    hops[actor] = rs.receive(actor, max=2, ttl=0.5)
                    continue
                time.sleep(rng.choice([0, 0, 0, 0, 0.01, 0.6]))
                _, hops[actor] = rs.complete_and_receive(
                    actor, [(h, {actor: True}) for h in hops[actor]], max=2, ttl=0.5)
            except LeaseLost:
                hops[actor] = []  # the handler outlived its lease: the hop comes again
            except AgentpostError as exc:
                errors.put(f"{type(exc).__name__}: {exc}")
                hops[actor] = []
    store.close()


@pytest.mark.slow
def test_runtimes_streaming_between_actors_that_send_to_each_other(
        dsn: str, store: EnvelopeStore) -> None:
    """Two runtimes stream hops between two actors that send to each other while leases
    expire under them: no step ever fails but for its own stale lease (LeaseLost, also when
    the other runtime moved the envelope on meanwhile; no deadlock, see
    test_a_step_commits_holding_only_its_actors_chain for the lock order), and every route
    ends exactly once (at happy-end, or at error-end when its hop timed out)."""
    rs = RouteStore(store)
    rs.setup(ACTORS)
    roots = [f"p{i}" for i in range(30)]
    rs.start_many([{"id": r, "route": {"actors": ["prep", "infer", "prep", "infer"]},
                    "payload": {}} for r in roots])
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_streamer, daemon=True, args=(
        dsn, os.environ["AGENTPOST_TRAIL_KEY"], seed, 6.0, errors)) for seed in (1, 2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    time.sleep(0.6)  # leases held when the runtimes stopped run out
    busy = True
    while busy:
        busy = False
        for actor in ("prep", "infer"):
            for hop in rs.receive(actor, max=50):
                busy = True
                rs.complete(actor, hop.lease, hop.envelope, {actor: True})
        if done := rs.receive(HAPPY_END, max=50):
            busy = True
            rs.finish_many(done)
    rs.sweep_timeouts()  # hops whose leases ran out four times: error-end (a timeout)
    if done := rs.receive(ERROR_END, max=50):
        rs.finish_many(done)
    views = [v for r in roots for v in rs.family(r).members]
    assert {v.status for v in views} <= {RouteStatus.SUCCEEDED, RouteStatus.FAILED}
    assert all(v.error == {"error": "timeout", "message": v.error["message"]}
               for v in views if v.status is RouteStatus.FAILED)
    ended = _rows(connect(dsn), "SELECT meta->'asya'->>'id', count(*) FROM agentpost.envelopes"
                                " WHERE recipient IN ('happy-end', 'error-end') GROUP BY 1")
    assert sorted(ended) == sorted((r, 1) for r in roots)
    assert store.verify_trail().ok


def test_a_step_commits_holding_only_its_actors_chain(dsn: str, routes: RouteStore) -> None:
    """Lock order: a step never waits for another actor's chain. While the chain of "infer"
    is held elsewhere (as a step of infer holds it), prep completes a hop although an expired
    lease of an envelope *infer sent* waits in prep's inbox (returning it locks infer's
    chain): the step commits at once and leaves the expired lease to a lease of its own,
    which waits for infer's chain after the commit. Were it taken inside the step, two
    actors sending to each other could deadlock."""
    routes.start({"id": "s1", "route": {"actors": ["prep"]}, "payload": {}})
    routes.start({"id": "s2", "route": {"actors": ["infer", "prep"]}, "payload": {}})
    ((lease, env),) = routes.receive("infer")
    routes.complete("infer", lease, env, {})
    hops = {h.envelope.id: h for h in routes.receive("prep", max=1)}
    hops.update({h.envelope.id: h for h in routes.receive("prep", max=1, ttl=0.05)})
    assert set(hops) == {"s1", "s2"}
    time.sleep(0.1)
    holder = _hold_lock(dsn, "hashtextextended('agentpost.trail:' || %s, 0)", "infer")
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(routes.complete_and_receive(
        "prep", [(hops["s1"], {})], max=1)))
    try:
        worker.start()
        deadline = time.monotonic() + 10
        while routes.get("s1").route.end != HAPPY_END:
            assert time.monotonic() < deadline, "the step waited for infer's chain"
            time.sleep(0.02)
        assert worker.is_alive()  # the separate lease of the expired hop waits for infer
    finally:
        holder.rollback()
        holder.close()
    worker.join(10)
    (_steps, (again,)) = got[0]
    assert (again.envelope.id, again.lease.attempt) == ("s2", 2)
    assert routes.store.verify_trail().ok
