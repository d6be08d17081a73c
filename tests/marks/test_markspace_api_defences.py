"""The defence layers driven through the package's names and signatures (issue 15: a program
written against ``markspace`` runs on ``agentpost.marks`` after changing its import).

Written from the package's API: ``StatisticalEnvelope(EnvelopeConfig, clock)`` with
``WelfordDetector(WelfordConfig)`` (Markspace §9.7, P40, P41), the ``AnomalyDetector`` ABC,
``DiagnosticProbe(space, ProbeConfig, clock)`` (§9.9, P46) over both space backends, the
``TelemetrySink`` ABC and its sinks (§9.11, P57, P58) and ``Scheduler(clock,
pre_activation_check)`` (§14, P56). Clocks are injected: no sleeps.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any

import pytest

from agentpost.marks import (
    Agent,
    AgentManifest,
    AgentStats,
    AnomalyDetector,
    DiagnosticProbe,
    EnvelopeConfig,
    EnvelopeVerdict,
    FailingSink,
    InMemorySink,
    MarkType,
    Need,
    NullSink,
    Observation,
    ProbeConfig,
    ProbeResult,
    ProbeVerdict,
    Scheduler,
    Scope,
    StatisticalEnvelope,
    StructuredLogSink,
    TelemetryEvent,
    TelemetrySink,
    WelfordConfig,
    WelfordDetector,
)
from agentpost.marks import Warning as WarningMark
from agentpost.marks.core import InvalidArgument
from agentpost.marks.envelope import AnomalyKind
from agentpost.marks.guard import Guard
from agentpost.marks.telemetry import METRIC_MARKS_WRITTEN
from marks_backends import T0

OBS, WARN, NEED = MarkType.OBSERVATION, MarkType.WARNING, MarkType.NEED
WINDOW = 300.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def obs(topic: str = "x", scope: str = "feed") -> Observation:
    return Observation(scope=scope, topic=topic, content={"v": 1})


def windows(envelope: StatisticalEnvelope, clock: Clock, who: uuid.UUID, counts: list[int]):
    """One window per entry: ``count`` observations, then the clock moves a full window on."""
    for count in counts:
        for _ in range(count):
            envelope.record(who, obs())
        clock.t += WINDOW


# =========================================================================== envelope


def test_p41_package_envelope_is_normal_until_min_samples_active_windows() -> None:
    """P41: NORMAL while the WelfordDetector has fewer than min_samples (10) windows with
    writes, whatever the agent does; windows without writes do not count."""
    clock = Clock()
    envelope = StatisticalEnvelope(EnvelopeConfig(), clock)
    who = uuid.uuid4()
    for burst in [2, 40, 2, 2, 0, 0, 2, 2, 2, 2]:
        for _ in range(burst):
            envelope.record(who, obs())
            assert envelope.check(who) is EnvelopeVerdict.NORMAL
        clock.t += WINDOW
    stats = envelope.get_stats(who)
    assert isinstance(stats, AgentStats)
    assert stats.completed_windows == 7 and not stats.restricted  # the 8th is still open
    assert envelope.check(who) is EnvelopeVerdict.NORMAL  # closes it: 8 of 10
    assert envelope.get_stats(who).completed_windows == 8
    assert envelope.check(uuid.uuid4()) is EnvelopeVerdict.NORMAL  # never seen: NORMAL


def test_p40_rate_spike_restricts_until_reset_returns_true() -> None:
    """P40: a window above mean + k·max(stddev, sqrt(mean)) is RESTRICTED, and stays so in
    later quiet windows; reset() -> True lifts it, a second reset() -> False."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = uuid.uuid4()
    windows(envelope, clock, who, [2] * 10)
    for _ in range(6):  # 2 + 3.5·sqrt(2) = 6.95: six is within
        envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED
    clock.t += 10 * WINDOW
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED
    assert envelope.get_stats(who).restricted
    assert envelope.reset(who, uuid.uuid4()) is True
    assert envelope.reset(who, uuid.uuid4()) is False
    assert envelope.check(who) is EnvelopeVerdict.NORMAL


