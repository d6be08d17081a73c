"""The example DAGs on a real Airflow (`make demo`) or under `dag.test()` (`make demo-headless`).

Both run the same scenarios: every DAG of the DAGs folder whose id starts with ``agentpost_``
and that is tagged ``example``, against a fresh store database ``agentpost_demo`` set up with
the demo fleet. A person of the demo (``dana``) answers every command that waits for a
confirmation through the human highway, as someone at `agentpost command confirm` would.

- `run_airflow_demo`: `airflow standalone` through `AirflowRuntime`; unpause, trigger and
  wait over the REST API; print the UI address, the login and the trail; keep running until
  Ctrl-C, which stops every process started.
- `run_headless_demo`: no servers; each DAG's `dag.test()` in a child process with its own
  AIRFLOW_HOME and SQLite metadata; exit non-zero if any run fails.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentpost.airflow_runtime import (
    AirflowClient,
    AirflowRuntime,
    connection_json,
    private_environment,
)
from agentpost.store import CommandLedger, EnvelopeStore
from agentpost.store.bootstrap import create_database, find_server
from agentpost.store.migrations import migrate
from agentpost.store.server import find_repo_root

DEMO_DATABASE = "agentpost_demo"
PERSON = "dana"
EXAMPLE_PREFIX = "agentpost_"
EXAMPLE_TAG = "example"
RESULT_MARK = "AGENTPOST-RESULT "
RUN_TIMEOUT = 600.0


def apply_demo_fleet(store: EnvelopeStore) -> None:
    """The roles, envelope types and workspaces the example DAGs need.

    Applying it again changes nothing. Merge note: once `agentpost fleet apply FILE` exists,
    this becomes applying the demo's fleet file; add what new example DAGs need there.
    """
    store.define_role("agent")  # roles and types are upserts; workspaces are not
    for action in ("room.book", "card.charge"):
        store.register_type(action, ["agent"], ["agent"])
    existing = {ws.id for ws in store.workspaces()}
    if "travel-desk" not in existing:
        store.create_workspace("agent", workspace_id="travel-desk", originator=PERSON)


def is_example(dag_id: str, tags: list[str] | tuple[str, ...] | set[str]) -> bool:
    """Whether the demo runs this DAG."""
    return dag_id.startswith(EXAMPLE_PREFIX) and EXAMPLE_TAG in tags


class DemoPerson:
    """The demo's person: confirms every command that waits for a confirmation, found on the
    trail (``command.confirmation.requested``) and answered through the human highway."""

    def __init__(self, store: EnvelopeStore, name: str = PERSON,
                 say: Callable[[str], None] = print) -> None:
        self.ledger = CommandLedger(store)
        self.store = store
        self.name = name
        self.say = say
        self._after = 0

    def answer(self) -> list[str]:
        """Confirm what is waiting now; the ids confirmed."""
        confirmed = []
        for event in self.store.trail(event="command_state_change", after=self._after):
            self._after = event.id
            if event.body.get("event") != "command.confirmation.requested":
                continue
            command_id = event.body["lifecycle"]["command_id"]
            if self.ledger.view(command_id).state.value == "confirmation_required":
                self.ledger.confirmation_envelope(self.name, command_id, "confirm")
                self.say(f"  {self.name} confirms command {command_id[:8]} "
                         f"({event.body.get('action')})")
                confirmed.append(command_id)
        return confirmed

    def close(self) -> None:
        self.ledger.close()


def prepare_store(dsn: str | None) -> str:
    """The demo's store: `dsn` migrated, or a fresh ``agentpost_demo`` found by discovery;
    with the demo fleet applied."""
    if dsn is None:
        dsn = create_database(find_server().dsn, DEMO_DATABASE, fresh=True)
    migrate(dsn)
    with EnvelopeStore(dsn) as store:
        apply_demo_fleet(store)
    return dsn


def trail_summary(store: EnvelopeStore) -> list[str]:
    """Lines that say what the trail holds and whether it verifies."""
    events = store.trail()
    counts = Counter(e.event for e in events)
    result = store.verify_trail()
    verdict = "verified" if result.ok else f"FAILED: {result.failure}"
    lines = [f"trail: {len(events)} entries in {result.chains} chains, {verdict}"]
    lines += [f"  {count:>4}  {event}" for event, count in sorted(counts.items())]
    return lines


@dataclass
class Outcome:
    """How one example DAG's run ended."""

    dag_id: str
    state: str
    tasks: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.state == "success"

    def line(self) -> str:
        tasks = ", ".join(f"{t}={s}" for t, s in sorted(self.tasks.items()))
        return f"  {self.dag_id}: {self.state} ({tasks})"


