"""The Airflow side of live delivery (issue 3, "Live delivery": "consumers and Airflow triggers
wait on LISTEN with polling as the fallback, so delivery latency does not depend on a poll
interval"): the agentpost hook and connection, InboxTrigger, and the deferrable InboxSensor.

Triggers run directly under asyncio here, against a real database; the sensor runs inside a
real Airflow with `dag.test()`, in a subprocess with its own AIRFLOW_HOME and a migrated SQLite
metadata database, so this module's Airflow configuration cannot leak into other tests (and
theirs cannot leak in).

The only timing assertions are generous upper bounds, far below the 30 s poll interval, on
"woke on the notification, not on the poll".
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
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException
from airflow.sdk.module_loading import import_string
from psycopg2.extensions import parse_dsn

from agentpost.hooks import AgentpostHook
from agentpost.operators import InboxSensor
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import ConfigurationError, InvalidInput, StoreUnavailable
from agentpost.store import EnvelopeStore
from agentpost.triggers import InboxTrigger, StoreTrigger, available
from agentpost.triggers import inbox as triggers
from dbtools import connect, rows
from test_leases import LONG_TTL, send, topology

POLL = 30.0  # the trigger's poll interval: any wake-up well before it came from NOTIFY
WAKE_BOUND = 10.0  # generous upper bound for "woke up on the notification"
CONN_VAR = "AIRFLOW_CONN_AGENTPOST_DEFAULT"


@pytest.fixture
def inboxes(store: EnvelopeStore) -> EnvelopeStore:
    """boss -> w1, w2, empty inboxes."""
    topology(store, ["w1", "w2"])
    return store


@pytest.fixture
def no_store_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Neither the default connection nor AGENTPOST_DSN is defined."""
    monkeypatch.delenv(CONN_VAR, raising=False)
    monkeypatch.delenv("AGENTPOST_DSN", raising=False)
    return monkeypatch


def connection_json(dsn: str, **extra: Any) -> str:
    """The JSON form of an `agentpost` Airflow connection to the database of `dsn`."""
    p = parse_dsn(libpq_dsn(dsn))
    fields: dict[str, Any] = {"conn_type": "agentpost", "host": p.get("host"),
                              "port": int(p.get("port", 5432)), "login": p.get("user"),
                              "password": p.get("password"), "schema": p.get("dbname")}
    if extra:
        fields["extra"] = extra
    return json.dumps({k: v for k, v in fields.items() if v is not None})


def backends(dsn: str, application: str) -> set[int]:
    """Backends of this database opened under `application` (the listener's connections
    only once they have executed LISTEN)."""
    conn = connect(dsn)
    try:
        found = rows(conn, """
            SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = %s
               AND (application_name <> 'agentpost-listen' OR query ILIKE 'LISTEN%%')""",
                     (application,))
    finally:
        conn.close()
    return {pid for (pid,) in found}


def listening_backends(dsn: str) -> set[int]:
    return backends(dsn, "agentpost-listen")


def wait_for_listener(dsn: str, *, besides: Iterable[int] = (), within: float = 60.0) -> int:
    """The pid of a listener backend (other than `besides`) once one is LISTENing."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        new = listening_backends(dsn) - set(besides)
        if new:
            return min(new)
        time.sleep(0.05)
    raise AssertionError("no listener connected to the store")


def run_trigger(trigger: InboxTrigger, beside: Future[Any] | None = None,
                limit: float = 90.0) -> tuple[dict[str, Any], float]:
    """The first event's payload and the seconds it took (see `first_event`)."""
    event, took = first_event(trigger, beside, limit)
    return event.payload, took


def first_event(trigger: Any, beside: Future[Any] | None = None,
                limit: float = 90.0) -> tuple[Any, float]:
    """The first event the trigger yields and the seconds it took. Fails after `limit`
    seconds, or as soon as the helper running `beside` it fails (the trigger would wait for
    it forever)."""

    async def first() -> Any:
        fired = asyncio.ensure_future(anext(trigger.run()))
        deadline = time.monotonic() + limit
        try:
            while not fired.done():
                await asyncio.wait({fired}, timeout=0.2)
                if beside is not None and beside.done() and beside.exception() is not None:
                    raise beside.exception()  # type: ignore[misc]
                assert time.monotonic() < deadline, "the trigger never fired"
            return fired.result()
        finally:
            fired.cancel()

    started = time.monotonic()
    event = asyncio.run(first())
    return event, time.monotonic() - started


