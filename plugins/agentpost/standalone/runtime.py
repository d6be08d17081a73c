"""`airflow standalone` in a private home, every process it starts stopped afterwards.

`AirflowRuntime` gives:

- a private AIRFLOW_HOME (a temporary directory unless one is given), the given DAGs folder,
  no example DAGs, modest parallelism, the API on 127.0.0.1 at a free port;
- Airflow's metadata in its own database on the store's Postgres server (not SQLite: the
  scheduler and the triggerer write concurrently), created here;
- the `agentpost_default` connection pointing at the store;
- `airflow standalone` started as the leader of a new session, so every process it starts
  (its four components, executor workers, task supervisors and the tasks, which Airflow puts
  in process groups of their own) can be found by session id and stopped: SIGINT to every
  process group of the session first (standalone stops cleanly on it, not on SIGTERM), then
  SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import psutil
from psycopg2.extensions import parse_dsn
from sqlalchemy.engine import URL

from agentpost.pg.bootstrap import create_database, drop_database
from agentpost.pg.server import find_repo_root, libpq_dsn
from agentpost.standalone.client import (
    AirflowClient,
    AirflowError,
    Credentials,
    read_credentials,
    wait_until,
)

COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
LOG_FILE = "standalone.log"
#: first start on a fresh metadata database migrates it: minutes on a busy 2-core machine
START_TIMEOUT = 420.0
#: how long each signal of the stop sequence (SIGINT, SIGTERM) gets before the next one
STOP_GRACE = 30.0


def free_port() -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def sqlalchemy_url(dsn: str) -> str:
    """A libpq DSN (URI or key=value) as the psycopg2 SQLAlchemy URL Airflow's
    ``sql_alchemy_conn`` wants; a socket-directory host goes into the query."""
    params = parse_dsn(libpq_dsn(dsn))
    host = params.pop("host", None)
    port = params.pop("port", None)
    query = dict(params)
    user, password, database = query.pop("user", None), query.pop("password", None), \
        query.pop("dbname", None)
    if host and host.startswith("/"):
        query["host"], host = host, None
    url = URL.create("postgresql+psycopg2", username=user, password=password, host=host,
                     port=int(port) if port else None, database=database, query=query)
    return url.render_as_string(hide_password=False)


#: the `spark_default` connection of the demo: Spark in local mode on every core (without
#: it, SparkSubmitOperator would silently submit to YARN)
SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[*]"})


def connection_json(store_dsn: str) -> str:
    """The `agentpost_default` connection (AIRFLOW_CONN_AGENTPOST_DEFAULT) for a store DSN:
    the DSN travels whole in the extra, which the hook uses instead of the fields."""
    return json.dumps({"conn_type": "agentpost", "extra": {"dsn": libpq_dsn(store_dsn)}})


def private_environment() -> dict[str, str]:
    """Our environment without the caller's Airflow configuration or store DSN: a private
    Airflow is configured whole by its starter, and finds the store only through the
    `agentpost_default` connection it is given."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW", "_AIRFLOW")) and k != "AGENTPOST_DSN"}


def venv_bin() -> Path:
    """The directory of the running interpreter: where `airflow` was installed with it
    (standalone starts its components as plain `airflow` from PATH)."""
    return Path(sys.executable).parent


