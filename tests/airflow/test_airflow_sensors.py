"""The sensors and triggers beyond the plain inbox count: inbox filters, replies, Markspace
needs and deferred verdicts, the settle hold, and InboxEventTrigger's claims (each arrival
reported once, across trigger instances). Triggers run under asyncio against the real
database, as in test_airflow_inbox.py, whose helpers this module uses.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import pytest
from airflow.sdk._shared.listeners import hookimpl
from airflow.sdk.exceptions import AirflowException
from airflow.sdk.listener import get_listener_manager
from airflow.sdk.module_loading import import_string
from airflow.triggers.base import TaskSuccessEvent

import test_airflow_inbox  # noqa: F401  (sets up a private AIRFLOW_HOME before Airflow loads)
from agentpost.marks import Action, Agent, ConflictPolicy, DecayConfig, Guard, Need, Scope, hours
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.operators import InboxSensor, NeedResolvedSensor, ReplySensor, VerdictSensor
from agentpost.operators.sensors import default_deferrable
from agentpost.protocol.errors import InvalidInput
from agentpost.store import EnvelopeStore
from agentpost.triggers import (
    InboxEventTrigger,
    InboxTrigger,
    NeedResolvedTrigger,
    ReplyTrigger,
    VerdictTrigger,
)
from test_airflow_inbox import (
    CONN_VAR,
    POLL,
    WAKE_BOUND,
    connection_json,
    first_event,
    in_background,
    run_trigger,
    wait_for_listener,
)
from test_leases import BOSS, send, topology

PARKING = Scope(name="parking", conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
                deferred=True, decay=DecayConfig(intent_ttl=hours(2)))
DRIVERS = [Agent(name=f"driver-{k}", scopes={"parking": ["intent", "action"]})
           for k in range(2)]
CAL = Scope(name="cal")
ASKER = Agent(name="asker", scopes={"cal": ["need", "action"]})


@pytest.fixture
def inboxes(store: EnvelopeStore) -> EnvelopeStore:
    topology(store, ["w1", "w2"])
    return store


def later(fn: Any, dsn: str, delay: float = 0.5) -> Any:
    """`fn` run once a trigger listens, `delay` seconds later."""

    def go() -> Any:
        wait_for_listener(dsn)
        time.sleep(delay)
        return fn()

    return go


# -- inbox filters ---------------------------------------------------------------------------


def test_inbox_trigger_counts_only_matching_envelopes(inboxes: EnvelopeStore,
                                                      dsn: str) -> None:
    """InboxSensor's matching: with a filter only matching leasable envelopes count, and
    the event names them; a match delivered later wakes the trigger on NOTIFY."""
    first = send(inboxes, "w1", "plain")
    answer = inboxes.send(BOSS, "w1", "directive", "re", in_reply_to=first).envelope_id
    payload, _ = run_trigger(InboxTrigger(workspace_id="w1", in_reply_to=first, dsn=dsn))
    assert payload == {"status": "ready", "workspace_id": "w1", "available": 1,
                       "envelope_ids": [answer]}
    trigger = InboxTrigger(workspace_id="w1", priority="urgent", sender=BOSS,
                           poll_interval=POLL, dsn=dsn)
    with in_background(later(lambda: send(inboxes, "w1", "now", priority="urgent"),
                             dsn)) as sent:
        payload, took = run_trigger(trigger, sent)
        urgent = sent.result(timeout=10)
    assert payload["envelope_ids"] == [urgent] and payload["available"] == 1
    assert took < WAKE_BOUND
    with pytest.raises(InvalidInput):
        InboxTrigger(workspace_id="w1", priority="soon")


# -- replies ---------------------------------------------------------------------------------


def test_reply_trigger_fires_on_the_answer_in_the_senders_inbox(inboxes: EnvelopeStore,
                                                               dsn: str) -> None:
    """ReplySensor: the answer is an envelope whose in_reply_to is the original, delivered
    to the original's sender; an unrelated envelope there does not count; the delivery's
    NOTIFY wakes the trigger."""
    asked = inboxes.send("w1", BOSS, "query", "question?")
    assert asked.accepted, asked
    inboxes.send("w2", BOSS, "query", "unrelated")

    def answer() -> str:
        return inboxes.send(BOSS, "w1", "feedback", "answer",
                            in_reply_to=asked.envelope_id).envelope_id

    trigger = ReplyTrigger(envelope_id=asked.envelope_id, sender="w1", poll_interval=POLL,
                           dsn=dsn)
    with in_background(later(answer, dsn)) as sent:
        payload, took = run_trigger(trigger, sent)
        reply_id = sent.result(timeout=10)
    assert payload["status"] == "replied" and took < WAKE_BOUND
    assert payload["reply"]["id"] == reply_id
    assert payload["reply"]["in_reply_to"] == asked.envelope_id
    again, _ = run_trigger(trigger)  # run twice (a triggerer restart): the same answer
    assert again == payload
    unknown, _ = run_trigger(ReplyTrigger(envelope_id="no-such-envelope", dsn=dsn))
    assert unknown["status"] == "error" and unknown["message"].startswith("NotFound: ")


# -- needs -----------------------------------------------------------------------------------


def test_need_trigger_wakes_on_the_resolution(store: EnvelopeStore, dsn: str) -> None:
    """NeedResolvedSensor: resolving a need NOTIFYs agentpost_need (0040), so the trigger
    fires at once, with the resolving copy and action; a mark that is not a need, or no
    mark, is an error event."""
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], space="team") as space:
        need = space.write(ASKER, Need(scope="cal", question="which room?"))
        action = space.write(ASKER, Action(scope="cal", action="answered"))
        trigger = NeedResolvedTrigger(need_id=need, space="team", poll_interval=POLL, dsn=dsn)
        with in_background(later(lambda: space.resolve(need, action), dsn)) as done:
            payload, took = run_trigger(trigger, done)
            copy = done.result(timeout=10)
    assert payload == {"status": "resolved", "need_id": str(need), "space": "team",
                       "resolution_id": str(copy), "resolved_by": str(action)}
    assert took < WAKE_BOUND
    elsewhere, _ = run_trigger(NeedResolvedTrigger(need_id=need, space="other", dsn=dsn))
    assert elsewhere["status"] == "error" and "NotFound" in elsewhere["message"]


# -- verdicts --------------------------------------------------------------------------------


def test_verdict_trigger_reports_allow_and_blocked_with_the_winner(store: EnvelopeStore,
                                                                   dsn: str) -> None:
    """VerdictSensor: agents' intents on a deferred scope wait for a boundary; its verdicts
    (kept by the space, NOTIFYed by 0040) end the wait: ALLOW for the winner, BLOCKED with
    the winning intent for the loser."""
    with PostgresMarkSpace(dsn=dsn, scopes=[PARKING], space="lot") as space:
        guard = Guard(space)
        low, high = DRIVERS
        guard.pre_action(low, "parking", "spot-1", "park", 0.2)
        guard.pre_action(high, "parking", "spot-1", "park", 0.9)
        loser = VerdictTrigger(scope="parking", resource="spot-1", agent_id=low.id,
                               space="lot", poll_interval=POLL, dsn=dsn)
        with in_background(later(lambda: guard.resolve_deferred("parking", "spot-1"),
                                 dsn)) as boundary:
            blocked, took = run_trigger(loser, boundary)
            boundary.result(timeout=10)
        allowed, _ = run_trigger(VerdictTrigger(scope="parking", resource="spot-1",
                                                agent_id=high.id, space="lot", dsn=dsn))
    assert took < WAKE_BOUND
    assert (blocked["status"], blocked["verdict"], blocked["allowed"]) == (
        "decided", "BLOCKED", False)
    assert (allowed["verdict"], allowed["allowed"]) == ("ALLOW", True)
    assert blocked["winner_id"] == allowed["winner_id"] == allowed["intent_id"]


# -- the settle hold and serialization ---------------------------------------------------------


def test_an_early_event_is_held_until_not_before(inboxes: EnvelopeStore, dsn: str) -> None:
    """The deferral race's mitigation: a trigger whose condition holds at once still does
    not fire before `not_before` (the sensor sets it to the deferral time + settle)."""
    send(inboxes, "w1", "already here")
    payload, took = run_trigger(InboxTrigger(workspace_id="w1", dsn=dsn,
                                             not_before=time.time() + 2.0))
    assert payload["status"] == "ready" and took >= 1.8


def test_an_ending_trigger_ends_the_task_at_once_with_the_sensors_result(
        inboxes: EnvelopeStore, dsn: str) -> None:
    """end_from_trigger: the trigger yields Airflow's TaskSuccessEvent, whose XCom
    ``return_value`` is what the sensor would have returned, and is not held by
    `not_before` (a task going straight from deferred to success meets no race)."""
    send(inboxes, "w1", "already here")
    event, took = first_event(InboxTrigger(workspace_id="w1", dsn=dsn, end_task=True,
                                           not_before=time.time() + 30.0))
    assert isinstance(event, TaskSuccessEvent) and took < 10.0
    assert event.xcoms == {"return_value": {"status": "ready", "workspace_id": "w1",
                                            "available": 1}}
    asked = inboxes.send("w1", BOSS, "query", "question?").envelope_id
    answer = inboxes.send(BOSS, "w1", "feedback", "the answer", in_reply_to=asked)
    event, _ = first_event(ReplyTrigger(envelope_id=asked, sender="w1", dsn=dsn,
                                        end_task=True, result_key="reply"))
    reply = event.xcoms["return_value"]
    assert isinstance(event, TaskSuccessEvent) and reply["id"] == answer.envelope_id
    assert reply["in_reply_to"] == asked and reply["payload"]["content"] == "the answer"


def test_an_ending_trigger_still_resumes_the_task_on_an_error(dsn: str) -> None:
    """An error is not a success: the event resumes the task on a worker, where it fails
    with the reason (and is held like any resuming event)."""
    event, took = first_event(InboxTrigger(workspace_id="nobody", dsn=dsn, end_task=True,
                                           not_before=time.time() + 1.5))
    assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "error"
    assert took >= 1.3


def test_sensors_end_from_the_triggerer_unless_airflow_has_listeners() -> None:
    """On by default; off when Airflow has listeners (Airflow refuses to load a DAG whose
    tasks end from the triggerer then); an explicit argument wins; bad values refused."""
    assert InboxSensor(task_id="a", workspace_id="w1").end_from_trigger
    manager = get_listener_manager()

    class Listener:
        @hookimpl  # type: ignore[misc]
        def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
            pass

    manager.add_listener(Listener())
    try:
        assert manager.has_listeners
        assert not ReplySensor(task_id="b", envelope_id="e").end_from_trigger
        assert VerdictSensor(task_id="c", scope="s", resource="r", agent_id="a",
                             end_from_trigger=True).end_from_trigger
    finally:
        manager.clear()
    with pytest.raises(ValueError, match="end_from_trigger"):
        InboxSensor(task_id="d", workspace_id="w1", end_from_trigger="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("trigger", [
    InboxTrigger(workspace_id="w1", type="directive", priority="urgent", not_before=5.0),
    InboxTrigger(workspace_id="w1", end_task=True),
    ReplyTrigger(envelope_id="e1", sender="w1", end_task=True, result_key="reply"),
    ReplyTrigger(envelope_id="e1", type="feedback", sender="w1", conn_id="ap"),
    NeedResolvedTrigger(need_id=UUID(int=1), space="s"),
    VerdictTrigger(scope="parking", resource="r", agent_id=UUID(int=2),
                   intent_id=UUID(int=3)),
    InboxEventTrigger("w1", agentpost_conn_id="ap", watcher="dag:x"),
], ids=lambda t: type(t).__name__)
def test_triggers_round_trip_through_their_classpath(trigger: Any) -> None:
    """Airflow stores classpath and kwargs and rebuilds the trigger in the triggerer."""
    classpath, kwargs = trigger.serialize()
    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)
    assert "dsn" in kwargs and kwargs["dsn"] is None  # the connection id travels, not a DSN


# -- event triggers: one report per arrival --------------------------------------------------


async def take(trigger: InboxEventTrigger, n: int, within: float = 30.0) -> list[str]:
    """The envelope ids of the first `n` events, then the trigger is cancelled (a triggerer
    stopping)."""
    events = trigger.run()
    got: list[str] = []
    try:
        while len(got) < n:
            event = await asyncio.wait_for(anext(events), within)
            got.append(event.payload["envelope_id"])
    finally:
        await events.aclose()
    return got


async def nothing_more(trigger: InboxEventTrigger, wait: float = 1.5) -> bool:
    try:
        await take(trigger, 1, within=wait)
    except TimeoutError:
        return True
    return False


def test_event_trigger_reports_each_arrival_once_across_instances(
        inboxes: EnvelopeStore, dsn: str) -> None:
    """InboxEventTrigger claims what it reports: two instances of one watcher (a restart,
    or two triggerers) never report an arrival twice, and one that stops leaves the rest
    to the other; envelopes in the inbox before the watcher's first claim are not arrivals;
    another watcher sees every arrival too."""
    send(inboxes, "w1", "before the watcher")

    def watcher(name: str = "dag:a") -> InboxEventTrigger:
        return InboxEventTrigger("w1", watcher=name, poll_interval=0.5, min_interval=0.05,
                                 dsn=dsn)

    assert asyncio.run(nothing_more(watcher()))  # first claim: starts watching
    assert asyncio.run(nothing_more(watcher("dag:b")))
    sent = [send(inboxes, "w1", f"m{i}") for i in range(6)]
    first = asyncio.run(take(watcher(), 2))

    async def two_at_once() -> list[str]:
        a, b = watcher(), watcher()
        done = await asyncio.gather(take(a, 2), take(b, 2))
        return done[0] + done[1]

    rest = asyncio.run(two_at_once())
    assert sorted(first + rest) == sorted(sent) and len(set(first + rest)) == 6
    assert first == sent[:2], "arrivals are reported in arrival order"
    assert asyncio.run(nothing_more(watcher())), "a claimed arrival was reported again"
    late = send(inboxes, "w1", "while nobody watched")
    assert asyncio.run(take(watcher(), 1)) == [late]
    assert asyncio.run(take(watcher("dag:b"), 7)) == [*sent, late]


# -- the sensors outside a DAG run -----------------------------------------------------------


def test_sensors_check_through_the_connection_and_fail_in_one_line(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Poke mode runs the trigger's own check from the worker; execute_complete turns an
    error event into one clear line; results are what the docs promise."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    asked = inboxes.send("w1", BOSS, "query", "question?").envelope_id
    reply = ReplySensor(task_id="reply", envelope_id=asked)
    assert not reply.poke({})
    answer = inboxes.send(BOSS, "w1", "feedback", "yes", in_reply_to=asked).envelope_id
    assert reply.poke({}).xcom_value["id"] == answer
    matching = InboxSensor(task_id="m", workspace_id="w1", in_reply_to=asked)
    assert matching.poke({}).xcom_value["envelope_ids"] == [answer]
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], space="team") as space:
        need = space.write(ASKER, Need(scope="cal", question="q"))
        sensor = NeedResolvedSensor(task_id="need", need_id=need, space="team")
        assert not sensor.poke({})
        answer = space.write(ASKER, Action(scope="cal", action="answered"))
        space.resolve(need, answer)  # by a stored action, as the package requires
        assert sensor.poke({}).xcom_value["resolved_by"] == str(answer)
    verdict = VerdictSensor(task_id="v", scope="parking", resource="r", agent_id=UUID(int=4))
    with pytest.raises(AirflowException, match=r"cannot watch the verdict for .*: NotFound"):
        verdict.execute_complete({}, {"status": "error", "agent_id": "a", "scope": "parking",
                                      "resource": "r", "message": "NotFound: x"})


def test_sensors_defer_by_default_unless_the_environment_says_no(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deferrable by default; [operators] default_deferrable set in the environment is
    obeyed; an explicit argument wins."""
    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    assert default_deferrable() and InboxSensor(task_id="a", workspace_id="w1").deferrable
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "false")
    assert not InboxSensor(task_id="b", workspace_id="w1").deferrable
    assert ReplySensor(task_id="c", envelope_id="e", deferrable=True).deferrable
    with pytest.raises(ValueError):
        InboxSensor(task_id="d", workspace_id="w1", settle=-1)