@contextmanager
def in_background(fn: Callable[[], Any]) -> Iterator[Future[Any]]:
    """`fn` running in a thread while the block runs; the block's end waits for it."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(fn)


# -- the hook ------------------------------------------------------------------------------------


def test_hook_builds_the_dsn_from_a_json_connection(dsn: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow side of issue 3: the store is found through an Airflow Connection of type
    `agentpost` (here AIRFLOW_CONN_AGENTPOST_DEFAULT in JSON form) read with the Task SDK; the
    connection wins over AGENTPOST_DSN, and its extra carries the trail key."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn, trail_key="a-key-from-the-connection",
                                                 connect_timeout=7))
    monkeypatch.setenv("AGENTPOST_DSN", "postgresql://nobody@unused.invalid/nothing")
    hook = AgentpostHook()
    built = hook.get_dsn()
    assert built.startswith("postgresql://")
    want = parse_dsn(libpq_dsn(dsn))
    got = parse_dsn(built)
    for key in ("host", "port", "user", "password", "dbname"):
        assert got.get(key) == want.get(key), key
    assert got["connect_timeout"] == "7"
    with hook.get_store() as store:
        assert store.settings.trail_key == "a-key-from-the-connection"
        assert store.workspaces() == [], "not the fresh test database"


def test_hook_quotes_fields_and_prefers_an_explicit_dsn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A password with URI delimiters and a socket directory as host survive the URI; a `dsn`
    in the extra is used as is."""
    monkeypatch.setenv("AIRFLOW_CONN_AP_ODD", json.dumps({
        "conn_type": "agentpost", "host": "/run/postgresql", "login": "agent smith",
        "password": "p@ss:w/rd?#", "schema": "ap db", "port": 5433}))
    got = parse_dsn(AgentpostHook("ap_odd").get_dsn())
    assert (got["host"], got["user"], got["password"], got["dbname"], got["port"]) == (
        "/run/postgresql", "agent smith", "p@ss:w/rd?#", "ap db", "5433")
    monkeypatch.setenv("AIRFLOW_CONN_AP_RAW", json.dumps({
        "conn_type": "agentpost", "host": "ignored", "extra": {"dsn": "host=db dbname=x"}}))
    assert AgentpostHook("ap_raw").get_dsn() == "host=db dbname=x"


def test_hook_falls_back_to_agentpost_dsn(dsn: str, no_store_env: pytest.MonkeyPatch) -> None:
    """Without the connection the hook uses AGENTPOST_DSN (the CLI's configuration); without
    either it says what to configure."""
    with pytest.raises(ConfigurationError, match="AGENTPOST_DSN"):
        AgentpostHook().get_dsn()
    no_store_env.setenv("AGENTPOST_DSN", dsn)
    hook = AgentpostHook()
    assert hook.get_dsn() == dsn
    with hook.get_store() as store:
        assert store.workspaces() == []


# -- the trigger ---------------------------------------------------------------------------------


def test_trigger_wakes_on_notify_not_on_the_poll(inboxes: EnvelopeStore, dsn: str) -> None:
    """Issue 3, Live delivery: a trigger waiting with poll_interval=30 s fires on the NOTIFY of
    a send made 0.5 s after it started listening, long before its poll interval."""
    trigger = InboxTrigger(workspace_id="w1", poll_interval=POLL, dsn=dsn)

    def send_later() -> str:
        wait_for_listener(dsn)
        time.sleep(0.5)
        return send(inboxes, "w1", "wake up")

    with in_background(send_later) as sent:
        payload, took = run_trigger(trigger, sent)
        sent.result(timeout=10)
    assert payload == {"status": "ready", "workspace_id": "w1", "available": 1}
    assert took < WAKE_BOUND, f"took {took:.1f} s: the trigger waited for its poll"


