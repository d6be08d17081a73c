"""One envelope: its fields, its lifecycle (from its trail entries), its thread, and its
trail entries each checked on the page (WACP §3 Integrity).

The check covers only the entries shown: each one's hash, signature and signed columns, and
its link to its chain predecessor (itself checked, since a link to a forged entry proves
nothing), with `ChainCheck`, the check `verify_trail` runs over whole chains; and the
envelope's row against what its entries signed (the `lifecycle_gaps` and `envelope_gaps`
queries of `verify_trail`, for this one envelope). Never the whole trail per page view.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import RedirectResponse, Response

from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.protocol.models import Envelope
from agentpost.protocol.trail import ChainCheck, StoredEntry
from agentpost.protocol.validation import MAX_ID
from agentpost.store import EnvelopeStore
from agentpost.store.queries import QUERIES
from agentpost.store.trail_archive_read import (
    ArchivedRow,
    archived_entries,
    archived_predecessors,
    archived_row,
)
from agentpost.web.auth import require_viewer
from agentpost.web.context import Store
from agentpost.web.links import run_link
from agentpost.web.render import page, root

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "envelopes.sql")
EnvelopeId = Annotated[str, Path(max_length=MAX_ID, description="envelope id")]

#: trail entries, thread ancestors and replies shown at most
MAX_ENTRIES = 500
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_DEPTH = 50
MAX_REPLIES = 100

#: what each trail event means on the timeline
LABELS = {
    "envelope_created": "created", "envelope_rejected": "rejected",
    "envelope_delivered": "delivered", "envelope_delivery_failed": "delivery failed",
    "envelope_redelivered": "redelivery", "envelope_undeliverable": "dead-lettered",
    "envelope_leased": "leased", "lease_nacked": "nacked", "lease_expired": "lease expired",
    "envelope_consumed": "consumed", "envelope_requeued": "requeued",
    "signal_emitted": "signal",
}


def _entry(cols: tuple[Any, ...]) -> StoredEntry:
    eid, chain, seq, event, envelope_id, at_us, record, prev, digest, mac = cols
    return StoredEntry(id=eid, chain=chain, seq=seq, event=event, envelope_id=envelope_id,
                       at_us=at_us, record=record, prev_hash=bytes(prev), hash=bytes(digest),
                       mac=bytes(mac))


def entry_problem(key: bytes, entry: StoredEntry, before: StoredEntry | None) -> str | None:
    """Why `entry` does not verify (None if it does): its own hash, signature and columns,
    then its link to `before`, its chain predecessor, which must verify itself."""
    check = ChainCheck(key)
    if before is not None:
        check.resume(before, before.hash)
        if check.failures:
            return f"its predecessor ({before.chain} #{before.seq}) fails: {check.failures[0][3]}"
    check.feed(entry)
    return check.failures[0][3] if check.failures else None


def entry_alone(key: bytes, entry: StoredEntry) -> str | None:
    """Why `entry` does not verify on its own (hash, signature, columns), None if it does."""
    check = ChainCheck(key)
    check.resume(entry, entry.hash)
    return check.failures[0][3].removeprefix("checkpointed head: ") if check.failures else None


def _detail(event: str, body: dict[str, Any]) -> str:
    """The few words of a timeline step beyond its label."""
    parts = []
    if event == "envelope_leased":
        parts.append(f"by {body.get('holder')} (attempt {body.get('attempt')})")
    elif event == "envelope_consumed" and body.get("via") == "ack":
        parts.append(f"acked by {body.get('holder')}")
    elif event in ("lease_nacked", "lease_expired"):
        parts.append(f"redelivery {body.get('redelivery')}")
        if body.get("dead_lettered"):
            parts.append("dead-lettered")
    elif event == "envelope_requeued":
        parts.append(f"by {body.get('originator')}")
    elif event == "signal_emitted":
        parts.append(f"{body.get('signal')} to {body.get('to')}")
    if body.get("reason") and event != "signal_emitted":
        parts.append(f"reason {body['reason']}")
    return ", ".join(str(p) for p in parts)


def trail_entries(store: EnvelopeStore, envelope_id: str
                  ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The envelope's entries in trail order, each checked, with its timeline label; and,
    on a pruned trail, what the page says of the archive (docs/ui.md, "Archived envelopes"):
    an envelope whose creation entry a prune took out of Postgres gets its archived entries,
    and an entry whose predecessor went gets it from there, when this server reaches the
    archive (else that one link is not checked, and the entry says so)."""
    key = store.settings.trail_key.encode("utf-8")
    found = [(_entry(r[:10]), None if r[11] is None else _entry(r[11:21]), "live")
             for r in store.db.fetchall(Q["entries"], {"id": envelope_id,
                                                       "limit": MAX_ENTRIES})]
    note = None
    if not any(e.event in ("envelope_created", "envelope_rejected") for e, _, _ in found):
        archived = archived_entries(store, envelope_id, MAX_ENTRIES)
        if archived is not None:
            live = {e.id for e, _, _ in found}
            old = [(e, b, "archive") for e, b in archived.entries if e.id not in live]
            found = sorted([*old, *found], key=lambda x: x[0].id)[:MAX_ENTRIES]
            note = {"cut": archived.cut, "directory": archived.directory,
                    "reachable": archived.reachable, "entries": len(old)}
    wanted = {(e.chain, e.seq - 1) for e, b, _ in found if b is None and e.seq > 1}
    older = archived_predecessors(store, wanted)
    return [_shown(key, e, b or older.get((e.chain, e.seq - 1)), source)
            for e, b, source in found], note


