"""The pytest plugin of the markspace suite run (``-p markspace_suite_plugin``).

- Marks each known difference (``MARKSPACE_SUITE_KNOWN``: a JSON file, test id -> reason,
  for this run's backend) ``xfail(strict=True)`` with its reason, so the run itself says why
  each of them fails, and one that starts to pass fails the run.
- Loads the hypothesis profile of the run: the package's own "ci" profile (50 examples,
  too_slow not checked), derandomized (the same examples every run), without deadlines
  (a Postgres example under a loaded CI machine may take longer than 200 ms; timing is not
  behaviour) and without an example database (nothing written beside the tests).
- Writes ``MARKSPACE_SUITE_REPORT`` (JSON) at the end: where `markspace` and each
  `markspace.*` module came from and what `markspace.MarkSpace` is, so the caller can check
  that the alias, and never the installed package, was imported.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

PROFILE = "agentpost-suite"
settings.register_profile(
    PROFILE,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    deadline=None,
    database=None,
)


def _known() -> dict[str, str]:
    path = os.environ.get("MARKSPACE_SUITE_KNOWN")
    return json.loads(Path(path).read_text()) if path else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known = _known()
    for item in items:
        reason = known.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def _origin(module: object) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__name__", ""))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("MARKSPACE_SUITE_REPORT")
    if not path:
        return
    import markspace

    modules = {name: _origin(module) for name, module in sorted(sys.modules.items())
               if name == "markspace" or name.startswith("markspace.")}
    space_class = markspace.MarkSpace
    Path(path).write_text(json.dumps({
        "backend": markspace.BACKEND,
        "modules": modules,
        "module_names": {name: getattr(sys.modules[name], "__name__", "")
                         for name in modules},
        "mark_space": f"{space_class.__module__}.{space_class.__qualname__}",
        "mark_space_bases": [f"{c.__module__}.{c.__qualname__}" for c in space_class.__mro__],
    }, indent=1))
