"""Airflow for real: `airflow standalone` through `AirflowRuntime`, end to end, and the
headless demo (`make demo-headless`) over the whole dags/ folder.

One standalone start: the runtime brings Airflow up on its own metadata database beside the
test's store, the health endpoint reports every component, the command example is unpaused,
triggered and awaited over the REST API (its confirmation answered by the demo's person
through the human highway), the event-driven example runs when the demo's envelope arrives
in its inbox (the asset watcher in the real triggerer), the trail holds what they did, and
the trail's nightly audit DAG (issue 14, ``agentpost_trail_audit``, triggered over the
REST API) runs spark-submit in local mode over the trail those two left, and `stop()`
leaves no process, no listening port and no metadata database behind.
Standalone runs this representative set only: every scenario under standalone takes minutes
on two shared cores; the headless test below runs them all.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from agentpost.demo.airflow import DemoPerson, RestRunner, apply_demo_fleet, run_headless_demo
from agentpost.demo.scenarios import EVENT_DRIVEN, Outcome
from agentpost.demo.store import running_demo_store
from agentpost.pg.server import libpq_dsn, redact_dsn
from agentpost.spark.audit import AuditReport
from agentpost.standalone import (
    COMPONENTS,
    AirflowClient,
    AirflowError,
    AirflowRuntime,
    Credentials,
    port_open,
    wait_until,
)
from agentpost.store import CommandLedger, EnvelopeStore
from dbtools import query

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
EXAMPLE = "agentpost_command_example"
EVENT_EXAMPLE = "agentpost_event_driven_example"
TRAIL_JOBS = "agentpost_trail_jobs"
AUDIT = "agentpost_trail_audit"
#: a Spark job's run, spark-submit and JVM start included, on two busy cores
SPARK_RUN_TIMEOUT = 600


def listening_addresses(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def command_views(store: EnvelopeStore) -> dict[str, object]:
    """Every command on the trail, by action."""
    ids = {e.body["lifecycle"]["command_id"] for e in store.trail(event="command_state_change")}
    with CommandLedger(store) as ledger:
        views = [ledger.view(i) for i in ids]
    return {v.action: v for v in views}


def databases(dsn: str, name: str) -> list[tuple[str]]:
    return query(libpq_dsn(dsn), "SELECT datname FROM pg_database WHERE datname = %s", (name,))


@pytest.mark.slow
def test_standalone_runs_an_example_dag_and_stops_without_a_trace(dsn: str,
                                                                  tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in (EXAMPLE, EVENT_EXAMPLE, TRAIL_JOBS):
        shutil.copy(DAGS / f"{name}.py", dags)
    apply_demo_fleet(dsn, DAGS)
    runtime = AirflowRuntime(dsn, dags_folder=dags, home=tmp_path / "home", drop_metadata=True)
    try:
        runtime.start()
        started = _run_the_example(runtime, dsn)
    finally:
        runtime.stop()
    assert started, "standalone started no processes"
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert runtime.processes() == []
    for port in runtime.ports:
        assert not port_open(port), f"port {port} is still open"
    assert "standalone | Complete" in runtime.log_path.read_text(), \
        "standalone did not stop cleanly on SIGINT"
    assert databases(dsn, runtime.metadata_db) == [], "the metadata database was left"


def _run_the_example(runtime: AirflowRuntime, dsn: str) -> list[psutil.Process]:
    """Everything between start and stop; the processes running before the stop."""
    with AirflowClient(runtime.url) as anonymous:
        health = anonymous.health()
    assert all(health[c]["status"] == "healthy" for c in COMPONENTS), health
    assert listening_addresses(runtime.port) == {"127.0.0.1"}
    assert databases(dsn, runtime.metadata_db), "Airflow's metadata is not on the store's server"
    with AirflowClient(runtime.url, Credentials("admin", "wrong")) as intruder, \
            pytest.raises(AirflowError, match="login failed \\(401\\)"):
        intruder.dag_ids()

    with runtime.client() as client, EnvelopeStore(dsn) as store:
        client.wait_for_dag(EXAMPLE)
        client.wait_for_dag(EVENT_EXAMPLE)
        assert client.dag_ids(prefix="agentpost_", tag="example") == [EXAMPLE, EVENT_EXAMPLE]
        client.unpause(EXAMPLE)
        run_id = client.trigger(EXAMPLE)
        person = DemoPerson(store)
        try:
            state = client.wait_for_run(EXAMPLE, run_id, timeout=300, tick=person.answer)
        finally:
            person.close()
        tasks = {ti["task_id"]: ti["state"] for ti in client.task_instances(EXAMPLE, run_id)}
        assert (state, tasks) == ("success", {"book_room": "success", "charge_card": "success",
                                              "receipt": "success"}), runtime.log_tail()
        views = command_views(store)
        assert {a: v.state.value for a, v in views.items()} == {"room.book": "executed",
                                                                "card.charge": "executed"}
        assert views["card.charge"].confirmed_by == "human:dana"
        _event_driven(client, store)
        assert store.verify_trail().ok
        _the_agentpost_page(client, runtime, views["card.charge"].command_id)
        _trail_jobs(client, runtime, dsn)
    return runtime.processes()


def _the_agentpost_page(client: AirflowClient, runtime: AirflowRuntime,
                        command_id: str) -> None:
    """Under standalone the plugin is loaded from its entry point, listed with its menu
    entry, and serves the page from the store of the `agentpost_default` connection."""
    [plugin] = [p for p in client.request("GET", "/plugins")["plugins"]
                if p["name"] == "agentpost"]
    assert [(v["href"], v["destination"], v["category"]) for v in plugin["external_views"]] \
        == [("/agentpost/", "nav", "browse")]
    assert httpx.get(runtime.url + "/agentpost/", timeout=30).status_code == 401
    index = client.page("/agentpost/")
    assert index.status_code == 200 and 'id="inboxes"' in index.text, index.text[:500]
    command = client.page(f"/agentpost/commands/{command_id}")
    assert command.status_code == 200, command.text[:500]
    assert 'data-state="executed"' in command.text


def _trail_jobs(client: AirflowClient, runtime: AirflowRuntime, dsn: str) -> None:
    """Issue 14 under standalone: the nightly audit DAG, triggered over the REST API and
    unpaused, runs spark-submit in local mode; its task succeeds, the audit finds the trail
    sound, and its report, in agentpost.audit_reports, is in the task's log as the UI serves
    it; the task's "Trail analytics" link is served and opens the analytics page, which
    lists the report. The trigger takes the DAG's next scheduled slot, so unpausing adds no
    scheduled run. The analytics DAG runs under `dag.test()` (tests/spark/test_spark_airflow.py,
    with its scheduled daily window): a second Spark job here cost CI minutes on two cores."""
    with pytest.raises(AirflowError, match=f"DAG {EXAMPLE} has no next scheduled run"):
        client.trigger(EXAMPLE, slot=True)  # schedule=None: nothing started
    assert len(client.runs(EXAMPLE)) == 1
    client.wait_for_dag(AUDIT)
    run_id = client.trigger(AUDIT, {}, slot=True)
    client.unpause(AUDIT)
    _await_success(client, runtime, AUDIT, run_id)
    assert [r["dag_run_id"] for r in client.runs(AUDIT)] == [run_id]
    report = _reported_in_log(client, dsn, AUDIT, run_id)
    assert report["ok"] is True, report
    _the_trail_analytics_link(client, runtime, AUDIT, run_id, "audit", report["id"])


def _await_success(client: AirflowClient, runtime: AirflowRuntime, dag_id: str,
                   run_id: str) -> None:
    state = client.wait_for_run(dag_id, run_id, timeout=SPARK_RUN_TIMEOUT)
    tis = client.task_instances(dag_id, run_id)
    assert state == "success" and [t["state"] for t in tis] == ["success"], (
        dag_id, run_id, state,
        [client.task_log(dag_id, run_id, t["task_id"], t["try_number"], lines=60)
         for t in tis if t["try_number"]], runtime.log_tail())


def _reported_in_log(client: AirflowClient, dsn: str, dag_id: str,
                     run_id: str) -> dict[str, Any]:
    """The audit report (its row) whose summary, every line of it, is in the run's task log
    as the REST API serves it to the UI; there must be exactly one."""
    [ti] = client.task_instances(dag_id, run_id)
    log = set(client.task_log(dag_id, run_id, ti["task_id"], ti["try_number"],
                              lines=None).splitlines())
    rows = query(dsn, "SELECT id, ok, report FROM agentpost.audit_reports ORDER BY id")
    shown = [{"id": i, "ok": ok} for i, ok, report in rows
             if {ln.strip() for ln in AuditReport.model_validate(report).summary()
                 .splitlines()} <= log]
    assert len(shown) == 1, (shown, rows, sorted(log)[-60:])
    return shown[0]


def _the_trail_analytics_link(client: AirflowClient, runtime: AirflowRuntime, dag_id: str,
                              run_id: str, task_id: str, audit_id: int) -> None:
    links = client.extra_links(dag_id, run_id, task_id)
    assert links == {"Trail analytics": f"{runtime.url}/agentpost/analytics"}, links
    page = client.page(links["Trail analytics"].removeprefix(runtime.url))
    assert page.status_code == 200 and f'data-audit="{audit_id}"' in page.text, page.text[:500]


def _event_driven(client: AirflowClient, store: EnvelopeStore) -> None:
    """The demo's way: the triggerer runs the inbox watcher once the DAG is unpaused; the
    envelope sent then starts one asset-triggered run, which consumes it."""
    arrival = EVENT_DRIVEN[EVENT_EXAMPLE]
    person = DemoPerson(store)
    runner = RestRunner(client, store, person, timeout=300)
    sent = []
    try:
        runner.watch([EVENT_EXAMPLE], [arrival.watcher])
        outcomes = runner.on_arrival(EVENT_EXAMPLE, arrival, lambda: sent.append(store.send(
            arrival.sender, arrival.inbox, arrival.type, arrival.content, format="json")))
    finally:
        person.close()
    assert [(o.state, o.tasks) for o in outcomes] == [
        ("success", {"handle_arrivals": "success"})], outcomes
    (run,) = [r for r in client.runs(EVENT_EXAMPLE)]
    assert run["run_type"] == "asset_triggered", run
    assert store.get(sent[0].envelope_id).consumed_at is not None


FAILING_EXAMPLE = '''
"""An example that fails: the headless demo must say so with its exit code."""
from datetime import datetime

from airflow.sdk import dag, task


@dag(dag_id="agentpost_failing_example", schedule=None, start_date=datetime(2026, 1, 1),
     tags=["example"])
def failing():
    @task(retries=0)
    def boom():
        raise RuntimeError("this example fails")

    boom()


failing()
'''


def test_an_expected_failure_counts_only_when_it_compensated() -> None:
    """A run of a DAG tagged expect-failure is as designed only when it failed after
    compensating (undo tasks succeeded, listed in the order they ran); its success, or a
    failure without compensation or with a failed undo, is unexpected."""
    saga = {"flight": "success", "hotel": "success", "payment": "failed",
            "undo_payment": "skipped", "undo_hotel": "success", "undo_flight": "success",
            "booking_outcome": "failed"}
    ended = {"undo_hotel": "2026-01-01T10:00:01", "undo_flight": "2026-01-01T10:00:02"}
    designed = Outcome("agentpost_booking_saga", "failed", saga, ended, expect_failure=True)
    assert designed.ok and designed.compensated == ["hotel", "flight"]
    assert "agentpost_booking_saga: failed as designed: compensated hotel, flight (" in \
        designed.line()
    for state, tasks in [("success", {**saga, "undo_hotel": "skipped"}),
                         ("failed", {**saga, "undo_hotel": "skipped", "undo_flight": "skipped"}),
                         ("failed", {**saga, "undo_flight": "failed"})]:
        outcome = Outcome("agentpost_booking_saga", state, tasks, ended, expect_failure=True)
        assert not outcome.ok and "NOT AS DESIGNED" in outcome.line(), tasks
    assert not Outcome("agentpost_route_example", "failed", {"split": "failed"}).ok


@pytest.mark.slow
def test_headless_demo_runs_every_scenario_with_dag_test(dsn: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """`make demo-headless` on a copy of dags/: the fleet file applied, every example run
    (the booking saga failing as designed, the command confirmed by the demo's person), the
    event-driven example started by the arrival its own trigger reported, the fleet's source
    agents and boundary until each driver parked on its own spot, the dispatcher reading its
    inbox, maintenance last; exit 0 and a verified trail."""
    dags = tmp_path / "dags"
    shutil.copytree(DAGS, dags, ignore=shutil.ignore_patterns("__pycache__"))
    assert run_headless_demo(dsn, dags_folder=dags) == 0, capsys.readouterr().out[-6000:]
    out = capsys.readouterr().out
    assert "nothing to change" not in out and "create workspace triage" in out  # fleet apply
    for line in (
            f"{EXAMPLE}: success (book_room=success, charge_card=success, receipt=success)",
            "agentpost_booking_saga: failed as designed: compensated hotel, flight (",
            "agentpost_coordinator_example: success (", "agentpost_route_example: success (",
            f"{EVENT_EXAMPLE}: success (handle_arrivals=success)",
            f"ok   {EVENT_EXAMPLE} handled its arrival: envelope ",
            "boundary_city: success (resolve=success)",
            "agent_city_weather-poller: success (activate=success)",
            "agent_city_dispatcher: success (activate=success)",
            "agentpost_maintenance: success (archive_and_prune=success, checkpoint=success, "
            "maintain=success, verify=success)",
            "ok   every contender holds its own resource after the boundaries: driver-a on "
            "spot-3, driver-b on spot-1, driver-c on spot-2",
            "dana confirms command", ", verified", "every one as expected"):
        assert line in out, (line, out[-6000:])
    with EnvelopeStore(dsn) as store:
        assert store.inbox("dispatch") == [] and store.inbox("triage") == []
        assert store.inbox("travel-desk") == []  # dana's confirmation was consumed
        compensated = [e.body["step"] for e in store.trail(event="saga_step_compensated")]
        assert compensated == ["hotel", "flight"]


@pytest.mark.slow
def test_headless_demo_fails_on_an_unexpected_failure(dsn: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """An example that fails without being designed to makes the exit code 1 and is named
    (a fleet without agents: only the examples and maintenance run)."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fleet.yaml").write_text("name: tiny\nworkspaces: [{id: tiny-1, role: worker}]\n")
    shutil.copy(DAGS / "agentpost_maintenance.py", dags)
    (dags / "agentpost_failing_example.py").write_text(FAILING_EXAMPLE)
    assert run_headless_demo(dsn, dags_folder=dags) == 1
    out = capsys.readouterr().out
    assert "agentpost_failing_example: failed (boom=failed)" in out, out
    assert "agentpost_maintenance: success" in out
    assert "UNEXPECTED: agentpost_failing_example" in out