def test_trigger_does_not_miss_a_send_racing_its_first_count(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 3, Live delivery: an envelope delivered just after the trigger's first count (it
    saw 0) and before it waits is not left for the 30 s poll: the trigger LISTENs before it
    counts, so the delivery is either counted or notified."""
    counts: list[int] = []

    def count_then_send(store: EnvelopeStore, ws: str) -> int:
        n = available(store, ws)
        if not counts:
            send(inboxes, "w1", "right after the first count")
        counts.append(n)
        return n

    monkeypatch.setattr(triggers, "available", count_then_send)
    payload, took = run_trigger(InboxTrigger(workspace_id="w1", poll_interval=POLL, dsn=dsn))
    assert counts[0] == 0 and payload["available"] == 1, (counts, payload)
    assert took < WAKE_BOUND, f"took {took:.1f} s: the send racing the first count was missed"


def test_trigger_fires_at_once_when_enough_is_there(inboxes: EnvelopeStore, dsn: str) -> None:
    """The trigger counts before it waits, and counts what a lease could take: leased
    envelopes do not count, `min_envelopes` is honoured, a stream name is accepted."""
    for i in range(3):
        send(inboxes, "w1", f"m{i}")
    inboxes.lease("w1", max=1, ttl=LONG_TTL)
    payload, _ = run_trigger(InboxTrigger(workspace_id="agents/w1/inbox", min_envelopes=2,
                                          poll_interval=POLL, dsn=dsn))
    assert payload == {"status": "ready", "workspace_id": "w1", "available": 2}


def test_trigger_polls_when_nothing_is_notified(inboxes: EnvelopeStore, dsn: str) -> None:
    """Issue 3, "polling as the fallback": an envelope that becomes leasable without any
    notification (a nack delay running out is no transaction, so nothing NOTIFYs) is found by
    the poll."""
    send(inboxes, "w1", "comes back later")
    [lease] = inboxes.lease("w1", ttl=LONG_TTL)
    inboxes.nack(lease.token, delay=1.0)
    assert available(inboxes, "w1") == 0, "the nacked envelope is not held back"
    payload, _ = run_trigger(InboxTrigger(workspace_id="w1", poll_interval=0.3, dsn=dsn))
    assert payload == {"status": "ready", "workspace_id": "w1", "available": 1}


def counted_once(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once the trigger's first count has returned."""
    done = threading.Event()

    def count(store: EnvelopeStore, ws: str) -> int:
        n = available(store, ws)
        done.set()
        return n

    monkeypatch.setattr(triggers, "available", count)
    return done


