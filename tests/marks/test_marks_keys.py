"""Caller-chosen keys of the mark space (agentpost.marks.keys, sql/0043_mark_keys.sql): at most
one mark write, and at most one guarded call, per key, on both backends. This is what makes
a retried Airflow task (same key, next try) a replay instead of a second effect.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agentpost.marks.core import Agent, InvalidArgument, MarkType, Observation, Scope
from agentpost.marks.guard import Guard, RateLimited, Verdict
from agentpost.marks.keys import KeyInUse, UnsettledCall
from agentpost.marks.postgres import PostgresMarkSpace

CALENDAR = Scope(name="calendar", allowed_intent_verbs=("book",),
                 allowed_action_verbs=("booked",))
ALICE = Agent(name="alice", scopes={"calendar": ["intent", "action", "observation"]})


class Tool:
    """A tool that counts its calls, and raises `error` (once, if `once`) when given."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.calls = 0
        self.error = error

    def __call__(self) -> dict[str, int]:
        self.calls += 1
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return {"room": 101, "call": self.calls}


def book(guard: Guard, tool: Tool, key: str = "k1", resource: str = "room-101"):
    return guard.execute_once(key, ALICE, "calendar", resource, "book", "booked", tool)


def marks_of(space, mark_type: MarkType) -> list:
    return space.read("calendar", resource="room-101", mark_type=mark_type)


def test_a_recorded_call_is_replayed_not_repeated(make_space) -> None:
    """At most once per key: the second call under a key whose action is recorded returns
    that action's result with an ALLOW, calls nothing and writes no mark."""
    space = make_space([CALENDAR])
    guard, tool = Guard(space), Tool()
    decision, result, replayed = book(guard, tool)
    assert (decision.verdict, result, replayed) == (Verdict.ALLOW, {"room": 101, "call": 1},
                                                    False)
    before = len(space)
    again, replay, replayed = book(guard, tool)
    assert (again.verdict, replay, replayed) == (Verdict.ALLOW, {"room": 101, "call": 1}, True)
    assert again.intent_id == decision.intent_id
    assert tool.calls == 1 and len(space) == before
    record = space.key_record("k1")
    assert (record.kind, record.failed, record.calls) == ("execute", False, 1)
    assert record.mark_id == marks_of(space, MarkType.ACTION)[0].id


def test_a_call_that_died_in_the_tool_is_not_run_again(make_space) -> None:
    """A call that started its tool and recorded no outcome (SystemExit escaping the tool)
    may have acted: the next call under the key raises UnsettledCall and calls nothing,
    until a person releases the key; then it runs."""
    space = make_space([CALENDAR])
    guard = Guard(space)
    with pytest.raises(SystemExit):
        book(guard, Tool(SystemExit(1)))
    tool = Tool()
    with pytest.raises(UnsettledCall, match=r"key 'k1': .* recorded no outcome; it may or "
                                            r"may not have run"):
        book(guard, tool)
    assert tool.calls == 0 and not marks_of(space, MarkType.ACTION)
    assert space.key_record("k1").settled is False
    assert space.release_key("k1") is True and space.release_key("k1") is False
    assert book(guard, tool)[1:] == ({"room": 101, "call": 1}, False)


def test_a_call_whose_tool_raised_runs_again(make_space) -> None:
    """A tool that raised is known to have ended (a failed action): the next call under the
    key calls it again (the record counts the calls), and later ones replay that success."""
    space = make_space([CALENDAR])
    guard, tool = Guard(space), Tool(RuntimeError("backend timed out"))
    with pytest.raises(RuntimeError, match="timed out"):
        book(guard, tool)
    assert space.key_record("k1").failed is True
    assert book(guard, tool)[1:] == ({"room": 101, "call": 2}, False)
    assert book(guard, tool)[1:] == ({"room": 101, "call": 2}, True)
    assert tool.calls == 2 and space.key_record("k1").calls == 2


def test_a_key_names_one_thing_and_bad_keys_change_nothing(make_space) -> None:
    """A key reused for another resource, and a malformed key, are refused with a clear
    error before anything is written or called."""
    space = make_space([CALENDAR])
    guard, tool = Guard(space), Tool()
    book(guard, tool)
    before = len(space)
    with pytest.raises(KeyInUse, match=r"names a call .* on 'room-101', not a call .* "
                                       r"on 'room-102'"):
        book(guard, tool, resource="room-102")
    for bad in ("", "  ", "x" * 201, "nul\x00", 7):
        with pytest.raises(InvalidArgument):
            book(guard, tool, key=bad)
    assert tool.calls == 1 and len(space) == before


