"""agentpost.marks side by side with the PyPI package ``markspace==0.2.0b0`` (issue 15: a drop-in).

Hypothesis draws one sequence of operations — writes of every mark type (direct and through
``Guard.write_mark``; supersession; warnings that invalidate), reads by scope / resource / topic /
mark_type / min_strength, ``pre_action``, ``post_action``, ``execute`` (tool succeeds or raises),
``resolve_deferred`` (with and without the agents mapping), clock advances, ``resolve`` of needs,
``aggregate_needs``, ``get_intents`` and ``check_conflict`` — and applies it to the package's
``MarkSpace`` + ``Guard`` and to ours, in memory and on Postgres (a fresh space name per example).

Mark ids differ between implementations; they are mapped by write order (every side's write
hooks list the marks each operation stored, plus the copy ``resolve`` returns). After every
operation both sides must have stored the same marks (fields compared with ids mapped), every
read returns the same marks with the same effective strengths (to 1e-9), every guard decision
has the same verdict (and the same intent, winner and conflicting intents, mapped), and every
error is of the package's exception type (ours subclass the class of the same name that
``agentpost.marks`` exports; builtins such as ValueError are the builtin).

Where we knowingly differ, only that is excluded, and said so where it is excluded:
- durability and many processes (Postgres) are ours alone: nothing here can compare them;
- the clock only moves forward: ours stamps ``created_at`` monotonically (a write never gets an
  earlier time than the write before it, so "first writer" stays the write order even when a
  wall clock steps back); the package stamps the clock's value as is;
- the wording of ``reason`` strings and of the question/context of the need the guard writes
  for a YIELD_ALL conflict is each implementation's own (verdicts and mark structure are not);
- ties in strength: the package returns equally strong marks in set order (random between two
  runs of the package itself), so reads are compared in (strength, write order) order and each
  side is only checked to be sorted by strength;
- a second between writes (see `_run`): with equal created_at the package breaks FIRST_WRITER
  and HIGHEST_CONFIDENCE ties by comparing random uuid4 strings, which no other run repeats.
- the guard's checks read the one scope (Markspace §6: a conflict is between intents on "the
  same resource in the same scope"; §9.2 steps 2 and 4 read `(scope, resource)`): an intent
  or action in a child scope ("desk/east") does not contend for the parent's resource. The
  package's guard reads the tree (its `get_intents` and action read include child scopes),
  so a guard call on a resource that a child scope also marks is left out (`_child_marks`;
  `test_the_guard_checks_one_scope_as_the_spec_says` shows the difference).

Differences this test found that are not settled yet are listed in ``OPEN``: each has a strict
xfail test reproducing it with its shortest sequence, and the random test leaves out only the
cases that run into it (``_open_case``, the ``tolerated`` checks, the generator's comments). When
one is fixed its xfail passes, so fails (strict): then delete its entry, repro and exclusion.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import markspace as pkg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentpost.marks as ours
from marks_backends import ALIVE, BACKENDS, T0, close_space, make_space

TOLERANCE = 1e-9

# --------------------------------------------------------------------------- the world

RESOURCES = ("r1", "r2", "r3")
TOPICS = ("price", "load", "other")  # "other" is not an observation topic of "desk"
# Differences from the package found by this test and still open (reported to the owners of
# guard.py and space.py; issue 15). Each has a strict xfail test below that reproduces it
# (it starts passing, and so failing as XPASS, once fixed: then delete the entry, its test and
# the narrow exclusion that names it). The random test leaves out exactly these cases.
OPEN = {
    "own_intent": "pre_action/execute by an agent that already holds an active intent on the "
                  "resource supersedes that intent; the package writes a new plain intent and "
                  "resolves among all (a FIRST_WRITER agent then yields to its own older "
                  "intent); post_action(intent_id=None) supersedes the agent's intent, the "
                  "package's action supersedes nothing",
    "notify": "post_action over another agent's action also writes a Warning to that agent "
              "(§6.3's SHOULD); the package writes only the superseding action",
    "deferred": "pre_action on a deferred scope lists the other intents as "
                "conflicting_intents; the package's BLOCKED decision lists none",
    "resolved_at": "resolve stamps the resolved copy with created_at = now; the package's copy "
                   "keeps the need's created_at",
    "resolve_resolved": "resolve of the copy an earlier resolve returned raises InvalidMark "
                        "(already resolved); the package resolves it again (the copy is not "
                        "superseded) and checks the agent first (ScopeError)",
    "boundary_claimed": "resolve_deferred on a resource another agent's action already holds "
                        "gives every intent BLOCKED (check CLAIMED: an action takes "
                        "precedence, P39); the package's boundary ignores actions and gives "
                        "the best intent ALLOW",
    "invalidated_claim": "pre_action/execute on a resource another agent's action holds, "
                         "that action invalidated by a warning: CONFLICT (check CLAIMED: P39, "
                         "an action that exists takes precedence; a warning contests a fact, "
                         "it does not undo it, §9.5); the package no longer sees the action "
                         "and gives ALLOW",
    "deferred_loser": "resolve_deferred gives a losing agent BLOCKED (check DEFERRED); the "
                      "package gives it CONFLICT (and the decisions' conflicting_intents differ "
                      "when an agent holds several intents)",
}

SCOPE_NAMES = ("desk", "desk/east", "bid", "pool", "crowd", "nowhere")
MIN_STRENGTHS = (0.0, 0.01, 0.2, 0.6, 1.0)  # 0.0: marks at strength 0 too, not superseded
ADVANCES = (1.0, 7.0, 35.0, 65.0, 250.0)


def _scopes(ns: Any) -> list[Any]:
    """Four scopes, one per conflict policy (and a deferred one), with decays short enough
    that a few clock advances expire intents and fade observations and warnings."""
    decay = ns.DecayConfig
    return [
        ns.Scope(name="desk", allowed_intent_verbs=("book", "hold"),
                 allowed_action_verbs=("booked",), observation_topics=("price", "load"),
                 decay=decay(observation_half_life=100.0, warning_half_life=40.0,
                             intent_ttl=60.0),
                 conflict_policy=ns.ConflictPolicy.FIRST_WRITER),
        ns.Scope(name="bid", decay=decay(observation_half_life=50.0, warning_half_life=20.0,
                                          intent_ttl=30.0),
                 conflict_policy=ns.ConflictPolicy.HIGHEST_CONFIDENCE),
        ns.Scope(name="pool", decay=decay(observation_half_life=200.0, warning_half_life=80.0,
                                           intent_ttl=120.0),
                 conflict_policy=ns.ConflictPolicy.HIGHEST_CONFIDENCE, deferred=True),
        ns.Scope(name="crowd", conflict_policy=ns.ConflictPolicy.YIELD_ALL),
    ]


ALL = ["intent", "action", "observation", "warning", "need"]
AGENT_IDS = {name: uuid.UUID(int=i + 1) for i, name in enumerate(("ann", "bob", "cat", "dan"))}


def _agents(ns: Any) -> dict[str, Any]:
    """ann may do everything; bob may not write needs in "crowd" (the guard then writes no
    need for a YIELD_ALL conflict); cat is an external agent that may not write actions in
    "pool" (pre_action says DENIED); dan only has "desk/east" (a child scope)."""
    return {
        "ann": ns.Agent(name="ann", id=AGENT_IDS["ann"],
                        scopes={s: ALL for s in ("desk", "bid", "pool", "crowd")}),
        "bob": ns.Agent(name="bob", id=AGENT_IDS["bob"],
                        scopes={"desk": ALL, "bid": ALL, "pool": ALL,
                                "crowd": ["intent", "action"]}),
        "cat": ns.Agent(name="cat", id=AGENT_IDS["cat"],
                        max_source=ns.Source.EXTERNAL_VERIFIED,
                        scopes={"desk": ["observation", "warning", "need"], "pool": ["intent"],
                                "crowd": ALL, "bid": ALL}),
        "dan": ns.Agent(name="dan", id=AGENT_IDS["dan"], scopes={"desk/east": ALL}),
    }


# --------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class Write:
    agent: str
    scope: str
    kind: str
    key: str  # resource or topic
    number: float  # confidence / priority
    flag: bool  # failed (action), blocking (need)
    source: str
    severity: str
    supersedes: int | None  # an index into the marks written so far (mod their count)
    invalidates: int | None
    guarded: bool  # through Guard.write_mark


@dataclass(frozen=True)
class Read:
    scope: str
    resource: str | None
    topic: str | None
    mark_type: str | None
    min_strength: float


@dataclass(frozen=True)
class PreAction:
    agent: str
    scope: str
    resource: str
    verb: str
    confidence: float


@dataclass(frozen=True)
class PostAction:
    agent: str
    scope: str
    resource: str
    intent: int | None  # an index into the intent ids decisions returned so far


@dataclass(frozen=True)
class Execute:
    agent: str
    scope: str
    resource: str
    confidence: float
    fails: bool


@dataclass(frozen=True)
class ResolveDeferred:
    scope: str
    resource: str
    with_agents: bool


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Resolve:
    need: int
    action: int
    agent: str | None
    typed: bool  # pick the need among needs and the action among actions (else any mark)


@dataclass(frozen=True)
class AggregateNeeds:
    pass


@dataclass(frozen=True)
class Intents:
    scope: str
    resource: str


# mostly the agents and scopes that may act, sometimes the ones that may not
agents_st = st.sampled_from(("ann", "ann", "bob", "bob", "cat", "dan"))
# "desk/east" is a child of "desk": reads of "desk" include its marks (hierarchical read)
scopes_st = st.sampled_from(("desk", "desk", "desk/east", "bid", "pool", "pool", "crowd",
                             "nowhere"))
guarded_scopes_st = st.sampled_from(("desk", "bid", "bid", "pool", "pool", "crowd"))
resources_st = st.sampled_from(RESOURCES[:2])
unit_st = st.sampled_from((0.2, 0.5, 0.7, 0.9, 1.0))
ref_st = st.none() | st.integers(0, 40)
kinds = ("intent", "action", "observation", "warning", "need")

write_st = st.builds(
    Write, agent=agents_st, scope=scopes_st, kind=st.sampled_from(kinds),
    key=st.sampled_from(RESOURCES + TOPICS), number=unit_st, flag=st.booleans(),
    source=st.sampled_from(("fleet", "external_verified", "external_unverified")),
    severity=st.sampled_from(("info", "caution", "critical")),
    supersedes=st.none() | st.none() | st.integers(0, 40),
    invalidates=ref_st, guarded=st.booleans())
read_st = st.one_of(
    st.builds(Read, scope=scopes_st, resource=resources_st, topic=st.none(),
              mark_type=st.none() | st.sampled_from(kinds[:2]),
              min_strength=st.sampled_from(MIN_STRENGTHS)),
    st.builds(Read, scope=scopes_st, resource=st.none(), topic=st.sampled_from(TOPICS),
              mark_type=st.none() | st.sampled_from(kinds[2:4]),
              min_strength=st.sampled_from(MIN_STRENGTHS)),
    st.builds(Read, scope=scopes_st, resource=st.none() | resources_st,
              topic=st.none() | st.sampled_from(TOPICS),
              mark_type=st.none() | st.sampled_from(kinds),
              min_strength=st.sampled_from(MIN_STRENGTHS)))
need_write_st = st.builds(
    Write, agent=st.sampled_from(("ann", "bob")), scope=st.sampled_from(("desk", "bid")),
    kind=st.just("need"), key=st.sampled_from(TOPICS), number=unit_st, flag=st.booleans(),
    source=st.just("fleet"), severity=st.just("info"), supersedes=st.none(),
    invalidates=st.none(), guarded=st.booleans())
operation_st = st.one_of(
    write_st, write_st, need_write_st, read_st, read_st,
    st.builds(PreAction, agent=agents_st, scope=guarded_scopes_st, resource=resources_st,
              verb=st.sampled_from(("book", "book", "hold", "grab")), confidence=unit_st),
    st.builds(PostAction, agent=agents_st, scope=guarded_scopes_st, resource=resources_st,
              intent=ref_st),
    st.builds(Execute, agent=agents_st, scope=guarded_scopes_st, resource=resources_st,
              confidence=unit_st, fails=st.booleans()),
    st.builds(ResolveDeferred, scope=st.sampled_from(("pool", "pool", "bid")),
              resource=resources_st, with_agents=st.booleans()),
    st.builds(Advance, seconds=st.sampled_from(ADVANCES)),
    st.builds(Resolve, need=st.integers(0, 40), action=st.integers(0, 40),
              agent=st.none() | agents_st, typed=st.booleans()),
    st.just(AggregateNeeds()),
    st.builds(Intents, scope=guarded_scopes_st, resource=resources_st),
)


# --------------------------------------------------------------------------- one side


class ToolFailed(RuntimeError):
    """What a failing tool of ``execute`` raises (both sides must let it through)."""


@dataclass
class Side:
    """One implementation: its namespace, space, guard, and the marks it stored in order."""

    ns: Any
    space: Any
    guard: Any
    agents: dict[str, Any]
    log: list[Any] = field(default_factory=list)  # marks stored, in write order
    intent_ids: list[uuid.UUID] = field(default_factory=list)  # from decisions, in order

    @classmethod
    def build(cls, ns: Any, space: Any) -> Side:
        side = cls(ns=ns, space=space, guard=ns.Guard(space), agents=_agents(ns))
        space.add_write_hook(lambda _agent_id, mark: side.log.append(mark))
        return side

    def mark(self, kind: str, **fields: Any) -> Any:
        cls = {"intent": self.ns.Intent, "action": self.ns.Action,
               "observation": self.ns.Observation, "warning": self.ns.Warning,
               "need": self.ns.Need}[kind]
        return cls(**fields)


def _ref(ids: list[uuid.UUID], index: int | None) -> uuid.UUID | None:
    return None if index is None or not ids else ids[index % len(ids)]


def _write(side: Side, op: Write) -> Any:
    ns = side.ns
    agent = side.agents[op.agent]
    ids = [m.id for m in side.log]
    common: dict[str, Any] = {"scope": op.scope, "supersedes": _ref(ids, op.supersedes)}
    if op.kind == "intent":
        mark = side.mark("intent", resource=op.key, action="book", confidence=op.number,
                         **common)
    elif op.kind == "action":
        mark = side.mark("action", resource=op.key, action="booked", result={"n": op.number},
                         failed=op.flag, **common)
    elif op.kind == "observation":
        mark = side.mark("observation", topic=op.key, content={"v": op.number},
                         confidence=op.number, source=ns.Source(op.source), **common)
    elif op.kind == "warning":
        mark = side.mark("warning", topic=op.key, reason="stale",
                         invalidates=_ref(ids, op.invalidates),
                         severity=ns.Severity(op.severity), **common)
    else:
        mark = side.mark("need", question=f"which {op.key}?", context={"k": op.key},
                         priority=op.number, blocking=op.flag, **common)
    if op.guarded:
        return side.guard.write_mark(agent, mark)
    return side.space.write(agent, mark)


def _ids(side: Side, kind: str, typed: bool) -> list[uuid.UUID]:
    return [m.id for m in side.log if not typed or type(m).__name__ == kind]


def _tool(fails: bool) -> Callable[[], dict[str, str]]:
    def tool() -> dict[str, str]:
        if fails:
            raise ToolFailed("the tool broke")
        return {"booked": "yes"}

    return tool


def _apply(side: Side, op: Any) -> Any:
    """Run one operation on one side; returns what the call returned."""
    space, guard, agents = side.space, side.guard, side.agents
    if isinstance(op, Write):
        return _write(side, op)
    if isinstance(op, Read):
        return space.read(op.scope, resource=op.resource, topic=op.topic,
                          mark_type=None if op.mark_type is None
                          else side.ns.MarkType(op.mark_type),
                          min_strength=op.min_strength)
    if isinstance(op, PreAction):
        return guard.pre_action(agents[op.agent], op.scope, op.resource, op.verb,
                                op.confidence)
    if isinstance(op, PostAction):
        return guard.post_action(agents[op.agent], op.scope, op.resource, "booked",
                                 {"done": True}, _ref(side.intent_ids, op.intent))
    if isinstance(op, Execute):
        return guard.execute(agents[op.agent], op.scope, op.resource, "book", "booked",
                             _tool(op.fails), confidence=op.confidence)
    if isinstance(op, ResolveDeferred):
        mapping = {a.id: a for a in agents.values()} if op.with_agents else None
        return guard.resolve_deferred(op.scope, op.resource, mapping)
    if isinstance(op, Advance):
        return space.set_clock(space.now() + op.seconds)
    if isinstance(op, Resolve):
        agent = None if op.agent is None else agents[op.agent]
        return space.resolve(_ref(_ids(side, "Need", op.typed), op.need),
                             _ref(_ids(side, "Action", op.typed), op.action), agent)
    if isinstance(op, AggregateNeeds):
        return space.aggregate_needs()
    if isinstance(op, Intents):
        return (space.get_intents(op.scope, op.resource),
                space.check_conflict(op.scope, op.resource))
    raise AssertionError(op)


# --------------------------------------------------------------------------- comparing


class Mapping:
    """Package mark id -> our mark id, by write order; `tolerated`: the OPEN differences
    left out."""

    def __init__(self, tolerated: frozenset[str] = frozenset(OPEN)) -> None:
        self.ids: dict[uuid.UUID, uuid.UUID] = {}
        self.tolerated = tolerated

    def __call__(self, value: uuid.UUID | None) -> uuid.UUID | None:
        if value is None or value in AGENT_IDS.values():
            return value
        return self.ids.get(value, value)


#: fields of a mark the guard writes on its own whose wording is each implementation's own
GUARD_WORDING = frozenset({"question", "context"})


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return value


def _fields(theirs: Any, mine: Any, mapping: Mapping,
            skip: frozenset[str] = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
    """The package mark's fields and ours of the same names, ids mapped to ours."""
    expected, got = {}, {}
    for name in type(theirs).model_fields:
        if name in skip:
            continue
        value = _plain(getattr(theirs, name))
        if name in ("id", "supersedes", "invalidates", "resolved_by"):
            value = mapping(value)
        expected[name] = value
        got[name] = _plain(getattr(mine, name, "<missing>"))
    return expected, got


