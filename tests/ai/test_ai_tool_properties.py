"""A property of the agent tools (issue 24): random sequences of tool calls by three seats
never write anything the same calls through the store API would refuse, and the trail
verifies after.

Hypothesis draws a list of calls, each by one of three seats (a coordinator, a reviewer, a
worker that delegates), on one topology that has every case the store's send check knows
(a custom role and a type with required fields, a delegation edge, an integrating, a
suspended and a closed workspace) and a mark space with three scopes (verbs listed, a
wildcard verb, and one scope only one agent may write in). Arguments are drawn from valid and
invalid pools alike: unknown and closed recipients, types the seat may not send, content
that is oversized, holds a NUL, has the wrong shape for its type, envelope ids never seen,
acks of envelopes another seat leased, claims on verbs the scope does not list, commands
the matrix does not allow.

For every call:
- either it returns, or it raises `ToolRefused` and no row of any table changed (one count
  of every table before and after);
- its decision agrees with the store API, asked on a twin database that has the same
  topology: a send or reply the tools made is one `EnvelopeStore.send` accepts, one they
  refused for a permission or type reason is one `send` rejects; a command they refused as
  not permitted is one `CommandLedger.authorize` rejects as `not_permitted`, and one they
  accepted is not; a mark or a claim they refused for its scope, verb or writer is one
  `space.write` of the same mark refuses, and one they wrote is one it takes.
After every example the trail of the example's own database verifies.

Each example runs on a fresh database copied from a template holding the topology (so counts
and the trail start clean); the twin is shared by the test (only its registry decides).
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st

from agentpost.marks import Agent, Intent, MarkType, Need, Observation, Scope, Warning
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.pg.server import PostgresServer
from agentpost.protocol.errors import AgentpostError
from agentpost.smcl import CommandLedger
from agentpost.store import EnvelopeStore
from agentpost.tools import AgentTools, RunInfo, ToolRefused
from dbtools import connect, create_database, drop_database, rows, unique_db_name

SCOPES = [
    Scope(name="deploys", allowed_intent_verbs=("deploy",), allowed_action_verbs=("deployed",)),
    Scope(name="ops", allowed_intent_verbs=("*",), allowed_action_verbs=("*",)),
    Scope(name="audit", allowed_intent_verbs=("review",)),
]
KINDS = (MarkType.INTENT, MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
         MarkType.NEED)
SEATS = ("boss", "rev", "lead")
# boss may write in every scope; the others not in `audit`
AGENTS = {seat: Agent(id=uuid.uuid5(uuid.NAMESPACE_URL, f"props:{seat}"), name=f"{seat}-agent",
                      scopes={s.name: KINDS for s in SCOPES
                              if s.name != "audit" or seat == "boss"})
          for seat in SEATS}
WORKSPACES = ("boss", "w1", "w2", "lead", "w3", "rev", "int", "sus", "dead")


def build_topology(store: EnvelopeStore) -> None:
    """boss (coordinator) over w1, w2, rev (a reviewer: a worker that may also send `report`,
    which needs a `score`), lead (a worker that delegates) over w3, and three workers in
    states a send must respect: int (integrating), sus (suspended), dead (closed)."""
    store.define_role("reviewer", inherits="worker")
    store.register_type("report", ["reviewer"], ["coordinator"], ["score"])
    store.create_workspace("coordinator", workspace_id="boss")
    for ws in ("w1", "w2", "int", "sus", "dead"):
        store.create_workspace("worker", parent="boss", workspace_id=ws)
    store.create_workspace("reviewer", parent="boss", workspace_id="rev")
    store.create_workspace("worker", parent="boss", workspace_id="lead", delegation=True)
    store.create_workspace("worker", parent="lead", workspace_id="w3")
    store.transition("int", "active")
    store.transition("int", "integrating")
    store.transition("sus", "suspended")
    store.transition("dead", "closed")


# --------------------------------------------------------------------------- databases


def _terminate(admin_dsn: str, name: str) -> None:
    conn = connect(admin_dsn)
    try:
        rows(conn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def topology_db(pg_server: PostgresServer, template_db: str) -> Iterator[str]:
    """The name of a migrated database holding the topology: the template of every example's
    database (no connection left open to it)."""
    name = unique_db_name("props_tmpl")
    dsn = create_database(pg_server.dsn, name, template=template_db)
    try:
        with EnvelopeStore(dsn) as store:
            build_topology(store)
        _terminate(pg_server.dsn, name)
        yield name
    finally:
        drop_database(pg_server.dsn, name)


@pytest.fixture(scope="module")
def twin(pg_server: PostgresServer, topology_db: str) -> Iterator[tuple[str, EnvelopeStore]]:
    """The twin: the same topology, asked the same questions through the store API."""
    name = unique_db_name("props_twin")
    dsn = create_database(pg_server.dsn, name, template=topology_db)
    try:
        with EnvelopeStore(dsn, ack_timeout=0.2) as store:
            yield dsn, store
    finally:
        drop_database(pg_server.dsn, name)


class Counts:
    """Row counts of every table of the database, in one statement."""

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        tables = rows(self.conn, "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename)"
                                 " FROM pg_tables WHERE schemaname NOT IN "
                                 "('pg_catalog', 'information_schema') ORDER BY 1")
        self.tables = [t for (t,) in tables]
        self.sql = " UNION ALL ".join(f"SELECT {i}, count(*) FROM {t}"
                                      for i, t in enumerate(self.tables))

    def __call__(self) -> dict[str, int]:
        return {self.tables[i]: n for i, n in rows(self.conn, self.sql)}

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- the calls


@dataclass(frozen=True)
class Known:
    """An envelope id known to the example by the time the call runs (seeded, sent or read),
    the `index`-th modulo how many there are."""

    index: int


@dataclass(frozen=True)
class Call:
    seat: str
    tool: str
    args: dict[str, Any]


NUL = "nul\x00byte"
HUGE = "x" * 40_000


def mostly(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
    """Three draws in four from `good`: most calls get past the argument models, so that
    the store's and the tools' decisions are compared often."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good),
                     st.sampled_from(bad))


