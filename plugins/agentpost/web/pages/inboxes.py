"""The inboxes: the overview (the app's index, live), one inbox's page (stats, charts, waiting
envelopes, dead letters, live), and two human-highway actions on it: inject an envelope
(the human highway: origin and originator of WACP §3) and requeue a dead letter (WACP §7
bounded redelivery, over Courier §6.3's leases).

Numbers are Courier's stats (§10) as `EnvelopeStore.stats` computes them; the overview reads
every inbox's in one statement (inboxes.sql) rather than one query per inbox. Cells are
formatted here, once, for the HTML and the JSON the live refresh reads alike, so the two can
never show a value differently.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import Conflict, InvalidInput
from agentpost.protocol.models import Priority, Status
from agentpost.protocol.validation import MAX_ID, normalize_draft
from agentpost.store import EnvelopeStore
from agentpost.store.views import STATS_SAMPLE, STATS_WINDOW_S
from agentpost.web.actions import confirm_then, form_fields
from agentpost.web.auth import Actor, require_viewer, user_name
from agentpost.web.context import Store
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "inboxes.sql")
Ws = Annotated[str, Path(max_length=MAX_ID, description="workspace id")]
EnvelopeId = Annotated[str, Path(max_length=MAX_ID, description="envelope id")]
After = Annotated[str, Query(max_length=MAX_ID, description="list inboxes after this id")]

#: inboxes per page of the overview (each reads its stats sample), envelopes per table
PAGE = 25
MAX_ROWS = 100
#: consumed envelopes: per page of their list, on the inbox page, and the rows one page's
#: walk of the inbox's deliveries reads at most (inboxes.sql, `consumed`)
CONSUMED_PAGE = 50
CONSUMED_RECENT = 10
CONSUMED_WALK = 5_000
Before = Annotated[int | None, Query(ge=1, le=2**63 - 1,
                                     description="consumed envelopes below this seq")]
#: the throughput chart looks at this many of an inbox's most recent deliveries
THROUGHPUT_SAMPLE = 10_000
#: upper edges (ms) of the latency histogram's buckets; the last bucket is open
LATENCY_EDGES_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000,
                    60_000)
#: the inject form's limits (the store checks the rest, as for any sender)
MAX_TYPE = 64
MAX_CONTENT = 64 * 1024


# -- formatting ------------------------------------------------------------------------------

def number(value: Any) -> str:
    """A count or rate as shown: no trailing zeros, '–' for none."""
    if value is None:
        return "–"
    if isinstance(value, Decimal | float):
        return f"{float(value):g}"
    return str(value)


def millis(value: Any) -> str:
    return "–" if value is None else f"{float(value):g} ms"


def age(since: datetime | None, now: datetime | None = None) -> str:
    """How long ago, in the largest whole unit (s, min, h, d)."""
    if since is None:
        return "–"
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def cells(depth: Any, in_flight: Any, oldest: datetime | None, rate_in: Any, rate_out: Any,
          p50: Any, p95: Any, dead: Any) -> dict[str, str]:
    """The overview's cells by class name (the DOM contract of the index page)."""
    return {"depth": number(depth), "in-flight": number(in_flight), "oldest": age(oldest),
            "rate-in": f"{number(rate_in)}/s", "rate-out": f"{number(rate_out)}/s",
            "p50": millis(p50), "p95": millis(p95), "dead": number(dead)}


# -- reads -----------------------------------------------------------------------------------

def overview(store: EnvelopeStore, after: str = "") -> list[dict[str, Any]]:
    """A page of inboxes (PAGE + 1, to tell whether there is a next page) by id after
    `after`, with their cells."""
    rows = store.db.fetchall(Q["overview"], {"sample": STATS_SAMPLE, "window_s": STATS_WINDOW_S,
                                             "after": after, "limit": PAGE + 1})
    return [{"workspace_id": ws, "state": state,
             "cells": cells(depth, in_flight, oldest, rate_in, rate_out, p50, p95, dead),
             "oldest": oldest}
            for ws, state, depth, in_flight, oldest, dead, rate_in, rate_out, p50, p95 in rows]


def waiting(store: EnvelopeStore, ws: str) -> list[dict[str, Any]]:
    """The first MAX_ROWS waiting envelopes in processing order, with their live leases."""
    keys = ("id", "from", "type", "priority", "origin", "created_at", "delivered_at",
            "redeliveries", "lease_holder", "lease_until")
    return [dict(zip(keys, row, strict=True))
            for row in store.db.fetchall(Q["waiting"], {"ws": ws, "limit": MAX_ROWS})]


def inbox_stats(store: EnvelopeStore, ws: str) -> dict[str, Any]:
    """`stats(ws)` plus the oldest waiting envelope, and the overview's cells for them."""
    stats = store.stats(ws)
    oldest = store.db.scalar(Q["oldest"], {"ws": ws})
    return {"stats": stats.model_dump(mode="json"), "oldest": oldest,
            "cells": cells(stats.depth, stats.in_flight, oldest, stats.rate_in, stats.rate_out,
                           stats.lat_p50_ms, stats.lat_p95_ms, stats.dead_lettered)}


