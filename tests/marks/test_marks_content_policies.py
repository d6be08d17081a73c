"""Content policies in the guard (Markspace §9.13, P67–P70), on both backends.

Policies here are small real ones (recording, rewriting, rejecting, flagging); the spaces are
real (memory and Postgres). Each test names the property it checks.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest

from agentpost.marks.core import (
    Agent,
    InvalidMark,
    MarkType,
    Need,
    Observation,
    Scope,
    Source,
    Warning,
)
from agentpost.marks.envelope import StatisticalEnvelope
from agentpost.marks.guard import (
    SYSTEM_SCOPE,
    ContentPolicy,
    ContentPolicyError,
    Guard,
    GuardVerdict,
    PolicyResult,
    PolicyVerdict,
    WriteRejected,
)

WRITER = Agent(name="writer", scopes={"feed": ["observation", "warning", "need", "intent",
                                               "action"]})
FLAG_TOPIC = "content-policy-flag"


class Scripted(ContentPolicy):
    """Answers a fixed verdict and records every mark it was shown, in a shared log."""

    def __init__(self, label: str, verdict: PolicyVerdict, log: list, content: Any = None,
                 reason: str | None = None) -> None:
        self.label, self.verdict, self.log = label, verdict, log
        self.content, self.reason = content, reason

    def evaluate(self, agent: Agent, mark: Observation, scope: Scope) -> PolicyResult:
        self.log.append((self.label, mark, scope.name))
        return PolicyResult(self.verdict, content=self.content, reason=self.reason)

    @property
    def name(self) -> str:
        return self.label


class Redact(ContentPolicy):
    """Rewrites "secret" to "[redacted]" in the content's text; other content passes."""

    def evaluate(self, agent: Agent, mark: Observation, scope: Scope) -> PolicyResult:
        text = mark.content.get("text") if isinstance(mark.content, dict) else None
        if isinstance(text, str) and "secret" in text:
            return PolicyResult(PolicyVerdict.REWRITE,
                                {**mark.content, "text": text.replace("secret", "[redacted]")})
        return PolicyResult(PolicyVerdict.ALLOW)


def text(value: str) -> dict:
    return {"text": value}


def obs(content: Any = "hello", topic: str = "news") -> Observation:
    """An observation whose content is ``{"text": content}``."""
    return Observation(scope="feed", topic=topic, content=text(content), confidence=0.7,
                       source=Source.EXTERNAL_VERIFIED)


def stored(space) -> list:
    return sorted(space.active_marks(), key=lambda m: (m.scope, m.mark_type.value))


def test_p67_reject_stores_nothing(make_space):
    """P67: a REJECT raises ContentPolicyError (a refusal of the guard's hierarchy) and no
    mark is stored, on either backend."""
    space = make_space([Scope(name="feed")])
    guard = Guard(space, content_policies=[Scripted("no", PolicyVerdict.REJECT, [], reason="spam")])
    with pytest.raises(ContentPolicyError, match="spam") as caught:
        guard.write_mark(WRITER, obs())
    assert isinstance(caught.value, WriteRejected | PermissionError)
    assert stored(space) == []


def test_p68_policies_run_in_order_rewrites_feed_forward_and_reject_stops(make_space):
    """P68: policies run in declaration order; policy N+1 sees policy N's rewrite; the first
    REJECT ends the pipeline (later policies are not evaluated)."""
    space = make_space([Scope(name="feed")])
    log: list = []
    guard = Guard(space, content_policies=[
        Scripted("first", PolicyVerdict.REWRITE, log, content=text("one")),
        Scripted("second", PolicyVerdict.REWRITE, log, content=text("two")),
        Scripted("third", PolicyVerdict.ALLOW, log),
    ])
    mark_id = guard.write_mark(WRITER, obs("zero"))
    assert [(label, mark.content["text"]) for label, mark, _ in log] == [
        ("first", "zero"), ("second", "one"), ("third", "two")]
    assert space.get(mark_id).content == text("two")

    log.clear()
    stopping = Guard(space, content_policies=[
        Scripted("a", PolicyVerdict.ALLOW, log),
        Scripted("b", PolicyVerdict.REJECT, log),
        Scripted("c", PolicyVerdict.ALLOW, log),
    ])
    with pytest.raises(ContentPolicyError):
        stopping.write_mark(WRITER, obs("x"))
    assert [label for label, _, _ in log] == ["a", "b"]
    assert [m.id for m in stored(space)] == [mark_id]


def test_p69_only_observations_and_only_their_content(make_space):
    """P69: policies see Observations only (warnings and needs through write_mark, intents
    and actions through execute are not evaluated); a REWRITE changes the content and
    nothing else (scope, type, topic, confidence, source, writer)."""
    space = make_space([Scope(name="feed")])
    log: list = []
    guard = Guard(space, content_policies=[Redact(), Scripted("seen", PolicyVerdict.ALLOW, log)])
    guard.write_mark(WRITER, Warning(scope="feed", topic="t", reason="a secret reason"))
    guard.write_mark(WRITER, Need(scope="feed", question="secret?"))
    decision, _ = guard.execute(WRITER, "feed", "r", "do", "done", lambda: {"secret": 1})
    assert decision.verdict is GuardVerdict.ALLOW
    assert log == []
    original = obs("my secret plan")
    mark = space.get(guard.write_mark(WRITER, original))
    assert [label for label, _, _ in log] == ["seen"]
    assert mark.content == text("my [redacted] plan")
    assert (mark.scope, mark.mark_type, mark.topic, mark.confidence, mark.source,
            mark.agent_id) == ("feed", MarkType.OBSERVATION, "news", 0.7,
                               Source.EXTERNAL_VERIFIED, WRITER.id)
    warning = next(m for m in space.active_marks() if isinstance(m, Warning))
    assert warning.reason == "a secret reason"


