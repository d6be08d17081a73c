"""`NeedResolvedTrigger`: waits until a Markspace need is resolved.

A need is resolved when `PostgresMarkSpace.resolve` writes the copy of it that carries
``resolved_by`` and supersedes it; that insert NOTIFYs ``agentpost_need`` with the need's id
(sql/0040_watch_notifications.sql), so the trigger LISTENs for it and polls as the fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from agentpost.hooks import AgentpostHook
from agentpost.protocol.errors import InvalidInput
from agentpost.store import EnvelopeStore
from agentpost.store.checks import text as _text
from agentpost.store.watches import need_resolution
from agentpost.triggers.base import WatchTrigger

CLASSPATH = "agentpost.triggers.needs.NeedResolvedTrigger"
#: the channel a need's resolution is notified on (payload: the need's id)
NEED_CHANNEL = "agentpost_need"


def mark_id(value: object, what: str) -> str:
    """A mark or agent id (a UUID, or its text) as canonical text."""
    try:
        return str(UUID(str(value)))
    except ValueError:
        raise InvalidInput(f"{what} must be a UUID, not {value!r}") from None


def space_name(value: object) -> str:
    return _text(value, "mark space", limit=200)


class NeedResolvedTrigger(WatchTrigger):
    """Fires once need `need_id` of the mark space named `space` is resolved.

    Event payloads: ``{"status": "resolved", "need_id", "space", "resolution_id",
    "resolved_by"}`` (the resolving copy and the action that resolved it), or
    ``{"status": "error", "need_id", "space", "message"}`` (no such mark, not a need, no
    store).
    """

    channel = NEED_CHANNEL

    def __init__(self, need_id: str | UUID, space: str = "default",
                 poll_interval: float = 30.0, conn_id: str = AgentpostHook.default_conn_name,
                 dsn: str | None = None, not_before: float | None = None,
                 end_task: bool = False, result_key: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.need_id = mark_id(need_id, "need id")
        self.space = space_name(space)
        self._reach(poll_interval, conn_id, dsn, not_before, end_task, result_key)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"need_id": self.need_id, "space": self.space,
                           **self._reach_kwargs()}

    def listen_keys(self) -> Sequence[str]:
        return [self.need_id]

    def subject(self) -> dict[str, Any]:
        return {"need_id": self.need_id, "space": self.space}

    def label(self) -> str:
        return f"need {self.need_id} in {self.space!r}"

    def check(self, store: EnvelopeStore) -> dict[str, Any] | None:
        state = need_resolution(store, self.space, self.need_id)
        if not state.resolved:
            return None
        return {"status": "resolved", **self.subject(), "resolution_id": state.resolution_id,
                "resolved_by": state.resolved_by}