def _short_ms(ms: int) -> str:
    """A bucket edge as its axis label: ``500 ms``, ``2 s`` (short enough to fit under it)."""
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:g} s"


def latency_histogram(store: EnvelopeStore, ws: str) -> dict[str, Any]:
    """Enqueue → first lease of the recent sample, counted in LATENCY_EDGES_MS buckets."""
    counts = [0] * (len(LATENCY_EDGES_MS) + 1)
    for (ms,) in store.db.fetchall(Q["latencies"], {"ws": ws, "sample": STATS_SAMPLE}):
        counts[bisect_left(LATENCY_EDGES_MS, ms)] += 1  # the first bucket whose edge >= ms
    labels = [f"≤{_short_ms(e)}" for e in LATENCY_EDGES_MS] + [
        f">{_short_ms(LATENCY_EDGES_MS[-1])}"]
    return {"x": list(range(len(counts))), "labels": labels, "counts": counts}


def throughput(store: EnvelopeStore, ws: str) -> dict[str, Any]:
    """Envelopes in and out per minute over the last hour (minutes as unix seconds)."""
    now = int(datetime.now(UTC).timestamp()) // 60 * 60
    minutes = [now - 60 * i for i in range(59, -1, -1)]
    series: dict[str, dict[int, int]] = {"in": {}, "out": {}}
    for kind, minute, n in store.db.fetchall(Q["throughput"],
                                             {"ws": ws, "sample": THROUGHPUT_SAMPLE}):
        series[kind][minute] = n
    return {"x": minutes, "in": [series["in"].get(m, 0) for m in minutes],
            "out": [series["out"].get(m, 0) for m in minutes]}


def consumed(store: EnvelopeStore, ws: str, before: int | None, limit: int) -> dict[str, Any]:
    """A page of the inbox's consumed envelopes, newest first (by seq below `before`), and
    where the next page starts: after the last one shown, or where the page's bounded walk
    of the inbox's deliveries stopped (`next_before`, None at the end)."""
    rows = store.db.fetchall(Q["consumed"], {"ws": ws, "before": before or 2**63 - 1,
                                             "walk": CONSUMED_WALK, "limit": limit + 1})
    walked, lowest = rows[0][:2]
    keys = ("id", "seq", "from", "type", "priority", "origin", "created_at", "consumed_at",
            "redeliveries", "leases")
    items = [dict(zip(keys, r[2:], strict=True)) for r in rows if r[2] is not None]
    if len(items) > limit:
        items, next_before = items[:limit], items[limit - 1]["seq"]
    else:
        next_before = lowest if walked >= CONSUMED_WALK else None
    return {"consumed": items, "next_before": next_before}


def _recent_consumed(store: EnvelopeStore, ws: str) -> dict[str, Any]:
    found = consumed(store, ws, None, CONSUMED_RECENT)
    return {"consumed_rows": found["consumed"], "more_consumed": found["next_before"] is not None}


def _json_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.items()}
            for r in rows]


# -- pages -----------------------------------------------------------------------------------

@router.get("/")
def index(request: Request, store: Store, after: After = "") -> Response:
    """The overview of the inboxes, a page at a time, refreshed live from /api/inboxes."""
    rows = overview(store, after)
    return page(request, "inboxes.html", nav="inboxes", inboxes=rows[:PAGE], after=after,
                next_after=rows[PAGE - 1]["workspace_id"] if len(rows) > PAGE else None)


@router.get("/api/inboxes")
def api_inboxes(store: Store, after: After = "") -> dict[str, Any]:
    rows = overview(store, after)
    return {"inboxes": _json_rows(rows[:PAGE]),
            "next_after": rows[PAGE - 1]["workspace_id"] if len(rows) > PAGE else None}


@router.get("/inboxes/{ws}")
def inbox_page(request: Request, ws: Ws, store: Store) -> Response:
    workspace = store.workspace(ws)
    return page(request, "inbox.html", nav="inboxes", ws=workspace,
                info=inbox_stats(store, ws), waiting=waiting(store, ws),
                dead=store.dead_letters(ws, limit=MAX_ROWS),
                histogram=latency_histogram(store, ws), throughput=throughput(store, ws),
                **_recent_consumed(store, ws),
                priorities=[p.value for p in Priority], max_rows=MAX_ROWS)


@router.get("/api/inboxes/{ws}")
def api_inbox(ws: Ws, store: Store) -> dict[str, Any]:
    store.workspace(ws)
    info = inbox_stats(store, ws)
    return {"workspace_id": ws, "stats": info["stats"], "cells": info["cells"],
            "waiting": _json_rows(waiting(store, ws))}


