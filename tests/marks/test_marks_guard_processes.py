"""The Postgres guard across processes: four spawned processes race ``Guard.pre_action`` on
the same few resources of one space, and no (scope, resource) ever gets an ALLOW the rules do
not give.

Each worker builds its own ``PostgresMarkSpace`` on the module's database (same space name)
and its own ``Guard``, with three agents of its own, waits at a barrier, then asks for every
(scope, resource) once per agent in a shuffled order, with confidences drawn from a few values
(ties included). Time is the wall clock, as in production; in a second run one machine with
a clock an hour fast has written to the space first. Three scopes:

- ``rooms``: FIRST_WRITER. Exactly one ALLOW per resource, for the intent that is first in the
  space's total order (created_at, id).
- ``desks``: HIGHEST_CONFIDENCE, immediate. Serialized decisions may let a later, stronger
  intent through too (§6.2's priority inversion, within the rules), so the check is the rule
  itself: an ALLOW goes only to an intent that beats every intent before it in the total
  order, and the first intent always gets one.
- ``parking``: HIGHEST_CONFIDENCE, deferred. ``pre_action`` answers BLOCKED only; each worker
  then calls ``resolve_deferred`` (concurrent boundaries: exactly one ALLOW each), and a final
  boundary after all workers are done gives exactly one ALLOW, to the intent with the highest
  confidence (earliest on ties), and BLOCKED to every other agent.

Without a working cross-process lock the checks fail: two workers read the intents before
either has committed its own, and both are let through.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import time
import traceback
import uuid
from typing import Any

import pytest

from agentpost.marks import (
    Agent,
    ConflictPolicy,
    DecayConfig,
    Guard,
    MarkType,
    Observation,
    Scope,
    Verdict,
    hours,
)
from agentpost.marks.postgres import PostgresMarkSpace

WORKERS = 4
AGENTS_PER_WORKER = 3
RESOURCES = ("spot-1", "spot-2")
CONFIDENCES = (0.2, 0.5, 0.5, 0.8, 0.9)
LONG = DecayConfig(intent_ttl=hours(2))  # nothing expires during the race
SCOPES = [
    Scope(name="rooms", conflict_policy=ConflictPolicy.FIRST_WRITER, decay=LONG),
    Scope(name="desks", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE, decay=LONG),
    Scope(name="parking", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE, deferred=True,
          decay=LONG),
]


def race(dsn: str, space_name: str, worker: int, barrier: Any, results: Any) -> None:
    """One racing process (spawned: builds everything it uses itself)."""
    try:
        space = PostgresMarkSpace(dsn=dsn, scopes=SCOPES, clock=None, space=space_name)
        guard = Guard(space)
        grants = {scope.name: ["intent", "action"] for scope in SCOPES}
        agents = [Agent(name=f"w{worker}-a{k}", scopes=grants) for k in range(AGENTS_PER_WORKER)]
        rng = random.Random(worker)
        plan = [(a, s.name, r) for a in agents for s in SCOPES for r in RESOURCES]
        rng.shuffle(plan)
        barrier.wait(timeout=60)
        decisions = []
        for agent, scope, resource in plan:
            decision = guard.pre_action(agent, scope, resource, "take", rng.choice(CONFIDENCES))
            decisions.append((scope, resource, str(agent.id), decision.verdict.value,
                              str(decision.intent_id) if decision.intent_id else None))
        boundaries = [
            (resource, {str(a): v.verdict.value
                        for a, v in guard.resolve_deferred("parking", resource).items()})
            for resource in RESOURCES
        ]
        space.close()
        results.put(("ok", worker, decisions, boundaries))
    except BaseException:
        results.put(("error", worker, traceback.format_exc(), None))


def run_race(dsn: str, space_name: str) -> tuple[list[Any], list[Any]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=race, args=(dsn, space_name, w, barrier, results))
             for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    decisions: list[Any] = []
    boundaries: list[Any] = []
    try:
        for _ in procs:
            status, worker, payload, extra = results.get(timeout=120)
            assert status == "ok", f"worker {worker} failed:\n{payload}"
            decisions += payload
            boundaries += extra
    except queue.Empty:
        pytest.fail("a racing process did not report within 120 s")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return decisions, boundaries


def order_key(intent: Any) -> tuple[float, uuid.UUID]:
    return (intent.created_at, intent.id)


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [0.0, hours(1)], ids=["wall-clocks", "one-fast-clock"])
def test_processes_racing_pre_action_never_break_the_rules(module_dsn: str,
                                                           ahead: float) -> None:
    """Several processes racing pre_action on the same resources never produce two ALLOWs
    for one (scope, resource) outside the rules (FIRST_WRITER, HIGHEST_CONFIDENCE, deferred).

    "one-fast-clock": before the race, a machine whose clock is an hour fast wrote one mark
    in the space. Every later write then gets that mark's created_at (P32's max(clock,
    latest)), so all intents tie on created_at, and the rules must still follow write
    order: an agent already let through stays the only one."""
    space_name = f"race_{uuid.uuid4().hex}"
    if ahead:
        fast = PostgresMarkSpace(dsn=module_dsn, scopes=SCOPES, clock=time.time() + ahead,
                                 space=space_name)
        with fast:
            fast.write(Agent(name="fast-clock", scopes={"rooms": ["observation"]}),
                       Observation(scope="rooms", topic="clock", content={"ahead": ahead}))
    decisions, boundaries = run_race(module_dsn, space_name)
    total = WORKERS * AGENTS_PER_WORKER
    assert len(decisions) == total * len(SCOPES) * len(RESOURCES)

    with PostgresMarkSpace(dsn=module_dsn, scopes=SCOPES, clock=None, space=space_name) as space:
        for scope in ("rooms", "desks", "parking"):
            for resource in RESOURCES:
                mine = [d for d in decisions if d[:2] == (scope, resource)]
                intents = sorted(space.read(scope, resource=resource,
                                            mark_type=MarkType.INTENT), key=order_key)
                assert len(intents) == total == len(mine)
                assert {str(i.id) for i in intents} == {d[4] for d in mine}
                allowed = {d[4] for d in mine if d[3] == Verdict.ALLOW.value}
                if scope == "rooms":
                    assert allowed == {str(intents[0].id)}, (scope, resource)
                elif scope == "desks":
                    assert str(intents[0].id) in allowed
                    for position, intent in enumerate(intents):
                        beats_earlier = all(intent.confidence > e.confidence
                                            for e in intents[:position])
                        assert (str(intent.id) in allowed) == beats_earlier, (resource, position)
                else:
                    assert {d[3] for d in mine} == {Verdict.BLOCKED.value}
                    assert allowed == set()

        for _resource, outcome in boundaries:
            assert list(outcome.values()).count(Verdict.ALLOW.value) == 1, outcome

        guard = Guard(space)
        for resource in RESOURCES:
            intents = space.read("parking", resource=resource, mark_type=MarkType.INTENT)
            winner = min(intents, key=lambda i: (-i.confidence, i.created_at, i.id))
            outcome = {a: d.verdict for a, d in guard.resolve_deferred("parking", resource).items()}
            assert len(outcome) == total
            assert [a for a, v in outcome.items() if v is Verdict.ALLOW] == [winner.agent_id]
            assert max(i.confidence for i in intents) == winner.confidence
