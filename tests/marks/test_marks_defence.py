"""The optional defence layers of agentpost.marks (Markspace spec §9.7–§9.12): statistical
envelope (P40–P43), absorbing barrier (P44–P45), diagnostic probe (P46), telemetry (P57–P58),
token budgets (P59–P63) and scope rate limits (P64–P66). Each test names its P-number.

Spaces come from the ``make_space(scopes, clock)`` fixture below (in memory here; the lead
parametrizes it over the Postgres backend too). Time is the space's injectable clock.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import Counter
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentpost.marks.barrier import AgentBarrier, PrincipalTokenRejected
from agentpost.marks.budget import (
    BudgetLedger,
    BudgetStatus,
    InvalidTokenCount,
    estimate_tokens,
    truncate_to_budget,
)
from agentpost.marks.core import (
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
    UnauthorizedWrite,
    UnknownScope,
    Warning,
)
from agentpost.marks.envelope import (
    AnomalyKind,
    EnvelopeVerdict,
    StatisticalEnvelope,
    Welford,
    WindowedDetector,
)
from agentpost.marks.guard import (
    SYSTEM_AGENT_ID,
    SYSTEM_SCOPE,
    BarrierDenied,
    BudgetExhausted,
    EnvelopeRestricted,
    Guard,
    GuardCheck,
    RateLimited,
    Verdict,
    WriteRejected,
)
from agentpost.marks.probe import (
    ACK_TOOL,
    DiagnosticProbe,
    ProbeIsolationError,
    ProbeVerdict,
)
from agentpost.marks.rate_limit import RateLimiter, RateLimitKind
from agentpost.marks.telemetry import (
    ACTIVE_MARKS,
    BUDGET_REMAINING,
    CONFLICTS_RESOLVED,
    EVENT_EXECUTE,
    EVENT_SYSTEM_WRITE_FAILED,
    EVENT_WRITE_MARK,
    MARKS_WRITTEN,
    NEEDS_PENDING,
    TOKENS_INPUT,
    Emitter,
    FailingSink,
    InMemorySink,
    NullSink,
    StructuredLogSink,
)
from marks_backends import T0

HYPOTHESIS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TOKEN = "principal-secret"
W = 300.0  # the envelope's default window
#: closed windows before the package's default detector judges (WelfordConfig.min_samples)
BASELINE = 10
START = T0 - (T0 % W)  # a window boundary, so window arithmetic in tests is exact
ALL_TYPES = ["intent", "action", "observation", "warning", "need"]


def agent(name: str, scopes=("feed",), manifest: AgentManifest | None = None) -> Agent:
    return Agent(name=name, scopes={s: ALL_TYPES for s in scopes}, manifest=manifest)


def at(window: int, second: float = 1.0) -> float:
    return START + window * W + second


def obs(scope_name: str = "feed", topic: str = "x") -> Observation:
    return Observation(scope=scope_name, topic=topic, content={"v": 1})


def snapshot(space) -> set:
    return {m.id for m in space.active_marks()}


def guarded(make_space, scopes=("feed", "other", "third"), **kwargs):
    space = make_space([Scope(name=s) for s in scopes], clock=at(0))
    envelope = StatisticalEnvelope(principal_token=TOKEN)
    guard = Guard(space, envelope=envelope, principal_token=TOKEN, **kwargs)
    return space, envelope, guard


def steady(space, guard, who, windows: int, per_window: int = 2, scope_name: str = "feed"):
    """A regular baseline: ``per_window`` observations in each of ``windows`` windows."""
    for window in range(windows):
        space.set_clock(at(window))
        for _ in range(per_window):
            guard.write_mark(who, obs(scope_name))


def flood(space, guard, who, window: int, count: int, scope_name: str = "feed"):
    """``count`` write attempts in ``window``; returns the rejections."""
    space.set_clock(at(window))
    rejected = []
    for _ in range(count):
        try:
            guard.write_mark(who, obs(scope_name))
        except WriteRejected as exc:
            rejected.append(exc)
    return rejected


# =========================================================================== envelope


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=50))
def test_welford_matches_the_two_pass_statistics(values):
    """§9.7 (the basis of P40–P43): Welford's online mean and variance equal the two-pass ones."""
    acc = Welford()
    for value in values:
        acc.update(value)
    assert acc.mean == pytest.approx(statistics.fmean(values), rel=1e-9, abs=1e-6)
    assert acc.variance == pytest.approx(statistics.variance(values), rel=1e-6, abs=1e-3)


@given(
    bursts=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    agents=st.integers(1, 4),
)
def test_p41_cold_start_is_always_normal(bursts, agents):
    """P41: with fewer than min_samples closed windows, check() is NORMAL whatever the agent
    does, concentration included."""
    envelope = StatisticalEnvelope(min_samples=5)
    ids = [uuid4() for _ in range(agents)]
    for window, burst in enumerate(bursts):
        for index in range(burst):
            who = ids[index % agents]
            kind = MarkType.NEED if index % 3 else MarkType.OBSERVATION
            envelope.record_attempt(who, kind, scope="feed", at=at(window), topic="x")
            assert envelope.check(who, at(window)) is EnvelopeVerdict.NORMAL
    assert not envelope.detector_for(ids[0]).is_ready()


def test_rate_spike_restricts_after_the_baseline(make_space):
    """§9.7 rate check: a window well above mean + k·stddev makes the agent RESTRICTED, and
    the flag names the scope and type (the write that crossed the line is refused, P42)."""
    space, envelope, guard = guarded(make_space)
    spiky = agent("spiky")
    steady(space, guard, spiky, windows=BASELINE)
    rejected = flood(space, guard, spiky, window=BASELINE, count=10)
    assert isinstance(rejected[0], EnvelopeRestricted)
    assert all(isinstance(r, BarrierDenied) for r in rejected[1:])
    finding = envelope.evaluate(spiky.id, space.now())
    assert finding.verdict is EnvelopeVerdict.RESTRICTED
    assert (finding.kind, finding.scope, finding.mark_type) == (
        AnomalyKind.RATE,
        "feed",
        MarkType.OBSERVATION,
    )


