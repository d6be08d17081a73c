"""``WS /v1/subscribe?stream=<stream>[&ttl=<seconds>]``: one consumer of one inbox over a
WebSocket, with Courier's credits (§6.2) and leases (§6.3).

Client → server frames (JSON text):

- ``{"credit": N}`` adds N credits. Credits live in this connection only; each delivery spends
  one, and nothing is delivered while the credit is 0 (silence, not an error). Credit plus
  unacknowledged deliveries may not exceed the gateway's ``max_credit``: a grant beyond it is
  refused whole with a 429 frame (back off: ack what you hold, then grant again).
- ``{"ack": "<envelope id>"}`` completes the lease on a delivered envelope → ``{"acked": id}``.
- ``{"nack": "<envelope id>", "delay": s}`` gives it back (``delay`` optional, seconds) →
  ``{"nacked": id, "status": ...}``; the fourth return dead-letters it (status undeliverable).

Server → client: ``{"deliver": <Courier envelope> + {"lease": {"attempt", "expires_at"}}}``,
the confirmations above, and ``{"error": {"code", "message"}}``: 400 for a malformed frame,
409 for an ack/nack of an id this connection holds no live lease on (never delivered here,
already acked or nacked, or the lease expired), 429 for credit over quota.
Errors inside a session keep it open. Errors when opening it (401, 403, 404, 400, 429) are
sent as a frame, then the socket is closed with code 4000 + status.

Leases are taken with `store.lease` in a thread; between attempts the session sleeps on the
gateway's LISTEN hub, re-checking every ``poll_interval`` seconds without a notification.
When the connection closes, the leases it still holds are nacked (delay 0) so the envelopes
go straight back to the inbox instead of waiting out their TTL; this counts as a redelivery,
as an expiry would. If the gateway process dies, the leases simply expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from agentpost.gateway.core import Gateway, canonical_stream
from agentpost.gateway.errors import GatewayError, from_exception
from agentpost.protocol.errors import AgentpostError, LeaseLost
from agentpost.protocol.leases import Lease, to_courier

log = logging.getLogger("agentpost.gateway")

FRAME_HELP = ('a frame is {"credit": N}, {"ack": "<id>"} or {"nack": "<id>", "delay": s}')
MAX_TTL = 86_400.0


def delivery_frame(lease: Lease) -> dict[str, Any]:
    return {"deliver": {**to_courier(lease.envelope),
                        "lease": {"attempt": lease.attempt,
                                  "expires_at": lease.expires_at.isoformat()}}}


def parse_ttl(value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        ttl = float(value)
    except ValueError:
        ttl = math.nan
    if not (math.isfinite(ttl) and 0 < ttl <= MAX_TTL):
        raise GatewayError(400, f"ttl must be a number of seconds in (0, {MAX_TTL:.0f}]")
    return ttl


class Socket:
    """A WebSocket shared by a session's tasks: sends are serialized."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._lock = asyncio.Lock()

    async def send(self, frame: dict[str, Any]) -> None:
        text = json.dumps(frame, default=str, ensure_ascii=False)
        async with self._lock:
            await self.websocket.send_text(text)

    async def send_error(self, error: GatewayError) -> None:
        await self.send(error.body())

    async def refuse(self, exc: BaseException) -> None:
        """Report an error that ends the session, then close with 4000 + its status."""
        error = from_exception(exc)
        with contextlib.suppress(Exception):
            await self.send_error(error)
            await self.websocket.close(code=error.close_code, reason=error.message[:120])

    async def frames(self, limit: int) -> Any:
        """Yield each incoming frame's text (None for a frame that is not JSON text),
        until the client disconnects."""
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            yield text if text is not None and len(text) <= limit else None


