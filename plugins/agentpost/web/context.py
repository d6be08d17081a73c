"""Where the web app finds its store: opened on first use, not at import, because Airflow
imports every plugin in every component (scheduler, workers) and most never serve a page.

The store comes from, in order: the `dsn` given to `create_app`; the Airflow connection
``agentpost_default`` (read server-side, as the API server reads connections), as operators
find it; AGENTPOST_DSN (with AGENTPOST_TRAIL_KEY).

Reads may come from a streaming standby instead (docs/operations.md, "Reads off the
primary"): the `read_dsn` given to `create_app`, else the Airflow connection
``agentpost_read``, else AGENTPOST_READ_DSN; none of them: the primary. A GET or HEAD reads
there; every other request (the human highway's actions, the MCP endpoint, the gateway)
goes to the primary. A page read from a standby says how far behind the primary it is.
"""

from __future__ import annotations

import os
import threading
from typing import Annotated, Any

from fastapi import Depends, Request

from agentpost.hooks.agentpost import StoreTarget, dsn_from_connection, target_from_environment
from agentpost.store import EnvelopeStore

CONN_ID = "agentpost_default"
READ_CONN_ID = "agentpost_read"
#: how far (seconds) the standby is behind: 0 when it has replayed all it received (an idle
#: primary sends nothing, so the age of the last replayed transaction alone would grow), else
#: the age of the last transaction it replayed; 0 on a primary
REPLAY_LAG = ("SELECT CASE WHEN NOT pg_is_in_recovery() "
              "OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
              "ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0) "
              "END::float8")


class WebContext:
    """The store shared by every request of one app (EnvelopeStore is thread-safe: it pools
    its connections), plus the DSN for components that open their own (mark spaces)."""

    def __init__(self, dsn: str | None = None, *, read_dsn: str | None = None) -> None:
        self._target = None if dsn is None else StoreTarget(dsn=dsn, source="create_app")
        self._read_target: StoreTarget | bool | None = (
            False if read_dsn is None else StoreTarget(dsn=read_dsn, source="create_app"))
        self._store: EnvelopeStore | None = None
        self._read_store: EnvelopeStore | None = None
        self._lock = threading.Lock()
        self.extras: dict[str, Any] = {}

    @property
    def target(self) -> StoreTarget:
        if self._target is None:
            self._target = _configured_target()
        return self._target

    @property
    def dsn(self) -> str:
        return self.target.dsn

    @property
    def store(self) -> EnvelopeStore:
        with self._lock:
            if self._store is None:
                self._store = self.target.open()
            return self._store

    @property
    def read_store(self) -> EnvelopeStore | None:
        """The standby's store, None when reads go to the primary. Signed with the
        primary's key: a standby holds the same trail."""
        if self._read_target is False:
            self._read_target = _configured_read_target()
        if self._read_target is None:
            return None
        primary = self.target
        with self._lock:
            if self._read_store is None:
                assert isinstance(self._read_target, StoreTarget)
                self._read_store = StoreTarget(dsn=self._read_target.dsn,
                                               trail_key=primary.trail_key).open()
            return self._read_store

    def close(self) -> None:
        with self._lock:
            for extra in self.extras.values():
                close = getattr(extra, "close", None)
                if close is not None:
                    close()
            self.extras.clear()
            for store in (self._store, self._read_store):
                if store is not None:
                    store.close()
            self._store = self._read_store = None


def _configured_target() -> StoreTarget:
    try:
        from airflow.models.connection import Connection

        conn = Connection.get_connection_from_secrets(CONN_ID)
    except Exception:  # not defined, or no metadata database here at all
        return target_from_environment(CONN_ID)
    extra = conn.extra_dejson
    key = extra.get("trail_key")
    return StoreTarget(dsn=dsn_from_connection(conn, extra),
                       trail_key=str(key) if key else None)


def _configured_read_target() -> StoreTarget | None:
    try:
        from airflow.models.connection import Connection

        conn = Connection.get_connection_from_secrets(READ_CONN_ID)
    except Exception:  # not defined, or no metadata database here at all
        dsn = os.environ.get("AGENTPOST_READ_DSN")
        return StoreTarget(dsn=dsn, source="AGENTPOST_READ_DSN") if dsn else None
    return StoreTarget(dsn=dsn_from_connection(conn, conn.extra_dejson), source="connection")


def web_context(request: Request) -> WebContext:
    return request.app.state.agentpost


def get_store(request: Request) -> EnvelopeStore:
    """FastAPI dependency: the app's store; for a GET or HEAD, the standby's when one is
    configured (its lag, in seconds, is kept on the request for the page to say)."""
    context = web_context(request)
    if request.method in ("GET", "HEAD"):
        replica = context.read_store
        if replica is not None:
            request.state.agentpost_read_lag = replica.db.scalar(REPLAY_LAG)
            return replica
    return context.store


#: a page handler's parameter for the app's store (``store: Store``)
Store = Annotated[EnvelopeStore, Depends(get_store)]
