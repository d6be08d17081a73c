"""The markspace package's own test suite, from its sdist, run on agentpost.marks in memory
(docs/marks.md, "The package's own suite"): every test passes but the known differences
(tests/conformance/markspace_suite/known.py), which fail as strict xfails with their reasons.

The sdist is downloaded at test time by pip (PyPI must be reachable, or the cache filled),
never committed; tests/conformance/markspace_suite/runner.py says how.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from markspace_suite.known import known
from markspace_suite.runner import fetch_suite, problems, run_suite

pytestmark = pytest.mark.slow


def test_the_package_suite_passes_on_the_in_memory_space(tmp_path: Path) -> None:
    expected = known("memory")
    run = run_suite(fetch_suite(), tmp_path, expected, dsn=None)
    assert problems(run, "memory", expected) == [], run.output[-6000:]
