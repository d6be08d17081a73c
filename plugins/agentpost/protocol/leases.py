"""Leases, inbox statistics and the Courier view of an inbox, as frozen models.

A Courier *stream* is a workspace's inbox: ``agents/<workspace>/inbox`` (or the bare workspace
id). A lease is a time-limited claim on one delivered envelope by one consumer; its token is
opaque to callers and names both the envelope and the lease.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.models import Envelope

#: a lease is returned this many times (nack or expiry) before the envelope is dead-lettered
MAX_REDELIVERIES = 3
#: the reason recorded on a dead-lettered envelope
DEAD_LETTER_REASON = "redelivery_exhausted"

_STREAM = re.compile(r"^agents/([^/]+)/inbox$")
_TOKEN_UUID = 36


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class Lease(_Frozen):
    """A consumer's claim on one envelope until `expires_at`. `attempt` counts leases of
    this envelope (1 the first time); acking or nacking needs `token`."""

    token: str
    envelope: Envelope
    attempt: int
    expires_at: datetime
    holder: str

    @property
    def envelope_id(self) -> str:
        return self.envelope.id


class InboxStats(_Frozen):
    """Courier's per-stream metrics (§10) for one inbox. Rates are per second over the
    window; latencies are enqueue → first lease, over the most recent leased envelopes."""

    workspace_id: str
    stream: str
    depth: int
    in_flight: int
    delayed: int
    dead_lettered: int
    enqueued: int
    delivered: int
    acks: int
    nacks: int
    redeliveries: int
    expiries: int
    rate_in: float
    rate_out: float
    lat_p50_ms: float | None
    lat_p95_ms: float | None
    last_ts: datetime | None
    window_s: float


def stream_of(workspace_id: str) -> str:
    """The Courier stream name of a workspace's inbox."""
    return f"agents/{workspace_id}/inbox"


def workspace_of(stream: object) -> str:
    """The workspace behind a stream name (``agents/<ws>/inbox`` or ``<ws>``)."""
    if not isinstance(stream, str) or not stream:
        raise InvalidInput("a stream is agents/<workspace>/inbox or a workspace id")
    match = _STREAM.match(stream)
    ws = match.group(1) if match else stream
    if "/" in ws:
        raise InvalidInput(f"unknown stream form {stream[:80]!r}: use agents/<workspace>/inbox")
    return ws


def make_token(envelope_id: str, lease_uuid: str) -> str:
    return f"{lease_uuid}.{envelope_id}"


def split_token(token: object) -> tuple[str, str]:
    """(envelope id, lease uuid) of a token; a malformed token is invalid input."""
    if (not isinstance(token, str) or len(token) < _TOKEN_UUID + 2
            or token[_TOKEN_UUID] != "." or len(token) > 400):
        raise InvalidInput("malformed lease token")
    lease_uuid, envelope_id = token[:_TOKEN_UUID], token[_TOKEN_UUID + 1:]
    if not re.fullmatch(r"[0-9a-f-]{36}", lease_uuid) or "\x00" in envelope_id:
        raise InvalidInput("malformed lease token")
    return envelope_id, lease_uuid


def to_courier(envelope: Envelope) -> dict[str, Any]:
    """An envelope in Courier's public JSON shape (§4.1), with agentpost's extra fields."""
    import json

    content = envelope.payload.content
    payload: Any = content
    if envelope.payload.format == "json" and content is not None:
        try:
            payload = json.loads(content)
        except ValueError:
            payload = content
    meta = dict(envelope.meta)
    out: dict[str, Any] = {
        "id": envelope.id,
        "ts": envelope.timestamp.isoformat(),
        "from": envelope.from_,
        "to": stream_of(envelope.to),
        "type": envelope.type,
        "tags": list(envelope.tags),
        "headers": {"priority": envelope.priority.value, **envelope.headers},
        "payload": payload,
        "format": envelope.payload.format,
        "status": envelope.status.value,
    }
    for key in ("schema", "version", "corr", "refs"):
        if key in meta:
            out[key] = meta[key]
    return out


COURIER_FIELDS = frozenset({"id", "ts", "from", "to", "type", "schema", "version", "corr",
                            "refs", "tags", "headers", "payload"})


def courier_draft(to: str, envelope: object) -> tuple[dict[str, Any], str | None]:
    """The draft fields of a Courier envelope enqueued to stream `to`, and the user id when
    it comes through the human highway (``from: human:<user>``). Courier v1 requires `id`,
    `ts`, `to`, `type` and `payload`; `to` may come from the request instead."""
    from collections.abc import Mapping

    if not isinstance(envelope, Mapping):
        raise InvalidInput("envelope must be a JSON object")
    unknown = sorted(str(k) for k in envelope if k not in COURIER_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown envelope field {unknown[0][:60]!r}")
    for required in ("id", "ts", "type", "payload", "from"):
        if envelope.get(required) is None:
            raise InvalidInput(f"envelope.{required} is required")
    stream = workspace_of(to)
    if envelope.get("to") is not None and workspace_of(envelope["to"]) != stream:
        raise InvalidInput("envelope.to names another stream than the request's to")
    headers = envelope.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise InvalidInput("envelope.headers must be an object")
    headers = dict(headers)
    priority = headers.pop("priority", "normal")
    sender = envelope["from"]
    if not isinstance(sender, str):
        raise InvalidInput("envelope.from must be a string")
    match = re.match(r"^agents/([^/]+)/(?:outbox|inbox)$", sender)
    sender = match.group(1) if match else sender
    meta = {k: envelope[k] for k in ("ts", "schema", "version", "corr", "refs") if k in envelope}
    fields = {"from": sender, "to": stream, "type": envelope["type"],
              "content": _json_text(envelope["payload"]), "format": "json", "priority": priority,
              "envelope_id": envelope["id"], "tags": envelope.get("tags") or (),
              "headers": headers, "meta": meta}
    human = sender[len("human:"):] if sender.startswith("human:") else None
    return fields, human


def _json_text(payload: object) -> str:
    import json

    try:
        return json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise InvalidInput("envelope.payload must be plain JSON") from None
