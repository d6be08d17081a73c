"""Soak the deferral path under a real ``airflow standalone``: many DAG runs whose
InboxSensor defers, with the envelope delivered the moment the task instance is deferred
(the trigger then finds it at its first check and fires at once: the race in
docs/airflow.md, "Sensors and triggers"). Runs alternate between the sensor as shipped
(it ends the task from the triggerer) and ``end_from_trigger=False`` (the event resumes the
task on a worker, the path the settle hold protects); every successful run's XCom must be
the sensor's result.

    python -m agentpost.benchmarks.airflow_soak --runs 200 --concurrency 4
    python -m agentpost.benchmarks.airflow_soak --runs 40 --settle 0   # without the hold

It needs a Postgres server it may create databases on (``--admin-dsn``, default
postgresql://postgres@127.0.0.1:5432/postgres) and ``asyncpg`` in the environment (Airflow's
metadata DB on Postgres needs it). Everything is private: an AIRFLOW_HOME and a database
(Airflow's metadata and the store's schema side by side) made for the soak and removed after
it, the API on 127.0.0.1 on a free port. Standalone is stopped with SIGINT to its process
group. The last line printed is the result, as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg2

from agentpost.pg.server import dsn_for_database

DAG_ID = "agentpost_soak"
RESUMED_DAG_ID = "agentpost_soak_resumed"
TASK_ID = "wait"
FINAL = {"success", "failed"}

DAG_FILE = '''
"""Written by agentpost.benchmarks.airflow_soak: one deferrable InboxSensor per run."""
from datetime import datetime

from airflow.sdk import dag

from agentpost.operators import InboxSensor


@dag(dag_id="{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     max_active_runs=64, default_args={{"retries": 0}})
def soak():
    InboxSensor(task_id="{task_id}", workspace_id="{{{{ dag_run.conf['ws'] }}}}",
                poke_interval=30, timeout=300, settle={settle!r})


@dag(dag_id="{resumed_dag_id}", schedule=None, start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=64, default_args={{"retries": 0}})
def soak_resumed():
    InboxSensor(task_id="{task_id}", workspace_id="{{{{ dag_run.conf['ws'] }}}}",
                poke_interval=30, timeout=300, settle={settle!r}, end_from_trigger=False)


soak()
soak_resumed()
'''


EVENTS_DAG_ID = "agentpost_soak_events"
EVENTS_WS = "events"
EVENTS_DAG_FILE = f'''
"""Written by agentpost.benchmarks.airflow_soak: an event-driven agent on inbox {EVENTS_WS!r}."""
from agentpost.factories.reactive import reactive_agent_dag

reactive_agent_dag("{EVENTS_DAG_ID}", "{EVENTS_WS}", poll_interval=2.0)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A new database for the soak, dropped afterwards; yields its DSN."""
    name = f"agentpost_soak_{uuid.uuid4().hex[:10]}"
    conn = psycopg2.connect(admin_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield dsn_for_database(admin_dsn, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def airflow_env(home: Path, dags: Path, dsn: str, port: int) -> dict[str, str]:
    """A private Airflow on Postgres, the store through the `agentpost_default` connection."""
    parts = urlsplit(dsn)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "_AIRFLOW")) and k != "AGENTPOST_DSN"}
    env.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": urlunsplit(
            parts._replace(scheme="postgresql+psycopg2")),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__CORE__PARALLELISM": "16",
        "AIRFLOW_CONN_AGENTPOST_DEFAULT": json.dumps({
            "conn_type": "agentpost", "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 5432, "login": parts.username, "password": parts.password,
            "schema": parts.path.lstrip("/")}),
    })
    return env


