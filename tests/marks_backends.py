"""The two mark-space backends behind one factory, for the tests of ``agentpost.marks``.

``make_space(kind, scopes, clock, dsn=None)`` builds an in-memory ``MarkSpace`` (``kind`` =
"memory") or a ``PostgresMarkSpace`` (``kind`` = "postgres") on ``dsn``, under a space name
of its own, so one database serves a whole test module: a space is cheap to create by
contract (no DDL, no scan), and two spaces never see each other's marks.

``BACKENDS`` is the parameter list of the backend fixtures.

``SpaceFactory`` builds spaces of one backend and closes them all at teardown. Two fixtures of
tests/marks/conftest.py hand one out: ``make_space`` (parametrized itself) and ``new_space``
(parametrized through ``backend``, which a test can also take to branch on it).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.marks.space import MarkSpace

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres"),
]

# A fixed start for the injectable clocks: a realistic unix time, so float resolution at
# this magnitude (about 0.24 µs) is what production sees.
T0 = 1_700_000_000.0

Clock = float | Callable[[], float] | None

# The least float above 0: read(min_strength=ALIVE) returns exactly the marks at strength > 0,
# every live mark. min_strength <= 0 also returns unsuperseded marks at strength 0 (expired
# intents, resolved need copies, fully invalidated marks), as the markspace package does.
ALIVE = 5e-324


def unique_space_name() -> str:
    return f"t_{uuid.uuid4().hex}"


def make_space(kind: str, scopes: Iterable[Any], clock: Clock, dsn: str | None = None,
               **options: Any) -> Any:
    """A fresh, empty space of backend ``kind`` with ``scopes`` registered (``options``: the
    constructor's keyword arguments both backends share, such as ``max_content_bytes``)."""
    scopes = list(scopes)
    if kind == "memory":
        return MarkSpace(scopes=scopes, clock=clock, **options)
    if kind == "postgres":
        if dsn is None:
            raise ValueError("a postgres space needs a dsn")
        return PostgresMarkSpace(dsn=dsn, scopes=scopes, clock=clock, space=unique_space_name(),
                                 **options)
    raise ValueError(f"unknown backend {kind!r}")


def close_space(space: Any) -> None:
    close = getattr(space, "close", None)
    if callable(close):
        close()


class SpaceFactory:
    """Builds spaces of one backend; ``close_all()`` closes every space it built."""

    def __init__(self, kind: str, dsn: str | None) -> None:
        self.kind = kind
        self.dsn = dsn
        self._made: list[Any] = []

    def __call__(self, scopes: Iterable[Any], clock: Clock = T0, **options: Any) -> Any:
        space = make_space(self.kind, scopes, clock, self.dsn, **options)
        self._made.append(space)
        return space

    @contextlib.contextmanager
    def scoped(self, scopes: Iterable[Any], clock: Clock = T0, **options: Any) -> Iterator[Any]:
        """A space closed when the block ends (hypothesis examples make many)."""
        space = make_space(self.kind, scopes, clock, self.dsn, **options)
        try:
            yield space
        finally:
            close_space(space)

    def close_all(self) -> None:
        while self._made:
            close_space(self._made.pop())


def factories(request: pytest.FixtureRequest, kind: str) -> Iterator[SpaceFactory]:
    """The body of the factory fixtures: a factory of ``kind`` (a Postgres one draws the
    module's database, ``module_dsn``), whose spaces are closed at teardown."""
    dsn = request.getfixturevalue("module_dsn") if kind == "postgres" else None
    factory = SpaceFactory(kind, dsn)
    yield factory
    factory.close_all()
