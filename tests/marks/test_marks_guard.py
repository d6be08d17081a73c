"""The guard of agentpost.marks (Markspace spec §6, §9.1–§9.6, §10): pre_action, post_action,
execute, deferred resolution and write_mark. Each test names its P-number (or spec section).

Spaces come from the ``make_space(scopes, clock)`` fixture below (in memory here; the lead
parametrizes it over the Postgres backend too), so the tests use the space interface only.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Intent,
    InvalidMark,
    MarkType,
    Need,
    Observation,
    Scope,
    UnauthorizedWrite,
    UnknownScope,
    Warning,
    minutes,
    winning_intent,
)
from agentpost.marks.guard import (
    SYSTEM_AGENT_ID,
    Guard,
    GuardCheck,
    GuardDecision,
    GuardedMarkType,
    Verdict,
    as_result,
)
from agentpost.marks.postgres import PostgresMarkSpace
from marks_backends import T0

HYPOTHESIS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TTL = minutes(30)
ALL_TYPES = ["intent", "action", "observation", "warning", "need"]


def scope(
    name: str = "calendar",
    policy: ConflictPolicy = ConflictPolicy.HIGHEST_CONFIDENCE,
    deferred: bool = False,
    **extra,
) -> Scope:
    return Scope(
        name=name,
        conflict_policy=policy,
        deferred=deferred,
        decay=DecayConfig(intent_ttl=TTL),
        **extra,
    )


def agent(name: str, scope_name: str = "calendar", types=ALL_TYPES) -> Agent:
    return Agent(name=name, scopes={scope_name: list(types)})


def verdicts_of(decisions: dict) -> dict:
    """A boundary's decisions as agent id -> verdict."""
    return {agent_id: decision.verdict for agent_id, decision in decisions.items()}


def intents_on(space, scope_name: str, resource: str) -> list[Intent]:
    return [
        m
        for m in space.read(scope_name, resource=resource, mark_type=MarkType.INTENT)
        if isinstance(m, Intent)
    ]


def actions_on(space, scope_name: str, resource: str) -> list[Action]:
    return [
        m
        for m in space.read(scope_name, resource=resource, mark_type=MarkType.ACTION)
        if isinstance(m, Action)
    ]


class Tool:
    """A tool function that counts its calls."""

    def __init__(self, result=None, error: Exception | None = None) -> None:
        self.calls = 0
        self.result = {"done": True} if result is None else result
        self.error = error

    def __call__(self):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.result


# --------------------------------------------------------------------------- §9.2 basics


def test_pre_action_allows_and_writes_the_intent(make_space):
    """§9.2 steps 3–5: with no rival the agent is allowed and its intent is in the space."""
    space = make_space([scope()])
    guard = Guard(space)
    booker = agent("booker")
    decision = guard.pre_action(booker, "calendar", "thu-14:00", "book", 0.9)
    assert decision.verdict is Verdict.ALLOW
    [intent] = intents_on(space, "calendar", "thu-14:00")
    assert intent.id == decision.intent_id
    assert (intent.agent_id, intent.action, intent.confidence) == (booker.id, "book", 0.9)


def test_highest_confidence_loser_gets_conflict_with_the_winner(make_space):
    """§6.1 HIGHEST_CONFIDENCE, P38: the loser's CONFLICT names the winning intent."""
    space = make_space([scope()])
    guard = Guard(space)
    strong, weak = agent("strong"), agent("weak")
    assert guard.pre_action(strong, "calendar", "r", "book", 0.9).allowed
    decision = guard.pre_action(weak, "calendar", "r", "book", 0.4)
    assert decision.verdict is Verdict.CONFLICT
    assert decision.winning_intent is not None
    assert decision.winning_intent.agent_id == strong.id
    assert decision.intent_id is not None  # the loser's intent stays until its TTL (§6.2.1)
    assert [i.agent_id for i in decision.conflicting_intents] == [strong.id]


def test_first_writer_earliest_intent_wins(make_space):
    """§6.1 FIRST_WRITER: the earliest intent wins whatever the confidence."""
    space = make_space([scope(policy=ConflictPolicy.FIRST_WRITER)])
    guard = Guard(space)
    early, late = agent("early"), agent("late")
    assert guard.pre_action(early, "calendar", "r", "book", 0.1).allowed
    space.set_clock(T0 + 1)
    decision = guard.pre_action(late, "calendar", "r", "book", 1.0)
    assert decision.verdict is Verdict.CONFLICT
    assert decision.winning_intent.agent_id == early.id


def test_yield_all_blocks_everyone_and_files_one_need_each(make_space):
    """§6.1 YIELD_ALL ("all agents with conflicting intents MUST write a need mark"), §9.2
    step 6, P38: BLOCKED with a reason and a Need written as the blocked agent itself (as the
    package files it)."""
    space = make_space([scope(policy=ConflictPolicy.YIELD_ALL)])
    guard = Guard(space)
    a, b = agent("a"), agent("b")
    assert guard.pre_action(a, "calendar", "r", "book").allowed  # alone: no conflict
    decision_b = guard.pre_action(b, "calendar", "r", "book")
    decision_a = guard.pre_action(a, "calendar", "r", "book")
    for decision in (decision_a, decision_b):
        assert decision.verdict is Verdict.BLOCKED
        assert decision.reason
        assert decision.need_id is not None
    needs = [m for m in space.read("calendar", mark_type=MarkType.NEED) if isinstance(m, Need)]
    assert sorted(n.context["agent_id"] for n in needs) == sorted([str(a.id), str(b.id)])
    assert all(n.blocking and str(n.agent_id) == n.context["agent_id"] for n in needs)
    assert {n.context["agent"] for n in needs} == {"a", "b"}  # the package's context keys
    # asking again does not pile up needs
    assert guard.pre_action(b, "calendar", "r", "book").need_id == decision_b.need_id
    assert len(space.read("calendar", mark_type=MarkType.NEED)) == 2


