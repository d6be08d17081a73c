"""The built distribution (not the editable install) contains what the package needs.

Builds a wheel from a copy of the source tree without build isolation (setuptools and wheel
come from the dev extra), installs it with --no-deps into a fresh virtualenv whose only link to
the test environment is a path entry for its site-packages (the dependencies), and inspects it
there. No network is needed.
"""

from __future__ import annotations

import email
import json
import os
import re
import sys
import sysconfig
import tarfile
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from dist_support import REPO, build_sdist, build_wheel, copy_source, tracked_files
from dist_support import run as _run

# source directory -> where its files land in the wheel
PACKAGE_ROOTS = {"plugins/agentpost": "agentpost", "operators": "agentpost/operators"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    return build_wheel(copy_source(work / "src"), work / "dist")


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    target = wheel.parent.parent / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(target)])
    python = target / "bin" / "python"
    _run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
            "--no-index", str(wheel),
        ]
    )  # fmt: skip
    # the dependencies come from the test environment, appended after the venv's own path;
    # a plain path line does not run that environment's .pth files (its editable install)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                .stdout.strip())  # fmt: skip
    (site / "zz_test_environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return target


def _source_of(wheel: Path) -> Path:
    """The copy of the tree the wheel was built from (the live tree may change meanwhile)."""
    return wheel.parent.parent / "src"


def test_every_source_file_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    source = _source_of(wheel)
    expected = set()
    for source_dir, package_dir in [*PACKAGE_ROOTS.items(), ("sql", "agentpost/sql")]:
        root = source / source_dir
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                expected.add(f"{package_dir}/{path.relative_to(root).as_posix()}")
    missing = sorted(expected - names)
    assert not missing, (
        "not in the wheel (declare the package in [tool.setuptools] packages, or the file "
        f"pattern in [tool.setuptools.package-data]): {missing}"
    )


def test_every_package_directory_is_declared() -> None:
    declared = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {"agentpost.sql"}
    for source_dir, package_dir in PACKAGE_ROOTS.items():
        root = REPO / source_dir
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and "__pycache__" not in path.parts and any(path.glob("*.py")):
                relative = path.relative_to(root).parts
                found.add(".".join([*package_dir.split("/"), *relative]))
    assert found <= declared, f"undeclared packages: {sorted(found - declared)}"


def test_installed_wheel_imports_and_ships_migrations(
    wheel: Path, venv: Path, tmp_path: Path
) -> None:
    check = textwrap.dedent(
        """
        import importlib.resources, json
        import agentpost, agentpost.operators
        from agentpost.pg.migrations import load
        sql = importlib.resources.files("agentpost.sql")
        print(json.dumps({
            "loaded": [m.name for m in load()],
            "agentpost": [str(p) for p in agentpost.__path__],
            "operators": agentpost.operators.__file__,
            "sql": sorted(p.name for p in sql.iterdir() if p.name.endswith(".sql")),
        }))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = _run(
        [
            str(
                venv / "bin" / "python",
            ),
            "-c",
            check,
        ],
        cwd=tmp_path,
        env=env,
    )
    found = json.loads(out.stdout)
    prefix = str(venv.resolve())
    assert all(str(Path(p).resolve()).startswith(prefix) for p in found["agentpost"]), found
    assert str(Path(found["operators"]).resolve()).startswith(prefix), found
    assert found["sql"], "no .sql migrations in the installed agentpost.sql package"
    assert found["loaded"] == [name for name in found["sql"] if name[0].isdigit()]
    assert found["sql"] == sorted(p.name for p in (_source_of(wheel) / "sql").glob("*.sql"))


def test_console_script_is_installed(venv: Path) -> None:
    script = venv / "bin" / "agentpost"
    assert script.is_file()
    assert os.access(script, os.X_OK)
    first_line = script.read_text().splitlines()[0]
    assert first_line.startswith("#!") and str(venv) in first_line
    assert "agentpost.cli" in script.read_text()


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as whl:
        (name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(whl.read(name))


def test_wheel_metadata_license_urls_and_extras(wheel: Path) -> None:
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    with zipfile.ZipFile(wheel) as whl:
        (found,) = [n for n in whl.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert whl.read(found) == (REPO / "LICENSE").read_bytes()
    assert re.search(r"Apache License\s+Version 2\.0", (REPO / "LICENSE").read_text())
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls and all(u.startswith("https://") for u in urls.values()), urls
    assert meta["Requires-Python"] in (">=3.11,<3.14", "<3.14,>=3.11")
    # nothing of Spark without the `spark` extra; the postgres extra carries psycopg 3
    requires = meta.get_all("Requires-Dist")
    base = [r for r in requires if "extra ==" not in r]
    assert not [r for r in base if re.match(r"(pyspark|apache-airflow-providers-apache-spark)",
                                             r)], base
    spark = [re.split(r"[<>=;\s]", r)[0] for r in requires if 'extra == "spark"' in r]
    assert sorted(spark) == ["apache-airflow-providers-apache-spark", "pyspark"]
    assert any(r.startswith("psycopg[binary]") and 'extra == "postgres"' in r for r in requires)


def test_the_pypi_description_has_no_relative_links(wheel: Path) -> None:
    """PyPI resolves no relative link (README.md's docs/... links), so the long description
    links only to absolute URLs."""
    meta = _metadata(wheel)
    assert meta["Description-Content-Type"] == "text/markdown"
    text = re.sub(r"```.*?```|`[^`\n]*`", "", meta.get_payload(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)|<a\s[^>]*href=\"([^\"]+)\"|src=\"([^\"]+)\"", text)
    relative = [t for group in targets for t in group if t and not t.startswith("https://")]
    assert not relative, relative
    assert 'pip install "apache-airflow==' in meta.get_payload()  # the pinned install


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("sdist")
    return build_sdist(copy_source(work / "src"), work / "dist")


def test_the_sdist_is_the_repository(sdist: Path) -> None:
    """Every file git tracks is in the sdist (the tests and their helpers among them), and
    nothing of a local tree (caches, virtualenvs, bytecode) is."""
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = sorted(set(tracked_files()) - names)
    assert not missing, f"not in the sdist (MANIFEST.in): {missing}"
    junk = sorted(n for n in names if re.search(r"(^|/)(__pycache__|\.venv|\.pg)(/|$)|\.pyc$", n))
    assert not junk, junk
    assert {"LICENSE", "constraints.txt", "tests/conftest.py", "tests/dbtools.py"} <= names


@pytest.mark.slow
def test_the_tests_run_from_the_unpacked_sdist(sdist: Path, tmp_path: Path) -> None:
    """Every test module, helper imports included, collects from the unpacked sdist, and the
    tests that read the repository's file list run there (against that tree, with no git)."""
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    collected = _run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                      "-p", "no:cacheprovider"], cwd=unpacked, env=env).stdout
    modules = {line.split("::", 1)[0] for line in collected.splitlines() if "::" in line}
    assert modules == {p.relative_to(unpacked).as_posix()
                       for p in (unpacked / "tests").rglob("test_*.py")}
    # the tests that read the repository's file list (git's in a clone, the sdist's here)
    _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
          "tests/system/test_packaging.py::test_every_package_directory_is_declared",
          "tests/system/test_packaging.py::test_the_sdist_is_the_repository",
          "tests/system/test_docs_standalone.py",
          "tests/system/test_docker_compose.py::test_everything_the_dockerfile_copies_is_in_the_repository"],
         cwd=unpacked, env=env)
