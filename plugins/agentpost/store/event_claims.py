"""Event claims in two steps, and their lifetime (sql/0045_event_claim_acks.sql,
sql/0046_event_claim_pruning.sql).

An event watcher (`InboxEventTrigger`) claims an arrival *pending* before it reports it, and
*confirms* the claim once Airflow has stored the asset event. A pending claim belongs to one
`ClaimSession`: a dedicated connection holding an advisory lock for the session's life. No
other session hands the envelope out while the owner lives; once its connection is gone (a
killed triggerer), or the claim is older than the timeout, the next claim hands it out
again. So an arrival is reported at least once, and twice only when the owner died after
Airflow stored the event and before the confirmation committed.

Blocking: async callers run these in a worker thread.
"""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions

from agentpost.pg.db import translate
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import StoreUnavailable
from agentpost.store.checks import ref as _ref
from agentpost.store.envelopes import EnvelopeStore

_OWNER = "SELECT agentpost.event_claim_owner()"
_CLAIM = ("SELECT agentpost.claim_arrivals(%(watcher)s, %(ws)s, %(max)s, %(owner)s,"
          " make_interval(secs => %(timeout)s), false)")
_CONFIRM = "SELECT agentpost.confirm_claims(%s, %s)"
_RELEASE = "SELECT agentpost.release_claims(%s, %s, %s)"
_PRUNE = "SELECT agentpost.prune_event_claims(make_interval(secs => %s))"
_DROP = "SELECT agentpost.drop_event_watchers(make_interval(secs => %s))"

#: how long a pending claim of a live owner is left alone: longer than Airflow's
#: `[triggerer] shared_stream_ack_timeout` (300 s), by which Airflow has either confirmed
#: or failed every event its owner yielded
DEFAULT_CLAIM_TIMEOUT = 600.0
#: how far behind the clock a watcher's cursor stays (against a clock stepping back)
DEFAULT_PRUNE_MARGIN = 60.0


class ClaimSession:
    """One owner's pending claims on `watcher`'s arrivals in `workspace_id`'s inbox.

    Not thread-safe: callers serialize. A broken connection raises `StoreUnavailable`; the
    next call reconnects as a new owner (the old owner's pending claims are orphaned then,
    and handed out again)."""

    def __init__(self, dsn: str, watcher: str, workspace_id: str,
                 timeout: float = DEFAULT_CLAIM_TIMEOUT) -> None:
        self.dsn = libpq_dsn(dsn)
        self.watcher = _ref(watcher, "watcher")
        self.workspace_id = _ref(workspace_id, "workspace id")
        self.timeout = timeout
        self.owner: int | None = None
        self._conn: psycopg2.extensions.connection | None = None

    def connect(self) -> int:
        """Open the session if it is not open (a new owner, locked) and return its owner."""
        if self._conn is not None and not self._conn.closed:
            return self.owner  # type: ignore[return-value]
        conn = None
        try:
            conn = psycopg2.connect(self.dsn, application_name="agentpost-claims")
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(_OWNER)
                owner = cur.fetchone()[0]
        except psycopg2.Error as exc:
            if conn is not None:
                conn.close()
            raise translate(exc) from None
        self._conn, self.owner = conn, owner
        return owner

    def _scalar(self, sql: str, params: Any) -> Any:
        self.connect()
        try:
            with self._conn.cursor() as cur:  # type: ignore[union-attr]
                cur.execute(sql, params)
                return cur.fetchone()[0]
        except psycopg2.Error as exc:
            error = translate(exc)
            if isinstance(error, StoreUnavailable):
                self.close()  # the connection is gone, and with it the owner's lock
            raise error from None

    def claim(self, max: int = 1) -> tuple[list[str], int]:
        """Claim up to `max` arrivals, pending, in arrival order: their ids and the owner
        (callers serialize, so the session cannot change owner in between)."""
        owner = self.connect()
        ids = self._scalar(_CLAIM, {"watcher": self.watcher, "ws": self.workspace_id,
                                    "max": max, "owner": owner, "timeout": self.timeout})
        return list(ids or ()), owner

    def confirm(self, ids: list[str]) -> int:
        """Make these claims final (Airflow stored their events): never handed out again."""
        return self._scalar(_CONFIRM, (self.watcher, ids)) if ids else 0

    def release(self, ids: list[str], owner: int) -> int:
        """Hand these pending claims of `owner` out again (Airflow did not store them)."""
        return self._scalar(_RELEASE, (self.watcher, ids, owner)) if ids else 0

    def close(self) -> None:
        """End the session: its lock goes, and so its pending claims are orphaned."""
        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.close()
            except psycopg2.Error:
                pass
        self._conn = None


def prune_event_claims(store: EnvelopeStore, margin: float = DEFAULT_PRUNE_MARGIN) -> int:
    """Delete the claims no claim query can look at again: confirmed ones at or before each
    watcher's cursor of contiguous confirmed arrivals (moved here, `margin` seconds behind
    the clock), and those of envelopes no longer stored. Returns how many went."""
    return store.db.scalar(_PRUNE, (margin,))


def drop_event_watchers(store: EnvelopeStore, idle: float) -> list[str]:
    """Forget watchers no trigger asked for in `idle` seconds, with their claims. A dropped
    watcher whose trigger comes back starts afresh (what arrived meanwhile is no event)."""
    return list(store.db.scalar(_DROP, (idle,)) or ())


__all__ = ["DEFAULT_CLAIM_TIMEOUT", "ClaimSession", "drop_event_watchers",
           "prune_event_claims"]