def test_yield_all_files_no_need_for_an_agent_that_may_not_write_needs(make_space):
    """§6.1 YIELD_ALL: the Need is the agent's own, so an agent without need rights in the
    scope is BLOCKED all the same and nothing is filed for it (the package's reading; the
    guard's system agent no longer writes it in its place)."""
    space = make_space([scope(policy=ConflictPolicy.YIELD_ALL)])
    guard = Guard(space)
    plain = ["intent", "action"]
    assert guard.pre_action(agent("a", types=plain), "calendar", "r", "book").allowed
    decision = guard.pre_action(agent("b", types=plain), "calendar", "r", "book")
    assert decision.verdict is Verdict.BLOCKED and decision.reason
    assert decision.need_id is None
    assert space.read("calendar", mark_type=MarkType.NEED) == []
    assert not any(m.agent_id == SYSTEM_AGENT_ID for m in space.active_marks())


def test_yield_all_principal_settles_by_invalidating_the_rival(make_space):
    """§6.1 YIELD_ALL / P12: once the principal invalidates the rival intent, the agent goes."""
    space = make_space([scope(policy=ConflictPolicy.YIELD_ALL)])
    guard = Guard(space)
    principal = agent("principal")
    a, b = agent("a"), agent("b")
    guard.pre_action(a, "calendar", "r", "book")
    rival = guard.pre_action(b, "calendar", "r", "book")
    space.write(principal, Warning(scope="calendar", topic="r", invalidates=rival.intent_id))
    assert guard.pre_action(a, "calendar", "r", "book").verdict is Verdict.ALLOW


# --------------------------------------------------------------------------- P36 determinism


@HYPOTHESIS
@given(
    policy=st.sampled_from(list(ConflictPolicy)),
    rivals=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 100)), min_size=0, max_size=6),
    mine=st.floats(0.0, 1.0),
)
def test_p36_pre_action_is_deterministic(make_space, policy, rivals, mine):
    """P36, P11: the same space state and inputs give the same verdict, and the verdict is
    the pure resolution of the intents in the space."""
    with make_space.scoped([scope(policy=policy)]) as space:
        guard = Guard(space)
        for index, (confidence, offset) in enumerate(rivals):
            space.set_clock(T0 + offset)
            space.write(
                agent(f"rival{index}"),
                Intent(scope="calendar", resource="r", action="book", confidence=confidence),
            )
        space.set_clock(T0 + 200)
        me = agent("me")
        first = guard.pre_action(me, "calendar", "r", "book", mine)
        second = guard.pre_action(me, "calendar", "r", "book", mine)
        assert first.verdict is second.verdict
        assert first.intent_id == second.intent_id
        assert first.winning_intent == second.winning_intent
        intents = intents_on(space, "calendar", "r")
        assert len(intents) == len(rivals) + 1
        assert first.verdict is _expected(policy, intents, me.id)


def _expected(policy: ConflictPolicy, intents: list[Intent], me: UUID) -> Verdict:
    if all(i.agent_id == me for i in intents):
        return Verdict.ALLOW
    if policy is ConflictPolicy.YIELD_ALL:
        return Verdict.BLOCKED
    winner = winning_intent(intents, policy)
    return Verdict.ALLOW if winner.agent_id == me else Verdict.CONFLICT


def test_p36_repeated_pre_action_reuses_the_intent_and_a_new_plan_supersedes_it(make_space):
    """P36 and §10: repeating pre_action keeps one intent; a new confidence supersedes it."""
    space = make_space([scope()])
    guard = Guard(space)
    me = agent("me")
    first = guard.pre_action(me, "calendar", "r", "book", 0.5)
    assert guard.pre_action(me, "calendar", "r", "book", 0.5).intent_id == first.intent_id
    changed = guard.pre_action(me, "calendar", "r", "book", 0.8)
    assert changed.intent_id != first.intent_id
    [intent] = intents_on(space, "calendar", "r")
    assert intent.id == changed.intent_id and intent.supersedes == first.intent_id


# --------------------------------------------------------------------------- P37 atomicity


@HYPOTHESIS
@given(
    policy=st.sampled_from(list(ConflictPolicy)),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=12,
    ),
)
def test_p37_tool_runs_only_on_allow(make_space, policy, steps):
    """P37: whatever happened before, tool_fn is called exactly when the verdict is ALLOW."""
    with make_space.scoped([scope(policy=policy)]) as space:
        guard = Guard(space)
        agents = [agent(f"a{i}") for i in range(4)]
        for tick, (who, resource, confidence) in enumerate(steps):
            space.set_clock(T0 + tick)
            tool = Tool()
            decision, result = guard.execute(
                agents[who], "calendar", f"r{resource}", "book", "booked", tool, confidence
            )
            assert tool.calls == (1 if decision.allowed else 0)
            assert (result is not None) == decision.allowed


@pytest.mark.parametrize("verdict", ["conflict", "blocked", "denied"])
def test_p37_no_tool_call_for_each_refusal(make_space, verdict):
    """P37: CONFLICT, BLOCKED and DENIED each return (decision, None) without the tool."""
    policy = ConflictPolicy.YIELD_ALL if verdict == "blocked" else ConflictPolicy.FIRST_WRITER
    space = make_space([scope(policy=policy)])
    guard = Guard(space)
    holder = agent("holder")
    if verdict == "conflict":
        guard.execute(holder, "calendar", "r", "book", "booked", Tool())
    elif verdict == "blocked":
        guard.pre_action(holder, "calendar", "r", "book")
    caller = agent("caller", types=["need"]) if verdict == "denied" else agent("caller")
    tool = Tool()
    decision, result = guard.execute(caller, "calendar", "r", "book", "booked", tool)
    assert decision.verdict.value == verdict
    assert (tool.calls, result) == (0, None)


