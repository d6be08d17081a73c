"""Consuming an inbox: leases, acknowledgments, heartbeats and dead letters (Courier §6.3).

Each method is one server-side function (sql/0005_leases.sql), so one transaction: a lease
claims rows with FOR UPDATE SKIP LOCKED and records `envelope_leased` in the inbox's chain;
an ack consumes; a nack or an expiry returns the envelope to the tail of its priority level
and counts a redelivery; the fourth return dead-letters it. Leases and acks of one inbox run
side by side: beside another consumer they record on one of the inbox's consumer lanes
(sql/0083_consumer_lanes.sql, docs/design.md "Consumer lanes").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from agentpost.config import Settings
from agentpost.pg.db import Database
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import Lease, make_token, split_token
from agentpost.protocol.models import Envelope
from agentpost.store.checks import count as _count
from agentpost.store.checks import name as _name
from agentpost.store.checks import ref as _ref
from agentpost.store.checks import text as _text
from agentpost.store.queries import QUERIES

#: the longest lease or nack delay accepted (a day), in seconds
MAX_SECONDS = 86_400.0
MAX_BATCH = 10_000


def _seconds(value: object, what: str, *, allow_zero: bool) -> int:
    """Milliseconds from a number of seconds, checked."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number of seconds")
    if not (0 <= value <= MAX_SECONDS) or (value == 0 and not allow_zero):
        low = "0" if allow_zero else "more than 0"
        raise InvalidInput(f"{what} must be {low} and at most {MAX_SECONDS:.0f} seconds")
    return max(0 if allow_zero else 1, round(value * 1000))


def _tokens(tokens: Iterable[object]) -> tuple[list[str], list[str]]:
    ids, uuids = [], []
    for token in tokens:
        envelope_id, lease_uuid = split_token(token)
        ids.append(envelope_id)
        uuids.append(lease_uuid)
    if len(ids) > MAX_BATCH:
        raise InvalidInput(f"at most {MAX_BATCH} tokens at once")
    return ids, uuids


