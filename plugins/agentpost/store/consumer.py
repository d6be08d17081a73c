"""A consumer of one inbox with Courier's credits (§6.2): nothing is handed to it while its
credit is 0, each envelope handed over spends one, and waiting uses LISTEN/NOTIFY with
polling as the fallback, so an envelope reaches a waiting consumer as soon as it is delivered.

Credits belong to the live consumer (a process, a trigger, a WebSocket): they are not stored,
and die with it. What is durable is the lease: a consumer that dies leaves leases that expire
and return their envelopes to the inbox.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import Lease
from agentpost.protocol.models import Envelope
from agentpost.store.listen import Listener

if TYPE_CHECKING:
    from agentpost.store.envelopes import EnvelopeStore


class Subscriber:
    """Leases envelopes of `workspace_id` as credit allows."""

    def __init__(self, store: EnvelopeStore, workspace_id: str, *, ttl: float = 30.0,
                 holder: str | None = None, poll_interval: float = 1.0,
                 listener: Listener | None = None) -> None:
        self.store = store
        self.workspace_id = store.workspace(workspace_id).id
        self.ttl = ttl
        self.holder = holder or f"sub-{uuid.uuid4().hex[:12]}"
        self.poll_interval = poll_interval
        self.listener = listener or Listener(store.dsn, [self.workspace_id])
        self._own_listener = listener is None
        self.credit = 0
        self.received = 0

    def grant(self, n: int) -> int:
        """Add `n` credits; returns the credit now available."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInput("credit must be a non-negative whole number")
        self.credit += n
        return self.credit

    def take(self, timeout: float = 0.0) -> list[Lease]:
        """Lease up to `credit` envelopes, waiting up to `timeout` seconds for some to
        arrive. Returns [] when the credit is 0 (nothing is pushed without credit) or when
        nothing arrived in time."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self.credit > 0:
            self.listener.connect()
        while self.credit > 0:
            leases = self.store.lease(self.workspace_id, max=self.credit, ttl=self.ttl,
                                      holder=self.holder)
            if leases:
                self.credit -= len(leases)
                self.received += len(leases)
                return leases
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            # nothing announces a lease running out or a nack's delay ending: wake for it
            due = self.store.next_due(self.workspace_id)
            self.listener.wait(min(left, self.poll_interval,
                                   self.poll_interval if due is None else due + 0.005))
        return []

    def ack(self, lease: Lease | str) -> None:
        self.store.ack(lease.token if isinstance(lease, Lease) else lease)

    def nack(self, lease: Lease | str, delay: float = 0) -> Envelope:
        return self.store.nack(lease.token if isinstance(lease, Lease) else lease, delay)

    def close(self) -> None:
        if self._own_listener:
            self.listener.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
