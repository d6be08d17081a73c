"""Structural checks on what a caller asks to send (the "structure" part of WACP §4 rule 2).

A draft that fails here is still recorded, as a rejection with reason `invalid_structure`,
because the spec wants every rejected envelope in the trail with a notification to its sender.
So the checks return a *normalized row* (safe to store: no NUL bytes, no lone surrogates,
bounded lengths) together with the problem, instead of raising. Only a sender that cannot be
named at all raises: without a sender there is nobody to record the rejection against.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.models import Priority, RightType

MAX_ID = 200
MAX_TYPE = 100
MAX_FORMAT = 32
MAX_ATTACHMENT = 2048
MAX_ATTACHMENTS = 100
MAX_RIGHTS = 32
DEFAULT_MAX_CONTENT_BYTES = 1 << 20

#: fields the runtime assigns; a caller that sets them is sending a malformed envelope
RUNTIME_FIELDS = frozenset({"id", "timestamp", "origin", "status", "originator"})
DRAFT_FIELDS = frozenset(
    {"from", "sender", "to", "type", "content", "format", "attachments", "in_reply_to",
     "priority", "rights", "envelope_id", "tags", "headers", "meta"}
)
#: a caller-chosen envelope id (the idempotency key of Courier §6.4)
CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_TAGS = 32
MAX_TAG = 100
MAX_HEADERS = 64
MAX_META_BYTES = 16_384
# (sets built once: a send checks every draft against them)
_PRIORITIES = frozenset(p.value for p in Priority)
_RIGHT_TYPES = frozenset(r.value for r in RightType)


class _Malformed(Exception):
    pass


def clean_text(value: object, *, limit: int, what: str) -> str:
    """A string safe to store: the right type, within `limit` characters, encodable UTF-8
    without NUL bytes. Raises _Malformed with a reason otherwise."""
    if not isinstance(value, str):
        raise _Malformed(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise _Malformed(f"{what} is longer than {limit} characters")
    _check_encodable(value, what)
    return value


def _check_encodable(value: str, what: str) -> None:
    if "\x00" in value:
        raise _Malformed(f"{what} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Malformed(f"{what} is not valid Unicode text ({exc.reason})") from None


def sanitize(value: object, limit: int = MAX_ID) -> str:
    """Best-effort printable stand-in for a bad field of a rejected envelope's metadata."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:limit]


def check_sender(sender: object) -> str:
    try:
        return clean_text(sender, limit=MAX_ID, what="sender")
    except _Malformed as exc:
        raise InvalidInput(str(exc)) from None


@dataclass(frozen=True)
class DraftRow:
    """One draft, normalized for the store's `send` procedure."""

    row: dict[str, Any]
    problem: str | None


def _content(content: object, fmt: str, max_bytes: int) -> tuple[str, list[str] | None]:
    if fmt == "json" and isinstance(content, Mapping | list):
        try:
            content = json.dumps(content)
        except (TypeError, ValueError, RecursionError):
            raise _Malformed("content cannot be written as JSON") from None
    text = clean_text(content, limit=max_bytes, what="content")
    if len(text.encode("utf-8")) > max_bytes:
        raise _Malformed(f"content is larger than {max_bytes} bytes")
    keys = None
    if fmt == "json":
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            raise _Malformed("content declared as json does not parse") from None
        if isinstance(parsed, dict):
            keys = sorted(clean_text(k, limit=MAX_ATTACHMENT, what="a payload field name")
                          for k in parsed)
    return text, keys


def _rights(rights: object) -> list[dict[str, str]]:
    if isinstance(rights, str | bytes) or not isinstance(rights, Iterable):
        raise _Malformed("rights must be a list of {type, target}")
    out = []
    for item in rights:
        if isinstance(item, Mapping):
            kind, target = item.get("type"), item.get("target")
            if set(item) - {"type", "target"}:
                raise _Malformed("a right has only the fields type and target")
        elif isinstance(item, tuple | list) and len(item) == 2:
            kind, target = item
        elif hasattr(item, "type") and hasattr(item, "target"):
            kind, target = item.type, item.target
        else:
            raise _Malformed("each right is {type, target}")
        if not isinstance(kind, str) or kind not in _RIGHT_TYPES:
            raise _Malformed(f"a right's type is send or send_once, not {sanitize(kind, 40)}")
        out.append({"type": str(kind), "target": clean_text(target, limit=MAX_ID,
                                                             what="right target")})
    if len(out) > MAX_RIGHTS:
        raise _Malformed(f"at most {MAX_RIGHTS} rights per envelope")
    return out


def _attachments(attachments: object) -> list[str]:
    if isinstance(attachments, str | bytes | Mapping) or not isinstance(attachments, Iterable):
        raise _Malformed("attachments must be a list of strings")
    out = [clean_text(a, limit=MAX_ATTACHMENT, what="attachment") for a in attachments]
    if len(out) > MAX_ATTACHMENTS:
        raise _Malformed(f"at most {MAX_ATTACHMENTS} attachments per envelope")
    return out


