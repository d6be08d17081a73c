"""Saga steps that wait for a person's confirmation defer instead of failing the try
(SagaStepOperator / DagSaga with `deferrable=True`, the default), and resume on the answer:
confirmed, the step executes; declined, the saga compensates the executed steps.

Real Postgres per test, real Airflow `dag.test()` in a subprocess with its own home (which runs
the deferred task's `CommandTrigger` in line), a person answering from another thread, and
side effects that append lines to files, counted outside the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from agentpost.command_triggers import CommandTrigger
from agentpost.operators import SagaStepOperator
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from test_airflow_commands import RUN_THE_DAG, commands, lines, person, run_dag
from test_airflow_inbox import CONN_VAR, connection_json
from test_airflow_operators import StandInTI


@pytest.fixture
def desk(store: EnvelopeStore) -> EnvelopeStore:
    """A workspace `desk` that may perform `book`."""
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="desk")
    return store


DAG = '''
import json
import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag

from agentpost.operators import DagSaga

EFFECTS = Path(os.environ["AGENTPOST_TEST_EFFECTS"])


def effect(args, verb):
    with open(EFFECTS / f"{args['saga']}.txt", "a") as out:
        out.write(f"{verb} {args['item']}\\n")
    return {verb: args["item"]}


HANDLERS = {"book": lambda args: effect(args, "book"),
            "cancel": lambda args: effect(args, "cancel"),
            "pay": lambda args: effect(args, "pay")}


@dag(dag_id="agentpost_saga_wait_test", schedule=None, start_date=datetime(2026, 1, 1))
def saga_wait_test():
    for name in ("confirmed", "declined"):
        saga = DagSaga(name, workspace="desk", handlers=HANDLERS, auto_confirm="test-policy",
                       saga_key=name + "-{{ run_id }}", poke_interval=30)
        for item in ("flight", "hotel"):
            saga.step(f"{name}_{item}", "book", {"saga": name, "item": item}, action="book",
                      compensation=("cancel", {"saga": name, "item": item}))
        saga.step(f"{name}_payment", "pay", {"saga": name, "item": "payment"}, action="book",
                  auto_confirm=None)  # a person confirms the payment
        saga.end()


the_dag = saga_wait_test()
''' + RUN_THE_DAG


@pytest.mark.slow
def test_a_waiting_saga_step_defers_until_a_person_answers(desk: EnvelopeStore, dsn: str,
                                                           tmp_path: Path) -> None:
    """A saga step waiting for a confirmation defers (it is not failed, no retry is
    configured) and resumes on the answer: confirmed, the payment executes once and the
    saga completes; declined, the payment never runs, the earlier steps are compensated
    last first, their undo tasks succeed and the outcome task fails the run."""
    answers = {"/confirmed_payment": "confirm", "/declined_payment": "decline"}
    with person(dsn, answers, matches=str.endswith) as decided:
        result, output = run_dag(tmp_path, dsn, DAG, "saga_wait_test.py")
    tasks = result["tasks"]
    assert decided.keys() == answers.keys(), output[-6000:]
    assert output.count("running trigger in line") == 2, output[-6000:]
    effects = tmp_path / "effects"
    # confirmed: deferred, resumed, executed once; nothing undone
    assert lines(effects / "confirmed.txt") == ["book flight", "book hotel", "pay payment"]
    assert tasks["confirmed_payment"] == ["success", 1], output[-6000:]
    assert tasks["confirmed_outcome"][0] == "success"
    assert {tasks[f"undo_confirmed_{s}"][0] for s in ("flight", "hotel", "payment")} \
        == {"skipped"}
    # declined: the step fails without retries once declined; hotel then flight cancelled
    assert lines(effects / "declined.txt") == ["book flight", "book hotel", "cancel hotel",
                                               "cancel flight"]
    assert tasks["declined_payment"] == ["failed", 1]
    assert "step 'declined_payment' did not execute" in output, output[-6000:]
    assert [tasks[f"undo_declined_{s}"][0] for s in ("flight", "hotel")] == ["success"] * 2
    assert tasks["declined_outcome"][0] == "failed"
    assert result["run"] == "failed"
    with CommandLedger(dsn) as ledger:
        assert ledger.view(decided["/confirmed_payment"]).state.value == "executed"
        declined = ledger.view(decided["/declined_payment"])
        assert declined.declined and declined.state.value != "executed"


def test_a_waiting_step_defers_on_its_command_or_fails_the_try(
        desk: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Called directly: a step whose command waits for a confirmation raises TaskDeferred
    with a CommandTrigger on that command (deferrable, the default), and fails the try
    without deferring when deferrable=False; either way the handler has not run, and a
    malformed trigger event fails the resumed try with a clear message."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    calls: list[dict[str, Any]] = []
    step = {"task_id": "pay", "step": "pay", "handler": "pay", "action": "book",
            "workspace": "desk", "saga_key": "direct", "args": {"amount": 5},
            "handlers": {"pay": calls.append}}
    ti = StandInTI(task_id="pay")
    with pytest.raises(TaskDeferred) as deferred:
        SagaStepOperator(**step).execute({"ti": ti})
    trigger = deferred.value.trigger
    assert isinstance(trigger, CommandTrigger)
    waiting = [c for c in commands(dsn) if c["state"] == "confirmation_required"]
    assert [c["id"] for c in waiting] == [trigger.command_id]
    assert deferred.value.method_name == "execute_complete"
    with pytest.raises(AirflowException, match=r"^pay: saga .* is confirmation_required; "
                                               r"a later try goes on"):
        SagaStepOperator(**step, deferrable=False).execute({"ti": StandInTI(2, task_id="pay")})
    with pytest.raises(AirflowException, match=r"^pay: unexpected trigger event"):
        SagaStepOperator(**step).execute_complete({"ti": ti}, {"status": "nope"})
    with pytest.raises(ValueError, match="poke_interval"):
        SagaStepOperator(**step, poke_interval=0)
    assert calls == []