def test_execute_records_the_result_as_an_action_superseding_the_intent(make_space):
    """§9.2 execute, §2.2: the action mark supersedes the intent; the result is stored."""
    space = make_space([scope()])
    guard = Guard(space)
    booker = agent("booker")
    decision, result = guard.execute(
        booker, "calendar", "r", "book", "booked", Tool({"flight": "DL413"})
    )
    assert decision.allowed and result == {"flight": "DL413"}
    assert intents_on(space, "calendar", "r") == []
    [action] = actions_on(space, "calendar", "r")
    assert action.supersedes == decision.intent_id
    assert action.result == {"flight": "DL413"} and not action.failed


def test_execute_records_a_raising_tool_as_a_failed_action_that_claims_nothing(make_space):
    """§2.3: a tool exception is recorded as a failed action (re-raised), and a failed
    action does not claim the resource."""
    space = make_space([scope()])
    guard = Guard(space)
    first, second = agent("first"), agent("second")
    with pytest.raises(RuntimeError, match="boom"):
        guard.execute(first, "calendar", "r", "book", "booked", Tool(error=RuntimeError("boom")))
    [failed] = actions_on(space, "calendar", "r")
    # the package's failed result (it was {"error": <class>, "message": ...})
    assert failed.failed and failed.result == {"error": "boom", "status": "failed"}
    assert intents_on(space, "calendar", "r") == []
    decision, _ = guard.execute(second, "calendar", "r", "book", "booked", Tool())
    assert decision.allowed


def test_execute_records_a_tool_result_too_large_for_the_space_as_a_summary(make_space):
    """P39 with the content bound (docs/marks.md): the tool has run, so its action is
    recorded and holds the resource even when the result is larger than the space's
    ``max_content_bytes``: the mark keeps a summary of it, execute returns it whole."""
    space = make_space([scope()], max_content_bytes=1024)
    guard = Guard(space)
    me, other = agent("me"), agent("other")
    big = {"rows": "x" * 5000}
    decision, result = guard.execute(me, "calendar", "r", "book", "booked", Tool(big))
    assert decision.allowed and result == big
    [action] = actions_on(space, "calendar", "r")
    assert action.agent_id == me.id
    assert action.result == {"oversize": True, "bytes": 5011, "limit": 1024}
    assert guard.pre_action(other, "calendar", "r", "book").verdict is Verdict.CONFLICT


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (None, {}),
        ({"a": 1}, {"a": 1}),
        (3, {"value": 3}),
        ([1, "x"], {"value": [1, "x"]}),
        ({1, 2}, {"repr": "{1, 2}"}),
        ({"bad": float("nan")}, {"repr": "{'bad': nan}"}),
    ],
)
def test_as_result_turns_any_tool_return_into_a_json_object(value, stored):
    """§2.3 result MUST be a JSON object: whatever the tool returned can be recorded."""
    assert as_result(value) == stored


# --------------------------------------------------------------------------- P38, P39


def test_p38_denied_says_which_check_failed(make_space):
    """P38: DENIED carries a reason naming the failed authorization check."""
    space = make_space([scope(allowed_intent_verbs=("book",), allowed_action_verbs=("booked",))])
    guard = Guard(space)
    no_intent = agent("no-intent", types=["action"])
    no_action = agent("no-action", types=["intent"])
    other_scope = agent("elsewhere", scope_name="mail")
    cases = [
        (guard.pre_action(no_intent, "calendar", "r", "book"), GuardCheck.AUTHORIZATION, "intent"),
        (guard.pre_action(no_action, "calendar", "r", "book"), GuardCheck.AUTHORIZATION, "action"),
        (guard.pre_action(other_scope, "calendar", "r", "book"), GuardCheck.AUTHORIZATION, ""),
        (
            guard.execute(agent("ok2"), "calendar", "r", "book", "stole", Tool())[0],
            GuardCheck.VERB,
            "stole",
        ),
    ]
    for decision, check, word in cases:
        assert decision.verdict is Verdict.DENIED
        assert decision.check is check
        assert decision.reason and word in decision.reason
    assert space.active_marks() == []  # nothing was written for a denied call


def test_an_intent_verb_the_scope_does_not_allow_raises_invalid_mark(make_space):
    """§7.1: an intent verb outside the scope's list is bad input, not a verdict: InvalidMark
    (the package's ValidationError, raised by its space's check of the intent), from
    pre_action and execute alike, with nothing written and the tool never called (P37)."""
    space = make_space([scope(allowed_intent_verbs=("book",), allowed_action_verbs=("booked",))])
    guard = Guard(space)
    tool = Tool()
    with pytest.raises(InvalidMark, match="steal"):
        guard.pre_action(agent("ok"), "calendar", "r", "steal")
    with pytest.raises(InvalidMark, match="steal"):
        guard.execute(agent("ok2"), "calendar", "r", "steal", "booked", tool)
    assert tool.calls == 0
    assert space.active_marks() == []


def test_p38_conflict_caused_by_an_action_names_the_action(make_space):
    """P38: a CONFLICT caused by an action names that action (`winning_action`); no intent
    won, so `winning_intent` is None, as in the package (it used to be the action's
    superseded intent)."""
    space = make_space([scope()])
    guard = Guard(space)
    holder, late = agent("holder"), agent("late")
    decision, _ = guard.execute(holder, "calendar", "r", "book", "booked", Tool())
    conflict = guard.pre_action(late, "calendar", "r", "book", 1.0)
    assert conflict.verdict is Verdict.CONFLICT
    assert conflict.winning_intent is None
    assert conflict.winning_action.agent_id == holder.id
    assert conflict.winning_action.supersedes == decision.intent_id


