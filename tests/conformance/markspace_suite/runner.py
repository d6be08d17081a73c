"""Run the markspace package's own test suite against agentpost.marks (docs/marks.md, "The
package's own suite").

- `fetch_suite()` downloads the package's sdist with pip (``pip download --no-binary :all:
  --no-deps``, the hash pinned, so a changed file is refused), into a cache outside the
  repository (``AGENTPOST_MARKSPACE_SUITE_CACHE``, else ``$XDG_CACHE_HOME/agentpost``, else
  ``~/.cache/agentpost``), and unpacks its ``tests/`` only. A file lock makes concurrent
  test workers download once; a cached sdist with the right hash is reused.
- `run_suite()` runs those tests in a subprocess pytest whose rootdir is the unpacked sdist
  (its own conftest, none of ours), with the alias package ``alias/markspace`` first on its
  path and the plugin ``alias/markspace_suite_plugin.py`` (known differences as strict
  xfails, the hypothesis profile, the import report), and parses its JUnit XML.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "0.2.0b0"
SDIST = f"markspace-{VERSION}.tar.gz"
SHA256 = "d04843ee577df93a880a804bc88da00cc7302a7e5345ac87f5dff2fc3043138b"
ALIAS = Path(__file__).resolve().parent / "alias"
#: how long one run may take before it is killed (it takes minutes on a loaded machine)
TIMEOUT = 1500.0
#: what the run's own pytest.ini says: nothing but the rootdir and the test path
PYTEST_INI = "[pytest]\ntestpaths = tests\n"


def cache_dir() -> Path:
    explicit = os.environ.get("AGENTPOST_MARKSPACE_SUITE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentpost" / "markspace-suite"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(into: Path) -> Path:
    """The sdist, fetched by pip with its hash required; raises with pip's words."""
    with tempfile.TemporaryDirectory(dir=into) as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"markspace=={VERSION} --hash=sha256:{SHA256}\n")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             "--require-hashes", "-r", str(requirements), "-d", scratch,
             "--disable-pip-version-check", "--no-input", "--quiet"],
            capture_output=True, text=True, timeout=600, check=False,
        )
        fetched = Path(scratch) / SDIST
        if done.returncode != 0 or not fetched.exists():
            raise RuntimeError(f"pip could not download {SDIST} (PyPI must be reachable):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
        if _sha256(fetched) != SHA256:
            raise RuntimeError(f"{SDIST} does not have the pinned sha256")
        target = into / SDIST
        os.replace(fetched, target)
        return target


def _unpack(tarball: Path, into: Path) -> None:
    """Only the sdist's tests/ (never its markspace/ sources: the run must not find them),
    with a pytest.ini of our own beside them."""
    prefix = f"markspace-{VERSION}/tests/"
    shutil.rmtree(into, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=into.parent))
    try:
        with tarfile.open(tarball) as archive:
            members = [m for m in archive.getmembers()
                       if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            archive.extractall(staging, members=members, filter="data")
        (staging / f"markspace-{VERSION}" / "pytest.ini").write_text(PYTEST_INI)
        os.replace(staging / f"markspace-{VERSION}", into)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_suite() -> Path:
    """The unpacked suite's root (it holds ``tests/`` and ``pytest.ini``), downloaded and
    unpacked once per cache."""
    cache = cache_dir()
    with _locked(cache / ".lock"):
        tarball = cache / SDIST
        if not (tarball.exists() and _sha256(tarball) == SHA256):
            tarball = _download(cache)
        root = cache / f"markspace-{VERSION}"
        stamp = root / ".unpacked"
        if not stamp.exists() or stamp.read_text() != SHA256:
            _unpack(tarball, root)
            stamp.write_text(SHA256)
        return root


@dataclass
class SuiteRun:
    """What one run of the suite did, test id -> outcome, and what it imported."""

    outcomes: dict[str, str]
    messages: dict[str, str]
    report: dict
    output: str
    seconds: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)

    def with_outcome(self, *outcomes: str) -> dict[str, str]:
        return {t: self.messages.get(t, "") for t, o in self.outcomes.items() if o in outcomes}


def _outcome(case: ET.Element) -> tuple[str, str]:
    for child in case:
        message = child.get("message") or ""
        if child.tag in ("failure", "error"):
            return child.tag, message or (child.text or "")[-500:]
        if child.tag == "skipped":
            return ("xfailed" if child.get("type") == "pytest.xfail" else "skipped"), message
    return "passed", ""