def test_cold_start_baseline_is_the_median_not_the_mean() -> None:
    """§9.7 (package): one burst during cold start does not inflate the baseline: after ten
    windows of 2 with one of 30, the mean is 2 (the median) and 8 writes are a spike."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = uuid.uuid4()
    windows(envelope, clock, who, [2, 2, 30, 2, 2, 2, 2, 2, 2, 2])
    for _ in range(8):
        envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED
    assert envelope.get_stats(who).welford_mean[OBS] == 2.0


def test_type_shift_and_untracked_types() -> None:
    """§9.7 check 2 over the tracked types (observations, warnings): an observer that turns
    to warnings is RESTRICTED; needs are not tracked and change nothing."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = uuid.uuid4()
    envelope.seed_baseline(who, {OBS: 48.0})  # 4 per window, ready at once
    for _ in range(50):
        envelope.record(who, Need(scope="feed", question="q"))
        envelope.record_attempt(who, NEED)
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    assert envelope.get_stats(who).current_window.counts == {}
    envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    for _ in range(3):
        envelope.record(who, WarningMark(scope="feed", topic="x"))
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED  # 3 of 4 writes are warnings


def test_record_attempt_counts_a_rejected_write() -> None:
    """P64 with the envelope: record_attempt(agent_id, mark_type) counts like a stored mark."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = uuid.uuid4()
    envelope.seed_baseline(who, {OBS: 24.0})
    for _ in range(7):
        envelope.record_attempt(who, OBS)
    assert envelope.get_stats(who).current_window.counts == {OBS: 7}
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED


def test_concentration_flags_three_writers_of_one_topic() -> None:
    """§9.7 check 3: three ready agents on one (scope, topic) in their windows are FLAGGED,
    not restricted; another topic is NORMAL."""
    clock = Clock()
    envelope = StatisticalEnvelope(EnvelopeConfig(concentration_threshold=3), clock)
    crowd = [uuid.uuid4() for _ in range(3)]
    for who in crowd:
        envelope.seed_baseline(who, {OBS: 24.0})
    envelope.record(crowd[0], obs("hot"))
    envelope.record(crowd[1], obs("hot"))
    assert envelope.check(crowd[0]) is EnvelopeVerdict.NORMAL
    envelope.record(crowd[2], obs("hot"))
    assert [envelope.check(who) for who in crowd] == [EnvelopeVerdict.FLAGGED] * 3
    loner = uuid.uuid4()
    envelope.seed_baseline(loner, {OBS: 24.0})
    envelope.record(loner, obs("cold"))
    assert envelope.check(loner) is EnvelopeVerdict.NORMAL


def test_exempt_agents_and_the_escalation_threshold() -> None:
    """§9.7 exempt agents: add_exempt_agent makes record() ignore the agent; the global
    escalation threshold is the config's (P43)."""
    envelope = StatisticalEnvelope(EnvelopeConfig(global_escalation_threshold=5), Clock())
    who = uuid.uuid4()
    envelope.add_exempt_agent(who)
    envelope.record(who, obs())
    envelope.record_attempt(who, OBS)
    assert envelope.get_stats(who) is None
    assert envelope.global_escalation_threshold == 5
    assert StatisticalEnvelope().global_escalation_threshold == 3


class Ceiling(AnomalyDetector):
    """A custom detector: anything above a fixed ceiling, ready after one window."""

    def __init__(self, agent_id: uuid.UUID) -> None:
        self.agent_id = agent_id
        self.windows: list[dict[MarkType, int]] = []

    def observe(self, window_counts: dict[MarkType, int]) -> None:
        self.windows.append(window_counts)

    def is_ready(self) -> bool:
        return bool(self.windows)

    def is_anomalous(self, current_counts: dict[MarkType, int]) -> bool:
        return sum(current_counts.values()) > 3

    def export_state(self) -> dict[str, Any]:
        return {"windows": len(self.windows)}

    def import_state(self, data: dict[str, Any]) -> None:
        self.windows = [{}] * data["windows"]


def test_custom_detector_through_the_config_factory() -> None:
    """§9.7 pluggable detection: detector_factory(agent_id) builds one detector per agent;
    its answers are the envelope's verdicts; export/import carry its state and the flag."""
    clock = Clock()
    made: list[Ceiling] = []
    config = EnvelopeConfig(detector_factory=lambda agent_id: made.append(Ceiling(agent_id))
                            or made[-1])
    envelope = StatisticalEnvelope(config, clock)
    who = uuid.uuid4()
    windows(envelope, clock, who, [1])
    for _ in range(4):
        envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED
    assert [d.agent_id for d in made] == [who] and made[0].windows == [{OBS: 1}]
    exported = envelope.export_stats()
    assert exported == {str(who): {"windows": 1, "restricted": True}}
    fresh = StatisticalEnvelope(config, clock)
    fresh.import_stats(json.loads(json.dumps(exported)))
    assert fresh.check(who) is EnvelopeVerdict.RESTRICTED