class AirflowRuntime:
    """`airflow standalone` for one store, started by `start()` (or `with`), stopped with
    every process it started by `stop()`.

    :param store_dsn: the agentpost store; Airflow's metadata goes into database
        `metadata_db` on the same server (created, dropped first when `fresh`).
    :param dags_folder: the DAGs folder (default: the repo's ``dags/``).
    :param home: AIRFLOW_HOME (default: a temporary directory, removed by `stop()`).
    :param drop_metadata: drop the metadata database in `stop()` (tests, benchmarks).
    """

    def __init__(self, store_dsn: str, *, dags_folder: Path | None = None,
                 home: Path | None = None, metadata_db: str | None = None,
                 fresh: bool = True, drop_metadata: bool = False, parallelism: int = 4,
                 extra_env: dict[str, str] | None = None) -> None:
        self.store_dsn = store_dsn
        self.dags_folder = Path(dags_folder or find_repo_root() / "dags").resolve()
        self._own_home = home is None
        self.home = Path(home or tempfile.mkdtemp(prefix="agentpost-airflow-")).resolve()
        self.metadata_db = metadata_db or f"{_store_db(store_dsn)}_airflow"
        self.fresh = fresh
        self.drop_metadata = drop_metadata
        self.parallelism = parallelism
        self.extra_env = dict(extra_env or {})
        self.port = 0
        self.log_ports: tuple[int, int] = (0, 0)
        self.process: subprocess.Popen[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}

    # -- configuration ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the runtime's servers listen on: the API, the two log servers."""
        return (self.port, *self.log_ports)

    @property
    def log_path(self) -> Path:
        return self.home / LOG_FILE

    def environment(self, metadata_dsn: str) -> dict[str, str]:
        """The environment standalone and its components run with: ours without any Airflow
        or store settings of the caller, plus the private configuration."""
        env = private_environment()
        env.update({
            "PATH": f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy_url(metadata_dsn),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            # one secret for every component: the API server verifies what workers sign
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # the log servers of the worker and the triggerer bind every interface (Airflow
            # has no host setting for them): at least not the fixed 8793/8794 of a neighbour
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_ports[1]),
            "AIRFLOW_CONN_AGENTPOST_DEFAULT": connection_json(self.store_dsn),
            # the Spark jobs over the trail (dags/agentpost_trail_jobs.py) in local mode
            "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
            "NO_COLOR": "1",
        })
        env.update(self.extra_env)
        return env

    # -- start -----------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> AirflowRuntime:
        """Create the metadata database, start standalone, return once every component
        reports healthy. A start that fails stops whatever did start."""
        metadata_dsn = self._metadata_database()
        self.port = free_port()
        self.log_ports = (free_port(), free_port())
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(venv_bin() / "airflow"), "standalone"], env=self.environment(metadata_dsn),
                cwd=self.home, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_default_sigint)
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _metadata_database(self) -> str:
        return create_database(libpq_dsn(self.store_dsn), self.metadata_db, fresh=self.fresh)

    def wait_healthy(self, timeout: float) -> None:
        """Wait until the API answers and reports every component healthy."""
        with AirflowClient(self.url, timeout=5.0) as client:
            def healthy() -> bool:
                self._check_alive()
                self._remember_processes()
                try:
                    health = client.health()
                except httpx.HTTPError:
                    return False
                return all((health.get(c) or {}).get("status") == "healthy" for c in COMPONENTS)

            wait_until(healthy, timeout, f"Airflow to be healthy (log: {self.log_path})")

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AirflowError(f"airflow standalone exited with {self.process.returncode}:\n"
                               f"{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def credentials(self) -> Credentials:
        return read_credentials(self.home)

    def client(self) -> AirflowClient:
        """A REST client logged in as the generated admin; the caller closes it."""
        return AirflowClient(self.url, self.credentials())

    def __enter__(self) -> AirflowRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- processes -------------------------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        """The session standalone leads (its pid), None before `start()`."""
        return None if self.process is None else self.process.pid

    def _remember_processes(self) -> None:
        """Note every descendant seen, in case one leaves the session (none of Airflow's
        do today; a BashOperator's command does)."""
        if self.process is None:
            return
        try:
            root = psutil.Process(self.process.pid)
            for proc in (root, *root.children(recursive=True)):
                self._known.setdefault(proc.pid, proc)
        except psutil.Error:
            pass

    def processes(self) -> list[psutil.Process]:
        """Live (non-zombie) processes this runtime started: the session's and those it saw."""
        sid = self.session_id
        if sid is None:
            return []
        found = {p.pid: p for p in _in_session(sid)}
        for pid, proc in self._known.items():
            if pid not in found and _alive(proc):
                found[pid] = proc
        return list(found.values())

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every process started: SIGINT to standalone (its clean stop), then SIGTERM
        and at last SIGKILL to every process group of the session, each after `grace`
        seconds; then drop the metadata database (if asked) and a temporary home.
        Idempotent; a second Ctrl-C skips to SIGKILL."""
        if self.process is not None:
            self._remember_processes()
            try:
                if not self._interrupt_and_wait(grace) and \
                        not self._signal_and_wait(signal.SIGTERM, grace):
                    self._signal_and_wait(signal.SIGKILL, grace)
            except KeyboardInterrupt:
                self._signal_and_wait(signal.SIGKILL, grace)
                raise
            finally:
                self._reap()
        self._clean_up()

    def _interrupt_and_wait(self, grace: float) -> bool:
        """SIGINT to standalone alone, which SIGTERMs each component once. A SIGINT to the
        whole group would reach every component twice (ours, then standalone's SIGTERM), and
        Airflow's scheduler and triggerer take a second signal as "force exit", which can
        hang them (seen here: both stuck for more than 30 s)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self._wait_gone(grace)

    def _wait_gone(self, grace: float) -> bool:
        """Whether every process was gone within `grace` seconds."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self._reap()
            if not self.processes():
                return True
            time.sleep(0.2)
        return False

    def _signal_and_wait(self, sig: signal.Signals, grace: float) -> bool:
        """Send `sig` to every group and straggler; whether all were gone within `grace`."""
        procs = self.processes()
        sid = self.session_id
        for pgid in {_pgid(p) for p in procs if _sid(p) == sid} - {None, os.getpgrp()}:
            try:
                os.killpg(pgid, sig)  # type: ignore[arg-type]
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:  # those that left the session are not in any group signalled
            if _sid(proc) != sid:
                try:
                    proc.send_signal(sig)
                except psutil.Error:
                    pass
        return self._wait_gone(grace)

    def _reap(self) -> None:
        if self.process is not None:
            self.process.poll()

    def _clean_up(self) -> None:
        if self.drop_metadata:
            drop_database(libpq_dsn(self.store_dsn), self.metadata_db)
            self.drop_metadata = False
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A caller started in the
    background by a shell ignores SIGINT, and the ignore would be inherited, leaving
    standalone deaf to the signal it stops cleanly on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _store_db(dsn: str) -> str:
    return parse_dsn(libpq_dsn(dsn)).get("dbname") or "agentpost"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


def _sid(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


def _in_session(sid: int) -> Iterable[psutil.Process]:
    """Live processes of session `sid` (zombies are gone in all but name)."""
    for proc in psutil.process_iter():
        try:
            if _sid(proc) == sid and _alive(proc):
                yield proc
        except psutil.Error:
            continue
