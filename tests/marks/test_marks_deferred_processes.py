"""Deferred resolution across processes (Markspace §6.2.1 phase 3, P12, P16, P17): the
boundary's verdicts live with the space, not in the Guard that ran it.

Three spawned worker processes each build their own ``PostgresMarkSpace`` (one space name)
and their own ``Guard``, and run the commands the test sends them: an agent's
``pre_action``, a boundary (``resolve_deferred`` or ``resolve_all_deferred``), an agent's
``execute``. Per round, on a fresh resource of a deferred HIGHEST_CONFIDENCE scope:

1. three agents write their intents, each through a random worker: all BLOCKED (phase 1);
2. one worker runs the boundary (phase 2/3);
3. in every other round a fourth agent outbids them all and *another* worker runs a second
   boundary, which supersedes the first: the first winner then tries to act through the
   worker that granted it, before anyone else (a grant kept in that Guard's memory would
   let it through);
4. every agent calls ``execute`` through a worker other than the one that ran the latest
   boundary.

Each round must end with exactly one tool call and one action mark, both by the latest
boundary's winner (P12: someone proceeds; P17: one ALLOW per boundary, and never two
actions on one exclusive resource), and every pending resource must have been covered by a
boundary (P16). With grants kept in the Guard object, the winner is BLOCKED forever in
every process but the boundary's, and a superseded grant still lets its holder act.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.marks import Agent, ConflictPolicy, DecayConfig, Guard, Scope, hours
from agentpost.marks.postgres import PostgresMarkSpace

WORKERS = 3
ROUNDS = 10
CONFIDENCES = (0.2, 0.5, 0.5, 0.9)
SCOPE = Scope(name="parking", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
              deferred=True, decay=DecayConfig(intent_ttl=hours(2)))
AGENTS = [Agent(name=f"driver-{k}", scopes={"parking": ["intent", "action"]})
          for k in range(6)]


def _handle(guard: Guard, op: str, args: tuple[Any, ...]) -> Any:
    """One command, run in a worker; results are plain values (picklable)."""
    if op == "pre":
        agent, resource, confidence = args
        return guard.pre_action(agent, "parking", resource, "park", confidence).verdict.value
    if op == "resolve":
        (resource,) = args
        return {str(a): v.verdict.value
                for a, v in guard.resolve_deferred("parking", resource).items()}
    if op == "resolve_all":
        return {resource: {str(a): v.value for a, v in outcome.items()}
                for (_, resource), outcome in guard.resolve_all_deferred().items()}
    if op == "execute":
        agent, resource, confidence = args
        calls = []

        def tool() -> dict[str, str]:
            calls.append(agent.name)
            return {"parked": agent.name}

        decision, _ = guard.execute(agent, "parking", resource, "park", "parked", tool,
                                    confidence)
        return decision.verdict.value, len(calls)
    if op == "actions":
        (resource,) = args
        return [str(a.agent_id) for a in guard.space.claims("parking", resource)]
    raise ValueError(f"unknown command {op!r}")


def serve(dsn: str, space_name: str, inbox: Any, outbox: Any) -> None:
    """A worker process (spawned: it builds everything it uses itself)."""
    space = PostgresMarkSpace(dsn=dsn, scopes=[SCOPE], space=space_name)
    guard = Guard(space)
    try:
        while (command := inbox.get(timeout=120)) is not None:
            try:
                outbox.put(("ok", _handle(guard, *command)))
            except BaseException:
                outbox.put(("error", traceback.format_exc()))
    finally:
        space.close()


class Worker:
    """The test's handle on one worker process: call() sends a command and waits."""

    def __init__(self, ctx: Any, dsn: str, space_name: str) -> None:
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=serve, args=(dsn, space_name, self.inbox, self.outbox))
        self.proc.start()

    def call(self, op: str, *args: Any) -> Any:
        self.inbox.put((op, args))
        try:
            status, payload = self.outbox.get(timeout=60)
        except queue.Empty:
            pytest.fail(f"worker {self.proc.pid} did not answer {op} within 60 s")
        assert status == "ok", payload
        return payload

    def stop(self) -> None:
        self.inbox.put(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture
def workers(module_dsn: str) -> Iterator[list[Worker]]:
    ctx = multiprocessing.get_context("spawn")
    space_name = f"deferred_{uuid.uuid4().hex}"
    pool: list[Worker] = []
    try:
        pool = [Worker(ctx, module_dsn, space_name) for _ in range(WORKERS)]
        yield pool
    finally:
        for worker in pool:
            worker.stop()


def _winner(outcome: dict[str, str]) -> str:
    allowed = [agent for agent, verdict in outcome.items() if verdict == "allow"]
    assert len(allowed) == 1, outcome  # P17: one ALLOW per boundary
    return allowed[0]


@pytest.mark.slow
def test_p12_p16_p17_deferred_verdicts_are_shared_by_every_process(workers) -> None:
    """P12, P16, P17 and §6.2.1 phase 3 across processes: whichever process runs the
    boundary, the winner acts from any other process, a later boundary supersedes an earlier
    one everywhere, and each resource gets exactly one action, by the latest winner."""
    rng = random.Random(20260323)
    by_id = {str(a.id): a for a in AGENTS}
    for round_no in range(ROUNDS):
        resource = f"spot-{round_no}"
        contenders = rng.sample(AGENTS[:5], 3)
        plans = {str(a.id): rng.choice(CONFIDENCES) for a in contenders}
        for agent in contenders:
            verdict = rng.choice(workers).call("pre", agent, resource, plans[str(agent.id)])
            assert verdict == "blocked"  # phase 1: advisory only

        boundary = rng.randrange(WORKERS)
        if round_no % 3 == 0:
            outcome = workers[boundary].call("resolve_all")
            assert resource in outcome  # P16: the round-end boundary covers it
            outcome = outcome[resource]
        else:
            outcome = workers[boundary].call("resolve", resource)
        assert set(outcome) == set(plans)
        winner = _winner(outcome)

        order = list(plans)
        if round_no % 2 == 1:  # a late, stronger claim and a second boundary elsewhere
            late = AGENTS[5]
            plans[str(late.id)] = 1.0
            assert rng.choice(workers).call("pre", late, resource, 1.0) == "blocked"
            stale, first = winner, boundary
            boundary = (first + 1 + rng.randrange(WORKERS - 1)) % WORKERS
            outcome = workers[boundary].call("resolve", resource)
            winner = _winner(outcome)
            assert winner == str(late.id)
            verdict, calls = workers[first].call("execute", by_id[stale], resource,
                                                 plans[stale])
            assert (verdict, calls) == ("blocked", 0), "a superseded grant let its agent act"
            order.remove(stale)
            order.append(str(late.id))

        rng.shuffle(order)
        ran = []
        for agent_id in order:
            elsewhere = rng.choice([w for i, w in enumerate(workers) if i != boundary])
            verdict, calls = elsewhere.call("execute", by_id[agent_id], resource,
                                            plans[agent_id])
            assert (verdict == "allow") == (calls == 1)
            if calls:
                ran.append(agent_id)
        assert ran == [winner], (round_no, outcome, ran)  # P12 and P17
        assert workers[0].call("actions", resource) == [winner]