def test_restriction_invalidates_recent_observations_and_files_an_audit_need(make_space):
    """§9.7 escalation step 4: warnings on the agent's recent observations in the flagged
    scope (they drop out of reads) plus an audit Need for the principal."""
    space, _, guard = guarded(make_space)
    spiky = agent("spiky")
    steady(space, guard, spiky, windows=BASELINE)
    flood(space, guard, spiky, window=BASELINE, count=8)
    recent = [
        m
        for m in space.read("feed", mark_type=MarkType.OBSERVATION)
        if m.agent_id == spiky.id and m.created_at >= space.now() - W
    ]
    assert recent == []
    warnings = [m for m in space.read("feed", mark_type=MarkType.WARNING)]
    assert warnings and all(w.agent_id == SYSTEM_AGENT_ID and w.invalidates for w in warnings)
    [audit] = [m for m in space.read("feed", mark_type=MarkType.NEED) if isinstance(m, Need)]
    assert audit.context["kind"] == "envelope_restriction"
    assert audit.context["agent_id"] == str(spiky.id)


def test_p40_restriction_is_sticky_until_the_principal_resets(make_space):
    """P40: once RESTRICTED, check() stays RESTRICTED in later, quiet windows until
    reset(agent, principal_token); a wrong token is refused and changes nothing."""
    space, envelope, guard = guarded(make_space)
    spiky = agent("spiky")
    steady(space, guard, spiky, windows=BASELINE)
    flood(space, guard, spiky, window=BASELINE, count=8)
    for window in range(BASELINE + 1, 20):
        assert envelope.check(spiky.id, at(window)) is EnvelopeVerdict.RESTRICTED
    with pytest.raises(PrincipalTokenRejected):
        envelope.reset(spiky.id, "guess")
    assert envelope.check(spiky.id, at(20)) is EnvelopeVerdict.RESTRICTED
    envelope.reset(spiky.id, TOKEN)
    assert envelope.check(spiky.id, at(20)) is EnvelopeVerdict.NORMAL


@HYPOTHESIS
@given(
    quiet=st.lists(st.integers(0, 3), min_size=1, max_size=8),
)
def test_p40_sticky_for_any_later_activity(quiet):
    """P40 for all t' > t: whatever the agent does afterwards, RESTRICTED holds."""
    envelope = StatisticalEnvelope(principal_token=TOKEN, min_samples=3)
    who = uuid4()
    for window in range(3):
        envelope.record_attempt(who, MarkType.OBSERVATION, scope="feed", at=at(window))
    for _ in range(20):
        envelope.record_attempt(who, MarkType.OBSERVATION, scope="feed", at=at(3))
    assert envelope.check(who, at(3)) is EnvelopeVerdict.RESTRICTED
    for offset, count in enumerate(quiet, start=4):
        for _ in range(count):
            envelope.record_attempt(who, MarkType.OBSERVATION, scope="feed", at=at(offset))
        assert envelope.check(who, at(offset, 299)) is EnvelopeVerdict.RESTRICTED


def test_type_shift_restricts():
    """§9.7 check 2, our windowed reading (every mark type counted): a window whose type mix
    is far from the history (distance > 0.5)."""
    envelope = StatisticalEnvelope(window_seconds=W)
    rates = {"observation": 120.0, "warning": 60.0, "need": 60.0}  # 10, 5, 5 per window
    who = agent("shifty", manifest=AgentManifest(expected_activity=rates))
    envelope.register(who)
    for _ in range(8):
        envelope.record_attempt(who.id, MarkType.NEED, scope="feed", at=at(0))
    finding = envelope.evaluate(who.id, at(0))
    assert finding.verdict is EnvelopeVerdict.RESTRICTED
    assert (finding.kind, finding.mark_type) == (AnomalyKind.TYPE_SHIFT, MarkType.NEED)


def test_burst_straddling_a_window_boundary():
    """§9.7 check 1: current + previous > 2·threshold flags a burst split across windows."""
    detector = WindowedDetector(k=1.0)
    detector.seed_baseline({MarkType.OBSERVATION: 2.0})
    for _ in range(8):
        detector.record(MarkType.OBSERVATION, at(0))  # late in window 0, never checked
    for _ in range(4):
        detector.record(MarkType.OBSERVATION, at(1))
    threshold = detector.threshold(MarkType.OBSERVATION)
    assert 4 <= threshold < 8
    anomaly = detector.anomaly(at(1))
    assert anomaly is not None and anomaly.kind is AnomalyKind.BURST


def test_declared_baseline_removes_the_cold_start(make_space):
    """§9.7 declared baselines: expected_activity seeds the detector at registration, so a
    deviation is flagged in the very first window; the declared rate itself is fine."""
    space, envelope, guard = guarded(make_space)
    manifest = AgentManifest(expected_activity={"observation": 24.0})  # 2 per window
    declared = agent("declared", manifest=manifest)
    guard.write_mark(declared, obs())
    guard.write_mark(declared, obs())
    assert envelope.detector_for(declared.id).is_ready()
    assert envelope.check(declared.id, space.now()) is EnvelopeVerdict.NORMAL
    rejected = flood(space, guard, declared, window=0, count=10)
    assert rejected and isinstance(rejected[0], EnvelopeRestricted)


def test_seeded_variance_is_a_quarter_of_the_mean_squared():
    """§9.7: synthetic variance = 25% of mean² (stddev = half the mean)."""
    detector = WindowedDetector()
    detector.seed_baseline({MarkType.OBSERVATION: 8.0})
    stats = detector.stats[MarkType.OBSERVATION]
    assert stats.mean == 8.0 and stats.stddev == pytest.approx(4.0)


