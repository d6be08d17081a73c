"""The built distribution (not the editable install) contains what the package needs.

Builds a wheel from a copy of the source tree without build isolation (setuptools and wheel
come from the dev extra), installs it with --no-deps into a fresh virtualenv whose only link to
the test environment is a path entry for its site-packages (the dependencies), and inspects it
there. No network is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".pg",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "build",
    "dist",
    ".*_cache",
    ".hypothesis",
)
# source directory -> where its files land in the wheel
PACKAGE_ROOTS = {"plugins/agentpost": "agentpost", "operators": "agentpost/operators"}


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=IGNORE)
    _run(
        [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--no-index", "--wheel-dir", str(work / "dist"), str(source),
        ]
    )  # fmt: skip
    (built,) = (work / "dist").glob("airflow_agentpost-*.whl")
    return built


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
        from agentpost.store.migrations import load
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