CONTENT = mostly(["status?", "\u202eevil\u202c é 👩‍👩‍👧", {"score": 3},
                  {"score": 1, "note": "ok"}, {"note": "no score"}, [1, "two"], {}],
                 [HUGE, NUL, 5, None])
RECIPIENT = mostly(list(WORKSPACES), ["nobody", "bad id", "w1\n", ""])
TYPE = mostly(["directive", "feedback", "query", "report"],
              ["no-such-type", "Directive", "x" * 70])
ENVELOPE_ID = mostly([Known(i) for i in range(12)], ["no-such-envelope", "a b", "x\ty"])
SCOPE = mostly(["deploys", "ops", "audit"], ["nowhere", "bad\x07scope"])
VERB = st.sampled_from(["deploy", "review", "delete", "anything"])
UNIT = mostly([0.1, 0.5, 0.9], [7])


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def drop_none(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if v is not None}


ARGS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "send_envelope": st.fixed_dictionaries({
        "to": RECIPIENT, "type": TYPE, "content": CONTENT,
        "priority": optional(mostly(["normal", "urgent"], ["now"])),
        "in_reply_to": optional(ENVELOPE_ID)}).map(drop_none),
    "read_inbox": st.fixed_dictionaries({"limit": mostly([1, 2, 50], [0, 51])}),
    "reply": st.fixed_dictionaries({
        "envelope_id": ENVELOPE_ID, "content": CONTENT,
        "type": optional(TYPE)}).map(drop_none),
    "ack": st.fixed_dictionaries({"envelope_id": ENVELOPE_ID}),
    "read_marks": st.fixed_dictionaries({
        "scope": SCOPE, "resource": optional(st.sampled_from(["api", "web"])),
        "limit": st.sampled_from([1, 20, 0])}).map(drop_none),
    "write_mark": st.fixed_dictionaries({
        "kind": st.sampled_from(["observation", "warning", "need", "intent"]),
        "scope": SCOPE, "topic": optional(st.sampled_from(["api", "t\x07"])),
        "content": optional(CONTENT), "reason": optional(st.just("flaky")),
        "question": optional(st.just("go live?")), "confidence": optional(UNIT)}
    ).map(drop_none),
    "claim": st.fixed_dictionaries({
        "scope": SCOPE, "resource": st.sampled_from(["api", "web"]), "action": VERB,
        "confidence": UNIT}),
    "submit_command": st.fixed_dictionaries({
        "key": mostly(["k1", "k2", "k3"], ["a\nb"]),
        "action": TYPE, "executor": optional(st.sampled_from(["w1", "rev", "lead", "dead",
                                                              "ghost"])),
        "mutating": st.booleans(), "args": optional(st.sampled_from([{"v": 1}, {"x": HUGE}]))}
    ).map(drop_none),
}
#: (seat, recipient, type) the store takes (with a `score` for `report`): a branch of its own,
#: so that sends get through often enough to compare both ways
CHANNELS = [("boss", to, ty) for to in ("w1", "w2", "lead", "rev", "sus")
            for ty in ("directive", "feedback")] + [
    ("rev", "boss", "query"), ("rev", "boss", "report"), ("lead", "boss", "query"),
    ("lead", "w3", "directive"), ("lead", "w3", "feedback")]