def _same_mark(theirs: Any, mine: Any, mapping: Mapping, context: str,
               skip: frozenset[str] = frozenset()) -> None:
    assert type(theirs).__name__ == type(mine).__name__, (context, theirs, mine)
    expected, got = _fields(theirs, mine, mapping, skip)
    assert got == expected, (context, expected, got)


def _strength(side: Side, mark: Any) -> float:
    """The mark's effective strength now (decay, trust, warnings), by the side's own public
    function over the warnings it stored (superseded ones do not count)."""
    superseded = {m.supersedes for m in side.log if m.supersedes is not None}
    if mark.id in superseded:
        return 0.0
    warnings = [m for m in side.log if type(m).__name__ == "Warning"
                and m.invalidates == mark.id and m.id not in superseded]
    decay = side.space.get_scope(mark.scope).decay
    return side.ns.effective_strength_with_warnings(mark, warnings, side.space.now(), decay)


def _same_read(theirs: Side, mine: Side, got_theirs: list[Any], got_mine: list[Any],
               mapping: Mapping, op: Read) -> None:
    def ordered(side: Side, marks: list[Any], mapped: Callable[[Any], Any]) -> list[Any]:
        strengths = [_strength(side, m) for m in marks]
        assert all(a >= b - TOLERANCE for a, b in itertools.pairwise(strengths)), (
            "read not sorted by strength", op, strengths)
        assert all(s >= op.min_strength - TOLERANCE for s in strengths), (op, strengths)
        return sorted(zip(strengths, marks, strict=True),
                      key=lambda pair: (-round(pair[0], 9), str(mapped(pair[1].id))))

    expected = ordered(theirs, got_theirs, mapping)
    got = ordered(mine, got_mine, lambda i: i)
    assert [mapping(m.id) for _, m in expected] == [m.id for _, m in got], (
        op, [(s, m) for s, m in expected], [(s, m) for s, m in got])
    for (s_theirs, m_theirs), (s_mine, m_mine) in zip(expected, got, strict=True):
        assert math.isclose(s_theirs, s_mine, rel_tol=0, abs_tol=TOLERANCE), (op, m_theirs)
        _same_mark(m_theirs, m_mine, mapping, f"read {op}", _unchecked(mapping, m_theirs)
                   | _resolved_at(mapping, m_theirs))