def _finish(dsn: str, outcomes: list[Outcome]) -> int:
    """Print the outcomes and the trail; the exit code."""
    print("\n== Runs")
    for outcome in outcomes:
        print(outcome.line())
    if not outcomes:
        print(f"  no DAG with an id starting {EXAMPLE_PREFIX!r} tagged {EXAMPLE_TAG!r}")
    print("\n== Trail")
    with EnvelopeStore(dsn) as store:
        lines = trail_summary(store)
        verified = store.verify_trail().ok
    print("\n".join(lines))
    return 0 if outcomes and all(o.ok for o in outcomes) and verified else 1


# ----------------------------------------------------------------------------- real Airflow


def run_airflow_demo(dsn: str | None = None, *, keep_running: bool = True) -> int:
    """`make demo`: the examples on `airflow standalone`, then wait for Ctrl-C."""
    _interrupt_on_signals()
    dsn = prepare_store(dsn)
    root = find_repo_root()
    home = root / ".airflow-demo"
    shutil.rmtree(home, ignore_errors=True)
    runtime = AirflowRuntime(dsn, dags_folder=root / "dags", home=home)
    print(f"agentpost demo: starting Airflow (standalone; log: {runtime.log_path})", flush=True)
    try:
        runtime.start()
        code = _run_examples(runtime, dsn)
        _print_access(runtime)
        if keep_running:
            print("\nAirflow keeps running; Ctrl-C stops it and everything it started.",
                  flush=True)
            try:
                _wait_for_ctrl_c(runtime)
            except KeyboardInterrupt:
                pass  # the way this demo ends: its exit code is the scenarios'
        return code
    except KeyboardInterrupt:
        return 130
    finally:
        print("agentpost demo: stopping Airflow ...", flush=True)
        runtime.stop()
        print(f"agentpost demo: stopped, {len(runtime.processes())} process(es) left")


def _interrupt_on_signals() -> None:
    """Ctrl-C, a closed terminal (SIGHUP) and `kill` (SIGTERM) all stop the demo the same
    way: KeyboardInterrupt, so `finally` stops Airflow (SIGINT is restored too, in case the
    shell that started us in the background made us ignore it)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def _run_examples(runtime: AirflowRuntime, dsn: str) -> int:
    with runtime.client() as client, EnvelopeStore(dsn) as store:
        person = DemoPerson(store)
        try:
            dag_ids = discover_examples(client, runtime.dags_folder)
            print(f"\n== Example DAGs: {', '.join(dag_ids) or 'none'}")
            runs = {}
            for dag_id in dag_ids:
                client.unpause(dag_id)
                runs[dag_id] = client.trigger(dag_id)
                print(f"  triggered {dag_id} ({runs[dag_id]})", flush=True)
            outcomes = [_await(client, dag_id, run_id, person) for dag_id, run_id in runs.items()]
        finally:
            person.close()
    return _finish(dsn, outcomes)


def _await(client: AirflowClient, dag_id: str, run_id: str, person: DemoPerson) -> Outcome:
    state = client.wait_for_run(dag_id, run_id, RUN_TIMEOUT, tick=person.answer)
    tasks = {ti["task_id"]: str(ti["state"]) for ti in client.task_instances(dag_id, run_id)}
    return Outcome(dag_id, state, tasks)


def discover_examples(client: AirflowClient, dags_folder: Path, timeout: float = 180.0
                      ) -> list[str]:
    """The example DAG ids, once the dag-processor has parsed every DAG file of the folder
    (a file that failed to import is reported, not waited for)."""
    files = {p.name for p in dags_folder.glob("*.py") if _might_hold_dags(p)}
    deadline = time.monotonic() + timeout
    while True:
        dags = client.request("GET", "/dags", params={"limit": 1000})["dags"]
        errors = client.request("GET", "/importErrors", params={"limit": 1000})["import_errors"]
        seen = {Path(d["fileloc"]).name for d in dags} | {Path(e["filename"]).name
                                                          for e in errors}
        if files <= seen or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    for error in errors:
        print(f"  import error in {error['filename']}: "
              f"{error['stack_trace'].strip().splitlines()[-1]}")
    return sorted(d["dag_id"] for d in dags
                  if is_example(d["dag_id"], {t["name"] for t in d.get("tags", [])}))


def _might_hold_dags(path: Path) -> bool:
    """Airflow's own safe-mode heuristic: a DAG file mentions both words."""
    text = path.read_text(errors="replace").lower()
    return "airflow" in text and "dag" in text