def normalize_draft(fields: Mapping[str, Any], *, index: int = 0,
                    max_content_bytes: int = DEFAULT_MAX_CONTENT_BYTES) -> DraftRow:
    """Check one draft given as a mapping (`from`/`sender`, `to`, `type`, `content`, ...).

    Raises InvalidInput only for a missing or unusable sender."""
    sender = check_sender(fields.get("from", fields.get("sender")))
    row: dict[str, Any] = {
        "i": index, "sender": sender,
        "recipient": sanitize(fields.get("to", "")), "type": sanitize(fields.get("type", ""), 100),
        "format": "markdown", "content": None, "attachments": [], "in_reply_to": None,
        "priority": "normal", "rights": [], "keys": None, "malformed": None,
        "envelope_id": None, "tags": [], "headers": {}, "meta": {},
    }
    try:
        _fill(row, fields, max_content_bytes)
    except _Malformed as exc:
        row["malformed"] = str(exc)
        row["content"] = None
        row["attachments"] = []
        row["rights"] = []
        row["format"] = sanitize(row["format"], MAX_FORMAT)
        row["in_reply_to"] = None
        # a malformed draft keeps no caller-chosen id: its corrected resend must not be
        # taken for a duplicate of the rejection
        row.update(envelope_id=None, tags=[], headers={}, meta={})
        return DraftRow(row, str(exc))
    return DraftRow(row, None)


def _fill(row: dict[str, Any], fields: Mapping[str, Any], max_content_bytes: int) -> None:
    if "from" in fields and "sender" in fields:
        raise _Malformed("give the sender as from or as sender, not both")
    assigned = sorted(RUNTIME_FIELDS & set(fields))
    if assigned:
        raise _Malformed(f"{', '.join(assigned)} is assigned by the runtime, not the sender")
    unknown = sorted(set(map(str, fields)) - DRAFT_FIELDS)
    if unknown:
        raise _Malformed(f"unknown field {sanitize(unknown[0], 60)}")
    for required in ("to", "type", "content"):
        if fields.get(required) is None:
            raise _Malformed(f"{required} is required")
    row["recipient"] = clean_text(fields["to"], limit=MAX_ID, what="to")
    row["type"] = clean_text(fields["type"], limit=MAX_TYPE, what="type")
    fmt = clean_text(fields.get("format", "markdown"), limit=MAX_FORMAT, what="format")
    if not fmt:
        raise _Malformed("format must not be empty")
    row["format"] = fmt
    priority = fields.get("priority", "normal")
    if not isinstance(priority, str) or priority not in _PRIORITIES:
        raise _Malformed(f"priority is normal, urgent or blocking, not {sanitize(priority, 40)}")
    row["priority"] = str(priority)
    row["content"], row["keys"] = _content(fields["content"], fmt, max_content_bytes)
    row["attachments"] = _attachments(fields.get("attachments", ()))
    reply = fields.get("in_reply_to")
    row["in_reply_to"] = None if reply is None else clean_text(reply, limit=MAX_ID,
                                                               what="in_reply_to")
    row["rights"] = _rights(fields.get("rights", ()))
    _extras(row, fields)


def _extras(row: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """Courier's fields: a caller-chosen id, tags, headers and free metadata."""
    eid = fields.get("envelope_id")
    if eid is not None:
        if not isinstance(eid, str) or not CLIENT_ID.match(eid):
            raise _Malformed("envelope_id uses 1 to 128 letters, digits, '.', '_', ':' or '-'"
                             " and starts with a letter or digit")
        row["envelope_id"] = eid
    tags = fields.get("tags", ())
    if isinstance(tags, str | bytes | Mapping) or not isinstance(tags, Iterable):
        raise _Malformed("tags must be a list of strings")
    row["tags"] = sorted({clean_text(t, limit=MAX_TAG, what="tag") for t in tags})
    if len(row["tags"]) > MAX_TAGS:
        raise _Malformed(f"at most {MAX_TAGS} tags per envelope")
    headers = fields.get("headers") or {}
    if not isinstance(headers, Mapping) or len(headers) > MAX_HEADERS:
        raise _Malformed(f"headers must be an object of at most {MAX_HEADERS} entries")
    for key, value in headers.items():
        clean_text(key, limit=MAX_TAG, what="a header name")
        if not (value is None or isinstance(value, str | int | float | bool)):
            raise _Malformed(f"header {sanitize(key, 40)} must be a string, number or boolean")
        if isinstance(value, str):
            clean_text(value, limit=MAX_ATTACHMENT, what=f"header {sanitize(key, 40)}")
    row["headers"] = dict(headers)
    meta = fields.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise _Malformed("meta must be an object")
    if not meta:  # nothing to check, and no JSON round trip for the common draft
        row["meta"] = {}
        return
    try:
        encoded = json.dumps(meta, allow_nan=False, ensure_ascii=False)
        encoded.encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        raise _Malformed("meta must be plain JSON") from None
    if len(encoded) > MAX_META_BYTES or "\x00" in encoded or "\\u0000" in encoded:
        raise _Malformed(f"meta must be at most {MAX_META_BYTES} bytes of JSON without NULs")
    row["meta"] = json.loads(encoded)


def required_fields_problem(type_name: str, required: Iterable[str],
                            keys: Iterable[str] | None) -> str | None:
    """Why a payload fails its type's required fields (the structure part of WACP §4 rule
    2), naming the fields; None when it carries them all. `keys`: the top-level fields of a
    JSON object payload, None for any other payload."""
    required = list(required)
    if not required:
        return None
    if keys is None:
        return (f"type {sanitize(type_name, MAX_TYPE)!r} requires the field(s) "
                f"{', '.join(required)}: send a JSON object with format json")
    present = set(keys)
    missing = [f for f in required if f not in present]
    if not missing:
        return None
    return (f"missing required field(s) of type {sanitize(type_name, MAX_TYPE)!r}: "
            f"{', '.join(missing)}")


def draft_fields(draft: object) -> Mapping[str, Any]:
    """Accept a Draft model or a mapping."""
    if isinstance(draft, Mapping):
        return draft
    dump = getattr(draft, "model_dump", None)
    if dump is None:
        raise InvalidInput(f"a draft is a mapping or a Draft, not {type(draft).__name__}")
    return dump(by_alias=True, mode="json")