class LeaseOps:
    """The lease half of EnvelopeStore (mixed in; needs `db`, `_ref` and `_envelope_row`)."""

    db: Database
    settings: Settings

    #: provided by EnvelopeStore: an Envelope from a row of the envelope select list
    _envelope_row: Callable[[Sequence[Any]], Envelope]

    def lease(self, workspace_id: str, max: int = 1, ttl: float = 30.0, *,
              holder: str | None = None) -> list[Lease]:
        """Claim up to `max` deliverable envelopes of an inbox, in processing order (the
        blocking gate holds: while a blocking envelope waits, only blocking ones are
        leased). Expired leases of this inbox are returned (and counted) first. Concurrent
        callers never get the same envelope while its lease is live."""
        _count(max, "max")
        if not 1 <= max <= MAX_BATCH:
            raise InvalidInput(f"max must be between 1 and {MAX_BATCH}")
        ttl_ms = _seconds(ttl, "ttl", allow_zero=False)
        who = _ref(holder, "holder") if holder is not None else f"consumer-{uuid.uuid4().hex[:12]}"
        rows = self.db.fetchall(QUERIES["lease"], {
            "ws": _ref(workspace_id, "workspace id"), "max": max, "ttl_ms": ttl_ms,
            "holder": who})
        leases = []
        for row in rows:
            *env, token, attempt, until, lease_holder = row
            envelope = self._envelope_row(env)
            leases.append(Lease(token=make_token(envelope.id, str(token)), envelope=envelope,
                                attempt=attempt, expires_at=until, holder=lease_holder))
        return leases

    def ack(self, token: str) -> None:
        """Complete a lease: the envelope is consumed. A stale token (expired, or the
        envelope leased again since) raises LeaseLost and changes nothing."""
        self.ack_many([token])

    def ack_many(self, tokens: Iterable[str]) -> int:
        """Acknowledge many leases in one transaction, all or nothing."""
        if isinstance(tokens, str | bytes):
            raise InvalidInput("ack_many takes a list of tokens")
        ids, uuids = _tokens(tokens)
        if not ids:
            return 0
        return self.db.scalar("SELECT agentpost.ack(%s, %s::uuid[], %s)",
                              (ids, uuids, self.settings.durable_acks))

    def nack(self, token: str, delay: float = 0) -> Envelope:
        """Give a lease back: the envelope returns to the tail of its priority level, to be
        leased again after `delay` seconds. The fourth return dead-letters it (status
        `undeliverable`, reason `redelivery_exhausted`, a `failed` signal to its sender)."""
        envelope_id, lease_uuid = split_token(token)
        delay_ms = _seconds(delay, "delay", allow_zero=True)
        self.db.scalar("SELECT agentpost.nack(%s, %s::uuid, %s, %s)",
                       (envelope_id, lease_uuid, delay_ms, self.settings.durable_acks))
        return self.get(envelope_id)  # type: ignore[attr-defined]

    def heartbeat(self, token: str, ttl: float = 30.0) -> datetime:
        """Extend a live lease to `ttl` seconds from now; returns the new expiry."""
        envelope_id, lease_uuid = split_token(token)
        ttl_ms = _seconds(ttl, "ttl", allow_zero=False)
        return self.db.scalar("SELECT agentpost.heartbeat(%s, %s::uuid, %s)",
                              (envelope_id, lease_uuid, ttl_ms))

    def leasable(self, workspace_id: str) -> int:
        """How many envelopes `lease` could take from this inbox now (the blocking gate
        holds; a lease that ran out counts, since `lease` returns it first)."""
        ws = _ref(workspace_id, "workspace id")
        self.workspace(ws)  # type: ignore[attr-defined]  # unknown inbox -> NotFound
        return self.db.scalar(QUERIES["leasable"], {"ws": ws})

    def next_due(self, workspace_id: str) -> float | None:
        """Seconds until the next envelope of this inbox becomes leasable again by time
        alone (a lease running out, a nack's delay ending); None when nothing waits so."""
        return self.db.scalar(QUERIES["next_due"], {"ws": _ref(workspace_id, "workspace id")})

    def expire_leases(self) -> dict[str, Any]:
        """Return every expired lease in every inbox (each one counted, the exhausted ones
        dead-lettered). Leasing does this for its own inbox; run this to keep stats honest
        and to dead-letter envelopes nobody leases any more."""
        return self.db.scalar(QUERIES["expire_leases"])

    def dead_letters(self, workspace_id: str, limit: int = 100) -> list[Envelope]:
        """Envelopes of this inbox dead-lettered after exhausting their redeliveries."""
        _count(limit, "limit")
        rows = self.db.fetchall(QUERIES["dead_letters"],
                                {"ws": _ref(workspace_id, "workspace id"), "limit": limit})
        return [self._envelope_row(r) for r in rows]

    def requeue(self, workspace_id: str, envelope_id: str, user_id: str, *,
                key: str | None = None) -> dict[str, Any]:
        """The human highway's second chance for a dead letter (WACP §3 origin/originator):
        in one transaction
        the envelope becomes leasable again in its inbox (fresh redelivery count, tail of its
        level) and an `envelope_requeued` entry records `user_id` as originator. NotFound
        for an unknown envelope; Conflict when it is not a dead letter of `workspace_id`.

        `key` makes the call single-use (a person's confirmation): a later call with the same
        key requeues nothing and returns the first call's result with ``duplicate`` true,
        even if the envelope was dead-lettered again meanwhile; the key used for another
        envelope or by another person is a Conflict."""
        args = (_ref(workspace_id, "workspace id"), _ref(envelope_id, "envelope id"),
                _name(user_id, "user id"))
        if key is None:
            return self.db.scalar("SELECT agentpost.requeue(%s, %s, %s)", args)
        return self.db.scalar("SELECT agentpost.requeue(%s, %s, %s, %s)",
                              (*args, _text(key, "key", 200)))
