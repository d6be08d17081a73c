"""Live wake-ups: LISTEN on the channel the store NOTIFYs when an inbox gains envelopes.

Every transaction that makes envelopes leasable in an inbox (a delivery, a nack, an expired
lease) notifies ``agentpost_inbox`` with the workspace id as payload; Postgres folds identical
notifications of one transaction into one, so a batch of a thousand costs one notification
per inbox. A notification is only a hint: waiters always re-check the store, and fall back to
polling (the timeout of `wait`) when the connection is lost or a notification is missed.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Iterable

import psycopg2
import psycopg2.extensions

from agentpost.pg.server import libpq_dsn

INBOX_CHANNEL = "agentpost_inbox"


class Listener:
    """A dedicated connection LISTENing to inbox notifications (blocking API).

    `wait(timeout)` returns the workspaces notified since the last call (an empty set on a
    timeout). A broken connection is reopened on the next wait; until then waits simply time
    out, which is the polling fallback. Subclasses listening elsewhere set `channel`.
    """

    channel = INBOX_CHANNEL

    def __init__(self, dsn: str, workspaces: Iterable[str] | None = None) -> None:
        self.dsn = libpq_dsn(dsn)
        self.only = None if workspaces is None else frozenset(workspaces)
        self._conn: psycopg2.extensions.connection | None = None
        self._pending: set[str] = set()
        self.reconnects = 0

    def connect(self) -> bool:
        """Start listening now (a waiter should listen before its first check of the store,
        or a delivery between the check and the first wait goes unnoticed)."""
        return self._connection() is not None

    def _connection(self) -> psycopg2.extensions.connection | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg2.connect(self.dsn, application_name="agentpost-listen")
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"LISTEN {self.channel}")
        except psycopg2.Error:
            self._conn = None
            return None
        if self._conn is not None:
            self.reconnects += 1
            # notifications may have been missed while disconnected: wake everyone
            self._pending.add("*")
        self._conn = conn
        return conn

    def _drain(self, conn: psycopg2.extensions.connection) -> None:
        conn.poll()
        while conn.notifies:
            note = conn.notifies.pop(0)
            if self.only is None or note.payload in self.only:
                self._pending.add(note.payload)

    def _ready(self, conn: psycopg2.extensions.connection | None) -> set[str]:
        """What was notified so far (and forget it)."""
        if conn is not None:
            self._drain(conn)
        out, self._pending = self._pending, set()
        return out

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            conn = self._connection()
            try:
                ready = self._ready(conn)
                if ready:
                    return ready
                left = deadline - time.monotonic()
                if left <= 0:
                    return set()
                if conn is None:
                    time.sleep(min(left, 0.5))
                    continue
                select.select([conn], [], [], left)
            except (psycopg2.Error, OSError, ValueError):
                self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg2.Error:
                pass
        # (the closed connection stays referenced: the next one counts as a reconnect)

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    def __enter__(self) -> Listener:
        self._connection()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncListener(Listener):
    """The same, for asyncio code (Airflow triggers, the gateway): `await wait(timeout)`
    never blocks the event loop; it waits for the socket to become readable."""

    async def wait(self, timeout: float) -> set[str]:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            conn = await loop.run_in_executor(None, self._connection) if (
                self._conn is None or self._conn.closed) else self._conn
            try:
                ready = self._ready(conn)
                if ready:
                    return ready
                left = deadline - loop.time()
                if left <= 0:
                    return set()
                if conn is None:
                    await asyncio.sleep(min(left, 0.5))
                    continue
                readable = asyncio.Event()
                fd = conn.fileno()
                loop.add_reader(fd, readable.set)
                try:
                    await asyncio.wait_for(readable.wait(), left)
                except TimeoutError:
                    pass
                finally:
                    loop.remove_reader(fd)
            except (psycopg2.Error, OSError, ValueError):
                self._close()