def test_p38_conflict_on_a_bare_action_names_it(make_space):
    """P38: an action written without an intent is named by `winning_action`
    (`winning_intent` is None, as in the package; it used to restate the action)."""
    space = make_space([scope()])
    guard = Guard(space)
    holder = agent("holder")
    action_id = space.write(holder, Action(scope="calendar", resource="r", action="booked"))
    conflict = guard.pre_action(agent("late"), "calendar", "r", "book")
    assert conflict.verdict is Verdict.CONFLICT
    assert conflict.winning_intent is None
    assert conflict.winning_action.id == action_id
    assert conflict.winning_action.agent_id == holder.id


@pytest.mark.parametrize("policy", list(ConflictPolicy))
@pytest.mark.parametrize("deferred", [False, True])
def test_p39_an_action_beats_any_later_intent(make_space, policy, deferred):
    """P39: another agent's action on the resource means CONFLICT, whatever the policy,
    the confidence, or the deferred flag."""
    space = make_space([scope(policy=policy, deferred=deferred)])
    guard = Guard(space)
    holder = agent("holder")
    space.write(holder, Action(scope="calendar", resource="r", action="booked"))
    decision = guard.pre_action(agent("eager"), "calendar", "r", "book", 1.0)
    assert decision.verdict is Verdict.CONFLICT
    assert decision.intent_id is None  # nothing written (§9.2 step 2 returns before step 3)
    assert intents_on(space, "calendar", "r") == []


def test_p39_own_and_failed_actions_do_not_block(make_space):
    """P39 concerns OTHER agents' actions; §2.3 failed actions claim nothing."""
    space = make_space([scope()])
    guard = Guard(space)
    me, other = agent("me"), agent("other")
    space.write(me, Action(scope="calendar", resource="mine", action="booked"))
    space.write(other, Action(scope="calendar", resource="free", action="booked", failed=True))
    assert guard.pre_action(me, "calendar", "mine", "book").allowed
    assert guard.pre_action(me, "calendar", "free", "book").allowed


# --------------------------------------------------------------------------- P12, P13


def test_p12_exactly_one_winner_among_pending_intents(make_space):
    """P12: of several agents on one resource (serialized), exactly one executes."""
    space = make_space([scope(policy=ConflictPolicy.FIRST_WRITER)])
    guard = Guard(space)
    agents = [agent(f"a{i}") for i in range(5)]
    decisions = []
    for tick, each in enumerate(agents):
        space.set_clock(T0 + tick)
        decisions.append(guard.pre_action(each, "calendar", "r", "book"))
    assert [d.verdict for d in decisions].count(Verdict.ALLOW) == 1
    assert decisions[0].allowed


def test_p13_yield_recovery_after_the_winner_abandons(make_space):
    """P13: after the winning intent expires, the yielding agent is evaluated afresh."""
    space = make_space([scope()])
    guard = Guard(space)
    winner, loser = agent("winner"), agent("loser")
    guard.pre_action(winner, "calendar", "r", "book", 0.9)
    assert guard.pre_action(loser, "calendar", "r", "book", 0.5).verdict is Verdict.CONFLICT
    space.set_clock(T0 + TTL + 1)  # both intents expired (P4)
    assert intents_on(space, "calendar", "r") == []
    assert guard.pre_action(loser, "calendar", "r", "book", 0.5).verdict is Verdict.ALLOW


def test_expired_intents_do_not_conflict(make_space):
    """P4 via the guard: an intent past its TTL no longer competes."""
    space = make_space([scope(policy=ConflictPolicy.FIRST_WRITER)])
    guard = Guard(space)
    guard.pre_action(agent("gone"), "calendar", "r", "book")
    space.set_clock(T0 + TTL + 0.5)
    assert guard.pre_action(agent("new"), "calendar", "r", "book").allowed


# --------------------------------------------------------------------------- deferred


def deferred_setup(make_space, confidences, policy=ConflictPolicy.HIGHEST_CONFIDENCE):
    space = make_space([scope(policy=policy, deferred=True)])
    guard = Guard(space)
    agents = []
    for tick, confidence in enumerate(confidences):
        space.set_clock(T0 + tick)
        each = agent(f"a{tick}")
        agents.append(each)
        decision = guard.pre_action(each, "calendar", "spot", "park", confidence)
        assert decision.verdict is Verdict.BLOCKED and decision.check is GuardCheck.DEFERRED
        assert decision.reason and decision.intent_id is not None
    return space, guard, agents


def test_deferred_advisory_mode_then_highest_confidence_wins(make_space):
    """§6.2 timeline, P15: A 0.5, B 0.95, C 0.7 collected; at the boundary B alone gets
    ALLOW, A and C BLOCKED; the losing intents stay until their TTL."""
    space, guard, (a, b, c) = deferred_setup(make_space, [0.5, 0.95, 0.7])
    verdicts = verdicts_of(guard.resolve_deferred("calendar", "spot"))
    assert verdicts == {a.id: Verdict.BLOCKED, b.id: Verdict.ALLOW, c.id: Verdict.BLOCKED}
    assert len(intents_on(space, "calendar", "spot")) == 3
    decisions = guard.resolve_deferred_decisions("calendar", "spot")
    assert decisions[a.id].winning_intent.agent_id == b.id and decisions[a.id].reason


