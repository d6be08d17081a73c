"""Fast unit tests of agentpost.marks' pure functions (core, compose), the in-memory
MarkSpace and the Scheduler. Each test names the spec property (P-number) it checks; the
backend-parametrized property suite lives in the test_marks_* property modules."""

from __future__ import annotations

import itertools
import math
import random
import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agentpost.marks import (
    Action,
    Agent,
    AgentManifest,
    ConflictPolicy,
    DecayConfig,
    Intent,
    InvalidArgument,
    InvalidMark,
    MarkSpace,
    MarkType,
    Need,
    Observation,
    Scheduler,
    Scope,
    ScopeVisibility,
    Severity,
    Source,
    UnauthorizedWrite,
    UnknownMark,
    UnknownScope,
    Warning,
    WatchPattern,
    compute_strength,
    effective_strength,
    effective_strength_with_warnings,
    hours,
    minutes,
    project_mark,
    reinforce,
    resolve_conflict,
    trust_weight,
    validate_manifest_permissions,
    validate_pipeline,
    winning_intent,
)
from agentpost.marks.core import (
    CONTENT_FIELDS,
    REDACTED,
    cluster_needs,
    mark_from_record,
    revalidate,
)
from agentpost.marks.space import memory as space_module
from marks_backends import ALIVE

T0 = 1_700_000_000.0
DECAY = DecayConfig(observation_half_life=100.0, warning_half_life=50.0, intent_ttl=30.0)
ALL_TYPES = list(MarkType)


def scope(name: str = "ops", **kw) -> Scope:
    kw.setdefault("decay", DECAY)
    return Scope(name=name, **kw)


def writer(*scopes: str, **kw) -> Agent:
    return Agent(name=kw.pop("name", "w"), scopes={s: ALL_TYPES for s in scopes}, **kw)


@pytest.fixture
def space() -> MarkSpace:
    return MarkSpace(
        scopes=[
            scope("ops"),
            scope("hr", visibility=ScopeVisibility.PROTECTED),
            scope("legal", visibility=ScopeVisibility.CLASSIFIED),
            scope(
                "calendar",
                allowed_intent_verbs=["book"],
                allowed_action_verbs=["booked"],
                observation_topics=["free"],
                warning_topics=["stale"],
            ),
        ],
        clock=T0,
    )


@pytest.fixture
def agent() -> Agent:
    return writer("ops", "hr", "legal", "calendar", name="alice")


def observation(**kw) -> Observation:
    kw.setdefault("scope", "ops")
    kw.setdefault("topic", "t")
    return Observation(**kw)


def written(mark, at: float = T0):
    """A mark as the space would store it (id, agent, created_at set)."""
    return mark.model_copy(update={"id": uuid.uuid4(), "agent_id": uuid.uuid4(), "created_at": at})


# ----------------------------------------------------------------- DSL and models


def test_dsl_spec_example_runs():
    """§12.1 (P27): the spec's DSL example runs unchanged and reads as the spec says."""
    calendar = Scope(
        name="calendar",
        allowed_intent_verbs=["book", "reschedule", "cancel"],
        allowed_action_verbs=["booked", "rescheduled", "cancelled"],
        decay=DecayConfig(
            observation_half_life=hours(1), warning_half_life=hours(4), intent_ttl=minutes(30)
        ),
        conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
    )
    space = MarkSpace(scopes=[calendar])
    booker = Agent(name="flight-booker", scopes={"calendar": ["intent", "action"]})
    intent_id = space.write(
        booker, Intent(scope="calendar", resource="thu-14:00", action="book", confidence=0.9)
    )
    [intent] = space.read(scope="calendar", resource="thu-14:00")
    assert intent.id == intent_id and intent.agent_id == booker.id
    action_id = space.write(
        booker,
        Action(
            scope="calendar",
            resource="thu-14:00",
            action="booked",
            result={"flight": "DL413", "departure": "14:30"},
            supersedes=intent_id,
        ),
    )
    assert [m.id for m in space.read(scope="calendar", resource="thu-14:00")] == [action_id]


def test_enum_values_and_durations():
    """§2/§7 (P6 order words): enum values are the spec's lowercase words; hours/minutes."""
    assert MarkType.INTENT == "intent" and Source.EXTERNAL_VERIFIED == "external_verified"
    assert Severity.CAUTION == "caution" and ScopeVisibility.OPEN == "open"
    assert ConflictPolicy.HIGHEST_CONFIDENCE == "highest_confidence"
    assert hours(1) == 3600.0 and minutes(30) == 1800.0


