"""The demos' stores: their databases, the trail key they sign with, and where a running
`make demo` leaves its store for the CLI.

Each demo has a database of its own on the server discovery finds, recreated at its start:
``agentpost_demo`` (`make demo`, the one its Airflow serves), ``agentpost_demo_headless``
(`make demo-headless`) and ``agentpost_demo_terminal`` (`agentpost demo`). A demo never
drops a database someone is connected to (`agentpost.pg.bootstrap.create_database`), so
a second demo of the same kind refuses to start instead of pulling the store from under the
first. Without AGENTPOST_TRAIL_KEY a demo signs with a key it generates (`demo_trail_key`),
not the public development key, and nothing warns about it.

`agentpost demo --airflow` publishes ``<repo root>/.airflow-demo/store.json`` (mode 0600)
while it runs: the store's DSN, the demo's process id and, when the demo generated the trail
key (AGENTPOST_TRAIL_KEY was not set), that key, so the CLI signs and verifies as the demo's
Airflow does. The demo withdraws the file when it stops. The CLI reads it only when it was
given no ``--dsn`` and no AGENTPOST_DSN, and only while that process lives: a file left by a
demo that was killed outright is ignored.

Only the standard library, pydantic and the repo-root lookup: the CLI reads this before it
imports anything heavier.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from agentpost.pg.server import find_repo_root

#: the database of each demo
AIRFLOW_DATABASE = "agentpost_demo"
HEADLESS_DATABASE = "agentpost_demo_headless"
TERMINAL_DATABASE = "agentpost_demo_terminal"
#: the demo's private Airflow home, under the repo root
DEMO_HOME = ".airflow-demo"
STORE_FILE = "store.json"


class DemoStore(BaseModel):
    """What the running demo published."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    dsn: str
    pid: int
    trail_key: str | None = None


def demo_trail_key() -> str | None:
    """Set AGENTPOST_TRAIL_KEY to a generated key when it is not set, for this process and
    the Airflow it starts; the key generated, or None when one was set."""
    if os.environ.get("AGENTPOST_TRAIL_KEY"):
        return None
    key = os.environ["AGENTPOST_TRAIL_KEY"] = secrets.token_urlsafe(32)
    return key


def demo_home(root: Path | None = None) -> Path:
    """The demo's Airflow home: ``.airflow-demo`` under the repo root (or `root`)."""
    return (root or find_repo_root()) / DEMO_HOME


def publish(home: Path, dsn: str, trail_key: str | None) -> Path:
    """Write the store file into `home` for this process, readable by its owner only."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / STORE_FILE
    state = DemoStore(dsn=dsn, pid=os.getpid(), trail_key=trail_key)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(state.model_dump_json())
    return path


def withdraw(home: Path) -> None:
    """Remove the store file if this process published it."""
    found = _read(home / STORE_FILE)
    if found is not None and found.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            (home / STORE_FILE).unlink()


def running_demo_store(root: Path | None = None) -> DemoStore | None:
    """The store of the demo running from this checkout, if one runs."""
    found = _read(demo_home(root) / STORE_FILE)
    return found if found is not None and _alive(found.pid) else None


def _read(path: Path) -> DemoStore | None:
    try:
        return DemoStore.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    return True
