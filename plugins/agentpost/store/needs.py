"""What the command ledger and the saga runner need from a mark space, in plain values.

A command asks a person for its confirmation, and a saga for help with a compensation it
could not run, through a blocking need; the ledger then reads how the need was answered.
That is all the store asks of a mark space, so it names those few operations here
(`NeedBoard`), with strings, mappings and UUIDs, and imports nothing from `agentpost.marks`.

The smallest design that keeps both sides independent: the store states the interface, and
the layer that composes store and marks implements it. `agentpost.smcl.MarkSpaceNeeds` is a
NeedBoard over any mark space (in memory or Postgres); `agentpost.smcl.CommandLedger` and
`agentpost.smcl.SagaRunner` take the mark space itself (``marks=``, ``space=``, ``agent=``)
and adapt it, the call shape the store's classes had before. The store's own classes take a
NeedBoard (or nothing), so a test or another backend can answer needs without a mark space.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class MarkView:
    """A mark as the ledger reads it: enough to follow a need to the action resolving it."""

    id: uuid.UUID
    mark_type: str
    agent_id: uuid.UUID | None
    #: the need a resolution supersedes (None for a mark that supersedes nothing)
    supersedes: uuid.UUID | None
    #: the action that resolved it (None unless this is a resolved need)
    resolved_by: uuid.UUID | None
    #: True unless this is an action that succeeded
    failed: bool
    #: an action's result (None for other marks)
    result: Any


@runtime_checkable
class NeedBoard(Protocol):
    """Blocking needs posted and answered on a mark space, by a writer the board knows."""

    @property
    def space(self) -> str | None:
        """The name of a Postgres mark space in the store's database, whose resolutions the
        store can look up itself; None for any other space (callers pass resolution ids)."""
        ...

    def ask(self, scope: str, question: str, context: Mapping[str, Any], *,
            priority: float) -> uuid.UUID:
        """Write a blocking need in ``scope``; its id."""
        ...

    def answer(self, scope: str, need_id: str, action: str,
               result: Mapping[str, Any]) -> bool:
        """Resolve the need with an action ``action`` carrying ``result``; False when the
        space refused (resolved meanwhile by someone else), and nothing changed."""
        ...

    def mark(self, mark_id: uuid.UUID) -> MarkView | None:
        """The mark ``mark_id`` (None when the space has no such mark)."""
        ...


def board(value: Any, what: str) -> NeedBoard | None:
    """``value`` when it is a NeedBoard (or None); a TypeError naming the composing layer for
    anything else, a mark space in particular."""
    if value is None or isinstance(value, NeedBoard):
        return value
    raise TypeError(f"{what}: a NeedBoard (agentpost.store.needs) or None, not "
                    f"{type(value).__name__}; for a mark space use agentpost.smcl's "
                    "CommandLedger and SagaRunner, which adapt it")
