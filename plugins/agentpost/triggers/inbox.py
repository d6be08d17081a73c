"""`InboxTrigger`: fires when an inbox holds enough envelopes a consumer could lease.

It waits on LISTEN (the store NOTIFYs ``agentpost_inbox`` whenever an inbox gains leasable
envelopes) with polling as the fallback, so a deferred sensor wakes as soon as an envelope is
delivered, not at its next poll (issue 3, "Live delivery"). Notifications are only hints:
every wake-up re-counts in the store. The machinery it shares with the other triggers
(`WatchTrigger` and below) is in `agentpost.triggers.base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentpost.hooks import AgentpostHook
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import workspace_of
from agentpost.store import EnvelopeStore
from agentpost.store.watches import check_filter, matching
from agentpost.triggers.base import WatchTrigger

CLASSPATH = "agentpost.triggers.InboxTrigger"


def available(store: EnvelopeStore, workspace_id: str) -> int:
    """Envelopes of the inbox a lease could take now (lease's own conditions, the blocking
    gate included). Blocking, synchronous: call it in a thread from async code."""
    return store.leasable(workspace_id)


def _at_least_one(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{what} must be a whole number of at least 1")
    return value


class InboxTrigger(WatchTrigger):
    """Fires once when at least `min_envelopes` envelopes of `workspace_id`'s inbox are
    available to lease; with a filter (`type`, `sender`, `in_reply_to`, `priority`), only
    envelopes matching all of its fields count.

    The store is found through the Airflow connection `conn_id` (resolved in the triggerer,
    so no password travels in the trigger's kwargs, which Airflow stores and logs), or
    through `dsn` when one is given explicitly.

    Event payloads: ``{"status": "ready", "workspace_id", "available"}``, with a filter also
    ``"envelope_ids"`` (the first 100 matching, in processing order), or ``{"status":
    "error", "workspace_id", "message"}`` (one line) when the inbox cannot be watched:
    unknown workspace, no store configured, a store that does not answer the first few
    attempts. A store that answered once and then drops (a restart, a failover) is waited
    out: every poll tries again, until the deferral's timeout.
    """

    def __init__(self, workspace_id: str, min_envelopes: int = 1, poll_interval: float = 30.0,
                 conn_id: str = AgentpostHook.default_conn_name, dsn: str | None = None,
                 type: str | None = None, sender: str | None = None,
                 in_reply_to: str | None = None, priority: str | None = None,
                 not_before: float | None = None, end_task: bool = False,
                 result_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workspace_id = workspace_of(workspace_id)
        self.min_envelopes = _at_least_one(min_envelopes, "min_envelopes")
        self._reach(poll_interval, conn_id, dsn, not_before, end_task, result_key)
        self.filter = {k: v for k, v in check_filter(type, sender, in_reply_to,
                                                     priority).items() if v is not None}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "workspace_id": self.workspace_id,
            "min_envelopes": self.min_envelopes,
            **self._reach_kwargs(),
            **self.filter,
        }

    def listen_keys(self) -> Sequence[str]:
        return [self.workspace_id]

    def subject(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id}

    def label(self) -> str:
        return f"inbox {self.workspace_id}"

    def check(self, store: EnvelopeStore) -> dict[str, Any] | None:
        """Count what a lease could take (matching the filter, if any)."""
        ws = self.workspace_id
        if not self.filter:
            n = available(store, ws)
            ready: dict[str, Any] = {"status": "ready", "workspace_id": ws, "available": n}
        else:
            found = matching(store, ws, **self.filter)
            n = found.available
            ready = {"status": "ready", "workspace_id": ws, "available": n,
                     "envelope_ids": list(found.envelope_ids)}
        self.log.debug("inbox %s: %d envelope(s) available", ws, n)
        return ready if n >= self.min_envelopes else None
