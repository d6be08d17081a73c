"""Every example of dags/ on a real Airflow (`make demo`) or under `dag.test()` (`make
demo-headless`).

Both set up a fresh store database of their own (``agentpost_demo``,
``agentpost_demo_headless``: `agentpost.demo.store`) by applying the DAGs folder's fleet.yaml
(what `agentpost fleet apply` does), sign the trail with a generated key unless
AGENTPOST_TRAIL_KEY is set, and play the scenarios of `agentpost.demo.scenarios` in the same
order; a person of the demo (``dana``) answers every command that waits for a confirmation
through the human highway, as someone at `agentpost command confirm` would.
The summary lists each run with its outcome, the checks made in the store and the trail.
The exit code is 0 only when every run ended as expected (a run of a DAG tagged
``expect-failure`` fails and compensates) and the trail verifies.

- `run_airflow_demo`: `airflow standalone` through `AirflowRuntime`, driven over REST
  (`RestRunner`); keeps running until Ctrl-C, which stops every process started. While it
  runs, its store is published where the CLI finds it (`agentpost.demo.store`).
- `run_headless_demo`: no servers; `dag.test()` in one child process with its own
  AIRFLOW_HOME and SQLite metadata (`ChildRunner`, `agentpost.demo.child`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from agentpost.demo.child import DSN_VAR
from agentpost.demo.scenarios import (
    EXAMPLE_PREFIX,
    EXAMPLE_TAG,
    FLEET_FILE,
    Arrival,
    Check,
    Demo,
    Outcome,
    is_example,
    load_demo_fleet,
)
from agentpost.demo.store import (
    AIRFLOW_DATABASE,
    HEADLESS_DATABASE,
    demo_home,
    demo_trail_key,
    publish,
    withdraw,
)
from agentpost.fleet import apply as apply_fleet
from agentpost.fleet import describe, load_fleet
from agentpost.pg.bootstrap import create_database, find_server
from agentpost.pg.migrations import migrate
from agentpost.pg.server import find_repo_root, redact_dsn
from agentpost.protocol.errors import AgentpostError, InvalidInput, one_line
from agentpost.standalone import (
    SPARK_LOCAL,
    TERMINAL_RUN_STATES,
    AirflowClient,
    AirflowRuntime,
    connection_json,
    private_environment,
    wait_until,
)
from agentpost.store import CommandLedger, EnvelopeStore

__all__ = ["DemoPerson", "Outcome", "apply_demo_fleet", "is_example", "prepare_store",
           "run_airflow_demo", "run_headless_demo", "trail_summary"]

DEMO_DATABASE = AIRFLOW_DATABASE
PERSON = "dana"
#: the child's line protocol (agentpost.demo.child)
MARK = "AGENTPOST-"
RUN_TIMEOUT = 600.0
#: a reactive agent's inbox is read once it stayed empty, with no run going, this long
QUIET = 10.0


def apply_demo_fleet(dsn: str, dags_folder: Path) -> None:
    """Apply the DAGs folder's fleet file as `agentpost fleet apply FILE` does, printing what
    it changed and an error in the CLI's one line; idempotent. The file declares every
    example's topology."""
    path = dags_folder / FLEET_FILE
    try:
        fleet = load_fleet(str(path))
        with EnvelopeStore(dsn) as store:
            result = apply_fleet(store, fleet)
    except AgentpostError as exc:
        print(f"agentpost: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(f"agentpost demo: applying {path} failed") from None
    print(describe(result, applied=True))


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
        self._lock = threading.Lock()

    def answer(self) -> list[str]:
        """Confirm what is waiting now; the ids confirmed."""
        with self._lock:
            return self._answer()

    def _answer(self) -> list[str]:
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


def dags_folder_of(dags_folder: Path | str | None) -> Path:
    """The DAGs folder a demo plays: the given one, else the checkout's ``dags/``; it must
    hold the fleet file (InvalidInput, before anything is created, when it does not)."""
    folder = Path(dags_folder or find_repo_root() / "dags").resolve()
    if not (folder / FLEET_FILE).is_file():
        where = "the given DAGs folder" if dags_folder else "a checkout of agentpost"
        raise InvalidInput(
            f"no {FLEET_FILE} in {folder}: the Airflow demos play the example DAGs and their "
            f"fleet file, found in {where}; run it in a checkout of the agentpost repository, "
            "or pass --dags-folder with a folder holding them")
    return folder


def prepare_store(dsn: str | None, dags_folder: Path,
                  database: str = DEMO_DATABASE) -> str:
    """The demo's store: `dsn` migrated, or a fresh `database` found by discovery (signed
    with a generated key unless AGENTPOST_TRAIL_KEY is set); with the fleet file of
    `dags_folder` applied."""
    if dsn is None:
        dsn = create_database(find_server().dsn, database, fresh=True)
        demo_trail_key()
    migrate(dsn)
    print(f"\n== Fleet: agentpost fleet apply {dags_folder / FLEET_FILE}", flush=True)
    apply_demo_fleet(dsn, dags_folder)
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


def _finish(dsn: str, outcomes: list[Outcome], checks: Sequence[Check] = ()) -> int:
    """Print the runs, the checks and the trail; the exit code."""
    print("\n== Runs")
    for outcome in outcomes:
        print(outcome.line())
    if not outcomes:
        print(f"  no DAG with an id starting {EXAMPLE_PREFIX!r} tagged {EXAMPLE_TAG!r}")
    if checks:
        print("\n== Checks")
        print("\n".join(c.line() for c in checks))
    print("\n== Trail")
    with EnvelopeStore(dsn) as store:
        lines = trail_summary(store)
        verified = store.verify_trail().ok
    print("\n".join(lines))
    unexpected = [o.dag_id for o in outcomes if not o.ok] + [c.what for c in checks if not c.ok]
    ok = bool(outcomes) and not unexpected and verified
    print(f"\nagentpost demo: {len(outcomes)} run(s), " + (
        "every one as expected" if ok else
        f"UNEXPECTED: {', '.join(unexpected) or 'the trail does not verify'}"), flush=True)
    return 0 if ok else 1


def _play(runner: Any, dsn: str, dags: dict[str, set[str]], folder: Path) -> int:
    """The scenarios on `runner`, then the summary; the exit code."""
    with EnvelopeStore(dsn) as store:
        demo = Demo(runner, store, load_demo_fleet(folder), dags,
                    say=lambda line: print(line, flush=True))
        demo.play()
    return _finish(dsn, demo.outcomes, demo.checks)


# ----------------------------------------------------------------------------- real Airflow


def run_airflow_demo(dsn: str | None = None, *, keep_running: bool = True,
                     dags_folder: Path | None = None, home: Path | None = None) -> int:
    """`make demo`: the scenarios on `airflow standalone`, then wait for Ctrl-C. Its store
    is published for the CLI (`agentpost.demo.store`) until it stops."""
    _interrupt_on_signals()
    folder = dags_folder_of(dags_folder)
    had_key = bool(os.environ.get("AGENTPOST_TRAIL_KEY"))
    dsn = prepare_store(dsn, folder)
    home = home or demo_home()
    shutil.rmtree(home, ignore_errors=True)
    runtime = AirflowRuntime(dsn, dags_folder=folder, home=home)
    publish(home, dsn, None if had_key else os.environ.get("AGENTPOST_TRAIL_KEY"))
    print(f"agentpost demo: store {redact_dsn(dsn)}", flush=True)
    print(f"agentpost demo: starting Airflow (standalone; log: {runtime.log_path})", flush=True)
    try:
        runtime.start()
        code = _run_on(runtime, dsn)
        _print_access(runtime, dsn)
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
        withdraw(home)
        runtime.stop()
        print(f"agentpost demo: stopped, {len(runtime.processes())} process(es) left",
              flush=True)


def _interrupt_on_signals() -> None:
    """Ctrl-C, a closed terminal (SIGHUP) and `kill` (SIGTERM) all stop the demo the same
    way: KeyboardInterrupt, so `finally` stops Airflow (SIGINT is restored too, in case the
    shell that started us in the background made us ignore it)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def _run_on(runtime: AirflowRuntime, dsn: str) -> int:
    with runtime.client() as client, EnvelopeStore(dsn) as store:
        person = DemoPerson(store)
        try:
            dags = discover_dags(client, runtime.dags_folder)
            print(f"\n== DAGs: {', '.join(sorted(dags)) or 'none'}", flush=True)
            return _play(RestRunner(client, store, person), dsn, dags, runtime.dags_folder)
        finally:
            person.close()


class RestRunner:
    """`Runner` on a running Airflow, over its REST API; the person answers while it waits."""

    def __init__(self, client: AirflowClient, store: EnvelopeStore, person: DemoPerson,
                 timeout: float = RUN_TIMEOUT) -> None:
        self.client, self.store, self.person, self.timeout = client, store, person, timeout

    def watch(self, dag_ids: Sequence[str], watchers: Sequence[str]) -> None:
        for dag_id in dag_ids:
            self.client.unpause(dag_id)
        for watcher in watchers:
            wait_until(lambda w=watcher: self._watching(w), 180,
                       f"the triggerer to run watcher {watcher}", interval=0.5)
        print(f"  watching: {', '.join(watchers)}", flush=True)

    def _watching(self, watcher: str) -> bool:
        return bool(self.store.db.fetchall(
            "SELECT 1 FROM agentpost.event_watchers WHERE watcher = %s", (watcher,)))

    def run(self, dag_ids: Sequence[str]) -> list[Outcome]:
        runs = []
        for dag_id in dag_ids:
            self.client.unpause(dag_id)
            runs.append((dag_id, self.client.trigger(dag_id)))
        return [self._await(dag_id, run_id) for dag_id, run_id in runs]

    def on_arrival(self, dag_id: str, arrival: Arrival, send: Callable[[], None]
                   ) -> list[Outcome]:
        before = self._run_ids(dag_id)
        send()
        new = wait_until(lambda: sorted(self._run_ids(dag_id) - before), 180,
                         f"a run of {dag_id} started by the arrival", interval=0.5)
        return [self._await(dag_id, run_id) for run_id in new]

    def drain(self, dag_id: str, inbox: str) -> list[Outcome]:
        """Runs start on the arrivals by themselves: wait until the inbox is empty and no
        run went on for `QUIET` seconds; every run of the DAG."""
        quiet_since = [time.monotonic()]

        def settled() -> bool:
            self.person.answer()
            busy = self.store.inbox(inbox) or any(
                r["state"] not in TERMINAL_RUN_STATES for r in self.client.runs(dag_id))
            if busy:
                quiet_since[0] = time.monotonic()
            return time.monotonic() - quiet_since[0] >= QUIET

        wait_until(settled, self.timeout, f"{dag_id} to read inbox {inbox}", interval=1.0)
        return [self._outcome(dag_id, r["dag_run_id"], r["state"])
                for r in self.client.runs(dag_id)]

    def _run_ids(self, dag_id: str) -> set[str]:
        return {r["dag_run_id"] for r in self.client.runs(dag_id)}

    def _await(self, dag_id: str, run_id: str) -> Outcome:
        state = self.client.wait_for_run(dag_id, run_id, self.timeout, tick=self.person.answer)
        return self._outcome(dag_id, run_id, state)

    def _outcome(self, dag_id: str, run_id: str, state: str) -> Outcome:
        found = self.client.task_instances(dag_id, run_id)
        return Outcome(dag_id, state, {_task_key(ti["task_id"], ti.get("map_index", -1)):
                                       str(ti["state"]) for ti in found},
                       {ti["task_id"]: str(ti.get("end_date") or "") for ti in found})


def _task_key(task_id: str, map_index: int | None) -> str:
    return task_id if map_index is None or map_index < 0 else f"{task_id}[{map_index}]"


def discover_dags(client: AirflowClient, dags_folder: Path, timeout: float = 240.0
                  ) -> dict[str, set[str]]:
    """Every parsed DAG's id and tags, once the dag-processor has parsed every DAG file of
    the folder (a file that failed to import is reported, not waited for)."""
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
    return {d["dag_id"]: {t["name"] for t in d.get("tags", [])} for d in dags}


def _might_hold_dags(path: Path) -> bool:
    """Airflow's own safe-mode heuristic: a DAG file mentions both words."""
    text = path.read_text(errors="replace").lower()
    return "airflow" in text and "dag" in text


def _print_access(runtime: AirflowRuntime, dsn: str) -> None:
    login = runtime.credentials()
    print("\n== Airflow")
    print(f"  UI:       {runtime.url}")
    print(f"  agents:   {runtime.url}/agentpost/  (also Browse → Agents in the UI)")
    print(f"  login:    {login.username} / {login.password}  (generated into "
          f"{runtime.home / 'simple_auth_manager_passwords.json.generated'})")
    print(f"  log:      {runtime.log_path}")
    print(f"  store:    {redact_dsn(dsn)}")
    print("  CLI:      agentpost inbox worker-a  (from this checkout, the CLI uses this store "
          "while the demo runs)", flush=True)


def _wait_for_ctrl_c(runtime: AirflowRuntime) -> None:
    """Block until Ctrl-C (KeyboardInterrupt); fail if standalone dies on its own."""
    while True:
        time.sleep(1.0)
        if runtime.process is not None and runtime.process.poll() is not None:
            raise SystemExit(f"airflow standalone exited on its own ({runtime.process.returncode})"
                             f"; see {runtime.log_path}")


# ----------------------------------------------------------------------------- dag.test()


def run_headless_demo(dsn: str | None = None, dags_folder: Path | None = None) -> int:
    """`make demo-headless`: the scenarios under `dag.test()`, no servers; 1 unless every
    run ended as expected."""
    folder = dags_folder_of(dags_folder)
    dsn = prepare_store(dsn, folder, HEADLESS_DATABASE)
    print(f"agentpost demo --headless: dag.test() of the DAGs in {folder}", flush=True)
    with tempfile.TemporaryDirectory(prefix="agentpost-headless-") as home, \
            EnvelopeStore(dsn) as store:
        person = DemoPerson(store)
        stop = threading.Event()
        answering = threading.Thread(target=_keep_answering, args=(person, stop), daemon=True)
        answering.start()
        runner = ChildRunner(folder, Path(home), dsn)
        try:
            dags = runner.start()
            if dags is None:  # the child died before listing the DAGs
                return _finish(dsn, runner.lost())
            print(f"\n== DAGs: {', '.join(sorted(dags)) or 'none'}", flush=True)
            return _play(runner, dsn, dags, folder)
        finally:
            runner.close()
            stop.set()
            answering.join()
            person.close()


def _keep_answering(person: DemoPerson, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        person.answer()


class ChildRunner:
    """`Runner` under `dag.test()`: one child process (agentpost.demo.child) loads
    the DAGs folder once and runs what it is sent, one JSON line per command.

    Without a triggerer or scheduler, the child plays their part for event-driven DAGs: it
    runs the DAG's own `InboxEventTrigger` in-process until it yields the arrival, and hands
    the event's payload to `dag.test()` as the run's ``arrivals`` (the reactive factory's
    manual runs). A fleet's reactive agent reads its whole inbox in one run."""

    def __init__(self, folder: Path, home: Path, dsn: str) -> None:
        self.folder, self.home, self.dsn = folder, home, dsn
        self.log: deque[str] = deque(maxlen=40)  # the tail of the child's output
        self.proc: subprocess.Popen[bytes] | None = None
        self.commands: IO[str] | None = None
        self.answers: IO[str] | None = None
        self.dead = False

    def start(self) -> dict[str, set[str]] | None:
        """Start the child; the DAGs it loaded (None if it died first)."""
        env = private_environment()
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW_CONN_AGENTPOST_DEFAULT": connection_json(self.dsn),
            "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
            DSN_VAR: self.dsn,
        })
        commands_r, commands_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentpost.demo.child", str(self.folder),
             str(commands_r)], env=env, cwd=self.home, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(commands_r,))
        os.close(commands_r)
        self.commands = open(commands_w, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.answers = io.TextIOWrapper(self.proc.stdout, encoding="utf-8", errors="replace")
        kind, found = self._until("DAGS")
        if kind is None:
            return None
        for path, error in found["errors"].items():
            print(f"  import error in {path}: {error}")
        return {d: set(tags) for d, tags in found["dags"].items()}

    def watch(self, dag_ids: Sequence[str], watchers: Sequence[str]) -> None:
        """Nothing to start: each arrival's trigger runs in `on_arrival`."""

    def run(self, dag_ids: Sequence[str]) -> list[Outcome]:
        return self._command({"op": "run", "dags": list(dag_ids)})

    def on_arrival(self, dag_id: str, arrival: Arrival, send: Callable[[], None]
                   ) -> list[Outcome]:
        self._send({"op": "arrival", "dag": dag_id, "inbox": arrival.inbox,
                    "watcher": arrival.watcher})
        if self._until("WATCHING")[0] is None:
            return self.lost()
        send()
        return self._results()

    def drain(self, dag_id: str, inbox: str) -> list[Outcome]:
        return self.run([dag_id])

    def _command(self, command: dict[str, Any]) -> list[Outcome]:
        self._send(command)
        return self._results()

    def _send(self, command: dict[str, Any]) -> None:
        assert self.commands is not None
        try:
            self.commands.write(json.dumps(command) + "\n")
            self.commands.flush()
        except BrokenPipeError:
            pass  # the child is gone: reading its answers says so

    def _results(self) -> list[Outcome]:
        """RESULT lines until DONE."""
        outcomes = []
        while True:
            kind, data = self._line()
            if kind is None:
                return outcomes + self.lost()
            if kind == "RESULT":
                outcomes.append(Outcome(data["dag_id"], data["state"], data["tasks"],
                                        data.get("ended", {})))
            elif kind == "DONE":
                return outcomes

    def _until(self, wanted: str) -> tuple[str | None, Any]:
        """The next `wanted` line (kind, data); (None, None) when the child is gone."""
        while True:
            kind, data = self._line()
            if kind is None or kind == wanted:
                return kind, data

    def _line(self) -> tuple[str | None, Any]:
        """The next protocol line (kind, data); (None, None) when the child is gone."""
        assert self.answers is not None
        for line in iter(self.answers.readline, ""):
            self.log.append(line.rstrip())
            if line.startswith(MARK):
                kind, _, rest = line.removeprefix(MARK).rstrip("\n").partition(" ")
                return kind, json.loads(rest) if rest.strip() else None
        return None, None

    def lost(self) -> list[Outcome]:
        """The child died: say so once, with its log's tail, as a failed outcome."""
        if self.dead:
            return []
        self.dead = True
        code = None if self.proc is None else self.proc.wait()
        print("\n".join(["  the dag.test() process died; its output ends:", *self.log]),
              flush=True)
        return [Outcome("(dag.test runner)", f"exit {code}", {})]

    def close(self) -> None:
        """End the child: it stops at the end of its commands."""
        for stream in (self.commands, self.answers):
            try:
                if stream is not None:
                    stream.close()
            except BrokenPipeError:
                pass
        if self.proc is None:
            return
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
