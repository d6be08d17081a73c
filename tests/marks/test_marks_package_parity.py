"""Where the markspace package's own suite (tests/conformance/test_markspace_suite_*.py) found
agentpost.marks to differ, each fixed at the root and pinned here, on both backends where a
space is involved (issue 22, section 6):

- refusals carry the package's words, which callers match on, and keep ours (who, what,
  where): "Rate limit exceeded", "Fleet rate limit", "blocked by barrier", "Cannot write
  intent", "COMPROMISED", "No connection", "lacks write permission";
- the Scheduler's API (§14): `register` -> bool, intervals <= 0 not scheduled, `update`
  without an interval unschedules, `_entries` / `_running` / `_thread` as the package's,
  `start` and `stop` idempotent;
- `TokenBudget.warning_fraction` below 1 (§9.10: the warning comes before the hard stop);
- marks built in code have an id, so the pure functions work on them (P11, P12, P34);
- a content policy's FLAG is not a `record_attempt` (P70), a refused write is (P64);
- a write the space refuses emits a "denied" event with its reason (P58);
- `PostgresMarkSpace._marks`, the in-memory space's (and the package's) private map.
"""

from __future__ import annotations

import math
import threading
import uuid
from typing import Any

import pytest

from agentpost.marks import (
    Action,
    Agent,
    AgentManifest,
    ConflictPolicy,
    ContentPolicy,
    DecayConfig,
    DiagnosticProbe,
    InMemorySink,
    Intent,
    MarkType,
    Observation,
    PolicyResult,
    PolicyVerdict,
    ProbeVerdict,
    RateLimitTracker,
    Scheduler,
    Scope,
    ScopeError,
    ScopeRateLimit,
    Severity,
    StatisticalEnvelope,
    TokenBudget,
    Warning,
    WatchPattern,
    effective_strength,
    effective_strength_with_warnings,
    hours,
    resolve_conflict,
    schedule,
    validate_manifest_permissions,
    validate_pipeline,
)
from agentpost.marks.guard import Guard, GuardVerdict
from marks_backends import T0

ALL = ["intent", "action", "observation", "warning", "need"]


def agent(name: str, scope: str = "feed", **kw: Any) -> Agent:
    return Agent(name=name, scopes={scope: ALL}, **kw)


def limited(**limits: Any) -> Scope:
    return Scope(name="feed", rate_limit=ScopeRateLimit(window_seconds=60, **limits))


# =========================================================================== the package's words


def test_rate_limit_refusals_start_with_the_package_words():
    """P64, P65: callers match "Rate limit exceeded" and "Fleet rate limit"; ours go on
    with who, which cap, which scope."""
    tracker, mine = RateLimitTracker(), uuid.uuid4()
    cap = ScopeRateLimit(max_writes_per_agent_per_window=1, max_total_writes_per_window=2,
                         window_seconds=60)
    assert tracker.check_and_record("feed", mine, cap, T0) is None
    refusal = tracker.check_and_record("feed", mine, cap, T0 + 1)
    assert refusal.startswith("Rate limit exceeded")
    assert str(mine) in refusal and "'feed'" in refusal and "1 writes per 60 s" in refusal
    assert tracker.check_and_record("feed", uuid.uuid4(), cap, T0 + 2) is None
    fleet = tracker.check_and_record("feed", uuid.uuid4(), cap, T0 + 3)
    assert fleet.startswith("Fleet rate limit exceeded") and "fleet cap of 2" in fleet


