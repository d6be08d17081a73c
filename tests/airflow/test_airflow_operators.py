"""The envelope, lease, mark and saga operators called directly (``execute`` with a stand-in
task instance), against a real Postgres store per test: fast checks of what a try does, what
a retry (a second try of the same task instance) does, and how bad input fails. The same
operators run inside real Airflow in tests/airflow/test_airflow_examples.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from agentpost.marks import Agent, PostgresMarkSpace, Scope
from agentpost.operators import (
    AckOperator,
    DirectiveOperator,
    GuardedActionOperator,
    LeaseOperator,
    NackOperator,
    QueryOperator,
    SagaStepOperator,
    SendEnvelopeOperator,
    WriteMarkOperator,
)
from agentpost.operators.common import client_id
from agentpost.operators.envelopes import EnvelopeRejected
from agentpost.operators.marks import GuardRefused, stable_agent
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.validation import CLIENT_ID
from agentpost.store import EnvelopeStore
from test_airflow_inbox import CONN_VAR, connection_json
from test_leases import BOSS, fill, topology

ROOT = Path(__file__).resolve().parents[2]


class StandInTI:
    """What the operators read of a task instance; the store behind them is real."""

    def __init__(self, try_number: int = 1, *, task_id: str = "t", map_index: int = -1,
                 run_id: str = "manual__2026-01-01T00:00:00+00:00") -> None:
        self.dag_id, self.task_id, self.run_id = "d", task_id, run_id
        self.map_index, self.try_number = map_index, try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context(ti: StandInTI) -> dict[str, Any]:
    return {"ti": ti}


def run(op: Any, try_number: int = 1, map_index: int = -1) -> Any:
    """One try of `op`'s task instance in run `manual__...`; its return value."""
    return op.execute(context(StandInTI(try_number, task_id=op.task_id,
                                        map_index=map_index)))