def test_deferred_winner_proceeds_with_post_action_then_others_conflict(make_space):
    """§6.2.1 phase 3 then P39: the winner acts; the next boundary and pre_action see it."""
    _, guard, (a, b) = deferred_setup(make_space, [0.3, 0.8])
    decisions = guard.resolve_deferred_decisions("calendar", "spot")
    assert decisions[b.id].verdict is Verdict.ALLOW
    guard.post_action(b, "calendar", "spot", "parked", {}, decisions[b.id].intent_id)
    assert guard.pre_action(a, "calendar", "spot", "park", 1.0).verdict is Verdict.CONFLICT
    assert verdicts_of(guard.resolve_deferred("calendar", "spot")) == {a.id: Verdict.BLOCKED}


def test_deferred_winner_can_execute_after_the_boundary(make_space):
    """§6.2.3 phase 3: after the boundary the winner's execute is allowed (its winning
    intent is reused), the losers' stay BLOCKED and never run their tools (P37)."""
    space, guard, (a, b, c) = deferred_setup(make_space, [0.5, 0.95, 0.7])
    assert verdicts_of(guard.resolve_deferred("calendar", "spot"))[b.id] is Verdict.ALLOW
    loser_tool, winner_tool = Tool(), Tool()
    lost, _ = guard.execute(a, "calendar", "spot", "park", "parked", loser_tool, 0.5)
    won, result = guard.execute(b, "calendar", "spot", "park", "parked", winner_tool, 0.95)
    assert lost.verdict is Verdict.BLOCKED and loser_tool.calls == 0
    assert won.verdict is Verdict.ALLOW and winner_tool.calls == 1 and result
    assert [x.agent_id for x in actions_on(space, "calendar", "spot")] == [b.id]
    assert guard.pre_action(c, "calendar", "spot", "park", 0.7).verdict is Verdict.CONFLICT


def test_deferred_grant_lapses_when_the_winner_changes_its_plan(make_space):
    """§6.2.1: a grant belongs to the winning intent; a new intent waits for a boundary."""
    _, guard, (a, b) = deferred_setup(make_space, [0.5, 0.9])
    verdicts_of(guard.resolve_deferred("calendar", "spot"))
    assert guard.pre_action(b, "calendar", "spot", "park", 0.9).allowed
    assert guard.pre_action(b, "calendar", "spot", "park", 0.6).verdict is Verdict.BLOCKED
    assert verdicts_of(guard.resolve_deferred("calendar", "spot")) == {
        a.id: Verdict.BLOCKED,
        b.id: Verdict.ALLOW,
    }


def test_p14_p18_old_intents_within_ttl_are_included_expired_ones_not(make_space):
    """P14, P18: every intent still within its TTL at the boundary is compared, however old;
    an expired one is not."""
    space = make_space([scope(deferred=True)])
    guard = Guard(space)
    old_strong, expired, fresh = agent("old"), agent("expired"), agent("fresh")
    space.set_clock(T0)
    guard.pre_action(expired, "calendar", "spot", "park", 1.0)
    space.set_clock(T0 + 10)
    guard.pre_action(old_strong, "calendar", "spot", "park", 0.9)
    space.set_clock(T0 + TTL + 5)
    guard.pre_action(fresh, "calendar", "spot", "park", 0.2)
    verdicts = verdicts_of(guard.resolve_deferred("calendar", "spot"))
    assert verdicts == {old_strong.id: Verdict.ALLOW, fresh.id: Verdict.BLOCKED}


@HYPOTHESIS
@given(
    policy=st.sampled_from([ConflictPolicy.HIGHEST_CONFIDENCE, ConflictPolicy.FIRST_WRITER]),
    claims=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 3000)), min_size=1, max_size=8),
    boundary=st.integers(0, 4000),
)
def test_p15_p17_deferred_mutual_exclusion_and_fidelity(make_space, policy, claims, boundary):
    """P17: exactly one ALLOW per boundary among agents with active intents, the others
    BLOCKED; P15/P14: the winner is the policy's winner over ALL active intents at once."""
    with make_space.scoped([scope(policy=policy, deferred=True)]) as space:
        guard = Guard(space)
        order = sorted(enumerate(claims), key=lambda item: item[1][1])
        for index, (confidence, tick) in order:
            space.set_clock(T0 + tick)
            guard.pre_action(agent(f"a{index}"), "calendar", "spot", "park", confidence)
        space.set_clock(T0 + max(boundary, max(t for _, t in claims)))
        active = intents_on(space, "calendar", "spot")
        verdicts = verdicts_of(guard.resolve_deferred("calendar", "spot"))
        assert set(verdicts) == {i.agent_id for i in active}
        if not active:
            assert verdicts == {}
            return
        assert Counter(verdicts.values())[Verdict.ALLOW] == 1
        assert Counter(verdicts.values())[Verdict.BLOCKED] == len(active) - 1
        winner = winning_intent(active, policy)
        assert verdicts[winner.agent_id] is Verdict.ALLOW
        # the same boundary state gives the same answer (P11)
        assert verdicts_of(guard.resolve_deferred("calendar", "spot")) == verdicts


def test_deferred_first_writer_and_yield_all(make_space):
    """§6.2.2: deferred FIRST_WRITER picks the earliest; deferred YIELD_ALL blocks all and
    files Needs (P17 allows at most one ALLOW: here none)."""
    _, guard, agents = deferred_setup(make_space, [0.1, 0.9], ConflictPolicy.FIRST_WRITER)
    assert verdicts_of(guard.resolve_deferred("calendar", "spot"))[agents[0].id] is Verdict.ALLOW
    space, guard, agents = deferred_setup(make_space, [0.1, 0.9], ConflictPolicy.YIELD_ALL)
    decisions = guard.resolve_deferred_decisions("calendar", "spot")
    assert {d.verdict for d in decisions.values()} == {Verdict.BLOCKED}
    assert all(d.need_id is not None for d in decisions.values())
    assert len(space.read("calendar", mark_type=MarkType.NEED)) == 2