def test_guard_refusals_carry_the_package_words(make_space):
    """The guard's refusals, on both backends: a rate-limited write_mark and execute, a
    barrier on write_mark and on pre_action, an intent or action through write_mark."""
    space = make_space([limited(max_writes_per_agent_per_window=1), Scope(name="other")])
    guard = Guard(space)
    who = Agent(name="who", scopes={"feed": ALL, "other": ALL})
    guard.write_mark(who, Observation(scope="feed", topic="t"))
    with pytest.raises(ScopeError, match=r"^Rate limit exceeded: agent "):
        guard.write_mark(who, Observation(scope="feed", topic="t"))
    decision, _ = guard.execute(who, "feed", "r", "book", "booked", lambda: "done")
    assert decision.verdict is GuardVerdict.DENIED and "Rate limit exceeded" in decision.reason

    barrier = guard.get_or_create_barrier(who.id)
    barrier.narrow("other", MarkType.INTENT)
    barrier.narrow("other", MarkType.OBSERVATION)
    denied = guard.pre_action(who, "other", "r", "book", 0.9)
    assert denied.verdict is GuardVerdict.DENIED
    assert denied.reason == ("agent 'who' blocked by barrier: it may no longer write intent "
                             "marks in scope 'other' until the principal restores it")
    with pytest.raises(ScopeError, match="blocked by barrier: it may no longer write "
                                         "observation marks in scope 'other'"):
        guard.write_mark(who, Observation(scope="other", topic="t"))

    with pytest.raises(ValueError, match=r"^Cannot write intent via write_mark"):
        guard.write_mark(who, Intent(scope="other", resource="r", action="book"))
    with pytest.raises(ValueError, match=r"^Cannot write action via write_mark"):
        guard.write_mark(who, Action(scope="other", resource="r", action="booked"))


def test_a_compromised_agent_need_says_compromised(make_space):
    """§9.9: the blocking Need a COMPROMISED verdict files names the verdict and the agent."""
    space = make_space([Scope(name="diagnostics")])
    probe = DiagnosticProbe(space, clock=lambda: T0)
    (result,) = probe.run_probe("feed", {uuid.uuid4(): ("rogue", [])})
    assert result.verdict is ProbeVerdict.COMPROMISED
    (need,) = space.read("diagnostics", mark_type=MarkType.NEED)
    assert need.blocking and need.priority == 1.0
    assert need.question.startswith("Probe: agent 'rogue' COMPROMISED")
    assert "did not acknowledge its diagnostic canary" in need.question


def test_composition_problems_carry_the_package_words():
    """P53, P54: "No connection" for a pair that does not feed, "lacks write permission"
    for an output the agent may not write, each with our details."""
    sensor = Agent(name="sensor", scopes={"sensors": ["observation"]},
                   manifest=AgentManifest(outputs=(("sensors", MarkType.OBSERVATION),)))
    alerter = Agent(name="alerter", scopes={"alerts": ["warning"]},
                    manifest=AgentManifest(inputs=(WatchPattern(scope="alerts"),),
                                           outputs=(("alerts", MarkType.WARNING),)))
    assert validate_pipeline([sensor, alerter]) == [
        "No connection: no output of 'sensor' feeds an input of 'alerter'"]
    liar = sensor.model_copy(update={"manifest": AgentManifest(
        outputs=(("sensors", MarkType.WARNING),))})
    assert validate_manifest_permissions(liar) == [
        "agent 'sensor' declares warning output to 'sensors' but lacks write permission "
        "for it"]


# =========================================================================== the scheduler


def scheduled(name: str, interval: float | None, agent_id: uuid.UUID | None = None) -> Agent:
    return Agent(name=name, id=agent_id or uuid.uuid4(),
                 manifest=AgentManifest(schedule_interval=interval))


