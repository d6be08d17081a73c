"""Many deferred boundaries at once (issue 25): `Guard.resolve_deferred_many`, and
`resolve_all_deferred` built on it, decide exactly as `resolve_deferred` does one resource at
a time, record the same verdicts, and keep each resource's boundary atomic. And pre_action's
write-then-read (`write_and_read_with_claims`) is a write and a read.

The equivalence is checked on the same data: a seeded scenario (every conflict policy,
intents re-stated with another confidence, actions holding a resource, an agent no longer
entitled, resources without intents) is resolved resource by resource, then all at once in
small chunks; the decisions, the stored verdicts and the telemetry must match. Both
backends; and the two backends must agree with each other on the verdicts.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

import agentpost.marks.guard.deferred as deferred_module
from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Intent,
    Scope,
    UnauthorizedWrite,
    minutes,
)
from agentpost.marks.guard import ACTIVE, Guard, Verdict
from agentpost.marks.telemetry import EVENT_RESOLVE_DEFERRED, InMemorySink
from marks_backends import T0, SpaceFactory, close_space, make_space

TTL = minutes(30)
POLICIES = (ConflictPolicy.HIGHEST_CONFIDENCE, ConflictPolicy.FIRST_WRITER,
            ConflictPolicy.YIELD_ALL)
SCOPES = [Scope(name=f"lot-{p.value}", conflict_policy=p, deferred=True,
                allowed_action_verbs=("parked",), decay=DecayConfig(intent_ttl=TTL))
          for p in POLICIES]
TYPES = ["intent", "action", "need"]
AGENTS = [Agent(name=f"driver-{k}", scopes={s.name: TYPES for s in SCOPES}) for k in range(5)]
RESOURCES = [f"spot-{k:02d}" for k in range(14)]


def _fill(space: Any, seed: int) -> None:
    """The seeded scenario: per scope and resource 0-4 bidders (some bid twice, ties in
    confidence are common), now and then an action that holds the resource."""
    rng = random.Random(seed)
    guard = Guard(space)
    tick = 0.0
    for scope in SCOPES:
        for resource in RESOURCES:
            for bidder in rng.sample(AGENTS, rng.randrange(5)):
                for _ in range(rng.choice((1, 1, 2))):
                    tick += rng.choice((0.0, 1.0))
                    space.set_clock(T0 + tick)
                    guard.pre_action(bidder, scope.name, resource, "park",
                                     rng.choice((0.3, 0.5, 0.5, 0.8)))
            if rng.random() < 0.15:
                space.write(rng.choice(AGENTS), Action(scope=scope.name, resource=resource,
                                                       action="parked", result={}))
    space.set_clock(T0 + tick + 1)


def _entitled() -> dict[Any, Agent]:
    """The agents at the boundary: driver-4 may no longer write actions anywhere."""
    current = {a.id: a for a in AGENTS}
    last = AGENTS[4]
    current[last.id] = Agent(id=last.id, name=last.name,
                             scopes={s.name: ["intent"] for s in SCOPES})
    return current


def _stored(space: Any, scope: str) -> dict[tuple[str, Any], tuple[Any, ...]]:
    """The verdicts the space keeps on the scope, without their boundary and time."""
    out = {}
    for resource in RESOURCES:
        for agent in AGENTS:
            v = space.deferred_verdict(scope, resource, agent.id)
            if v is not None:
                out[(resource, agent.id)] = (v.intent_id, v.allowed, v.winner_id, v.expires_at,
                                             v.consumed_by)
    return out


def _boundaries(space: Any, scope: str) -> list[int]:
    """The boundary numbers on the scope's resources, in resource order (one per resource
    that has any verdict)."""
    numbers = []
    for resource in RESOURCES:
        found = {v.boundary for a in AGENTS
                 if (v := space.deferred_verdict(scope, resource, a.id)) is not None}
        assert len(found) <= 1, "one boundary per resource"
        numbers.extend(found)
    return numbers


def _events(sink: InMemorySink) -> list[dict[str, Any]]:
    return [e.attributes for e in sink.events_named(EVENT_RESOLVE_DEFERRED)]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("entitled", [False, True], ids=["all", "recheck"])
def test_many_decides_as_one_at_a_time(make_space, monkeypatch, seed, entitled):
    """On the same marks, resolve_deferred_many (chunks of 4, so several transactions) gives
    every resource the decisions resolve_deferred gave it (verdicts, reasons, intents,
    winners, the same Needs under YIELD_ALL), stores the same verdicts under new boundary
    numbers that follow resource order, and emits the same events."""
    monkeypatch.setattr(deferred_module, "BOUNDARY_CHUNK", 4)
    space = make_space(SCOPES)
    _fill(space, seed)
    agents = _entitled() if entitled else None
    for scope in SCOPES:
        sink_one, sink_many = InMemorySink(), InMemorySink()
        one = {r: Guard(space, telemetry=sink_one).resolve_deferred(scope.name, r, agents)
               for r in RESOURCES}
        stored_one, numbers_one = _stored(space, scope.name), _boundaries(space, scope.name)
        shuffled = random.Random(seed).sample(RESOURCES, len(RESOURCES))
        many = Guard(space, telemetry=sink_many).resolve_deferred_many(
            scope.name, shuffled + shuffled[:3], agents)
        assert list(many) == shuffled
        assert many == one
        assert _stored(space, scope.name) == stored_one
        numbers_many = _boundaries(space, scope.name)
        assert numbers_many == sorted(numbers_many)
        assert not numbers_one or min(numbers_many) > max(numbers_one)
        assert _events(sink_many) == _events(sink_one)
        assert any(d for d in one.values()), "the scenario must contest something"


def test_resolve_all_deferred_agrees_across_backends(request, monkeypatch):
    """resolve_all_deferred (the batched path) gives the same verdicts, by agent and
    resource, on both backends, and the per-resource path agrees on each."""
    monkeypatch.setattr(deferred_module, "BOUNDARY_CHUNK", 5)
    factory = SpaceFactory("postgres", request.getfixturevalue("module_dsn"))
    spaces = {"memory": make_space("memory", SCOPES, T0), "postgres": factory(SCOPES)}
    try:
        outcome = {}
        for kind, space in spaces.items():
            _fill(space, 7)
            outcome[kind] = Guard(space).resolve_all_deferred()
            per_resource = {key: {a: d.verdict for a, d in
                                  Guard(space).resolve_deferred(*key).items()}
                            for key in outcome[kind]}
            assert per_resource == outcome[kind]
        assert outcome["memory"] == outcome["postgres"]
        assert Verdict.ALLOW in {v for verdicts in outcome["memory"].values()
                                 for v in verdicts.values()}
    finally:
        close_space(spaces["memory"])
        factory.close_all()


def test_a_failed_chunk_keeps_none_of_its_verdicts(make_space, monkeypatch):
    """A chunk is one transaction: a boundary that raises in it leaves none of that chunk's
    verdicts (earlier chunks stay decided), as a raising resolve_deferred keeps nothing."""
    monkeypatch.setattr(deferred_module, "BOUNDARY_CHUNK", 7)
    space = make_space(SCOPES)
    _fill(space, 4)
    scope = SCOPES[0].name
    guard = Guard(space)
    real = guard._batch

    def failing(scope_def: Scope, board: Any) -> Any:
        if any(i.resource == RESOURCES[10] for i in board.intents):
            raise RuntimeError("boom")
        return real(scope_def, board)

    monkeypatch.setattr(guard, "_batch", failing)
    assert any(i.resource == RESOURCES[10] for i in space.get_intents(scope, RESOURCES[10]))
    with pytest.raises(RuntimeError, match="boom"):
        guard.resolve_deferred_many(scope, RESOURCES)
    kept = {r for (r, _) in _stored(space, scope)}
    assert not kept & set(RESOURCES[7:])
    contested = {r for r in RESOURCES[:7] if space.get_intents(scope, r)}
    assert kept == contested


def test_a_boundary_holds_its_resources_until_it_commits(make_space, monkeypatch):
    """While a batch decides, an agent's pre_action on one of its resources (another
    thread, another Guard) waits; it then answers from the verdict the batch recorded."""
    space = make_space(SCOPES)
    scope = SCOPES[0].name  # HIGHEST_CONFIDENCE
    bidder = Guard(space)
    low, high = AGENTS[0], AGENTS[1]
    bidder.pre_action(low, scope, "spot-00", "park", 0.2)
    bidder.pre_action(high, scope, "spot-00", "park", 0.9)
    bidder.pre_action(low, scope, "spot-01", "park", 0.2)
    boundary = Guard(space)
    inside, release = threading.Event(), threading.Event()
    real = boundary._batch

    def paused(scope_def: Scope, board: Any) -> Any:
        inside.set()
        assert release.wait(30)
        return real(scope_def, board)

    monkeypatch.setattr(boundary, "_batch", paused)
    runner = threading.Thread(target=boundary.resolve_deferred_many,
                              args=(scope, ["spot-00", "spot-01"]))
    runner.start()
    assert inside.wait(30)
    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.append(
        Guard(space).pre_action(high, scope, "spot-00", "park", 0.9)))
    asker.start()
    asker.join(0.5)
    assert asker.is_alive(), "pre_action ran inside the boundary"
    release.set()
    runner.join(30)
    asker.join(30)
    assert [a.verdict for a in answers] == [Verdict.ALLOW]
    assert "resolution boundary" in answers[0].reason


def test_overlapping_batches_do_not_deadlock(make_space):
    """Two boundaries over overlapping resources, given in opposite orders, at once: both
    finish (the locks are taken in one order), and the verdicts are those of one boundary
    after the other."""
    space = make_space(SCOPES)
    _fill(space, 5)
    scope = SCOPES[0].name
    expected = Guard(space).resolve_deferred_many(scope, RESOURCES)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda order=order: results.append(
        Guard(space).resolve_deferred_many(scope, order)))
        for order in (RESOURCES, RESOURCES[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert [dict(sorted(r.items())) for r in results] == [expected, expected]


def test_many_refuses_what_one_refuses(make_space):
    """The checks of resolve_deferred: an unknown scope, a resource that is not a string."""
    space = make_space(SCOPES)
    guard = Guard(space)
    with pytest.raises(Exception, match="no scope"):
        guard.resolve_deferred_many("nowhere", ["a"])
    with pytest.raises(Exception, match="strings"):
        guard.resolve_deferred_many(SCOPES[0].name, ["a", 3])
    assert guard.resolve_deferred_many(SCOPES[0].name, []) == {}


def test_write_and_read_with_claims_is_a_write_then_a_read(make_space):
    """pre_action's intent and its second look (one statement on Postgres): the mark is
    stored as write() stores it (hooks, names), and the board returned is what
    read_with_claims returns right after: the new intent in, the one it supersedes out,
    the actions holding the resource."""
    space = make_space(SCOPES)
    scope = SCOPES[0].name
    me, rival, holder = AGENTS[:3]
    fired: list[Any] = []
    space.add_write_hook(lambda agent_id, mark: fired.append(mark))
    old = space.write(me, Intent(scope=scope, resource="r", action="park", confidence=0.2))
    space.write(rival, Intent(scope=scope, resource="r", action="park", confidence=0.5))
    space.write(holder, Action(scope=scope, resource="r", action="parked", result={}))
    new = Intent(scope=scope, resource="r", action="park", confidence=0.9, supersedes=old)
    mark_id, (read, claims) = space.write_and_read_with_claims(me, new, ACTIVE)
    stored = space.get(mark_id)
    assert (stored.agent_id, stored.confidence, stored.supersedes) == (me.id, 0.9, old)
    assert fired[-1] == stored
    assert (read, claims) == space.read_with_claims(scope, "r", ACTIVE)
    assert mark_id in {m.id for m in read} and old not in {m.id for m in read}
    assert [a.agent_id for a in claims] == [holder.id]
    if hasattr(space, "agent_names"):
        assert space.agent_names([me.id]) == {me.id: me.name}


def test_write_and_read_with_claims_refuses_what_write_refuses(make_space):
    """The checks of write, before anything is stored: nothing written, nothing fired."""
    space = make_space(SCOPES)
    outsider = Agent(name="outsider", scopes={})
    with pytest.raises(UnauthorizedWrite):
        space.write_and_read_with_claims(
            outsider, Intent(scope=SCOPES[0].name, resource="r", action="park"), ACTIVE)
    assert space.read_with_claims(SCOPES[0].name, "r", ACTIVE) == ([], [])