def test_windowed_export_carries_the_baseline():
    """§9.7 export/import on our windowed engine: the package's format over every mark type
    (its one window count stands for both counts); an import makes a fresh detector judge
    with the same baseline and never lowers a window count."""
    detector = WindowedDetector()
    detector.seed_baseline({MarkType.OBSERVATION: 8.0})
    exported = json.loads(json.dumps(detector.export_state()))
    assert exported["completed_windows"] == exported["active_windows"] == 5
    assert exported["welford_n"] == {t.value: 5 for t in MarkType}
    means = {t.value: 8.0 if t is MarkType.OBSERVATION else 0.0 for t in MarkType}
    assert exported["welford_mean"] == means
    assert exported["welford_m2"]["observation"] == pytest.approx(0.25 * 64 * 4)
    copy = WindowedDetector()
    assert not copy.is_ready()
    copy.import_state(exported)
    assert copy.is_ready() and copy.stats == detector.stats
    assert copy.threshold(MarkType.OBSERVATION) == detector.threshold(MarkType.OBSERVATION)
    ahead = WindowedDetector(windows_completed=9)
    ahead.import_state(exported)
    assert ahead.windows_completed == 9


def test_concentration_flags_without_a_barrier(make_space):
    """§9.7 check 3: three agents on one (scope, topic) in a window are FLAGGED; the guard
    writes one warning on the topic and narrows nothing."""
    space, envelope, guard = guarded(make_space)
    crowd = [agent(f"c{i}") for i in range(3)]
    for window in range(BASELINE):
        space.set_clock(at(window))
        for index, who in enumerate(crowd):
            guard.write_mark(who, obs(topic=f"own-{index}"))
    space.set_clock(at(BASELINE))
    for who in crowd:
        guard.write_mark(who, obs(topic="hot"))
    assert envelope.check(crowd[0].id, space.now()) is EnvelopeVerdict.FLAGGED
    flagged = [
        w
        for w in space.read("feed", topic="hot", mark_type=MarkType.WARNING)
        if w.agent_id == SYSTEM_AGENT_ID
    ]
    assert len(flagged) == 1
    assert all(guard.barrier_for(who.id).is_clear for who in crowd)


def test_exempt_agents_are_invisible_to_the_envelope(make_space):
    """§9.7 exempt agents: the guard's system agent (and probe agents) are never counted."""
    space, envelope, guard = guarded(make_space)
    assert envelope.is_exempt(guard.system_agent.id)
    helper = agent("helper")
    guard.exempt(helper.id)
    for window in range(8):
        space.set_clock(at(window))
        for _ in range(1 if window < 6 else 50):
            guard.write_mark(helper, obs())
    assert envelope.check(helper.id, space.now()) is EnvelopeVerdict.NORMAL
    probe = DiagnosticProbe(space, guard=guard)
    assert envelope.is_exempt(probe.agent.id)


def test_p42_rejected_writes_store_nothing(make_space):
    """P42: a write refused by the barrier or by the envelope leaves the space unchanged."""
    space, _, guard = guarded(make_space)
    spiky = agent("spiky")
    steady(space, guard, spiky, windows=BASELINE)
    space.set_clock(at(BASELINE))
    while True:
        before = snapshot(space)
        try:
            guard.write_mark(spiky, obs())
        except EnvelopeRestricted:
            after = snapshot(space)
            assert not any(space.get(i).agent_id == spiky.id for i in after - before)
            break
    before = snapshot(space)
    with pytest.raises(BarrierDenied):
        guard.write_mark(spiky, obs())
    assert snapshot(space) == before


@HYPOTHESIS
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["feed", "other", "third"]), st.integers(0, 30)),
        min_size=1,
        max_size=8,
    )
)
def test_p43_one_scope_per_flag_and_global_need_only_after_the_threshold(make_space, plan):
    """P43: each envelope flag narrows at most one scope; require-need-all appears only
    once global_escalation_threshold flags were counted."""
    with make_space.scoped(
        [Scope(name=s) for s in ("feed", "other", "third")], clock=at(0)
    ) as space:
        envelope = StatisticalEnvelope(principal_token=TOKEN, min_samples=2)
        guard = Guard(space, envelope=envelope, principal_token=TOKEN)
        who = agent("who", scopes=("feed", "other", "third"))
        barrier = guard.barrier_for(who.id)
        for window in range(2):
            space.set_clock(at(window))
            guard.write_mark(who, obs())
        for window, (scope_name, count) in enumerate(plan, start=2):
            space.set_clock(at(window))
            for _ in range(count):
                old = barrier.state()
                try:
                    guard.write_mark(who, obs(scope_name))
                except WriteRejected:
                    pass
                new = barrier.state()
                new_scopes = {s for s, _ in new.revoked} - {s for s, _ in old.revoked}
                assert len(new_scopes) <= new.flag_count - old.flag_count
                assert new.flag_count - old.flag_count <= 1
                if new.need_all:
                    assert new.flag_count >= guard.global_escalation_threshold


def test_escalation_after_three_flags_requires_needs_everywhere(make_space):
    """§9.7 escalation 1–3: flags on three scopes narrow one scope each; the third requires
    a Need before any action anywhere (DENIED until the agent writes one there; Needs stay
    writable)."""
    space, _, guard = guarded(make_space, scopes=("feed", "other", "third", "quiet"))
    who = agent("who", scopes=("feed", "other", "third", "quiet"))
    for window in range(BASELINE):
        space.set_clock(at(window))
        for name in ("feed", "other", "third"):
            guard.write_mark(who, obs(name))
    for window, name in enumerate(("feed", "other", "third"), start=BASELINE):
        space.set_clock(at(window))
        barrier = guard.barrier_for(who.id)
        flags = barrier.flag_count
        for _ in range(10_000):  # the baseline grows with each flood: flood until flagged
            if barrier.flag_count > flags:
                break
            try:
                guard.write_mark(who, obs(name))
            except WriteRejected:
                pass
        state = barrier.state()
        assert (name, MarkType.OBSERVATION) in state.revoked
        assert state.flag_count == window - BASELINE + 1
        assert state.need_all is (state.flag_count >= 3)
    decision = guard.pre_action(who, "quiet", "r", "touch")
    assert decision.verdict is Verdict.DENIED and decision.check is GuardCheck.NEED_REQUIRED
    assert decision.reason
    guard.write_mark(who, Need(scope="quiet", question="may I?"))
    assert guard.pre_action(who, "quiet", "r", "touch").verdict is Verdict.ALLOW