def _unchecked(mapping: Mapping, mark: Any) -> frozenset[str]:
    """Fields not compared: the wording of the guard's own YIELD_ALL need (each side's)."""
    guard_need = type(mark).__name__ == "Need" and getattr(mark, "blocking", False) and \
        isinstance(mark.context, dict) and "resource" in mark.context
    return GUARD_WORDING if guard_need else frozenset()


def _resolved_at(mapping: Mapping, mark: Any) -> frozenset[str]:
    """A resolved copy's created_at while OPEN["resolved_at"] is tolerated (a read at
    min_strength 0 returns the copy, at strength 0)."""
    copy = getattr(mark, "resolved_by", None) is not None
    return frozenset({"created_at"}) if copy and "resolved_at" in mapping.tolerated \
        else frozenset()


def _same_decision(theirs: Any, mine: Any, mapping: Mapping, op: Any) -> None:
    assert _plain(mine.verdict) == _plain(theirs.verdict), (op, theirs, mine)
    assert mine.intent_id == mapping(theirs.intent_id), (op, theirs, mine)
    winner = None if theirs.winning_intent is None else mapping(theirs.winning_intent.id)
    mine_winner = None if mine.winning_intent is None else mine.winning_intent.id
    assert mine_winner == winner, (op, theirs, mine)
    deferred = isinstance(op, PreAction | Execute) and _plain(theirs.verdict) == "blocked" \
        and op.scope == "pool"
    if deferred and "deferred" in mapping.tolerated:
        return
    assert sorted(str(i.id) for i in mine.conflicting_intents) == sorted(
        str(mapping(i.id)) for i in theirs.conflicting_intents), (op, theirs, mine)


