"""The mandatory properties of the Markspace spec (§15: P1–P39 and P47), on both backends.

Every test names its property (``test_p<N>_...``) and quotes it in its docstring. The
``backend`` fixture runs each test on the in-memory ``MarkSpace`` and on
``PostgresMarkSpace`` (a fresh space name per space, one database per module). Where the spec
states a "for all", the test is a hypothesis test; each example builds its own space with a
fixed clock at ``T0`` that the test moves with ``set_clock``.

Where the spec leaves room the tests follow the readings the implementation documents (module
docstrings of agentpost.marks, docs/design.md): ``read(scope)`` reads the exact scope; a read
never returns marks of strength 0; read authorization comes from ``read_scopes`` only; an
intent is at full strength while its age is <= its TTL; ``resolve_all_deferred`` is the
harness's resolution boundary (P16).
"""

from __future__ import annotations

import itertools
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentpost.marks import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Guard,
    Intent,
    InvalidMark,
    MarkType,
    Need,
    Observation,
    Scope,
    ScopeVisibility,
    Severity,
    Source,
    UnauthorizedWrite,
    Verdict,
    Warning,
    compute_strength,
    hours,
    minutes,
    project_mark,
    reinforce,
    resolve_conflict,
)
from agentpost.marks.core import REINFORCEMENT_CAP
from marks_backends import ALIVE, T0, SpaceFactory

# --------------------------------------------------------------------------- fixtures


def for_all(max_examples: int = 40) -> settings:
    """Hypothesis settings of this module: modest example counts, no deadline (Postgres
    round trips), and the function-scoped ``new_space`` fixture is fine (each example
    builds its own space)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# --------------------------------------------------------------------------- vocabulary

OBS_HALF_LIFE = hours(1)
WARN_HALF_LIFE = minutes(20)
TTL = minutes(30)
DECAY = DecayConfig(
    observation_half_life=OBS_HALF_LIFE, warning_half_life=WARN_HALF_LIFE, intent_ttl=TTL
)
ALL_TYPES = ("intent", "action", "observation", "warning", "need")
HALF_LIFE = {MarkType.OBSERVATION: OBS_HALF_LIFE, MarkType.WARNING: WARN_HALF_LIFE}
# fields a projected read keeps (§7.4 / P24) and the content fields it redacts
STRUCTURAL = (
    "id", "mark_type", "agent_id", "scope", "created_at", "initial_strength", "supersedes",
)
COORDINATION = (
    "resource", "action", "topic", "confidence", "severity", "priority", "blocking", "source",
    "invalidates", "resolved_by",
)
CONTENT = {
    MarkType.INTENT: {},
    MarkType.ACTION: {"result": None},
    MarkType.OBSERVATION: {"content": None},
    MarkType.WARNING: {"reason": ""},
    MarkType.NEED: {"question": "", "context": None},
}


def make_scope(name: str = "cal", **overrides: Any) -> Scope:
    fields: dict[str, Any] = {
        "name": name,
        "allowed_intent_verbs": ("book",),
        "allowed_action_verbs": ("booked",),
        "decay": DECAY,
        "conflict_policy": ConflictPolicy.FIRST_WRITER,
    }
    fields.update(overrides)
    return Scope(**fields)


def make_agent(
    name: str,
    scopes: tuple[str, ...] = ("cal",),
    types: tuple[str, ...] = ALL_TYPES,
    read_scopes: tuple[str, ...] = (),
) -> Agent:
    return Agent(name=name, scopes={s: list(types) for s in scopes}, read_scopes=read_scopes)


WRITER = make_agent("writer")
OTHER = make_agent("other")


def put(space: Any, agent: Agent, mark: Any) -> Any:
    """Write ``mark`` and return the stored mark."""
    stored = space.get(space.write(agent, mark))
    assert stored is not None
    return stored


def at(space: Any, age: float) -> None:
    """Move the space's clock to ``T0 + age``."""
    space.set_clock(T0 + age)


def ids(marks: list[Any]) -> list[uuid.UUID]:
    return [m.id for m in marks]


def snapshot(space: Any, scopes: tuple[str, ...] = ("cal",)) -> dict[str, Any]:
    """Everything a reader can observe of the space now, for "nothing changed" checks."""
    return {
        "active": [m.model_dump() for m in space.active_marks()],
        "reads": {s: [m.model_dump() for m in space.read(s, min_strength=0.0)] for s in scopes},
    }


# --------------------------------------------------------------------------- strategies

NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
UNIT = st.floats(0.0, 1.0)
INITIAL = st.floats(0.0, 10.0)
POSITIVE = st.floats(0.05, 10.0)
SOURCES = st.sampled_from(list(Source))
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=8,
)
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_OBJECT = st.dictionaries(
    TEXT,
    st.recursive(
        JSON_LEAF,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=6,
    ),
    max_size=3,
)


@st.composite
def any_mark(draw: st.DrawFn, scope: str = "cal", initial: st.SearchStrategy = INITIAL) -> Any:
    """A valid mark of any of the five types for ``scope`` (allowed verbs, any topic)."""
    common = {"scope": scope, "initial_strength": draw(initial)}
    kind = draw(st.sampled_from(list(MarkType)))
    if kind is MarkType.INTENT:
        return Intent(resource=draw(NAMES), action="book", confidence=draw(UNIT), **common)
    if kind is MarkType.ACTION:
        return Action(
            resource=draw(st.none() | NAMES),
            action="booked",
            result=draw(JSON_OBJECT),
            failed=draw(st.booleans()),
            **common,
        )
    if kind is MarkType.OBSERVATION:
        return Observation(
            topic=draw(NAMES),
            content=draw(JSON_OBJECT),
            confidence=draw(UNIT),
            source=draw(SOURCES),
            **common,
        )
    if kind is MarkType.WARNING:
        return Warning(
            topic=draw(NAMES),
            reason=draw(TEXT),
            severity=draw(st.sampled_from(list(Severity))),
            **common,
        )
    return Need(
        question=draw(TEXT),
        context=draw(JSON_OBJECT),
        priority=draw(UNIT),
        blocking=draw(st.booleans()),
        **common,
    )


def transient(kind: MarkType, initial: float, source: Source = Source.FLEET) -> Any:
    if kind is MarkType.OBSERVATION:
        return Observation(scope="cal", topic="t", initial_strength=initial, source=source)
    return Warning(scope="cal", topic="t", reason="r", initial_strength=initial)


# =========================================================================== §3 decay


@for_all()
@given(
    kind=st.sampled_from([MarkType.OBSERVATION, MarkType.WARNING]),
    initial=INITIAL,
    source=SOURCES,
    t1=st.floats(0.0, hours(24 * 30)),
    dt=st.floats(0.0, hours(24 * 30)),
)
def test_p1_decay_monotonicity(new_space, kind, initial, source, t1, dt) -> None:
    """P1: For observation and warning marks, strength MUST be a monotonically non-increasing
    function of time: for all t2 > t1, strength(mark, t2) <= strength(mark, t1). (And, §2.4,
    the decay is exponential: one half-life halves it.)"""
    with new_space.scoped([make_scope()]) as space:
        mark = put(space, WRITER, transient(kind, initial, source))
        at(space, t1)
        s1 = space.strength_of(mark)
        at(space, t1 + dt)
        s2 = space.strength_of(mark)
        assert s2 <= s1
        at(space, t1 + HALF_LIFE[kind])
        assert space.strength_of(mark) == pytest.approx(s1 / 2, rel=1e-6, abs=1e-300)


@for_all()
@given(
    initial=INITIAL,
    failed=st.booleans(),
    ages=st.lists(st.floats(-hours(1), hours(24 * 365 * 50)), min_size=1, max_size=5),
)
def test_p2_action_permanence(new_space, initial, failed, ages) -> None:
    """P2: For non-superseded action marks, base strength MUST be constant: for all t1, t2,
    compute_strength(action, t1) == compute_strength(action, t2). A superseded action's
    effective strength is 0, but its base strength remains unchanged."""
    with new_space.scoped([make_scope()]) as space:
        action = put(
            space, WRITER, Action(scope="cal", resource="r", action="booked", failed=failed,
                                  initial_strength=initial)
        )
        for age in ages:
            at(space, age)
            assert space.strength_of(action) == initial
            assert compute_strength(action, T0 + age, DECAY) == initial
        newer = put(space, WRITER, Action(scope="cal", resource="r", action="booked",
                                          supersedes=action.id))
        for age in ages:
            at(space, age)
            assert space.strength_of(action) == 0.0
            assert compute_strength(space.get(action.id), T0 + age, DECAY) == initial
            assert space.strength_of(newer) == 1.0
        assert space.get(action.id) == action


