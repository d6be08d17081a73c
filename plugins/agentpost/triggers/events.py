"""`InboxEventTrigger`: starts a DAG run for each envelope that arrives in an inbox.

A `BaseEventTrigger` for asset watchers (``Asset(..., watchers=[AssetWatcher(name=...,
trigger=InboxEventTrigger(workspace_id))])`` and ``schedule=[asset]``): every event it
yields becomes an asset event, and so a run of each DAG scheduled on the asset.

The condition "the inbox holds envelopes" stays true until someone consumes them, so the
trigger must claim what it reports, or it would start runs forever. It runs as an Airflow
3.3 shared stream in ack mode: its producer (`ArrivalProducer`) claims one arrival at a time,
*pending*, in the store (sql/0045_event_claim_acks.sql) and broadcasts it; the trigger's
filter yields the event; Airflow calls the producer's `advance` only once the asset event
is stored in its metadata database, and only then is the claim confirmed. A pending claim
keeps every other instance of the watcher off the envelope while its owner (the producer's
database session) lives; when the owner is gone (a triggerer killed) or the claim is older
than `claim_timeout`, the envelope is reported again. So no arrival's run is lost; the one
window left is a triggerer killed after Airflow stored the event and before the
confirmation committed (about one state sync, ~1 s), which reports that arrival twice: a
duplicate run, with the same envelope id in its `triggering_asset_events`.

Arrivals count from the watcher's first claim on (envelopes already in the inbox then are
not events).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from contextlib import aclosing
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from agentpost.hooks import AgentpostHook
from agentpost.protocol.errors import AgentpostError, StoreUnavailable
from agentpost.protocol.leases import workspace_of
from agentpost.protocol.models import Envelope
from agentpost.store import EnvelopeStore
from agentpost.store.checks import ref as _ref
from agentpost.store.event_claims import DEFAULT_CLAIM_TIMEOUT, ClaimSession
from agentpost.store.listen import AsyncListener
from agentpost.triggers.base import StoreAccess, TriggerStore, first_check, one_line, positive

CLASSPATH = "agentpost.triggers.events.InboxEventTrigger"

#: what the producer hands Airflow with each arrival, for its `advance`: the envelope id
#: and the owner whose pending claim it is
Claim = tuple[str, int]


def arrival(envelope: Envelope, watcher: str) -> dict[str, Any]:
    """An arrival as the event's payload (the asset event's ``extra["payload"]``): the
    envelope's id and routing fields; the content stays in the store (``store.get(id)``)."""
    return {"envelope_id": envelope.id, "workspace_id": envelope.to,
            "sender": envelope.sender, "type": envelope.type,
            "priority": envelope.priority, "in_reply_to": envelope.in_reply_to,
            "delivered_at": None if envelope.delivered_at is None
            else envelope.delivered_at.isoformat(), "watcher": watcher}


class _Claims(TriggerStore):
    """The producer's store and claim session, used from worker threads one call at a
    time (the claim loop and Airflow's advance pump both call in)."""

    def __init__(self, store: EnvelopeStore, session: ClaimSession) -> None:
        super().__init__(store)
        self.session = session

    def next(self) -> tuple[Envelope, int] | None:
        """The next arrival, claimed pending, with its owner; None when there is none."""
        with self._lock:
            self.store.workspace(self.session.workspace_id)  # unknown inbox -> NotFound
            ids, owner = self.session.claim(max=1)
            return (self.store.get(ids[0]), owner) if ids else None

    def settle(self, confirmed: list[str], released: list[Claim]) -> None:
        """Confirm the claims Airflow stored, release those it did not."""
        with self._lock:
            self.session.confirm(confirmed)
            for owner in {o for _, o in released}:
                self.session.release([i for i, o in released if o == owner], owner)

    def release(self) -> None:
        self.session.close()  # the lock goes: pending claims left are handed out again
        super().release()