def test_deferred_single_claimant_is_allowed(make_space):
    """P17 with N = 1: the only claimant wins (also under YIELD_ALL: no conflict)."""
    _, guard, [only] = deferred_setup(make_space, [0.4], ConflictPolicy.YIELD_ALL)
    assert verdicts_of(guard.resolve_deferred("calendar", "spot")) == {only.id: Verdict.ALLOW}


def test_p16_resolve_all_deferred_reaches_every_pending_resource(make_space):
    """P16: one round-end boundary resolves every deferred (scope, resource) with active
    intents; immediate scopes are left alone."""
    space = make_space([scope(deferred=True), scope("rooms", policy=ConflictPolicy.FIRST_WRITER)])
    guard = Guard(space)
    a = Agent(name="a", scopes={"calendar": ALL_TYPES, "rooms": ALL_TYPES})
    b = agent("b")
    for resource in ("s1", "s2", "s3"):
        guard.pre_action(a, "calendar", resource, "park", 0.5)
    guard.pre_action(b, "calendar", "s2", "park", 0.9)
    guard.pre_action(a, "rooms", "r1", "book")
    results = guard.resolve_all_deferred()
    assert sorted(results) == [("calendar", "s1"), ("calendar", "s2"), ("calendar", "s3")]
    assert results[("calendar", "s2")] == {a.id: Verdict.BLOCKED, b.id: Verdict.ALLOW}
    assert results[("calendar", "s1")] == {a.id: Verdict.ALLOW}


def test_deferred_boundary_respects_an_existing_action(make_space):
    """P39 at the boundary: if an agent's action already holds the resource, no one else
    is allowed."""
    space, guard, (a, b) = deferred_setup(make_space, [0.2, 0.9])
    space.write(a, Action(scope="calendar", resource="spot", action="parked"))
    assert verdicts_of(guard.resolve_deferred("calendar", "spot")) == {
        a.id: Verdict.ALLOW,
        b.id: Verdict.BLOCKED,
    }


def twin(space):
    """The same space as another process would see it: the object itself in memory (one
    process), a second object on the same database and space name on Postgres."""
    if isinstance(space, PostgresMarkSpace):
        return PostgresMarkSpace(dsn=space.dsn, scopes=space.registered_scopes(), clock=space.now,
                                 space=space.space)
    return space


def test_p16_deferred_verdicts_are_shared_by_every_guard_on_the_space(make_space):
    """§6.2.1 phase 3, P12: the boundary's verdicts live with the space, so a Guard that did
    not run the boundary (another process, another task) lets the winner act and tells each
    loser it lost, and to whom (§6.2.3 verdict delivery, P38)."""
    space, boundary_guard, (a, b, c) = deferred_setup(make_space, [0.5, 0.95, 0.7])
    assert verdicts_of(boundary_guard.resolve_deferred("calendar", "spot"))[b.id] is Verdict.ALLOW
    with contextlib.closing(twin(space)) as elsewhere:
        guard = Guard(elsewhere)
        lost = guard.pre_action(a, "calendar", "spot", "park", 0.5)
        assert lost.verdict is Verdict.BLOCKED and lost.check is GuardCheck.DEFERRED
        assert lost.winning_intent is not None and lost.winning_intent.agent_id == b.id
        assert "lost" in lost.reason
        tool = Tool()
        won, _ = guard.execute(b, "calendar", "spot", "park", "parked", tool, 0.95)
        assert won.verdict is Verdict.ALLOW and tool.calls == 1
        assert [x.agent_id for x in actions_on(elsewhere, "calendar", "spot")] == [b.id]
    assert boundary_guard.pre_action(c, "calendar", "spot", "park", 0.7).verdict is (
        Verdict.CONFLICT
    )


def test_p17_a_later_boundary_supersedes_an_earlier_grant_in_every_guard(make_space):
    """P17: guard X grants B at one boundary; C outbids and guard Y's later boundary grants
    C. X must not still let B act (two ALLOWs, two actions on one exclusive resource):
    only C acts, through either guard."""
    space, guard_x, (a, b) = deferred_setup(make_space, [0.5, 0.9])
    assert guard_x.resolve_deferred("calendar", "spot")[b.id].verdict is Verdict.ALLOW
    with contextlib.closing(twin(space)) as elsewhere:
        guard_y = Guard(elsewhere)
        c = agent("late")
        assert guard_y.pre_action(c, "calendar", "spot", "park", 1.0).verdict is (
            Verdict.BLOCKED
        )
        assert verdicts_of(guard_y.resolve_deferred("calendar", "spot")) == {
            a.id: Verdict.BLOCKED, b.id: Verdict.BLOCKED, c.id: Verdict.ALLOW,
        }
        stale = guard_x.pre_action(b, "calendar", "spot", "park", 0.9)
        assert stale.verdict is Verdict.BLOCKED
        assert stale.winning_intent is not None and stale.winning_intent.agent_id == c.id
        tools = {who.name: Tool() for who in (a, b, c)}
        for who, confidence, via in ((b, 0.9, guard_x), (a, 0.5, guard_y), (c, 1.0, guard_x)):
            via.execute(who, "calendar", "spot", "park", "parked", tools[who.name], confidence)
        assert {name: tool.calls for name, tool in tools.items()} == {
            a.name: 0, b.name: 0, c.name: 1,
        }
        assert [x.agent_id for x in actions_on(space, "calendar", "spot")] == [c.id]