@for_all(20)
@given(
    marks=st.lists(
        st.tuples(
            st.sampled_from([MarkType.OBSERVATION, MarkType.WARNING]),
            INITIAL,
            SOURCES,
            st.sampled_from(["cal", "slow"]),
            st.floats(0.0, hours(2)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_p3_convergence(new_space, marks) -> None:
    """P3: Given no new marks, the total strength of all transient marks (observations +
    warnings) in the space MUST converge to 0 as t -> infinity."""
    slow = make_scope("slow", decay=DecayConfig(observation_half_life=hours(24 * 7),
                                               warning_half_life=hours(24)))
    writer = make_agent("writer", scopes=("cal", "slow"))
    written = []
    with new_space.scoped([make_scope(), slow]) as space:
        for kind, initial, source, scope, when in marks:
            at(space, when)
            if kind is MarkType.OBSERVATION:
                mark = Observation(scope=scope, topic="t", initial_strength=initial,
                                   source=source)
            else:
                mark = Warning(scope=scope, topic="t", initial_strength=initial)
            written.append(put(space, writer, mark))
        longest = hours(24 * 7)
        totals = []
        for horizon in (hours(2), hours(24), longest, 10 * longest, 100 * longest,
                        1200 * longest):
            at(space, horizon)
            totals.append(math.fsum(space.strength_of(m) for m in written))
        assert all(b <= a for a, b in itertools.pairwise(totals)), totals
        assert totals[-2] < 1e-12
        assert totals[-1] == 0.0
        for scope in ("cal", "slow"):
            assert space.read(scope, min_strength=ALIVE) == []
        assert space.active_marks() == []


@for_all()
@given(
    initial=INITIAL,
    ttl=st.floats(1.0, hours(24)),
    before=st.floats(0.0, 1.0),
    after=st.floats(1e-3, hours(24 * 365)),
)
def test_p4_intent_expiry(new_space, initial, ttl, before, after) -> None:
    """P4: An intent mark's strength MUST be 0 for all t > created_at + ttl (and it is at full
    strength before: §3.1, a step function)."""
    scope = make_scope(decay=DecayConfig(intent_ttl=ttl))
    with new_space.scoped([scope]) as space:
        intent = put(space, WRITER, Intent(scope="cal", resource="r", action="book",
                                           initial_strength=initial))
        at(space, before * (ttl - 1e-3))
        assert space.strength_of(intent) == initial
        at(space, ttl + after)
        assert space.strength_of(intent) == 0.0
        assert space.read("cal", resource="r", min_strength=ALIVE) == []
        # §8.2 excludes strength < min_strength only: at 0 the expired intent is still read
        assert space.read("cal", resource="r", min_strength=0.0) == [intent]
        assert space.active_marks() == []


@for_all()
@given(initial=INITIAL, ages=st.lists(st.floats(0.0, hours(24 * 365 * 50)), min_size=1,
                                      max_size=5))
def test_p5_need_persistence(new_space, initial, ages) -> None:
    """P5: An unresolved need mark's strength MUST equal its initial strength for all t."""
    with new_space.scoped([make_scope()]) as space:
        need = put(space, WRITER, Need(scope="cal", question="q?", initial_strength=initial))
        for age in ages:
            at(space, age)
            assert space.strength_of(need) == initial
            found = space.read("cal", mark_type=MarkType.NEED, min_strength=ALIVE)
            assert ids(found) == ([need.id] if initial > 0 else [])


# =========================================================================== §4 trust


@for_all()
@given(initial=POSITIVE, confidence=UNIT, age=st.floats(0.0, hours(48)))
def test_p6_trust_ordering(new_space, initial, confidence, age) -> None:
    """P6: For two marks with identical properties except source, a mark with a higher-trust
    source MUST have higher effective strength: fleet >= external_verified >=
    external_unverified at every t (strictly, while the base strength is > 0), and reads
    rank them so."""
    with new_space.scoped([make_scope()]) as space:
        by_source = {
            source: put(space, WRITER, Observation(scope="cal", topic="t", confidence=confidence,
                                                   source=source, initial_strength=initial))
            for source in (Source.EXTERNAL_UNVERIFIED, Source.FLEET, Source.EXTERNAL_VERIFIED)
        }
        at(space, age)
        fleet, verified, unverified = (
            space.strength_of(by_source[s])
            for s in (Source.FLEET, Source.EXTERNAL_VERIFIED, Source.EXTERNAL_UNVERIFIED)
        )
        assert fleet > verified > unverified > 0.0
        read = space.read("cal", topic="t", min_strength=0.0)
        assert [m.source for m in read] == [
            Source.FLEET, Source.EXTERNAL_VERIFIED, Source.EXTERNAL_UNVERIFIED,
        ]


@for_all(40)
@given(mark=any_mark(), age=st.floats(-hours(24), hours(24 * 365)))
def test_p7_trust_bounds(new_space, mark, age) -> None:
    """P7: Effective strength MUST be in [0.0, max_strength * 1.0]. Trust weighting MUST NOT
    amplify strength beyond the base decay value (also when the clock is set back before
    the mark's creation)."""
    with new_space.scoped([make_scope()]) as space:
        stored = put(space, WRITER, mark)
        at(space, age)
        strength = space.strength_of(stored)
        assert 0.0 <= strength <= stored.initial_strength
        assert strength <= compute_strength(stored, T0 + age, DECAY)


# =========================================================================== §5 reinforcement


def topic_strengths(space: Any, topic: str = "t") -> list[float]:
    return [space.strength_of(m) for m in space.read("cal", topic=topic, min_strength=0.0)]


@for_all()
@given(n=st.integers(2, 12), initial=POSITIVE, source=SOURCES, age=st.floats(0.0, hours(3)))
def test_p8_sublinearity(new_space, n, initial, source, age) -> None:
    """P8: For N identical marks, aggregate_strength(N marks) < N * single_mark_strength for
    all N > 1."""
    with new_space.scoped([make_scope()]) as space:
        for _ in range(n):
            space.write(WRITER, Observation(scope="cal", topic="t", source=source,
                                            initial_strength=initial))
        at(space, age)
        strengths = topic_strengths(space)
        assert len(strengths) == n
        single = strengths[0]
        assert all(s == single for s in strengths)
        assert reinforce(strengths) < n * single


@for_all()
@given(
    marks=st.lists(st.tuples(st.floats(0.0, 100.0), SOURCES, st.floats(0.0, hours(2))),
                   min_size=1, max_size=15),
    cap=st.floats(0.1, 50.0),
)
def test_p9_boundedness(new_space, marks, cap) -> None:
    """P9: aggregate_strength(any number of marks) <= REINFORCEMENT_CAP (finite)."""
    assert math.isfinite(REINFORCEMENT_CAP)
    with new_space.scoped([make_scope()]) as space:
        for initial, source, when in marks:
            at(space, when)
            space.write(WRITER, Observation(scope="cal", topic="t", source=source,
                                            initial_strength=initial))
        strengths = topic_strengths(space)
        assert reinforce(strengths) <= REINFORCEMENT_CAP
        assert reinforce(strengths, cap=cap) <= cap


@for_all()
@given(
    marks=st.lists(st.tuples(INITIAL, SOURCES), max_size=10),
    new=st.tuples(POSITIVE, SOURCES),
)
def test_p10_monotonic_addition(new_space, marks, new) -> None:
    """P10: Adding a positive-strength mark MUST NOT decrease aggregate strength:
    aggregate(marks + [new]) >= aggregate(marks) when effective_strength(new) > 0."""
    with new_space.scoped([make_scope()]) as space:
        for initial, source in marks:
            space.write(WRITER, Observation(scope="cal", topic="t", source=source,
                                            initial_strength=initial))
        before = topic_strengths(space)
        added = put(space, OTHER, Observation(scope="cal", topic="t", source=new[1],
                                              initial_strength=new[0]))
        assert space.strength_of(added) > 0
        after = topic_strengths(space)
        assert len(after) == len(before) + 1
        assert reinforce(after) >= reinforce(before)


# =========================================================================== §6 conflicts

AGENTS = tuple(make_agent(f"agent-{i}") for i in range(6))
POLICIES = st.sampled_from([ConflictPolicy.HIGHEST_CONFIDENCE, ConflictPolicy.FIRST_WRITER])


def expected_winner(intents: list[Any], policy: ConflictPolicy) -> Any:
    """The policy of §6.1 written out independently: (highest confidence, then) earliest
    created_at, then the lower id (P32's tiebreaker)."""
    if policy is ConflictPolicy.HIGHEST_CONFIDENCE:
        return min(intents, key=lambda i: (-i.confidence, i.created_at, i.id))
    return min(intents, key=lambda i: (i.created_at, i.id))


def guard_for(space: Any) -> Any:
    return Guard(space)


@for_all()
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 5), UNIT, st.sampled_from([0.0, 0.0, 1.0, 30.0])),
        min_size=1,
        max_size=8,
    ),
    policy=POLICIES,
    data=st.data(),
)
def test_p11_determinism(new_space, plan, policy, data) -> None:
    """P11: Given the same set of intent marks, all agents MUST reach the same conclusion
    about which intent wins. The resolution function is pure: resolve(intents) -> winner_id
    (whatever order the intents come in, whoever reads them)."""
    with new_space.scoped([make_scope(conflict_policy=policy)]) as space:
        clock = 0.0
        for index, confidence, step in plan:
            clock += step
            at(space, clock)
            space.write(AGENTS[index],
                        Intent(scope="cal", resource="r", action="book", confidence=confidence))
        seen = [space.read("cal", resource="r", mark_type=MarkType.INTENT, reader=agent)
                for agent in AGENTS]
        assert all(ids(s) == ids(seen[0]) for s in seen)
        intents = seen[0]
        assert len(intents) == len(plan)
        winner = resolve_conflict(intents, policy)
        assert winner == expected_winner(intents, policy).id
        for _ in range(3):
            shuffled = data.draw(st.permutations(intents))
            assert resolve_conflict(shuffled, policy) == winner
        for agent_view in seen:
            assert resolve_conflict(agent_view, policy) == winner


