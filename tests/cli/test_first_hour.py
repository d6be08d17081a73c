"""A new user's first hour (issue 22, section 4): the demos keep to their own databases and
never drop one in use, the CLI finds the store of the `make demo` running from its checkout
and names the store whenever something is missing, the trail-key warning says its piece once
per process, and the Airflow demos outside a checkout say what they need.

The CLI runs as a subprocess (tests/cli/test_cli.py's way); the demo databases' fixed names are
never used here (other runs share the server): the demos are pointed at per-test databases.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from agentpost.demo import terminal as demo
from agentpost.demo.store import (
    AIRFLOW_DATABASE,
    HEADLESS_DATABASE,
    TERMINAL_DATABASE,
    publish,
    running_demo_store,
    withdraw,
)
from agentpost.pg.bootstrap import create_database
from agentpost.pg.server import PostgresServer, libpq_dsn, redact_dsn
from agentpost.protocol.errors import Conflict
from agentpost.store import EnvelopeStore
from dbtools import drop_database, query, unique_db_name

SCRIPT = Path(sys.executable).parent / "agentpost"
TIMEOUT = 180


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The console script in `cwd`, with no store configured unless `env` says so."""
    base = {k: v for k, v in os.environ.items() if k != "AGENTPOST_DSN"}
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def checkout(path: Path) -> Path:
    """A directory the CLI takes for an agentpost checkout (its repo root)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "pyproject.toml").write_text('[project]\nname = "airflow-agentpost"\n')
    return path


# -- the demos' databases -------------------------------------------------------------------------


def test_each_demo_has_its_own_database() -> None:
    """The terminal demo recreated `make demo`'s database under its running Airflow (the
    page answered 503, the next maintenance run failed on a vanished trail)."""
    assert len({AIRFLOW_DATABASE, HEADLESS_DATABASE, TERMINAL_DATABASE}) == 3
    assert demo.DEMO_DATABASE == TERMINAL_DATABASE != AIRFLOW_DATABASE


def test_a_fresh_start_never_drops_a_database_in_use(pg_server: PostgresServer) -> None:
    """A demo's fresh start drops its database only when nobody is connected: with a
    connection open (a running demo's Airflow) it is a Conflict naming the database and the
    server, and the database and its rows are still there; once the connection is gone the
    database is recreated empty."""
    name = unique_db_name("demo")
    dsn = create_database(pg_server.dsn, name)
    try:
        query(dsn, "CREATE TABLE kept (x int)")
        query(dsn, "INSERT INTO kept VALUES (1)")
        held = psycopg2.connect(libpq_dsn(dsn))
        try:
            with pytest.raises(Conflict, match=rf"database '{name}' on .* is in use \(1 "):
                create_database(pg_server.dsn, name, fresh=True)
            assert query(dsn, "SELECT x FROM kept") == [(1,)]
        finally:
            held.close()
        create_database(pg_server.dsn, name, fresh=True)
        assert query(dsn, "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'") == [(0,)]
    finally:
        drop_database(pg_server.dsn, name)


def test_the_terminal_demo_refuses_while_its_database_is_in_use(
        pg_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`agentpost demo` on its database while someone works there stops with the Conflict
    before writing anything; free, it plays on it and says how to look again."""
    name = unique_db_name("demo")
    dsn = create_database(pg_server.dsn, name)
    monkeypatch.setattr(demo, "DEMO_DATABASE", name)
    monkeypatch.setattr(demo, "find_server", lambda: pg_server)
    try:
        held = psycopg2.connect(libpq_dsn(dsn))
        try:
            with pytest.raises(Conflict, match="is in use"):
                demo.run_demo()
        finally:
            held.close()
        assert query(dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'agentpost'") \
            == [(0,)]
        assert demo.run_demo() == 0
        with EnvelopeStore(dsn) as store:
            assert store.verify_trail().ok
    finally:
        drop_database(pg_server.dsn, name)


# -- the CLI and the running demo's store ---------------------------------------------------------


def test_the_cli_uses_the_running_demos_store(store: EnvelopeStore, dsn: str,
                                              tmp_path: Path) -> None:
    """While `make demo` runs, the CLI in its checkout, given no --dsn and no AGENTPOST_DSN,
    works on the demo's store, signs and verifies with the key the demo generated, and says
    on stderr which store it uses; before, it created and used the database `agentpost`
    and said "unknown workspace". A file left by a demo that is gone is ignored, and the
    demo withdraws its own file when it stops."""
    store.create_workspace("coordinator", workspace_id="coordinator-1")
    store.create_workspace("worker", parent="coordinator-1", workspace_id="worker-a")
    store.send("coordinator-1", "worker-a", "directive", "hello from the demo")
    root = checkout(tmp_path / "repo")
    home = root / ".airflow-demo"
    path = publish(home, dsn, os.environ["AGENTPOST_TRAIL_KEY"])
    assert path.stat().st_mode & 0o777 == 0o600
    no_key = {"AGENTPOST_TRAIL_KEY": ""}
    inbox = cli("inbox", "worker-a", cwd=root, env=no_key)
    assert inbox.returncode == 0, inbox.stderr
    assert "hello from the demo" in inbox.stdout
    assert f"using the store of the demo running here (pid {os.getpid()}): " \
           f"{redact_dsn(dsn)}" in inbox.stderr
    assert "development key" not in inbox.stderr
    sent = cli("send", "--from", "coordinator-1", "--to", "worker-a", "--type", "directive",
               "from the CLI", cwd=root, env=no_key)
    assert sent.returncode == 0, sent.stderr
    verify = cli("verify", cwd=root, env=no_key)  # signed with the demo's key, not the public
    assert verify.returncode == 0 and verify.stdout.startswith("trail verified"), verify.stderr

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (home / "store.json").write_text((home / "store.json").read_text().replace(
        f'"pid":{os.getpid()}', f'"pid":{gone.stdout.strip()}'))
    assert running_demo_store(root) is None
    publish(home, dsn, None)
    assert running_demo_store(root) is not None
    withdraw(home)
    assert not (home / "store.json").exists() and running_demo_store(root) is None


def test_a_missing_thing_names_the_store_without_its_password(dsn: str,
                                                              tmp_path: Path) -> None:
    """Every CLI error about something missing says which store it looked in, its DSN
    without the password (trust authentication ignores the one given here)."""
    with_password = dsn.replace("postgres@", "postgres:s3cret@", 1)
    assert with_password != dsn
    shown = redact_dsn(with_password)
    for args in (["inbox", "worker-a"], ["command", "view", "no-such-command"],
                 ["workspace", "create", "worker", "--parent", "nobody"],
                 ["mark-key", "show", "no-such-key"]):
        run = cli("--dsn", with_password, *args, cwd=tmp_path)
        assert run.returncode == 2, (args, run.stderr)
        [line] = run.stderr.splitlines()
        assert line.startswith("agentpost: ") and line.endswith(f" (in the store {shown})"), \
            (args, line)
        assert "s3cret" not in run.stderr


# -- the trail key -------------------------------------------------------------------------------


def test_the_trail_key_warning_is_said_once_per_process(dsn: str) -> None:
    """Without AGENTPOST_TRAIL_KEY every store, ledger and hook built warned again (one line
    per caller); it is said once per process."""
    code = ("from agentpost.config import Settings\n"
            "from agentpost.store import EnvelopeStore\n"
            "Settings.from_env()\n"
            "Settings.from_env()\n"
            "for _ in range(2):\n"
            f"    EnvelopeStore({dsn!r}).close()\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENTPOST_TRAIL_KEY"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("AGENTPOST_TRAIL_KEY is not set") == 1, proc.stderr


# -- the Airflow demos outside a checkout ---------------------------------------------------------


def test_the_airflow_demos_say_what_they_need_outside_a_checkout(dsn: str,
                                                                 tmp_path: Path) -> None:
    """Outside a checkout there is no dags/fleet.yaml: `demo --headless` (and `--airflow`)
    stop with one line saying to run in a checkout or pass --dags-folder, before touching
    the store; --dags-folder names the folder to play; the terminal demo has no DAGs."""
    before = query(dsn, "SELECT count(*) FROM agentpost.trail")
    for mode in ("--headless", "--airflow"):
        run = cli("--dsn", dsn, "demo", mode, cwd=tmp_path)
        assert run.returncode == 2, run.stdout + run.stderr
        [line] = run.stderr.splitlines()
        assert f"no fleet.yaml in {tmp_path.resolve() / 'dags'}" in line, line
        assert "checkout of the agentpost repository" in line and "--dags-folder" in line
    empty = tmp_path / "mine"
    empty.mkdir()
    run = cli("--dsn", dsn, "demo", "--headless", "--dags-folder", str(empty), cwd=tmp_path)
    assert run.returncode == 2 and "the given DAGs folder" in run.stderr, run.stderr
    run = cli("--dsn", dsn, "demo", "--dags-folder", str(empty), cwd=tmp_path)
    assert run.returncode == 2 and "terminal demo plays no DAGs" in run.stderr, run.stderr
    assert query(dsn, "SELECT count(*) FROM agentpost.trail") == before
