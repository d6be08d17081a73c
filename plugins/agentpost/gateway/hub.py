"""One LISTEN connection per gateway process, fanned out to every WebSocket session.

A session registers a `Watch` for its workspace (or for every workspace, the live view) and
is woken when the store notifies that the inbox gained leasable envelopes. Notifications are
hints: sessions also re-check on a timer (the poll fallback), which covers lost notifications,
a dropped LISTEN connection, delayed nacks and expired leases, none of which notify on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from agentpost.store.listen import AsyncListener

log = logging.getLogger("agentpost.gateway")

#: the listener reports "*" after reconnecting: anything may have changed
EVERYTHING = "*"


class Watch:
    """What one session waits on: an event, and the workspaces notified since it last looked."""

    def __init__(self, workspace_id: str | None) -> None:
        self.workspace_id = workspace_id
        self.event = asyncio.Event()
        self.changed: set[str] = set()

    def notify(self, workspaces: set[str]) -> None:
        self.changed |= workspaces
        self.event.set()

    def take(self) -> set[str]:
        """The workspaces notified since the last call (``*`` = re-check everything)."""
        out, self.changed = self.changed, set()
        self.event.clear()
        return out

    async def wait(self, timeout: float | None) -> bool:
        """True when woken, False when `timeout` passed first."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        return True


class InboxHub:
    """Starts its LISTEN task lazily, in the loop of the first session that needs it (a
    mounted sub-application does not get lifespan events)."""

    def __init__(self, dsn: str, *, wait_timeout: float = 5.0,
                 listener_factory: Callable[[str], AsyncListener] = AsyncListener) -> None:
        self.dsn = dsn
        self.wait_timeout = wait_timeout
        self.listener_factory = listener_factory
        self._watches: set[Watch] = set()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def watch(self, workspace_id: str | None) -> Watch:
        """Register interest in one workspace's inbox (None: every inbox)."""
        self._ensure_started()
        watch = Watch(workspace_id)
        self._watches.add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        self._watches.discard(watch)

    async def ready(self, timeout: float) -> None:
        """Wait (at most `timeout`) until the LISTEN connection was attempted, so that a
        session checking the store afterwards misses no notification sent after its check.
        If the database is unreachable, sessions go on and rely on polling."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def dispatch(self, workspaces: set[str]) -> None:
        """Wake the sessions concerned by a set of notified workspaces."""
        if not workspaces:
            return
        everything = EVERYTHING in workspaces
        for watch in list(self._watches):
            if watch.workspace_id is None or everything:
                watch.notify(workspaces)
            elif watch.workspace_id in workspaces:
                watch.notify({watch.workspace_id})

    async def _run(self) -> None:
        listener = self.listener_factory(self.dsn)
        try:
            await asyncio.to_thread(listener.__enter__)  # connects and LISTENs
            self._ready.set()
            while True:
                try:
                    self.dispatch(await listener.wait(self.wait_timeout))
                except asyncio.CancelledError:
                    raise
                except Exception:  # sessions keep polling; the listener comes back
                    log.exception("inbox listener failed; retrying")
                    await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(Exception):
                listener.close()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