def _shown(key: bytes, entry: StoredEntry, before: StoredEntry | None, source: str
           ) -> dict[str, Any]:
    """One entry as the page shows it, checked against its predecessor. A chain's entry past
    its first with no predecessor found is one whose predecessor a prune archived out of
    reach: the entry is checked alone and says so (on a trail never pruned, its predecessor
    is always found, or the entry is the chain's first)."""
    unlinked = before is None and entry.seq > 1 and source == "live"
    problem = entry_alone(key, entry) if unlinked else entry_problem(key, entry, before)
    try:
        body = json.loads(entry.record).get("body") or {}
    except (ValueError, AttributeError):
        body = {}
    return {"id": entry.id, "chain": entry.chain, "seq": entry.seq, "event": entry.event,
            "at": EPOCH + timedelta(microseconds=entry.at_us),
            "label": LABELS.get(entry.event, entry.event),
            "detail": _detail(entry.event, body), "body": body, "hash": entry.hash.hex(),
            "verified": problem is None, "problem": problem, "source": source,
            "unlinked": unlinked}


def row_problems(store: EnvelopeStore, envelope_id: str) -> list[str]:
    """How the envelope's row differs from what its entries signed (verify_trail's row
    checks, for this envelope only)."""
    problems = []
    ids = [envelope_id]
    for chain, _id, status, event in store.db.fetchall(QUERIES["lifecycle_gaps"],
                                                       {"envelopes": ids}):
        problems.append(f"the row is {status} but {chain} has no {event} entry for it")
    for _chain, _id, name, in_row, signed, entry in store.db.fetchall(
            QUERIES["envelope_gaps"], {"envelopes": ids}):
        problems.append(f"{name} is {json.dumps(in_row)} in the row but {json.dumps(signed)} "
                        f"in {entry}")
    return problems


def thread(store: EnvelopeStore, envelope_id: str) -> dict[str, list[dict[str, Any]]]:
    """Ancestors by in_reply_to, root first, and direct replies."""
    keys = ("id", "from", "to", "type", "created_at")
    up = [dict(zip((*keys, "known"), r, strict=True))
          for r in store.db.fetchall(Q["ancestors"], {"id": envelope_id, "limit": MAX_DEPTH})]
    down = [dict(zip(keys, r, strict=True))
            for r in store.db.fetchall(Q["replies"], {"id": envelope_id,
                                                      "limit": MAX_REPLIES})]
    return {"ancestors": list(reversed(up)), "replies": down}