# =========================================================================== barrier


BARRIER_OPS = st.lists(
    st.tuples(
        st.sampled_from(["narrow", "narrow_all", "restore_bad", "restore", "restore_all_bad"]),
        st.sampled_from(["a", "a/b", "c"]),
        st.sampled_from([MarkType.OBSERVATION, MarkType.ACTION]),
    ),
    max_size=25,
)


@given(ops=BARRIER_OPS)
def test_p44_p45_barrier_is_monotonic_without_the_principal(ops):
    """P44: a revoked (scope, type) stays revoked until restore() with the principal token
    succeeds; P45: any other token is refused (False, as in the package) and changes
    nothing."""
    barrier = AgentBarrier(uuid4(), TOKEN)
    probes = [(s, t) for s in ("a", "a/b", "a/b/c", "c", "z") for t in MarkType]
    for op, scope_name, mark_type in ops:
        before = {p: barrier.is_allowed_checked(*p) for p in probes}
        if op == "narrow":
            barrier.narrow(scope_name, mark_type)
        elif op == "narrow_all":
            barrier.narrow_all(mark_type)
        elif op == "restore_bad":
            assert barrier.restore(scope_name, mark_type, "not-the-token") is False
        elif op == "restore_all_bad":
            assert barrier.restore_all(TOKEN + "x") is False
        else:
            assert barrier.restore(scope_name, mark_type, TOKEN) is True
        after = {p: barrier.is_allowed_checked(*p) for p in probes}
        if op != "restore":
            assert all(after[p] is False for p in probes if before[p] is False)
        if op in ("restore_bad", "restore_all_bad"):
            assert after == before


def test_barrier_hierarchy_wildcard_and_restore():
    """§9.8: narrowing covers child scopes (is_allowed_checked; is_allowed is the exact
    entry, as in the package), narrow_all is the "*" wildcard; restore lifts exactly the
    named entry; restore_all clears everything and the escalation counter."""
    barrier = AgentBarrier(uuid4(), TOKEN)
    barrier.narrow("calendar", MarkType.OBSERVATION)
    assert not barrier.is_allowed_checked("calendar/rooms", MarkType.OBSERVATION)
    assert barrier.is_allowed("calendar/rooms", MarkType.OBSERVATION)
    assert not barrier.is_allowed("calendar", "observation")
    assert barrier.is_allowed_checked("calendar", MarkType.NEED)
    assert barrier.is_allowed_checked("calendars", MarkType.OBSERVATION)
    barrier.narrow_all(MarkType.ACTION)
    assert not barrier.is_allowed_checked("anything/at/all", MarkType.ACTION)
    barrier.restore("calendar", MarkType.OBSERVATION, TOKEN)
    assert barrier.is_allowed_checked("calendar/rooms", MarkType.OBSERVATION)
    barrier.require_need("calendar")
    barrier.record_flag("calendar")
    assert barrier.need_required("calendar/rooms") and not barrier.need_required("mail")
    barrier.restore_all(TOKEN)
    assert barrier.is_clear and barrier.flag_count == 0


def test_guard_applies_barriers_to_actions_and_writes(make_space):
    """§9.8 through the guard: a revoked intent/action type means DENIED (check barrier); a
    need requirement refuses intents and writes (DENIED, BarrierDenied) until the agent has
    written a Need of its own there (the package's reading); restore_all lifts both."""
    space = make_space([Scope(name="feed")], clock=at(0))
    guard = Guard(space, principal_token=TOKEN)
    who = agent("who")
    barrier = guard.barrier_for(who.id)
    barrier.narrow("feed", MarkType.ACTION)
    denied = guard.pre_action(who, "feed", "r", "do")
    assert denied.verdict is Verdict.DENIED and denied.check is GuardCheck.BARRIER
    assert "action" in denied.reason
    barrier.narrow("feed", MarkType.OBSERVATION)
    with pytest.raises(BarrierDenied):
        guard.write_mark(who, obs())
    barrier.restore("feed", MarkType.ACTION, TOKEN)
    barrier.require_need("feed")
    refused = guard.pre_action(who, "feed", "r", "do")
    assert refused.verdict is Verdict.DENIED and refused.check is GuardCheck.NEED_REQUIRED
    barrier.restore_all(TOKEN)
    barrier.require_need("feed")
    with pytest.raises(BarrierDenied):
        guard.write_mark(who, Warning(scope="feed", topic="t", reason="r"))
    assert guard.pre_action(who, "feed", "r", "do").verdict is Verdict.DENIED
    guard.write_mark(who, Need(scope="feed", question="may I?"))
    assert guard.pre_action(who, "feed", "r", "do").verdict is Verdict.ALLOW
    barrier.restore_all(TOKEN)
    assert guard.pre_action(who, "feed", "r2", "do").verdict is Verdict.ALLOW


# =========================================================================== probe


def probe_setup(make_space):
    space = make_space([Scope(name="feed"), DiagnosticProbe.scope_definition()], clock=at(0))
    guard = Guard(space, envelope=StatisticalEnvelope(principal_token=TOKEN), principal_token=TOKEN)
    probe = DiagnosticProbe(space, guard=guard)
    return space, guard, probe