@for_all()
@given(confidences=st.lists(UNIT, min_size=2, max_size=5), policy=POLICIES,
       deferred=st.booleans())
def test_p12_progress(new_space, confidences, policy, deferred) -> None:
    """P12: At least one agent MUST be able to proceed on each contested (scope, resource).
    The protocol MUST NOT deadlock: under HIGHEST_CONFIDENCE and FIRST_WRITER exactly one
    intent wins (the one the policy picks)."""
    scope = make_scope(conflict_policy=policy, deferred=deferred)
    with new_space.scoped([scope]) as space:
        guard = guard_for(space)
        verdicts = []
        for step, confidence in enumerate(confidences):
            at(space, float(step))
            decision = guard.pre_action(AGENTS[step], "cal", "r", "book", confidence)
            verdicts.append(decision.verdict)
        if deferred:
            assert set(verdicts) == {Verdict.BLOCKED}
            outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
            allowed = [a for a, v in outcome.items() if v is Verdict.ALLOW]
        else:
            allowed = [AGENTS[i].id for i, v in enumerate(verdicts) if v is Verdict.ALLOW]
            assert set(verdicts) <= {Verdict.ALLOW, Verdict.CONFLICT}
        assert allowed, verdicts
        intents = space.read("cal", resource="r", mark_type=MarkType.INTENT)
        winner = expected_winner(intents, policy)
        if deferred:
            assert allowed == [winner.agent_id]
        elif policy is ConflictPolicy.FIRST_WRITER:
            assert verdicts[0] is Verdict.ALLOW
            assert allowed == [AGENTS[0].id]
        else:
            # serialized HIGHEST_CONFIDENCE: an agent is let through when its intent beats
            # every intent written before it (§6.2's priority inversion, within the rules)
            for step, confidence in enumerate(confidences):
                beats_all = all(confidence > c for c in confidences[:step])
                assert (verdicts[step] is Verdict.ALLOW) == beats_all, (step, verdicts)


@for_all()
@given(
    policy=st.sampled_from(list(ConflictPolicy)),
    confidences=st.tuples(UNIT, UNIT),
    late=st.floats(1e-3, hours(24)),
)
def test_p13_yield_recovery(new_space, policy, confidences, late) -> None:
    """P13: If agent A yields to agent B's intent, and agent B later abandons (its intent
    expires), A MUST NOT be permanently prevented from acting on that resource: a new intent
    from A is evaluated without reference to the expired history."""
    strong, weak = max(confidences), min(confidences)
    with new_space.scoped([make_scope(conflict_policy=policy)]) as space:
        guard = guard_for(space)
        first = guard.pre_action(AGENTS[1], "cal", "r", "book", strong)
        assert first.verdict is Verdict.ALLOW
        at(space, 1.0)
        yielded = guard.pre_action(AGENTS[0], "cal", "r", "book", weak)
        assert yielded.verdict in (Verdict.CONFLICT, Verdict.BLOCKED)
        at(space, 1.0 + TTL + late)  # both intents have expired; B never acted
        retry = guard.pre_action(AGENTS[0], "cal", "r", "book", weak)
        assert retry.verdict is Verdict.ALLOW, retry.reason
        assert not retry.conflicting_intents


def deferred_scope(policy: ConflictPolicy = ConflictPolicy.HIGHEST_CONFIDENCE) -> Scope:
    return make_scope(conflict_policy=policy, deferred=True)


@for_all()
@given(
    stale=st.lists(UNIT, max_size=3),
    live=st.lists(st.tuples(UNIT, st.floats(0.0, TTL - 1e-3)), min_size=1, max_size=4),
)
def test_p14_deferred_completeness(new_space, stale, live) -> None:
    """P14: Under deferred resolution, the batch resolution step MUST consider ALL active
    intents on (scope, resource) at the resolution boundary; an intent written before the
    boundary and still within its TTL MUST NOT be excluded (and expired ones do not count)."""
    boundary = 2 * TTL + 10.0
    with new_space.scoped([deferred_scope()]) as space:
        guard = guard_for(space)
        for i, confidence in enumerate(stale):  # expired by the boundary
            at(space, float(i))
            guard.pre_action(AGENTS[i], "cal", "r", "book", confidence)
        active = {}
        for j, (confidence, age) in enumerate(live):
            agent = AGENTS[3 + j] if j < 3 else make_agent("late")
            at(space, boundary - age)
            decision = guard.pre_action(agent, "cal", "r", "book", confidence)
            active[agent.id] = decision.intent_id
        at(space, boundary)
        outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
        assert set(outcome) == set(active)
        intents = [space.get(i) for i in active.values()]
        winner = expected_winner(intents, ConflictPolicy.HIGHEST_CONFIDENCE)
        assert [a for a, v in outcome.items() if v is Verdict.ALLOW] == [winner.agent_id]


@for_all()
@given(confidences=st.lists(st.sampled_from([0.1, 0.5, 0.5, 0.9, 1.0]), min_size=1,
                            max_size=6), data=st.data())
def test_p15_deferred_priority_fidelity(new_space, confidences, data) -> None:
    """P15: Under deferred resolution with HIGHEST_CONFIDENCE, the winning intent MUST be the
    one with the highest confidence among all candidates at the boundary (ties: earliest),
    identical to evaluating all intents simultaneously, whatever order they arrived in."""
    order = data.draw(st.permutations(range(len(confidences))))
    with new_space.scoped([deferred_scope()]) as space:
        guard = guard_for(space)
        arrival = {}
        for step, index in enumerate(order):
            at(space, float(step))
            guard.pre_action(AGENTS[index], "cal", "r", "book", confidences[index])
            arrival[AGENTS[index].id] = step
        outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
        top = max(confidences)
        expected = min((arrival[AGENTS[i].id], AGENTS[i].id)
                       for i, c in enumerate(confidences) if c == top)[1]
        assert [a for a, v in outcome.items() if v is Verdict.ALLOW] == [expected]
        intents = space.read("cal", resource="r", mark_type=MarkType.INTENT)
        assert resolve_conflict(intents, ConflictPolicy.HIGHEST_CONFIDENCE) == next(
            i.id for i in intents if i.agent_id == expected
        )