@pytest.mark.parametrize(
    "build",
    [
        lambda: Intent(scope="s", resource="r", action="a", confidence=1.5),
        lambda: Intent(scope="s", resource="r", action="a", confidence=-0.1),
        lambda: Intent(scope="s", resource="r", action="a", confidence=math.nan),
        lambda: Need(scope="s", question="q", priority=2),
        lambda: Observation(scope="s", topic="t", initial_strength=-1),
        lambda: Observation(scope="s", topic="t", initial_strength=math.inf),
        lambda: Observation(scope="s", topic="t", content={"x": math.nan}),
        lambda: Observation(scope="s", topic="t", content={1: "non-string key"}),
        lambda: Observation(scope="s", topic="t\x00"),
        lambda: Observation(scope="a//b", topic="t"),
        lambda: Observation(scope="", topic="t"),
        lambda: Intent(scope="s", resource="r", action="a", mark_type="action"),
        lambda: Intent(scope="s", resource="r", action="a", colour="red"),
        lambda: Action(scope="s"),
    ],
)
def test_malformed_marks_raise_typed_errors(build):
    """P30 / bad input: malformed marks raise MarkValidationError, both an InvalidMark and a
    pydantic ValidationError."""
    with pytest.raises(InvalidMark) as caught:
        build()
    assert isinstance(caught.value, ValidationError)


def test_marks_are_deeply_frozen():
    """P30: marks are frozen, their dict fields too, and they stay equal to plain dicts."""
    mark = observation(content={"a": [1, {"b": 2}]})
    with pytest.raises(ValidationError):
        mark.topic = "other"
    with pytest.raises(TypeError):
        mark.content["a"] = 0
    with pytest.raises(TypeError):
        mark.content["a"].append(3)
    assert mark.content == {"a": [1, {"b": 2}]}
    # equal fields, equal hash (each mark built in code has its own provisional id)
    assert hash(mark) == hash(observation(content={"a": [1, {"b": 2}]}, id=mark.id))
    assert mark_from_record(mark.model_dump(mode="json")) == mark


def test_revalidate_catches_smuggled_values():
    """P30 / bad input: model_copy(update=...) and model_construct skip validation; the
    space's revalidation does not."""
    good = Intent(scope="s", resource="r", action="a")
    with pytest.raises(InvalidMark):
        revalidate(good.model_copy(update={"confidence": 7.0}))
    with pytest.raises(InvalidMark):
        revalidate(Intent.model_construct(scope="s", resource="r", action="a", confidence=-1))
    with pytest.raises(InvalidMark):
        revalidate("not a mark")


# ----------------------------------------------------------------- decay and trust

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
strengths = st.floats(min_value=0, max_value=10, allow_nan=False)


@given(t1=times, dt=times, initial=strengths, kind=st.sampled_from(["obs", "warn"]))
def test_decay_monotonic(t1, dt, initial, kind):
    """P1: observation and warning strength never increases with time."""
    if kind == "obs":
        mark = written(observation(initial_strength=initial), at=T0)
    else:
        mark = written(Warning(scope="ops", topic="t", initial_strength=initial), at=T0)
    assert compute_strength(mark, T0 + t1 + dt, DECAY) <= compute_strength(mark, T0 + t1, DECAY)


@given(t1=times, t2=times, initial=strengths)
def test_action_permanence(t1, t2, initial):
    """P2: an action's base strength is constant."""
    mark = written(Action(scope="ops", action="did", initial_strength=initial))
    assert compute_strength(mark, T0 + t1) == compute_strength(mark, T0 + t2) == initial


def test_convergence():
    """P3: observations and warnings fade to 0."""
    marks = [written(observation()), written(Warning(scope="ops", topic="t"))]
    late = T0 + 1e6
    assert sum(compute_strength(m, late, DECAY) for m in marks) < 1e-12