def test_p46_probe_writes_only_to_the_diagnostic_scope(make_space):
    """P46: the probe agent has no write access to production scopes, and a probe agent
    with any permission outside the diagnostic scope is refused."""
    space, _, probe = probe_setup(make_space)
    with pytest.raises(UnauthorizedWrite):
        space.write(probe.agent, obs())
    leaky = Agent(name="leaky", scopes={"diagnostics": ["observation"], "feed": ["need"]})
    with pytest.raises(ProbeIsolationError):
        DiagnosticProbe(space, probe_agent=leaky)
    nested = Agent(name="nested", scopes={"diagnostics/canaries": ["observation", "need"]})
    DiagnosticProbe(space, probe_agent=nested)
    canary = probe.inject(agent("target"))
    assert space.get(canary).scope == "diagnostics"


def test_probe_cycle_acknowledged_is_healthy(make_space):
    """§9.9 steps 1–4: inject, prompt from the space, gate until the right ack, HEALTHY."""
    space, _, probe = probe_setup(make_space)
    target = agent("target")
    assert probe.gate(target, "any_tool")  # no canary: no gating
    canary = probe.inject(target)
    assert probe.canary_visible(canary)
    assert str(canary) in probe.prompt_for(target)
    assert not probe.gate(target, "book_room") and probe.gate(target, ACK_TOOL)
    assert not probe.acknowledge(target, uuid4())
    assert not probe.acknowledge(agent("other"), canary)
    assert probe.acknowledge(target, canary)
    assert probe.gate(target, "book_room")
    assert probe.check(target, was_active=True) is ProbeVerdict.HEALTHY
    newer = probe.inject(target)  # a new round: a new canary supersedes the old one
    assert probe.canary_for(target) == newer and not probe.gate(target, "book_room")
    assert space.read("diagnostics", reader=target) == []  # classified: agents see nothing


def test_probe_compromised_locks_the_agent_down(make_space):
    """§9.9 auto-restriction: an active agent that did not acknowledge is COMPROMISED: a
    blocking Need is filed and only Need marks remain writable."""
    space, guard, probe = probe_setup(make_space)
    target = agent("target")
    probe.inject(target)
    assert probe.check(target, was_active=False) is ProbeVerdict.HEALTHY
    assert probe.check(target, was_active=True) is ProbeVerdict.COMPROMISED
    [need] = [m for m in space.read("diagnostics", mark_type=MarkType.NEED)]
    assert need.blocking and need.context["agent_id"] == str(target.id)
    assert guard.pre_action(target, "feed", "r", "do").verdict is Verdict.DENIED
    with pytest.raises(BarrierDenied):
        guard.write_mark(target, obs())
    guard.write_mark(target, Need(scope="feed", question="what happened?"))
    guard.barrier_for(target.id).restore_all(TOKEN)
    assert guard.pre_action(target, "feed", "r", "do").allowed


# =========================================================================== budgets


def budgeted(name: str = "spender", **limits) -> Agent:
    return agent(name, manifest=AgentManifest(budget=TokenBudget(**limits)))


def budget_needs(space, who) -> list[Need]:
    return [
        m
        for m in space.read(SYSTEM_SCOPE, mark_type=MarkType.NEED)
        if isinstance(m, Need)
        and m.context.get("kind") == "budget_warning"
        and m.context.get("agent_id") == str(who.id)
    ]


def test_p59_no_budget_no_tracking_no_enforcement(make_space):
    """P59: without a budget nothing is tracked, no Need is written, activation is free."""
    space = make_space([Scope(name="feed")], clock=at(0))
    guard = Guard(space)
    free = agent("free")
    for _ in range(5):
        assert guard.record_round_tokens(free, 10**9, 10**9) is BudgetStatus.OK
    assert guard.check_activation(free).allowed and guard.can_activate(free)
    assert guard.budgets.usage(free.id) == (0, 0)
    assert space.active_marks() == []
    assert guard.pre_action(free, "feed", "r", "do").allowed


@HYPOTHESIS
@given(
    rounds=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 400)), max_size=12),
    fraction=st.sampled_from([0.5, 0.8, 0.99]),  # below 1: the warning precedes the stop
)
def test_p60_exactly_one_non_blocking_need_per_dimension(make_space, rounds, fraction):
    """P60: crossing warning_fraction of a total writes exactly one non-blocking Need for
    that dimension, however many rounds follow."""
    with make_space.scoped([Scope(name="feed")], clock=at(0)) as space:
        guard = Guard(space)
        who = budgeted(
            max_input_tokens_total=1000, max_output_tokens_total=800, warning_fraction=fraction
        )
        for tokens_in, tokens_out in rounds:
            guard.record_round_tokens(who, tokens_in, tokens_out)
        used_in = sum(r[0] for r in rounds)
        used_out = sum(r[1] for r in rounds)
        needs = budget_needs(space, who)
        by_dimension = {n.context["dimension"]: n for n in needs}
        assert len(needs) == len(by_dimension)
        assert ("input" in by_dimension) is (used_in >= fraction * 1000)
        assert ("output" in by_dimension) is (used_out >= fraction * 800)
        assert all(not n.blocking for n in needs)


def test_p61_hard_stop_and_p62_resumption(make_space):
    """P61: at the total the agent is refused activation, tool calls and writes, and stays
    stopped; P62: a larger budget on the (same) agent's manifest makes it eligible again,
    with its usage intact (P63)."""
    space = make_space([Scope(name="feed")], clock=at(0))
    guard = Guard(space)
    who = budgeted(max_input_tokens_total=1000)
    guard.record_round_tokens(who, 600, 50)
    assert guard.check_activation(who).allowed
    status = guard.record_round_tokens(who, 400, 50)
    assert status is BudgetStatus.WARNING_INPUT  # the package's order: the warning first
    assert guard.budget_status(who).stopped
    decision = guard.check_activation(who)
    assert decision.verdict is Verdict.DENIED and decision.check is GuardCheck.BUDGET
    assert decision.reason
    assert guard.pre_action(who, "feed", "r", "do").check is GuardCheck.BUDGET
    with pytest.raises(BudgetExhausted):
        guard.write_mark(who, obs())
    guard.record_round_tokens(who, 0, 0)
    assert not guard.can_activate(who)
    raised = who.model_copy(
        update={"manifest": AgentManifest(budget=TokenBudget(max_input_tokens_total=5000))}
    )
    assert raised.id == who.id
    assert guard.can_activate(raised)
    assert guard.budgets.usage(who.id) == (1000, 100)
    guard.write_mark(raised, obs())


