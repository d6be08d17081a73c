"""Find a Postgres server for agentpost, starting a private one when there is none.

``discover()`` tries, in order:

1. ``AGENTPOST_DSN`` from the environment, used as given;
2. a server answering on 127.0.0.1:5432 as user ``postgres`` (trust authentication);
3. a private cluster under ``<repo root>/.pg/`` built from the installed PostgreSQL binaries
   and started on a free loopback port. It is created (``initdb``) on first use and left in
   place afterwards, so later calls find it running or start it again.

Layout of the private cluster directory::

    .pg/data/          the cluster (PGDATA)
    .pg/run/           its Unix socket directory
    .pg/postgres.log   the server log
    .pg/discover.lock  serialises concurrent discover() calls

``initdb`` and ``postgres`` refuse to run as root: when this process is root, the directory is
handed to the ``postgres`` user and the binaries run through ``runuser`` (or ``su``).

Only the standard library and psycopg2 are used here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg2
from psycopg2.extensions import make_dsn, parse_dsn

__all__ = [
    "DSN_ENV",
    "PostgresServer",
    "PostgresUnavailable",
    "discover",
    "dsn_for_database",
    "find_bindir",
    "find_repo_root",
    "libpq_dsn",
    "redact_dsn",
]

DSN_ENV = "AGENTPOST_DSN"
BINDIR_ENV = "AGENTPOST_PG_BINDIR"
LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5432
CLUSTER_USER = "postgres"  # the OS user that owns the private cluster when we are root
DISTRIBUTION = "airflow-agentpost"

_CONNECT_TIMEOUT = 2  # seconds, for probing


class PostgresUnavailable(RuntimeError):
    """No Postgres server could be found or started."""


@dataclass
class PostgresServer:
    """A Postgres server agentpost can use.

    ``dsn`` is an admin DSN to the ``postgres`` database (for AGENTPOST_DSN: the DSN as given).
    ``source`` says where it came from: ``"env"``, ``"local"`` (127.0.0.1:5432) or
    ``"private"`` (the cluster in ``pgdata``). ``started_here`` is true only when this
    discover() call started the server; ``stop()`` stops it then and does nothing otherwise.
    """

    dsn: str
    started_here: bool = False
    source: str = "env"
    pgdata: Path | None = None
    bindir: Path | None = None
    run_as: str | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def stop_command(self) -> str | None:
        """A shell command that stops the private cluster (``None`` for servers we don't own)."""
        if self.source != "private" or self.pgdata is None or self.bindir is None:
            return None
        return shlex.join(self._as_cluster_user(self._pg_ctl_stop()))

    def stop(self) -> None:
        """Stop the server if this discover() call started it; idempotent."""
        if not self.started_here or self._stopped:
            return
        _run(self._as_cluster_user(self._pg_ctl_stop()))
        self._stopped = True

    def _pg_ctl_stop(self) -> list[str]:
        assert self.bindir is not None and self.pgdata is not None
        return [str(self.bindir / "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", "fast", "-w"]

    def _as_cluster_user(self, argv: list[str]) -> list[str]:
        return _as_user(self.run_as, argv)


# --------------------------------------------------------------------------- DSN helpers


def libpq_dsn(dsn: str) -> str:
    """Turn a SQLAlchemy URL (``postgresql+psycopg2://...``) into one libpq accepts."""
    return re.sub(r"^postgres(?:ql)?\+[a-z0-9_]+://", "postgresql://", dsn, count=1)


def redact_dsn(dsn: str) -> str:
    """A DSN (URI or key=value) without its password, for messages and logs."""
    dsn = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def dsn_for_database(admin_dsn: str, dbname: str) -> str:
    """Return ``admin_dsn`` with its database replaced by ``dbname``.

    URIs (``postgresql://``, ``postgres://``, ``postgresql+driver://``) stay URIs with the same
    scheme; key=value DSNs stay key=value DSNs.
    """
    if "://" in admin_dsn:
        parts = urlsplit(admin_dsn)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
        return urlunsplit(
            (parts.scheme, parts.netloc, "/" + quote(dbname, safe=""), urlencode(query), "")
        )
    params = parse_dsn(admin_dsn)
    params["dbname"] = dbname
    return make_dsn(**params)


# --------------------------------------------------------------------------- discovery


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) whose pyproject.toml names
    the airflow-agentpost distribution; ``start`` itself when there is none."""
    here = (start or Path.cwd()).resolve()
    pattern = re.compile(r"""^\s*name\s*=\s*["']airflow-agentpost["']""", re.MULTILINE)
    for candidate in (here, *here.parents):
        pyproject = candidate / "pyproject.toml"
        try:
            if pattern.search(pyproject.read_text(encoding="utf-8")):
                return candidate
        except OSError:
            continue
    return here


def discover(
    repo_root: Path | None = None,
    *,
    start: bool = True,
    cluster_dir: Path | None = None,
    private_only: bool = False,
) -> PostgresServer:
    """Find a Postgres server (see the module docstring for the order).

    ``cluster_dir`` replaces ``<repo_root>/.pg`` as the private cluster directory.
    ``private_only`` skips AGENTPOST_DSN and port 5432 and goes straight to the private
    cluster. With ``start=False`` a private cluster that is not running is not started (nor
    created) and PostgresUnavailable is raised instead.
    """
    if not private_only:
        env_dsn = os.environ.get(DSN_ENV, "").strip()
        if env_dsn:
            return PostgresServer(dsn=env_dsn, source="env")
        local_dsn = f"postgresql://postgres@{LOCAL_HOST}:{LOCAL_PORT}/postgres"
        if _answers(local_dsn):
            return PostgresServer(dsn=local_dsn, source="local")
    base = Path(cluster_dir) if cluster_dir is not None else find_repo_root(repo_root) / ".pg"
    return _private_cluster(base.resolve(), start=start)


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl/postgres: $AGENTPOST_PG_BINDIR, ``pg_config
    --bindir``, the newest /usr/lib/postgresql/<version>/bin, or the one on PATH."""
    candidates: list[Path] = []
    if os.environ.get(BINDIR_ENV):
        candidates.append(Path(os.environ[BINDIR_ENV]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    versioned = []
    for path in Path("/usr/lib/postgresql").glob("*/bin"):
        version = tuple(int(p) for p in re.findall(r"\d+", path.parent.name))
        if version:
            versioned.append((version, path))
    candidates.extend(path for _, path in sorted(versioned, reverse=True))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if all((candidate / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return candidate
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found; install PostgreSQL, "
        f"set {BINDIR_ENV}, or point {DSN_ENV} at a running server"
    )


def _answers(dsn: str) -> bool:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=_CONNECT_TIMEOUT)
    except psycopg2.Error:
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except psycopg2.Error:
        return False
    finally:
        conn.close()


def _private_cluster(base: Path, *, start: bool) -> PostgresServer:
    data = base / "data"
    run_dir = base / "run"
    log = base / "postgres.log"
    run_as = _cluster_user()

    if not start and not (data / "PG_VERSION").exists():
        raise PostgresUnavailable(f"no private Postgres cluster in {data} (start=False)")

    bindir = find_bindir()
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / "discover.lock"):
        if run_as:
            _hand_over(base, run_dir, run_as)
        else:
            run_dir.mkdir(exist_ok=True)

        def server(port: int, started_here: bool) -> PostgresServer:
            return PostgresServer(
                dsn=f"postgresql://postgres@{LOCAL_HOST}:{port}/postgres",
                started_here=started_here,
                source="private",
                pgdata=data,
                bindir=bindir,
                run_as=run_as,
            )

        port = _running_port(bindir, data, run_as)
        if port is not None:
            found = server(port, started_here=False)
            if _wait_until_answers(found.dsn, timeout=30):
                return found
            raise PostgresUnavailable(
                f"the private cluster in {data} is running on port {port} but does not accept "
                f"connections; see {log}"
            )
        if not start:
            raise PostgresUnavailable(f"the private cluster in {data} is not running (start=False)")

        if not (data / "PG_VERSION").exists():
            if data.exists() and any(data.iterdir()):
                raise PostgresUnavailable(f"{data} exists but is not a Postgres cluster")
            _run(
                _as_user(
                    run_as,
                    [
                        str(bindir / "initdb"),
                        "-D", str(data),
                        "-U", "postgres",
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--locale=C",
                        "--no-sync",
                    ],
                )
            )  # fmt: skip

        last_error: Exception | None = None
        for _attempt in range(3):  # a free port can be taken before the server binds it
            port = _free_port()
            options = " ".join(
                [
                    "-c", shlex.quote(f"listen_addresses={LOCAL_HOST}"),
                    "-p", str(port),
                    "-k", shlex.quote(str(run_dir)),
                ]
            )  # fmt: skip
            argv = [
                str(bindir / "pg_ctl"), "start", "-D", str(data), "-l", str(log),
                "-w", "-t", "60", "-o", options,
            ]  # fmt: skip
            try:
                _run(_as_user(run_as, argv))
            except PostgresUnavailable as exc:
                last_error = exc
                continue
            started = server(port, started_here=True)
            if _wait_until_answers(started.dsn, timeout=30):
                return started
            started.stop()
            last_error = PostgresUnavailable(f"started {data} on port {port} but it won't answer")
        raise PostgresUnavailable(
            f"could not start the private cluster in {data}; see {log}: {last_error}"
        )


def _cluster_user() -> str | None:
    """The user to run initdb/pg_ctl as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(CLUSTER_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"running as root, but there is no '{CLUSTER_USER}' user to own a private cluster"
        ) from None
    return CLUSTER_USER


def _as_user(user: str | None, argv: Sequence[str]) -> list[str]:
    if user is None:
        return list(argv)
    runuser = shutil.which("runuser") or next(
        (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.access(p, os.X_OK)), None
    )
    if runuser:
        return [runuser, "-u", user, "--", *argv]
    return ["su", user, "-s", "/bin/sh", "-c", shlex.join(argv)]


def _hand_over(base: Path, run_dir: Path, user: str) -> None:
    """Give the cluster directory to ``user`` (we are root) and check it can get there."""
    entry = pwd.getpwnam(user)
    run_dir.mkdir(exist_ok=True)
    for path in (base, run_dir):
        if path.stat().st_uid != entry.pw_uid:
            os.chown(path, entry.pw_uid, entry.pw_gid)
    base.chmod(0o700)
    probe = subprocess.run(_as_user(user, ["test", "-w", str(base)]), check=False, cwd="/")
    if probe.returncode != 0:
        raise PostgresUnavailable(
            f"the '{user}' user cannot write to {base} (a parent directory is not accessible "
            f"to it); pass another cluster_dir or set {DSN_ENV}"
        )


def _running_port(bindir: Path, data: Path, run_as: str | None) -> int | None:
    """The port of the cluster in ``data`` if its postmaster runs, else None."""
    if not (data / "PG_VERSION").exists():
        return None
    status = subprocess.run(
        _as_user(run_as, [str(bindir / "pg_ctl"), "status", "-D", str(data)]),
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    if status.returncode != 0:
        return None
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        return int(lines[3])
    except (OSError, IndexError, ValueError):
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCAL_HOST, 0))
        return sock.getsockname()[1]


def _wait_until_answers(dsn: str, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if _answers(dsn):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _run(argv: list[str]) -> None:
    # cwd=/ because the cluster user may not be allowed into ours
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd="/")
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        raise PostgresUnavailable(f"{shlex.join(argv)} failed ({proc.returncode}): {output}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
