"""What the Airflow sensors and triggers look for in the store, each one statement.

- `matching`: envelopes of an inbox a lease could take now that match a filter (type, sender,
  in_reply_to, priority), as `leasable` counts them (the blocking gate included);
- `reply_to`: the first delivered answer to an envelope, in its sender's inbox;
- `need_resolution`: whether a Markspace need was resolved (the resolving copy of it);
- `claim_arrivals`: an event watcher's exclusive claim on envelopes that arrived in an inbox
  (sql/0041_event_claims.sql), so an arrival is reported once, whoever asks.

They are blocking: async callers run them in a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.protocol.models import Envelope
from agentpost.store.checks import ref as _ref
from agentpost.store.envelopes import EnvelopeStore

#: priorities an envelope can have (the envelopes table's check constraint)
PRIORITIES = ("normal", "urgent", "blocking")
#: how many matching ids a match reports at most
MAX_IDS = 100

#: the store's own definition of "leasable" (lease()'s conditions, sql/0050), narrowed by the
#: filter, with the first matching ids in processing order
_MATCHING = """
SELECT available::int, envelope_ids
  FROM agentpost.leasable_matching(%(ws)s, %(type)s, %(sender)s, %(in_reply_to)s,
                                   %(priority)s, %(limit)s)
"""

_REPLY = """
SELECT r.id
  FROM agentpost.envelopes r
 WHERE r.recipient = %(sender)s AND r.in_reply_to = %(id)s AND r.delivered_at IS NOT NULL
   AND (%(type)s::text IS NULL OR r.type = %(type)s)
 ORDER BY r.seq
 LIMIT 1
"""

_NEED = """
SELECT n.mark_type, r.id, r.resolved_by
  FROM agentpost.marks n
  LEFT JOIN LATERAL (SELECT c.id, c.resolved_by FROM agentpost.marks c
                      WHERE c.space = n.space AND c.supersedes = n.id
                        AND c.resolved_by IS NOT NULL
                      ORDER BY c.created_at LIMIT 1) r ON true
 WHERE n.space = %(space)s AND n.id = %(id)s
"""

_CLAIM = "SELECT agentpost.claim_arrivals(%(watcher)s, %(ws)s, %(max)s)"


@dataclass(frozen=True)
class Match:
    """What an inbox filter found: how many envelopes match, the first ids in processing
    order."""

    available: int
    envelope_ids: tuple[str, ...]


def _optional_ref(value: object, what: str) -> str | None:
    return None if value is None else _ref(value, what)


def check_filter(type: object = None, sender: object = None, in_reply_to: object = None,
                 priority: object = None) -> dict[str, str | None]:
    """An inbox filter, checked: each field None (any) or the value an envelope must have."""
    if priority is not None and priority not in PRIORITIES:
        raise InvalidInput(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return {"type": _optional_ref(type, "type"), "sender": _optional_ref(sender, "sender"),
            "in_reply_to": _optional_ref(in_reply_to, "in_reply_to"),
            "priority": priority}  # type: ignore[dict-item]


def matching(store: EnvelopeStore, workspace_id: str, limit: int = MAX_IDS,
             **fields: Any) -> Match:
    """The envelopes of `workspace_id`'s inbox a lease could take now that match `fields`
    (see `check_filter`). Nothing is leased: another consumer may take them first."""
    ws = _ref(workspace_id, "workspace id")
    store.workspace(ws)  # unknown inbox -> NotFound
    row = store.db.fetchone(_MATCHING, {"ws": ws, "limit": limit, **check_filter(**fields)})
    return Match(available=row[0], envelope_ids=tuple(row[1] or ()))


def reply_to(store: EnvelopeStore, envelope_id: str, type: str | None = None
             ) -> Envelope | None:
    """The first envelope delivered to the sender of `envelope_id` that answers it
    (in_reply_to), optionally of one `type`; None while there is none. Consumed or not."""
    original = store.get(_ref(envelope_id, "envelope id"))  # unknown -> NotFound
    found = store.db.scalar(_REPLY, {"sender": original.sender, "id": original.id,
                                     "type": _optional_ref(type, "type")})
    return None if found is None else store.get(found)


@dataclass(frozen=True)
class NeedState:
    """A need's resolution: the copy that resolved it and the action that did, or Nones."""

    resolution_id: str | None
    resolved_by: str | None

    @property
    def resolved(self) -> bool:
        return self.resolution_id is not None


def need_resolution(store: EnvelopeStore, space: str, need_id: str | UUID) -> NeedState:
    """Whether need `need_id` of mark space `space` was resolved (marks/space/postgres.py's
    `resolve` writes a copy with `resolved_by` that supersedes the need)."""
    try:
        mark = UUID(str(need_id))
    except ValueError:
        raise InvalidInput(f"need id must be a UUID, not {need_id!r}") from None
    row = store.db.fetchone(_NEED, {"space": space, "id": str(mark)})
    if row is None:
        raise NotFound(f"no mark {mark} in mark space {space!r}")
    if row[0] != "need":
        raise InvalidInput(f"mark {mark} is a {row[0]}, not a need")
    return NeedState(resolution_id=None if row[1] is None else str(row[1]),
                     resolved_by=None if row[2] is None else str(row[2]))


def claim_arrivals(store: EnvelopeStore, watcher: str, workspace_id: str,
                   max: int = 1) -> list[Envelope]:
    """Claim for `watcher` up to `max` envelopes that arrived in the inbox since the watcher
    first claimed, in arrival order, and return them. A claim commits before this returns
    and is never handed out again, to this or any other caller with the same watcher."""
    ws = _ref(workspace_id, "workspace id")
    store.workspace(ws)
    ids = store.db.scalar(_CLAIM, {"watcher": _ref(watcher, "watcher"), "ws": ws, "max": max})
    return [store.get(i) for i in ids or ()]