@given(dt=st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_intent_expiry(dt):
    """P4: intent strength is 0 after created_at + ttl, full before."""
    mark = written(Intent(scope="ops", resource="r", action="a"))
    strength = compute_strength(mark, T0 + dt, DECAY)
    assert strength == (1.0 if dt <= DECAY.intent_ttl else 0.0)


@given(t=times)
def test_need_persistence(t):
    """P5: an unresolved need keeps its initial strength; a resolved one is 0."""
    need = written(Need(scope="ops", question="q", initial_strength=0.7))
    assert compute_strength(need, T0 + t) == 0.7
    assert compute_strength(need.model_copy(update={"resolved_by": uuid.uuid4()}), T0) == 0.0


@given(t=times, initial=strengths)
def test_trust_ordering_and_bounds(t, initial):
    """P6, P7: fleet >= verified >= unverified, all within [0, decayed strength]."""
    marks = [written(observation(initial_strength=initial, source=s)) for s in Source]
    values = [effective_strength(m, T0 + t, DECAY) for m in marks]
    assert values[0] >= values[1] >= values[2] >= 0.0
    assert values[0] <= compute_strength(marks[0], T0 + t, DECAY) <= initial
    assert trust_weight(None) == trust_weight(Intent(scope="s", resource="r", action="a")) == 1.0


def test_negative_age_does_not_amplify():
    """P7: a clock set before created_at counts as age 0, never above initial strength."""
    mark = written(observation(initial_strength=0.5), at=T0)
    assert compute_strength(mark, T0 - 1000, DECAY) == 0.5


# ----------------------------------------------------------------- reinforcement


@given(s=st.floats(min_value=1e-6, max_value=10), n=st.integers(min_value=2, max_value=50))
def test_reinforce_sublinear(s, n):
    """P8: n identical marks aggregate to less than n times one."""
    assert reinforce([s] * n) < n * s


@given(st.lists(st.floats(min_value=0, max_value=100), max_size=60))
def test_reinforce_bounded(values):
    """P9: the aggregate never exceeds the cap."""
    assert reinforce(values) <= 2.0


@given(st.lists(st.floats(min_value=0, max_value=5), max_size=30), st.floats(1e-9, 5))
def test_reinforce_monotonic_addition(values, extra):
    """P10: adding a positive-strength mark never lowers the aggregate."""
    assert reinforce([*values, extra]) >= reinforce(values)


# ----------------------------------------------------------------- conflicts

intent_lists = st.lists(
    st.builds(
        lambda c, t: written(Intent(scope="ops", resource="r", action="a", confidence=c), T0 + t),
        st.floats(min_value=0, max_value=1),
        st.sampled_from([0.0, 1.0, 2.0]),
    ),
    min_size=1,
    max_size=8,
)


@given(intent_lists, st.randoms())
def test_resolve_conflict_deterministic(intents, rnd):
    """P11, P12: the winner does not depend on input order, and one always exists for
    FIRST_WRITER and HIGHEST_CONFIDENCE."""
    shuffled = list(intents)
    rnd.shuffle(shuffled)
    for policy in (ConflictPolicy.FIRST_WRITER, ConflictPolicy.HIGHEST_CONFIDENCE):
        winner = resolve_conflict(intents, policy)
        assert winner is not None and winner == resolve_conflict(shuffled, policy)


@given(intent_lists)
def test_resolve_conflict_policies(intents):
    """P15: HIGHEST_CONFIDENCE picks the top confidence (earliest on ties); FIRST_WRITER
    the earliest (created_at, id); YIELD_ALL names no winner (the principal decides, as in
    the package), and its lone intent proceeds (§6.1 step 2: no conflict, `winning_intent`)."""
    best = resolve_conflict(intents, ConflictPolicy.HIGHEST_CONFIDENCE)
    top = max(i.confidence for i in intents)
    winner = next(i for i in intents if i.id == best)
    assert winner.confidence == top
    assert winner.created_at == min(i.created_at for i in intents if i.confidence == top)
    first = min(intents, key=lambda i: (i.created_at, i.id))
    assert resolve_conflict(intents, ConflictPolicy.FIRST_WRITER) == first.id
    assert resolve_conflict(intents, ConflictPolicy.YIELD_ALL) is None
    lone = winning_intent(intents, ConflictPolicy.YIELD_ALL)
    assert lone == (intents[0] if len(intents) == 1 else None)
    assert resolve_conflict([], ConflictPolicy.FIRST_WRITER) is None


# ----------------------------------------------------------------- projection and warnings


@pytest.mark.parametrize(
    "mark",
    [
        Intent(scope="s", resource="r", action="a", confidence=0.4),
        Action(scope="s", resource="r", action="a", result={"x": 1}, failed=True),
        Observation(scope="s", topic="t", content={"x": 1}, source=Source.EXTERNAL_VERIFIED),
        Warning(scope="s", topic="t", reason="why", invalidates=uuid.uuid4()),
        Need(scope="s", question="q?", context={"x": 1}, priority=0.9, blocking=True),
    ],
)
def test_projection_preserves_structure(mark):
    """P24: projection keeps every structural and coordination field, redacts content only,
    and sets projected=True."""
    stored = written(mark)
    projected = project_mark(stored)
    assert projected.projected is True
    content = CONTENT_FIELDS[stored.mark_type]
    for name in type(stored).model_fields:
        if name in content:
            assert getattr(projected, name) == REDACTED[name]
        elif name != "projected":
            assert getattr(projected, name) == getattr(stored, name)


@given(dt=times)
def test_invalidation_bound_and_recovery(dt):
    """P34, P35: a warning never takes strength below 0, and the target recovers as the
    warning decays."""
    target = written(Action(scope="ops", action="did"))
    warning = written(Warning(scope="ops", topic="t", invalidates=target.id), at=T0)
    now = T0 + dt
    value = effective_strength_with_warnings(target, [warning], now, DECAY)
    assert 0.0 <= value <= 1.0
    later = effective_strength_with_warnings(target, [warning], now + 10, DECAY)
    assert later >= value
    unrelated = written(Warning(scope="ops", topic="t", invalidates=uuid.uuid4()))
    assert effective_strength_with_warnings(target, [unrelated], now, DECAY) == 1.0


# ----------------------------------------------------------------- the space: writes


def test_write_assigns_fields(space, agent):
    """P31, P32, §8.1: a write gets a fresh id (a version-8 UUID increasing in write order, so
    marks of one created_at order as written), the writer's id and created_at = now."""
    ids = [
        space.write(agent, observation(id=uuid.uuid4(), agent_id=uuid.uuid4())) for _ in range(50)
    ]
    assert len(set(ids)) == 50 and ids == sorted(ids)
    stored = space.get(ids[0])
    assert stored.agent_id == agent.id and stored.created_at == T0 and stored.id.version == 8


def test_created_at_monotonic_even_when_clock_steps_back(space, agent):
    """P32: created_at never decreases; (created_at, id) totally orders marks."""
    stamps = []
    for t in [T0 + 5, T0 + 1, T0 + 7, T0 + 7, T0 - 100]:
        space.set_clock(t)
        stamps.append(space.get(space.write(agent, observation())).created_at)
    assert stamps == sorted(stamps) and stamps[-1] == T0 + 7


BAD_WRITES = [
    ("unknown scope", lambda: observation(scope="nowhere"), UnknownScope),
    ("unauthorized", lambda: observation(scope="ops"), UnauthorizedWrite),
    ("intent verb", lambda: Intent(scope="calendar", resource="r", action="eat"), InvalidMark),
    ("action verb", lambda: Action(scope="calendar", action="ate"), InvalidMark),
    ("obs topic", lambda: observation(scope="calendar", topic="busy"), InvalidMark),
    ("warn topic", lambda: Warning(scope="calendar", topic="fresh"), InvalidMark),
    (
        "smuggled confidence",
        lambda: Intent(scope="ops", resource="r", action="a").model_copy(
            update={"confidence": 3.0}
        ),
        InvalidMark,
    ),
    (
        "smuggled strength",
        lambda: observation().model_copy(update={"initial_strength": -2.0}),
        InvalidMark,
    ),
    ("projected", lambda: project_mark(observation()), InvalidMark),
    ("not a mark", lambda: {"scope": "ops"}, InvalidMark),
]


@pytest.mark.parametrize(("what", "build", "error"), BAD_WRITES, ids=[b[0] for b in BAD_WRITES])
def test_rejected_write_stores_nothing(space, agent, what, build, error):
    """P19 and bad input: a refused write raises its typed error and changes nothing (no
    mark, no hook call, no subscription delivery)."""
    space.write(agent, observation())
    before = space.all_marks()
    calls = []
    space.add_write_hook(lambda *a: calls.append(a))
    watcher = writer("ops", name="watcher")
    space.subscribe(watcher, [WatchPattern(scope="ops"), WatchPattern(scope="calendar")])
    who = writer("hr", name="outsider") if what == "unauthorized" else agent
    with pytest.raises(error):
        space.write(who, build())
    assert space.all_marks() == before and calls == []
    assert space.get_watched_marks(watcher) == []


def test_write_rejects_non_agent(space):
    """P19: only an Agent can write."""
    with pytest.raises(InvalidArgument):
        space.write("alice", observation())
    assert len(space) == 0


def test_write_many_all_or_nothing(space, agent):
    """P19 / bad input: write_many stores every mark or none."""
    with pytest.raises(InvalidMark):
        space.write_many(agent, [observation(), observation(scope="calendar", topic="busy")])
    assert len(space) == 0
    ids = space.write_many(agent, [observation(), observation()])
    assert [m.id for m in space.all_marks()] == ids


def test_hierarchical_write_authorization(space):
    """P23: permission for "ops" covers "ops/a/b"; not "opsx" nor the parent."""
    child = writer("ops/a")
    space.write(writer("ops"), observation(scope="ops/a/b"))
    space.write(child, observation(scope="ops/a"))
    with pytest.raises(UnauthorizedWrite):
        space.write(child, observation(scope="ops"))
    space.register_scope(scope("opsx"))
    with pytest.raises(UnauthorizedWrite):
        space.write(writer("ops"), observation(scope="opsx"))


# ----------------------------------------------------------------- the space: reads


def test_read_filters_and_order(space, agent):
    """P27, §8.2: reads filter by resource/topic/type, strongest first; a read of "ops"
    includes its nested scope "ops/child" (the package's hierarchical read), read_exact
    reads "ops" alone."""
    weak = space.write(agent, observation(initial_strength=0.3))
    strong = space.write(agent, observation(initial_strength=0.9))
    space.write(agent, observation(topic="other"))
    child = space.write(agent, observation(scope="ops/child", initial_strength=0.6))
    space.write(agent, Intent(scope="ops", resource="r", action="a"))
    assert [m.id for m in space.read("ops", topic="t")] == [strong, child, weak]
    assert [m.id for m in space.read_exact("ops", topic="t")] == [strong, weak]
    assert [m.mark_type for m in space.read("ops", resource="r")] == [MarkType.INTENT]
    assert len(space.read("ops", mark_type="observation")) == 4
    assert len(space.read("ops")) == 5
    assert len(space.read_exact("ops")) == 4
    assert len(space.read("ops/child")) == 1
    assert space.read("ops", topic="t", min_strength=0.5)[0].id == strong


def test_read_unknown_scope(space):
    """§8.2: reading a scope with no definition (nor ancestor) is a typed error."""
    with pytest.raises(UnknownScope):
        space.read("nowhere")


def test_read_purity(space, agent):
    """P28: reads do not change stored marks, even of expired intents."""
    space.write(agent, Intent(scope="ops", resource="r", action="a"))
    space.write(agent, observation())
    before = space.all_marks()
    space.set_clock(T0 + 1e5)
    for _ in range(3):
        space.read("ops", min_strength=0.0)
        space.read("ops", resource="r")
        space.active_marks()
    assert space.all_marks() == before
    space.set_clock(T0)
    assert len(space.read("ops")) == 2


def test_visibility_levels(space, agent):
    """P20, P21, P22, P25, P26: OPEN full, PROTECTED projected, CLASSIFIED empty for an
    unauthorized reader; full for authorized readers (hierarchically) and reader=None;
    an undefined child scope inherits its parent's visibility."""
    for name in ("ops", "hr", "hr/team", "legal"):
        space.write(agent, observation(scope=name, content={"secret": 1}))
    stranger = Agent(name="stranger")
    insider = Agent(name="insider", read_scopes=("hr", "legal"))
    assert space.read("ops", reader=stranger)[0].content == {"secret": 1}
    [projected] = space.read("hr/team", reader=stranger)
    assert projected.projected and projected.content is None and projected.topic == "t"
    assert space.read("legal", reader=stranger) == []
    for name in ("hr", "hr/team", "legal"):
        assert space.read(name, reader=insider)[0].content == {"secret": 1}
        assert space.read(name)[0].projected is False


def test_strength_with_supersession_chain(space, agent):
    """P47: if C supersedes B and B supersedes A, only C is visible."""
    a = space.write(agent, observation())
    b = space.write(agent, observation(supersedes=a))
    c = space.write(agent, observation(supersedes=b))
    assert [m.id for m in space.read("ops", topic="t")] == [c]
    assert space.strength_of(space.get(a)) == space.strength_of(space.get(b)) == 0.0


def test_warning_invalidation_in_space(space, agent):
    """P34, P35 via the space: a live warning cancels its target; as it decays the target
    comes back; superseding the warning lifts it at once."""
    target = space.write(agent, Action(scope="ops", action="did"))
    warning = space.write(agent, Warning(scope="ops", topic="t", invalidates=target))
    assert space.strength_of(space.get(target)) == 0.0
    assert space.read("ops", mark_type="action") == []
    space.set_clock(T0 + DECAY.warning_half_life)
    assert space.strength_of(space.get(target)) == pytest.approx(0.5)
    space.write(agent, Warning(scope="ops", topic="t", supersedes=warning))
    assert space.strength_of(space.get(target)) == 1.0


def test_intent_expires_in_reads(space, agent):
    """P4, P13 via the space: an intent vanishes from reads after its TTL."""
    space.write(agent, Intent(scope="ops", resource="r", action="a"))
    space.set_clock(T0 + DECAY.intent_ttl)
    assert len(space.read("ops", resource="r")) == 1
    space.set_clock(T0 + DECAY.intent_ttl + 0.001)
    assert space.read("ops", resource="r") == []


def test_decay_config_fixed_at_write(space, agent):
    """P1/P36 across re-registration: a mark keeps the DecayConfig it was written under."""
    mark_id = space.write(agent, observation())
    space.register_scope(scope("ops", decay=DecayConfig(observation_half_life=1.0)))
    space.set_clock(T0 + DECAY.observation_half_life)
    assert space.strength_of(space.get(mark_id)) == pytest.approx(0.5)


def test_reads_use_indexes_not_scans(space, agent, monkeypatch):
    """Issue 4 benchmark goal: a read computes strength only for its own bucket's marks,
    not for the whole space."""
    batch = [observation(topic=f"t{i % 200}") for i in range(4000)]
    batch += [Intent(scope="ops", resource=f"r{i % 200}", action="a") for i in range(4000)]
    space.write_many(agent, batch)
    calls = []
    real = space_module.compute_strength
    monkeypatch.setattr(space_module, "compute_strength", lambda *a: calls.append(1) or real(*a))
    assert len(space.read("ops", topic="t7")) == 20
    assert len(space.read("ops", resource="r7")) == 20
    assert len(calls) == 40


def test_old_marks_are_skipped_by_time(space, agent, monkeypatch):
    """Issue 4 benchmark goal: decayed observations and expired intents are bisected past,
    so history does not slow reads down (P28: nothing is deleted)."""
    for i in range(300):
        space.set_clock(T0 + i * 10)
        space.write(agent, observation())
        space.write(agent, Intent(scope="ops", resource="r", action="a"))
    calls = []
    real = space_module.compute_strength
    monkeypatch.setattr(space_module, "compute_strength", lambda *a: calls.append(1) or real(*a))
    space.read("ops", topic="t")  # 0.01 is reached after log2(100) ~ 6.6 half-lives
    assert len(calls) <= 70
    calls.clear()
    assert len(space.read("ops", resource="r")) == 4  # ttl 30 s, one intent per 10 s
    assert len(calls) <= 5
    assert len(space.all_marks()) == 600


def _reference_read(space, name, resource, topic, kind, min_strength, nested=True):
    """What read must return, by brute force over every mark (the scope and, if `nested`,
    the scopes under it)."""
    out = []
    superseded = {m.supersedes for m in space.all_marks()}
    for mark in space.all_marks():
        inside = mark.scope == name or (nested and mark.scope.startswith(name + "/"))
        if not inside or (kind is not None and mark.mark_type != kind):
            continue
        if resource is not None and getattr(mark, "resource", None) != resource:
            continue
        if topic is not None and getattr(mark, "topic", None) != topic:
            continue
        strength = space.strength_of(mark)
        # §8.2: strength >= min_strength; §10: never a superseded mark (at 0 the rest count)
        if strength >= min_strength and (strength > 0 or mark.id not in superseded):
            out.append((-strength, mark.created_at, mark.id.int, mark.id))
    return [entry[-1] for entry in sorted(out)]


def test_indexed_reads_match_brute_force():
    """P27, P28, P47 and the index: random writes, supersessions, warnings, resolutions and
    clock moves; every indexed read equals a brute-force scan."""
    rnd = random.Random(4)
    decays = [DECAY, DecayConfig(observation_half_life=7, warning_half_life=3, intent_ttl=11)]
    space = MarkSpace(scopes=[scope("a"), scope("b", decay=decays[1])], clock=T0)
    agent = writer("a", "b")
    ids: list[uuid.UUID] = []
    now = T0
    for step in range(1500):
        name = rnd.choice(["a", "b", "a/c"])
        roll = rnd.random()
        strength = rnd.choice([0.0, 0.02, 0.5, 1.0, 3.0])
        prior = rnd.choice(ids) if ids and rnd.random() < 0.15 else None
        if roll < 0.3:
            mark = observation(
                scope=name,
                topic=rnd.choice("xyz"),
                initial_strength=strength,
                source=rnd.choice(list(Source)),
                supersedes=prior,
            )
        elif roll < 0.5:
            mark = Intent(scope=name, resource=rnd.choice("pq"), action="go", supersedes=prior)
        elif roll < 0.65:
            mark = Action(scope=name, resource=rnd.choice("pq"), action="did", supersedes=prior)
        elif roll < 0.8:
            mark = Warning(
                scope=name,
                topic=rnd.choice("xyz"),
                invalidates=rnd.choice(ids) if ids else None,
                initial_strength=strength,
            )
        else:
            mark = Need(scope=name, question="q")
        ids.append(space.write(agent, mark))
        if roll > 0.95:
            needs = space.read(name, mark_type="need", min_strength=ALIVE)  # open ones
            if needs:  # resolved by a stored action, as the package requires
                done = space.write(agent, Action(scope=name, resource="p", action="did"))
                space.resolve(needs[0].id, done)
        if step % 7 == 0:
            now += rnd.choice([0.0, 1.0, 5.0, 40.0])
            space.set_clock(now)
        if step % 25 == 0:
            for probe in itertools.product(
                ["a", "b", "a/c"],
                [None, "p"],
                [None, "x"],
                [None, MarkType.OBSERVATION, MarkType.INTENT],
                [0.0, 0.01, 0.4],
            ):
                got = [m.id for m in space.read(*probe)]
                assert got == _reference_read(space, *probe), probe
                if probe[-1] == 0.01:  # the exact read too, on a third of the probes
                    exact = [m.id for m in space.read_exact(*probe)]
                    assert exact == _reference_read(space, *probe, nested=False), probe


# ----------------------------------------------------------------- needs


def test_resolve_need(space, agent):
    """P29, P30, §8.3: resolve writes a superseding copy; the need's strength is 0 at once,
    the original is unchanged, and it cannot be resolved twice."""
    need_id = space.write(agent, Need(scope="ops", question="Which room?", blocking=True))
    action_id = space.write(agent, Action(scope="ops", action="answered"))
    original = space.get(need_id)
    copy_id = space.resolve(need_id, action_id)
    copy = space.get(copy_id)
    assert copy.resolved_by == action_id and copy.supersedes == need_id
    assert copy.agent_id == agent.id and space.get(need_id) == original
    assert space.read("ops", mark_type="need", min_strength=ALIVE) == []
    # at 0 the resolved copy (strength 0, not superseded) is read, never the need (§8.2, §10)
    assert [m.id for m in space.read("ops", mark_type="need", min_strength=0.0)] == [copy_id]
    assert space.aggregate_needs() == []
    with pytest.raises(InvalidMark):
        space.resolve(need_id, action_id)
    with pytest.raises(UnknownMark):
        space.resolve(uuid.uuid4(), action_id)
    with pytest.raises(InvalidMark):
        space.resolve(action_id, action_id)


def test_aggregate_needs(space, agent):
    """§8.4: needs cluster by scope (as the markspace package: every question of a scope is
    "similar"); priority max + log(n) * 0.1, at most 1.0; sorted by it, descending."""
    for priority in (0.2, 0.6):
        space.write(agent, Need(scope="ops", question="Which room?", priority=priority))
    space.write(agent, Need(scope="ops", question="Another thing", priority=0.1, blocking=True,
                            context={"k": 1}))
    space.write(agent, Need(scope="hr", question="Budget?", priority=0.7))
    clusters = space.aggregate_needs()
    assert [c.scope for c in clusters] == ["ops", "hr"]
    assert clusters[0].effective_priority == pytest.approx(0.6 + math.log(3) * 0.1)
    assert clusters[0].blocking_count == 1
    assert clusters[0].contexts == [None, None, {"k": 1}]
    assert [n.priority for n in clusters[0].needs] == [0.2, 0.6, 0.1]  # in write order
    space.write(agent, Need(scope="hr", question="More?", priority=0.98))
    assert space.aggregate_needs()[0].effective_priority == 1.0  # capped
    assert cluster_needs([]) == []


# ----------------------------------------------------------------- hooks


def test_hooks_non_interference(space, agent):
    """P33, §8.6: hooks get (agent_id, stored mark); a failing hook changes nothing; hooks
    added or removed while firing do not affect the current dispatch; removal by handle."""
    seen = []

    def adder(agent_id, mark):
        seen.append(("adder", agent_id, mark.id))
        space.add_write_hook(lambda *a: seen.append(("late",)))

    space.add_write_hook(lambda *a: 1 / 0)
    handle = space.add_write_hook(adder)
    mark_id = space.write(agent, observation())
    assert seen == [("adder", agent.id, mark_id)]
    assert space.read("ops")[0].id == mark_id
    assert space.remove_write_hook(handle) and not space.remove_write_hook(handle)


def test_hooks_fire_outside_the_lock(space, agent):
    """§8.6: a hook may use the space from another thread without deadlock."""
    results = []

    def hook(agent_id, mark):
        worker = threading.Thread(target=lambda: results.append(len(space.read("ops"))))
        worker.start()
        worker.join(5)

    space.add_write_hook(hook)
    space.write(agent, observation())
    assert results == [1]


# ----------------------------------------------------------------- subscriptions


def test_subscriptions(space, agent):
    """P48–P52, §13.4: prospective, only matching, write order, at most once with clear,
    preserved without clear, no self-delivery, replaced by re-subscribe."""
    reader = writer("ops", name="reader")
    space.write(agent, observation(topic="before"))
    space.subscribe(reader, [WatchPattern(scope="ops", mark_type=MarkType.OBSERVATION)])
    first = space.write(agent, observation(topic="a"))
    space.write(agent, Intent(scope="ops", resource="r", action="a"))
    space.write(reader, observation(topic="own"))
    second = space.write(agent, observation(scope="ops/sub", topic="b"))
    assert [m.id for m in space.get_watched_marks(reader, clear=False)] == [first, second]
    assert [m.id for m in space.get_watched_marks(reader)] == [first, second]
    assert space.get_watched_marks(reader) == []
    space.write(agent, observation(topic="queued"))
    space.subscribe(reader, [WatchPattern(scope="ops", topic="new")])
    space.subscribe(reader, [WatchPattern(scope="ops", topic="new")])
    assert space.get_watched_marks(reader) == []
    third = space.write(agent, observation(topic="new"))
    assert [m.id for m in space.get_watched_marks(reader)] == [third]
    space.unsubscribe(reader)
    space.write(agent, observation(topic="new"))
    assert space.get_watched_marks(reader) == []
    with pytest.raises(InvalidArgument):
        space.subscribe(reader, [])


def test_subscriptions_follow_visibility(space, agent):
    """P21, P22 for deliveries: projected in PROTECTED, nothing in CLASSIFIED."""
    stranger = Agent(name="stranger")
    space.subscribe(stranger, [WatchPattern(scope="hr"), WatchPattern(scope="legal")])
    space.write(agent, observation(scope="hr", content={"pay": 1}))
    space.write(agent, observation(scope="legal", content={"case": 1}))
    [delivered] = space.get_watched_marks(stranger)
    assert delivered.projected and delivered.scope == "hr" and delivered.content is None


@given(
    pattern=st.builds(
        WatchPattern,
        scope=st.sampled_from(["ops", "ops/a", "hr"]),
        mark_type=st.none() | st.sampled_from(ALL_TYPES),
        topic=st.none() | st.sampled_from(["t", "u"]),
        resource=st.none() | st.sampled_from(["r", "s"]),
    ),
    mark=st.sampled_from(
        [
            observation(scope="ops/a/b", topic="t"),
            Intent(scope="ops", resource="r", action="a"),
            Action(scope="hr", action="x"),
            Warning(scope="ops/a", topic="u"),
        ]
    ),
)
def test_pattern_match_pure(pattern, mark):
    """P55, §13.1: matching is a pure field comparison, hierarchical in scope."""
    before = (pattern.model_dump(), mark.model_dump())
    result = pattern.matches(mark)
    assert result == pattern.matches(mark)
    assert before == (pattern.model_dump(), mark.model_dump())
    expected = (
        (mark.scope == pattern.scope or mark.scope.startswith(pattern.scope + "/"))
        and pattern.mark_type in (None, mark.mark_type)
        and pattern.topic in (None, getattr(mark, "topic", None))
        and pattern.resource in (None, getattr(mark, "resource", None))
    )
    assert result == expected


# ----------------------------------------------------------------- composition


def manifest_agent(name, scopes, inputs=(), outputs=()):
    return Agent(
        name=name,
        scopes={s: ALL_TYPES for s in scopes},
        manifest=AgentManifest(inputs=inputs, outputs=outputs),
    )


def test_validate_pipeline():
    """P53: pipeline validation depends on manifests only (no space involved)."""
    sensor = manifest_agent("sensor", ["sensors"], outputs=[("sensors/temp", "observation")])
    analyst = manifest_agent(
        "analyst",
        ["alerts"],
        inputs=[WatchPattern(scope="sensors", mark_type=MarkType.OBSERVATION)],
        outputs=[("alerts", MarkType.WARNING)],
    )
    pager = manifest_agent("pager", [], inputs=[WatchPattern(scope="alerts")])
    assert validate_pipeline([sensor, analyst, pager]) == []
    assert validate_pipeline([]) == validate_pipeline([sensor]) == []
    assert len(validate_pipeline([sensor, pager])) == 1
    assert len(validate_pipeline([pager, analyst])) == 1
    assert validate_pipeline([sensor, Agent(name="bare")]) == ["agent 'bare' has no manifest"]


def test_validate_manifest_permissions():
    """P54: every declared output must be covered by a write permission (hierarchically)."""
    ok = manifest_agent("ok", ["weather"], outputs=[("weather/eu", MarkType.OBSERVATION)])
    assert validate_manifest_permissions(ok) == []
    bad = Agent(
        name="bad",
        scopes={"weather": ["observation"]},
        manifest=AgentManifest(outputs=[("weather", "action"), ("news", "observation")]),
    )
    assert len(validate_manifest_permissions(bad)) == 2
    assert validate_manifest_permissions(Agent(name="plain")) == []


# ----------------------------------------------------------------- scheduling


def scheduled(name, interval):
    return Agent(name=name, manifest=AgentManifest(schedule_interval=interval))


def test_scheduler_without_real_time():
    """P56, §14.2: new agents are due at once; tick_all activates; the next activation is
    at least schedule_interval later; update keeps the last activation."""
    clock = [T0]
    sched = Scheduler(clock=lambda: clock[0])
    fast, slow = scheduled("fast", 10.0), scheduled("slow", 60.0)
    sched.register(fast)
    sched.register(slow)
    sched.register(Agent(name="unscheduled"))
    assert sched.due() == [fast, slow]
    assert sched.tick_all() == [fast, slow] and sched.due() == []
    clock[0] += 9.999
    assert sched.tick_all() == []
    clock[0] = T0 + 10
    assert sched.tick_all() == [fast]
    slower = scheduled("slow", 120.0).model_copy(update={"id": slow.id})
    sched.update(slower)
    clock[0] = T0 + 61
    assert sched.due() == [fast]
    clock[0] = T0 + 120
    assert sched.tick_all() == [fast, slower]
    sched.update(Agent(id=fast.id, name="fast"))
    assert sched.scheduled() == [slower]


@given(st.lists(st.floats(min_value=0, max_value=50), min_size=1, max_size=40))
def test_scheduler_interval_property(steps):
    """P56: for all clock advances, consecutive activations are >= interval apart."""
    now = [T0]
    sched = Scheduler(clock=lambda: now[0])
    agent = scheduled("a", 15.0)
    sched.register(agent)
    activations = []
    for step in steps:
        now[0] += step
        if sched.tick_all():
            activations.append(now[0])
    assert all(b - a >= 15.0 for a, b in itertools.pairwise(activations))


def test_scheduler_background_loop():
    """§14.2: start/stop run tick_all on a timer and pass due agents to on_due."""
    sched = Scheduler(clock=T0)
    sched.register(scheduled("a", 1000.0))
    got = threading.Event()
    sched.start(0.01, on_due=lambda agents: got.set())
    try:
        assert got.wait(5)
    finally:
        sched.stop()
    assert not sched.running


# ----------------------------------------------------------------- concurrency


def test_concurrent_writes_unique_and_ordered(space):
    """P31, P32 under threads: ids unique, created_at non-decreasing in write order."""
    agents = [writer("ops", name=f"w{i}") for i in range(8)]
    space.set_clock(None)

    def work(agent):
        for _ in range(200):
            space.write(agent, observation())

    threads = [threading.Thread(target=work, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks = space.all_marks()
    assert len({m.id for m in marks}) == len(marks) == 1600
    stamps = [m.created_at for m in marks]
    assert stamps == sorted(stamps)


def test_lock_is_per_key_and_reentrant(space):
    """§9.2 guard serialization: one lock per (scope, resource), re-entrant per thread;
    another key is never blocked by it."""
    other_done = threading.Event()
    with space.lock("ops", "r"), space.lock("ops", "r"):

        def other_key():
            with space.lock("ops", "s"):
                other_done.set()

        worker = threading.Thread(target=other_key)
        worker.start()
        assert other_done.wait(5)
        worker.join()
        blocked = threading.Event()

        def same_key():
            with space.lock("ops", "r"):
                blocked.set()

        waiter = threading.Thread(target=same_key)
        waiter.start()
        assert not blocked.wait(0.1)
    assert blocked.wait(5)
    waiter.join()
