"""Installed as the README says: the wheel, with plain pip, into a fresh virtualenv outside the
repository, beside the Airflow the lock pins (`-c constraints.txt`), with the `postgres` extra
only, works from a directory outside the repository.

Checked there: Airflow lists the provider and the plugin and reaches its metadata database at
a bare `postgresql://` URL (SQLAlchemy 2.1 reads it as psycopg 3, which the `postgres` extra
brings); `agentpost migrate` applies the SQL shipped in site-packages to a fresh database; the
example DAGs (a copy of dags/) parse. Without the `spark` extra nothing of Spark is installed,
`agentpost spark ...` and `agentpost bench spark` say in one line what to install, and the
Spark example DAG's import error says the same (docs/airflow.md, "Installing").

On Python 3.13 (the newest requires-python admits) in `make test`; the interpreters are a
comma-separated list in AGENTPOST_INSTALL_PYTHONS (`AGENTPOST_INSTALL_PYTHONS=3.11,3.12,3.13`
checks each; 3.11 and 3.12 passed so when requires-python was widened). 3.11, the lock's, is
the interpreter the rest of the suite installs the same pins into and runs on; what it adds
here, plain pip on 3.11, cost 2-3 minutes of a full run that had to fit in 30. Each install
downloads its ~135 wheels (66 MB) from the package index, one request after another (pip's
HTTP cache stays empty on these machines, so every run is a cold one): about 1.5 minutes of
CPU for install and checks per interpreter, and 3-4 minutes of wall time for the install on a
loaded two-core machine. The virtualenvs and the Airflow metadata databases are deleted
afterwards.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg2.extensions import parse_dsn

from agentpost.pg.server import PostgresServer, libpq_dsn
from agentpost.spark.install import INSTALL
from dbtools import fresh_database, query
from dist_support import REPO, build_wheel, copy_source, run

pytestmark = pytest.mark.slow

SPARK_DAGS = {"agentpost_trail_jobs.py"}
#: the LLM examples: without the `ai` extra their import error says what to install
LLM_DAGS = {"agentpost_research_desk.py", "agentpost_shared_staging.py",
            "agentpost_refund_desk.py"}
AI_INSTALL = "pip install 'airflow-agentpost[ai]'"
NOT_INSTALLED = ("pyspark", "pyspark-client", "pandas", "pyarrow", "numpy",
                 "apache-airflow-providers-apache-spark")


@dataclass(frozen=True)
class Installed:
    venv: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.venv / "bin" / argv[0]), *argv[1:]], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=600,
                              check=False)
        if check:
            assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


def interpreter(version: str) -> str:
    """A Python `version` to build the virtualenv from: this one, one on PATH, or pyenv's."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True,
                          check=False).returncode == 0:
            return candidate
    pytest.fail(f"no Python {version} here: install it (pyenv install {version}) to test the "
                f"install on it", pytrace=False)


def sqlalchemy_url(dsn: str) -> str:
    """A bare postgresql:// URL (no +driver) for the database of `dsn`."""
    p = parse_dsn(libpq_dsn(dsn))
    auth = p.get("user", "postgres") + (f":{p['password']}" if p.get("password") else "")
    return f"postgresql://{auth}@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("install-wheel")
    return build_wheel(copy_source(work / "src"), work / "dist")


PYTHONS = os.environ.get("AGENTPOST_INSTALL_PYTHONS", "3.13").replace(" ", "").split(",")


@pytest.fixture(scope="module", params=PYTHONS)
def installed(request: pytest.FixtureRequest, wheel: Path,
              pg_server: PostgresServer) -> Iterator[Installed]:
    python = interpreter(request.param)
    work = Path(tempfile.mkdtemp(prefix=f"agentpost-install-{request.param}-"))
    metadata = contextmanager(fresh_database)(pg_server, "install_airflow")
    try:
        metadata_dsn = metadata.__enter__()
        venv = work / "venv"
        run([python, "-m", "venv", "--without-pip", str(venv)])
        # plain pip (this environment's, acting on the new one); --no-compile only saves time
        run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "--no-compile", "--constraint", str(REPO / "constraints.txt"),
             f"{wheel}[postgres]"], timeout=1800)
        home, cwd = work / "airflow-home", work / "elsewhere"
        home.mkdir()
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW", "AGENTPOST_", "PYTHON", "VIRTUAL_ENV"))}
        env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                    "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy_url(metadata_dsn),
                    "AGENTPOST_TRAIL_KEY": "install-test-key"})
        yield Installed(venv, env, cwd)
    finally:
        metadata.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)