def test_deferred_grant_is_consumed_by_the_winners_action(make_space):
    """§6.2.1: an ALLOW is used once. The stored verdict records the action that consumed
    it, and the winner's next plan on the resource waits for the next boundary."""
    space, guard, (a, b) = deferred_setup(make_space, [0.3, 0.8])
    verdicts_of(guard.resolve_deferred("calendar", "spot"))
    granted = space.deferred_verdict("calendar", "spot", b.id)
    assert granted.allowed and granted.consumed_by is None
    decision = guard.pre_action(b, "calendar", "spot", "park", 0.8)
    assert decision.allowed and decision.intent_id == granted.intent_id
    action_id = guard.post_action(b, "calendar", "spot", "parked", {}, decision.intent_id)
    assert space.deferred_verdict("calendar", "spot", b.id).consumed_by == action_id
    assert not space.deferred_verdict("calendar", "spot", a.id).allowed
    again = guard.pre_action(b, "calendar", "spot", "park", 0.8)
    assert again.verdict is Verdict.BLOCKED and again.check is GuardCheck.DEFERRED


def test_deferred_verdicts_expire_with_their_intents(make_space):
    """§2.2, P13: a verdict lasts as long as the intent it is about; past the TTL it is gone
    and the agent's next intent waits for a new boundary."""
    space, guard, (a, b) = deferred_setup(make_space, [0.3, 0.8])
    verdicts_of(guard.resolve_deferred("calendar", "spot"))
    stored = space.deferred_verdict("calendar", "spot", b.id)
    assert stored.expires_at == space.get(stored.intent_id).created_at + TTL
    space.set_clock(stored.expires_at)
    assert space.deferred_verdict("calendar", "spot", b.id) == stored
    assert guard.pre_action(b, "calendar", "spot", "park", 0.8).allowed
    space.set_clock(stored.expires_at + 1)
    assert space.deferred_verdict("calendar", "spot", b.id) is None
    assert space.deferred_verdict("calendar", "spot", a.id) is None
    assert guard.pre_action(b, "calendar", "spot", "park", 0.8).verdict is Verdict.BLOCKED


# --------------------------------------------------------------------------- post_action


def test_post_action_supersedes_the_given_intent(make_space):
    """§9.2 post_action step 2, P47 style: the intent is invisible once the action is in."""
    space = make_space([scope()])
    guard = Guard(space)
    me = agent("me")
    decision = guard.pre_action(me, "calendar", "r", "book")
    action_id = guard.post_action(me, "calendar", "r", "booked", {"ok": True}, decision.intent_id)
    assert intents_on(space, "calendar", "r") == []
    assert space.get(action_id).supersedes == decision.intent_id


def test_post_action_finds_the_agents_own_intent_when_none_is_given(make_space):
    """§2.2 SHOULD: the action supersedes the agent's active intent on the resource."""
    space = make_space([scope()])
    guard = Guard(space)
    me = agent("me")
    decision = guard.pre_action(me, "calendar", "r", "book")
    action_id = guard.post_action(me, "calendar", "r", "booked", {})
    assert space.get(action_id).supersedes == decision.intent_id


def test_post_action_race_later_action_supersedes_and_warns(make_space):
    """§6.3: two actions on one resource: the later supersedes the earlier one, and the
    agent whose action was superseded gets a warning mark."""
    space = make_space([scope()])
    guard = Guard(space)
    early, late = agent("early"), agent("late")
    early_id = guard.post_action(early, "calendar", "r", "booked", {"seat": 1})
    space.set_clock(T0 + 1)
    late_id = guard.post_action(late, "calendar", "r", "booked", {"seat": 2})
    [holder] = actions_on(space, "calendar", "r")
    assert holder.id == late_id and space.get(late_id).supersedes == early_id
    warnings = [
        m
        for m in space.read("calendar", mark_type=MarkType.WARNING)
        if isinstance(m, Warning) and m.invalidates == early_id
    ]
    assert len(warnings) == 1 and warnings[0].reason
    assert guard.pre_action(early, "calendar", "r", "book").verdict is Verdict.CONFLICT


def test_post_action_failed_does_not_supersede_a_rival(make_space):
    """§2.3 + §6.3: a failed action claims nothing, so it does not displace a real one."""
    space = make_space([scope()])
    guard = Guard(space)
    holder, failing = agent("holder"), agent("failing")
    held = guard.post_action(holder, "calendar", "r", "booked", {})
    guard.post_action(failing, "calendar", "r", "booked", {"error": "x"}, failed=True)
    assert [a.id for a in actions_on(space, "calendar", "r") if not a.failed] == [held]


# --------------------------------------------------------------------------- write_mark


@pytest.mark.parametrize(
    "mark",
    [
        Intent(scope="calendar", resource="r", action="book"),
        Action(scope="calendar", resource="r", action="booked"),
    ],
)
def test_write_mark_refuses_intents_and_actions(make_space, mark):
    """§9.7: intents and actions go through pre_action/post_action; write_mark raises a
    ValueError and stores nothing."""
    space = make_space([scope()])
    guard = Guard(space)
    with pytest.raises(ValueError) as caught:
        guard.write_mark(agent("me"), mark)
    assert isinstance(caught.value, GuardedMarkType | InvalidMark)
    assert space.active_marks() == []


def test_write_mark_stores_observations_warnings_and_needs(make_space):
    """§9.4: the agent's voluntary marks go through write_mark into the space."""
    space = make_space([scope()])
    guard = Guard(space)
    me = agent("me")
    ids = [
        guard.write_mark(me, Observation(scope="calendar", topic="load", content={"v": 1})),
        guard.write_mark(me, Warning(scope="calendar", topic="load", reason="stale")),
        guard.write_mark(me, Need(scope="calendar", question="which room?")),
    ]
    assert {m.id for m in space.active_marks()} == set(ids)