@for_all(20)
@given(resources=st.lists(st.lists(UNIT, min_size=1, max_size=3), min_size=1, max_size=3))
def test_p16_deferred_liveness(new_space, resources) -> None:
    """P16: For any scope with deferred: true and at least one active intent, a resolution
    boundary MUST eventually occur; intents must not accumulate without resolution (and TTL
    expiry remains the safety net). The harness's boundary, ``resolve_all_deferred``, covers
    every deferred (scope, resource) with active intents and nothing else."""
    undeferred = make_scope("now", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE)
    agents = [make_agent(f"p16-{i}", scopes=("cal", "now")) for i in range(3)]
    with new_space.scoped([deferred_scope(), undeferred]) as space:
        guard = guard_for(space)
        for r, confidences in enumerate(resources):
            for a, confidence in enumerate(confidences):
                assert guard.pre_action(agents[a], "cal", f"r{r}", "book",
                                        confidence).verdict is Verdict.BLOCKED
        guard.pre_action(agents[0], "now", "x", "book", 0.5)
        boundary = guard.resolve_all_deferred()
        assert set(boundary) == {("cal", f"r{r}") for r in range(len(resources))}
        for outcome in boundary.values():
            assert list(outcome.values()).count(Verdict.ALLOW) == 1
        at(space, TTL + 1.0)
        assert guard.resolve_all_deferred() == {}


@for_all()
@given(confidences=st.lists(UNIT, min_size=1, max_size=6),
       policy=POLICIES, boundaries=st.integers(1, 3))
def test_p17_deferred_mutual_exclusion(new_space, confidences, policy, boundaries) -> None:
    """P17: Under deferred resolution, at most one agent MUST receive ALLOW per (scope,
    resource) per resolution boundary: with N agents' active intents, exactly one wins and
    N-1 receive BLOCKED. No ALLOW is given before the boundary."""
    with new_space.scoped([deferred_scope(policy)]) as space:
        guard = guard_for(space)
        for step, confidence in enumerate(confidences):
            at(space, float(step))
            decision = guard.pre_action(AGENTS[step], "cal", "r", "book", confidence)
            assert decision.verdict is Verdict.BLOCKED
            assert decision.reason
        winners = set()
        for _ in range(boundaries):
            outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
            verdicts = sorted(outcome.values())
            assert len(outcome) == len(confidences)
            assert verdicts.count(Verdict.ALLOW) == 1
            assert verdicts.count(Verdict.BLOCKED) == len(confidences) - 1
            winners |= {a for a, v in outcome.items() if v is Verdict.ALLOW}
        assert len(winners) == 1


@for_all()
@given(
    others=st.lists(st.tuples(UNIT, st.floats(0.0, TTL - 1e-3)), min_size=1, max_size=4),
    last=UNIT,
)
def test_p18_deferred_inclusion(new_space, others, last) -> None:
    """P18: All active intents (strength > 0) on (scope, resource) at the resolution boundary
    MUST be included in the comparison, including one written just before the boundary and
    one about to reach its TTL."""
    boundary = TTL
    with new_space.scoped([deferred_scope()]) as space:
        guard = guard_for(space)
        written = []
        for i, (confidence, age) in enumerate(sorted(others, key=lambda o: -o[1])):
            at(space, boundary - age)
            written.append(guard.pre_action(AGENTS[i], "cal", "r", "book", confidence))
        at(space, boundary)
        written.append(guard.pre_action(AGENTS[5], "cal", "r", "book", last))
        outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
        assert set(outcome) == {AGENTS[i].id for i in range(len(others))} | {AGENTS[5].id}
        intents = [space.get(d.intent_id) for d in written]
        winner = expected_winner(intents, ConflictPolicy.HIGHEST_CONFIDENCE)
        assert [a for a, v in outcome.items() if v is Verdict.ALLOW] == [winner.agent_id]


# =========================================================================== §7 scopes


def scopes_for_visibility() -> list[Scope]:
    return [
        make_scope("open"),
        make_scope("hr", visibility=ScopeVisibility.PROTECTED),
        make_scope("legal", visibility=ScopeVisibility.CLASSIFIED),
    ]


VISIBILITY_WRITER = make_agent("vis-writer", scopes=("open", "hr", "legal"))


@for_all()
@given(
    mark=any_mark(scope="s"),
    granted=st.sets(st.sampled_from(["cal", "s/x", "sx", "s2"]), max_size=3),
    types=st.sets(st.sampled_from(ALL_TYPES), max_size=5),
)
def test_p19_scope_isolation(new_space, mark, granted, types) -> None:
    """P19: An agent without authorization for scope S MUST be unable to write any mark to
    S: write(unauthorized_agent, mark_in_S) -> Error (and nothing is stored). Only a grant
    on S or an ancestor of it counts: not a child, a sibling, or a name prefix."""
    outsider = make_agent("outsider", scopes=tuple(granted), types=tuple(types))
    no_type = make_agent("no-type", scopes=("s",),
                         types=tuple(t for t in ALL_TYPES if t != mark.mark_type.value))
    with new_space.scoped([make_scope("s"), make_scope("cal"), make_scope("s2"),
                           make_scope("sx")]) as space:
        before = snapshot(space, ("s",))
        for agent in (outsider, no_type):
            with pytest.raises(UnauthorizedWrite):
                space.write(agent, mark)
        assert snapshot(space, ("s",)) == before
        assert space.read("s/x", min_strength=0.0) == []


@for_all()
@given(mark=any_mark(scope="open", initial=POSITIVE))
def test_p20_structural_visibility(new_space, mark) -> None:
    """P20: For OPEN scopes any agent MUST be able to read full marks regardless of
    authorization; for PROTECTED scopes any agent MUST be able to read projected marks;
    reader=None (infrastructure) MUST receive full marks regardless of visibility."""
    stranger = make_agent("stranger", scopes=())
    with new_space.scoped(scopes_for_visibility()) as space:
        stored = {
            name: put(space, VISIBILITY_WRITER, mark.model_copy(update={"scope": name}))
            for name in ("open", "hr", "legal")
        }
        assert space.read("open", min_strength=0.0, reader=stranger) == [stored["open"]]
        for name in ("open", "hr", "legal"):
            assert space.read(name, min_strength=0.0) == [stored[name]]
        projected = space.read("hr", min_strength=0.0, reader=stranger)
        assert ids(projected) == [stored["hr"].id]
        assert projected[0].projected is True


def assert_redacted(mark: Any) -> None:
    assert mark.projected is True
    for field, empty in CONTENT[mark.mark_type].items():
        assert getattr(mark, field) == empty, field


@for_all()
@given(mark=any_mark(scope="hr", initial=POSITIVE))
def test_p21_content_access(new_space, mark) -> None:
    """P21: For PROTECTED scopes an agent MUST have read authorization to access content
    fields; without it the implementation MUST return projected marks with content fields
    redacted and projected=true. (Write permission alone is not read authorization.)"""
    reader = make_agent("reader", scopes=(), read_scopes=("hr",))
    writer_only = make_agent("writer-only", scopes=("hr",))
    with new_space.scoped(scopes_for_visibility()) as space:
        stored = put(space, VISIBILITY_WRITER, mark)
        assert space.read("hr", min_strength=0.0, reader=reader) == [stored]
        for agent in (writer_only, make_agent("nobody", scopes=())):
            (seen,) = space.read("hr", min_strength=0.0, reader=agent)
            assert seen.id == stored.id
            assert_redacted(seen)


@for_all()
@given(mark=any_mark(scope="legal", initial=POSITIVE))
def test_p22_classified_opacity(new_space, mark) -> None:
    """P22: For CLASSIFIED scopes, an agent without read authorization MUST receive an empty
    result; it is all-or-nothing (an authorized one gets full marks)."""
    cleared = make_agent("cleared", scopes=(), read_scopes=("legal",))
    with new_space.scoped(scopes_for_visibility()) as space:
        stored = put(space, VISIBILITY_WRITER, mark)
        assert space.read("legal", min_strength=0.0, reader=VISIBILITY_WRITER) == []
        assert space.read("legal", min_strength=0.0, reader=cleared) == [stored]
        assert space.read("legal", min_strength=0.0) == [stored]