RANDOM_CALLS = st.builds(Call, st.sampled_from(SEATS), st.sampled_from(sorted(ARGS)),
                         st.just({})).flatmap(
    lambda c: ARGS[c.tool].map(lambda a: Call(c.seat, c.tool, a)))
CHANNEL_SENDS = st.builds(
    lambda channel, content: Call(channel[0], "send_envelope",
                                  {"to": channel[1], "type": channel[2], "content": content}),
    st.sampled_from(CHANNELS), st.sampled_from(["hello", {"score": 2}, {"note": "x"}]))
CALLS = st.one_of(RANDOM_CALLS, RANDOM_CALLS, RANDOM_CALLS, CHANNEL_SENDS)


# --------------------------------------------------------------------------- the oracle


class Oracle:
    """The store API on the twin database, asked whether it would take what the tools
    decided; it records its answers (for the test's final check that both sides of every
    question were asked)."""

    def __init__(self, store: EnvelopeStore) -> None:
        self.store = store
        self.space: PostgresMarkSpace | None = None  # each example's own space
        self.asked: Counter[str] = Counter()
        self.keys = itertools.count()

    def send_accepted(self, sender: str, to: str, type_: str, content: Any) -> bool:
        fmt = "markdown" if isinstance(content, str) else "json"
        result = self.store.send(sender, to, type_, content, format=fmt)
        return result.accepted

    def command_reason(self, seat: str, action: str, executor: str) -> str | None:
        """The reason authorize rejects the command with, None when it authorizes it (a
        read-only one: the same permission decision, without the confirmation gate)."""
        with CommandLedger(self.store) as ledger:
            try:
                view = ledger.submit(seat, f"oracle-{next(self.keys)}", action=action,
                                     mutating=False, executor=executor)
            except AgentpostError as exc:  # an unknown action type: refused at submit
                return f"submit refused: {type(exc).__name__}"
            view = ledger.authorize(view.command_id)
        return None if view.state.value == "authorized" else (view.reason or "rejected")

    def mark_taken(self, seat: str, mark: Any) -> bool:
        assert self.space is not None
        try:
            self.space.write(AGENTS[seat], mark)
        except AgentpostError:
            return False
        return True


def mark_of(tool: str, args: dict[str, Any]) -> Any:
    """The mark write_mark or claim writes for these (valid) arguments, built with the mark
    space's own models; None when the tools refuse the arguments themselves."""
    scope = args["scope"]
    if tool == "claim":
        return Intent(scope=scope, resource=args["resource"], action=args["action"],
                      confidence=args.get("confidence", 0.5))
    kind = args["kind"]
    if kind == "observation" and args.get("topic") and args.get("content") is not None:
        return Observation(scope=scope, topic=args["topic"], content=args["content"],
                           confidence=args.get("confidence", 0.5))
    if kind == "warning" and args.get("topic") and args.get("reason"):
        return Warning(scope=scope, topic=args["topic"], reason=args["reason"])
    if kind == "need" and args.get("question"):
        return Need(scope=scope, question=args["question"])
    return None