def test_write_mark_keeps_the_spaces_errors(make_space):
    """§8.1 through the guard: unauthorized and unknown-scope writes raise typed errors."""
    space = make_space([scope()])
    guard = Guard(space)
    with pytest.raises(UnauthorizedWrite):
        guard.write_mark(agent("mute", types=["need"]), Observation(scope="calendar", topic="t"))
    with pytest.raises(UnknownScope):
        guard.write_mark(agent("x", "nowhere"), Observation(scope="nowhere", topic="t"))
    assert space.active_marks() == []


# --------------------------------------------------------------------------- bad input


def test_bad_input_raises_and_stores_nothing(make_space):
    """Bad input: out-of-range confidence, empty resource, unknown scope raise typed errors."""
    space = make_space([scope()])
    guard = Guard(space)
    me = agent("me")
    with pytest.raises(InvalidMark):
        guard.pre_action(me, "calendar", "r", "book", 1.5)
    with pytest.raises(InvalidMark):
        guard.pre_action(me, "calendar", "", "book")
    with pytest.raises(UnknownScope):
        guard.pre_action(me, "nowhere", "r", "book")
    with pytest.raises(UnknownScope):
        guard.execute(me, "nowhere", "r", "book", "booked", Tool())
    with pytest.raises(InvalidMark):
        guard.post_action(me, "calendar", "r", "booked", {"x": float("inf")})
    assert space.active_marks() == []


def test_hierarchical_scopes_through_the_guard(make_space):
    """P23 via the guard: permission on "calendar" covers "calendar/rooms"; decisions and
    locks are per exact child scope."""
    space = make_space([scope()])
    guard = Guard(space)
    me, other = agent("me"), agent("other")
    assert guard.pre_action(me, "calendar/rooms", "r", "book").allowed
    assert guard.pre_action(other, "calendar/desks", "r", "book").allowed
    assert guard.pre_action(other, "calendar/rooms", "r", "book", 0.1).verdict is (Verdict.CONFLICT)


# --------------------------------------------------------------------------- serialization


class LockSpy:
    """Wraps a space; records lock() keys and whether writes happen inside a lock."""

    def __init__(self, space) -> None:
        self._space = space
        self.locks: list[tuple[str, str]] = []
        self.writes_outside: list[str] = []
        self._depth = threading.local()

    def __getattr__(self, name):
        return getattr(self._space, name)

    def lock(self, scope_name, resource):
        spy = self
        inner = self._space.lock(scope_name, resource)

        class _Ctx:
            def __enter__(self):
                inner.__enter__()
                spy.locks.append((scope_name, resource))
                spy._depth.n = getattr(spy._depth, "n", 0) + 1

            def __exit__(self, *exc):
                spy._depth.n -= 1
                return inner.__exit__(*exc)

        return _Ctx()

    def write(self, who, mark):
        if getattr(self._depth, "n", 0) == 0:
            self.writes_outside.append(mark.mark_type.value)
        return self._space.write(who, mark)


def test_guard_serializes_through_space_lock(make_space):
    """§6.2 / contract: every decision and write of pre_action, post_action, execute and
    resolve_deferred happens inside space.lock(scope, resource)."""
    spy = LockSpy(make_space([scope(), scope("parking", deferred=True)]))
    guard = Guard(spy)
    a = Agent(name="a", scopes={"calendar": ALL_TYPES, "parking": ALL_TYPES})
    guard.pre_action(a, "calendar", "r1", "book")
    guard.post_action(a, "calendar", "r1", "booked", {})
    guard.execute(a, "calendar", "r2", "book", "booked", Tool())
    guard.pre_action(a, "parking", "p", "park")
    guard.resolve_deferred("parking", "p")
    assert spy.writes_outside == []
    assert set(spy.locks) == {("calendar", "r1"), ("calendar", "r2"), ("parking", "p")}


@pytest.mark.parametrize("policy", [ConflictPolicy.FIRST_WRITER, ConflictPolicy.HIGHEST_CONFIDENCE])
def test_threads_racing_execute_run_each_tool_once_per_resource(make_space, policy):
    """P12/P39 under concurrency: threads racing execute on shared resources run the tool
    once per resource (the check-act-record is atomic per (scope, resource))."""
    space = make_space([scope(policy=policy)], clock=None)
    guard = Guard(space)
    agents = [agent(f"t{i}") for i in range(8)]
    resources = [f"r{i}" for i in range(4)]
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(len(agents))

    def tool_for(resource):
        def run():
            with lock:
                calls[resource] += 1
            return {"by": resource}

        return run

    def worker(each, index):
        barrier.wait()
        for offset in range(len(resources)):
            resource = resources[(index + offset) % len(resources)]
            guard.execute(each, "calendar", resource, "book", "booked", tool_for(resource), 0.5)

    threads = [threading.Thread(target=worker, args=(a, i)) for i, a in enumerate(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == Counter(dict.fromkeys(resources, 1))
    for resource in resources:
        assert len([a for a in actions_on(space, "calendar", resource) if not a.failed]) == 1


def test_threads_racing_pre_action_first_writer_one_allow_each(make_space):
    """P12 / mutual exclusion under FIRST_WRITER: racing pre_actions give one ALLOW per
    resource (the earliest intent), whatever the interleaving."""
    space = make_space([scope(policy=ConflictPolicy.FIRST_WRITER)], clock=None)
    guard = Guard(space)
    agents = [agent(f"t{i}") for i in range(8)]
    results: list[tuple[str, GuardDecision]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(agents))

    def worker(each):
        barrier.wait()
        for resource in ("x", "y", "z"):
            decision = guard.pre_action(each, "calendar", resource, "book")
            with lock:
                results.append((resource, decision))

    threads = [threading.Thread(target=worker, args=(a,)) for a in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    allowed = Counter(resource for resource, d in results if d.allowed)
    assert allowed == Counter({"x": 1, "y": 1, "z": 1})
