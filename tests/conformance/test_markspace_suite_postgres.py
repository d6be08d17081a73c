"""The markspace package's own test suite, from its sdist, run on agentpost.marks on
Postgres (docs/marks.md, "The package's own suite"): `markspace.MarkSpace` is a
PostgresMarkSpace on a fresh database (created for this module, dropped after it), each
space under a name of its own. Every test passes but the known differences
(tests/conformance/markspace_suite/known.py), which fail as strict xfails with their reasons.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from markspace_suite.known import known
from markspace_suite.runner import fetch_suite, problems, run_suite

pytestmark = pytest.mark.slow


def test_the_package_suite_passes_on_the_postgres_space(tmp_path: Path, module_dsn: str) -> None:
    expected = known("postgres")
    run = run_suite(fetch_suite(), tmp_path, expected, dsn=module_dsn)
    assert problems(run, "postgres", expected) == [], run.output[-6000:]
