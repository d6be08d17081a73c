"""The spec's own examples run unchanged with ``from agentpost.marks import ...``, on both
backends.

``SPEC_12_1`` is the DSL example of spec §12.1 as printed there, with only its import line
pointed at ``agentpost.marks``. It runs with ``exec`` in two halves so the test can check the
result of each ``read`` (the spec shows them as comments). On Postgres the one line that builds
the in-memory space is swapped for a ``PostgresMarkSpace`` of the module's database.

The §14.1 manifest example, the §7.4 visibility examples and the §6.2.1 deferred-resolution
timeline run as written too, against a space of each backend.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from agentpost.marks import (
    Action,
    Agent,
    AgentManifest,
    ConflictPolicy,
    Guard,
    Intent,
    MarkType,
    Need,
    Observation,
    Scheduler,
    Scope,
    ScopeVisibility,
    UnauthorizedWrite,
    Verdict,
    hours,
    minutes,
    validate_manifest_permissions,
)
from marks_backends import T0, SpaceFactory

# Spec §12.1, "DSL Usage", verbatim but for `from markspace import` -> `from agentpost.marks
# import`. Split where the spec's comments show what the first read returns.
SPEC_12_1_FIRST = textwrap.dedent(
    '''
    from agentpost.marks import (
        Action,
        Agent,
        ConflictPolicy,
        DecayConfig,
        Intent,
        MarkSpace,
        Need,
        Observation,
        Scope,
        Source,
        Warning,
        hours,
        minutes,
    )

    # Define a scope
    calendar = Scope(
        name="calendar",
        allowed_intent_verbs=["book", "reschedule", "cancel"],
        allowed_action_verbs=["booked", "rescheduled", "cancelled"],
        decay=DecayConfig(
            observation_half_life=hours(1),
            warning_half_life=hours(4),
            intent_ttl=minutes(30),
        ),
        conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
    )

    # Define the environment with the scope registered
    space = MarkSpace(scopes=[calendar])

    # Define agents
    booker = Agent(
        name="flight-booker",
        scopes={"calendar": ["intent", "action"]},
    )
    optimizer = Agent(
        name="calendar-opt",
        scopes={"calendar": ["intent", "action", "observation"]},
    )

    # Agent writes an intent
    intent_id = space.write(
        booker,
        Intent(
            scope="calendar",
            resource="thu-14:00",
            action="book",
            confidence=0.9,
        ),
    )

    # Another agent reads, sees the intent, applies local rules
    marks = space.read(scope="calendar", resource="thu-14:00")
    # → [Intent(agent=booker, action="book", confidence=0.9, strength=1.0)]
    '''
)
SPEC_12_1_SECOND = textwrap.dedent(
    '''
    # Agent executes and writes action
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

    # Other agents see the action, update their world model
    marks = space.read(scope="calendar", resource="thu-14:00")
    # → [Action(agent=booker, action="booked", result={...}, strength=1.0)]
    # Intent is gone (superseded)
    '''
)
MEMORY_SPACE_LINE = "space = MarkSpace(scopes=[calendar])"


def test_spec_12_1_dsl_usage(new_space: SpaceFactory, backend: str) -> None:
    """§12.1: the DSL example runs as printed, and its reads return what its comments say."""
    first = SPEC_12_1_FIRST
    assert first.count(MEMORY_SPACE_LINE) == 1
    namespace: dict[str, Any] = {}
    if backend == "postgres":
        first = first.replace(MEMORY_SPACE_LINE, "space = make_space([calendar], None)")
        namespace["make_space"] = new_space
    exec(compile(first, "<spec §12.1>", "exec"), namespace)
    space, booker = namespace["space"], namespace["booker"]

    (intent,) = namespace["marks"]
    assert isinstance(intent, Intent)
    assert intent.id == namespace["intent_id"]
    assert (intent.agent_id, intent.action, intent.confidence) == (booker.id, "book", 0.9)
    assert space.strength_of(intent) == 1.0

    exec(compile(SPEC_12_1_SECOND, "<spec §12.1>", "exec"), namespace)
    (action,) = namespace["marks"]
    assert isinstance(action, Action)
    assert action.id == namespace["action_id"]
    assert (action.agent_id, action.action) == (booker.id, "booked")
    assert action.result == {"flight": "DL413", "departure": "14:30"}
    assert space.strength_of(action) == 1.0
    assert space.strength_of(space.get(namespace["intent_id"])) == 0.0  # superseded
    assert namespace["optimizer"].can_write("calendar", MarkType.OBSERVATION)


def test_spec_14_1_schedule_configuration(new_space: SpaceFactory) -> None:
    """§14.1: the weather-poller agent of the example, with its manifest, writes its
    declared output; the Scheduler makes it due at once, then every five minutes."""
    agent = Agent(
        name="weather-poller",
        scopes={"weather": ["observation"]},
        manifest=AgentManifest(
            outputs=(("weather", MarkType.OBSERVATION),),
            schedule_interval=minutes(5),  # principal sets this
        ),
    )
    space = new_space([Scope(name="weather")], clock=T0)
    assert validate_manifest_permissions(agent) == []
    observation = space.write(agent, Observation(scope="weather", topic="temp",
                                                 content={"celsius": 21.5}))
    assert space.read("weather", topic="temp")[0].id == observation
    with pytest.raises(UnauthorizedWrite):
        space.write(agent, Need(scope="weather", question="more sensors?"))

    scheduler = Scheduler(clock=T0)
    scheduler.register(agent)
    assert scheduler.tick_all() == [agent]
    scheduler.set_clock(T0 + minutes(5) - 1)
    assert scheduler.due() == []
    scheduler.set_clock(T0 + minutes(5))
    assert scheduler.due() == [agent]

    overreaching = agent.model_copy(update={"manifest": AgentManifest(
        outputs=(("weather", MarkType.OBSERVATION), ("alerts", MarkType.WARNING)))})
    assert len(validate_manifest_permissions(overreaching)) == 1


def test_spec_7_4_visibility_examples(new_space: SpaceFactory) -> None:
    """§7.4: the OPEN calendar, the PROTECTED hr scope ("a salary observation on employee-X
    at strength 0.95, but not the salary amount") and the CLASSIFIED legal scope."""
    calendar = Scope(name="calendar", visibility=ScopeVisibility.OPEN)
    hr = Scope(name="hr", visibility=ScopeVisibility.PROTECTED)
    legal = Scope(name="legal", visibility=ScopeVisibility.CLASSIFIED)
    space = new_space([calendar, hr, legal], clock=T0)
    clerk = Agent(name="clerk", scopes={"calendar": ["observation"], "hr": ["observation"],
                                        "legal": ["observation"]},
                  read_scopes=["hr", "legal"])
    anyone = Agent(name="anyone")
    for scope in ("calendar", "hr", "legal"):
        space.write(clerk, Observation(scope=scope, topic="employee-X", confidence=0.95,
                                       content={"salary": 123456}))
    (seen,) = space.read("calendar", topic="employee-X", reader=anyone)
    assert seen.content == {"salary": 123456}
    (salary,) = space.read("hr", topic="employee-X", reader=anyone)
    assert (salary.projected, salary.topic, salary.confidence) == (True, "employee-X", 0.95)
    assert salary.content is None
    assert space.read("hr", topic="employee-X", reader=clerk)[0].content == {"salary": 123456}
    assert space.read("legal", topic="employee-X", reader=anyone) == []
    assert len(space.read("legal", topic="employee-X", reader=clerk)) == 1


def test_spec_6_2_1_deferred_timeline(new_space: SpaceFactory) -> None:
    """§6.2.1: A (0.5), B (0.95) and C (0.7) write intents on R during collection; at the
    boundary HIGHEST_CONFIDENCE picks B; A and C get BLOCKED."""
    parking = Scope(name="parking", allowed_intent_verbs=["park"],
                    conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE, deferred=True)
    space = new_space([parking], clock=T0)
    guard = Guard(space)
    fleet = {n: Agent(name=n, scopes={"parking": ["intent", "action"]}) for n in "ABC"}
    for step, (name, confidence) in enumerate((("A", 0.5), ("B", 0.95), ("C", 0.7))):
        space.set_clock(T0 + step)
        decision = guard.pre_action(fleet[name], "parking", "R", "park", confidence)
        assert decision.verdict is Verdict.BLOCKED  # phase 1: advisory, no verdict yet
    outcome = {a: d.verdict for a, d in guard.resolve_deferred("parking", "R").items()}
    assert outcome == {
        fleet["A"].id: Verdict.BLOCKED,
        fleet["B"].id: Verdict.ALLOW,
        fleet["C"].id: Verdict.BLOCKED,
    }
    # losing intents stay until their TTL (they are not forcibly removed)
    assert len(space.read("parking", resource="R", mark_type=MarkType.INTENT)) == 3
    space.set_clock(T0 + hours(1))
    assert space.read("parking", resource="R", mark_type=MarkType.INTENT) == []