@given(
    rounds=st.lists(
        st.tuples(st.integers(-5, 300), st.integers(-5, 300), st.booleans()), max_size=15
    )
)
def test_p63_usage_never_decreases(rounds):
    """P63: tracked usage is monotonically non-decreasing, across budget changes; bad
    counts are refused without touching the totals."""
    tracker = BudgetLedger()
    who = uuid4()
    small = TokenBudget(max_input_tokens_total=100, max_output_tokens_total=100)
    large = TokenBudget(max_input_tokens_total=10**6)
    last = (0, 0)
    for tokens_in, tokens_out, grow in rounds:
        budget = large if grow else small
        if tokens_in < 0 or tokens_out < 0:
            with pytest.raises(InvalidTokenCount):
                tracker.record(who, budget, tokens_in, tokens_out)
        else:
            tracker.record(who, budget, tokens_in, tokens_out)
        usage = tracker.usage(who)
        assert usage[0] >= last[0] and usage[1] >= last[1]
        last = usage


def test_per_round_budgets_cut_reads_and_set_max_tokens(make_space):
    """§9.10 rules 1–2: reads are truncated at the per-round input budget, strongest
    first; the per-round output budget is the LLM's max_tokens."""
    space = make_space([Scope(name="feed")], clock=at(0))
    guard = Guard(space)
    writer = agent("writer")
    for index in range(10):
        space.set_clock(at(0, index * 600.0))
        guard.write_mark(writer, obs(topic=f"t{index}"))
    everything = space.read("feed")
    per_mark = estimate_tokens(everything[0])
    reader = budgeted(
        "reader", max_input_tokens_per_round=per_mark * 3, max_output_tokens_per_round=77
    )
    cut = guard.read(reader, "feed")
    assert cut == everything[: len(cut)] and 1 <= len(cut) <= 3
    assert guard.output_token_limit(reader) == 77 and guard.output_token_limit(writer) is None
    assert truncate_to_budget([1, 2, 3], None) == [1, 2, 3]


# =========================================================================== rate limits


class CountingDetector(WindowedDetector):
    """A default detector that also remembers how many attempts it saw."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.seen = 0

    def record(self, mark_type, at_time):
        self.seen += 1
        super().record(mark_type, at_time)


def limited_scope(**limits) -> Scope:
    return Scope(name="feed", rate_limit=ScopeRateLimit(window_seconds=60.0, **limits))


def test_p64_per_agent_cap_rejects_and_the_envelope_sees_it(make_space):
    """P64: beyond max_writes_per_agent_per_window the write is rejected (nothing stored),
    and the rejected attempt is visible to the envelope (record_attempt)."""
    space = make_space([limited_scope(max_writes_per_agent_per_window=3)], clock=at(0))
    envelope = StatisticalEnvelope(detector_factory=CountingDetector, principal_token=TOKEN)
    guard = Guard(space, envelope=envelope)
    who, other = agent("who"), agent("other")
    for _ in range(3):
        guard.write_mark(who, obs())
    before = snapshot(space)
    with pytest.raises(RateLimited) as caught:
        guard.write_mark(who, obs())
    assert caught.value.check is GuardCheck.RATE_LIMIT
    assert snapshot(space) == before
    assert envelope.detector_for(who.id).seen == 4
    guard.write_mark(other, obs())  # a per-agent cap: others are unaffected
    denied = guard.pre_action(who, "feed", "r", "do")
    assert denied.verdict is Verdict.DENIED and denied.check is GuardCheck.RATE_LIMIT


def test_p65_fleet_cap_rejects_everyone_until_the_window_rotates(make_space):
    """P65: once the scope's total reaches max_total_writes_per_window, every agent is
    refused until the writes age out of the sliding window."""
    space = make_space(
        [limited_scope(max_total_writes_per_window=4, max_writes_per_agent_per_window=10)],
        clock=START,
    )
    guard = Guard(space)
    writers = [agent(f"w{i}") for i in range(4)]
    for who in writers:
        guard.write_mark(who, obs())
    for who in [*writers, agent("fresh")]:
        with pytest.raises(RateLimited):
            guard.write_mark(who, obs())
    space.set_clock(START + 59.9)
    with pytest.raises(RateLimited):
        guard.write_mark(writers[0], obs())
    space.set_clock(START + 60.0)  # a sliding window (the package's): START still counts
    with pytest.raises(RateLimited):
        guard.write_mark(writers[0], obs())
    space.set_clock(START + 60.001)
    guard.write_mark(writers[0], obs())


def test_rate_limits_count_child_scopes_with_their_parent(make_space):
    """§9.12 + §7.5: a child scope without its own definition shares the parent's limit."""
    space = make_space([limited_scope(max_total_writes_per_window=2)], clock=START)
    guard = Guard(space)
    who = agent("who")
    guard.write_mark(who, obs("feed/a"))
    guard.write_mark(who, obs("feed/b"))
    with pytest.raises(RateLimited):
        guard.write_mark(who, obs("feed"))


