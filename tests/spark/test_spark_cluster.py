"""The Spark jobs unchanged on a real Spark standalone cluster (issue 14).

A module fixture starts a standalone master and one worker with the pip pyspark's own
`spark-class` (each in a process group of its own, on free ports at 127.0.0.1, the worker's
work directory under the module's tmp dir), waits until the master lists the worker ALIVE,
and at the end stops both (SIGTERM to each group, SIGKILL after a timeout) and asserts that
no process of theirs (executors included) and no port they listened on is left.

The audit then runs on the cluster as TrailJobOperator submits it (client deploy mode; the
store and the key in spark-submit's environment, the JDBC jar by `--jars`), with the real
spark-submit. (Through TrailJobOperator under `dag.test()` with a `spark_default` naming the
master it also ran, but cost two more minutes of CI: the operator's command line is tested
in tests/spark/test_spark_airflow.py.) The tasks run in executor JVMs that the worker
starts: they fetch the JDBC jar from the driver and read the store in the driver's exported
snapshot. Each test asserts exit 0 (task success), an ok row in agentpost.audit_reports
covering every entry, the application FINISHED in the master's list by its name, and its
executor's log in the worker's work directory with the tasks it ran.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
import pyspark
import pytest

from agentpost.benchmarks.spark_fill import Plan, fill
from agentpost.spark.apps import application
from agentpost.spark.settings import DEFAULT_JDBC_JAR
from agentpost.standalone import free_port
from agentpost.store import EnvelopeStore
from dbtools import query

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: the pip pyspark is a whole Spark: its bin/spark-class runs the master and the worker
SPARK_HOME = Path(pyspark.__file__).parent
KEY = os.environ["AGENTPOST_TRAIL_KEY"]
APP = "agentpost-trail-audit"
DAY = datetime(2026, 11, 1, tzinfo=UTC)
#: every Spark process binds and advertises loopback only
LOOPBACK = {"SPARK_LOCAL_IP": "127.0.0.1"}
#: how long the cluster may take to start, a job to run, a process group to stop on SIGTERM
START_TIMEOUT, JOB_TIMEOUT, STOP_TIMEOUT = 180.0, 900.0, 30.0


@dataclass
class Cluster:
    """A running standalone master and worker: where to submit, where to look."""

    ports: dict[str, int]
    work: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.ports['master']}"

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's /json)."""
        url = f"http://127.0.0.1:{self.ports['master_ui']}/json/"
        return httpx.get(url, timeout=10).json()

    def log_tail(self) -> str:
        return "\n".join(Path(f.name).read_text(errors="replace")[-3000:] for f in self.logs)


# -- processes, groups and ports ---------------------------------------------------------------

