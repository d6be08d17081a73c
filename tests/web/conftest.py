"""Fixtures of the agentpost page's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.store import EnvelopeStore


@pytest.fixture(scope="module")
def web(module_dsn: str) -> Iterator[Any]:
    """The agentpost page in Airflow's API app on ``module_dsn``'s store (web_support.py)."""
    from web_support import airflow_web

    with airflow_web(module_dsn) as page:
        yield page


@pytest.fixture(scope="module")
def st(request: pytest.FixtureRequest, module_dsn: str) -> Iterator[EnvelopeStore]:
    """A store on ``module_dsn`` with the test module's coordinator workspace ``BOSS`` (a
    module can define its own)."""
    with EnvelopeStore(module_dsn) as s:
        s.create_workspace("coordinator", workspace_id=request.module.BOSS)
        yield s