def test_p66_rate_limits_and_envelope_are_independent(make_space):
    """P66: an agent within its rate limit but restricted by the envelope is still refused;
    an agent within its envelope baseline but over its rate limit is still refused."""
    space = make_space([limited_scope(max_writes_per_agent_per_window=50)], clock=at(0))
    envelope = StatisticalEnvelope(principal_token=TOKEN)
    guard = Guard(space, envelope=envelope, principal_token=TOKEN)
    spiky = agent("spiky")
    steady(space, guard, spiky, windows=BASELINE)
    rejected = flood(space, guard, spiky, window=BASELINE, count=10)
    assert rejected and not any(isinstance(r, RateLimited) for r in rejected)
    declared = agent("declared", manifest=AgentManifest(expected_activity={"observation": 6000.0}))
    space.set_clock(at(BASELINE + 1))
    outcomes = []
    for _ in range(52):
        try:
            guard.write_mark(declared, obs())
            outcomes.append("ok")
        except RateLimited:
            outcomes.append("limited")
    assert outcomes.count("ok") == 50 and outcomes[-1] == "limited"
    assert envelope.check(declared.id, space.now()) is EnvelopeVerdict.NORMAL


def test_rate_limiter_reserve_and_release():
    """§9.12 bookkeeping: a reservation counts; releasing it (store failed) gives it back."""
    limiter = RateLimiter()
    limit = ScopeRateLimit(max_writes_per_agent_per_window=1, window_seconds=10.0)
    who = uuid4()
    first = limiter.reserve("s", who, limit, 5.0)
    assert first.allowed
    second = limiter.reserve("s", who, limit, 6.0)
    assert not second.allowed and second.kind is RateLimitKind.AGENT
    limiter.release("s", who, first)
    assert limiter.reserve("s", who, limit, 7.0).allowed
    assert limiter.reserve("s", who, None, 7.0).allowed


def test_a_write_the_space_refuses_does_not_use_up_the_rate_limit(make_space):
    """§9.12 with P42: a write rejected by the space (bad topic) is not counted."""
    scope_def = Scope(
        name="feed",
        observation_topics=("ok",),
        rate_limit=ScopeRateLimit(max_writes_per_agent_per_window=1, window_seconds=60.0),
    )
    space = make_space([scope_def], clock=at(0))
    guard = Guard(space)
    who = agent("who")
    with pytest.raises(ValueError):
        guard.write_mark(who, obs(topic="nope"))
    guard.write_mark(who, obs(topic="ok"))


# =========================================================================== telemetry


def scripted_run(space, guard) -> list:
    """A fixed mix of guard calls; returns every outcome (verdicts, ids kept out)."""
    a, b = agent("a"), agent("b")
    outcomes = []
    for tick, (who, resource, confidence) in enumerate(
        [(a, "r1", 0.5), (b, "r1", 0.9), (a, "r2", 0.2), (b, "r2", 0.1), (a, "r1", 0.5)]
    ):
        space.set_clock(at(0, tick))
        outcomes.append(guard.pre_action(who, "feed", resource, "do", confidence).verdict)
    outcomes.append(guard.execute(b, "feed", "r3", "do", "done", lambda: {"ok": 1})[0].verdict)
    outcomes.append(guard.execute(a, "feed", "r3", "do", "done", lambda: {"ok": 1})[0].verdict)
    outcomes.append(type(guard.write_mark(a, obs())).__name__)
    for bad in (Need(scope="feed", question="?"), Observation(scope="elsewhere", topic="t")):
        try:
            guard.write_mark(agent("mute", scopes=("x",)), bad)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    guard.record_round_tokens(budgeted(max_input_tokens_total=10), 20, 0)
    guard.emit_gauges()
    outcomes.append(sorted((m.mark_type.value, m.scope) for m in space.active_marks()))
    return outcomes


def test_p57_a_failing_sink_changes_nothing(make_space):
    """P57: with a sink that raises on every call, verdicts, stored marks and errors are
    exactly those of a run with a working sink."""
    results = []
    for sink in (InMemorySink(), FailingSink()):
        space = make_space([Scope(name="feed")], clock=at(0))
        guard = Guard(space, telemetry=sink, envelope=StatisticalEnvelope())
        results.append(scripted_run(space, guard))
    assert results[0] == results[1]


GUARD_OPS = st.lists(
    st.tuples(
        st.sampled_from(["pre", "execute", "execute_raises", "write", "write_bad", "tokens"]),
        st.integers(0, 2),
        st.integers(0, 2),
        st.floats(0.0, 1.0),
    ),
    min_size=1,
    max_size=15,
)


def random_run(space, guard, ops) -> tuple[list, Counter]:
    """Run ``ops``; returns the outcomes and how many write_mark / execute calls were made."""
    agents = [budgeted(f"a{i}", max_output_tokens_total=50) for i in range(3)]
    outcomes: list = []
    calls: Counter = Counter()
    for tick, (op, who, resource, confidence) in enumerate(ops):
        space.set_clock(at(0, tick))
        actor, target = agents[who], f"r{resource}"
        try:
            if op == "pre":
                outcome = guard.pre_action(actor, "feed", target, "do", confidence).verdict
            elif op.startswith("execute"):
                calls["execute"] += 1
                tool = (lambda: 1 / 0) if op == "execute_raises" else (lambda: {"ok": 1})
                outcome = guard.execute(actor, "feed", target, "do", "done", tool, confidence)[0]
                outcome = outcome.verdict
            elif op == "write":
                calls["write_mark"] += 1
                outcome = type(guard.write_mark(actor, obs(topic=target))).__name__
            elif op == "write_bad":
                calls["write_mark"] += 1
                outcome = guard.write_mark(actor, Observation(scope="elsewhere", topic="t"))
            else:
                status = guard.record_round_tokens(actor, 5, 20)
                outcome = status.stopped
        except Exception as exc:
            outcome = type(exc).__name__
        outcomes.append(outcome)
    outcomes.append(
        sorted((m.mark_type.value, m.agent_id is not None) for m in space.active_marks())
    )
    return outcomes, calls


