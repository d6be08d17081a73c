"""Whether this environment can run the Spark jobs, checked before a job imports pyspark.

The jobs need the `spark` extra: pyspark, whose wheel carries Spark's JVM (the jars), and the
Apache Spark provider. The provider also requires pyspark-client, the Spark Connect client,
which installs its Python files into the same `pyspark` directory: whichever of the two pip
installs last wins, and `pip check` sees nothing wrong. pyspark-client's files beside another
version's JVM fail deep inside py4j, so a job refuses such an install at start, in one line
that names the fix. Nothing here imports pyspark (it may be missing or mixed).
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
    None when pyspark is installed and its Python files match Spark's JVM."""
    spec = find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return f"pyspark is not installed: {INSTALL}"
    if _dist_version("pyspark") is None:
        return (f"only pyspark-client (the Spark Connect client) is installed, not pyspark, "
                f"which the jobs need: {INSTALL}")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    python, jvm = _python_files_version(package_dir), _jvm_version(package_dir)
    if jvm is None:
        if os.environ.get("SPARK_HOME"):
            return (f"SPARK_HOME ({os.environ['SPARK_HOME']}) has no Spark jars: point it at "
                    f"a Spark {python} or unset it")
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
    return f"pyspark {metadata.version('pyspark')}: Python files and Spark's JVM agree"
