"""A program written against the `markspace` package (0.2.0b0), as its users write them.

tests/conformance/test_markspace_dropin.py runs this file three times: as it is (on the
package), with its import line changed to agentpost.marks, and with the constructor calls changed to
PostgresMarkSpace. Every run prints the same transcript. Nothing else in the file changes.
"""

import markspace
from markspace import (
    Agent,
    ConflictPolicy,
    ContentPolicy,
    ContentPolicyError,
    DecayConfig,
    Guard,
    GuardVerdict,
    MarkType,
    Need,
    Observation,
    PolicyResult,
    PolicyVerdict,
    QuotaExceededError,
    Scope,
    ScopeError,
    ScopeVisibility,
    Source,
    ValidationError,
    Warning,
    hours,
    minutes,
)

T0 = 1_700_000_000.0
DECAY = DecayConfig(observation_half_life=hours(1), warning_half_life=minutes(30),
                    intent_ttl=hours(2))
SCOPES = [
    Scope(name="calendar", allowed_intent_verbs=("book",), allowed_action_verbs=("booked",),
          decay=DECAY, conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE),
    Scope(name="rooms", decay=DECAY, conflict_policy=ConflictPolicy.FIRST_WRITER),
    Scope(name="venues", decay=DECAY, deferred=True),
    Scope(name="research", decay=DECAY),
    Scope(name="hr", visibility=ScopeVisibility.PROTECTED, decay=DECAY),
]
transcript: list[str] = []


def say(*parts: object) -> None:
    transcript.append(" ".join(str(p) for p in parts))


class Hygiene(ContentPolicy):
    """Strips text, rejects secrets, flags unfinished notes (Markspace §9.13)."""

    def evaluate(self, agent, mark, scope):
        if not isinstance(mark.content, str):
            return PolicyResult(verdict=PolicyVerdict.ALLOW)
        if "password" in mark.content:
            return PolicyResult(verdict=PolicyVerdict.REJECT, reason="a secret")
        if "TODO" in mark.content:
            return PolicyResult(verdict=PolicyVerdict.FLAG, reason="unfinished")
        return PolicyResult(verdict=PolicyVerdict.REWRITE, content=mark.content.strip())


def strengths(space, scope, **filters):
    now = space.now()
    decay = space.get_scope(scope).decay
    marks = space.read(scope, **filters)
    warnings = [m for m in space.read(scope, mark_type=MarkType.WARNING, min_strength=0.0)
                if isinstance(m, Warning)]
    return sorted(
        f"{m.mark_type.value}:{m.content if hasattr(m, 'content') else ''}:"
        f"{markspace.effective_strength_with_warnings(m, warnings, now, decay):.9f}"
        for m in marks)


space = markspace.MarkSpace(scopes=SCOPES, clock=T0)
guard = Guard(space, content_policies=[Hygiene()])
every = ["intent", "action", "observation", "warning", "need"]
alice = Agent(name="alice", scopes={"calendar": every, "rooms": every, "venues": every,
                                    "research": every, "hr": every}, read_scopes={"hr"})
bob = Agent(name="bob", scopes={"calendar": every, "rooms": every, "venues": every,
                                "research": ["observation"]},
            max_source=Source.EXTERNAL_VERIFIED)
mallory = Agent(name="mallory", scopes={"research": ["observation"]})

# conflicts under HIGHEST_CONFIDENCE, and an action holding its resource (P39)
say("alice", guard.pre_action(alice, "calendar", "room-1", "book", confidence=0.9).verdict.value)
loser = guard.pre_action(bob, "calendar", "room-1", "book", confidence=0.6)
say("bob", loser.verdict.value, loser.winning_intent.agent_id == alice.id)
decision, result = guard.execute(alice, "calendar", "room-2", "book", "booked",
                                 lambda: {"ok": True}, confidence=0.8)
say("execute", decision.verdict.value, result)
say("bob on a booked room",
    guard.pre_action(bob, "calendar", "room-2", "book", confidence=1.0).verdict.value)