def test_welford_detector_package_api() -> None:
    """§9.7 WelfordDetector: seeded baselines (stddev half the mean), readiness, export and
    import, diagnostics."""
    detector = WelfordDetector(WelfordConfig(min_samples=3))
    assert not detector.is_ready()
    detector.seed_baseline({OBS: 4.0, NEED: 9.0}, synthetic_windows=5)  # needs: untracked
    assert detector.is_ready() and detector.completed_windows == 5
    stats = detector.diagnostic_stats()
    assert stats["mean"] == {OBS: 4.0} and stats["m2"][OBS] == pytest.approx(0.25 * 16 * 4)
    assert not detector.is_anomalous({OBS: 11})  # 4 + 3.5 * 2 = 11
    assert detector.is_anomalous({OBS: 12})
    detector.observe({OBS: 4, WARN: 0})
    copy = WelfordDetector(WelfordConfig(min_samples=3))
    copy.import_state(json.loads(json.dumps(detector.export_state())))
    assert copy.is_ready() and copy.completed_windows == 6
    assert copy.diagnostic_stats()["mean"] == detector.diagnostic_stats()["mean"]


LONG_HISTORY = 40  # windows of 2 writes: past ~13, a closed half no longer lifts the threshold


def straddle(envelope: StatisticalEnvelope, clock: Clock, gap: float = WINDOW) -> uuid.UUID:
    """A long-running agent, then a burst across a window boundary: 9 writes recorded through
    the write hook with no check in their window (never judged), and ``gap`` later 6 more,
    under the threshold on their own. Returns the agent."""
    who = uuid.uuid4()
    windows(envelope, clock, who, [2] * LONG_HISTORY)
    windows(envelope, clock, who, [9])
    clock.t += gap - WINDOW
    for _ in range(6):
        envelope.record(who, obs())
    return who


