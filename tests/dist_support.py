"""Building the distributions in tests: from a copy of the tree (the live tree may change
meanwhile), without build isolation (setuptools and wheel come from the dev extra), offline."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".pg",
    ".airflow-demo",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "build",
    "dist",
    ".*_cache",
    ".hypothesis",
)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """`argv`, which must succeed (the end of its output is the assertion message when it
    does not: pip's, for one, ends with the error after pages of progress)."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return proc


def tracked_files(root: Path = REPO) -> list[str]:
    """The repository's files, relative to `root`: what git tracks in a checkout, else (an
    unpacked sdist, which is the repository: MANIFEST.in) the sdist's own file list."""
    if (root / ".git").exists():
        out = run(["git", "ls-files"], cwd=root).stdout.splitlines()
    else:
        (sources,) = root.glob("*.egg-info/SOURCES.txt")
        out = sources.read_text().splitlines()
    return [name for name in out if (root / name).is_file()]


def copy_source(target: Path) -> Path:
    """A copy of the working tree at `target`, without what git ignores here."""
    shutil.copytree(REPO, target, ignore=IGNORE)
    return target


def build_wheel(source: Path, dist: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(dist), str(source)])
    (built,) = dist.glob("airflow_agentpost-*.whl")
    return built


def build_sdist(source: Path, dist: Path) -> Path:
    """The sdist, by setuptools' PEP 517 hook (what `python -m build --sdist` calls)."""
    dist.mkdir(parents=True, exist_ok=True)
    name = run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                                      "print(b.build_sdist(sys.argv[1]))", str(dist)],
               cwd=source).stdout.strip().splitlines()[-1]
    return dist / name