def _same_winner(theirs: Any, mine: Any, mapping: Mapping, op: Any) -> None:
    allowed = _plain(theirs.verdict) == "allow"
    assert (_plain(mine.verdict) == "allow") == allowed, (op, theirs, mine)
    assert mine.intent_id == mapping(theirs.intent_id), (op, theirs, mine)


def _same_result(theirs: Side, mine: Side, op: Any, got_theirs: Any, got_mine: Any,
                 mapping: Mapping) -> None:
    if isinstance(op, Read):
        _same_read(theirs, mine, got_theirs, got_mine, mapping, op)
    elif isinstance(op, PreAction):
        _same_decision(got_theirs, got_mine, mapping, op)
    elif isinstance(op, Execute):
        _same_decision(got_theirs[0], got_mine[0], mapping, op)
        assert got_mine[1] == got_theirs[1], op
    elif isinstance(op, ResolveDeferred):
        assert set(got_mine) == set(got_theirs), (op, got_theirs, got_mine)
        for agent_id, decision in got_theirs.items():
            if "deferred_loser" in mapping.tolerated:  # the same winner and intents
                _same_winner(decision, got_mine[agent_id], mapping, op)
            else:
                _same_decision(decision, got_mine[agent_id], mapping, op)
    elif isinstance(op, AggregateNeeds):
        _same_clusters(got_theirs, got_mine, mapping)
    elif isinstance(op, Intents):
        assert sorted(str(mapping(i.id)) for i in got_theirs[0]) == sorted(
            str(i.id) for i in got_mine[0]), (op, got_theirs, got_mine)
        assert got_mine[1] == mapping(got_theirs[1]), (op, got_theirs, got_mine)
    elif isinstance(op, Write | PostAction | Resolve):
        assert got_mine == mapping(got_theirs), (op, got_theirs, got_mine)