SEGMENTS = st.text(alphabet="abcxyz019-_.", min_size=1, max_size=5)


@for_all()
@given(b=SEGMENTS, c=SEGMENTS, kind=st.sampled_from(list(MarkType)))
def test_p23_hierarchy(new_space, b, c, kind) -> None:
    """P23: Write authorization for scope "a" MUST imply write authorization for "a/b" and
    "a/b/c" for all b, c. Read authorization MUST follow the same rule. (A grant on "a/b"
    does not reach "a", and "ab" is no child of "a".)"""
    assume(b != c)
    parent = make_agent("parent", scopes=("a",), types=(kind.value,), read_scopes=("a",))
    child = make_agent("child", scopes=(f"a/{b}",), types=(kind.value,),
                       read_scopes=(f"a/{b}",))
    prefix = make_agent("prefix", scopes=("a" + b,), types=(kind.value,))
    scopes = [make_scope("a", visibility=ScopeVisibility.CLASSIFIED), make_scope("a" + b)]
    with new_space.scoped(scopes) as space:
        for name in (f"a/{b}", f"a/{b}/{c}"):
            mark = sample_mark(kind, name)
            stored = put(space, parent, mark)
            assert space.read(name, min_strength=0.0, reader=parent) == [stored]
            assert space.read(name, min_strength=0.0, reader=child) == [stored]
        put(space, child, sample_mark(kind, f"a/{b}/{c}"))
        for agent, name in ((child, "a"), (child, f"a/{c}"), (prefix, f"a/{b}")):
            with pytest.raises(UnauthorizedWrite):
                space.write(agent, sample_mark(kind, name))
        put(space, parent, sample_mark(kind, f"a/{c}"))
        assert space.read(f"a/{c}", min_strength=0.0, reader=child) == []


def sample_mark(kind: MarkType, scope: str) -> Any:
    """One valid mark of ``kind`` in ``scope``, with content fields set."""
    if kind is MarkType.INTENT:
        return Intent(scope=scope, resource="r", action="book", confidence=0.6)
    if kind is MarkType.ACTION:
        return Action(scope=scope, resource="r", action="booked", result={"ok": True})
    if kind is MarkType.OBSERVATION:
        return Observation(scope=scope, topic="t", content={"v": 1}, confidence=0.4,
                           source=Source.EXTERNAL_VERIFIED)
    if kind is MarkType.WARNING:
        return Warning(scope=scope, topic="t", reason="stale", severity=Severity.CRITICAL,
                       invalidates=uuid.uuid4())
    return Need(scope=scope, question="which?", context={"k": "v"}, priority=0.7,
                blocking=True)


@for_all(40)
@given(mark=any_mark(scope="hr", initial=POSITIVE), supersedes=st.booleans())
def test_p24_projection_preservation(new_space, mark, supersedes) -> None:
    """P24: A projected mark MUST retain all structural and coordination metadata (id,
    mark_type, agent_id, scope, created_at, initial_strength, resource, action, topic,
    confidence, severity, priority, blocking, source, invalidates, resolved_by, supersedes).
    Only content fields (result, content, reason, question, context) are redacted, and
    projected MUST be true."""
    stranger = make_agent("stranger", scopes=())
    with new_space.scoped(scopes_for_visibility()) as space:
        if supersedes:
            mark = mark.model_copy(update={"supersedes": uuid.uuid4()})
        stored = put(space, VISIBILITY_WRITER, mark)
        (seen,) = space.read("hr", min_strength=0.0, reader=stranger)
        assert type(seen) is type(stored)
        for field in STRUCTURAL + COORDINATION:
            if field in type(stored).model_fields:
                assert getattr(seen, field) == getattr(stored, field), field
        assert_redacted(seen)
        assert seen == project_mark(stored)
        assert space.strength_of(seen) == space.strength_of(stored)


@for_all()
@given(mark=any_mark(scope="legal", initial=POSITIVE))
def test_p25_classified_no_fallback(new_space, mark) -> None:
    """P25: CLASSIFIED scopes MUST NOT provide projected reads as a fallback: an
    unauthorized reader MUST receive an empty list, not projected marks, whatever the
    filters (while the same mark in a PROTECTED scope would be projected)."""
    stranger = make_agent("stranger", scopes=(), read_scopes=("hr",))
    with new_space.scoped(scopes_for_visibility()) as space:
        put(space, VISIBILITY_WRITER, mark)
        put(space, VISIBILITY_WRITER, mark.model_copy(update={"scope": "hr"}))
        assert len(space.read("hr", min_strength=0.0, reader=make_agent("x", scopes=()))) == 1
        key = getattr(mark, "resource", None), getattr(mark, "topic", None)
        for filters in ({}, {"mark_type": mark.mark_type}, {"resource": key[0]},
                        {"topic": key[1]}):
            assert space.read("legal", min_strength=0.0, reader=stranger, **filters) == []


@for_all(20)
@given(child=SEGMENTS, kind=st.sampled_from(list(MarkType)))
def test_p26_visibility_hierarchy_inheritance(new_space, child, kind) -> None:
    """P26: A child scope without its own definition MUST inherit the parent scope's
    visibility level; read authorization for a parent scope MUST imply read authorization
    for all child scopes. (A child with its own definition uses its own.)"""
    scopes = [*scopes_for_visibility(), make_scope("hr/public")]
    cleared = make_agent("cleared", scopes=(), read_scopes=("hr", "legal"))
    stranger = make_agent("stranger", scopes=())
    with new_space.scoped(scopes) as space:
        assert space.get_scope(f"legal/{child}").visibility is ScopeVisibility.CLASSIFIED
        assert space.get_scope(f"hr/{child}/x").visibility is ScopeVisibility.PROTECTED
        secret = put(space, VISIBILITY_WRITER, sample_mark(kind, f"legal/{child}"))
        private = put(space, VISIBILITY_WRITER, sample_mark(kind, f"hr/{child}/x"))
        public = put(space, VISIBILITY_WRITER, sample_mark(kind, "hr/public"))
        assert space.read(f"legal/{child}", min_strength=0.0, reader=stranger) == []
        assert space.read(f"legal/{child}", min_strength=0.0, reader=cleared) == [secret]
        (projected,) = space.read(f"hr/{child}/x", min_strength=0.0, reader=stranger)
        assert_redacted(projected)
        assert space.read(f"hr/{child}/x", min_strength=0.0, reader=cleared) == [private]
        assert space.read("hr/public", min_strength=0.0, reader=stranger) == [public]


# =========================================================================== §8 the space


def lifetime_age(mark: Any, fraction: float) -> float:
    """An age within the mark's active lifetime (strength still > 0)."""
    if mark.mark_type is MarkType.INTENT:
        return fraction * (TTL - 1e-3)
    if mark.mark_type in HALF_LIFE:
        return fraction * 3 * HALF_LIFE[mark.mark_type]
    return fraction * hours(24 * 365)