def lease_of(store: EnvelopeStore, envelope_id: str) -> dict[str, Any]:
    holder, until, leases, first = store.db.fetchone(Q["lease"], {"id": envelope_id})
    return {"holder": holder, "until": until, "leases": leases, "first_leased_at": first}


def tool_call(envelope: Envelope) -> dict[str, Any] | None:
    """The agent tool call that sent the envelope (its ``meta.tool_call``): the tool and the
    run as `run_link` shows it, linked to its Airflow task instance when it was one."""
    call = envelope.meta.get("tool_call") if isinstance(envelope.meta, dict) else None
    if not isinstance(call, dict):
        return None
    return {"tool": call.get("tool"), "call_id": call.get("call_id"),
            "run": run_link(call.get("run"))}


def details(store: EnvelopeStore, envelope_id: str) -> dict[str, Any]:
    """Everything the page shows (NotFound for an unknown id, InvalidInput for a bad one).
    An envelope whose row a prune dropped is shown from the archive's copy of it."""
    try:
        envelope, row_archived = store.get(envelope_id), None
    except NotFound as exc:
        row_archived = _archived_row(store, envelope_id, exc)
        envelope = row_archived.envelope
    entries, archived = trail_entries(store, envelope.id)
    return {"envelope": envelope, "entries": entries, "thread": thread(store, envelope.id),
            "tool_call": tool_call(envelope), "row_archived": row_archived is not None,
            "lease": (lease_of(store, envelope.id) if row_archived is None else
                      {"holder": None, "until": None, "leases": row_archived.leases,
                       "first_leased_at": row_archived.first_leased_at}),
            "archived": archived,
            # the row checks read the entries in Postgres: an archived envelope's are gone
            "row_problems": [] if archived else row_problems(store, envelope.id),
            "all_verified": all(e["verified"] for e in entries)}


def _archived_row(store: EnvelopeStore, envelope_id: str, missing: NotFound) -> ArchivedRow:
    """The archive's copy of a row a prune dropped, else `missing` (saying where to look
    when the archive is out of this server's reach)."""
    found = archived_row(store, envelope_id)
    if found is not None and found.envelope is not None:
        return found
    if found is not None and not found.reachable:
        raise NotFound(f"{missing}: the trail was pruned before {found.cut}, and an envelope "
                       f"older than that is in the archive {found.directory}, which this "
                       "server cannot reach") from None
    raise missing


def envelope_json(envelope: Envelope) -> dict[str, Any]:
    return envelope.model_dump(mode="json", by_alias=True)


@router.get("/envelopes")
def lookup(request: Request, id: Annotated[str, Query(min_length=1, max_length=MAX_ID)]
           ) -> Response:
    """The header's look-up box: to the envelope's page."""
    if not id.strip():
        raise InvalidInput("id: give an envelope id")
    return RedirectResponse(f"{root(request)}/envelopes/{quote(id.strip(), safe='')}",
                            status_code=303)


@router.get("/envelopes/{envelope_id}")
def envelope_page(request: Request, envelope_id: EnvelopeId, store: Store) -> Response:
    return page(request, "envelope.html", nav="inboxes", **details(store, envelope_id))


@router.get("/api/envelopes/{envelope_id}")
def api_envelope(envelope_id: EnvelopeId, store: Store) -> dict[str, Any]:
    found = details(store, envelope_id)
    return {"envelope": envelope_json(found["envelope"]), "lease": found["lease"],
            "thread": found["thread"], "row_problems": found["row_problems"],
            "all_verified": found["all_verified"], "archived": found["archived"],
            "entries": found["entries"]}