def _same_clusters(theirs: list[Any], mine: list[Any], mapping: Mapping) -> None:
    def key(clusters: list[Any], mapped: Callable[[Any], Any]) -> list[Any]:
        return sorted((c.scope, round(c.effective_priority, 9), c.blocking_count,
                       sorted(str(mapped(n.id)) for n in c.needs)) for c in clusters)

    assert key(mine, lambda i: i) == key(theirs, mapping), (theirs, mine)
    priorities = [c.effective_priority for c in mine]
    assert priorities == sorted(priorities, reverse=True), priorities


def _same_error(theirs: BaseException | None, mine: BaseException | None, op: Any) -> None:
    """Both raise or neither; ours is an instance of the class of the package's name."""
    if theirs is None:
        assert mine is None, (op, "only ours raised", repr(mine))
        return
    assert mine is not None, (op, "only the package raised", repr(theirs))
    name = type(theirs).__name__
    if isinstance(theirs, ToolFailed):
        expected: type[BaseException] = ToolFailed
    elif type(theirs).__module__.startswith("markspace"):
        expected = getattr(ours, name)
    else:
        expected = type(theirs)
    assert isinstance(mine, expected), (op, repr(theirs), repr(mine))


def _call(side: Side, op: Any) -> tuple[Any, BaseException | None]:
    try:
        return _apply(side, op), None
    except Exception as exc:
        return None, exc


