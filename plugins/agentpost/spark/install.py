"""Whether this environment can run the Spark jobs, checked before a job imports pyspark.

The jobs need the `spark` extra: pyspark, whose wheel carries Spark's JVM (the jars), and the
Apache Spark provider. The provider also requires pyspark-client, the Spark Connect client,
which installs its Python files into the same `pyspark` directory: whichever of the two pip
installs last wins, and `pip check` sees nothing wrong. Spark pairs its Python side only with
the JVM of its own version; another pairing may work for a while and then break inside py4j,
far from its cause. So a job refuses it at start, in one line that names the fix. Nothing here
imports pyspark (it may be missing or mixed).
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

INSTALL = 'pip install "airflow-agentpost[spark]"'
_VERSION = re.compile(r"""__version__[^=]*=\s*["']([^"']+)["']""")
_CORE_JAR = re.compile(r"spark-core_[0-9.]+-(.+)\.jar")


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _python_files_version(package_dir: Path) -> str | None:
    """The version pyspark's Python files say they are (`pyspark.__version__`, read without
    importing it): pyspark's own, or pyspark-client's when that overwrote them."""
    try:
        found = _VERSION.search((package_dir / "version.py").read_text(encoding="utf-8"))
    except OSError:
        return None
    return found.group(1) if found else None


def _jvm_version(package_dir: Path) -> str | None:
    """The version of the Spark the jobs run on: its spark-core jar, in SPARK_HOME (set by
    spark-submit, or by hand for a separate Spark) or else in the pyspark wheel."""
    jars = Path(os.environ.get("SPARK_HOME") or package_dir) / "jars"
    try:
        names = [p.name for p in jars.iterdir()]
    except OSError:
        return None
    return next((m.group(1) for n in names if (m := _CORE_JAR.fullmatch(n))), None)


def problem() -> str | None:
    """What keeps this environment from running the Spark jobs, in one line naming the fix;
    None when pyspark's Python files match Spark's JVM (the pyspark wheel's jars, or those of
    a Spark that SPARK_HOME names, beside which pyspark-client's files alone are enough)."""
    spec = find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return f"pyspark is not installed: {INSTALL}"
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    python, jvm = _python_files_version(package_dir), _jvm_version(package_dir)
    spark_home = os.environ.get("SPARK_HOME")
    if jvm is None and spark_home:
        return f"SPARK_HOME ({spark_home}) has no Spark jars: point it at a Spark {python}"
    if jvm is None and _dist_version("pyspark") is None:
        return (f"only pyspark-client (the Spark Connect client) is installed, not pyspark, "
                f"which the jobs need: {INSTALL}")
    if jvm is None:
        return ("pyspark has no Spark jars: pip install --no-deps --force-reinstall "
                f'"pyspark=={metadata.version("pyspark")}"')
    if python != jvm:
        client = _dist_version("pyspark-client")
        whose = f" (pyspark-client {client} overwrote them)" if client == python else ""
        return (f"pyspark is mixed: its Python files are {python}{whose}, Spark's JVM is "
                f'{jvm}: pip install --no-deps --force-reinstall "pyspark=={jvm}"')
    return None


def summary() -> str:
    """The line `agentpost spark check` prints for a usable install."""
    package_dir = Path(next(iter(find_spec("pyspark").submodule_search_locations)))
    return f"pyspark {_python_files_version(package_dir)}: Python files and Spark's JVM agree"