class ArrivalProducer(SharedStreamProducer):
    """The broker side of one watcher's shared stream: claims arrivals pending and paces
    them `min_interval` apart; `advance` confirms what Airflow stored. With ``final=True``
    (the trigger's standalone `run`, which has no ack channel) claims are final at once."""

    def __init__(self, trigger: InboxEventTrigger, *, final: bool = False) -> None:
        self.trigger = trigger
        self.final = final
        self.label = f"inbox {trigger.workspace_id} ({trigger.watcher})"
        self._claims: _Claims | None = None

    async def open_stream(self) -> AsyncIterator[tuple[dict[str, Any], Claim]]:
        """Yield ``(arrival, (envelope id, owner))`` per arrival, forever; wait on LISTEN
        (or the poll) when none is left. Cannot watch (unknown inbox, no store): raises."""
        trigger = self.trigger
        target = await trigger._target()
        store = await asyncio.to_thread(target.open)
        self._claims = claims = _Claims(store, ClaimSession(
            store.dsn, trigger.watcher, trigger.workspace_id, trigger.claim_timeout))
        listener = AsyncListener(store.dsn, [trigger.workspace_id])
        try:
            await listener.wait(0)  # LISTEN before the first claim: no arrival slips between
            found = await first_check(claims.next, trigger.log, self.label)
            while True:
                if found is not None:
                    envelope, owner = found
                    if self.final:
                        await asyncio.to_thread(claims.settle, [envelope.id], [])
                    yield arrival(envelope, trigger.watcher), (envelope.id, owner)
                    await asyncio.sleep(trigger.min_interval)  # claim the next one after it
                else:
                    await listener.wait(trigger.poll_interval)
                found = await self._next(claims)
        finally:
            listener.close()

    async def _next(self, claims: _Claims) -> tuple[Envelope, int] | None:
        try:
            return await asyncio.to_thread(claims.next)
        except StoreUnavailable as exc:  # the store away: wait for the next poll
            self.trigger.log.warning("%s: cannot claim, retrying at the next poll: %s",
                                     self.label, one_line(exc))
            return None

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Airflow resolved these arrivals: confirm those whose asset events are stored
        (every subscriber acked), release the others to be reported again. A store error
        is logged, not raised: the claims stay pending and come back once their owner is
        gone, a duplicate rather than a loss (raising would end the whole stream)."""
        confirmed = [item.broker_payload[0] for item in batch if item.outcome.is_clean]
        released = [item.broker_payload for item in batch if not item.outcome.is_clean]
        if self._claims is None or not (confirmed or released):
            return
        try:
            await asyncio.to_thread(self._claims.settle, confirmed, released)
        except AgentpostError as exc:
            self.trigger.log.warning("%s: cannot confirm %d arrival(s), they may be reported "
                                     "again: %s", self.label, len(confirmed), one_line(exc))
        if released:
            self.trigger.log.warning("%s: Airflow did not store %d arrival(s); reporting "
                                     "again: %s", self.label, len(released),
                                     [i for i, _ in released])

    async def aclose(self) -> None:
        if self._claims is not None:
            self._claims.close_soon()


class InboxEventTrigger(StoreAccess, BaseEventTrigger):
    """Yields one event per envelope arriving in `workspace_id`'s inbox, each once per
    `watcher` (default ``inbox:<workspace_id>``; give two watchers of one inbox that must
    both see every arrival different names), twice only if a triggerer dies between
    Airflow storing the event and the claim's confirmation.

    :param workspace_id: the inbox (or its stream name ``agents/<id>/inbox``).
    :param agentpost_conn_id: the ``agentpost`` connection, resolved in the triggerer (else
        AGENTPOST_DSN); `dsn` overrides it (tests, scripts).
    :param poll_interval: the fallback poll; a delivery NOTIFYs the trigger at once.
    :param min_interval: seconds between two events. Airflow's scheduler keeps one queued
        asset-triggered run per DAG: an asset event stored while that run is being created
        is not in its ``triggering_asset_events`` and waits for the next arrival's run
        (seen under standalone with three envelopes sent at once: one run, one arrival).
        Pacing events a scheduler loop or two apart gives each its own run in the common
        case; arrivals wait unclaimed in the inbox meanwhile. A loaded scheduler still
        strands one now and then: the reactive factory's runs also take the claimed
        arrivals no run took yet (sql/0071_event_handled.sql).
    :param claim_timeout: seconds after which a pending claim whose owner still holds its
        database session is reported again anyway (its host lost without closing the
        connection). Keep it above ``[triggerer] shared_stream_ack_timeout`` (300 s), or a
        slow but live triggerer's arrivals are reported twice.

    Any other keyword is an error: Airflow's BaseTrigger would swallow it silently, and
    ``MessageQueueTrigger(scheme="agentpost", ...)`` (`agentpost.triggers.messaging`) hands
    every keyword it gets to this class, so a misspelt one (``conn_id=``) would otherwise
    watch with the default.
    """

    def __init__(self, workspace_id: str, agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 watcher: str | None = None, poll_interval: float = 30.0,
                 dsn: str | None = None, min_interval: float = 2.0,
                 claim_timeout: float = DEFAULT_CLAIM_TIMEOUT, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"InboxEventTrigger got unexpected keyword argument(s) "
                            f"{', '.join(sorted(kwargs))}; it takes workspace_id, "
                            "agentpost_conn_id, watcher, poll_interval, min_interval, "
                            "claim_timeout and dsn")
        super().__init__()
        self.workspace_id = workspace_of(workspace_id)
        self.agentpost_conn_id = self.conn_id = agentpost_conn_id
        self.watcher = _ref(watcher or f"inbox:{self.workspace_id}", "watcher")
        self.poll_interval = positive(poll_interval, "poll_interval")
        self.min_interval = positive(min_interval, "min_interval")
        self.claim_timeout = positive(claim_timeout, "claim_timeout")
        self.dsn = dsn

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"workspace_id": self.workspace_id,
                           "agentpost_conn_id": self.agentpost_conn_id,
                           "watcher": self.watcher, "poll_interval": self.poll_interval,
                           "min_interval": self.min_interval,
                           "claim_timeout": self.claim_timeout, "dsn": self.dsn}

    def shared_stream_key(self) -> Hashable:
        """One stream per watcher and store: Airflow runs one producer for it and confirms
        each claim only after the asset event is stored (ack mode)."""
        return (CLASSPATH, self.watcher, self.workspace_id, self.agentpost_conn_id, self.dsn)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ArrivalProducer:
        return ArrivalProducer(cls(**kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        """One event per arrival, yielded before pulling the next (Airflow binds the event
        to the arrival it came from by that order)."""
        async for payload in shared_stream:
            self.log.info("inbox %s (%s): envelope %s arrived", self.workspace_id,
                          self.watcher, payload["envelope_id"])
            yield TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Standalone (the triggerer uses the shared stream instead): no ack channel, so a
        claim is final before its event is yielded, at most once as before ack mode."""
        producer = ArrivalProducer(self, final=True)
        try:
            async with aclosing(producer.open_stream()) as stream:
                async for payload, _ in stream:
                    yield TriggerEvent(payload)
        finally:
            await producer.aclose()