def test_straddling_burst_of_section_9_7_restricts_the_default_envelope() -> None:
    """Markspace §9.7 check 1: ``current + previous > 2 * threshold`` flags a burst split
    across a window boundary; on by default (beyond the package). Here 6 + 9 > 2 * 7.33,
    while the 6 of the current window alone stay under 7.33."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = straddle(envelope, clock)
    threshold = envelope.detector_for(who).threshold(OBS)
    assert 6 < threshold < 7.5
    finding = envelope.evaluate(who)
    assert finding.verdict is EnvelopeVerdict.RESTRICTED
    assert (finding.kind, finding.mark_type) == (AnomalyKind.BURST, OBS)
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED  # P40
    stats = envelope.get_stats(who)
    assert stats.previous_window.counts == {OBS: 9} and stats.current_window.counts == {OBS: 6}


def test_straddle_check_off_gives_the_package_verdict() -> None:
    """``EnvelopeConfig(straddle_check=False)``: the package's exact detection, so the same
    straddling sequence stays NORMAL (the package's WelfordDetector only sees 6 < 7.33)."""
    clock = Clock()
    envelope = StatisticalEnvelope(EnvelopeConfig(straddle_check=False), clock)
    who = straddle(envelope, clock)
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    assert EnvelopeConfig().straddle_check is True


def test_straddle_needs_adjacent_windows_an_idle_gap_means_no_previous() -> None:
    """§9.7 straddle: the halves must sit either side of one boundary; with a whole idle
    window between them, ``previous`` is empty and the later half alone is NORMAL."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = straddle(envelope, clock, gap=2 * WINDOW)
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    assert envelope.get_stats(who).previous_window.counts == {}


def test_reset_forgives_the_burst_for_the_straddle_check() -> None:
    """P40 reset: the window whose burst was lifted does not restrict again as the next
    window's ``previous`` (20 + 6 > 2 * 12.28 without the forgiveness); as the package,
    which has no straddle check, the agent is NORMAL after reset."""
    clock = Clock()
    envelope = StatisticalEnvelope(clock=clock)
    who = uuid.uuid4()
    windows(envelope, clock, who, [2] * LONG_HISTORY)
    for _ in range(20):
        envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.RESTRICTED
    clock.t += WINDOW
    assert envelope.reset(who, uuid.uuid4()) is True
    for _ in range(6):
        envelope.record(who, obs())
    assert envelope.check(who) is EnvelopeVerdict.NORMAL
    assert 12 < envelope.detector_for(who).threshold(OBS) < 13  # 26 would straddle


def test_windowed_keywords_and_a_config_do_not_mix() -> None:
    """Bad input: our windowed keywords next to an EnvelopeConfig are refused, clearly."""
    with pytest.raises(InvalidArgument, match="not both"):
        StatisticalEnvelope(EnvelopeConfig(), min_samples=3)
    with pytest.raises(InvalidArgument):
        StatisticalEnvelope(EnvelopeConfig(window_seconds=0))


# =========================================================================== probe


def test_p46_probe_cycle_of_the_package(make_space) -> None:
    """P46 and §9.9: the probe agent writes only to the diagnostic scope; a canary reads back;
    HEALTHY / SUSPICIOUS / COMPROMISED from the marks each agent wrote after it; a blocking
    Need per COMPROMISED agent; every result kept."""
    space = make_space([Scope(name="diagnostics"), Scope(name="feed")], clock=T0)
    probe = DiagnosticProbe(space, ProbeConfig(), clock=lambda: T0 + 1)
    assert set(probe.probe_agent.scopes) == {"diagnostics"}
    assert not probe.probe_agent.can_write("feed", OBS)
    canary = probe.inject_canary("feed")
    assert probe.check_canary_visibility(canary)
    assert not probe.check_canary_visibility(uuid.uuid4())
    stored = space.get(canary)
    assert stored.scope == "diagnostics" and stored.content["target_scope"] == "feed"
    on_topic = Observation(scope="diagnostics", topic="probe-canary", content={})
    ids = [uuid.uuid4() for _ in range(3)]
    results = probe.run_probe(
        "feed", {ids[0]: ("good", [on_topic]), ids[1]: ("chatty", [obs()]), ids[2]: ("mute", [])}
    )
    assert [r.verdict for r in results] == [
        ProbeVerdict.HEALTHY, ProbeVerdict.SUSPICIOUS, ProbeVerdict.COMPROMISED
    ]
    assert all(isinstance(r, ProbeResult) and r.timestamp == T0 + 1 for r in results)
    [need] = [m for m in space.read("diagnostics", mark_type=NEED)]
    assert need.blocking and need.context["agent_id"] == str(ids[2])
    assert probe.get_results() == results
    # an observation naming the canary's id is an answer too (the harness's own check)
    ack = Observation(scope="feed", topic="t", content={"canary_id": str(canary)})
    answer = probe.check_agent_response(ids[1], "chatty", canary, [obs(), ack])
    assert answer.verdict is ProbeVerdict.HEALTHY and probe.get_results()[-1] == answer


def test_probe_config_names_the_scope_and_topic(make_space) -> None:
    """§9.9: ProbeConfig(probe_scope, canary_topic) places canaries; nothing lands elsewhere."""
    space = make_space([Scope(name="health"), Scope(name="feed")], clock=T0)
    probe = DiagnosticProbe(space, ProbeConfig(probe_scope="health", canary_topic="ping"))
    canary = probe.inject_canary("feed", content={"hello": "there"})
    assert space.get(canary).topic == "ping" and space.get(canary).content == {"hello": "there"}
    assert space.read("feed") == []
    assert probe.probe_agent.read_scopes == ("health",)


# =========================================================================== telemetry


class Recorder(TelemetrySink):
    """A sink written against the package's ABC only."""

    def __init__(self) -> None:
        self.events: list[TelemetryEvent] = []
        self.counters: list[tuple[str, float, dict[str, str]]] = []

    def emit_event(self, event: TelemetryEvent) -> None:
        self.events.append(event)

    def record_counter(self, name: str, value: float, labels: dict[str, str]) -> None:
        self.counters.append((name, value, labels))

    def record_gauge(self, name: str, value: float, labels: dict[str, str]) -> None:
        pass

    def record_histogram(self, name: str, value: float, labels: dict[str, str]) -> None:
        pass


def test_p58_a_package_sink_gets_one_event_per_write(make_space) -> None:
    """P58: a TelemetrySink written for the package receives a TelemetryEvent for each
    write_mark (operation, verdict, agent, scope, type) and the written-marks counter."""
    space = make_space([Scope(name="feed")], clock=T0)
    sink = Recorder()
    guard = Guard(space, telemetry=sink)
    writer = Agent(name="w", scopes={"feed": ["observation"]})
    guard.write_mark(writer, obs())
    [event] = sink.events
    assert (event.operation, event.verdict, event.scope, event.mark_type) == (
        "write_mark", "accepted", "feed", "observation"
    )
    assert event.agent_id == str(writer.id) and event.timestamp == T0
    assert [c[0] for c in sink.counters] == [METRIC_MARKS_WRITTEN]


def test_p57_sinks_of_the_package() -> None:
    """P57 and §9.11: the ABC refuses an incomplete sink; NullSink ignores, FailingSink raises
    RuntimeError, InMemorySink keeps events and readings as the package does."""
    with pytest.raises(TypeError):
        type("Half", (TelemetrySink,), {"emit_event": lambda self, event: None})()
    NullSink().emit_event(TelemetryEvent())
    NullSink().flush()
    with pytest.raises(RuntimeError):
        FailingSink().record_counter("c", 1.0, {})
    sink = InMemorySink()
    sink.emit_event(TelemetryEvent(agent_id="a", operation="execute"))
    sink.record_counter("c", 2.0, {"k": "v"})
    sink.record_gauge("g", 3.0, {})
    sink.record_histogram("h", 4.0, {})
    assert sink.events[0].operation == "execute"
    assert (sink.counters, sink.gauges, sink.histograms) == (
        [("c", 2.0, {"k": "v"})], [("g", 3.0, {})], [("h", 4.0, {})]
    )
    sink.clear()
    assert not (sink.events or sink.counters or sink.gauges or sink.histograms)


def test_structured_log_sink_defaults_to_markspace_telemetry(caplog) -> None:
    """§9.11 StructuredLogSink(): JSON through the "markspace.telemetry" logger, the event's
    fields at INFO, metrics at DEBUG."""
    sink = StructuredLogSink()
    with caplog.at_level(logging.DEBUG, logger="markspace.telemetry"):
        sink.emit_event(TelemetryEvent(operation="write_mark", verdict="rejected"))
        sink.record_gauge("markspace.needs.pending", 2.0, {"scope": "feed"})
    first, second = caplog.records
    assert first.name == "markspace.telemetry" and first.levelno == logging.INFO
    assert json.loads(first.getMessage())["verdict"] == "rejected"
    assert second.levelno == logging.DEBUG
    assert json.loads(second.getMessage()) == {
        "metric": "markspace.needs.pending", "type": "gauge", "value": 2.0, "scope": "feed"
    }


# =========================================================================== scheduler


def scheduled(name: str, every: float | None) -> Agent:
    manifest = AgentManifest(schedule_interval=every) if every else None
    return Agent(name=name, scopes={"feed": ["observation"]}, manifest=manifest)


def test_p56_scheduler_with_a_pre_activation_check() -> None:
    """P56 and §14: register() -> True only for a scheduled agent; a vetoed agent is neither
    due nor activated, and is due as soon as the veto lifts; unregister() -> None."""
    clock = Clock()
    broke: set[uuid.UUID] = set()
    scheduler = Scheduler(clock, pre_activation_check=lambda a: "budget" if a.id in broke else None)
    poller, idle = scheduled("poller", 60.0), scheduled("idle", None)
    assert scheduler.register(poller) is True and scheduler.register(idle) is False
    broke.add(poller.id)
    assert scheduler.due() == [] and scheduler.tick_all() == []
    broke.clear()
    assert scheduler.tick_all() == [poller]  # never activated: due at once
    clock.t += 59
    assert scheduler.due() == []
    clock.t += 1
    assert scheduler.due() == [poller]
    assert scheduler.unregister(poller) is None and scheduler.due() == []


def test_scheduler_start_and_stop_in_the_background() -> None:
    """§14 timer wrapper: start(poll_interval, on_due) hands due agents to on_due; a second
    start is a no-op; stop() ends the loop."""
    scheduler = Scheduler(Clock())
    scheduler.register(scheduled("poller", 60.0))
    got = threading.Event()
    scheduler.start(poll_interval=0.01, on_due=lambda agents: got.set())
    scheduler.start()
    try:
        assert got.wait(5)
    finally:
        scheduler.stop()
    assert not scheduler.running