def test_scheduler_registers_only_positive_intervals_and_says_so():
    """§14.1/§14.2: register() -> True only for an interval > 0; an agent without manifest
    or interval, or with 0 or a negative one (a manifest the package accepts), is ignored;
    update() without an interval unschedules. The state is the package's `_entries`."""
    clock = [T0]
    scheduler = Scheduler(lambda: clock[0])
    poller = scheduled("poller", 60.0)
    assert scheduler.register(poller) is True
    assert scheduler.register(Agent(name="bare")) is False
    for interval in (None, 0.0, -10.0):
        ignored = scheduled("ignored", interval)
        assert scheduler.register(ignored) is False
        assert ignored.id not in scheduler._entries
    entry = scheduler._entries[poller.id]
    assert isinstance(entry, schedule.ScheduleEntry) and entry.interval_seconds == 60.0
    assert scheduler.tick_all() == [poller] and entry.last_activation == T0
    assert scheduler.register(scheduled("poller", -1.0, poller.id)) is False
    assert poller.id in scheduler._entries  # register ignores it: the old schedule stays
    scheduler.update(scheduled("poller", None, poller.id))
    assert poller.id not in scheduler._entries
    scheduler.register(poller)
    scheduler.unregister(poller)
    assert scheduler._entries == {}


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_manifest_takes_any_finite_interval(bad):
    """The package's manifest takes 0 and negative intervals (the Scheduler ignores them);
    NaN and infinity are no intervals and are refused, as every float of a mark model."""
    assert AgentManifest(schedule_interval=0.0).schedule_interval == 0.0
    assert AgentManifest(schedule_interval=-5.0).schedule_interval == -5.0
    with pytest.raises(ValueError, match="finite number"):
        AgentManifest(schedule_interval=bad)


