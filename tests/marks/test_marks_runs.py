"""PostgresMarkSpace.recording_run: the run that wrote a mark (the agent tools' seat, tool
call and run) is recorded in agentpost.mark_runs by the statement that writes the mark, for
the marks of the one agent named, in the one thread, inside the block, and only if the mark
itself is kept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from agentpost.marks import Action, Agent, Observation, Scope
from agentpost.marks.guard import Guard
from agentpost.marks.postgres import PostgresMarkSpace

SCOPE = Scope(name="desk", allowed_intent_verbs=("deploy",), allowed_action_verbs=("deployed",))
RUN = {"by": "test", "ref": "run-1", "attrs": {}}


@pytest.fixture
def space(dsn: str) -> Iterator[PostgresMarkSpace]:
    space = PostgresMarkSpace(dsn=dsn, scopes=[SCOPE], space="runs")
    yield space
    space.close()


def _runs(dsn: str) -> dict[str, tuple[str, str, str | None, Any]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT mark_id::text, workspace, tool, call_id, run"
                        " FROM agentpost.mark_runs WHERE space = 'runs'")
            return {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    finally:
        conn.close()


def _seen(topic: str) -> Observation:
    return Observation(scope=SCOPE.name, topic=topic, content={"ok": True}, confidence=0.5)


def test_only_the_named_agent_s_marks_in_the_block_and_thread_get_the_run(
        space: PostgresMarkSpace, dsn: str) -> None:
    seat = Agent(name="seat", scopes={"desk": ["observation"]})
    other = Agent(name="other", scopes={"desk": ["observation"]})
    before = space.write(seat, _seen("before"))
    elsewhere: list[Any] = []
    with space.recording_run(seat.id, workspace="w1", tool="write_mark", call_id="c1",
                             run=RUN):
        mine = space.write(seat, _seen("mine"))
        theirs = space.write(other, _seen("theirs"))
        worker = threading.Thread(
            target=lambda: elsewhere.append(space.write(seat, _seen("thread"))))
        worker.start()
        worker.join()
    after = space.write(seat, _seen("after"))
    runs = _runs(dsn)
    assert runs == {str(mine): ("w1", "write_mark", "c1", RUN)}
    assert {str(before), str(theirs), str(elsewhere[0]), str(after)}.isdisjoint(runs)


def test_a_claim_records_its_intent_and_a_refused_claim_records_nothing(
        space: PostgresMarkSpace, dsn: str) -> None:
    guard = Guard(space)
    first = Agent(name="first", scopes={"desk": ["intent", "action"]})
    second = Agent(name="second", scopes={"desk": ["intent", "action"]})
    assert guard.pre_action(first, "desk", "api", "deploy", 0.9).intent_id is not None
    space.write(first, Action(scope=SCOPE.name, resource="api", action="deployed",
                              result={"ok": True}))  # done: a later intent is refused
    with space.recording_run(second.id, workspace="w2", tool="claim", call_id=None, run=RUN):
        refused = guard.pre_action(second, "desk", "api", "deploy", 0.9)
    assert refused.intent_id is None
    assert _runs(dsn) == {}
    with space.recording_run(first.id, workspace="w1", tool="claim", call_id="c2", run=RUN):
        granted = guard.pre_action(first, "desk", "db", "deploy", 0.9)
    assert _runs(dsn) == {str(granted.intent_id): ("w1", "claim", "c2", RUN)}


def test_a_mark_rolled_back_leaves_no_run(space: PostgresMarkSpace, dsn: str) -> None:
    seat = Agent(name="seat", scopes={"desk": ["observation"]})
    with pytest.raises(RuntimeError), space.lock(SCOPE.name, "api"), \
            space.recording_run(seat.id, workspace="w1", tool="write_mark", call_id="c3",
                                run=RUN):
        space.write(seat, _seen("undone"))
        raise RuntimeError("the block fails after the write")
    assert _runs(dsn) == {}
    assert space.read(SCOPE.name) == []

