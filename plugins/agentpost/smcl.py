"""Commands and sagas whose people are asked through a mark space: store and marks composed.

The store's `CommandLedger` and `SagaRunner` post their blocking needs (a command's
confirmation, a saga's escalation) through a `NeedBoard` (agentpost.store.needs), an interface
in plain values, so the store imports nothing from `agentpost.marks` and the marks nothing from
the store. This module, above both, implements it:

- `MarkSpaceNeeds` is a NeedBoard over any mark space (`MarkSpace` in memory or
  `PostgresMarkSpace`), writing as the agent it is given;
- `CommandLedger` and `SagaRunner` here are the store's, taking the mark space itself
  (``marks=space``; ``space=space, agent=...``) and adapting it: the call shape and behaviour
  the store's classes had when they imported the marks. A NeedBoard is accepted as it is.

Use these whenever a mark space is involved; without one they are the store's classes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from agentpost.marks import (
    Action,
    Agent,
    MarkspaceError,
    MarkSpaceProtocol,
    MarkType,
    Need,
    Scope,
    UnknownScope,
)
from agentpost.protocol.commands import RedactionPolicy
from agentpost.store import commands as _commands
from agentpost.store import sagas as _sagas
from agentpost.store.envelopes import EnvelopeStore
from agentpost.store.needs import MarkView, NeedBoard

__all__ = ["CommandLedger", "MarkSpaceNeeds", "SagaRunner"]


class MarkSpaceNeeds:
    """A NeedBoard over a mark space: needs and their answers are marks written by
    ``writer()`` (called for each write, so a factory may give each write its own agent)."""

    def __init__(self, marks: MarkSpaceProtocol, writer: Callable[[], Agent]) -> None:
        self.marks = marks
        self.writer = writer

    @property
    def space(self) -> str | None:
        name = getattr(self.marks, "space", None)  # a PostgresMarkSpace's name
        return name if isinstance(name, str) else None

    def ask(self, scope: str, question: str, context: Mapping[str, Any], *,
            priority: float) -> uuid.UUID:
        need = Need(scope=scope, question=question, blocking=True, priority=priority,
                    context=context)
        return self.marks.write(self.writer(), need)

    def answer(self, scope: str, need_id: str, action: str,
               result: Mapping[str, Any]) -> bool:
        try:
            done = self.marks.write(self.writer(), Action(scope=scope, action=action,
                                                          result=result))
            self.marks.resolve(uuid.UUID(need_id), done)
        except MarkspaceError:
            return False
        return True

    def mark(self, mark_id: uuid.UUID) -> MarkView | None:
        mark = self.marks.get(mark_id)
        if mark is None:
            return None
        return MarkView(id=mark.id, mark_type=str(mark.mark_type), agent_id=mark.agent_id,
                        supersedes=getattr(mark, "supersedes", None),
                        resolved_by=getattr(mark, "resolved_by", None),
                        failed=getattr(mark, "failed", True),
                        result=getattr(mark, "result", None))


def _commands_board(marks: Any, need_scope: str) -> NeedBoard | None:
    """The ledger's board: each need and answer written by a fresh ``agentpost-commands``
    agent allowed needs and actions in ``need_scope``."""
    if marks is None or isinstance(marks, NeedBoard):
        return marks
    return MarkSpaceNeeds(marks, lambda: Agent(
        name="agentpost-commands", scopes={need_scope: (MarkType.NEED, MarkType.ACTION)}))


def _sagas_board(space: Any, scope: str, agent: Agent | None) -> tuple[NeedBoard, Agent | None]:
    """The runner's board: ``scope`` registered with default rules if the space does not know
    it; needs written by ``agent``, by default a ``saga-runner`` allowed needs there."""
    if isinstance(space, NeedBoard):
        return space, agent
    try:
        space.get_scope(scope)
    except UnknownScope:
        space.register_scope(Scope(name=scope))
    writer = agent or Agent(name="saga-runner", scopes={scope: (MarkType.NEED,)})
    return MarkSpaceNeeds(space, lambda: writer), writer


class CommandLedger(_commands.CommandLedger):
    """The store's CommandLedger; ``marks`` a mark space (or a NeedBoard) where confirmation
    needs are posted, in scope ``need_scope``."""

    def __init__(self, store_or_dsn: EnvelopeStore | str, *,
                 redaction: RedactionPolicy | None = None, marks: Any = None,
                 need_scope: str = "commands", lease_ttl: float = 60.0) -> None:
        super().__init__(store_or_dsn, redaction=redaction,
                         marks=_commands_board(marks, need_scope), need_scope=need_scope,
                         lease_ttl=lease_ttl)


class SagaRunner(_sagas.SagaRunner):
    """The store's SagaRunner; ``space`` a mark space (or a NeedBoard) that receives the
    blocking need of an escalation, written by ``agent`` in ``scope`` (registered with default
    rules if the space does not know it)."""

    def __init__(self, ledger: _commands.CommandLedger, handlers: Mapping[str, _sagas.Handler],
                 *, space: Any = None, scope: str = "sagas", agent: Agent | None = None,
                 attempts: int = 3, backoff: float = 0.5,
                 sleep: Callable[[float], Any] = time.sleep,
                 policy: str = "saga-compensation") -> None:
        # the arguments are checked before the space is touched (a scope registered)
        super().__init__(ledger, handlers, scope=scope, attempts=attempts, backoff=backoff,
                         sleep=sleep, policy=policy)
        self.agent: Agent | None = None
        if space is not None:
            self.space, self.agent = _sagas_board(space, scope, agent)