def _step(theirs: Side, mine: Side, op: Any, mapping: Mapping) -> None:
    """One operation on both sides: same error, same marks stored, same result."""
    before = len(theirs.log), len(mine.log)
    got_theirs, err_theirs = _call(theirs, op)
    got_mine, err_mine = _call(mine, op)
    _same_error(err_theirs, err_mine, op)
    stored_theirs = theirs.log[before[0]:]
    if isinstance(op, Resolve) and err_theirs is None:
        # the package's resolve stores its copy without firing the write hooks
        theirs.log.append(theirs.space.get_mark(got_theirs))
        stored_theirs = theirs.log[before[0]:]
        if not any(m.id == got_mine for m in mine.log[before[1]:]):
            mine.log.append(mine.space.get_mark(got_mine))
    stored_mine = mine.log[before[1]:]
    assert len(stored_mine) == len(stored_theirs), (op, stored_theirs, stored_mine)
    for m_theirs, m_mine in zip(stored_theirs, stored_mine, strict=True):
        mapping.ids[m_theirs.id] = m_mine.id
    skip: frozenset[str] = frozenset()
    if "resolved_at" in mapping.tolerated and isinstance(op, Resolve):
        skip = frozenset({"created_at"})
    for m_theirs, m_mine in zip(stored_theirs, stored_mine, strict=True):
        _same_mark(m_theirs, m_mine, mapping, f"stored by {op}",
                   _unchecked(mapping, m_theirs) | skip)
    if err_theirs is not None:
        return
    for side, got in ((theirs, got_theirs), (mine, got_mine)):
        for decision in _decisions(op, got):
            if decision.intent_id is not None:
                side.intent_ids.append(decision.intent_id)
    _same_result(theirs, mine, op, got_theirs, got_mine, mapping)


def _decisions(op: Any, got: Any) -> list[Any]:
    if isinstance(op, PreAction):
        return [got]
    if isinstance(op, Execute):
        return [got[0]]
    if isinstance(op, ResolveDeferred):
        return [got[a] for a in sorted(got, key=str)]
    return []


# --------------------------------------------------------------------------- the tests


def _child_marks(theirs: Side, op: Any) -> bool:
    """Does a guard call on (scope, resource) meet an active intent or action of a child
    scope in the package's state? (The knowingly different case of the module docstring.)"""
    if not isinstance(op, PreAction | Execute | PostAction | ResolveDeferred):
        return False
    try:
        marks = theirs.space.read(op.scope, resource=op.resource)
    except pkg.ValidationError:
        return False  # an unknown scope: both must refuse it alike
    return any(m.scope != op.scope and type(m).__name__ in ("Intent", "Action") for m in marks)


def _open_case(theirs: Side, op: Any) -> str | None:
    """The OPEN difference `op` would run into, judged on the package's state, or None."""
    if isinstance(op, Resolve):
        need = theirs.space.get_mark(_ref(_ids(theirs, "Need", op.typed), op.need))
        resolved = need is not None and getattr(need, "resolved_by", None) is not None
        return "resolve_resolved" if resolved else None
    if isinstance(op, ResolveDeferred):
        actions = theirs.space.read(op.scope, resource=op.resource,
                                    mark_type=pkg.MarkType.ACTION)
        return "boundary_claimed" if any(not a.failed for a in actions) else None
    if not isinstance(op, PreAction | Execute | PostAction):
        return None
    try:
        theirs.space.get_scope(op.scope)
    except pkg.ValidationError:
        return None  # an unknown scope: both must refuse it alike
    agent = theirs.agents[op.agent]
    intents = theirs.space.get_intents(op.scope, op.resource)
    if any(i.agent_id == agent.id for i in intents):
        return "own_intent"
    actions = theirs.space.read(op.scope, resource=op.resource, mark_type=pkg.MarkType.ACTION)
    if isinstance(op, PostAction) and any(not a.failed and a.agent_id != agent.id
                                          for a in actions):
        return "notify"
    if not isinstance(op, PostAction) and _invalidated_claim(theirs, op, agent.id):
        return "invalidated_claim"
    return None