def test_the_base_install_is_consistent_and_has_no_spark(installed: Installed) -> None:
    pip = [sys.executable, "-m", "pip", "--python", str(installed.venv / "bin" / "python")]
    run([*pip, "check"])
    names = {p["name"].lower() for p in json.loads(run([*pip, "list", "--format", "json"]).stdout)}
    assert {"airflow-agentpost", "apache-airflow", "psycopg", "asyncpg"} <= names
    assert names.isdisjoint(NOT_INSTALLED), sorted(names & set(NOT_INSTALLED))


def test_airflow_lists_the_provider_and_the_plugin(installed: Installed) -> None:
    installed.run("airflow", "db", "check")  # the bare postgresql:// URL: psycopg 3
    providers = json.loads(installed.run("airflow", "providers", "list", "-o", "json").stdout)
    assert "airflow-agentpost" in {p["package_name"] for p in providers}
    plugins = json.loads(installed.run("airflow", "plugins", "-o", "json").stdout)
    assert "agentpost" in {p["name"] for p in plugins}


def test_migrate_applies_the_sql_shipped_in_site_packages(installed: Installed, wheel: Path,
                                                         empty_dsn: str) -> None:
    where = installed.run("python", "-c", "import agentpost.sql as s; print(s.__path__[0])")
    assert Path(where.stdout.strip()).is_relative_to(installed.venv)
    shipped = sorted(Path(n).name for n in zipfile.ZipFile(wheel).namelist()
                     if n.startswith("agentpost/sql/") and Path(n).name[0].isdigit())
    installed.run("agentpost", "--dsn", empty_dsn, "migrate")
    applied = query(empty_dsn, "SELECT name FROM agentpost.schema_migrations ORDER BY version")
    assert [name for (name,) in applied] == shipped


def test_the_example_dags_parse(installed: Installed) -> None:
    """Every example DAG file parses except the Spark one and the LLM ones, whose import
    errors say what to install."""
    dags = installed.cwd / "dags"
    shutil.rmtree(dags, ignore_errors=True)
    shutil.copytree(REPO / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import json, sys; from pathlib import Path\n"
            "from airflow.dag_processing.dagbag import DagBag\n"
            "bag = DagBag(dag_folder=sys.argv[1])\n"
            "print(json.dumps({'errors': {Path(k).name: str(v) for k, v in "
            "bag.import_errors.items()}, 'files': sorted({Path(d.fileloc).name for d in "
            "bag.dags.values()})}))")
    parsed = json.loads(installed.run("python", "-c", code, str(dags)).stdout.splitlines()[-1])
    assert set(parsed["errors"]) == SPARK_DAGS | LLM_DAGS, parsed["errors"]
    errors = parsed["errors"]
    assert all(INSTALL in errors[name] for name in SPARK_DAGS), errors
    assert all(AI_INSTALL in errors[name] for name in LLM_DAGS), errors
    assert set(parsed["files"]) == {p.name for p in dags.glob("*.py")} - SPARK_DAGS - LLM_DAGS


@pytest.mark.parametrize("argv", [("spark", "check"), ("spark", "audit"),
                                  ("spark", "analytics", "--start", "2026-01-01"),
                                  ("bench", "spark", "--scale", "0.0001")])
def test_spark_commands_say_what_to_install(installed: Installed, argv: tuple[str, ...]) -> None:
    proc = installed.run("agentpost", *argv, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert INSTALL in proc.stderr
