"""Composition and scheduling properties (Markspace §13-§14, P48-P56) on both backends:
subscriptions replace, are prospective, deliver only matching marks, at most once, in write
order, never an agent's own writes; pipeline and manifest checks are pure; a scheduled agent
is never activated twice within its interval."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentpost.marks import (
    Agent,
    AgentManifest,
    DecayConfig,
    MarkType,
    Observation,
    Scope,
    WatchPattern,
    hours,
    minutes,
)
from agentpost.marks.compose import validate_manifest_permissions, validate_pipeline
from agentpost.marks.schedule import Scheduler
from marks_backends import T0, SpaceFactory

SENSORS = Scope(name="sensors", decay=DecayConfig(observation_half_life=hours(1)))
OTHER = Scope(name="other")


def _writer(name: str = "writer") -> Agent:
    return Agent(name=name, scopes={"sensors": ["observation"], "other": ["observation"]})


def _obs(topic: str, scope: str = "sensors", n: int = 0) -> Observation:
    return Observation(scope=scope, topic=topic, content={"n": n})


def test_p48_resubscribing_replaces_and_never_duplicates(new_space: SpaceFactory) -> None:
    """P48 Subscription Idempotency: subscribe() replaces the previous subscription;
    re-subscribing causes no duplicate deliveries."""
    space = new_space([SENSORS, OTHER], clock=T0)
    reader, writer = _writer("reader"), _writer()
    space.subscribe(reader, [WatchPattern(scope="sensors")])
    space.subscribe(reader, [WatchPattern(scope="sensors")])
    space.write(writer, _obs("a"))
    assert [m.topic for m in space.get_watched_marks(reader)] == ["a"]
    space.subscribe(reader, [WatchPattern(scope="other")])
    space.write(writer, _obs("b"))
    space.write(writer, _obs("c", scope="other"))
    assert [m.topic for m in space.get_watched_marks(reader)] == ["c"]


def test_p49_subscription_is_not_retroactive(new_space: SpaceFactory) -> None:
    """P49 Subscription Prospective: marks written before subscribe() are not delivered."""
    space = new_space([SENSORS], clock=T0)
    reader, writer = _writer("reader"), _writer()
    space.write(writer, _obs("before"))
    space.subscribe(reader, [WatchPattern(scope="sensors")])
    space.write(writer, _obs("after"))
    assert [m.topic for m in space.get_watched_marks(reader)] == ["after"]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(writes=st.lists(st.tuples(st.sampled_from(["sensors", "sensors/t", "other"]),
                                 st.sampled_from(["x", "y"]), st.booleans()),
                       min_size=1, max_size=12),
       topic=st.sampled_from([None, "x"]))
def test_p50_p51_p52_watched_marks_match_once_in_write_order(
        new_space: SpaceFactory, writes: list[tuple[str, str, bool]], topic: str | None) -> None:
    """P50 Watch Subset, P51 At-Most-Once Delivery, P52 Write-Order Delivery, and no
    delivery of an agent's own writes: for any sequence of writes, get_watched_marks returns
    exactly the matching marks written by others, in write order, once."""
    with new_space.scoped([SENSORS, OTHER, Scope(name="sensors/t")], clock=T0) as space:
        reader = Agent(name="reader", scopes={"sensors": ["observation"],
                                              "other": ["observation"]})
        writer = _writer()
        space.subscribe(reader, [WatchPattern(scope="sensors", mark_type=MarkType.OBSERVATION,
                                              topic=topic)])
        expected = []
        for i, (scope, t, own) in enumerate(writes):
            mark_id = space.write(reader if own else writer, _obs(t, scope=scope, n=i))
            if not own and scope.startswith("sensors") and topic in (None, t):
                expected.append(mark_id)
        peeked = [m.id for m in space.get_watched_marks(reader, clear=False)]
        assert peeked == expected
        assert [m.id for m in space.get_watched_marks(reader)] == expected
        assert space.get_watched_marks(reader) == []


def test_p51_unsubscribe_stops_delivery(new_space: SpaceFactory) -> None:
    """§13.3 unsubscribe: the subscription and its pending queue are removed."""
    space = new_space([SENSORS], clock=T0)
    reader, writer = _writer("reader"), _writer()
    space.subscribe(reader, [WatchPattern(scope="sensors")])
    space.write(writer, _obs("queued"))
    space.unsubscribe(reader)
    space.write(writer, _obs("after"))
    assert space.get_watched_marks(reader) == []


PRODUCER = Agent(name="producer", scopes={"sensors": ["observation"]},
                 manifest=AgentManifest(outputs=(("sensors", MarkType.OBSERVATION),)))
CONSUMER = Agent(name="consumer", scopes={"alerts": ["warning"]},
                 manifest=AgentManifest(inputs=(WatchPattern(scope="sensors"),),
                                        outputs=(("alerts", MarkType.WARNING),)))
SINK = Agent(name="sink", scopes={},
             manifest=AgentManifest(inputs=(WatchPattern(scope="alerts",
                                                         mark_type=MarkType.WARNING),)))


def test_p53_pipeline_validation_depends_on_manifests_only(new_space: SpaceFactory) -> None:
    """P53 Pipeline Structural Validation: a pure function of the manifests; the state of a
    space (empty or full) changes nothing."""
    before = (validate_pipeline([PRODUCER, CONSUMER, SINK]),
              validate_pipeline([PRODUCER, SINK]))
    space = new_space([SENSORS], clock=T0)
    space.write(PRODUCER, _obs("t"))
    after = (validate_pipeline([PRODUCER, CONSUMER, SINK]),
             validate_pipeline([PRODUCER, SINK]))
    assert before == after
    assert before[0] == [] and before[1] != []


def test_p54_manifest_outputs_must_be_permitted() -> None:
    """P54 Manifest-Permission Consistency: an output the agent may not write is reported."""
    assert validate_manifest_permissions(PRODUCER) == []
    liar = Agent(name="liar", scopes={"sensors": ["observation"]},
                 manifest=AgentManifest(outputs=(("alerts", MarkType.WARNING),)))
    assert validate_manifest_permissions(liar) != []


def test_p55_pattern_matching_is_pure(new_space: SpaceFactory) -> None:
    """P55 Pattern Match Purity: matching changes neither the mark nor the pattern."""
    space = new_space([SENSORS], clock=T0)
    mark = space.get(space.write(_writer(), _obs("t")))
    pattern = WatchPattern(scope="sensors", topic="t")
    snapshot = (mark.model_dump(), pattern.model_dump())
    assert all(pattern.matches(mark) for _ in range(3))
    assert (mark.model_dump(), pattern.model_dump()) == snapshot


@settings(max_examples=40, deadline=None)
@given(interval=st.floats(min_value=1, max_value=3600),
       steps=st.lists(st.floats(min_value=0, max_value=600), min_size=1, max_size=40))
def test_p56_activations_are_at_least_an_interval_apart(interval: float,
                                                        steps: list[float]) -> None:
    """P56 Schedule Interval: for any sequence of ticks, consecutive activations of an agent
    are at least schedule_interval apart."""
    clock = [T0]
    scheduler = Scheduler(clock=lambda: clock[0])
    agent = Agent(name="poller", scopes={"sensors": ["observation"]},
                  manifest=AgentManifest(schedule_interval=interval))
    scheduler.register(agent)
    activations = []
    for step in steps:
        clock[0] += step
        if any(a.id == agent.id for a in scheduler.tick_all()):
            activations.append(clock[0])
    assert activations and activations[0] == T0 + steps[0]
    assert all(b - a >= interval for a, b in itertools.pairwise(activations))


def test_p56_update_keeps_the_last_activation() -> None:
    """§14.2 update(): a new manifest keeps the last activation, so it is not re-triggered
    early."""
    clock = [T0]
    scheduler = Scheduler(clock=lambda: clock[0])
    agent = Agent(name="poller", scopes={}, manifest=AgentManifest(schedule_interval=minutes(5)))
    scheduler.register(agent)
    assert scheduler.tick_all() == [agent]
    clock[0] += minutes(4)
    scheduler.update(agent.model_copy(update={
        "manifest": AgentManifest(schedule_interval=minutes(10))}))
    clock[0] += minutes(5)
    assert scheduler.tick_all() == []
    clock[0] += minutes(1)
    assert [a.id for a in scheduler.tick_all()] == [agent.id]