def filters_matching(mark: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [{}, {"mark_type": mark.mark_type}]
    if getattr(mark, "resource", None) is not None:
        found.append({"resource": mark.resource})
    if getattr(mark, "topic", None) is not None:
        found.append({"topic": mark.topic, "mark_type": mark.mark_type})
    return found


@for_all(40)
@given(mark=any_mark(initial=POSITIVE), fraction=st.floats(0.0, 1.0),
       visibility=st.sampled_from(list(ScopeVisibility)))
def test_p27_write_visibility(new_space, mark, fraction, visibility) -> None:
    """P27: A mark written at time t MUST be visible to authorized reads at any time t' > t
    within its active lifetime, subject to scope visibility (unauthorized readers of a
    PROTECTED scope see its projection, of a CLASSIFIED scope nothing)."""
    authorized = make_agent("authorized", scopes=(), read_scopes=("cal",))
    stranger = make_agent("stranger", scopes=())
    with new_space.scoped([make_scope(visibility=visibility)]) as space:
        stored = put(space, WRITER, mark)
        assert stored.model_dump(exclude={"id", "agent_id", "created_at"}) == mark.model_dump(
            exclude={"id", "agent_id", "created_at"})
        assert (stored.agent_id, stored.created_at) == (WRITER.id, T0)
        at(space, lifetime_age(mark, fraction))
        for filters in filters_matching(mark):
            for reader in (None, authorized):
                found = space.read("cal", min_strength=0.0, reader=reader, **filters)
                assert found == [stored], filters
            seen = space.read("cal", min_strength=0.0, reader=stranger, **filters)
            if visibility is ScopeVisibility.CLASSIFIED:
                assert seen == []
            else:
                assert ids(seen) == [stored.id]


def all_reads(space: Any, readers: tuple[Any, ...]) -> list[Any]:
    out = []
    for reader in readers:
        for filters in ({}, {"resource": "r"}, {"topic": "t"}, {"mark_type": MarkType.NEED}):
            out.append([m.model_dump() for m in space.read("cal", min_strength=0.0,
                                                           reader=reader, **filters)])
    out.append([m.model_dump() for m in space.active_marks()])
    return out


@for_all(25)
@given(
    marks=st.lists(st.tuples(any_mark(), st.floats(0.0, hours(1))), min_size=1, max_size=6),
    visits=st.lists(st.floats(-hours(1), hours(24 * 365 * 100)), min_size=1, max_size=4),
    visibility=st.sampled_from(list(ScopeVisibility)),
)
def test_p28_read_purity(new_space, marks, visits, visibility) -> None:
    """P28: Reading marks MUST NOT change any mark's stored state (no write-on-read, e.g. no
    eager pruning of expired marks): reads far in the future leave every mark as it was, and
    going back to the earlier time gives the earlier results again."""
    readers = (None, make_agent("stranger", scopes=()))
    with new_space.scoped([make_scope(visibility=visibility)]) as space:
        written = []
        for mark, when in sorted(marks, key=lambda m: m[1]):
            at(space, when)
            written.append(space.write(WRITER, mark))
        at(space, hours(1))
        stored = {i: space.get(i) for i in written}
        first = all_reads(space, readers)
        strengths = [space.strength_of(stored[i]) for i in written]
        for age in visits:
            at(space, age)
            all_reads(space, readers)
            for mark in stored.values():
                space.strength_of(mark)
        at(space, hours(1))
        assert len(space) == len(written)
        assert {i: space.get(i) for i in written} == stored
        assert all_reads(space, readers) == first
        assert [space.strength_of(stored[i]) for i in written] == strengths


@for_all()
@given(priorities=st.lists(UNIT, min_size=1, max_size=5), data=st.data())
def test_p29_resolution_immediacy(new_space, priorities, data) -> None:
    """P29: Resolving a need mark MUST immediately reduce its effective strength to 0 on the
    next read (§8.3: a resolved copy with resolved_by supersedes it)."""
    principal = make_agent("principal", types=("action",))
    with new_space.scoped([make_scope()]) as space:
        needs = [put(space, WRITER, Need(scope="cal", question=f"q{i}?", priority=p))
                 for i, p in enumerate(priorities)]
        chosen = data.draw(st.sets(st.sampled_from(needs), min_size=1), label="resolved")
        for need in chosen:
            action_id = space.write(principal, Action(scope="cal", action="booked",
                                                      result={"answer": "yes"}))
            copy_id = space.resolve(need.id, action_id)
            copy = space.get(copy_id)
            assert (copy.resolved_by, copy.supersedes) == (action_id, need.id)
            assert space.strength_of(need) == 0.0
            assert space.strength_of(copy) == 0.0
            found = ids(space.read("cal", mark_type=MarkType.NEED, min_strength=ALIVE))
            assert need.id not in found
            assert copy_id not in found
            # at 0 the copy (strength 0, not superseded) is read, never the need (§8.2, §10)
            found = ids(space.read("cal", mark_type=MarkType.NEED, min_strength=0.0))
            assert need.id not in found
            assert copy_id in found
        open_ids = {n.id for n in needs} - {n.id for n in chosen}
        assert set(ids(space.read("cal", mark_type=MarkType.NEED))) == open_ids
        clustered = {n.id for c in space.aggregate_needs() for n in c.needs}
        assert clustered == open_ids


@for_all(40)
@given(mark=any_mark())
def test_p30_mark_immutability(new_space, mark) -> None:
    """P30: A mark's fields MUST NOT be mutated after write. All marks are frozen; need
    resolution creates a new mark; decay, invalidation and supersession are computed at read
    time from immutable data. (The stored mark equals what was written, field for field.)"""
    with new_space.scoped([make_scope()]) as space:
        written = mark.model_dump()
        stored = put(space, WRITER, mark)
        # the caller's mark is untouched: the space stored a copy with the id it assigned
        assert mark.model_dump() == written and stored.id != mark.id
        for field in ("initial_strength", "scope", "created_at"):
            with pytest.raises((ValidationError, TypeError, AttributeError)):
                setattr(stored, field, getattr(stored, field))
        for field in ("result", "content", "context"):
            value = getattr(stored, field, None)
            if value is not None:
                with pytest.raises(TypeError):
                    value["x"] = 1
        copy = stored.model_dump()
        space.write(WRITER, Warning(scope="cal", topic="t", invalidates=stored.id))
        if isinstance(stored, Need):  # resolved by a stored action (the package requires one)
            space.resolve(stored.id, space.write(WRITER, Action(scope="cal", action="booked")))
        space.write(WRITER, mark.model_copy(update={"supersedes": stored.id}))
        at(space, hours(24 * 365))
        assert space.get(stored.id).model_dump() == copy
        assert space.get(stored.id) == stored
        assert stored.model_dump() == copy


@for_all()
@given(marks=st.lists(any_mark(), min_size=1, max_size=10), repeats=st.integers(1, 3))
def test_p31_mark_id_uniqueness(new_space, marks, repeats) -> None:
    """P31: Every call to write() MUST assign a unique id; no two marks in the same space
    share one (the same mark object written again, or a mark carrying an existing id,
    gets a fresh id)."""
    with new_space.scoped([make_scope()]) as space:
        written = [space.write(WRITER, mark) for mark in marks for _ in range(repeats)]
        first = space.get(written[0])
        again = space.write(WRITER, first)  # carries written[0] as its id
        written.append(again)
        assert len(set(written)) == len(written)
        assert all(space.get(i).id == i for i in written)
        assert space.get(written[0]) == first


@for_all()
@given(steps=st.lists(st.tuples(st.floats(-hours(1), hours(1)), any_mark()), min_size=2,
                      max_size=10))
def test_p32_total_write_ordering(new_space, steps) -> None:
    """P32: Marks MUST be totally ordered by (created_at, id); the space MUST assign
    monotonically non-decreasing created_at timestamps (even when the clock steps back), and
    reads sort by strength, then (created_at, id)."""
    with new_space.scoped([make_scope()]) as space:
        stamps = []
        latest = -math.inf
        for when, mark in steps:
            at(space, when)
            stored = put(space, WRITER, mark)
            latest = max(latest, T0 + when)
            assert stored.created_at == latest
            stamps.append((stored.created_at, stored.id))
        assert [s for s, _ in stamps] == sorted(s for s, _ in stamps)
        assert len(set(stamps)) == len(stamps)
        read = space.read("cal", min_strength=0.0)
        keys = [(-space.strength_of(m), m.created_at, m.id) for m in read]
        assert keys == sorted(keys)


@pytest.mark.parametrize("policy", [ConflictPolicy.FIRST_WRITER,
                                    ConflictPolicy.HIGHEST_CONFIDENCE])
def test_p32_write_order_decides_ties_on_created_at(new_space, policy) -> None:
    """P32: marks are totally ordered by (created_at, id), and this ordering is what
    FIRST_WRITER (and HIGHEST_CONFIDENCE's tiebreak, §6.1: "All other agents MUST yield")
    uses. When the clock does not move between two intents (a fixed or coarse clock, or a
    lagging machine whose writes get max(clock, latest) = the latest created_at), the
    second writer must still yield to the first, who was already let through: the order of
    equal timestamps must be the write order, not a random id. Twenty trials, two agents,
    equal confidence."""
    doubles = 0
    for _ in range(20):
        with new_space.scoped([make_scope(conflict_policy=policy)]) as space:
            guard = guard_for(space)  # the clock stays at T0
            verdicts = [guard.pre_action(agent, "cal", "r", "book", 0.5).verdict
                        for agent in AGENTS[:2]]
            doubles += verdicts == [Verdict.ALLOW, Verdict.ALLOW]
            assert verdicts[0] is Verdict.ALLOW
    assert doubles == 0, f"two agents were let through in {doubles} of 20 trials"


@for_all()
@given(
    marks=st.lists(any_mark(), min_size=1, max_size=6),
    error=st.sampled_from([RuntimeError, ValueError, KeyError, ZeroDivisionError]),
)
def test_p33_hook_non_interference(new_space, marks, error) -> None:
    """P33: A post-write hook failure MUST NOT affect the stored mark or subsequent reads;
    hooks get (agent_id, stored_mark) after the write, handles remove them, and a hook added
    while hooks fire is not called for that write."""
    calls: list[tuple[Any, Any]] = []
    late: list[Any] = []

    def failing(agent_id, stored):
        raise error("hook failure")

    with new_space.scoped([make_scope()]) as space:
        space.add_write_hook(failing)
        space.add_write_hook(lambda agent_id, stored: calls.append((agent_id, stored)))

        def adder_hook(agent_id, stored):
            # hooks added while hooks fire: snapshot semantics keep them out of this write
            space.add_write_hook(lambda a, m: late.append((stored.id, m.id)))

        adder = space.add_write_hook(adder_hook)
        written = [space.write(WRITER, mark) for mark in marks]
        assert calls == [(WRITER.id, space.get(i)) for i in written]
        n = len(marks)
        assert len(late) == n * (n - 1) // 2
        assert all(added_at != seen for added_at, seen in late)
        assert space.remove_write_hook(adder) is True
        assert space.remove_write_hook(adder) is False
        reference = make_space_like(new_space)
        for mark in marks:
            reference.write(WRITER, mark)
        assert sorted(map(strip, space.read("cal", min_strength=0.0))) == sorted(
            map(strip, reference.read("cal", min_strength=0.0)))


def make_space_like(factory: SpaceFactory) -> Any:
    return factory([make_scope()])


def strip(mark: Any) -> str:
    """A mark's own fields (without what the space assigns), comparable across spaces."""
    return repr(mark.model_dump(exclude={"id", "agent_id", "created_at"}))


# =========================================================================== §9 the guard


def warned(target_kind: MarkType) -> Any:
    if target_kind is MarkType.ACTION:
        return Action(scope="cal", resource="r", action="booked", result={"v": 1})
    return Need(scope="cal", question="q?")


@for_all()
@given(
    target=st.sampled_from([MarkType.ACTION, MarkType.NEED, MarkType.OBSERVATION]),
    base=POSITIVE,
    warnings=st.lists(st.tuples(INITIAL, st.floats(0.0, hours(1))), min_size=1, max_size=4),
    age=st.floats(0.0, hours(3)),
)
def test_p34_invalidation_bound(new_space, target, base, warnings, age) -> None:
    """P34: A warning MUST NOT reduce a mark's effective strength below 0 (§9.5: strength =
    max(0, effective - sum of the live strengths of the warnings invalidating it))."""
    with new_space.scoped([make_scope()]) as space:
        if target is MarkType.OBSERVATION:
            mark = Observation(scope="cal", topic="t", initial_strength=base)
        else:
            mark = warned(target).model_copy(update={"initial_strength": base})
        stored = put(space, WRITER, mark)
        written = []
        for strength, when in sorted(warnings, key=lambda w: w[1]):
            at(space, when)
            written.append(put(space, OTHER, Warning(scope="cal", topic="t", reason="no",
                                                     invalidates=stored.id,
                                                     initial_strength=strength)))
        at(space, hours(1) + age)
        now = T0 + hours(1) + age
        penalty = sum(compute_strength(w, now, DECAY) for w in written)
        own = compute_strength(stored, now, DECAY)
        strength = space.strength_of(stored)
        assert strength >= 0.0
        assert strength == pytest.approx(max(0.0, own - penalty), abs=1e-9)
        if own - penalty <= 0:
            assert stored.id not in ids(space.read("cal", min_strength=ALIVE))
            # §8.2: at strength 0, not below a threshold of 0; not superseded, so still read
            assert stored.id in ids(space.read("cal", min_strength=0.0))


@for_all()
@given(
    target=st.sampled_from([MarkType.ACTION, MarkType.NEED]),
    base=POSITIVE,
    warning=st.floats(0.05, 20.0),
    times=st.lists(st.floats(0.0, hours(10)), min_size=2, max_size=6),
)
def test_p35_invalidation_decay(new_space, target, base, warning, times) -> None:
    """P35: As a warning decays, the invalidated mark's effective strength MUST recover
    (assuming the mark itself has not fully decayed): non-decreasing over time, back to its
    own strength once the warning has faded."""
    with new_space.scoped([make_scope()]) as space:
        stored = put(space, WRITER, warned(target).model_copy(update={"initial_strength": base}))
        put(space, OTHER, Warning(scope="cal", topic="t", invalidates=stored.id,
                                  initial_strength=warning))
        seen = []
        for when in sorted(times):
            at(space, when)
            seen.append(space.strength_of(stored))
        assert all(b >= a for a, b in itertools.pairwise(seen)), seen
        at(space, 200 * WARN_HALF_LIFE)
        assert space.strength_of(stored) == pytest.approx(base)
        at(space, 0.0)
        assert space.strength_of(stored) == pytest.approx(max(0.0, base - warning))


GUARD_OPS = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["pre", "post", "failed"]), UNIT,
              st.sampled_from(["r", "s"])),
    max_size=6,
)