@HYPOTHESIS
@given(ops=GUARD_OPS)
def test_p57_p58_for_any_sequence_of_guard_calls(make_space, ops):
    """P57 for all call sequences: a failing sink gives the same outcomes as a working one;
    P58: the working sink got one event per write_mark and per execute call."""
    runs = []
    sinks = (InMemorySink(), FailingSink())
    for sink in sinks:
        with make_space.scoped([Scope(name="feed")], clock=at(0)) as space:
            guard = Guard(space, telemetry=sink, envelope=StatisticalEnvelope())
            runs.append(random_run(space, guard, ops))
    assert runs[0][0] == runs[1][0]
    calls = runs[0][1]
    assert len(sinks[0].events_named(EVENT_WRITE_MARK)) == calls["write_mark"]
    assert len(sinks[0].events_named(EVENT_EXECUTE)) == calls["execute"]
    assert sinks[1].calls > 0


def test_p58_every_write_mark_and_execute_emits_one_event(make_space):
    """P58: one structured event per write_mark and per execute call, accepted, rejected or
    raising, with the verdict."""
    space = make_space([limited_scope(max_writes_per_agent_per_window=1)], clock=at(0))
    sink = InMemorySink()
    guard = Guard(space, telemetry=sink)
    who = agent("who")
    guard.write_mark(who, obs())
    with pytest.raises(RateLimited):
        guard.write_mark(who, obs())
    with pytest.raises(UnknownScope):
        guard.write_mark(who, Observation(scope="nowhere", topic="t"))
    with pytest.raises(ValueError):
        guard.write_mark(who, Intent(scope="feed", resource="r", action="do"))
    events = sink.events_named(EVENT_WRITE_MARK)
    assert len(events) == 4
    # the package's words: a defence "rejected" the write, the space "denied" it
    assert [e.attributes["verdict"] for e in events] == ["accepted", "rejected", "denied",
                                                          "denied"]
    assert events[1].attributes["check"] == "rate_limit"
    assert events[1].reason.startswith("Rate limit exceeded")
    assert "nowhere" in events[2].reason and "Cannot write intent" in events[3].reason
    assert sink.counter_total(MARKS_WRITTEN, verdict="accepted", mark_type="observation") == 1
    assert sink.counter_total(MARKS_WRITTEN, verdict="rejected") == 1
    assert sink.counter_total(MARKS_WRITTEN, verdict="denied") == 2

    other = agent("other")
    guard.execute(other, "feed", "r", "do", "done", lambda: 1)
    guard.execute(who, "feed", "r", "do", "done", lambda: 1)  # conflict
    with pytest.raises(ZeroDivisionError):
        guard.execute(agent("third"), "feed", "r2", "do", "done", lambda: 1 / 0)
    executes = sink.events_named(EVENT_EXECUTE)
    assert [e.attributes["verdict"] for e in executes] == ["allow", "conflict", "allow"]
    assert [e.attributes["tool_called"] for e in executes] == [True, False, True]
    assert executes[2].attributes["failed"] and executes[2].attributes["error"]


def test_metrics_of_section_9_11(make_space):
    """§9.11 metrics: conflicts, tokens, budget remaining, active marks, pending needs."""
    space = make_space(
        [Scope(name="feed", conflict_policy=ConflictPolicy.FIRST_WRITER)], clock=at(0)
    )
    sink = InMemorySink()
    guard = Guard(space, telemetry=sink)
    a, b = agent("a"), agent("b")
    guard.pre_action(a, "feed", "r", "do")
    space.set_clock(at(0, 2))
    guard.pre_action(b, "feed", "r", "do")
    assert sink.counter_total(CONFLICTS_RESOLVED, policy="first_writer", outcome="conflict") == 1
    spender = budgeted(max_input_tokens_total=100)
    guard.record_round_tokens(spender, 30, 5, duration=1.5)
    assert sink.counter_total(TOKENS_INPUT, agent_id=str(spender.id)) == 30
    assert sink.gauge_value(BUDGET_REMAINING, dimension="input") == 70
    guard.write_mark(a, Need(scope="feed", question="?"))
    guard.emit_gauges()
    assert sink.gauge_value(ACTIVE_MARKS, scope="feed", mark_type="intent") == 2
    assert sink.gauge_value(NEEDS_PENDING, scope="feed") == 1


def test_structured_log_sink_writes_json(caplog):
    """§9.11 StructuredLogSink: JSON records through Python logging; NullSink discards."""
    sink = StructuredLogSink("agentpost.marks.telemetry")
    emitter = Emitter(sink, lambda: T0)
    with caplog.at_level(logging.DEBUG, logger="agentpost.marks.telemetry"):
        emitter.event("markspace.test", agent_id=uuid4(), verdict=Verdict.ALLOW)
        emitter.count(MARKS_WRITTEN, {"scope": "feed"})
    payloads = [json.loads(record.getMessage()) for record in caplog.records]
    assert payloads[0]["verdict"] == "allow" and payloads[0]["operation"] == "test"
    assert payloads[0]["attributes"]["verdict"] == "allow"
    assert payloads[1]["metric"] == MARKS_WRITTEN and payloads[1]["scope"] == "feed"
    NullSink().log_event(None)  # accepts anything, does nothing


def test_guard_system_writes_are_best_effort(make_space):
    """§6.3 warning and readings: a scope that refuses the guard's warning topic does not
    change the agents' outcome; the failure is reported to telemetry."""
    strict = Scope(name="feed", warning_topics=("only-this",))
    space = make_space([strict], clock=at(0))
    sink = InMemorySink()
    guard = Guard(space, telemetry=sink)
    early, late = agent("early"), agent("late")
    guard.post_action(early, "feed", "r", "done", {})
    space.set_clock(at(0, 5))
    late_id = guard.post_action(late, "feed", "r", "done", {})
    assert [m.id for m in space.read("feed", resource="r")] == [late_id]
    assert sink.events_named(EVENT_SYSTEM_WRITE_FAILED)
    assert space.read("feed", mark_type=MarkType.WARNING) == []
