"""Where the web app finds its store: opened on first use, not at import, because Airflow
imports every plugin in every component (scheduler, workers) and most never serve a page.

The store comes from, in order: the `dsn` given to `create_app`; the Airflow connection
``agentpost_default`` (read server-side, as the API server reads connections), as operators
find it; AGENTPOST_DSN (with AGENTPOST_TRAIL_KEY).
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

from fastapi import Depends, Request

from agentpost.hooks.agentpost import StoreTarget, dsn_from_connection, target_from_environment
from agentpost.store import EnvelopeStore

CONN_ID = "agentpost_default"


class WebContext:
    """The store shared by every request of one app (EnvelopeStore is thread-safe: it pools
    its connections), plus the DSN for components that open their own (mark spaces)."""

    def __init__(self, dsn: str | None = None) -> None:
        self._target = None if dsn is None else StoreTarget(dsn=dsn, source="create_app")
        self._store: EnvelopeStore | None = None
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

    def close(self) -> None:
        with self._lock:
            for extra in self.extras.values():
                close = getattr(extra, "close", None)
                if close is not None:
                    close()
            self.extras.clear()
            if self._store is not None:
                self._store.close()
                self._store = None


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


def web_context(request: Request) -> WebContext:
    return request.app.state.agentpost


def get_store(request: Request) -> EnvelopeStore:
    """FastAPI dependency: the app's store."""
    return web_context(request).store


#: a page handler's parameter for the app's store (``store: Store``)
Store = Annotated[EnvelopeStore, Depends(get_store)]
