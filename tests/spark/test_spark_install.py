"""A Spark job refuses a pyspark it cannot run on, before importing it, in one line naming the
fix (agentpost.spark.install; docs/airflow.md, "Installing").

The mixed install is made of the real packages: this environment's pyspark files (its jars
linked, not copied) with the locked pyspark-client wheel's files written over them, which is
what pip leaves when it installs pyspark-client after pyspark. Each layout is a directory put
first on the path of a job's process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest

from agentpost.spark.apps import application
from agentpost.spark.install import INSTALL
from dist_support import REPO, run

PYSPARK = metadata.version("pyspark")
CLIENT = re.search(r"^pyspark-client==(\S+)$", (REPO / "constraints.txt").read_text(),
                   re.M).group(1)
REINSTALL = f'pip install --no-deps --force-reinstall "pyspark=={PYSPARK}"'


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("jars", "__pycache__"))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The locked pyspark-client wheel, installed alone into a directory (from uv's cache,
    which `make venv` filled, else the index)."""
    target = tmp_path_factory.mktemp("pyspark-client")
    run([str(Path(sys.executable).parent / "uv"), "pip", "install", "--python", sys.executable,
         "--no-deps", "--target", str(target), f"pyspark-client=={CLIENT}"])
    return target


PACKAGE = Path(next(iter(find_spec("pyspark").submodule_search_locations)))


def pyspark_files(site: Path, *, jars: bool = True) -> None:
    """This environment's pyspark: its Python files, and its dist-info and jars (linked)
    unless `jars` is false (Python files alone, as beside a separate Spark)."""
    _copy_tree(PACKAGE, site / "pyspark")
    if not jars:
        return
    if not (site / "pyspark" / "jars").exists():
        (site / "pyspark" / "jars").symlink_to(PACKAGE / "jars")
    info = f"pyspark-{PYSPARK}.dist-info"
    _copy_tree(Path(metadata.distribution("pyspark").locate_file(info)), site / info)


def client_files(site: Path, client: Path) -> None:
    for entry in client.iterdir():
        if entry.is_dir():
            _copy_tree(entry, site / entry.name)


def problem(site: Path, spark_home: Path | None = None) -> str | None:
    """install.problem() with `site` as the only place packages come from (-S: no
    site-packages), agentpost from the source tree."""
    code = "from agentpost.spark import install; print(install.problem())"
    env = {"PYTHONPATH": f"{site}:{REPO / 'plugins'}", "PATH": "/usr/bin:/bin"}
    out = run([sys.executable, "-S", "-c", code],
              env={**env, **({"SPARK_HOME": str(spark_home)} if spark_home else {})})
    line = out.stdout.strip()
    return None if line == "None" else line


def test_a_mixed_install_is_refused_with_the_command_that_repairs_it(
        tmp_path: Path, client: Path) -> None:
    """spark-submit's entry point of the audit, in this environment but for the mixed
    pyspark first on its path: exit 2, one line, nothing of pyspark imported."""
    assert CLIENT != PYSPARK, "the lock's pyspark and pyspark-client agree: nothing to mix"
    pyspark_files(tmp_path)
    client_files(tmp_path, client)
    proc = subprocess.run([sys.executable, application("audit")], capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert (f"pyspark is mixed: its Python files are {CLIENT} (pyspark-client {CLIENT} "
            f"overwrote them), Spark's JVM is {PYSPARK}: {REINSTALL}") in proc.stderr


def test_reinstalling_pyspark_last_repairs_it(tmp_path: Path, client: Path) -> None:
    pyspark_files(tmp_path)
    client_files(tmp_path, client)
    assert problem(tmp_path) is not None
    pyspark_files(tmp_path)  # what the reinstall writes: pyspark's own files again
    assert problem(tmp_path) is None


def test_pyspark_client_alone_cannot_run_the_jobs(tmp_path: Path, client: Path) -> None:
    client_files(tmp_path, client)
    assert problem(tmp_path) == ("only pyspark-client (the Spark Connect client) is installed, "
                                 f"not pyspark, which the jobs need: {INSTALL}")


def test_a_separate_spark_in_spark_home_decides(tmp_path: Path, client: Path) -> None:
    """Beside a Spark that SPARK_HOME names (spark-submit sets it), pyspark's Python files
    must match that Spark; pyspark-client's alone do when their versions agree."""
    pyspark_files(tmp_path, jars=False)
    assert problem(tmp_path, spark_home=PACKAGE) is None
    client_files(tmp_path, client)
    assert problem(tmp_path, spark_home=PACKAGE) == (
        f"pyspark is mixed: its Python files are {CLIENT} (pyspark-client {CLIENT} overwrote "
        f"them), Spark's JVM is {PYSPARK}: {REINSTALL}")
    assert problem(tmp_path, spark_home=tmp_path) == (
        f"SPARK_HOME ({tmp_path}) has no Spark jars: point it at a Spark {CLIENT}")


def test_without_pyspark_the_jobs_say_what_to_install(tmp_path: Path) -> None:
    assert problem(tmp_path) == f"pyspark is not installed: {INSTALL}"


def test_this_environment_is_consistent() -> None:
    """`make venv` reinstalls pyspark over pyspark-client and checks it."""
    out = run([str(Path(sys.executable).parent / "agentpost"), "spark", "check"])
    assert out.stdout.strip() == f"pyspark {PYSPARK}: Python files and Spark's JVM agree"


def test_pyspark_from_spark_home_s_zip_is_read_as_spark_submit_runs_it(tmp_path: Path) -> None:
    """spark-submit puts SPARK_HOME's python/lib/pyspark.zip first on the job's path, so the
    package's files are inside a zip, not a directory; they are that Spark's own and agree
    with its jars (the audit's task under spark-submit was refused as 'mixed' when the check
    read them as files)."""
    zipped = PACKAGE / "python" / "lib" / "pyspark.zip"
    assert zipped.is_file(), "the pyspark wheel carries python/lib/pyspark.zip"
    code = "from agentpost.spark import install; print(install.problem())"
    out = run([sys.executable, "-S", "-c", code],
              env={"PYTHONPATH": f"{zipped}:{REPO / 'plugins'}", "PATH": "/usr/bin:/bin",
                   "SPARK_HOME": str(PACKAGE)})
    assert out.stdout.strip() == "None", out.stdout