@dataclass
class Standalone:
    """``airflow standalone`` in its own process group; `stop` sends SIGINT to the group
    and waits, killing it only if it does not stop."""

    env: dict[str, str]
    log: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        subprocess.run(["airflow", "db", "migrate"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = self.log.open("wb")
        self.proc = subprocess.Popen(["airflow", "standalone"], env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, within: float = 90.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGINT)
        try:
            self.proc.wait(within)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the group's stragglers (workers, gunicorn)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.killpg(pgid, signal.SIGKILL)

    def password(self, within: float = 180.0) -> str:
        path = Path(self.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().strip():
                return json.loads(path.read_text())["admin"]
            self.check_alive()
            time.sleep(0.5)
        raise TimeoutError("standalone never wrote its admin password")

    def wait_for_api(self, within: float = 180.0) -> None:
        deadline = time.monotonic() + within
        while not port_open(self.port):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the API never listened on port {self.port}")
            time.sleep(0.5)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"airflow standalone exited ({self.proc.returncode}):\n{tail}")


class Api:
    """The REST API (/api/v2) with a SimpleAuthManager token."""

    def __init__(self, port: int, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.base, timeout=30)
        token = self.client.post("/auth/token", json={"username": "admin",
                                                      "password": password})
        token.raise_for_status()
        self.client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def get(self, path: str) -> httpx.Response:
        return self.client.get("/api/v2" + path)

    def wait_for_dag(self, dag_id: str, within: float = 180.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.get(f"/dags/{dag_id}").status_code == 200:
                self.client.patch(f"/api/v2/dags/{dag_id}",
                                  json={"is_paused": False}).raise_for_status()
                return
            time.sleep(1)
        raise TimeoutError(f"DAG {dag_id} was never parsed")

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        resp = self.client.post(f"/api/v2/dags/{dag_id}/dagRuns",
                                json={"logical_date": None, "conf": conf})
        resp.raise_for_status()
        return resp.json()["dag_run_id"]

    def ti_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        resp = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        return resp.json().get("state") if resp.status_code == 200 else None

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        resp = self.get(f"/dags/{dag_id}/dagRuns?limit=100")
        return resp.json().get("dag_runs", []) if resp.status_code == 200 else []

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        resp = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                        "/xcomEntries/return_value?deserialize=true")
        return resp.json().get("value") if resp.status_code == 200 else None

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        resp = self.get(f"/dags/{dag_id}/dagRuns/{run_id}")
        return resp.json().get("state") if resp.status_code == 200 else None


@dataclass
class Tally:
    runs: int = 0
    success: int = 0
    failed: list[str] = field(default_factory=list)
    never_deferred: int = 0
    wrong_xcom: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, run_id: str, state: str, deferred: bool, took: float,
            xcom_ok: bool) -> None:
        with self.lock:
            self.runs += 1
            self.never_deferred += not deferred
            if state == "success":
                self.success += 1
                self.seconds.append(took)
                if not xcom_ok:
                    self.wrong_xcom.append(run_id)
            else:
                self.failed.append(f"{run_id}: {state}")


def one_run(api: Api, dsn: str, tally: Tally, dag_id: str = DAG_ID,
            limit: float = 240.0) -> None:
    """A workspace of its own, a run that waits on it, the envelope sent the moment the
    sensor is deferred, then the run's end and the sensor's XCom."""
    from agentpost.store import EnvelopeStore

    with EnvelopeStore(dsn) as store:
        ws = store.create_workspace("worker", parent="boss").id
        started = time.monotonic()
        run_id = api.trigger(dag_id, {"ws": ws})
        deferred = False
        state = None
        while time.monotonic() - started < limit:
            if not deferred and api.ti_state(dag_id, run_id, TASK_ID) == "deferred":
                deferred = True
                store.send("boss", ws, "directive", "soak")
            state = api.run_state(dag_id, run_id)
            if state in FINAL:
                break
            time.sleep(0.1 if not deferred else 0.5)
    took = time.monotonic() - started
    xcom_ok = state != "success" or api.xcom(dag_id, run_id, TASK_ID) == {
        "status": "ready", "workspace_id": ws, "available": 1}
    tally.add(f"{dag_id}/{run_id}", state or "timeout", deferred, took, xcom_ok)


def watching(dsn: str, watcher: str) -> bool:
    """Whether the event watcher has made its first claim (arrivals count from then on)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM agentpost.event_watchers WHERE watcher = %s",
                        (watcher,))
            return cur.fetchone() is not None
    finally:
        conn.close()


def event_driven(api: Api, dsn: str, arrivals: int, limit: float = 240.0) -> dict[str, Any]:
    """Send `arrivals` envelopes to the event-driven DAG's inbox once its watcher runs;
    every one must be handled by exactly one run (the ids its runs returned)."""
    from agentpost.store import EnvelopeStore

    deadline = time.monotonic() + limit
    while not watching(dsn, f"asset:agentpost-inbox-{EVENTS_WS}"):
        if time.monotonic() > deadline:
            return {"error": "the inbox watcher never started"}
        time.sleep(1)
    with EnvelopeStore(dsn) as store:
        sent = [store.send("boss", EVENTS_WS, "directive", f"event {i}").envelope_id
                for i in range(arrivals)]
    handled: list[str] = []
    while time.monotonic() < deadline:
        done = [r for r in api.runs(EVENTS_DAG_ID) if r.get("state") in FINAL]
        handled = [a["envelope_id"] for r in done
                   for a in api.xcom(EVENTS_DAG_ID, r["dag_run_id"], "handle_arrivals") or []]
        if sorted(handled) == sorted(sent):
            time.sleep(5)  # and no run more
            break
        time.sleep(1)
    runs = api.runs(EVENTS_DAG_ID)
    return {"sent": len(sent), "handled": len(handled),
            "each_once": sorted(handled) == sorted(sent), "runs": len(runs),
            "failed_runs": sum(r.get("state") == "failed" for r in runs)}


#: which sensors a soak runs: alternating, or only one kind
MODES = {"both": (DAG_ID, RESUMED_DAG_ID), "triggerer": (DAG_ID,),
         "worker": (RESUMED_DAG_ID,)}


def soak(runs: int, concurrency: int, settle: float | None, admin_dsn: str,
         keep: Path | None = None, events: int = 0, mode: str = "both",
         triggerers: int = 1, kill: bool = False) -> dict[str, Any]:
    """Run the soak; the result as a dict (see `main`). `triggerers=2` runs a second
    ``airflow triggerer`` beside standalone's (agentpost.benchmarks.airflow_triggerers) and
    first holds sensors deferred over both; `kill` kills the second with SIGKILL while it
    holds some."""
    from agentpost.benchmarks import airflow_triggerers as two
    from agentpost.store import EnvelopeStore

    home = Path(tempfile.mkdtemp(prefix="agentpost-soak-"))
    try:
        with scratch_database(admin_dsn) as dsn:
            with EnvelopeStore(dsn) as store:
                store.migrate()
                store.create_workspace("coordinator", workspace_id="boss")
                store.create_workspace("worker", parent="boss", workspace_id=EVENTS_WS)
            dags = home / "dags"
            dags.mkdir()
            hold = None if settle is None else float(settle)
            (dags / "agentpost_soak.py").write_text(
                DAG_FILE.format(dag_id=DAG_ID, resumed_dag_id=RESUMED_DAG_ID, task_id=TASK_ID,
                                settle=hold))
            if events:
                (dags / "agentpost_soak_events.py").write_text(EVENTS_DAG_FILE)
            port = free_port()
            env = airflow_env(home / "home", dags, dsn, port)
            if triggerers == 2:
                env = two.triggerer_env(env)
            standalone = Standalone(env, home / "standalone.log", port)
            extra = two.ExtraTriggerer(env, home / "triggerer.log")
            spread = two.Spread(dsn)
            (home / "home").mkdir()
            tally = Tally()
            began = time.monotonic()
            held = None
            try:
                standalone.start()
                password = standalone.password()
                standalone.wait_for_api()
                api = Api(port, password)
                api.wait_for_dag(DAG_ID)
                api.wait_for_dag(RESUMED_DAG_ID)
                if events:
                    api.wait_for_dag(EVENTS_DAG_ID)
                if triggerers == 2:
                    extra.start()
                    two.wait_for(lambda: len(two.alive_triggerers(dsn)) == 2,
                                 "the second triggerer's heartbeat",
                                 alive=standalone.check_alive)
                    spread.start()
                    if kill:
                        held = two.held_across_a_kill(api, dsn, extra, spread, DAG_ID,
                                                      TASK_ID, standalone.check_alive)
                with ThreadPoolExecutor(concurrency) as pool:
                    dag_ids = MODES[mode]
                    for f in [pool.submit(one_run, api, dsn, tally,
                                          dag_ids[i % len(dag_ids)])
                              for i in range(runs)]:
                        f.result()
                events_result = event_driven(api, dsn, events) if events else None
            finally:
                spread.stop()
                extra.stop()
                standalone.stop()
                log = standalone.log.read_text(errors="replace")
                if keep is not None:
                    shutil.copy(standalone.log, keep)
            mismatches = log.count("but the task instance's state attribute is")
            seconds = sorted(tally.seconds) or [0.0]
            return {"runs": tally.runs, "success": tally.success, "failed": len(tally.failed),
                    "failures": tally.failed[:10], "state_mismatches": mismatches,
                    "wrong_xcom": len(tally.wrong_xcom),
                    "never_deferred": tally.never_deferred, "settle": settle, "mode": mode,
                    "concurrency": concurrency,
                    "median_run_s": round(seconds[len(seconds) // 2], 2),
                    "wall_s": round(time.monotonic() - began, 1),
                    "port_left_open": port_open(port), "event_driven": events_result,
                    "triggerers": None if triggerers == 1 else {
                        "count": triggerers, "held_across_kill": held,
                        "spread": len(spread.seen),
                        "triggers_by_triggerer": sorted(len(t) for t in spread.seen.values()),
                        "extra_left_running": extra.proc is not None
                        and extra.proc.poll() is None}}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--settle", type=float, default=None,
                        help="the sensors' settle time (default: theirs; 0: no hold)")
    parser.add_argument("--admin-dsn", default=os.environ.get(
        "AGENTPOST_SOAK_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--events", type=int, default=3,
                        help="envelopes for the event-driven DAG check after the soak (0: none)")
    parser.add_argument("--mode", choices=sorted(MODES), default="both",
                        help="sensors ending from the triggerer, resumed on a worker, or "
                             "alternating (default)")
    parser.add_argument("--triggerers", type=int, choices=(1, 2), default=1,
                        help="2: a second airflow triggerer beside standalone's")
    parser.add_argument("--kill", action="store_true",
                        help="with --triggerers 2: SIGKILL the second while it holds sensors")
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy standalone's log here")
    args = parser.parse_args(argv)
    result = soak(args.runs, args.concurrency, args.settle, args.admin_dsn, args.keep_log,
                  args.events, args.mode, args.triggerers, args.kill)
    print(json.dumps(result), flush=True)
    events = result["event_driven"]
    ok = result["failed"] == 0 and result["state_mismatches"] == 0 and (
        result["wrong_xcom"] == 0) and (
        events is None or (events.get("each_once") and not events.get("failed_runs")))
    return 0 if ok and not result["port_left_open"] else 1


if __name__ == "__main__":
    sys.exit(main())