@router.get("/inboxes/{ws}/consumed")
def consumed_page(request: Request, ws: Ws, store: Store, before: Before = None) -> Response:
    """The inbox's consumed envelopes, a page at a time (``before=<seq>``: older ones)."""
    workspace = store.workspace(ws)
    found = consumed(store, ws, before, CONSUMED_PAGE)
    return page(request, "consumed.html", nav="inboxes", ws=workspace, before=before,
                page_size=CONSUMED_PAGE, consumed_rows=found["consumed"],
                next_before=found["next_before"])


@router.get("/api/inboxes/{ws}/consumed")
def api_consumed(ws: Ws, store: Store, before: Before = None) -> dict[str, Any]:
    store.workspace(ws)
    found = consumed(store, ws, before, CONSUMED_PAGE)
    return {"workspace_id": ws, "consumed": _json_rows(found["consumed"]),
            "next_before": found["next_before"]}


# -- actions (the human highway) --------------------------------------------------------------

def inject_fields(fields: dict[str, str]) -> dict[str, str]:
    """The inject form, checked: a type, some content, a known priority, an optional id."""
    kind = fields.get("type", "").strip()
    content = fields.get("content", "")
    priority = fields.get("priority", "normal").strip() or "normal"
    reply = fields.get("in_reply_to", "").strip()
    if not kind or len(kind) > MAX_TYPE:
        raise InvalidInput(f"type: give an envelope type of 1 to {MAX_TYPE} characters")
    if not content.strip():
        raise InvalidInput("content: the envelope needs some content")
    if len(content.encode("utf-8")) > MAX_CONTENT:
        raise InvalidInput(f"content: at most {MAX_CONTENT // 1024} KiB")
    if priority not in {p.value for p in Priority}:
        raise InvalidInput("priority: one of " + ", ".join(p.value for p in Priority))
    if len(reply) > MAX_ID:
        raise InvalidInput(f"in_reply_to: an envelope id of at most {MAX_ID} characters")
    fields = {"type": kind, "content": content, "priority": priority, "in_reply_to": reply}
    _well_formed(fields)
    return fields


def _well_formed(fields: dict[str, str]) -> None:
    """What the store would reject as malformed is refused here, before confirming: a
    malformed envelope keeps no caller-chosen id, so its confirmation could not act once."""
    draft = normalize_draft({"from": "human:check", "to": "check", "type": fields["type"],
                             "content": fields["content"], "priority": fields["priority"],
                             "in_reply_to": fields["in_reply_to"] or None,
                             "envelope_id": "check"})
    if draft.problem is not None:
        raise InvalidInput(draft.problem)


@router.post("/inboxes/{ws}/inject")
async def inject(request: Request, ws: Ws, user: Actor, store: Store) -> Response:
    """Send an envelope into this inbox as the signed-in person (origin human, originator
    the user, WACP §3; no send right or matrix row, but type and structure are validated,
    and a rejection carries its WACP §9 reason).
    A rejected envelope is recorded like any other; the envelope page shows its reason. The
    envelope's id is the confirmation's single-use key: a replay lands on the same one."""
    fields = inject_fields(await form_fields(request))
    await asyncio.to_thread(store.workspace, ws)  # unknown inbox: 404 before confirming
    name = user_name(user)

    def act(key: str) -> str:
        result = store.inject(name, ws, fields["type"], fields["content"],
                              priority=fields["priority"],
                              in_reply_to=fields["in_reply_to"] or None,
                              envelope_id=f"human-{key}")
        return f"/envelopes/{result.envelope_id}"

    return await confirm_then(
        request, title=f"inject into {ws}", fields=fields, back=f"/inboxes/{ws}", act=act,
        summary=[("to", ws), ("type", fields["type"]), ("priority", fields["priority"]),
                 ("in reply to", fields["in_reply_to"] or "–"), ("origin", "human"),
                 ("originator", name), ("content", fields["content"])])


@router.post("/inboxes/{ws}/dead-letters/{envelope_id}/requeue")
async def requeue(request: Request, ws: Ws, envelope_id: EnvelopeId, user: Actor,
                  store: Store) -> Response:
    """Give a dead letter back to its inbox, leasable with a fresh redelivery count; the
    trail records the person who did it. The confirmation's key makes it act once: a replay
    requeues nothing, even once the envelope is a dead letter again."""
    envelope = await asyncio.to_thread(store.get, envelope_id)
    if envelope.to != ws or envelope.status is not Status.UNDELIVERABLE:
        raise Conflict(f"envelope {envelope_id!r} is not a dead letter of the inbox {ws!r}; "
                       "only dead letters can be requeued")
    name = user_name(user)

    def act(key: str) -> str:
        store.requeue(ws, envelope_id, name, key=key)
        return f"/inboxes/{ws}"

    return await confirm_then(
        request, title=f"requeue {envelope_id}", fields={}, back=f"/inboxes/{ws}", act=act,
        summary=[("envelope", envelope_id), ("inbox", ws), ("from", envelope.sender),
                 ("type", envelope.type), ("status now", envelope.status.value),
                 ("reason", envelope.reason or "–"),
                 ("after", "leasable again, redeliveries reset to 0"), ("originator", name)])
