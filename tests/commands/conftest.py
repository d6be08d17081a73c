"""Fixtures of the command (SMCL) tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger


@pytest.fixture
def ledger(store: EnvelopeStore) -> Iterator[CommandLedger]:
    """A CommandLedger on the test's store (a module can define its own)."""
    with CommandLedger(store) as ledger:
        yield ledger
