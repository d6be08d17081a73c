"""CommandOperator and CommandTrigger: side effects at most once per logical command however
often Airflow retries a task (issue 5: "Agents cause side effects (book a room, charge a card,
write a file). Those effects must run at most once per logical command however often Airflow
retries a task").

Everything is real: a Postgres store per test (tests/conftest.py), the CommandLedger, and
Airflow's `dag.test()` in a subprocess with its own AIRFLOW_HOME and a migrated SQLite
metadata database (the pattern of tests/airflow/test_airflow_inbox.py). The side effects
append lines to files, so "how often did it run" is counted outside the store, and the store's
evidence is checked against it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Airflow reads its configuration once, at first import: point it at a throwaway home before
# anything imports it (an AIRFLOW_HOME given by the caller is respected).
if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="agentpost-airflow-home-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from airflow.sdk.module_loading import import_string

from agentpost.command_triggers import CommandTrigger
from agentpost.operators import CommandOperator
from agentpost.operators.commands import MAX_KEY, default_key
from agentpost.protocol.commands import CommandState
from agentpost.protocol.errors import InvalidInput
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from dbtools import connect, rows
from test_airflow_inbox import (
    CONN_VAR,
    WAKE_BOUND,
    airflow_env,
    assert_cancel_closes_connections,
    connection_json,
    in_background,
    wait_for_listener,
)

S = CommandState
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "agentpost_command_example.py"


@pytest.fixture
def desk(store: EnvelopeStore) -> EnvelopeStore:
    """A workspace `desk` that may perform `book` (and the example DAG's `travel-desk`)."""
    store.define_role("agent")
    for action in ("book", "room.book", "card.charge"):
        store.register_type(action, ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="desk")
    store.create_workspace("agent", workspace_id="travel-desk")
    return store


def commands(dsn: str) -> list[dict[str, Any]]:
    """Every command row, oldest first."""
    conn = connect(dsn)
    try:
        found = rows(conn, """
            SELECT id, idempotency_key, kind, target_command_id, state, reason, declined
              FROM agentpost.commands ORDER BY created_at, id""")
    finally:
        conn.close()
    keys = ("id", "key", "kind", "target", "state", "reason", "declined")
    return [dict(zip(keys, r, strict=True)) for r in found]


def evidence(ledger: CommandLedger, command_id: str) -> list[dict[str, Any]]:
    return [e.body for e in ledger.evidence(command_id)]


def transitions(ledger: CommandLedger, command_id: str) -> list[str]:
    return [b["lifecycle"]["transition"] for b in evidence(ledger, command_id)
            if b["lifecycle"]["evidence_type"] == "state_change"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -- the trigger ---------------------------------------------------------------------------------


def run_trigger(trigger: CommandTrigger, limit: float = 90.0) -> tuple[dict[str, Any], float]:
    async def first() -> Any:
        return await asyncio.wait_for(anext(trigger.run()), limit)

    started = time.monotonic()
    event = asyncio.run(first())
    return event.payload, time.monotonic() - started


def waiting_command(ledger: CommandLedger, key: str) -> str:
    """A mutating command without auto-confirm: it stops at confirmation_required."""
    view = ledger.run("desk", key, lambda: "never", action="book", mutating=True)
    assert view.state is S.CONFIRMATION_REQUIRED
    return view.command_id


def test_trigger_wakes_on_a_persons_answer_not_on_the_poll(desk: EnvelopeStore,
                                                           dsn: str) -> None:
    """Issue 5, confirmation: a deferred task waits for a person's answer on LISTEN (the
    confirmation envelope is delivered into the command's workspace), so it resumes long
    before its 30 s poll; the event carries the decision."""
    with CommandLedger(desk) as ledger:
        command_id = waiting_command(ledger, "k-wake")

        def confirm_later() -> Any:
            wait_for_listener(dsn)
            time.sleep(0.5)
            return ledger.confirmation_envelope("alice", command_id, "confirm")

        trigger = CommandTrigger(command_id=command_id, workspace="desk", poll_interval=30,
                                 dsn=dsn)
        with in_background(confirm_later) as confirmed:
            payload, took = run_trigger(trigger)
            assert confirmed.result(timeout=10).state is S.CONFIRMED
    assert payload == {"status": "ready", "command_id": command_id, "state": "confirmed",
                       "declined": False}
    assert took < WAKE_BOUND, f"took {took:.1f} s: the trigger waited for its poll"


def test_trigger_sweeps_a_dead_executor(desk: EnvelopeStore, dsn: str) -> None:
    """Issue 5, "never run in parallel": a command started by a worker that died (its lease
    is not renewed) is waited for, then swept to failed by the trigger once the lease ran out,
    with the sweep's evidence."""
    with CommandLedger(desk, lease_ttl=0.5) as ledger:
        with pytest.raises(SystemExit):  # the executor dies inside the side effect
            ledger.run("desk", "k-dead", lambda: sys.exit(1), action="book", mutating=True,
                       auto_confirm="test-policy")
        [row] = commands(dsn)
        assert row["state"] == "started"
        payload, _ = run_trigger(CommandTrigger(command_id=row["id"], workspace="desk",
                                                poll_interval=0.2, dsn=dsn))
        assert payload["state"] == "failed"
        view = ledger.view(row["id"])
        assert view.reason == "executor_lost"
        assert transitions(ledger, row["id"])[-1] == "started→failed"


def test_a_cancelled_trigger_closes_its_connections(desk: EnvelopeStore, dsn: str) -> None:
    """Issue 5, waiting for a confirmation without holding resources: the triggerer cancels a
    trigger on the deferral timeout or when the task is cleared, and the trigger's LISTEN and
    store connections must not outlive it."""
    with CommandLedger(desk) as ledger:
        command_id = waiting_command(ledger, "k-cancel")

    assert_cancel_closes_connections(
        dsn, CommandTrigger(command_id=command_id, workspace="desk", dsn=dsn))


def test_trigger_reports_errors_and_serializes(desk: EnvelopeStore, dsn: str) -> None:
    """Issue 5, bad input gives a clear error: a command that cannot be watched ends in a
    one-line error event; the trigger round-trips through its classpath and kwargs; bad
    kwargs are refused."""
    missing = "00000000-0000-4000-8000-000000000000"
    payload, _ = run_trigger(CommandTrigger(command_id=missing, workspace="desk", dsn=dsn))
    assert payload["status"] == "error" and payload["message"].startswith("NotFound: ")
    assert "\n" not in payload["message"]
    trigger = CommandTrigger(command_id=missing, workspace="desk", poll_interval=2,
                             conn_id="ap", dsn="postgresql://u:s3cret@db/ap")
    classpath, kwargs = trigger.serialize()
    assert classpath == "agentpost.command_triggers.CommandTrigger"
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert "s3cret" not in repr(trigger)
    for bad in ({"poll_interval": 0}, {"workspace": ""}, {"command_id": ""},
                {"command_id": 5}):
        with pytest.raises(InvalidInput):
            CommandTrigger(**{"command_id": missing, "workspace": "desk", **bad})


# -- the operator outside a DAG run --------------------------------------------------------------


def test_default_key_is_the_same_for_every_try() -> None:
    """Issue 5: one logical command per task instance: the default key is built from
    dag_id, task_id, run_id and map_index, never the try number, and fits the ledger."""
    assert default_key("d", "t", "manual__1") == "airflow/d/t/manual__1"
    assert default_key("d", "t", "manual__1", 3) == "airflow/d/t/manual__1/3"
    long = default_key("d" * 250, "t", "r")
    assert len(long) <= MAX_KEY and long != default_key("d" * 249 + "e", "t", "r")


def test_operator_refuses_bad_arguments_at_parse_time() -> None:
    """Issue 5, bad input: a clear error where the DAG is defined, before anything runs."""
    ok = {"task_id": "t", "python_callable": print, "action": "book", "workspace": "desk"}
    for bad, match in (({"python_callable": "print"}, "callable"), ({"action": ""}, "action"),
                       ({"mutating": "yes"}, "mutating"), ({"auto_confirm": " "}, "policy"),
                       ({"poke_interval": 0}, "poke_interval")):
        with pytest.raises(ValueError, match=match):
            CommandOperator(**{**ok, **bad})


def test_trigger_events_become_results_or_clear_failures(
        desk: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 5, confirmation: resuming after the trigger, an error event fails the try with
    its message; a declined command fails the task without retries (AirflowFailException)."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    op = CommandOperator(task_id="t", python_callable=print, action="book", workspace="desk")
    with pytest.raises(AirflowException, match="cannot watch command c1: NotFound: gone"):
        op.execute_complete({}, {"status": "error", "command_id": "c1",
                                 "message": "NotFound: gone"})
    with CommandLedger(desk) as ledger:
        command_id = waiting_command(ledger, "k-declined")
        ledger.confirmation_envelope("bob", command_id, "decline")
    with pytest.raises(AirflowFailException, match=f"command {command_id} \\(book\\) was "
                                                   "declined: confirmation_declined"):
        op.execute_complete({}, {"status": "ready", "command_id": command_id,
                                 "state": "confirmation_required", "declined": True})


class StandInTI:
    """What the operator reads of Airflow's task instance, for calling `execute` directly
    (try after try) without a scheduler; the store behind it is real."""

    def __init__(self, try_number: int) -> None:
        self.dag_id, self.task_id, self.run_id, self.map_index = "d", "t", "manual__1", -1
        self.try_number = try_number
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def test_operator_try_after_try(desk: EnvelopeStore, dsn: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 5, "at most once per logical command however often Airflow retries": try 1's
    command fails, try 2's retry fails, try 3's retry executes, try 4 replays it; every retry
    is a recovery command of the primary with its own key; the callable ran three times (each
    failure was a real attempt), never a fourth."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    calls: list[str] = []

    def effect(what: str) -> dict[str, int]:
        calls.append(what)
        if len(calls) < 3:
            raise RuntimeError(f"attempt {len(calls)}")
        return {"ok": len(calls)}

    op = CommandOperator(task_id="t", python_callable=effect, op_args=["x"], action="book",
                         workspace="desk", auto_confirm="test-policy")
    for try_number in (1, 2):
        with pytest.raises(AirflowException, match=f"failed: RuntimeError: attempt {try_number}"
                           ) as failed:
            op.execute({"ti": StandInTI(try_number)})
        assert not isinstance(failed.value, AirflowFailException), "a failure is retryable"
        assert isinstance(failed.value.__cause__, RuntimeError), "the callable's traceback"
    for try_number in (3, 4):
        ti = StandInTI(try_number)
        assert op.execute({"ti": ti}) == {"ok": 3}
    assert calls == ["x", "x", "x"]
    rows_ = commands(dsn)
    primary = rows_[0]
    assert [(r["key"], r["kind"], r["target"], r["state"]) for r in rows_] == [
        ("airflow/d/t/manual__1", "primary", None, "failed"),
        ("airflow/d/t/manual__1/retry-2", "retry", primary["id"], "failed"),
        ("airflow/d/t/manual__1/retry-3", "retry", primary["id"], "executed")]
    assert ti.xcoms == {"command_id": rows_[2]["id"]}


def test_a_waiting_command_defers_or_fails_the_try(desk: EnvelopeStore, dsn: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 5, confirmation: a mutating command without auto_confirm is not executed; the
    task defers to CommandTrigger on that command (or, not deferrable, fails the try so a later
    try asks again) and the callable is not called."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    calls: list[int] = []
    common = {"task_id": "t", "python_callable": lambda: calls.append(1), "action": "book",
              "workspace": "desk", "poke_interval": 5}
    with pytest.raises(TaskDeferred) as deferred:
        CommandOperator(**common).execute({"ti": StandInTI(1)})
    [row] = commands(dsn)
    assert row["state"] == "confirmation_required"
    classpath, kwargs = deferred.value.trigger.serialize()
    assert (classpath, kwargs["command_id"], kwargs["poll_interval"]) == (
        "agentpost.command_triggers.CommandTrigger", row["id"], 5.0)
    assert deferred.value.method_name == "execute_complete"
    with pytest.raises(AirflowException, match="is waiting for a confirmation") as failed:
        CommandOperator(**common, deferrable=False).execute({"ti": StandInTI(2)})
    assert not isinstance(failed.value, AirflowFailException)
    assert calls == [] and len(commands(dsn)) == 1


# -- the operator in a DAG run -------------------------------------------------------------------

#: the end of every DAG file these tests write: run `the_dag` under dag.test() and print each
#: task's state and try number on one AGENTPOST-RESULT line (read by run_dag)
RUN_THE_DAG = '''
if __name__ == "__main__":
    import json

    from airflow.utils.db import initdb

    initdb()
    run = the_dag.test()
    states = {ti.task_id: [str(ti.state), ti.try_number] for ti in run.get_task_instances()}
    print("AGENTPOST-RESULT " + json.dumps({"run": str(run.state), "tasks": states}),
          flush=True)
'''

DAG_FILE = '''
"""Written by tests/airflow/test_airflow_commands.py: side effects through CommandOperator."""
import json
import os
import sys
from datetime import timedelta
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task

from agentpost.operators import CommandOperator

EFFECTS = Path(os.environ["AGENTPOST_TEST_EFFECTS"])
TASKS = ["book_room", "charge_card", "charge_checked", "confirm_me", "decline_me",
         "after_a_dead_worker", "bad_action", "bad_key"]


def effect(name, line):
    """The side effect: one line per execution, in a file the test counts."""
    with open(EFFECTS / f"{name}.txt", "a") as out:
        out.write(line + "\\n")
    return {"done": name, "line": line}


def flaky_effect(name, line):
    """Fails on its first call, after writing its line (a failed attempt that did half of
    its work), succeeds on the next."""
    marker = EFFECTS / f"{name}.first-call"
    effect(name, line)
    if not marker.exists():
        marker.write_text("")
        raise RuntimeError("card processor timed out")
    return {"charged": 42}


def fail_on_first_try(context, result):
    """A step after the command (outside it) that fails the first try."""
    if context["ti"].try_number == 1:
        raise RuntimeError(f"post-step failed after the command returned {result!r}")


def fail_on_second_try(context, result):
    if context["ti"].try_number == 2:
        raise RuntimeError(f"post-step failed after the retry returned {result!r}")


@dag(dag_id="agentpost_command_test", schedule=None, start_date=datetime(2026, 1, 1),
     default_args={"retries": 1, "retry_delay": timedelta(seconds=0)})
def command_test():
    common = {"action": "book", "workspace": "desk", "python_callable": effect,
              "poke_interval": 30}
    policy = {**common, "auto_confirm": "test-policy"}
    ops = [
        CommandOperator(task_id="book_room", post_execute=fail_on_first_try,
                        op_kwargs={"name": "book_room", "line": "room 101"}, **policy),
        CommandOperator(task_id="charge_card", op_args=["charge_card", "charge 42"],
                        **{**policy, "python_callable": flaky_effect}),
        CommandOperator(task_id="charge_checked", op_args=["charge_checked", "charge 7"],
                        retries=2, post_execute=fail_on_second_try,
                        **{**policy, "python_callable": flaky_effect}),
        CommandOperator(task_id="confirm_me", idempotency_key="confirm-{{ run_id }}",
                        op_args=["confirm_me", "{{ ti.task_id }} ran"], **common),
        CommandOperator(task_id="decline_me", idempotency_key="decline-{{ run_id }}",
                        op_args=["decline_me", "must not run"], retries=2, **common),
        CommandOperator(task_id="after_a_dead_worker", idempotency_key="died-mid-booking",
                        op_args=["after_a_dead_worker", "rebooked"],
                        **{**policy, "poke_interval": 0.5}),
        CommandOperator(task_id="bad_action", op_args=["bad_action", "must not run"],
                        retries=2, **{**policy, "action": "no.such.action"}),
        CommandOperator(task_id="bad_key", idempotency_key="k" * 201,
                        op_args=["bad_key", "must not run"], retries=2, **policy),
    ]

    @task(trigger_rule="all_done")
    def report(ti=None):
        out = {t: {"outcome": ti.xcom_pull(task_ids=t),
                   "command_id": ti.xcom_pull(task_ids=t, key="command_id")} for t in TASKS}
        with open(os.environ["AGENTPOST_TEST_REPORT"], "w") as f:
            json.dump(out, f)

    ops >> report()


the_dag = command_test()
''' + RUN_THE_DAG


def run_dag(tmp_path: Path, dsn: str, source: str, name: str,
            beside: Any = None) -> tuple[dict[str, Any], str]:
    """Run a DAG file's `__main__` (dag.test) in a private Airflow; its result and output."""
    dags = tmp_path / "dags"
    dags.mkdir(exist_ok=True)
    (dags / name).write_text(source)
    env = airflow_env(tmp_path, dsn)
    env["AGENTPOST_TEST_EFFECTS"] = str(tmp_path / "effects")
    (tmp_path / "effects").mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, str(dags / name)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and found, output[-6000:]
    return json.loads(found[-1].removeprefix("AGENTPOST-RESULT ")), output


@contextmanager
def person(dsn: str, answers: dict[str, str],
           matches: Callable[[str, str], bool] = str.startswith) -> Iterator[dict[str, str]]:
    """A person at another terminal while the block runs: for each pattern of `answers`,
    once the command whose key `matches` it (by default: starts with it) asks for a
    confirmation and the task's trigger listens, answer it: `confirm` through the CLI (a
    separate process), `decline` through `ledger.confirmation_envelope`. Yields the ids
    decided, per pattern (filled in as it goes)."""
    decided: dict[str, str] = {}
    stop = threading.Event()

    def watch() -> None:
        while len(decided) < len(answers) and not stop.wait(0.2):
            for row in commands(dsn):
                pattern = next((p for p in answers if matches(row["key"], p)), None)
                if pattern is not None and pattern not in decided \
                        and row["state"] == "confirmation_required":
                    wait_for_listener(dsn, within=120)
                    time.sleep(0.5)
                    decide(dsn, row["id"], answers[pattern])
                    decided[pattern] = row["id"]

    with in_background(watch) as watching:
        try:
            yield decided
        finally:
            stop.set()
    watching.result()


def decide(dsn: str, command_id: str, answer: str) -> None:
    if answer == "confirm":
        cli = shutil.which("agentpost") or str(Path(sys.executable).parent / "agentpost")
        proc = subprocess.run([cli, "command", "confirm", command_id, "--user", "alice"],
                              env={**os.environ, "AGENTPOST_DSN": dsn},
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return
    with CommandLedger(dsn) as ledger:
        ledger.confirmation_envelope("bob", command_id, answer)


@pytest.mark.slow
def test_commands_in_dag_test(desk: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """Issue 5 in Airflow ("Those effects must run at most once per logical command however
    often Airflow retries a task"), one `dag.test()` with a task per case:

    - book_room: the booking executes, then a step after the command fails try 1; try 2
      replays the outcome: one line in the effect file, one execution in the evidence, plus a
      duplicate_delivery from try 2.
    - charge_card: the callable fails on try 1 (after writing a line); try 2 is a `retry`
      recovery command linked to the failed primary: two lines, by design, and both
      commands' evidence.
    - confirm_me / decline_me: mutating without auto_confirm, the task defers until a person
      answers (CLI in another process / a ledger call in another thread); confirmed, it runs
      once; declined, it fails with the reason and no retry, the callable never called.
    - after_a_dead_worker: the key's command was started by a worker that died; the task
      waits (never runs in parallel) until the trigger sweeps it, then retries it once.
    - bad_action / bad_key: a one-line error, no retries, nothing recorded.
    """
    with CommandLedger(desk, lease_ttl=2.0) as ledger:
        with pytest.raises(SystemExit):
            ledger.run("desk", "died-mid-booking", lambda: sys.exit(1), action="book",
                       mutating=True, auto_confirm="test-policy")
        with person(dsn, {"confirm-": "confirm", "decline-": "decline"}) as decided:
            result, output = run_dag(tmp_path, dsn, DAG_FILE, "command_test.py")
        effects = tmp_path / "effects"
        report = json.loads((tmp_path / "report.json").read_text())
        rows_by_key = {r["key"]: r for r in commands(dsn)}
        tasks = result["tasks"]
        assert output.count("running trigger in line") == 3, "confirm, decline, dead worker"

        # book_room: executed once, replayed on try 2
        assert tasks["book_room"] == ["success", 2], output[-6000:]
        assert lines(effects / "book_room.txt") == ["room 101"]
        booked = report["book_room"]
        assert booked["outcome"] == {"done": "book_room", "line": "room 101"}
        body = evidence(ledger, booked["command_id"])
        assert transitions(ledger, booked["command_id"]).count("started→executed") == 1
        assert [b["lifecycle"]["evidence_type"] for b in body].count(
            "duplicate_delivery") == 1
        assert "post-step failed after the command returned" in output
        assert "already executed: replaying its outcome" in output

        # charge_card: primary failed, retry executed and linked to it
        assert tasks["charge_card"] == ["success", 2], output[-6000:]
        assert lines(effects / "charge_card.txt") == ["charge 42", "charge 42"]
        retry_id = report["charge_card"]["command_id"]
        assert report["charge_card"]["outcome"] == {"charged": 42}
        retry = ledger.view(retry_id)
        primary = ledger.view(str(retry.target_command_id))
        assert (retry.kind.value, retry.state, primary.state) == ("retry", S.EXECUTED,
                                                                  S.FAILED)
        assert primary.reason == "RuntimeError: card processor timed out"
        assert retry.idempotency_key == primary.idempotency_key + "/retry-2"
        links = [b for b in evidence(ledger, primary.command_id)
                 if b["lifecycle"]["evidence_type"] == "recovery_requested"]
        assert [(b["recovery_command_id"], b["recovery_kind"]) for b in links] == [
            (retry_id, "retry")]
        started = [b for b in evidence(ledger, retry_id)
                   if b["lifecycle"]["transition"] == "received→canonicalized"]
        assert started[0]["target_command_id"] == primary.command_id
        assert started[0]["context"]["airflow"]["try_number"] == 2

        # charge_checked: the retry executed on try 2, the post-step failed; try 3 replays the
        # retry's outcome instead of retrying again
        assert tasks["charge_checked"] == ["success", 3], output[-6000:]
        assert lines(effects / "charge_checked.txt") == ["charge 7", "charge 7"]
        checked = ledger.view(report["charge_checked"]["command_id"])
        assert (checked.kind.value, checked.state) == ("retry", S.EXECUTED)
        assert checked.idempotency_key.endswith("/retry-2")
        assert report["charge_checked"]["outcome"] == {"charged": 42}
        primary_body = evidence(ledger, str(checked.target_command_id))
        assert [b["lifecycle"]["evidence_type"] for b in primary_body].count(
            "duplicate_delivery") == 2, "tries 2 and 3 each asked for the primary again"
        assert [b.get("recovery_command_id") for b in primary_body
                if b["lifecycle"]["evidence_type"] == "recovery_requested"] == [
            checked.command_id], "try 3 started no second retry"

        # confirm_me: deferred, confirmed by alice through the CLI, executed once
        assert tasks["confirm_me"] == ["success", 1], output[-6000:]
        assert lines(effects / "confirm_me.txt") == ["confirm_me ran"]
        confirmed = ledger.view(decided["confirm-"])
        assert report["confirm_me"]["command_id"] == confirmed.command_id
        assert (confirmed.state, confirmed.confirmed_by) == (S.EXECUTED, "human:alice")

        # decline_me: deferred, declined by bob, failed without retries, never ran
        assert tasks["decline_me"] == ["failed", 1], output[-6000:]
        assert not (effects / "decline_me.txt").exists()
        assert ledger.view(decided["decline-"]).declined
        assert "was declined: confirmation_declined" in output

        # after_a_dead_worker: waited, swept, retried once
        assert tasks["after_a_dead_worker"] == ["success", 1], output[-6000:]
        assert lines(effects / "after_a_dead_worker.txt") == ["rebooked"]
        dead = rows_by_key["died-mid-booking"]
        assert (dead["state"], dead["reason"]) == ("failed", "executor_lost")
        again = rows_by_key["died-mid-booking/retry-1"]
        assert (again["kind"], again["target"], again["state"]) == ("retry", dead["id"],
                                                                   "executed")

        # bad input: one line, no retry, nothing recorded
        for task_id, message in (
                ("bad_action", "bad_action: InvalidInput: unknown action type "
                               "'no.such.action'"),
                ("bad_key", "bad_key: InvalidInput: idempotency_key")):
            assert tasks[task_id] == ["failed", 1], output[-6000:]
            assert message in output, task_id
            assert not (effects / f"{task_id}.txt").exists()
        assert len(rows_by_key) == 9, sorted(rows_by_key)  # 1 + 2 + 2 + 1 + 1 + 2
        assert desk.verify_trail().ok


@pytest.mark.slow
def test_the_example_dag_runs(desk: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """Issue 5, the documented example (dags/agentpost_command_example.py, the snippet in
    docs/airflow.md): the booking runs under its policy, the charge waits for a person and
    runs once they confirm."""
    example = EXAMPLE.read_text()
    documented = example[example.index("from __future__ import annotations"):]
    assert documented in (ROOT / "docs" / "airflow.md").read_text(), "docs/airflow.md is stale"
    source = example + "\nthe_dag = agentpost_command_example()\n" + RUN_THE_DAG
    with person(dsn, {"airflow/agentpost_command_example/charge_card/": "confirm"}) as decided:
        result, output = run_dag(tmp_path, dsn, source, "agentpost_command_example.py")
    assert result["tasks"] == {"book_room": ["success", 1], "charge_card": ["success", 1],
                               "receipt": ["success", 1]}, output[-6000:]
    assert result["run"] == "success"
    with CommandLedger(dsn) as ledger:
        charge = ledger.view(decided["airflow/agentpost_command_example/charge_card/"])
    assert (charge.state, charge.confirmed_by) == (S.EXECUTED, "human:alice")
    assert charge.outcome == {"charged": 180, "currency": "EUR"}

