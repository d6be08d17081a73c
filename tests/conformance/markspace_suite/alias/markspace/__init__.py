"""`markspace`, the name of the protocol's reference package, over `agentpost.marks`.

Only the suite run of tests/conformance/test_markspace_suite_*.py puts this directory first on a
subprocess's path, so the package's own tests (from its sdist) import agentpost instead of
the package: `markspace` re-exports `agentpost.marks`, and `markspace.core`,
`markspace.guard`, ... are `agentpost.marks.core`, `agentpost.marks.guard`, ... themselves.

With ``MARKSPACE_SUITE_DSN`` set, the suite runs on Postgres: `markspace.MarkSpace` (and
`markspace.space.MarkSpace`) build a `PostgresMarkSpace` on that database, each under a
space name of its own, with the package's constructor parameters.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import uuid
from typing import Any

from agentpost.marks import *  # noqa: F403 (every name, the lazily loaded ones too)
from agentpost.marks import __all__ as _names

__all__ = list(_names)

#: the package's submodules the suite imports, each an agentpost.marks module
SUBMODULES = ("core", "space", "guard", "envelope", "barrier", "probe", "compose", "schedule",
              "budget", "rate_limit", "telemetry")
DSN = os.environ.get("MARKSPACE_SUITE_DSN") or None
BACKEND = "postgres" if DSN else "memory"


def _postgres_space_class() -> type:
    from agentpost.marks.postgres import PostgresMarkSpace

    class MarkSpace(PostgresMarkSpace):
        """The package's `MarkSpace(scopes, clock, max_marks_per_agent)` on Postgres: a new,
        empty space of its own on the suite's database."""

        def __init__(self, scopes: Any = None, clock: Any = None,
                     max_marks_per_agent: int | None = None, **options: Any) -> None:
            options.setdefault("space", f"suite_{uuid.uuid4().hex}")
            super().__init__(scopes, clock, max_marks_per_agent, dsn=DSN, **options)

    MarkSpace.__module__ = "markspace.space"
    return MarkSpace


def _space_module(space_class: type) -> types.ModuleType:
    """`markspace.space`: agentpost.marks.space's names, with MarkSpace on Postgres."""
    real = importlib.import_module("agentpost.marks.space")
    module = types.ModuleType("markspace.space", real.__doc__)
    module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    module.MarkSpace = space_class
    return module


def _install() -> None:
    this = sys.modules[__name__]
    modules = {name: importlib.import_module(f"agentpost.marks.{name}") for name in SUBMODULES}
    if DSN:
        space_class = _postgres_space_class()
        modules["space"] = _space_module(space_class)
        this.MarkSpace = space_class
    for name, module in modules.items():
        sys.modules[f"{__name__}.{name}"] = module
        setattr(this, name, module)


_install()
