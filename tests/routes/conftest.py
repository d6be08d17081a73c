"""Fixtures of the route (Asya) tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.routes import RouteStore


@pytest.fixture
def routes(request: pytest.FixtureRequest, store: EnvelopeStore) -> Iterator[RouteStore]:
    """A RouteStore on the test's store with the test module's ``ACTORS`` set up."""
    rs = RouteStore(store)
    rs.setup(request.module.ACTORS)
    yield rs