#: how a refusal for a reason the store or the space decides begins
SEND_DENIED = "permission denied"
MARK_DENIED = ("UnknownScope", "UnauthorizedWrite", "InvalidMark", "unknown scope",
               "scope ")


def check_agreement(oracle: Oracle, store: EnvelopeStore, call: Call, args: dict[str, Any],
                    result: dict[str, Any] | None, reason: str | None) -> None:
    """The tools' decision on `call` against the store API's on the twin."""
    tool, seat = call.tool, call.seat
    if reason is not None and reason.startswith("invalid arguments"):
        return  # the argument models' own refusal: nothing the store was asked
    if tool == "send_envelope" and (result is not None or reason.startswith(SEND_DENIED)):
        accepted = oracle.send_accepted(seat, args["to"], args["type"], args["content"])
        oracle.asked[f"send {'accepted' if result else 'refused'}"] += 1
        assert accepted == (result is not None), (
            f"the tools {'sent' if result else 'refused'} {call}, the store "
            f"{'accepts' if accepted else 'rejects'} it ({reason})")
    elif tool == "reply" and (result is not None or reason.startswith(SEND_DENIED)):
        original = store.get(args["envelope_id"])
        type_ = result["type"] if result is not None else args["type"]
        accepted = oracle.send_accepted(seat, original.sender, type_, args["content"])
        oracle.asked[f"reply {'accepted' if result else 'refused'}"] += 1
        assert accepted == (result is not None), (
            f"the tools {'sent' if result else 'refused'} {call}, the store "
            f"{'accepts' if accepted else 'rejects'} it ({reason})")
    elif tool == "submit_command" and (result is not None or reason.startswith("not permitted")):
        why = oracle.command_reason(seat, args["action"], args.get("executor", seat))
        oracle.asked[f"command {'accepted' if result else 'refused'}"] += 1
        if result is None:
            # the store refuses it too (not_permitted, or a state it checks first)
            assert why is not None, f"the tools refused {call}; authorize allows it"
        else:
            assert why != "not_permitted", f"the tools accepted {call}; authorize: {why}"
    elif tool in ("write_mark", "claim"):
        if result is not None and tool == "claim" and result["verdict"] != "ALLOW":
            return  # the guard's own answer: CONFLICT, BLOCKED and DENIED are results
        if result is None and not reason.startswith(MARK_DENIED):
            return
        mark = mark_of(tool, args)
        if mark is None:
            return
        taken = oracle.mark_taken(seat, mark)
        oracle.asked[f"{tool} {'accepted' if result else 'refused'}"] += 1
        assert taken == (result is not None), (
            f"the tools {'took' if result else 'refused'} {call}, the space "
            f"{'takes' if taken else 'refuses'} it ({reason})")


# --------------------------------------------------------------------------- the property


def resolve(value: Any, known: list[str]) -> Any:
    if isinstance(value, Known):
        return known[value.index % len(known)] if known else "no-envelope-yet"
    return value