def replay(space: Any, ops: list[Any]) -> Any:
    guard = guard_for(space)
    for step, (who, op, confidence, resource) in enumerate(ops):
        at(space, float(step))
        agent = AGENTS[who]
        if op == "pre":
            guard.pre_action(agent, "cal", resource, "book", confidence)
        else:
            guard.post_action(agent, "cal", resource, "booked", {"step": step},
                              failed=op == "failed")
    at(space, float(len(ops)))
    return guard


@for_all(25)
@given(ops=GUARD_OPS, policy=st.sampled_from(list(ConflictPolicy)), who=st.integers(0, 4),
       confidence=UNIT, deferred=st.booleans())
def test_p36_guard_determinism(new_space, ops, policy, who, confidence, deferred) -> None:
    """P36: Given the same mark space state, pre_action MUST return the same verdict for the
    same inputs (two spaces brought to the same state answer alike; so does asking again)."""
    scope = make_scope(conflict_policy=policy, deferred=deferred)
    decisions = []
    for _ in range(2):
        with new_space.scoped([scope]) as space:
            guard = replay(space, ops)
            first = guard.pre_action(AGENTS[who], "cal", "r", "book", confidence)
            again = guard.pre_action(AGENTS[who], "cal", "r", "book", confidence)
            assert again.verdict is first.verdict
            decisions.append(first)
    left, right = decisions
    assert left.verdict is right.verdict
    assert left.check == right.check

    def winner(d):
        w = d.winning_intent
        return None if w is None else (w.agent_id, w.confidence, w.created_at)

    assert winner(left) == winner(right)


@for_all(25)
@given(ops=GUARD_OPS, policy=st.sampled_from(list(ConflictPolicy)), who=st.integers(0, 4),
       confidence=UNIT, deferred=st.booleans(), raises=st.booleans())