def _invalidated_claim(theirs: Side, op: Any, agent_id: Any) -> bool:
    """Has another agent a live action on the op's (scope, resource) that a warning, of any
    scope, invalidates? (Judged on the package's stored marks, which its reads then hide.)"""
    invalidated = {getattr(m, "invalidates", None) for m in theirs.log
                   if type(m).__name__ == "Warning"}
    superseded = {m.supersedes for m in theirs.log if m.supersedes is not None}
    return any(type(m).__name__ == "Action" and m.scope == op.scope
               and m.resource == op.resource and not m.failed and m.agent_id != agent_id
               and m.id in invalidated and m.id not in superseded for m in theirs.log)


def _run(operations: list[Any], space: Any,
         tolerated: frozenset[str] = frozenset(OPEN)) -> None:
    """Both sides through `operations`, leaving out the `tolerated` OPEN differences."""
    theirs = Side.build(pkg, pkg.MarkSpace(scopes=_scopes(pkg), clock=T0))
    mine = Side.build(ours, space)
    mapping = Mapping(tolerated)
    for op in operations:
        if _open_case(theirs, op) in tolerated or _child_marks(theirs, op):
            continue
        if not isinstance(op, Read | Advance | AggregateNeeds | Intents):
            # one second between writes: no two intents share a created_at, so FIRST_WRITER
            # and HIGHEST_CONFIDENCE never fall back to comparing (random) ids
            for side in (theirs, mine):
                side.space.set_clock(side.space.now() + 1.0)
        _step(theirs, mine, op, mapping)


SEQUENCES = st.lists(operation_st, min_size=6, max_size=25)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=SEQUENCES)
def test_memory_space_and_guard_behave_as_the_package(operations: list[Any]) -> None:
    """P27-P29, P11-P17, P34-P35 and the rest of §6-§9, as the package shows them."""
    space = make_space("memory", _scopes(ours), T0)
    try:
        _run(operations, space)
    finally:
        close_space(space)


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(operations=SEQUENCES)
def test_postgres_space_and_guard_behave_as_the_package(
        module_dsn: str, operations: list[Any]) -> None:
    """The same on Postgres, a fresh space per example (§8: the properties hold whatever
    the storage)."""
    space = make_space("postgres", _scopes(ours), T0, module_dsn)
    try:
        _run(operations, space)
    finally:
        close_space(space)


# --------------------------------------------------------------------------- reads at 0


def _zero_world(ns: Any, space: Any) -> list[Any]:
    """Every kind of strength-0 mark the package keeps readable, and superseded ones it does
    not: an expired intent (also in a child scope), an action and an observation written at
    strength 0, a fully warned action, a superseded observation, a resolved need and its
    copy. Returns the ids in write order (the copy last)."""
    ann = _agents(ns)["ann"]
    dan = _agents(ns)["dan"]
    writes = [
        (ann, ns.Intent(scope="desk", resource="r1", action="book")),
        (dan, ns.Intent(scope="desk/east", resource="r1", action="book")),
        (ann, ns.Action(scope="desk", resource="r1", action="booked", initial_strength=0.0)),
        (ann, ns.Observation(scope="desk", topic="price", content=1, initial_strength=0.0)),
        (ann, ns.Observation(scope="desk", topic="price", content=2)),
        (ann, ns.Action(scope="desk", resource="r2", action="booked")),
        (ann, ns.Need(scope="desk", question="which?", context={}, priority=0.5,
                      blocking=False)),
        (ann, ns.Action(scope="desk", resource="r3", action="booked")),
    ]
    ids = [space.write(agent, mark) for agent, mark in writes]
    ids.append(space.write(ann, ns.Warning(scope="desk", topic="price", reason="no",
                                           invalidates=ids[5], initial_strength=1.0)))
    ids.append(space.write(ann, ns.Observation(scope="desk", topic="price", content=3,
                                               supersedes=ids[4])))
    space.set_clock(space.now() + 65.0)  # past the intents' TTL (60 s)
    ids.append(space.resolve(ids[6], ids[7]))
    return ids


def _zero_reads(ns: Any, space: Any, ids: list[Any]) -> list[list[tuple[int, float]]]:
    """(write index, strength) of every mark of each read, in (strength, index) order."""
    need = ns.MarkType.NEED
    out = []
    for threshold in (-1.0, 0.0, ALIVE, 0.01):
        for filters in ({}, {"resource": "r1"}, {"topic": "price"}, {"mark_type": need}):
            marks = space.read("desk", min_strength=threshold, **filters)
            rows = [(ids.index(m.id), round(_strength_of(ns, space, m, ids), 9)) for m in marks]
            out.append(sorted(rows, key=lambda row: (-row[1], row[0])))
    return out


