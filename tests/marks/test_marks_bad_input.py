"""Bad input to the mark space, on both backends: a typed error, and nothing stored.

The hypothesis test draws a space with some valid marks in it, then a run of bad writes:
unauthorized agents (wrong scope, wrong mark type, a name prefix, a child grant), unknown
scopes, disallowed intent and action verbs, disallowed observation and warning topics,
out-of-range or non-finite confidence, priority and strength, and malformed marks (wrong field
types, NUL bytes and lone surrogates, non-JSON content, bad scope names, missing fields, a
wrong mark_type, projected copies, objects that are not marks, a non-Agent writer), each
written alone or inside a ``write_many`` batch with valid marks. Every one must raise the
typed error the contract names (docs: the order of the checks is fields, scope, permission,
scope rules) with a message, leave every read, ``active_marks()``, ``all_marks()`` and
``len()`` as they were, and fire no write hook. Marks that bypass validation are built with
``model_construct`` and ``model_copy(update=...)``, as careless or hostile callers would.

The other tests pin single cases: building a mark with bad fields raises an error that is
both ``InvalidMark`` and pydantic's ``ValidationError``; bad ``resolve`` calls; reads of an
unknown scope.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentpost.config import DEFAULT_MAX_MARK_CONTENT_BYTES as MAX_BYTES
from agentpost.marks import (
    Action,
    Agent,
    ConflictPolicy,
    Intent,
    InvalidArgument,
    InvalidMark,
    MarkspaceError,
    MarkType,
    Need,
    Observation,
    Scope,
    ScopeVisibility,
    Severity,
    UnauthorizedWrite,
    UnknownMark,
    UnknownScope,
    Warning,
)
from agentpost.marks.core import MAX_LABEL
from agentpost.protocol.errors import AgentpostError, ConfigurationError
from marks_backends import T0

SCOPES = [
    Scope(
        name="cal",
        allowed_intent_verbs=("book", "cancel"),
        allowed_action_verbs=("booked",),
        observation_topics=("weather", "traffic"),
        warning_topics=("weather",),
        conflict_policy=ConflictPolicy.FIRST_WRITER,
    ),
    Scope(name="hr", visibility=ScopeVisibility.PROTECTED),
    Scope(name="calx"),
]
SCOPE_NAMES = ("cal", "hr", "calx", "cal/sub")
ALL_TYPES = [t.value for t in MarkType]
WRITER = Agent(name="writer", scopes={"cal": ALL_TYPES, "hr": ALL_TYPES})


def good_mark(kind: MarkType, scope: str = "cal") -> Any:
    """A valid mark of ``kind`` for ``scope`` (its allowed verbs and topics)."""
    if kind is MarkType.INTENT:
        return Intent(scope=scope, resource="room-1", action="book", confidence=0.5)
    if kind is MarkType.ACTION:
        return Action(scope=scope, resource="room-1", action="booked", result={"ok": True})
    if kind is MarkType.OBSERVATION:
        return Observation(scope=scope, topic="weather", content={"c": 20}, confidence=0.5)
    if kind is MarkType.WARNING:
        return Warning(scope=scope, topic="weather", reason="stale", severity=Severity.INFO)
    return Need(scope=scope, question="which room?", context={"n": 2}, priority=0.5)


KINDS = st.sampled_from(list(MarkType))


@dataclass(frozen=True)
class Bad:
    """One bad write: who writes what, and the typed error it must raise."""

    label: str
    agent: Any
    mark: Any
    error: type[Exception]


def smuggled(mark: Any, **fields: Any) -> Any:
    """``mark`` with ``fields`` forced in, without validation (two ways callers can)."""
    return mark.model_copy(update=fields)


def constructed(kind: MarkType, **fields: Any) -> Any:
    """A mark of ``kind`` built field by field without validation."""
    base = good_mark(kind).model_dump()
    base.update(fields)
    return type(good_mark(kind)).model_construct(**base)


# a required field of each mark type (no default)
REQUIRED = {MarkType.INTENT: "resource", MarkType.ACTION: "action",
            MarkType.OBSERVATION: "topic", MarkType.WARNING: "topic", MarkType.NEED: "question"}
NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
OUT_OF_UNIT = st.floats(1.0, 1e6, exclude_min=True) | st.floats(-1e6, 0.0, exclude_max=True)
BAD_TEXT = st.sampled_from(["a\x00b", "\ud800", "x\udfff", "\x00"])
BAD_SCOPE_NAMES = st.sampled_from(["", "cal//x", "cal/", "/cal", "c al", "cal\tx", "cal\x00"])


@st.composite
def unauthorized(draw: st.DrawFn) -> Bad:
    kind = draw(KINDS)
    types = [t for t in ALL_TYPES if t != kind.value]
    agent = draw(st.sampled_from([
        Agent(name="no-grants"),
        Agent(name="other-scope", scopes={"calx": ALL_TYPES}),
        Agent(name="prefix", scopes={"ca": ALL_TYPES}),
        Agent(name="child-only", scopes={"cal/sub": ALL_TYPES}),
        Agent(name="other-types", scopes={"cal": types}),
        Agent(name="reader", scopes={}, read_scopes=("cal",)),
    ]))
    label = f"unauthorized {kind.value} by {agent.name}"
    return Bad(label, agent, good_mark(kind), UnauthorizedWrite)


@st.composite
def unknown_scope(draw: st.DrawFn) -> Bad:
    kind = draw(KINDS)
    name = draw(st.sampled_from(["nowhere", "nowhere/cal", "ca", "c", "CAL", "cal2/x"]))
    grant = Agent(name="granted", scopes={name: ALL_TYPES})
    return Bad(f"unknown scope {name}", grant, good_mark(kind, scope=name), UnknownScope)


@st.composite
def scope_rules(draw: st.DrawFn) -> Bad:
    word = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8))
    choice = draw(st.sampled_from(["intent", "action", "observation", "warning"]))
    if choice == "intent" and word not in ("book", "cancel"):
        mark = Intent(scope="cal", resource="room-1", action=word)
    elif choice == "action" and word != "booked":
        mark = Action(scope="cal", resource="room-1", action=word)
    elif choice == "observation" and word not in ("weather", "traffic"):
        mark = Observation(scope="cal", topic=word)
    elif choice == "warning" and word != "weather":
        mark = Warning(scope="cal", topic=word, reason="r")
    else:
        mark = Warning(scope="cal/sub", topic="traffic", reason="inherited topic list")
    return Bad(f"{choice} verb/topic {word!r} not allowed", WRITER, mark, InvalidMark)


@st.composite
def out_of_range(draw: st.DrawFn) -> Bad:
    field, kind = draw(st.sampled_from([
        ("confidence", MarkType.INTENT),
        ("confidence", MarkType.OBSERVATION),
        ("priority", MarkType.NEED),
        ("initial_strength", MarkType.ACTION),
        ("initial_strength", MarkType.WARNING),
    ]))
    if field == "initial_strength":
        value = draw(NOT_FINITE | st.floats(-1e6, 0.0, exclude_max=True))
    else:
        value = draw(NOT_FINITE | OUT_OF_UNIT)
    how = draw(st.sampled_from([smuggled, None]))
    mark = how(good_mark(kind), **{field: value}) if how else constructed(kind, **{field: value})
    return Bad(f"{kind.value}.{field}={value!r}", WRITER, mark, InvalidMark)


@st.composite
def malformed(draw: st.DrawFn) -> Bad:
    kind = draw(KINDS)
    good = good_mark(kind)
    text_field = {MarkType.INTENT: "resource", MarkType.ACTION: "action",
                  MarkType.OBSERVATION: "topic", MarkType.WARNING: "reason",
                  MarkType.NEED: "question"}[kind]
    dict_field = {MarkType.ACTION: "result", MarkType.OBSERVATION: "content",
                  MarkType.NEED: "context"}.get(kind)
    options: list[tuple[str, Callable[[], Any]]] = [
        ("bad text", lambda: smuggled(good, **{text_field: draw(BAD_TEXT)})),
        ("text not a string", lambda: smuggled(good, **{text_field: draw(
            st.sampled_from([12, None, 1.5, ["x"], {"x": 1}]))})),
        ("bad scope name", lambda: smuggled(good, scope=draw(BAD_SCOPE_NAMES))),
        ("wrong mark_type", lambda: smuggled(good, mark_type=draw(
            st.sampled_from([t for t in MarkType if t is not kind])))),
        ("projected copy", lambda: smuggled(good, projected=True)),
        ("unknown supersedes type", lambda: smuggled(good, supersedes="not-a-uuid")),
        ("boolean strength", lambda: smuggled(good, initial_strength="strong")),
        ("missing field", lambda: type(good).model_construct(
            **good.model_dump(exclude={REQUIRED[kind]}))),
    ]
    label_field = {MarkType.INTENT: "resource", MarkType.ACTION: "resource",
                   MarkType.OBSERVATION: "topic", MarkType.WARNING: "topic"}.get(kind)
    if label_field is not None:
        options += [
            ("label too long", lambda: smuggled(good, **{label_field: "r" * draw(
                st.integers(MAX_LABEL + 1, 4 * MAX_LABEL))})),
        ]
    if dict_field is not None:
        options += [
            ("non-JSON content", lambda: smuggled(good, **{dict_field: draw(st.sampled_from([
                {"x": {1, 2}}, {1: "int key"}, {"x": math.nan}, {"x": math.inf},
                {"x": object()}, {"x": b"bytes"}, {"x\x00": 1}, {"x": "\ud800"},
                {1, 2}, b"bytes"]))})),
            ("content too large", lambda: smuggled(good, **{dict_field: {"x": "y" * draw(
                st.integers(MAX_BYTES, 2 * MAX_BYTES))}})),
        ]
    label, build = draw(st.sampled_from(options))
    return Bad(f"{kind.value}: {label}", WRITER, build(), InvalidMark)


@st.composite
def not_a_mark(draw: st.DrawFn) -> Bad:
    thing = draw(st.sampled_from([
        None, {"mark_type": "intent", "scope": "cal"}, "intent", 42, Scope(name="cal"),
        Agent(name="x"),
    ]))
    return Bad(f"not a mark: {type(thing).__name__}", WRITER, thing, InvalidMark)


@st.composite
def not_an_agent(draw: st.DrawFn) -> Bad:
    thing = draw(st.sampled_from([None, "writer", WRITER.id, {"name": "writer"}]))
    return Bad(f"not an agent: {type(thing).__name__}", thing, good_mark(draw(KINDS)),
               InvalidArgument)


BAD_WRITES = st.one_of(unauthorized(), unknown_scope(), scope_rules(), out_of_range(),
                       malformed(), not_a_mark(), not_an_agent())


def observable(space: Any) -> dict[str, Any]:
    """What readers can see of the space, plus what it holds in all."""
    return {
        "len": len(space),
        "all": [m.model_dump() for m in space.all_marks()],
        "active": [m.model_dump() for m in space.active_marks()],
        "reads": {
            name: [m.model_dump() for m in space.read(name, min_strength=0.0)]
            for name in SCOPE_NAMES
        },
        "projected": [m.model_dump() for m in space.read("hr", reader=Agent(name="nobody"))],
        "needs": [dataclasses.asdict(c) for c in space.aggregate_needs()],
    }


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    existing=st.lists(st.tuples(KINDS, st.sampled_from(["cal", "hr"])), max_size=5),
    bad_writes=st.lists(BAD_WRITES, min_size=1, max_size=6),
    batched=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_rejected_writes_leave_the_space_unchanged(new_space, existing, bad_writes,
                                                   batched) -> None:
    """Every bad write raises its typed error (an AgentpostError with a message), alone or in
    a write_many batch, and stores nothing: reads, active_marks, all_marks, len, needs and
    write hooks show no trace of it."""
    fired: list[Any] = []
    with new_space.scoped(SCOPES, clock=T0) as space:
        for kind, scope in existing:
            space.write(WRITER, good_mark(kind, scope))
        space.add_write_hook(lambda agent_id, mark: fired.append(mark))
        before = observable(space)
        for bad, in_batch in zip(bad_writes, batched, strict=False):
            with pytest.raises(bad.error) as caught:
                if in_batch and isinstance(bad.agent, Agent):
                    space.write_many(bad.agent, [good_mark(MarkType.NEED, "cal")
                                                 if bad.agent is WRITER else bad.mark,
                                                 bad.mark])
                else:
                    space.write(bad.agent, bad.mark)
            assert isinstance(caught.value, MarkspaceError), bad.label
            assert isinstance(caught.value, AgentpostError)
            assert str(caught.value).strip(), bad.label
            assert observable(space) == before, bad.label
            assert fired == [], bad.label
        space.set_clock(T0 + 10.0)
        space.write(WRITER, good_mark(MarkType.NEED))
        assert len(space) == before["len"] + 1


@pytest.mark.parametrize(
    "build",
    [
        lambda: Intent(scope="cal", resource="r", action="book", confidence=1.5),
        lambda: Intent(scope="cal", resource="r", action="book", confidence=math.nan),
        lambda: Observation(scope="cal", topic="t", confidence=-0.1),
        lambda: Need(scope="cal", question="q", priority=2.0),
        lambda: Action(scope="cal", action="booked", initial_strength=-1.0),
        lambda: Warning(scope="cal", topic="t", initial_strength=math.inf),
        lambda: Observation(scope="cal", topic="t", content={"x": math.nan}),
        lambda: Intent(scope="cal", resource="r\x00", action="book"),
        lambda: Intent(scope="cal//x", resource="r", action="book"),
        lambda: Intent(scope="cal", action="book"),
        lambda: Observation(scope="cal", topic="t", colour="red"),
    ],
    ids=["confidence>1", "confidence-nan", "confidence<0", "priority>1", "strength<0",
         "strength-inf", "content-nan", "nul", "scope-name", "missing-resource", "extra-field"],
)
def test_building_a_bad_mark_raises_a_typed_error(build) -> None:
    """Out-of-range or malformed fields fail at construction with an error that is both the
    mark space's InvalidMark and pydantic's ValidationError."""
    with pytest.raises(InvalidMark) as caught:
        build()
    assert isinstance(caught.value, ValidationError)
    assert isinstance(caught.value, ValueError)


def test_bad_resolve_calls_store_nothing(new_space) -> None:
    """resolve() of an unknown mark, of a mark that is not a need, of an already resolved
    need, or with a non-action resolver raises a typed error and stores nothing."""
    space = new_space(SCOPES, clock=T0)
    need = space.write(WRITER, good_mark(MarkType.NEED))
    intent = space.write(WRITER, good_mark(MarkType.INTENT))
    action = space.write(WRITER, good_mark(MarkType.ACTION))
    before = observable(space)
    for args, error in (
        ((uuid.uuid4(), action), UnknownMark),
        ((intent, action), InvalidMark),
        ((need, intent), InvalidMark),
        ((need, "not-a-uuid"), UnknownMark),  # the package: no such action, a ValidationError
    ):
        with pytest.raises(error):
            space.resolve(*args)
        assert observable(space) == before, args
    space.resolve(need, action)
    after = observable(space)
    with pytest.raises(InvalidMark):
        space.resolve(need, action)
    assert observable(space) == after


def test_reads_of_unknown_scopes_raise(new_space) -> None:
    """A read of a scope that is not registered (nor any ancestor) raises UnknownScope; a
    child of a registered scope reads as empty."""
    space = new_space(SCOPES, clock=T0)
    for name in ("nowhere", "ca", "nowhere/cal"):
        with pytest.raises(UnknownScope):
            space.read(name)
    assert space.read("cal/never-written") == []


def test_bad_guard_calls_store_nothing(new_space) -> None:
    """The guard's entry points with bad arguments: an unknown scope, a non-Agent, an
    out-of-range or non-finite confidence, a disallowed verb, a non-JSON result. Each raises
    a typed error, and nothing reaches the space."""
    from agentpost.marks import Guard

    space = new_space(SCOPES, clock=T0)
    guard = Guard(space)
    space.write(WRITER, good_mark(MarkType.NEED))
    before = observable(space)
    calls: list[tuple[Callable[[], Any], type[Exception]]] = [
        (lambda: guard.pre_action(WRITER, "nowhere", "r", "book", 0.5), UnknownScope),
        (lambda: guard.pre_action(None, "cal", "r", "book", 0.5), InvalidArgument),
        (lambda: guard.pre_action(WRITER, "cal", "r", "book", 1.5), InvalidMark),
        (lambda: guard.pre_action(WRITER, "cal", "r", "book", math.nan), InvalidMark),
        (lambda: guard.pre_action(WRITER, "cal", "r\x00", "book", 0.5), InvalidMark),
        (lambda: guard.post_action(WRITER, "cal", "r", "flew", {"ok": True}), InvalidMark),
        (lambda: guard.post_action(WRITER, "cal", "r", "booked", {"x": {1, 2}}), InvalidMark),
        (lambda: guard.post_action(WRITER, "nowhere", "r", "booked", {}), UnknownScope),
        (lambda: guard.write_mark(WRITER, Observation(scope="cal", topic="gossip")),
         InvalidMark),
    ]
    for call, error in calls:
        with pytest.raises(error):
            call()
        assert observable(space) == before
    for verb in ("fly", "booked"):  # an intent verb the scope does not list: the package's
        with pytest.raises(InvalidMark, match=verb):  # ValidationError, not a verdict
            guard.pre_action(WRITER, "cal", "r", verb, 0.5)
        assert observable(space) == before


def test_bad_boundaries_are_refused_and_keep_the_last_verdicts(new_space) -> None:
    """record_verdicts (the space's half of §6.2.1 phase 3) refuses a boundary that breaks
    P17 (two ALLOWs), gives an agent two verdicts, is about another resource, names no intent
    of that agent there, or is not made of DeferredVerdicts: InvalidArgument, and the verdicts
    of the last good boundary stay as they were."""
    from agentpost.marks.core import DeferredVerdict

    space = new_space([Scope(name="lot", deferred=True)], clock=T0)
    drivers = [Agent(name=f"d{k}", scopes={"lot": ["intent"]}) for k in range(2)]
    intents = [space.write(d, Intent(scope="lot", resource="p1", action="park"))
               for d in drivers]
    elsewhere = space.write(drivers[0], Intent(scope="lot", resource="p2", action="park"))

    def verdict(k: int, allowed: bool, **changes: Any) -> DeferredVerdict:
        fields = {"scope": "lot", "resource": "p1", "agent_id": drivers[k].id,
                  "intent_id": intents[k], "allowed": allowed, **changes}
        return DeferredVerdict(**fields)

    first = space.record_verdicts("lot", "p1", [verdict(0, True), verdict(1, False)])
    kept = [space.deferred_verdict("lot", "p1", d.id) for d in drivers]
    assert kept[0].allowed and kept[0].boundary == first and not kept[1].allowed
    for bad in (
        [verdict(0, True), verdict(1, True)],
        [verdict(0, True), verdict(0, False)],
        [verdict(0, True, resource="p2")],
        [verdict(0, True, intent_id=elsewhere)],
        [verdict(0, True, intent_id=uuid.uuid4())],
        [verdict(1, True, intent_id=intents[0])],
        [verdict(1, True), verdict(0, False, intent_id=uuid.uuid4())],
        [{"agent_id": str(drivers[0].id), "allowed": True}],
    ):
        with pytest.raises(InvalidArgument):
            space.record_verdicts("lot", "p1", bad)
        assert [space.deferred_verdict("lot", "p1", d.id) for d in drivers] == kept
    with pytest.raises(UnknownScope):
        space.record_verdicts("nowhere", "p1", [])
    assert space.record_verdicts("lot", "p1", []) > first
    assert [space.deferred_verdict("lot", "p1", d.id) for d in drivers] == [None, None]


CONTENT = {MarkType.ACTION: "result", MarkType.OBSERVATION: "content", MarkType.NEED: "context"}


def with_content(kind: MarkType, size: int) -> Any:
    """A good mark of ``kind`` whose content fields encode to exactly ``size`` bytes."""
    mark = good_mark(kind)
    if kind is MarkType.WARNING:
        return mark.model_copy(update={"reason": "r" * (size - 2)})  # JSON: "r...r"
    fields = {"question": "q" * 2} if kind is MarkType.NEED else {}
    used = 4 if kind is MarkType.NEED else 0  # the question's JSON ("qq")
    fields[CONTENT[kind]] = {"x": "y" * (size - used - len('{"x":""}'))}
    return type(mark)(**{**mark.model_dump(exclude={"id", "agent_id", "created_at"}),
                         **fields})


@pytest.mark.parametrize("kind", [MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
                                  MarkType.NEED])
def test_mark_content_is_bounded_and_an_oversized_mark_stores_nothing(new_space, kind,
                                                                      monkeypatch) -> None:
    """Bad input (docs/marks.md, bounds): a mark whose content fields (result, content,
    reason, question and context, as UTF-8 JSON) exceed the space's bound is refused with
    InvalidMark on both backends, alone or in a batch, and nothing is stored; at the bound it
    is stored. The bound is AGENTPOST_MAX_MARK_CONTENT_BYTES, or the space's
    ``max_content_bytes``."""
    monkeypatch.setenv("AGENTPOST_MAX_MARK_CONTENT_BYTES", "2048")
    space = new_space(SCOPES, clock=T0)
    before = observable(space)
    for batch in (False, True):
        with pytest.raises(InvalidMark, match="2048"):
            if batch:
                space.write_many(WRITER, [good_mark(MarkType.NEED), with_content(kind, 2049)])
            else:
                space.write(WRITER, with_content(kind, 2049))
        assert observable(space) == before
    space.write(WRITER, with_content(kind, 2048))
    assert len(space) == before["len"] + 1
    assert space.max_content_bytes == 2048

    monkeypatch.delenv("AGENTPOST_MAX_MARK_CONTENT_BYTES")
    default = new_space(SCOPES, clock=T0)
    assert default.max_content_bytes == MAX_BYTES
    with pytest.raises(InvalidMark):
        default.write(WRITER, with_content(kind, 4 * MAX_BYTES))
    assert len(default) == 0
    roomy = new_space.scoped(SCOPES, clock=T0, max_content_bytes=8 * MAX_BYTES)
    with roomy as space:
        space.write(WRITER, with_content(kind, 4 * MAX_BYTES))
        assert len(space) == 1


@pytest.mark.parametrize("value", ["lots", "0", "-5", str(1 << 40)])
def test_a_bad_mark_content_bound_is_a_configuration_error(new_space, monkeypatch,
                                                           value) -> None:
    """A bound that is not a positive number of bytes (at most 256 MiB), from the
    environment or the constructor, is refused when the space is built."""
    monkeypatch.setenv("AGENTPOST_MAX_MARK_CONTENT_BYTES", value)
    with pytest.raises(ConfigurationError, match="max_mark_content_bytes"):
        new_space(SCOPES, clock=T0)
    monkeypatch.delenv("AGENTPOST_MAX_MARK_CONTENT_BYTES")
    with pytest.raises(ConfigurationError, match="max_mark_content_bytes"):
        new_space(SCOPES, clock=T0, max_content_bytes=value)


@pytest.mark.parametrize("field", ["scope", "resource", "action", "topic"])
def test_mark_labels_are_bounded_on_both_backends(new_space, field) -> None:
    """Bad input: a scope name, resource, verb or topic longer than MAX_LABEL characters is
    refused at construction, and when smuggled in, by both backends alike with InvalidMark,
    storing nothing (Postgres used to fail with a StoreError from its index, the memory
    backend to accept it). MAX_LABEL characters are accepted by both."""
    space = new_space([*SCOPES, Scope(name="s" * MAX_LABEL)], clock=T0)
    writer = Agent(name="w", scopes={"s" * MAX_LABEL: ALL_TYPES})
    kind = MarkType.OBSERVATION if field == "topic" else MarkType.INTENT
    good = good_mark(kind).model_copy(update={"scope": "s" * MAX_LABEL})
    longest = good.model_copy(update={field: "s" * MAX_LABEL})
    space.write(writer, type(good)(**longest.model_dump(exclude={"id"})))
    before = observable(space), len(space)
    too_long = "s" * (MAX_LABEL + 1)
    with pytest.raises(InvalidMark, match=str(MAX_LABEL)):
        type(good)(**{**good.model_dump(exclude={"id"}), field: too_long})
    with pytest.raises(InvalidMark, match=str(MAX_LABEL)):
        space.write(writer, good.model_copy(update={field: too_long}))
    assert (observable(space), len(space)) == before


@pytest.mark.parametrize("value", ["plain text", ["a", "list"], 3, None, {"nested": [1, {}]}])
def test_content_is_any_json_value(new_space, value: Any) -> None:
    """Action.result, Observation.content and Need.context take any JSON value, as the
    package's fields take any payload (issue 15): a string or a list is content, stored and
    read back as written; only what JSON cannot hold is refused (the random test above)."""
    fields = {MarkType.ACTION: "result", MarkType.OBSERVATION: "content",
              MarkType.NEED: "context"}
    with new_space.scoped(SCOPES, clock=T0) as space:
        for kind, name in fields.items():
            mark_id = space.write(WRITER, good_mark(kind).model_copy(update={name: value}))
            assert getattr(space.get_mark(mark_id), name) == value
