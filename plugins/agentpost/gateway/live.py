"""The latestPerAgent view (Courier §9): ``GET /v1/snapshot?view=latestPerAgent`` and its live
form, ``WS /v1/live?view=latestPerAgent`` (phase 2).

The live view first sends the snapshot, ``{"view": "latestPerAgent", "snapshot": {stream:
envelope}}`` (the same body as the HTTP snapshot), then ``{"delta": {stream: envelope}}``
whenever inboxes received a newer envelope. It is driven by the gateway's LISTEN hub: a
notification names the inboxes to re-read; after a reconnect of the listener ("*"), or when
``live_poll_interval`` passes without one, the whole view is re-read and compared with what
was sent. A delta carries only entries that changed; the client sends nothing (a frame it
sends gets a 400 error frame).
"""

from __future__ import annotations

import contextlib
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from agentpost.gateway.core import Gateway
from agentpost.gateway.errors import GatewayError, from_exception
from agentpost.gateway.hub import EVERYTHING, Watch
from agentpost.gateway.subscribe import Socket, accept, run_tasks
from agentpost.gateway.tokens import TokenInfo
from agentpost.protocol.errors import AgentpostError
from agentpost.protocol.leases import stream_of, to_courier

#: the views there are (Courier §9)
VIEWS = frozenset({"latestPerAgent"})
#: more notified inboxes than this in one wake-up: re-read the whole view instead
_REREAD_ALL = 20


def checked_view(gw: Gateway, who: TokenInfo, view: str | None) -> str:
    """The view asked for: 400 when none is named, 403 without the scope, 404 if unknown."""
    if not view:
        raise GatewayError(400, "name the view: view=latestPerAgent")
    if len(view) > 100:
        raise GatewayError(400, "a view name has at most 100 characters")
    gw.require(who, "views", view, "read")
    if view not in VIEWS:
        raise GatewayError(404, f"unknown view {view!r}: the views are "
                                f"{', '.join(sorted(VIEWS))}")
    return view


async def view_snapshot(gw: Gateway, view: str) -> dict[str, Any]:
    """The whole view, as the snapshot endpoint and the live view's first frame send it."""
    latest = await gw.call(gw.store.latest_per_agent)
    return {"view": view, "snapshot": {s: to_courier(e) for s, e in sorted(latest.items())}}


class LiveSession:
    """Keeps the id of the envelope last sent per stream, and sends what differs."""

    def __init__(self, gw: Gateway, socket: Socket, view: str) -> None:
        self.gw = gw
        self.socket = socket
        self.view = view
        self.sent: dict[str, str] = {}

    async def run(self) -> None:
        watch = self.gw.hub.watch(None)  # registered before the snapshot is read
        try:
            await self.gw.hub.ready(self.gw.config.listen_timeout)
            try:
                snapshot = await view_snapshot(self.gw, self.view)
            except AgentpostError as exc:
                await self.socket.refuse(exc)
                return
            self.sent = {s: e["id"] for s, e in snapshot["snapshot"].items()}
            with contextlib.suppress(WebSocketDisconnect, OSError):
                await self.socket.send(snapshot)
                await run_tasks(self.socket, self._refuse_frames(), self._follow(watch))
        finally:
            self.gw.hub.unwatch(watch)

    async def _refuse_frames(self) -> None:
        async for _ in self.socket.frames(self.gw.config.max_frame_bytes):
            await self.socket.send_error(GatewayError(400, "the live view takes no frames"))

    async def _follow(self, watch: Watch) -> None:
        failing = False
        while True:
            woken = await watch.wait(self.gw.config.live_poll_interval)
            changed = watch.take()
            try:
                delta = await self.gw.call(self._changes,
                                           changed if woken and not failing else {EVERYTHING})
                failing = False
            except AgentpostError as exc:
                if not failing:  # once per outage; the next poll re-reads everything
                    await self.socket.send_error(from_exception(exc))
                failing = True
                continue
            if delta:
                self.sent.update({s: e["id"] for s, e in delta.items()})
                await self.socket.send({"delta": delta})

    def _changes(self, changed: set[str]) -> dict[str, Any]:
        """(In a thread.) The entries of the view that differ from what was sent."""
        store = self.gw.store
        if EVERYTHING in changed or len(changed) > _REREAD_ALL:
            latest = store.latest_per_agent()
        else:
            latest = {}
            for workspace in sorted(changed):
                envelope = store.latest_of(workspace)
                if envelope is not None:
                    latest[stream_of(workspace)] = envelope
        return {s: to_courier(e) for s, e in sorted(latest.items())
                if self.sent.get(s) != e.id}


async def serve_live(gw: Gateway, websocket: WebSocket) -> None:
    """Open a live view (auth, scope, view), then follow it until the client leaves."""
    socket, authenticating = await accept(gw, websocket)
    try:
        who = await authenticating
        view = checked_view(gw, who, websocket.query_params.get("view"))
    except Exception as exc:
        await socket.refuse(exc)
        return
    await LiveSession(gw, socket, view).run()