def _print_access(runtime: AirflowRuntime) -> None:
    login = runtime.credentials()
    print("\n== Airflow")
    print(f"  UI:       {runtime.url}")
    print(f"  login:    {login.username} / {login.password}  (generated into "
          f"{runtime.home / 'simple_auth_manager_passwords.json.generated'})")
    print(f"  log:      {runtime.log_path}", flush=True)


def _wait_for_ctrl_c(runtime: AirflowRuntime) -> None:
    """Block until Ctrl-C (KeyboardInterrupt); fail if standalone dies on its own."""
    while True:
        time.sleep(1.0)
        if runtime.process is not None and runtime.process.poll() is not None:
            raise SystemExit(f"airflow standalone exited on its own ({runtime.process.returncode})"
                             f"; see {runtime.log_path}")


# ----------------------------------------------------------------------------- dag.test()


def run_headless_demo(dsn: str | None = None, dags_folder: Path | None = None) -> int:
    """`make demo-headless`: each example's `dag.test()`, no servers; 1 if any fails."""
    dsn = prepare_store(dsn)
    folder = Path(dags_folder or find_repo_root() / "dags").resolve()
    print(f"agentpost demo --headless: dag.test() of the examples in {folder}", flush=True)
    with tempfile.TemporaryDirectory(prefix="agentpost-headless-") as home, \
            EnvelopeStore(dsn) as store:
        person = DemoPerson(store)
        stop = threading.Event()
        answering = threading.Thread(target=_keep_answering, args=(person, stop), daemon=True)
        answering.start()
        try:
            outcomes = _headless_runs(folder, Path(home), dsn)
        finally:
            stop.set()
            answering.join()
            person.close()
    return _finish(dsn, outcomes)


def _keep_answering(person: DemoPerson, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        person.answer()


def _headless_runs(folder: Path, home: Path, dsn: str) -> list[Outcome]:
    """Run the child that runs the tests; its results."""
    env = private_environment()
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW_CONN_AGENTPOST_DEFAULT": connection_json(dsn),
    })
    proc = subprocess.Popen([sys.executable, "-m", "agentpost.airflow_demo", str(folder)],
                            env=env, cwd=home, stdout=subprocess.PIPE, text=True)
    outcomes = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(RESULT_MARK):
            data = json.loads(line.removeprefix(RESULT_MARK))
            outcomes.append(Outcome(data["dag_id"], data["state"], data["tasks"]))
    if proc.wait() != 0:
        outcomes.append(Outcome("(dag.test runner)", f"exit {proc.returncode}", {}))
    return outcomes


def _test_examples(folder: str) -> int:
    """In the child: load the folder, `dag.test()` every example, one result line each."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.db import initdb

    initdb()
    bag = DagBag(dag_folder=folder)
    for path, error in bag.import_errors.items():
        _report(path, "import_error", {"error": error.strip().splitlines()[-1]})
    for dag_id in sorted(bag.dags):
        dag = bag.dags[dag_id]
        if is_example(dag_id, dag.tags):
            run = dag.test()
            _report(dag_id, str(run.state),
                    {ti.task_id: str(ti.state) for ti in run.get_task_instances()})
    return 0


def _report(dag_id: str, state: str, tasks: dict[str, Any]) -> None:
    print(RESULT_MARK + json.dumps({"dag_id": dag_id, "state": state, "tasks": tasks}),
          flush=True)


if __name__ == "__main__":
    raise SystemExit(_test_examples(sys.argv[1]))
