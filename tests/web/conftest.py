"""Fixtures of the agentpost page's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def web(module_dsn: str) -> Iterator[Any]:
    """The agentpost page in Airflow's API app on ``module_dsn``'s store (web_support.py)."""
    from web_support import airflow_web

    with airflow_web(module_dsn) as page:
        yield page