async def run_tasks(socket: Socket, *coroutines: Any) -> None:
    """Run a session's tasks until the first ends (the client left, or a task failed);
    cancel and await the others. An unexpected failure is logged and reported to the client
    as a 500 error frame, closing the socket with 4500."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        exc = task.exception() if not task.cancelled() else None
        if exc is not None and not isinstance(exc, WebSocketDisconnect | OSError):
            await socket.refuse(exc)  # logs it (errors.from_exception)
            return


class SubscribeSession:
    """The state of one subscription: credit and the leases delivered and not yet settled."""

    def __init__(self, gw: Gateway, socket: Socket, workspace_id: str, ttl: float) -> None:
        self.gw = gw
        self.socket = socket
        self.workspace_id = workspace_id
        self.ttl = ttl
        self.holder = f"gw-{uuid.uuid4().hex[:12]}"
        self.credit = 0
        self.in_flight: dict[str, Lease] = {}
        self.watch = gw.hub.watch(workspace_id)

    async def run(self) -> None:
        try:
            await run_tasks(self.socket, self._serve_frames(), self._pump())
        finally:
            self.gw.hub.unwatch(self.watch)
            await self._release()

    # -- deliveries -----------------------------------------------------------------------

    async def _pump(self) -> None:
        await self.gw.hub.ready(self.gw.config.listen_timeout)
        failing = False
        while True:
            self.watch.take()
            timeout: float | None = None
            if self.credit > 0:
                timeout = self.gw.config.poll_interval
                try:
                    leases = await self._lease()
                    failing = False
                except AgentpostError as exc:
                    if not failing:  # once per outage, not once per poll
                        await self.socket.send_error(from_exception(exc))
                    failing, leases = True, []
                if leases:
                    await self._deliver(leases)
                    continue
            await self.watch.wait(timeout)

    async def _lease(self) -> list[Lease]:
        """Lease up to the credit. The call runs to completion even if the session is
        cancelled meanwhile, so that what it leased is known and released."""
        task = asyncio.ensure_future(self.gw.call(
            self.gw.store.lease, self.workspace_id, max=self.credit, ttl=self.ttl,
            holder=self.holder))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                for lease in await task:
                    self.in_flight[lease.envelope_id] = lease
            raise

    async def _deliver(self, leases: list[Lease]) -> None:
        self._live_leases()  # prune
        for lease in leases:
            self.in_flight[lease.envelope_id] = lease
        self.credit = max(0, self.credit - len(leases))
        for lease in leases:
            await self.socket.send(delivery_frame(lease))

    def _live_leases(self) -> list[Lease]:
        """The leases not yet expired; expired ones are forgotten (the store would refuse
        to settle them anyway, and the envelopes go back to the inbox)."""
        now = datetime.now(UTC)
        expired = [eid for eid, lease in self.in_flight.items() if lease.expires_at <= now]
        for envelope_id in expired:
            del self.in_flight[envelope_id]
        return list(self.in_flight.values())

    async def _release(self) -> None:
        """Nack what this connection still holds (best effort: a failure leaves the lease
        to expire)."""
        tokens = [lease.token for lease in self._live_leases()]
        self.in_flight.clear()
        if tokens:
            await asyncio.shield(self.gw.call(_nack_all, self.gw.store, tokens))

    # -- frames ---------------------------------------------------------------------------

    async def _serve_frames(self) -> None:
        async for text in self.socket.frames(self.gw.config.max_frame_bytes):
            try:
                await self._handle(text)
            except (WebSocketDisconnect, OSError):
                raise
            except Exception as exc:
                await self.socket.send_error(from_exception(exc))

    async def _handle(self, text: str | None) -> None:
        if text is None:
            raise GatewayError(400, f"frames are JSON text of at most "
                                    f"{self.gw.config.max_frame_bytes} bytes; {FRAME_HELP}")
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            raise GatewayError(400, f"not JSON; {FRAME_HELP}") from None
        keys = set(frame) if isinstance(frame, dict) else set()
        if keys == {"credit"}:
            self._grant(frame["credit"])
        elif keys == {"ack"}:
            await self._ack(frame["ack"])
        elif "nack" in keys and keys <= {"nack", "delay"}:
            await self._nack(frame["nack"], frame.get("delay", 0))
        else:
            raise GatewayError(400, FRAME_HELP)

    def _grant(self, n: object) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise GatewayError(400, "credit must be a whole number, 0 or more")
        outstanding = self.credit + len(self._live_leases())
        if outstanding + n > self.gw.config.max_credit:
            raise GatewayError(
                429, f"credit over quota: credit plus unacknowledged deliveries may not "
                     f"exceed {self.gw.config.max_credit}; ack or nack first",
                extra={"limit": self.gw.config.max_credit, "outstanding": outstanding})
        self.credit += n
        if n:
            self.watch.event.set()

    def _held(self, envelope_id: object) -> Lease:
        if not isinstance(envelope_id, str) or not envelope_id:
            raise GatewayError(400, "ack and nack name an envelope id (a string)")
        lease = self.in_flight.get(envelope_id)
        if lease is None:
            raise GatewayError(409, f"this connection holds no lease on {envelope_id[:100]!r} "
                                    "(not delivered here, already acked or nacked, or its "
                                    "lease expired)")
        return lease

    async def _ack(self, envelope_id: object) -> None:
        lease = self._held(envelope_id)
        await self._settle(lease, self.gw.store.ack, lease.token)
        await self.socket.send({"acked": lease.envelope_id})

    async def _nack(self, envelope_id: object, delay: object) -> None:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise GatewayError(400, "delay must be a number of seconds")
        lease = self._held(envelope_id)
        envelope = await self._settle(lease, self.gw.store.nack, lease.token, delay)
        await self.socket.send({"nacked": lease.envelope_id, "status": envelope.status.value})

    async def _settle(self, lease: Lease, fn: Any, *args: Any) -> Any:
        """Ack or nack in a thread; the lease is forgotten once done, or once found stale."""
        try:
            result = await self.gw.call(fn, *args)
        except LeaseLost:
            self._forget(lease)
            raise
        self._forget(lease)
        return result

    def _forget(self, lease: Lease) -> None:
        if self.in_flight.get(lease.envelope_id) is lease:
            del self.in_flight[lease.envelope_id]


def _nack_all(store: Any, tokens: list[str]) -> None:
    for token in tokens:
        try:
            store.nack(token, 0)
        except AgentpostError as exc:
            log.info("lease not returned on close (it will expire): %s", exc)


async def accept(gw: Gateway, websocket: WebSocket) -> tuple[Socket, Any]:
    """Accept the handshake (so that a refusal can be a §11 error frame) and authenticate;
    the caller refuses on the socket whatever this raises."""
    await websocket.accept()
    host = websocket.client.host if websocket.client else None
    return Socket(websocket), gw.authenticate(websocket.headers.get("authorization"), host)


async def serve_subscribe(gw: Gateway, websocket: WebSocket) -> None:
    """Open a subscription (auth, scope, stream, ttl), then run it until the client leaves."""
    socket, authenticating = await accept(gw, websocket)
    try:
        who = await authenticating
        stream, _ = canonical_stream(websocket.query_params.get("stream"))
        gw.require(who, "streams", stream, "subscribe")
        _, workspace = await gw.existing_stream(stream)
        ttl = parse_ttl(websocket.query_params.get("ttl"), gw.config.lease_ttl)
    except Exception as exc:
        await socket.refuse(exc)
        return
    await SubscribeSession(gw, socket, workspace, ttl).run()