@pytest.mark.slow
def test_make_demo_leaves_its_store_where_the_cli_finds_it(dsn: str, pg_server: Any,
                                                           tmp_path: Path) -> None:
    """Issue 22: `agentpost demo --airflow` (make demo) prints its store's DSN; while it
    runs, the CLI in its checkout, with no --dsn and no AGENTPOST_DSN, works on that store
    (before, it created the database `agentpost` and said "unknown workspace"); Ctrl-C stops
    every process it started and withdraws the store, and the CLI no longer finds it. A
    fleet without agents and no DAGs keeps standalone's part short."""
    from dbtools import drop_database
    from test_first_hour import SCRIPT, checkout, cli

    root = checkout(tmp_path / "repo")
    (root / "dags").mkdir()
    (root / "dags" / "fleet.yaml").write_text(
        "name: tiny\nworkspaces: [{id: lead, role: coordinator},\n"
        "             {id: worker-a, role: worker, parent: lead}]\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENTPOST_DSN"}
    demo = subprocess.Popen([str(SCRIPT), "--dsn", dsn, "demo", "--airflow"], cwd=root,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(demo.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("Airflow keeps running" in ln for ln in output)
                   or demo.poll() is not None, 600, "the demo to come up", interval=1.0)
        text = "".join(output)
        assert "Airflow keeps running" in text, text[-6000:]
        assert f"  store:    {redact_dsn(dsn)}\n" in text, text[-6000:]
        sent = cli("send", "--from", "lead", "--to", "worker-a", "--type", "directive",
                   "hello, demo", cwd=root)
        assert sent.returncode == 0, sent.stderr
        inbox = cli("inbox", "worker-a", cwd=root)
        assert inbox.returncode == 0 and "hello, demo" in inbox.stdout, inbox.stderr
        assert f"using the store of the demo running here (pid {demo.pid})" in inbox.stderr
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
        try:
            demo.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        reader.join(30)
        drop_database(pg_server.dsn, f"{dsn.rsplit('/', 1)[1]}_airflow")
    text = "".join(output)
    assert "agentpost demo: stopped, 0 process(es) left" in text, text[-6000:]
    assert not (root / ".airflow-demo" / "store.json").exists()
    assert running_demo_store(root) is None


def test_a_poll_the_api_server_does_not_answer_in_time_is_not_yet() -> None:
    """Under load the API server can take longer than the client's timeout for one GET; the
    wait goes on (the bench's sensor wait failed on one ReadTimeout) and only its own deadline
    ends it."""
    answers = iter([httpx.ReadTimeout("busy"), None, "done"])

    def probe() -> Any:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(probe, 5, "the probe", interval=0) == "done"

    def never() -> Any:
        raise httpx.ReadTimeout("busy")

    with pytest.raises(httpx.ReadTimeout):
        wait_until(never, 0, "the probe", interval=0)
