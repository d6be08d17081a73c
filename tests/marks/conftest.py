"""Fixtures of the mark-space tests: a space factory of each backend in turn
(tests/marks_backends.py holds the backends and the factory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marks_backends import BACKENDS, SpaceFactory, factories


@pytest.fixture(params=BACKENDS, name="make_space")
def make_space_fixture(request: pytest.FixtureRequest) -> Iterator[SpaceFactory]:
    """``make_space(scopes, clock=T0)`` -> a fresh, empty space with ``scopes`` registered,
    of each backend in turn. Parametrized itself,
    so a test can pick one backend with ``parametrize("make_space", [...], indirect=True)``."""
    yield from factories(request, request.param)


@pytest.fixture(params=BACKENDS, name="backend")
def backend_fixture(request: pytest.FixtureRequest) -> str:
    """The backend of the test, "memory" then "postgres", for tests that branch on it."""
    return request.param


@pytest.fixture(name="new_space")
def new_space_fixture(request: pytest.FixtureRequest, backend: str) -> Iterator[SpaceFactory]:
    """``new_space(scopes, clock=T0)`` -> a fresh, empty space of ``backend``."""
    yield from factories(request, backend)