def test_p70_reject_and_flag_leave_envelope_and_barrier_alone(make_space):
    """P70: a REJECT neither narrows the barrier nor reaches the envelope; a FLAG is one
    write for the envelope (`record`, as the package's post-write hook), never a
    record_attempt (the spec's words: "A FLAG does not feed into record_attempt()")."""
    space = make_space([Scope(name="feed")])
    seen: list = []

    class Counting(StatisticalEnvelope):
        """The envelope, noting every write and attempt the guard reports."""

        def record(self, agent_id, mark, **kwargs):
            seen.append(("record", mark.mark_type))
            return super().record(agent_id, mark, **kwargs)

        def record_attempt(self, agent_id, *args, **kwargs):
            seen.append(("record_attempt", next(a for a in args if isinstance(a, MarkType))))
            return super().record_attempt(agent_id, *args, **kwargs)

    envelope = Counting()
    reject = Guard(space, envelope=envelope,
                   content_policies=[Scripted("no", PolicyVerdict.REJECT, [])])
    for _ in range(3):
        with pytest.raises(ContentPolicyError):
            reject.write_mark(WRITER, obs())
    assert seen == [] and reject.get_barrier(WRITER.id) is None
    flag = Guard(space, envelope=envelope,
                 content_policies=[Scripted("hm", PolicyVerdict.FLAG, [], reason="odd")])
    flag.write_mark(WRITER, obs())
    assert seen == [("record", MarkType.OBSERVATION)]
    assert flag.get_barrier(WRITER.id) is None


def test_flags_accumulate_into_one_system_warning_stored_with_the_mark(make_space):
    """§9.13 FLAG: the observation is stored and one Warning in `_system` carries every
    flag's reason; ALLOW passes the mark unchanged."""
    space = make_space([Scope(name="feed")])
    guard = Guard(space, content_policies=[
        Scripted("one", PolicyVerdict.FLAG, [], reason="too loud"),
        Scripted("two", PolicyVerdict.ALLOW, []),
        Scripted("three", PolicyVerdict.FLAG, [], reason="off topic"),
    ])
    mark_id = guard.write_mark(WRITER, obs("hey"))
    assert space.get(mark_id).content == text("hey")
    warnings = [m for m in space.active_marks(scope=SYSTEM_SCOPE) if isinstance(m, Warning)]
    assert len(warnings) == 1
    assert warnings[0].topic == FLAG_TOPIC and str(mark_id) in warnings[0].reason
    assert "too loud" in warnings[0].reason and "off topic" in warnings[0].reason


def test_a_flag_whose_warning_is_refused_stores_neither(make_space):
    """§9.13 FLAG, both or neither: when `_system` refuses the flag warning (a topic list
    without it), the observation is not stored either."""
    strict = Scope(name=SYSTEM_SCOPE, warning_topics=("other",))
    space = make_space([Scope(name="feed"), strict])
    guard = Guard(space, content_policies=[Scripted("f", PolicyVerdict.FLAG, [], reason="r")])
    with pytest.raises(InvalidMark):
        guard.write_mark(WRITER, obs())
    assert stored(space) == []


@pytest.mark.parametrize("make_space", ["postgres"], indirect=True)
def test_a_flag_whose_warning_fails_in_postgres_rolls_back_the_mark(make_space):
    """§9.13 FLAG, both or neither, on Postgres: the warning's INSERT fails in the database
    (a trigger refuses it) after the observation's succeeded; the transaction rolls back and
    the observation is gone too."""
    space = make_space([Scope(name="feed")])
    trigger = f"refuse_flags_{space.space}"
    with psycopg2.connect(make_space.dsn) as conn, conn.cursor() as cur:
        cur.execute(f"""
            CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'no flags here'; END $$;
            CREATE TRIGGER {trigger} BEFORE INSERT ON agentpost.marks FOR EACH ROW
              WHEN (NEW.space = '{space.space}' AND NEW.topic = '{FLAG_TOPIC}')
              EXECUTE FUNCTION {trigger}();""")
    try:
        guard = Guard(space, content_policies=[Scripted("f", PolicyVerdict.FLAG, [])])
        with pytest.raises(Exception, match=r"rolled back|no flags here"):
            guard.write_mark(WRITER, obs())
        assert stored(space) == []
        plain = Guard(space)
        assert space.get(plain.write_mark(WRITER, obs())) is not None  # the space still works
    finally:
        with psycopg2.connect(make_space.dsn) as conn, conn.cursor() as cur:
            cur.execute(f"DROP TRIGGER {trigger} ON agentpost.marks; DROP FUNCTION {trigger}()")


def test_rewrite_to_invalid_content_and_bad_policies_store_nothing(make_space):
    """Bad input: a REWRITE to content a mark cannot hold raises InvalidMark, a policy that
    does not return a PolicyResult raises a MarkspaceError; nothing is stored."""
    space = make_space([Scope(name="feed")])

    class Broken(ContentPolicy):
        def evaluate(self, agent, mark, scope):
            return "allow"

    for policy, error in ((Scripted("bad", PolicyVerdict.REWRITE, [], content={"x": {1, 2}}),
                           InvalidMark), (Broken(), ValueError)):
        with pytest.raises(error):
            Guard(space, content_policies=[policy]).write_mark(WRITER, obs())
    with pytest.raises(ValueError):
        Guard(space, content_policies=[object()])
    assert stored(space) == []
