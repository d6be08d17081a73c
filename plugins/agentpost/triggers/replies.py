"""`ReplyTrigger`: waits for the answer to an envelope.

An answer (feedback, a result, a question back) is an envelope whose ``in_reply_to`` is the
original's id, delivered to the original's sender. Its delivery NOTIFYs ``agentpost_inbox``
with the sender's workspace (sql/0005_leases.sql), so the trigger LISTENs there and checks
on each notification, polling as the fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentpost.hooks import AgentpostHook
from agentpost.protocol.models import Envelope
from agentpost.store import EnvelopeStore
from agentpost.store.checks import ref as _ref
from agentpost.store.watches import reply_to
from agentpost.triggers.base import WatchTrigger

CLASSPATH = "agentpost.triggers.replies.ReplyTrigger"


def envelope_json(envelope: Envelope) -> dict[str, Any]:
    """An envelope as a JSON object (an event payload, an XCom): the §3 fields by their wire
    names, and its delivery bookkeeping."""
    return envelope.model_dump(mode="json", by_alias=True)


class ReplyTrigger(WatchTrigger):
    """Fires once an answer to envelope `envelope_id` (of `type`, if given) was delivered to
    its sender; `sender` (the original's sender workspace) narrows the notifications listened
    to, without it every inbox notification wakes a check.

    Event payloads: ``{"status": "replied", "envelope_id", "reply": {...the answer...}}``,
    or ``{"status": "error", "envelope_id", "message"}`` (unknown envelope, no store).
    """

    def __init__(self, envelope_id: str, type: str | None = None, sender: str | None = None,
                 poll_interval: float = 30.0, conn_id: str = AgentpostHook.default_conn_name,
                 dsn: str | None = None, not_before: float | None = None,
                 end_task: bool = False, result_key: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.envelope_id = _ref(envelope_id, "envelope id")
        self.type = None if type is None else _ref(type, "type")
        self.sender = None if sender is None else _ref(sender, "sender")
        self._reach(poll_interval, conn_id, dsn, not_before, end_task, result_key)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"envelope_id": self.envelope_id, "type": self.type,
                           "sender": self.sender, **self._reach_kwargs()}

    def listen_keys(self) -> Sequence[str] | None:
        return None if self.sender is None else [self.sender]

    def subject(self) -> dict[str, Any]:
        return {"envelope_id": self.envelope_id}

    def label(self) -> str:
        return f"replies to {self.envelope_id}"

    def check(self, store: EnvelopeStore) -> dict[str, Any] | None:
        reply = reply_to(store, self.envelope_id, self.type)
        if reply is None:
            return None
        return {"status": "replied", "envelope_id": self.envelope_id,
                "reply": envelope_json(reply)}