def test_p37_guard_atomicity(new_space, ops, policy, who, confidence, deferred,
                             raises) -> None:
    """P37: If pre_action returns CONFLICT or BLOCKED, tool_fn MUST NOT be called; the tool
    is never invoked unless the guard explicitly allows it (and then exactly once, its
    result recorded as an action mark)."""
    calls = []

    def tool():
        calls.append(1)
        if raises:
            raise RuntimeError("tool broke")
        return {"booked": True}

    scope = make_scope(conflict_policy=policy, deferred=deferred)
    with new_space.scoped([scope]) as space:
        guard = replay(space, ops)
        agent = AGENTS[who] if who < 4 else make_agent("intruder", types=("observation",))
        try:
            decision, result = guard.execute(agent, "cal", "r", "book", "booked", tool,
                                             confidence)
        except RuntimeError:
            assert raises and calls == [1]
            (action,) = [m for m in space.read("cal", resource="r", mark_type=MarkType.ACTION,
                                               min_strength=0.0) if m.agent_id == agent.id
                         and m.created_at == space.now()]
            assert action.failed is True
            return
        if decision.verdict is Verdict.ALLOW:
            assert calls == [1]
            assert result == {"booked": True}
            actions = space.read("cal", resource="r", mark_type=MarkType.ACTION)
            assert any(a.agent_id == agent.id and a.result == {"booked": True}
                       for a in actions)
        else:
            assert calls == []
            assert result is None


@for_all()
@given(policy=st.sampled_from(list(ConflictPolicy)), confidences=st.tuples(UNIT, UNIT))
def test_p38_guard_transparency(new_space, policy, confidences) -> None:
    """P38: A CONFLICT verdict MUST include winning_intent (the intent that won); a BLOCKED
    verdict MUST include a non-empty reason; a DENIED verdict MUST include a reason saying
    which authorization check failed."""
    scopes = [make_scope(conflict_policy=policy), make_scope("later", deferred=True)]
    reader_only = make_agent("reader-only", types=("observation",))
    with new_space.scoped(scopes) as space:
        guard = guard_for(space)
        guard.pre_action(AGENTS[0], "cal", "r", "book", confidences[0])
        at(space, 1.0)
        second = guard.pre_action(AGENTS[1], "cal", "r", "book", confidences[1])
        intents = space.read("cal", resource="r", mark_type=MarkType.INTENT)
        if second.verdict is Verdict.CONFLICT:
            assert second.winning_intent is not None
            assert second.winning_intent.id == resolve_conflict(intents, policy)
            assert second.winning_intent.agent_id == AGENTS[0].id
            assert second.winning_intent == space.get(second.winning_intent.id)
        if policy is ConflictPolicy.YIELD_ALL:
            assert second.verdict is Verdict.BLOCKED
        if second.verdict is Verdict.BLOCKED:
            assert second.reason.strip()
        if policy is ConflictPolicy.YIELD_ALL:  # §6.1: a need asks the principal
            need = space.get(second.need_id)
            assert isinstance(need, Need) and need.resolved_by is None
        denied = guard.pre_action(reader_only, "cal", "r", "book", 0.5)
        assert denied.verdict is Verdict.DENIED
        assert "authoriz" in denied.reason and "cal" in denied.reason
        assert "intent" in denied.reason
        before = len(space.read("cal", resource="r", mark_type=MarkType.INTENT))
        with pytest.raises(InvalidMark, match="fly"):  # the package's ValidationError
            guard.pre_action(AGENTS[2], "cal", "r", "fly", 0.5)
        assert len(space.read("cal", resource="r", mark_type=MarkType.INTENT)) == before
        both = make_agent("both", scopes=("cal", "later"))
        pending = guard.pre_action(both, "later", "r", "book", 0.5)
        assert pending.verdict is Verdict.BLOCKED and pending.reason.strip()


@for_all()
@given(
    policy=st.sampled_from(list(ConflictPolicy)),
    deferred=st.booleans(),
    confidence=UNIT,
    later=st.floats(0.0, hours(24 * 365)),
    direct=st.booleans(),
)
def test_p39_action_precedence(new_space, policy, deferred, confidence, later,
                               direct) -> None:
    """P39: If an action mark exists on a resource from agent X, the guard MUST return
    CONFLICT for any other agent's intent on that resource: completed actions take
    precedence over new intents, whatever the policy and confidence, for as long as the
    action stands. (A failed action claims nothing, §2.3.)"""
    scope = make_scope(conflict_policy=policy, deferred=deferred)
    with new_space.scoped([scope]) as space:
        guard = guard_for(space)
        if direct:
            claim = space.write(AGENTS[0], Action(scope="cal", resource="r", action="booked"))
        else:
            claim = guard.post_action(AGENTS[0], "cal", "r", "booked", {"ok": True})
        guard.post_action(AGENTS[1], "cal", "f", "booked", {"ok": False}, failed=True)
        at(space, later)
        for agent in AGENTS[1:4]:
            decision = guard.pre_action(agent, "cal", "r", "book", confidence)
            assert decision.verdict is Verdict.CONFLICT, decision.reason
            assert decision.winning_intent is None  # as the package: no intent won (P38:
            assert decision.winning_action.agent_id == AGENTS[0].id  # the action says who)
        if deferred:
            outcome = {a: d.verdict for a, d in guard.resolve_deferred("cal", "r").items()}
            assert Verdict.ALLOW not in outcome.values()
        free = guard.pre_action(AGENTS[2], "cal", "f", "book", confidence)
        expected = Verdict.BLOCKED if deferred else Verdict.ALLOW
        assert free.verdict is expected, free.reason
        assert space.get(claim) is not None


@for_all(15)
@given(policy=st.sampled_from(list(ConflictPolicy)), strength=st.floats(1.0, 10.0),
       through_guard=st.booleans())
def test_p39_a_warned_action_still_claims(new_space, policy, strength,
                                          through_guard) -> None:
    """P39: If an action mark exists on a resource from agent X, the guard MUST return
    CONFLICT for any other agent's intent on that resource. A warning that invalidates the
    action lowers its effective strength (§9.5) but "does not erase the fact": the action
    still exists, so another agent cannot take the resource by warning it away."""
    rival = make_agent("rival")
    with new_space.scoped([make_scope(conflict_policy=policy)]) as space:
        guard = guard_for(space)
        held = guard.pre_action(AGENTS[0], "cal", "r", "book", 0.5)
        assert held.verdict is Verdict.ALLOW
        action = guard.post_action(AGENTS[0], "cal", "r", "booked", {"ok": True},
                                   intent_id=held.intent_id)
        assert guard.pre_action(rival, "cal", "r", "book", 1.0).verdict is Verdict.CONFLICT
        warning = Warning(scope="cal", topic="r", reason="I want this room",
                          invalidates=action, initial_strength=strength)
        if through_guard:
            guard.write_mark(rival, warning)
        else:
            space.write(rival, warning)
        at(space, 1.0)
        taken = guard.pre_action(rival, "cal", "r", "book", 1.0)
        assert taken.verdict is Verdict.CONFLICT, taken.reason


# =========================================================================== §10 supersession


@for_all()
@given(
    chain=st.lists(st.sampled_from([MarkType.OBSERVATION, MarkType.WARNING, MarkType.NEED,
                                    MarkType.ACTION]), min_size=2, max_size=6),
    age=st.floats(0.0, minutes(10)),
)
def test_p47_supersession_transitivity(new_space, chain, age) -> None:
    """P47: If mark C supersedes B, and B supersedes A, then A and B are both invisible and C
    is the only visible mark (for chains of any length and of mixed types)."""
    with new_space.scoped([make_scope()]) as space:
        previous = None
        written = []
        for step, kind in enumerate(chain):
            at(space, float(step))
            mark = sample_mark(kind, "cal").model_copy(
                update={"supersedes": previous, "invalidates": None}
                if kind is MarkType.WARNING else {"supersedes": previous})
            previous = space.write(WRITER, mark)
            written.append(previous)
        at(space, len(chain) + age)
        assert ids(space.read("cal", min_strength=0.0)) == [written[-1]]
        assert ids(space.active_marks()) == [written[-1]]
        for older in written[:-1]:
            assert space.strength_of(space.get(older)) == 0.0
        assert space.strength_of(space.get(written[-1])) > 0.0


def test_p47_intent_superseded_by_action(new_space) -> None:
    """P47 (the §12.1 path): an action that supersedes an intent leaves only the action."""
    with new_space.scoped([make_scope()]) as space:
        intent = space.write(WRITER, Intent(scope="cal", resource="r", action="book"))
        action = space.write(WRITER, Action(scope="cal", resource="r", action="booked",
                                            supersedes=intent))
        replaced = space.write(WRITER, Action(scope="cal", resource="r", action="booked",
                                              supersedes=action))
        assert ids(space.read("cal", resource="r")) == [replaced]