def test_tool_calls_write_only_what_the_store_accepts_and_the_trail_verifies(
        pg_server: PostgresServer, topology_db: str,
        twin: tuple[str, EnvelopeStore]) -> None:
    twin_dsn, twin_store = twin
    spaces = itertools.count()
    outcomes: Counter[str] = Counter()
    oracle = Oracle(twin_store)

    # no shrink phase: shrinking through databases takes minutes; the failing example's
    # calls are printed (note) as they ran
    @settings(max_examples=30, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(calls=st.lists(CALLS, min_size=1, max_size=12))
    # one sure example of each question the assertions below require the run to reach
    # (random draws reach them almost always, not always: a run once drew no refused send)
    @example(calls=[
        Call("rev", "send_envelope", {"to": "boss", "type": "directive", "content": "obey"}),
        Call("boss", "send_envelope", {"to": "w1", "type": "directive", "content": "hello"}),
        Call("rev", "submit_command", {"key": "k1", "action": "directive", "executor": "boss",
                                       "mutating": False}),
        Call("rev", "claim", {"scope": "deploys", "resource": "api", "action": "delete",
                              "confidence": 0.5})])
    def run(calls: list[Call]) -> None:
        name = unique_db_name("props")
        dsn = create_database(pg_server.dsn, name, template=topology_db)
        counts = Counts(dsn)
        try:
            with (EnvelopeStore(dsn, ack_timeout=0.2) as store,
                  PostgresMarkSpace(dsn=dsn, scopes=SCOPES, space="props") as space,
                  PostgresMarkSpace(dsn=twin_dsn, scopes=SCOPES,
                                    space=f"oracle-{next(spaces)}") as oracle.space):
                seats = {seat: AgentTools(store, workspace_id=seat, marks=space,
                                          agent=AGENTS[seat],
                                          run=RunInfo(by="python", ref=f"props:{seat}"))
                         for seat in SEATS}
                known = [store.send(s, t, ty, c).envelope_id for s, t, ty, c in (
                    ("boss", "lead", "directive", "plan the rollout"),
                    ("boss", "rev", "directive", "review it"),
                    ("w1", "boss", "query", "ready?"),
                    ("w3", "lead", "query", "which region?"))]
                for call in calls:
                    args = {k: resolve(v, known) for k, v in call.args.items()}
                    before = counts()
                    result = reason = None
                    try:
                        result = seats[call.seat].call(call.tool, args)
                    except ToolRefused as refused:
                        reason = refused.reason
                    note(f"{call.seat} {call.tool}({args!r:.200}) -> "
                         f"{reason if reason is not None else result!r:.200}")
                    if reason is not None:
                        after = counts()
                        changed = {t: (before[t], after[t]) for t in before
                                   if before[t] != after[t]}
                        assert not changed, (f"{call.seat} {call.tool} was refused "
                                             f"({reason}) but wrote {changed}")
                    outcomes[f"{call.tool} {'refused' if reason else 'done'}"] += 1
                    check_agreement(oracle, store, Call(call.seat, call.tool, args),
                                    args, result, reason)
                    if result is not None:
                        known.extend(e["envelope_id"] for e in result.get("envelopes", ()))
                        if "envelope_id" in result and call.tool != "ack":
                            known.append(result["envelope_id"])
                for seat in seats.values():
                    seat.release()
                verified = store.verify_trail()
                assert verified.ok, (verified.failure_chain, verified.failure)
        finally:
            counts.close()
            drop_database(pg_server.dsn, name)

    run()

    print(f"outcomes: {dict(outcomes)}; oracle: {dict(oracle.asked)}")
    # the draws reached both sides of the questions that matter
    for question in ("send accepted", "send refused", "command refused", "claim refused"):
        assert oracle.asked[question] > 0, (question, dict(oracle.asked))
    assert twin_store.verify_trail().ok


def test_the_store_rejects_a_delegating_sender_s_directive_to_a_root(
        store: EnvelopeStore) -> None:
    """A delegating worker may direct its own children, not its coordinator: the matrix has
    no worker -> coordinator row for `directive`, and the coordinator is no child of it. The
    property above found the store accepting it (a NULL parent made the delegation clause
    NULL, not false: sql/0078); a root querying a delegating workspace is the other edge."""
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("worker", parent="boss", workspace_id="lead", delegation=True)
    store.create_workspace("worker", parent="lead", workspace_id="w3")
    assert store.send("lead", "boss", "directive", "obey").reason == "permission_denied"
    # the same edge the other way: a root may not query a delegating workspace as its child
    store.create_workspace("coordinator", workspace_id="other", delegation=True)
    assert store.send("boss", "other", "query", "why?").reason == "permission_denied"
    # the delegation edges themselves still hold
    assert store.send("lead", "w3", "directive", "do it").reason is None
    assert store.send("w3", "lead", "query", "how?").reason is None
