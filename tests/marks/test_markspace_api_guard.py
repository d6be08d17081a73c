"""The guard and its collaborators through the markspace package's names and signatures
(issue 15): a program written against ``markspace.guard`` / ``.barrier`` / ``.budget`` /
``.rate_limit`` runs on ``agentpost.marks`` after changing its imports. Written from the
package's API; both backends where a space is involved.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from agentpost.marks import barrier as barrier_module
from agentpost.marks import budget as budget_module
from agentpost.marks import guard as guard_module
from agentpost.marks import rate_limit as rate_limit_module
from agentpost.marks.core import (
    Action,
    Agent,
    AgentManifest,
    ConflictPolicy,
    Intent,
    MarkType,
    Need,
    Observation,
    Scope,
    ScopeRateLimit,
    TokenBudget,
)

AgentBarrier = barrier_module.AgentBarrier
BarrierSnapshot = barrier_module.BarrierSnapshot
BudgetStatus = budget_module.BudgetStatus
BudgetTracker = budget_module.BudgetTracker
Guard = guard_module.Guard
GuardDecision = guard_module.GuardDecision
GuardVerdict = guard_module.GuardVerdict
RateLimitTracker = rate_limit_module.RateLimitTracker

TYPES = ["intent", "action", "observation", "warning", "need"]


def member(name: str, budget: TokenBudget | None = None) -> Agent:
    manifest = AgentManifest(budget=budget) if budget is not None else None
    return Agent(name=name, scopes={"cal": TYPES, "lot": TYPES}, manifest=manifest)


def spaces(make_space):
    return make_space([
        Scope(name="cal", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE),
        Scope(name="lot", deferred=True),
    ])


def test_names_values_and_positional_construction():
    """The package's enum values, the deprecated alias, GuardDecision's positional fields."""
    assert [v.value for v in GuardVerdict] == ["allow", "conflict", "blocked", "denied"]
    assert guard_module.Verdict is GuardVerdict
    assert [v.value for v in guard_module.PolicyVerdict] == ["allow", "rewrite", "reject", "flag"]
    assert [v.value for v in BudgetStatus] == [
        "ok", "warning_input", "warning_output", "exhausted_input", "exhausted_output"]
    decision = GuardDecision(GuardVerdict.CONFLICT, "lost", None, None)
    assert (decision.verdict, decision.reason, decision.intent_id, decision.winning_intent,
            decision.conflicting_intents) == (GuardVerdict.CONFLICT, "lost", None, None, [])
    result = guard_module.PolicyResult(guard_module.PolicyVerdict.ALLOW)
    assert (result.content, result.reason, result.metadata) == (None, None, None)
    assert issubclass(guard_module.ContentPolicyError, guard_module.WriteRejected)


def test_guard_positional_constructor_defaults_and_tool_arguments(make_space):
    """Guard(space, envelope, principal_token, telemetry, content_policies); pre_action and
    execute default to confidence 0.5; execute passes tool_args / tool_kwargs; post_action
    takes a result and returns the action's id (superseding the intent)."""
    space = spaces(make_space)
    token = uuid.uuid4()
    guard = Guard(space, None, token, None, None)
    alice, bob = member("alice"), member("bob")
    first = guard.pre_action(alice, "cal", "mon", "book")
    assert first.verdict is GuardVerdict.ALLOW
    assert space.get(first.intent_id).confidence == 0.5
    calls = []
    decision, result = guard.execute(
        bob, "cal", "tue", "book", "booked", lambda a, b=0: calls.append((a, b)) or {"a": a},
        tool_args=(1,), tool_kwargs={"b": 2},
    )
    assert decision.verdict is GuardVerdict.ALLOW and calls == [(1, 2)] and result == {"a": 1}
    action_id = guard.post_action(alice, "cal", "mon", "booked", {"ok": True}, first.intent_id)
    action = space.get(action_id)
    assert isinstance(action, Action) and action.supersedes == first.intent_id
    assert guard.cleanup_locks() == 0


def test_resolve_deferred_returns_decisions_and_rechecks_agents(make_space):
    """resolve_deferred(scope, resource, agents=None) -> {agent id: GuardDecision}; with
    ``agents``, an agent missing from it is DENIED and left out of the comparison."""
    space = spaces(make_space)
    guard = Guard(space)
    low, high, gone = member("low"), member("high"), member("gone")
    for who, confidence in ((low, 0.3), (high, 0.6), (gone, 0.9)):
        assert guard.pre_action(who, "lot", "p1", "park", confidence).verdict is (
            GuardVerdict.BLOCKED)
    decisions = guard.resolve_deferred("lot", "p1", {low.id: low, high.id: high})
    assert all(isinstance(d, GuardDecision) for d in decisions.values())
    assert {a: d.verdict for a, d in decisions.items()} == {
        low.id: GuardVerdict.BLOCKED, high.id: GuardVerdict.ALLOW, gone.id: GuardVerdict.DENIED}
    assert isinstance(decisions[low.id].winning_intent, Intent)
    assert decisions[low.id].winning_intent.agent_id == high.id


def test_barrier_through_the_guard(make_space):
    """get_barrier (frozen snapshot or None), get_or_create_barrier, set_barrier; a barred
    write is refused by write_mark and pre_action answers DENIED."""
    space = spaces(make_space)
    token = uuid.uuid4()
    guard = Guard(space, principal_token=token)
    who = member("who")
    assert guard.get_barrier(who.id) is None
    guard.get_or_create_barrier(who.id).narrow("cal", "observation")
    snap = guard.get_barrier(who.id)
    assert isinstance(snap, BarrierSnapshot) and snap.revoked == {("cal", "observation")}
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.flag_count = 3  # type: ignore[misc]
    with pytest.raises(guard_module.WriteRejected):
        guard.write_mark(who, Observation(scope="cal/sub", topic="t"))
    guard.write_mark(who, Need(scope="cal", question="may I?"))
    replacement = AgentBarrier(who.id, token)
    replacement.narrow_all("intent")
    guard.set_barrier(who.id, replacement)
    assert guard.pre_action(who, "cal", "r", "book").verdict is GuardVerdict.DENIED
    assert replacement.restore_all(token) is True
    assert guard.pre_action(who, "cal", "r", "book").verdict is GuardVerdict.ALLOW