def test_write_once_writes_one_mark_per_key(make_space) -> None:
    """At most one mark per key, also through the guard's write_mark; a write the guard
    refuses records no key, so a later write under it is a first write."""
    space = make_space([CALENDAR.model_copy(update={"rate_limit": None})])
    guard = Guard(space)
    seen = Observation(scope="calendar", topic="weather", content={"sky": "clear"})
    first, written = space.write_once(ALICE, seen, "w1", guard.write_mark)
    again, rewritten = space.write_once(ALICE, seen, "w1", guard.write_mark)
    assert (again, written, rewritten) == (first, True, False)
    assert len(space) == 1 and space.key_record("w1").mark_id == first
    with pytest.raises(KeyInUse, match="names a write of agent"):
        space.write_once(Agent(name="bob", scopes={"calendar": ["observation"]}), seen, "w1")

    def refuse(agent, mark):
        raise RateLimited("too many writes")

    with pytest.raises(RateLimited):
        space.write_once(ALICE, seen, "w2", refuse)
    assert space.key_record("w2") is None and len(space) == 1


CRASH = """
import os, sys
from agentpost.marks.core import Agent, Scope
from agentpost.marks.guard import Guard
from agentpost.marks.postgres import PostgresMarkSpace

scope = Scope(name="calendar", allowed_intent_verbs=("book",), allowed_action_verbs=("booked",))
alice = Agent(id="{agent_id}", name="alice", scopes={{"calendar": ["intent", "action"]}})
space = PostgresMarkSpace(dsn=sys.argv[1], scopes=[scope], space="crash")

def tool():
    print("tool ran", flush=True)
    os._exit(9)  # the worker dies mid-call: no exception handler, no rollback by the client

Guard(space).execute_once("af/t/run", alice, "calendar", "room-101", "book", "booked", tool)
"""


def test_a_killed_process_leaves_an_unsettled_call(dsn: str) -> None:
    """A process that dies inside the tool (os._exit, the way a killed worker dies): the
    server rolls its intent back, yet the key's record was committed before the tool ran,
    so another process under the key refuses to call the tool again."""
    script = textwrap.dedent(CRASH.format(agent_id=ALICE.id))
    proc = subprocess.run([sys.executable, "-c", script, dsn], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 9 and "tool ran" in proc.stdout, proc.stderr
    with PostgresMarkSpace(dsn=dsn, scopes=[CALENDAR], space="crash") as space:
        assert not space.read("calendar", resource="room-101")  # rolled back with the crash
        tool = Tool()
        with pytest.raises(UnsettledCall, match="af/t/run"):
            Guard(space).execute_once("af/t/run", ALICE, "calendar", "room-101", "book",
                                      "booked", tool)
        assert tool.calls == 0


def test_a_person_releases_an_unsettled_key_from_the_cli(dsn: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`agentpost mark-key show|release`: after the killed call above, a person reads the
    key's record (no outcome), releases it, and the next call under the key runs; a settled
    key cannot be released and an unknown one is a clear usage error (exit 2)."""
    from agentpost.cli import main

    script = textwrap.dedent(CRASH.format(agent_id=ALICE.id))
    subprocess.run([sys.executable, "-c", script, dsn], capture_output=True, timeout=60,
                   check=False)
    assert main(["--dsn", dsn, "mark-key", "show", "af/t/run", "--space", "crash"]) == 0
    shown = capsys.readouterr().out
    assert '"mark_id": null' in shown and '"kind": "execute"' in shown, shown
    assert main(["--dsn", dsn, "mark-key", "release", "af/t/run", "--space", "crash"]) == 0
    assert '"released": true' in capsys.readouterr().out
    with PostgresMarkSpace(dsn=dsn, scopes=[CALENDAR], space="crash") as space:
        tool = Tool()
        decision, _, replayed = Guard(space).execute_once("af/t/run", ALICE, "calendar",
                                                          "room-101", "book", "booked", tool)
        assert decision.verdict is Verdict.ALLOW and tool.calls == 1 and not replayed
    assert main(["--dsn", dsn, "mark-key", "release", "af/t/run", "--space", "crash"]) == 2
    assert "is settled" in capsys.readouterr().err
    assert main(["--dsn", dsn, "mark-key", "show", "nope", "--space", "crash"]) == 2
    assert "no key 'nope'" in capsys.readouterr().err