def _strength_of(ns: Any, space: Any, mark: Any, ids: list[Any]) -> float:
    warnings = [m for i in ids if (m := space.get_mark(i)) is not None
                and type(m).__name__ == "Warning" and m.invalidates == mark.id]
    decay = space.get_scope(mark.scope).decay
    return ns.effective_strength_with_warnings(mark, warnings, space.now(), decay)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reads_at_or_below_zero_return_what_the_package_returns(
        backend: str, request: pytest.FixtureRequest) -> None:
    """§8.2 and §10 as the package reads them, for the cases the random test does not draw:
    at min_strength -1 and 0, every unsuperseded mark (strength 0 included: expired intents
    here and in a child scope, marks written at 0, a fully warned action, a resolved copy);
    never the superseded observation nor the resolved need; above 0, none at 0."""
    theirs = pkg.MarkSpace(scopes=_scopes(pkg), clock=T0)
    dsn = request.getfixturevalue("module_dsn") if backend == "postgres" else None
    mine = make_space(backend, _scopes(ours), T0, dsn)
    try:
        expected = _zero_reads(pkg, theirs, _zero_world(pkg, theirs))
        ids = _zero_world(ours, mine)
        got = _zero_reads(ours, mine, ids)
    finally:
        close_space(mine)
    assert got == expected
    everything = {index for index, _ in expected[4]}  # read at 0, no filter
    assert everything == set(range(len(ids))) - {4, 6}  # not the superseded ones
    assert {index for index, _ in expected[0]} == everything  # -1 reads as 0
    assert all(strength > 0 for rows in expected[8:] for _, strength in rows)


# --------------------------------------------------------------------------- open differences


def _w(agent: str, scope: str, kind: str, key: str) -> Write:
    return Write(agent=agent, scope=scope, kind=kind, key=key, number=0.5, flag=False,
                 source="fleet", severity="info", supersedes=None, invalidates=None,
                 guarded=False)


#: the shortest sequence that shows each OPEN difference
REPRODUCE: dict[str, list[Any]] = {
    "own_intent": [PreAction("ann", "desk", "r1", "book", 0.5),
                   PreAction("ann", "desk", "r1", "book", 0.5)],
    "notify": [PostAction("bob", "desk", "r1", None), PostAction("ann", "desk", "r1", None)],
    "deferred": [PreAction("ann", "pool", "r1", "book", 0.2),
                 PreAction("bob", "pool", "r1", "book", 0.9)],
    "resolved_at": [_w("ann", "desk", "need", "price"), _w("ann", "desk", "action", "r2"),
                    Advance(7.0), Resolve(0, 0, None, True)],
    "resolve_resolved": [_w("ann", "desk", "need", "price"), _w("ann", "desk", "action", "r2"),
                         Resolve(0, 0, None, True), Resolve(1, 0, None, True)],
    "boundary_claimed": [PreAction("bob", "pool", "r1", "book", 0.2),
                         PostAction("ann", "pool", "r1", None),
                         ResolveDeferred("pool", "r1", False)],
    "deferred_loser": [PreAction("ann", "pool", "r1", "book", 0.2),
                       PreAction("bob", "pool", "r1", "book", 0.9),
                       ResolveDeferred("pool", "r1", False)],
    # (found by the random test: the warning, of another scope, invalidates ann's action)
    "invalidated_claim": [PostAction("ann", "crowd", "r1", None),
                          replace(_w("ann", "desk", "warning", "r1"), invalidates=0),
                          PreAction("bob", "crowd", "r1", "book", 0.2)],
}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                               reason=OPEN[name]))
    for name in OPEN])
def test_open_difference_with_the_package(name: str) -> None:
    """Each OPEN difference, shown by its shortest sequence with every other one tolerated
    (XPASS, a failure, once it is fixed: then drop it from OPEN)."""
    space = make_space("memory", _scopes(ours), T0)
    try:
        _run(REPRODUCE[name], space, frozenset(OPEN) - {name})
    finally:
        close_space(space)


def test_every_open_difference_is_excluded_by_the_random_test() -> None:
    """The random test's exclusions cover each OPEN sequence: tolerated, they pass."""
    assert set(REPRODUCE) == set(OPEN)
    for operations in REPRODUCE.values():
        space = make_space("memory", _scopes(ours), T0)
        try:
            _run(operations, space)
        finally:
            close_space(space)


def test_the_guard_checks_one_scope_as_the_spec_says() -> None:
    """The difference `_child_marks` leaves out of the random test, shown: ann's intent on
    "desk/east"/r2 does not contend with bob's pre_action on "desk"/r2 in ours (Markspace §6,
    §9.2: one (scope, resource)); the package's guard reads the tree and says CONFLICT. On
    one scope, both say CONFLICT (FIRST_WRITER: ann was first)."""
    for ns, space in ((pkg, pkg.MarkSpace(scopes=_scopes(pkg), clock=T0)),
                      (ours, make_space("memory", _scopes(ours), T0))):
        try:
            agents, guard = _agents(ns), ns.Guard(space)
            space.write(agents["ann"], ns.Intent(scope="desk/east", resource="r2",
                                                 action="book"))
            space.write(agents["ann"], ns.Intent(scope="desk", resource="r1", action="book"))
            space.set_clock(T0 + 1.0)
            child = guard.pre_action(agents["bob"], "desk", "r2", "book", 0.5)
            same = guard.pre_action(agents["bob"], "desk", "r1", "book", 0.5)
        finally:
            if ns is ours:
                close_space(space)
        assert _plain(same.verdict) == "conflict"
        assert _plain(child.verdict) == ("conflict" if ns is pkg else "allow")
