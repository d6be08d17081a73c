"""`VerdictTrigger`: waits for a deferred-resolution boundary's verdict on an agent's intent.

The verdict is what the mark space keeps (`space.deferred_verdict(scope, resource,
agent_id)`, docs/marks.md "Deferred verdicts: the contract"); recording one NOTIFYs
``agentpost_verdict`` with the agent's id (sql/0040_watch_notifications.sql), so the trigger
LISTENs for it and polls as the fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from agentpost.hooks import AgentpostHook
from agentpost.marks.core import DeferredVerdict
from agentpost.store import EnvelopeStore
from agentpost.store.checks import text as _text
from agentpost.triggers.base import WatchTrigger
from agentpost.triggers.needs import mark_id, space_name

CLASSPATH = "agentpost.triggers.verdicts.VerdictTrigger"
#: the channel a boundary's verdicts are notified on (payload: the agent's id)
VERDICT_CHANNEL = "agentpost_verdict"


def verdict_json(verdict: DeferredVerdict) -> dict[str, Any]:
    """A verdict as an event payload's fields: ``verdict`` is ALLOW or BLOCKED."""
    fields = verdict.model_dump(mode="json")
    return {"verdict": "ALLOW" if verdict.allowed else "BLOCKED", **fields}


def current_verdict(dsn: str, space: str, scope: str, resource: str,
                    agent_id: str) -> DeferredVerdict | None:
    """The agent's verdict in the mark space, through the space's own API. Blocking."""
    from agentpost.marks.postgres import PostgresMarkSpace

    with PostgresMarkSpace(dsn=dsn, space=space, pool_size=1) as marks:
        return marks.deferred_verdict(scope, resource, UUID(agent_id))


class VerdictTrigger(WatchTrigger):
    """Fires once the latest boundary on (`scope`, `resource`) of mark space `space` has a
    verdict for agent `agent_id` (about intent `intent_id`, when given: an older verdict,
    about an intent the agent has since replaced, is not it).

    Event payloads: ``{"status": "decided", "verdict": "ALLOW"|"BLOCKED", "allowed",
    "winner_id", "intent_id", "agent_id", "boundary", ...}`` (the DeferredVerdict's fields),
    or ``{"status": "error", "agent_id", "scope", "resource", "message"}``.
    """

    channel = VERDICT_CHANNEL

    def __init__(self, scope: str, resource: str, agent_id: str | UUID,
                 space: str = "default", intent_id: str | UUID | None = None,
                 poll_interval: float = 30.0, conn_id: str = AgentpostHook.default_conn_name,
                 dsn: str | None = None, not_before: float | None = None,
                 end_task: bool = False, result_key: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scope = _text(scope, "scope", limit=200)
        self.resource = _text(resource, "resource", limit=500)
        self.agent_id = mark_id(agent_id, "agent id")
        self.space = space_name(space)
        self.intent_id = None if intent_id is None else mark_id(intent_id, "intent id")
        self._reach(poll_interval, conn_id, dsn, not_before, end_task, result_key)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"scope": self.scope, "resource": self.resource,
                           "agent_id": self.agent_id, "space": self.space,
                           "intent_id": self.intent_id, **self._reach_kwargs()}

    def listen_keys(self) -> Sequence[str]:
        return [self.agent_id]

    def subject(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "scope": self.scope, "resource": self.resource}

    def label(self) -> str:
        return f"verdict for {self.agent_id} on {self.scope}/{self.resource}"

    def check(self, store: EnvelopeStore) -> dict[str, Any] | None:
        verdict = current_verdict(store.dsn, self.space, self.scope, self.resource,
                                  self.agent_id)
        if verdict is None or (self.intent_id and str(verdict.intent_id) != self.intent_id):
            return None
        return {"status": "decided", "space": self.space, "scope": self.scope,
                "resource": self.resource, **verdict_json(verdict)}