say("mallory", guard.pre_action(mallory, "calendar", "room-3", "book").verdict.value)
say("is denied", guard.pre_action(mallory, "calendar", "room-3", "book").verdict
    is GuardVerdict.DENIED)

# FIRST_WRITER
space.set_clock(T0 + 1)
guard.pre_action(bob, "rooms", "r", "hold", confidence=0.1)
space.set_clock(T0 + 2)
say("first writer", guard.pre_action(alice, "rooms", "r", "hold", confidence=1.0).verdict.value)

# deferred resolution at a boundary
guard.pre_action(alice, "venues", "hall", "reserve", confidence=0.4)
guard.pre_action(bob, "venues", "hall", "reserve", confidence=0.7)
verdicts = guard.resolve_deferred("venues", "hall")
say("boundary", verdicts[alice.id].verdict.value, verdicts[bob.id].verdict.value)

# content policies on observations
kept = guard.write_mark(alice, Observation(scope="research", topic="weather",
                                           content="  sunny  ", confidence=0.9))
say("rewritten", repr(space.get_mark(kept).content))
try:
    guard.write_mark(alice, Observation(scope="research", topic="weather",
                                        content="password=hunter2"))
    say("not rejected")
except ContentPolicyError:
    say("rejected")
flagged = guard.write_mark(alice, Observation(scope="research", topic="weather",
                                              content="TODO measure"))
flags = [m for m in space.read("_system", mark_type=MarkType.WARNING)]
say("flagged", len(flags), space.get_mark(flagged).content)

# trust, authorization and validation errors
bob_id = space.write(bob, Observation(scope="research", topic="weather", content=18,
                                      source=Source.EXTERNAL_VERIFIED))
try:
    space.write(bob, Observation(scope="research", topic="weather", content=19))
    say("fleet source accepted")
except ScopeError:
    say("scope error: above max_source")
try:
    space.write(alice, Observation(scope="nowhere", topic="weather", content=1))
    say("unknown scope accepted")
except ValidationError:
    say("validation error: unknown scope")
try:
    space.write(mallory, Observation(scope="calendar", topic="weather", content=1))
    say("calendar observation accepted")
except ScopeError:
    say("scope error")

# decay, trust weights and warning invalidation, read back
space.set_clock(T0 + minutes(90))
say("weather", strengths(space, "research", topic="weather"))
space.write(alice, Warning(scope="research", topic="weather", invalidates=bob_id,
                           reason="sensor drift"))
space.set_clock(T0 + minutes(100))
say("weather warned", strengths(space, "research", topic="weather"))

# visibility: a PROTECTED scope shows bob a projection
space.write(alice, Observation(scope="hr", topic="salary", content={"amount": 100}))
say("hr alice", [m.content for m in space.read("hr", reader=alice)])
say("hr bob", [(m.content, m.projected) for m in space.read("hr", reader=bob)])

# needs: aggregate, resolve with the booking action
need = space.write(alice, Need(scope="research", question="Which venue?", priority=0.7,
                               blocking=True))
space.write(alice, Need(scope="research", question="Budget?", priority=0.2))
say("needs", [(c.scope, round(c.effective_priority, 9), c.blocking_count, len(c.needs))
              for c in space.aggregate_needs()])
booking = space.read("calendar", resource="room-2", mark_type=MarkType.ACTION)[0]
space.resolve(need, booking.id)
say("needs after", [(c.scope, len(c.needs)) for c in space.aggregate_needs()])

# intents run out at their TTL
space.set_clock(T0 + hours(3))
say("after ttl", guard.pre_action(bob, "calendar", "room-1", "book").verdict.value)

# a per-agent quota
small = markspace.MarkSpace(scopes=SCOPES, clock=T0, max_marks_per_agent=2)
for n in range(3):
    try:
        small.write(alice, Observation(scope="research", topic="t", content=n))
        say("quota write", n)
    except QuotaExceededError:
        say("quota exceeded at", n)