def _members(groups: set[int]) -> list[psutil.Process]:
    """The live processes (zombies aside) of the process groups `groups`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in groups and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _listeners(pids: set[int] | None = None, ports: set[int] | None = None
               ) -> dict[int, set[str]]:
    """Listening TCP ports (with their addresses) of the processes `pids`, or on `ports`."""
    found: dict[int, set[str]] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN:
            continue
        if (pids is not None and conn.pid in pids) or (ports is not None
                                                        and conn.laddr.port in ports):
            found.setdefault(conn.laddr.port, set()).add(conn.laddr.ip)
    return found


def _loopback(ip: str) -> bool:
    """Whether `ip` is a loopback address (Java's dual-stack sockets show 127.0.0.1 as
    ::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _start(cluster: Cluster, args: list[str], log: Path) -> None:
    """`spark-class args` in a process group of its own, its output to `log`."""
    out = log.open("wb")
    cluster.logs.append(out)
    env = {**os.environ, **LOOPBACK, "SPARK_HOME": str(SPARK_HOME),
           "SPARK_LOCAL_DIRS": str(cluster.work.parent / "local")}
    cluster.procs.append(subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args],
                                          env=env,
                                          stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to `proc`'s group; SIGKILL to whatever of it is left after STOP_TIMEOUT."""
    group = proc.pid  # start_new_session: the leader's pid is the group's id
    members = _members({group})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        _, members = psutil.wait_procs(members, timeout=STOP_TIMEOUT)
        if not members:
            break
    proc.wait(timeout=STOP_TIMEOUT)


def _run_group(command: list[str], env: dict[str, str], cwd: Path
               ) -> subprocess.CompletedProcess[str]:
    """`command` in a process group of its own (spark-submit's JVM starts the Python
    driver); the whole group is stopped if it outlives JOB_TIMEOUT, so nothing is left."""
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        pytest.fail(f"{command[0]} did not finish within {JOB_TIMEOUT} s")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _await(cluster: Cluster, ready: Any, what: str) -> dict[str, Any]:
    """Poll the master's /json until `ready(state)`; fail with the logs if a process died
    or START_TIMEOUT passed."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in cluster.procs), cluster.log_tail()
        try:
            state = cluster.state()
            if ready(state):
                return state
        except (httpx.HTTPError, ValueError):
            pass  # the web UI is not up yet
        time.sleep(0.5)
    pytest.fail(f"{what} within {START_TIMEOUT} s:\n{cluster.log_tail()}")


def _distinct_ports(names: tuple[str, ...]) -> dict[str, int]:
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(names):
        ports = {name: free_port() for name in names}
    return ports


# -- the cluster -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    cluster = Cluster(_distinct_ports(("master", "master_ui", "worker", "worker_ui")),
                      root / "work")
    cluster.work.mkdir()
    p = {k: str(v) for k, v in cluster.ports.items()}
    try:
        _start(cluster, ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", p["master"], "--webui-port", p["master_ui"]],
               root / "master.log")
        _start(cluster, ["org.apache.spark.deploy.worker.Worker", cluster.master,
                         "--host", "127.0.0.1", "--port", p["worker"], "--webui-port",
                         p["worker_ui"], "--cores", "2", "--memory", "2g",
                         "--work-dir", str(cluster.work)], root / "worker.log")
        _await(cluster, lambda s: [w for w in s["workers"] if w["state"] == "ALIVE"],
               "no worker registered ALIVE")
        yield cluster
    finally:
        _stop_cluster(cluster)


def _stop_cluster(cluster: Cluster) -> None:
    """Stop worker and master by process group; assert nothing of theirs is left."""
    groups = {p.pid for p in cluster.procs}
    listened = set(_listeners(pids={p.pid for p in _members(groups)})) | set(
        cluster.ports.values())
    for proc in reversed(cluster.procs):  # the worker first: it stops its executors
        _stop_group(proc)
    for out in cluster.logs:
        out.close()
    left = _members(groups)
    assert not left, f"left running: {[p.cmdline()[:3] for p in left]}"
    assert not _listeners(ports=listened), "a port of the cluster still listens"


def test_the_cluster_listens_on_loopback_only(cluster: Cluster) -> None:
    """Master and worker (RPC and web UI each) listen on the ports they were given, and on
    loopback alone."""
    groups = {p.pid for p in cluster.procs}
    listening = _listeners(pids={p.pid for p in _members(groups)})
    assert set(cluster.ports.values()) <= set(listening), listening
    assert all(_loopback(ip) for ips in listening.values() for ip in ips), listening
    state = cluster.state()
    assert (state["status"], state["url"]) == ("ALIVE", cluster.master)
    assert [(w["state"], w["cores"]) for w in state["workers"]] == [("ALIVE", 2)]


# -- a trail and the audit's evidence --------------------------------------------------------

def _trail(dsn: str, checkpoints: Path) -> int:
    """A small synthetic day of traffic, hashed and signed as the store signs, and a signed
    checkpoint of its heads in `checkpoints` (as the maintenance DAG keeps them); returns the
    number of trail entries."""
    fill(dsn, KEY.encode("utf-8"), Plan(envelopes=300, start_us=int(DAY.timestamp() * 1e6)),
         parts=1)
    with EnvelopeStore(dsn) as store:
        checkpoint = store.checkpoint()
    checkpoints.mkdir()
    # the audit takes the newest checkpoint of the directory by its name: an older file is
    # never read, even one that is not a checkpoint
    (checkpoints / "checkpoint-20000101T000000.000000Z.json").write_text("not read")
    (checkpoints / "checkpoint-20261102T000000.000000Z.json").write_text(checkpoint.to_json())
    return query(dsn, "SELECT count(*) FROM agentpost.trail")[0][0]


def _assert_audited_ok(dsn: str, entries: int, report: Path) -> None:
    """One ok audit_reports row over every entry, every chain head anchored, and the same
    report in the `--report` file."""
    rows = query(dsn, "SELECT ok, entries, failed, report FROM agentpost.audit_reports")
    assert [(ok, n, failed) for ok, n, failed, _ in rows] == [(True, entries, 0)], rows
    anchors = rows[0][3]["checks"]["checkpoint_anchors"]
    heads = query(dsn, "SELECT count(DISTINCT chain) FROM agentpost.trail")[0][0]
    assert (anchors["checked"], anchors["failed"]) == (heads, 0), anchors
    saved = json.loads(report.read_text())
    assert saved["ok"] is True and saved["entries"] == entries
    assert saved["checks"] == rows[0][3]["checks"]


def _apps(cluster: Cluster) -> set[str]:
    state = cluster.state()
    return {a["id"] for a in state["activeapps"] + state["completedapps"]}


def _assert_ran_on_the_cluster(cluster: Cluster, before: set[str]) -> None:
    """One new application, FINISHED under the job's name, whose executor (a JVM the worker
    started, logging into the worker's work directory) fetched the JDBC jar from the driver
    and ran the job's tasks."""
    state = _await(cluster, lambda s: [a for a in s["completedapps"]
                                       if a["id"] not in before], "no application completed")
    (app,) = [a for a in state["completedapps"] if a["id"] not in before]
    assert (app["name"], app["state"]) == (APP, "FINISHED"), app
    executors = sorted(p for p in (cluster.work / app["id"]).glob("*") if p.is_dir())
    assert executors, f"no executor ran {app['id']} in the worker's work directory"
    for executor in executors:
        text = (executor / "stderr").read_text(errors="replace")
        assert (executor / "postgresql.jar").is_file(), text[-3000:]
        assert "/jars/postgresql.jar" in text and "Fetching spark://" in text, text[-3000:]
        assert "Finished task" in text, text[-3000:]


def _job_env(dsn: str) -> dict[str, str]:
    """What TrailJobOperator puts into spark-submit's environment (the store and the key
    never on the command line), on this machine's loopback."""
    return {**os.environ, **LOOPBACK, "AGENTPOST_DSN": dsn, "AGENTPOST_TRAIL_KEY": KEY,
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}


# -- the jobs on the cluster -----------------------------------------------------------------

def test_spark_submit_runs_the_audit_on_the_cluster(cluster: Cluster, dsn: str,
                                                    tmp_path: Path) -> None:
    """The audit's file, arguments and environment as in local mode, only `--master` names
    the standalone master (and the executors get no Python): exit 0, every check passes
    against the newest checkpoint of the directory, the report is in the file and the
    table, and the work ran in the worker's executor. (The suite's one spark-submit of the
    audit on a clean trail; a tampered one fails its task under dag.test() in
    tests/spark/test_spark_airflow.py.)"""
    entries = _trail(dsn, tmp_path / "checkpoints")
    before = _apps(cluster)
    command = [str(BIN / "spark-submit"), "--master", cluster.master, "--deploy-mode",
               "client", "--name", APP, "--jars", DEFAULT_JDBC_JAR,
               "--executor-memory", "1g", "--total-executor-cores", "2",
               application("audit"), "--checkpoint-dir", str(tmp_path / "checkpoints"),
               "--report", str(tmp_path / "report.json")]
    # executors need no Python (docs/spark.md, "Scale-out"): the one they would start is
    # not there; the driver runs on PYSPARK_DRIVER_PYTHON
    env = {**_job_env(dsn), "PYSPARK_PYTHON": str(tmp_path / "no-python-on-executors")}
    run = _run_group(command, env, tmp_path)
    assert run.returncode == 0, run.stderr[-5000:]
    assert "entry_signature" in run.stdout and "OK" in run.stdout, run.stdout[-3000:]
    _assert_audited_ok(dsn, entries, tmp_path / "report.json")
    _assert_ran_on_the_cluster(cluster, before)