@pytest.fixture
def office(store: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> EnvelopeStore:
    """boss -> w1, w2 (directive, feedback; query back), reached through the connection."""
    topology(store, ["w1", "w2"])
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    return store


# -- envelopes ----------------------------------------------------------------------------------


def test_derived_ids_are_valid_stable_and_distinct() -> None:
    """Courier §6.4 ids are 1-128 of [A-Za-z0-9._:-]: a run id with '+' or a long dag id is
    hashed into one; the same parts always give the same id, different parts different."""
    plain = client_id("d", "t", "scheduled_1")
    assert plain == "af:d:t:scheduled_1"
    odd = client_id("d", "t", "manual__2026-01-01T00:00:00+00:00")
    long = client_id("d" * 300, "t", "r")
    for made in (odd, long):
        assert CLIENT_ID.fullmatch(made) and len(made) <= 128
    assert client_id("d", "t", "manual__2026-01-01T00:00:00+00:00") == odd
    assert client_id("d", "t", "manual__2026-01-01T00:00:00-00:00") != odd
    assert client_id("d" * 300, "t", "r", "1") != long


def test_a_retried_send_sends_once(office: EnvelopeStore) -> None:
    """Issue: "a task retry never sends twice": two tries of one task instance return the
    same envelope id, and w1's inbox holds one envelope; the second try says duplicate."""
    op = DirectiveOperator(task_id="t", sender=BOSS, to="w1", content="plan the trip",
                           priority="urgent", tags=["trip"], headers={"ticket": "T-1"})
    first, second = StandInTI(1), StandInTI(2)
    sent = op.execute(context(first))
    assert op.execute(context(second)) == sent
    assert [e.id for e in office.inbox("w1")] == [sent]
    envelope = office.get(sent)
    assert (envelope.type, envelope.priority.value, list(envelope.tags)) == \
        ("directive", "urgent", ["trip"])
    assert first.xcoms["send_result"]["duplicate"] is False
    assert second.xcoms["send_result"]["duplicate"] is True
    # another map index is another task instance: another envelope
    op.execute(context(StandInTI(1, map_index=0)))
    assert len(office.inbox("w1")) == 2


def test_a_rejection_fails_with_the_wacp_reason(office: EnvelopeStore) -> None:
    """A send the matrix refuses (a worker cannot direct its coordinator) fails the task
    without retries, naming the reason; an unknown type is a rejection too; an unknown sender
    is a one-line failure, not a traceback of SQL."""
    with pytest.raises(EnvelopeRejected, match="was rejected: ") as refused:
        DirectiveOperator(task_id="up", sender="w1", to=BOSS, content="x").execute(
            context(StandInTI(task_id="up")))
    assert isinstance(refused.value, AirflowFailException)
    reason = refused.value.args[0].split("was rejected: ")[1]
    assert reason and "\n" not in reason
    with pytest.raises(EnvelopeRejected, match="was rejected: invalid_type"):
        SendEnvelopeOperator(task_id="t2", sender=BOSS, to="w1", type="no.such.type",
                             content="x").execute(context(StandInTI(task_id="t2")))
    with pytest.raises(AirflowFailException, match=r"^t3: NotFound: "):
        run(QueryOperator(task_id="t3", sender="ghost", to=BOSS, content="?"))
    assert office.inbox("w1") == [] and office.inbox(BOSS) == []


def test_bad_arguments_fail_at_parse_time() -> None:
    """What can be known when the DAG is parsed is refused then, with a clear message."""
    with pytest.raises(InvalidInput, match="bad envelope type"):
        SendEnvelopeOperator(task_id="a", sender="s", to="t", type="", content="x")
    with pytest.raises(InvalidInput, match="priority must be one of"):
        DirectiveOperator(task_id="b", sender="s", to="t", content="x", priority="high")
    with pytest.raises(InvalidInput, match="sends 'directive' envelopes"):
        DirectiveOperator(task_id="c", sender="s", to="t", content="x", type="query")
    with pytest.raises(InvalidInput):
        LeaseOperator(task_id="d", workspace_id="w1", max=0)
    with pytest.raises(InvalidInput):
        NackOperator(task_id="e", lease="tok", delay=-1)


# -- leases -------------------------------------------------------------------------------------


def test_lease_ack_and_nack_one_each(office: EnvelopeStore) -> None:
    """LeaseOperator's output is one JSON object per lease (what `.expand` maps over); an
    AckOperator consumes its envelope, a NackOperator gives its back; a retry of either
    after the first try settled it succeeds without error."""
    ids = fill(office, "w1", 3)
    leases = LeaseOperator(task_id="lease", workspace_id="agents/w1/inbox", max=2,
                           ttl=60).execute(context(StandInTI()))
    assert [x["envelope_id"] for x in leases] == ids[:2]
    assert leases[0]["envelope"]["payload"] == "m0" and leases[0]["attempt"] == 1
    ack = AckOperator(task_id="ack", lease=leases[0])
    nack = NackOperator(task_id="nack", lease=leases[1]["token"], delay=0)
    assert ack.execute(context(StandInTI(1))) == ids[0]
    assert nack.execute(context(StandInTI(1))) == ids[1]
    assert ack.execute(context(StandInTI(2))) == ids[0]  # retries: already settled
    assert nack.execute(context(StandInTI(2))) == ids[1]
    assert office.get(ids[0]).consumed_at is not None
    assert [e.id for e in office.inbox("w1")] == [ids[2], ids[1]]
    assert LeaseOperator(task_id="again", workspace_id="w2").execute(
        context(StandInTI())) == []
    with pytest.raises(AirflowFailException, match="InvalidInput: malformed lease token"):
        AckOperator(task_id="bad", lease={"token": "nope"}).execute(context(StandInTI()))


def test_an_expired_lease_fails_the_ack(office: EnvelopeStore) -> None:
    """An ack after the lease ran out and the envelope was leased again is not "settled":
    it fails (a Conflict: no retry), and the envelope stays with its new holder."""
    (only,) = fill(office, "w1", 1)
    (lease,) = LeaseOperator(task_id="lease", workspace_id="w1", ttl=0.2).execute(
        context(StandInTI()))
    import time

    time.sleep(0.4)
    (again,) = office.lease("w1", ttl=60)
    assert again.envelope.id == only
    with pytest.raises(AirflowException, match="LeaseLost"):
        AckOperator(task_id="ack", lease=lease).execute(context(StandInTI()))
    assert office.get(only).consumed_at is None


# -- marks --------------------------------------------------------------------------------------

CALENDAR = [Scope(name="calendar", allowed_intent_verbs=("book",),
                  allowed_action_verbs=("booked",))]


def test_write_mark_through_the_guard_and_the_space(office: EnvelopeStore, dsn: str) -> None:
    """An observation goes through the guard's write_mark into the named space; a need
    straight into the space; the marks read back from a PostgresMarkSpace of that name.
    Intents through the guard are refused at parse time (they need pre_action)."""
    observed = run(WriteMarkOperator(
        task_id="observe", agent="weather-bot", scopes=lambda: CALENDAR, space="trips",
        mark_type="observation", scope="calendar",
        fields={"topic": "weather", "content": {"sky": "clear"}}))
    needed = run(WriteMarkOperator(
        task_id="need", agent="planner", scopes=CALENDAR, space="trips", mark_type="need",
        scope="calendar", fields={"question": "which hotel?", "blocking": True}, via="space"))
    with PostgresMarkSpace(dsn=dsn, scopes=CALENDAR, space="trips") as marks:
        observation = marks.get(UUID(observed))
        need = marks.get(UUID(needed))
        assert marks.get(UUID(observed)) is not None
    assert observation.content == {"sky": "clear"}
    assert observation.agent_id == stable_agent("weather-bot", {}).id
    assert (need.question, need.blocking) == ("which hotel?", True)
    with PostgresMarkSpace(dsn=dsn, scopes=CALENDAR, space="other") as marks:
        assert marks.get(UUID(observed)) is None  # another space
    with pytest.raises(InvalidInput, match="GuardedActionOperator"):
        WriteMarkOperator(task_id="i", agent="a", scopes=CALENDAR, mark_type="intent",
                          scope="calendar", fields={"resource": "r", "action": "book"})
    with pytest.raises(AirflowFailException, match=r"^bad: UnknownScope"):
        run(WriteMarkOperator(task_id="bad", agent="a", scopes=CALENDAR,
                              mark_type="observation", scope="nowhere",
                              fields={"topic": "t"}))


def test_guarded_action_runs_only_on_allow(office: EnvelopeStore) -> None:
    """Markspace §9.2 / P37 in a task: the first agent's callable runs and its result is the
    XCom; a second agent on the same room is refused: skipped by default, failed with
    on_refused="fail", the verdict's reason in the message, the callable never called; an
    agent without permission is DENIED."""
    calls: list[str] = []

    def book(who: str) -> dict[str, str]:
        calls.append(who)
        return {"room": "101", "by": who}

    def guarded(task_id: str, agent: Any, **extra: Any) -> GuardedActionOperator:
        return GuardedActionOperator(task_id=task_id, agent=agent, scopes=CALENDAR,
                                     space="trips", scope="calendar", resource="room-101",
                                     intent_action="book", result_action="booked",
                                     python_callable=book, op_args=[task_id], **extra)

    ti = StandInTI(task_id="alice")
    assert guarded("alice", "alice").execute(context(ti)) == {"room": "101", "by": "alice"}
    assert ti.xcoms["decision"]["verdict"] == "allow"
    with pytest.raises(AirflowSkipException, match=r"^bob: guard verdict ") as skipped:
        run(guarded("bob", "bob"))
    assert "the callable did not run" in str(skipped.value)
    with pytest.raises(GuardRefused, match=r"^carol: guard verdict (CONFLICT|BLOCKED)"):
        run(guarded("carol", "carol", on_refused="fail"))
    with pytest.raises(GuardRefused, match=r"guard verdict DENIED \(authorization\)"):
        run(guarded("mallory", Agent(name="mallory"), on_refused="fail"))
    assert calls == ["alice"]
    with pytest.raises(InvalidInput, match="on_refused"):
        guarded("x", "x", on_refused="ignore")


def test_a_refusal_names_the_agent_holding_the_resource(office: EnvelopeStore) -> None:
    """The guard's reasons name agents by id ("already claimed by agent <id>'s action");
    the task's message says the name too when the store can tell it (an agent named after
    a workspace: agentpost.web.names), and keeps the id."""
    office.create_workspace("worker", parent=BOSS, workspace_id="dora")

    def guarded(task_id: str) -> GuardedActionOperator:
        return GuardedActionOperator(task_id=task_id, agent=task_id, scopes=CALENDAR,
                                     space="names", scope="calendar", resource="room-7",
                                     intent_action="book", result_action="booked",
                                     python_callable=lambda: {"room": "7"})

    assert run(guarded("dora")) == {"room": "7"}
    dora = str(stable_agent("dora", {}).id)
    with pytest.raises(AirflowSkipException) as skipped:
        run(guarded("eve"))
    message = str(skipped.value)
    assert f"already claimed by agent 'dora' ({dora})'s action 'booked'" in message, message
    assert f"held by agent 'dora' ({dora})" in message


def test_a_refusal_names_an_agent_by_its_recorded_name(office: EnvelopeStore) -> None:
    """An agent whose name is no workspace id and whose id is random is named in a refusal
    too: its write recorded the name (sql/0076)."""
    porter = Agent(name="night-porter", scopes={"calendar": ["intent", "action"]})

    def guarded(task_id: str, agent: Any) -> GuardedActionOperator:
        return GuardedActionOperator(task_id=task_id, agent=agent, scopes=CALENDAR,
                                     space="names", scope="calendar", resource="room-9",
                                     intent_action="book", result_action="booked",
                                     python_callable=lambda: {"room": "9"})

    assert run(guarded("porter", porter)) == {"room": "9"}
    with pytest.raises(AirflowSkipException) as skipped:
        run(guarded("eve", "eve"))
    message = str(skipped.value)
    assert f"already claimed by agent 'night-porter' ({porter.id})'s action" in message, message


def test_a_retried_mark_write_writes_nothing_new(office: EnvelopeStore, dsn: str) -> None:
    """At most one mark per task instance: try 2 of the same instance returns try 1's mark
    id and writes nothing, through the guard and straight into the space; another mapped
    instance writes its own mark."""
    for via in ("guard", "space"):
        op = WriteMarkOperator(task_id=f"observe_{via}", agent="weather-bot", scopes=CALENDAR,
                               space="trips", mark_type="observation", scope="calendar",
                               fields={"topic": "weather", "content": {"sky": "clear"}},
                               via=via)
        first = run(op, 1)
        assert run(op, 2) == first and run(op, 3) == first
        assert run(op, 1, map_index=0) != first
    with PostgresMarkSpace(dsn=dsn, scopes=CALENDAR, space="trips") as marks:
        assert len(marks) == 4


def guarded_booking(fn: Any, task_id: str = "book") -> GuardedActionOperator:
    return GuardedActionOperator(task_id=task_id, agent="alice", scopes=CALENDAR,
                                 space="trips", scope="calendar", resource="room-101",
                                 intent_action="book", result_action="booked",
                                 python_callable=fn, op_args=["alice"])


def test_a_retried_guarded_action_replays_its_result(office: EnvelopeStore) -> None:
    """At most once per task instance: a retry after the callable ran and its action was
    recorded (here: the try failed after the call) returns the recorded result and pushes
    the decision again, without calling the callable."""
    calls: list[str] = []

    def book(who: str) -> dict[str, str]:
        calls.append(who)
        return {"room": "101", "by": who}

    op = guarded_booking(book)
    first, second = StandInTI(1, task_id="book"), StandInTI(2, task_id="book")
    assert op.execute(context(first)) == {"room": "101", "by": "alice"}
    assert op.execute(context(second)) == {"room": "101", "by": "alice"}
    assert calls == ["alice"]
    assert second.xcoms["decision"]["verdict"] == "allow"
    assert second.xcoms["decision"]["intent_id"] == first.xcoms["decision"]["intent_id"]
    assert "replayed" in second.xcoms["decision"]["reason"]


def test_a_try_that_died_mid_call_is_not_called_again(office: EnvelopeStore) -> None:
    """A try whose callable started and recorded no outcome (SystemExit: the worker going
    away mid-call) may have acted: every retry fails without calling it, saying what to
    check and how to release it; a callable that raised an exception is called again."""
    calls: list[int] = []

    def dies(who: str) -> dict[str, str]:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit(1)
        return {"room": "101"}

    op = guarded_booking(dies)
    with pytest.raises(SystemExit):
        run(op, 1)
    for try_number in (2, 3):
        with pytest.raises(AirflowFailException, match=(
                r"^book: an earlier try started the callable at .* recorded no outcome.*"
                r"may or may not have run.*mark this task instance success.*"
                r"agentpost mark-key release 'airflow/d/book/manual__")):
            run(op, try_number)
    assert calls == [1]

    def flaky(who: str) -> dict[str, int]:
        calls.append(2)
        if calls.count(2) == 1:
            raise RuntimeError("calendar API timed out")
        return {"room": 102}

    op = guarded_booking(flaky, task_id="flaky")
    op.resource = "room-102"
    with pytest.raises(RuntimeError, match="timed out"):
        run(op, 1)
    assert run(op, 2) == {"room": 102} and run(op, 3) == {"room": 102}
    assert calls == [1, 2, 2]


def test_unknown_workspace_fails_with_the_stores_reason(office: EnvelopeStore) -> None:
    """An unknown workspace is the store's one-line NotFound, not a SQL traceback."""
    with pytest.raises(AirflowFailException, match=r"^lease: NotFound: .*ghost"):
        run(LeaseOperator(task_id="lease", workspace_id="ghost"))


# -- saga steps ---------------------------------------------------------------------------------


def test_a_retried_saga_step_replays_its_command(office: EnvelopeStore) -> None:
    """A saga step's task retried after its command executed replays the outcome: the
    handler runs once; the second step takes position 2 in its own process (`after`)."""
    calls: list[str] = []

    def book(args: dict) -> dict:
        calls.append(args["item"])
        return {"booked": args["item"]}

    office.register_type("trip.book", ["coordinator"], ["coordinator"])
    shared = {"workspace": BOSS, "handlers": {"book": book}, "saga_key": "trip-1",
              "auto_confirm": "policy:test", "action": "trip.book", "handler": "book"}
    first = SagaStepOperator(task_id="flight", step="flight", args={"item": "flight"},
                             **shared)
    assert run(first, 1) == {"booked": "flight"}
    assert run(first, 2) == {"booked": "flight"}
    hotel = SagaStepOperator(task_id="hotel", step="hotel", args={"item": "hotel"},
                             after=["flight"], **shared)
    assert run(hotel) == {"booked": "hotel"}
    assert calls == ["flight", "hotel"]
    with pytest.raises(InvalidInput, match="no handler named 'nope'"):
        SagaStepOperator(task_id="x", step="x", **{**shared, "handler": "nope"})


# -- the guard's refusals under dag.test() and at parse time (issue 22) -------------------------

GUARD_DAG = '''
"""Written by tests/airflow/test_airflow_operators.py: one GuardedActionOperator per kind of
refusal."""
from datetime import datetime

from airflow.sdk import dag

from agentpost.marks import Agent, Scope
from agentpost.operators import GuardedActionOperator

ROOMS = [Scope(name="rooms", allowed_intent_verbs=["book"], allowed_action_verbs=["booked"]),
         Scope(name="lots", allowed_intent_verbs=["park"], allowed_action_verbs=["parked"],
               deferred=True)]


def rooms():  # scopes given as a callable are known only at run time
    return ROOMS


def act(who):
    return {"by": who}


@dag(schedule=None, start_date=datetime(2026, 1, 1))
def agentpost_guard_refusals():
    def guarded(task_id, agent, scope="rooms", verbs=("book", "booked"), scopes=ROOMS,
                **extra):
        return GuardedActionOperator(
            task_id=task_id, agent=agent, scopes=scopes, space="refusals", scope=scope,
            resource="r-1", intent_action=verbs[0], result_action=verbs[1],
            python_callable=act, op_args=[task_id], **extra)

    hold = guarded("hold", "alice")
    hold >> [guarded("conflict_skips", "bob"),
             guarded("conflict_fails", "carol", on_refused="fail"),
             guarded("blocked_skips", "dave", scope="lots", verbs=("park", "parked")),
             guarded("verb_fails", "erin", verbs=("book", "reserved"), scopes=rooms),
             guarded("permission_fails", Agent(name="mallory"))]


agentpost_guard_refusals()
'''


@pytest.mark.slow
def test_denied_fails_the_task_and_contention_follows_on_refused(
        office: EnvelopeStore, dsn: str, tmp_path: Any) -> None:
    """Issue 22: under dag.test(), a refusal caused by configuration fails the task even
    with the default on_refused="skip": an action verb the scope does not allow (scopes
    given as a callable, so only the run can tell) and an agent without permission (DENIED).
    Contention follows on_refused: CONFLICT skips by default and fails with "fail"; BLOCKED
    (a deferred scope before its boundary) skips. Before, every refusal was skipped, so a
    typo in a verb looked green."""
    from test_airflow_examples import run_dags

    results, output = run_dags(tmp_path, dsn, [{"name": "guard",
                                                "dag_id": "agentpost_guard_refusals"}],
                               extra={"agentpost_guard_refusals.py": GUARD_DAG}, examples=())
    result = results["guard"]
    assert result["tasks"] == {
        "hold": "success", "conflict_skips": "skipped", "conflict_fails": "failed",
        "blocked_skips": "skipped", "verb_fails": "failed", "permission_fails": "failed",
    }, output[-8000:]
    assert result["run"] == "failed"
    assert "action verb 'reserved' is not allowed in scope 'rooms'" in output
    assert "guard verdict DENIED (authorization)" in output


FLEET_GUARD_DAG = '''
"""Written by tests/airflow/test_airflow_operators.py: a guarded action in a scope of a fleet
file."""
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag

from agentpost.fleet import load_fleet
from agentpost.operators import GuardedActionOperator

FLEET = load_fleet(Path(__file__).parent / "fleet.yaml")


@dag(schedule=None, start_date=datetime(2026, 1, 1))
def agentpost_fleet_guard():
    GuardedActionOperator(task_id="park", agent="driver-a", scopes=FLEET.scopes,
                          space=FLEET.space, scope="parking", resource="spot-1",
                          intent_action="VERB", result_action="parked",
                          python_callable=dict)


agentpost_fleet_guard()
'''


def test_a_verb_the_fleet_scope_does_not_allow_fails_the_parse(tmp_path: Any) -> None:
    """Issue 22: where the scope is known when the DAG is parsed (the scopes of a fleet
    file), a verb it does not allow is an import error of the DAG file naming the task, the
    verb and the scope, instead of a task that runs and is skipped; the allowed verb parses.
    So is a scope the list does not define; a child of a defined scope is governed by it."""
    import shutil

    from airflow.dag_processing.dagbag import DagBag

    shutil.copy(ROOT / "dags" / "fleet.yaml", tmp_path / "fleet.yaml")
    dag_file = tmp_path / "agentpost_fleet_guard.py"
    dag_file.write_text(FLEET_GUARD_DAG.replace("VERB", "reserve"))
    bag = DagBag(dag_folder=str(dag_file))
    assert list(bag.dags) == []
    [error] = bag.import_errors.values()
    assert "park: intent verb 'reserve' is not allowed in scope 'parking' (allowed: park)" \
        in error, error
    dag_file.write_text(FLEET_GUARD_DAG.replace("VERB", "park"))
    assert list(DagBag(dag_folder=str(dag_file)).dags) == [
        "agentpost_fleet_guard"]

    def guarded(scope: str, intent: str = "book") -> GuardedActionOperator:
        return GuardedActionOperator(task_id="g", agent="a", scopes=CALENDAR, scope=scope,
                                     resource="r", intent_action=intent,
                                     result_action="booked", python_callable=dict)

    with pytest.raises(InvalidInput, match=r"^g: scope 'rooms' is not among the scopes given "
                                           r"\(calendar\)"):
        guarded("rooms")
    assert guarded("calendar/team-a").scope == "calendar/team-a"
    assert guarded("{{ params.scope }}", intent="anything").intent_action == "anything"
