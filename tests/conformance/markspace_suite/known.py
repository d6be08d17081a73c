"""The tests of the markspace package's own suite that fail on agentpost.marks on purpose.

Each is a difference docs/marks.md lists ("Where we knowingly differ"), where we follow the
Markspace spec and the package does not. The suite run marks each one ``xfail(strict=True)``
with its reason, so a difference that goes away fails the run as surely as a new failure.
Test ids are relative to the sdist's root.
"""

from __future__ import annotations

P17 = ("Markspace P17 and §6.2.1 phase 3: the losers of a deferred resolution boundary "
       "receive BLOCKED; the package answers CONFLICT (docs/marks.md, 'Deferred losers are "
       "BLOCKED')")

#: test id -> reason, on both backends
BOTH: dict[str, str] = {
    "tests/test_guard.py::TestDeferredResolution::test_p31_highest_confidence_wins": P17,
    "tests/test_guard.py::TestDeferredResolution::test_p31_tie_broken_by_created_at": P17,
}

#: test id -> reason, on one backend only
ONLY: dict[str, dict[str, str]] = {"memory": {}, "postgres": {}}


def known(backend: str) -> dict[str, str]:
    """The known differences of a run on ``backend`` ("memory" or "postgres")."""
    return {**BOTH, **ONLY[backend]}