def test_scheduler_start_and_stop_are_idempotent_and_restartable():
    """§14.2: start() while running and stop() while stopped do nothing (also from four
    threads at once: one timer); `_running` and `_thread` are the package's; a stopped
    scheduler starts again with a new thread."""
    fired = threading.Event()
    scheduler = Scheduler(lambda: T0)
    scheduler.stop()
    assert scheduler._running is False and scheduler._thread is None
    scheduler.register(scheduled("poller", 60.0))
    gate = threading.Barrier(4)
    seen: list[Any] = []

    def start() -> None:
        gate.wait()
        scheduler.start(poll_interval=0.01, on_due=lambda agents: fired.set())
        seen.append(scheduler._thread)

    starters = [threading.Thread(target=start) for _ in range(4)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(5)
    first = scheduler._thread
    assert scheduler._running is True and len({id(t) for t in seen}) == 1 and first in seen
    assert fired.wait(5)
    scheduler.stop()
    scheduler.stop()
    assert scheduler._running is False and scheduler._thread is None
    assert not first.is_alive() and not scheduler.running
    scheduler.start(poll_interval=0.01)
    try:
        assert scheduler.running and scheduler._thread is not first
    finally:
        scheduler.stop()


# =========================================================================== budgets


@pytest.mark.parametrize("fraction", [1.0, 1.5, 0.0, -0.1])
def test_a_warning_fraction_must_leave_runway_before_the_stop(fraction):
    """§9.10: the warning comes before the hard stop, so 0 < warning_fraction < 1."""
    with pytest.raises(ValueError, match="warning_fraction"):
        TokenBudget(warning_fraction=fraction)
    assert TokenBudget(warning_fraction=0.99).warning_fraction == 0.99


# =========================================================================== marks built in code


def test_marks_built_in_code_have_ids_the_pure_functions_use():
    """P11, P12: resolve(intents) -> winner_id names a winner among intents built in code
    (each has its own provisional id, as in the package); YIELD_ALL names none. P34: a
    warning built against such a mark suppresses it at once, and less as it decays (P35)."""
    intents = [Intent(scope="s", resource="r", action="book", agent_id=uuid.uuid4(),
                      confidence=c / 10, created_at=float(c)) for c in range(1, 6)]
    assert len({i.id for i in intents}) == len(intents) and None not in {i.id for i in intents}
    assert resolve_conflict(intents, ConflictPolicy.FIRST_WRITER) == intents[0].id
    assert resolve_conflict(intents, ConflictPolicy.HIGHEST_CONFIDENCE) == intents[-1].id
    assert resolve_conflict(intents, ConflictPolicy.YIELD_ALL) is None

    decay = DecayConfig(observation_half_life=hours(24), warning_half_life=hours(1))
    seen = Observation(scope="s", topic="x", created_at=0.0)
    wrong = Warning(scope="s", topic="x", invalidates=seen.id, created_at=0.0,
                    severity=Severity.CRITICAL)
    ratios = [effective_strength_with_warnings(seen, [wrong], t, decay)
              / effective_strength(seen, t, decay) for t in (0.0, hours(4), hours(24))]
    assert ratios[0] < 0.1 < ratios[1] < ratios[2] and ratios[2] > 0.99


def test_a_written_mark_gets_the_space_id_and_leaves_the_callers_alone(make_space):
    """§2.1: the id is assigned by the space on write; the caller's mark keeps its own."""
    space = make_space([Scope(name="feed")])
    mine = Observation(scope="feed", topic="t")
    stored = space.get(space.write(agent("w"), mine))
    assert stored.id != mine.id and space.get(mine.id) is None
    assert mine.agent_id is None and mine.created_at is None


# =========================================================================== envelope and telemetry


class Flag(ContentPolicy):
    def evaluate(self, agent: Agent, mark: Observation, scope: Scope) -> PolicyResult:
        return PolicyResult(PolicyVerdict.FLAG, reason="looks odd")


class CountingEnvelope(StatisticalEnvelope):
    """Our envelope, counting how it was fed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def record(self, agent_id: Any, mark: Any, *, at: float | None = None) -> None:
        self.calls.append("record")
        super().record(agent_id, mark, at=at)

    def record_attempt(self, agent_id: Any, mark_type: Any, **kw: Any) -> None:
        self.calls.append("record_attempt")
        super().record_attempt(agent_id, mark_type, **kw)


def test_p70_a_flag_is_not_a_record_attempt_and_p64_a_refusal_is(make_space):
    """P70: a FLAGged observation is written and counted once, as a write (`record`),
    never through `record_attempt`. P64: a rate-limited write is a `record_attempt`."""
    space = make_space([limited(max_writes_per_agent_per_window=1)])
    envelope = CountingEnvelope()
    guard = Guard(space, envelope=envelope, content_policies=[Flag()])
    who = agent("who")
    guard.write_mark(who, Observation(scope="feed", topic="t"))
    assert envelope.calls == ["record"]
    assert envelope.get_stats(who.id).current_window.counts == {MarkType.OBSERVATION: 1}
    with pytest.raises(ScopeError, match="Rate limit exceeded"):
        guard.write_mark(who, Observation(scope="feed", topic="t"))
    assert envelope.calls == ["record", "record_attempt"]


def test_p58_a_write_the_space_refuses_emits_a_denied_event_with_its_reason(make_space):
    """P58: every write_mark emits an event; a mark the space refuses (an unauthorized
    agent) is "denied", with the refusal's words as its reason ("not authorized", the
    package's), as in the package."""
    space = make_space([Scope(name="feed")])
    sink = InMemorySink()
    guard = Guard(space, telemetry=sink)
    with pytest.raises(ScopeError):
        guard.write_mark(Agent(name="nobody"), Observation(scope="feed", topic="t"))
    (event,) = [e for e in sink.events if e.operation == "write_mark"]
    assert event.verdict == "denied"
    assert event.reason == "agent 'nobody' is not authorized to write observation marks to " \
                           "scope 'feed'"


# =========================================================================== private state


def test_both_spaces_have_the_private_mark_map_the_package_suite_reads(make_space):
    """The package's tests read ``space._marks`` (id -> mark); on Postgres it is a
    read-only snapshot of the space's marks."""
    space = make_space([Scope(name="feed")])
    writer = agent("w")
    first = space.write(writer, Observation(scope="feed", topic="a"))
    second = space.write(writer, Warning(scope="feed", topic="a", invalidates=first))
    assert list(space._marks) == [first, second]
    assert space._marks[second].invalidates == first
