"""`InboxEventTrigger`: starts a DAG run for each envelope that arrives in an inbox.

A `BaseEventTrigger` for asset watchers (``Asset(..., watchers=[AssetWatcher(name=...,
trigger=InboxEventTrigger(workspace_id))])`` and ``schedule=[asset]``): every event it
yields becomes an asset event, and so a run of each DAG scheduled on the asset.

The condition "the inbox holds envelopes" stays true until someone consumes them, so the
trigger must claim what it reports, or it would start runs forever. It claims arrivals in
the store (sql/0041_event_claims.sql): one envelope at a time, under a per-watcher row lock,
in a transaction that commits before the event is yielded. A claimed envelope is never
reported again by any instance of the trigger with the same `watcher`: a triggerer restart
or a second triggerer running the same trigger picks up after the last claim, and an
arrival while no triggerer runs is claimed when one starts. Arrivals count from the
watcher's first claim on (envelopes already in the inbox then are not events).

The one window left: a triggerer killed after a claim committed and before Airflow stored
the asset event loses that arrival's run (at most once, never twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from agentpost.hooks import AgentpostHook
from agentpost.protocol.errors import StoreUnavailable
from agentpost.protocol.leases import workspace_of
from agentpost.protocol.models import Envelope
from agentpost.store import EnvelopeStore
from agentpost.store.checks import ref as _ref
from agentpost.store.listen import AsyncListener
from agentpost.store.watches import claim_arrivals
from agentpost.triggers.inbox import StoreAccess, TriggerStore, first_check, one_line, positive

CLASSPATH = "agentpost.triggers.events.InboxEventTrigger"


def arrival(envelope: Envelope, watcher: str) -> dict[str, Any]:
    """An arrival as the event's payload (the asset event's ``extra["payload"]``): the
    envelope's id and routing fields; the content stays in the store (``store.get(id)``)."""
    return {"envelope_id": envelope.id, "workspace_id": envelope.to,
            "sender": envelope.sender, "type": envelope.type,
            "priority": envelope.priority, "in_reply_to": envelope.in_reply_to,
            "delivered_at": None if envelope.delivered_at is None
            else envelope.delivered_at.isoformat(), "watcher": watcher}


class _Claims(TriggerStore):
    def __init__(self, store: EnvelopeStore, watcher: str, workspace_id: str) -> None:
        super().__init__(store)
        self.watcher, self.workspace_id = watcher, workspace_id

    def next(self) -> Envelope | None:
        with self._lock:
            found = claim_arrivals(self.store, self.watcher, self.workspace_id, max=1)
        return found[0] if found else None


class InboxEventTrigger(StoreAccess, BaseEventTrigger):
    """Yields one event per envelope arriving in `workspace_id`'s inbox, each exactly once
    per `watcher` (default ``inbox:<workspace_id>``; give two watchers of one inbox that
    must both see every arrival different names).

    :param workspace_id: the inbox (or its stream name ``agents/<id>/inbox``).
    :param agentpost_conn_id: the ``agentpost`` connection, resolved in the triggerer (else
        AGENTPOST_DSN); `dsn` overrides it (tests, scripts).
    :param poll_interval: the fallback poll; a delivery NOTIFYs the trigger at once.
    :param min_interval: seconds between two events. Airflow's scheduler keeps one queued
        asset-triggered run per DAG: an asset event stored while that run is being created
        is not in its ``triggering_asset_events`` and waits for the next arrival's run
        (seen under standalone with three envelopes sent at once: one run, one arrival).
        Pacing events a scheduler loop or two apart gives each its own run; arrivals wait
        unclaimed in the inbox meanwhile.
    """

    def __init__(self, workspace_id: str, agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 watcher: str | None = None, poll_interval: float = 30.0,
                 dsn: str | None = None, min_interval: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workspace_id = workspace_of(workspace_id)
        self.agentpost_conn_id = self.conn_id = agentpost_conn_id
        self.watcher = _ref(watcher or f"inbox:{self.workspace_id}", "watcher")
        self.poll_interval = positive(poll_interval, "poll_interval")
        self.min_interval = positive(min_interval, "min_interval")
        self.dsn = dsn

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"workspace_id": self.workspace_id,
                           "agentpost_conn_id": self.agentpost_conn_id,
                           "watcher": self.watcher, "poll_interval": self.poll_interval,
                           "min_interval": self.min_interval, "dsn": self.dsn}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Claim and report arrivals, one at a time; wait on LISTEN (or the poll) when none
        is left. Cannot watch (unknown inbox, no store): raises, with a one-line reason."""
        target = await self._target()
        store = await asyncio.to_thread(target.open)
        claims = _Claims(store, self.watcher, self.workspace_id)
        listener = AsyncListener(store.dsn, [self.workspace_id])
        label = f"inbox {self.workspace_id} ({self.watcher})"
        try:
            await listener.wait(0)  # LISTEN before the first claim: no arrival slips between
            envelope = await first_check(claims.next, self.log, label)
            while True:
                if envelope is not None:
                    self.log.info("%s: envelope %s arrived", label, envelope.id)
                    yield TriggerEvent(arrival(envelope, self.watcher))
                    await asyncio.sleep(self.min_interval)  # claim the next one after it
                else:
                    await listener.wait(self.poll_interval)
                envelope = await self._claim(claims, label)
        finally:
            listener.close()
            claims.close_soon()

    async def _claim(self, claims: _Claims, label: str) -> Envelope | None:
        try:
            return await asyncio.to_thread(claims.next)
        except StoreUnavailable as exc:  # the store away: wait for the next poll
            self.log.warning("%s: cannot claim, retrying at the next poll: %s", label,
                             one_line(exc))
            return None