def test_agent_barrier_package_semantics():
    """AgentBarrier(agent_id, principal token): string type values, exact is_allowed,
    hierarchical is_allowed_checked, restore answering False for a wrong token (P45),
    increment_flags, needs_required, snapshot."""
    token = uuid.uuid4()
    barrier = AgentBarrier(uuid.uuid4(), token)
    barrier.narrow("hr", "observation")
    assert not barrier.is_allowed("hr", "observation")
    assert barrier.is_allowed("hr/payroll", "observation")
    assert not barrier.is_allowed_checked("hr/payroll", MarkType.OBSERVATION)
    assert barrier.restore("hr", "observation", uuid.uuid4()) is False
    assert not barrier.is_allowed("hr", "observation")
    barrier.require_need("hr")
    assert barrier.needs_required("hr/payroll") and not barrier.needs_required("ops")
    assert (barrier.increment_flags(), barrier.increment_flags()) == (1, 2)
    barrier.flagged_scopes.add("hr")
    snap = barrier.snapshot()
    assert (snap.flag_count, snap.flagged_scopes, snap.require_need_scopes) == (
        2, frozenset({"hr"}), frozenset({"hr"}))
    assert not snap.is_allowed_checked("hr/x", "observation")
    assert barrier.restore("hr", "observation", token) is True
    assert barrier.is_allowed_checked("hr/payroll", "observation")
    assert barrier.restore_all(token) is True and barrier.flag_count == 0


def test_budget_through_the_guard(make_space):
    """record_round_tokens -> BudgetStatus (OK without a budget, P59; the warning before the
    stop, its non-blocking Need in `_system`, P60); check_budget_activation's reason once
    spent (P61); get_budget_status's tuple; update_budget needs the principal token and
    resumes the agent (P62)."""
    space = spaces(make_space)
    token = uuid.uuid4()
    guard = Guard(space, principal_token=token)
    free = member("free")
    assert guard.record_round_tokens(free, 10, 10) is BudgetStatus.OK
    assert guard.get_budget_status(free.id) is None
    spender = member("spender", TokenBudget(max_input_tokens_total=100))
    assert guard.record_round_tokens(spender, 50, 0) is BudgetStatus.OK
    assert guard.record_round_tokens(spender, 50, 0) is BudgetStatus.WARNING_INPUT
    needs = space.read(scope="_system", mark_type=MarkType.NEED)
    assert [(n.blocking, n.context["agent_id"], n.context["dimension"]) for n in needs] == [
        (False, str(spender.id), "input")]
    assert guard.record_round_tokens(spender, 0, 0) is BudgetStatus.EXHAUSTED_INPUT
    assert "exhausted" in guard.check_budget_activation(spender)
    assert guard.get_budget_status(spender.id) == (100, 0, True)
    bigger = TokenBudget(max_input_tokens_total=500)
    assert guard.update_budget(spender, bigger, uuid.uuid4()) is False
    assert guard.get_budget_status(spender.id) == (100, 0, True)
    assert guard.update_budget(spender, bigger, token) is True
    assert guard.get_budget_status(spender.id) == (100, 0, False)


def test_budget_tracker_package_semantics():
    """BudgetTracker: per-agent totals (P63), warnings before exhaustion, sticky exhaustion
    cleared only by a budget above the usage."""
    budget = TokenBudget(max_input_tokens_total=100, max_output_tokens_total=10)
    tracker = BudgetTracker()
    tracker.record_input(90)
    tracker.record_output(10)
    assert tracker.check_lifetime(budget) is BudgetStatus.WARNING_INPUT
    tracker.warning_emitted_input = True
    assert tracker.check_lifetime(budget) is BudgetStatus.WARNING_OUTPUT
    tracker.warning_emitted_output = True
    assert tracker.check_lifetime(budget) is BudgetStatus.EXHAUSTED_OUTPUT
    assert tracker.exhausted and tracker.is_exhausted(budget)
    assert tracker.try_clear_exhaustion(budget) is False
    assert tracker.try_clear_exhaustion(TokenBudget(max_input_tokens_total=100)) is True
    with pytest.raises(ValueError):
        tracker.record_input(-1)
    assert (tracker.total_input_consumed, tracker.total_output_consumed) == (90, 10)


def test_rate_limit_tracker_sliding_windows():
    """RateLimitTracker.check_and_record: the per-agent cap (P64), then the fleet cap (P65),
    in sliding windows; a refused write is not counted."""
    tracker = RateLimitTracker()
    limit = ScopeRateLimit(max_writes_per_agent_per_window=2, max_total_writes_per_window=3,
                           window_seconds=10.0)
    a, b = uuid.uuid4(), uuid.uuid4()
    assert tracker.check_and_record("s", a, limit, 0.0) is None
    assert tracker.check_and_record("s", a, limit, 5.0) is None
    assert "limit" in tracker.check_and_record("s", a, limit, 6.0)
    assert tracker.check_and_record("s", b, limit, 6.0) is None
    assert "cap" in tracker.check_and_record("s", b, limit, 9.0)
    assert tracker.check_and_record("s", b, limit, 10.0) is not None  # 0.0 still counts
    assert tracker.check_and_record("s", b, limit, 10.5) is None  # 0.0 aged out