def _test_id(case: ET.Element) -> str:
    """The pytest node id from a JUnit (xunit1) test case: file, classes, name."""
    path = case.get("file") or ""
    module = path.removesuffix(".py").replace("/", ".")
    classes = (case.get("classname") or "").removeprefix(module).strip(".")
    parts = [path, *(classes.split(".") if classes else ()), case.get("name") or ""]
    return "::".join(p for p in parts if p)


def parse_junit(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, float]]:
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    durations: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = _test_id(case)
        outcomes[test_id], messages[test_id] = _outcome(case)
        durations[test_id] = float(case.get("time") or 0.0)
    return outcomes, messages, durations


def run_suite(root: Path, workdir: Path, known: dict[str, str], dsn: str | None) -> SuiteRun:
    """Run the suite at ``root`` on the alias (on Postgres at ``dsn`` if given, else in
    memory), the ``known`` differences marked strict xfail; files go to ``workdir``."""
    junit, report, known_file = (workdir / n for n in ("junit.xml", "imports.json",
                                                       "known.json"))
    known_file.write_text(json.dumps(known))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MARKSPACE_SUITE_"))}
    path = os.pathsep.join(p for p in (str(ALIAS), env.get("PYTHONPATH")) if p)
    env.update(PYTHONPATH=path, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               MARKSPACE_SUITE_KNOWN=str(known_file), MARKSPACE_SUITE_REPORT=str(report))
    if dsn is not None:
        env["MARKSPACE_SUITE_DSN"] = dsn
    command = [sys.executable, "-m", "pytest", "tests", "-q", "-rfE", "--color=no",
               "-p", "_hypothesis_pytestplugin", "-p", "markspace_suite_plugin",
               "-p", "no:cacheprovider", "--hypothesis-profile=agentpost-suite",
               f"--junitxml={junit}", "-o", "junit_family=xunit1", "--rootdir", str(root)]
    output = _run(command, root, env)
    if not junit.exists():
        raise AssertionError(f"the suite run wrote no results:\n{output[-6000:]}")
    outcomes, messages, durations = parse_junit(junit)
    imports = json.loads(report.read_text()) if report.exists() else {}
    return SuiteRun(outcomes, messages, imports, output, durations=durations,
                    seconds=sum(durations.values()))


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run ``command`` in a process group of its own; on timeout the whole group is
    killed, so no worker or server it started is left behind."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(
            f"the suite run took over {TIMEOUT:g} s:\n{output[-6000:]}") from None
    return output


#: how many tests the sdist's suite has, and how many must pass on each backend (the rest:
#: the known differences, each a strict xfail)
SUITE_SIZE = 325
MUST_PASS = 318


def problems(run: SuiteRun, backend: str, known: dict[str, str]) -> list[str]:
    """What is wrong with ``run`` (empty: the suite conforms): a test that failed or errored
    (a known difference that passed fails too: strict xfail), a known difference that did
    not run, too few passes, or an import that is not the alias."""
    found = [f"{t}: {m}" for t, m in run.with_outcome("failure", "error").items()]
    xfailed = set(run.with_outcome("xfailed"))
    found += [f"known difference {t} did not fail as expected" for t in set(known) - xfailed]
    found += [f"{t} failed without being a known difference" for t in xfailed - set(known)]
    passed = len(run.with_outcome("passed"))
    if len(run.outcomes) != SUITE_SIZE or passed < MUST_PASS:
        found.append(f"{passed} of {len(run.outcomes)} tests passed; the suite has "
                     f"{SUITE_SIZE}, at least {MUST_PASS} must pass")
    return found + import_problems(run.report, backend)


def import_problems(report: dict, backend: str) -> list[str]:
    """The run must have imported the alias (this directory's ``markspace``), each
    ``markspace.*`` module must be agentpost's, and MarkSpace must be the backend's."""
    if not report:
        return ["the run wrote no import report"]
    found = []
    if report["backend"] != backend:
        found.append(f"the alias ran on {report['backend']}, not {backend}")
    if not report["modules"].get("markspace", "").startswith(str(ALIAS)):
        found.append(f"markspace came from {report['modules'].get('markspace')}, not the alias")
    for name, real in report["module_names"].items():
        if name != "markspace" and not (real.startswith("agentpost.marks.")
                                        or (name, real) == ("markspace.space", "markspace.space")):
            found.append(f"{name} is {real} ({report['modules'][name]}), not agentpost's")
    wanted = {"memory": "agentpost.marks.space.MarkSpace",
              "postgres": "agentpost.marks.postgres.PostgresMarkSpace"}[backend]
    if wanted not in report["mark_space_bases"]:
        found.append(f"markspace.MarkSpace is {report['mark_space']}, not a {wanted}")
    return found