def test_trigger_survives_losing_its_connections(inboxes: EnvelopeStore, dsn: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 3, Live delivery: when its LISTEN connection and its store connection are
    terminated while it waits (a Postgres restart or failover), the trigger reconnects, rides
    out the failed count and still wakes on the next send's NOTIFY, not the 30 s poll."""
    trigger = InboxTrigger(workspace_id="w1", poll_interval=POLL, dsn=dsn)
    counted = counted_once(monkeypatch)

    def cut_then_send() -> str:
        first = wait_for_listener(dsn)
        assert counted.wait(30), "the trigger never counted"
        admin = connect(dsn)
        try:
            killed = rows(admin, """
                SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database()
                   AND application_name IN ('agentpost', 'agentpost-listen')""")
        finally:
            admin.close()
        assert len(killed) >= 2, "the trigger's connections were not found"
        wait_for_listener(dsn, besides={first})
        time.sleep(0.5)
        with EnvelopeStore(dsn) as fresh:  # the fixture's pooled connections died too
            return send(fresh, "w1", "after the outage")

    with in_background(cut_then_send) as sent:
        payload, took = run_trigger(trigger, sent)
        sent.result(timeout=10)
    assert payload == {"status": "ready", "workspace_id": "w1", "available": 1}
    assert took < WAKE_BOUND + 5, f"took {took:.1f} s: the trigger waited for its poll"


def test_trigger_retries_a_store_that_has_not_answered_yet(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store unreachable at the trigger's first count (a blip while the triggerer starts)
    is retried a few times, a second apart, before the trigger gives up."""
    send(inboxes, "w1", "waiting")
    calls: list[int] = []

    def flaky(store: EnvelopeStore, ws: str) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailable("cannot reach the agentpost store: a blip")
        return available(store, ws)

    monkeypatch.setattr(triggers, "available", flaky)
    payload, _ = run_trigger(InboxTrigger(workspace_id="w1", poll_interval=POLL, dsn=dsn))
    assert payload["status"] == "ready" and len(calls) == 2, (payload, calls)


def assert_cancel_closes_connections(dsn: str, trigger: StoreTrigger) -> None:
    """Cancel `trigger` while it waits on LISTEN; neither its LISTEN connection nor its store
    connections may outlive it."""

    async def cancel_while_waiting() -> None:
        waiting = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.to_thread(wait_for_listener, dsn)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    before = backends(dsn, "agentpost")  # the fixture store's own pool
    asyncio.run(cancel_while_waiting())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            listening_backends(dsn) or backends(dsn, "agentpost") - before):
        time.sleep(0.05)
    assert not listening_backends(dsn), "the listener connection outlived the trigger"
    assert not backends(dsn, "agentpost") - before, "the store connection outlived the trigger"


def test_a_cancelled_trigger_closes_its_connections(inboxes: EnvelopeStore,
                                                    dsn: str) -> None:
    """The triggerer cancels a trigger on the deferral timeout or when the task is cleared:
    the trigger's LISTEN and store connections must not outlive it."""
    assert_cancel_closes_connections(dsn, InboxTrigger(workspace_id="w1", dsn=dsn))


def test_trigger_reports_errors_as_one_line_events(inboxes: EnvelopeStore, dsn: str,
                                                   no_store_env: pytest.MonkeyPatch) -> None:
    """A trigger that cannot watch the inbox ends with an error event (one line, no
    traceback) instead of waiting forever: unknown workspace, no store configured, a store
    that never answers."""
    unknown, _ = run_trigger(InboxTrigger(workspace_id="nobody", dsn=dsn))
    assert unknown["status"] == "error" and unknown["workspace_id"] == "nobody"
    assert unknown["message"].startswith("NotFound: ") and "\n" not in unknown["message"]
    unconfigured, _ = run_trigger(InboxTrigger(workspace_id="w1"))
    assert unconfigured["status"] == "error"
    assert unconfigured["message"].startswith("ConfigurationError: ")
    assert "\n" not in unconfigured["message"]
    nobody_listens = "postgresql://postgres@127.0.0.1:1/nothing?connect_timeout=2"
    unreachable, _ = run_trigger(InboxTrigger(workspace_id="w1", dsn=nobody_listens), limit=30)
    assert unreachable["status"] == "error"
    assert unreachable["message"].startswith("StoreUnavailable: ")


def test_trigger_resolves_its_connection_in_the_triggerer(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a conn_id (what the sensor passes), the trigger reads the connection itself with
    the SDK's async API: no DSN, and so no password, is among its stored kwargs."""
    monkeypatch.setenv("AIRFLOW_CONN_AP_TRIGGER", connection_json(dsn))
    monkeypatch.delenv("AGENTPOST_DSN", raising=False)
    send(inboxes, "w2", "for the trigger")
    trigger = InboxTrigger(workspace_id="w2", conn_id="ap_trigger", poll_interval=POLL)
    assert trigger.serialize()[1]["dsn"] is None
    payload, _ = run_trigger(trigger)
    assert payload == {"status": "ready", "workspace_id": "w2", "available": 1}


def test_trigger_serializes_to_its_classpath_and_kwargs() -> None:
    """Airflow 3.3: serialize() gives the importable classpath and kwargs that rebuild an
    equal trigger; a DSN given explicitly is kept but never shown with its password."""
    trigger = InboxTrigger(workspace_id="w1", min_envelopes=3, poll_interval=2.5,
                           conn_id="ap", dsn="postgresql://u:s3cret@db:5432/ap")
    classpath, kwargs = trigger.serialize()
    assert classpath == "agentpost.triggers.InboxTrigger"
    assert kwargs == {"workspace_id": "w1", "min_envelopes": 3, "poll_interval": 2.5,
                      "conn_id": "ap", "dsn": "postgresql://u:s3cret@db:5432/ap"}
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert "s3cret" not in repr(trigger)
    for bad in ({"min_envelopes": 0}, {"poll_interval": 0}, {"workspace_id": "a/b"}):
        with pytest.raises(InvalidInput):
            InboxTrigger(**{"workspace_id": "w1", **bad})


# -- the sensor outside a DAG run ----------------------------------------------------------------


def test_sensor_pokes_and_turns_trigger_events_into_results(
        inboxes: EnvelopeStore, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensor's poke counts through the connection; execute_complete returns a ready
    event's payload and fails clearly on an error event."""
    monkeypatch.setenv(CONN_VAR, connection_json(dsn))
    sensor = InboxSensor(task_id="wait", workspace_id="w1", min_envelopes=2)
    assert sensor.deferrable and sensor.poke_interval == POLL
    send(inboxes, "w1", "one")
    assert not sensor.poke({})
    send(inboxes, "w1", "two")
    assert sensor.poke({}).xcom_value == {"status": "ready", "workspace_id": "w1",
                                          "available": 2}
    ready = {"status": "ready", "workspace_id": "w1", "available": 2}
    assert sensor.execute_complete({}, ready) == ready
    with pytest.raises(AirflowException, match="cannot watch inbox 'w1': NotFound: gone"):
        sensor.execute_complete({}, {"status": "error", "workspace_id": "w1",
                                     "message": "NotFound: gone"})
    with pytest.raises(ValueError):
        InboxSensor(task_id="bad", workspace_id="w1", min_envelopes=0)


# -- the sensor in a DAG run ---------------------------------------------------------------------

DAG_FILE = '''
"""Written by tests/airflow/test_airflow_inbox.py: two deferrable inbox sensors and a report."""
import json
import os
from datetime import datetime

from airflow.sdk import dag, task

from agentpost.operators import InboxSensor


@dag(dag_id="agentpost_inbox_sensor_test", schedule=None, start_date=datetime(2026, 1, 1))
def inbox_sensor_test():
    ready = InboxSensor(task_id="ready", workspace_id="agents/w1/inbox", timeout=120)
    late = InboxSensor(task_id="late", workspace_id="w2", timeout=120)

    @task
    def report(ready_event, late_event):
        with open(os.environ["AGENTPOST_TEST_REPORT"], "w") as out:
            json.dump({"ready": ready_event, "late": late_event}, out)

    report(ready.output, late.output)


the_dag = inbox_sensor_test()

if __name__ == "__main__":
    from airflow.utils.db import initdb

    initdb()
    run = the_dag.test()
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("AGENTPOST-RESULT " + json.dumps({"run": str(run.state), "tasks": states}), flush=True)
'''


def airflow_env(tmp_path: Path, dsn: str) -> dict[str, str]:
    """A private Airflow: its own home, DAGs folder and SQLite metadata database; the store
    only through the `agentpost_default` connection."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "_AIRFLOW")) and k != "AGENTPOST_DSN"}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        CONN_VAR: connection_json(dsn),
        "AGENTPOST_TEST_REPORT": str(tmp_path / "report.json"),
    })
    return env


@pytest.mark.slow
def test_deferrable_sensor_in_dag_test(inboxes: EnvelopeStore, dsn: str,
                                       tmp_path: Path) -> None:
    """Issue 3, Live delivery, in Airflow: under `dag.test()` a deferrable InboxSensor whose
    inbox already holds an envelope succeeds at once; one whose inbox is empty defers to
    InboxTrigger (which connects its listener through the `agentpost_default` connection),
    and succeeds when an envelope is sent a second later; both hand their event to XCom."""
    send(inboxes, "w1", "already there")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "inbox_sensor_test.py").write_text(DAG_FILE)

    def send_after_deferral() -> str:
        wait_for_listener(dsn, within=120)
        time.sleep(1.0)
        return send(inboxes, "w2", "arrives after deferral")

    with in_background(send_after_deferral) as sent:
        proc = subprocess.run([sys.executable, str(dags / "inbox_sensor_test.py")],
                              env=airflow_env(tmp_path, dsn), cwd=tmp_path,
                              capture_output=True, text=True, timeout=180, check=False)
        sent.result(timeout=10)
    output = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and lines, output[-4000:]
    result = json.loads(lines[-1].removeprefix("AGENTPOST-RESULT "))
    assert result == {"run": "success", "tasks": {"ready": "success", "late": "success",
                                                  "report": "success"}}, output[-4000:]
    assert output.count("running trigger in line") == 1, "exactly one sensor deferred"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == {"ready": {"status": "ready", "workspace_id": "w1", "available": 1},
                      "late": {"status": "ready", "workspace_id": "w2", "available": 1}}
