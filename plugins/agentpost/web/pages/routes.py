"""Actor routes (Asya envelope routing): the routed envelopes that moved last, and one
envelope's progress hop by hop with its fan-out family.

A hop is a WACP envelope with the deterministic id ``asya:{id}:{index}`` (``:{end}`` appended
at an end actor), so an envelope's hops are found by primary key, and the phases each actor
reported by the trail's envelope index: nothing here scans the trail or the routes table.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.store import EnvelopeStore
from agentpost.web.auth import require_viewer
from agentpost.web.context import Store
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "routes.sql")

RECENT = 50
FAMILY_LIMIT = 500
PHASE_LIMIT = 500
_COLUMNS = ("id", "root_id", "parent_id", "actors", "current", "end", "phase", "status",
            "progress", "envelope_id", "error", "updated_at")


def _route_id(value: str) -> str:
    if not value or len(value) > 200 or not value.isprintable():
        raise InvalidInput("a routed envelope id is a printable string of at most 200"
                           " characters")
    return value


def _row(row: Any) -> dict[str, Any]:
    return dict(zip(_COLUMNS, row, strict=True))


def recent_routes(store: EnvelopeStore, limit: int) -> list[dict[str, Any]]:
    return [_row(r) for r in store.db.fetchall(Q["recent"], {"limit": limit})]


def _hop_ids(route: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(index, actor, WACP id) of every hop the route has or will have, the end included."""
    rid, actors = route["id"], route["actors"]
    hops = [(i, actor, f"asya:{rid}:{i}") for i, actor in enumerate(actors)]
    if route["end"]:
        hops.append((route["current"], route["end"], f"asya:{rid}:{route['current']}:"
                                                     f"{route['end']}"))
    return hops


def hops(store: EnvelopeStore, route: dict[str, Any]) -> list[dict[str, Any]]:
    """Each hop: its actor, the carrying envelope's state and times, the reported phases.
    A hop with no envelope under this id was made before a fan-out, under the parent's id,
    or is not reached yet."""
    planned = _hop_ids(route)
    ids = [wacp for _, _, wacp in planned]
    envelopes = {r[0]: r for r in store.db.fetchall(Q["hops"], {"ids": ids})}
    phases: dict[str, list[dict[str, Any]]] = {}
    for eid, at, record in store.db.fetchall(Q["phases"], {"ids": ids,
                                                           "limit": PHASE_LIMIT}):
        body = json.loads(record)["body"]
        phases.setdefault(eid, []).append({"phase": body.get("phase"), "at": at,
                                           "status": body.get("status")})
    first_own = min((i for i, _, wacp in planned if wacp in envelopes), default=None)
    out = []
    for index, actor, wacp in planned:
        env = envelopes.get(wacp)
        where = "here" if env else (
            "via parent" if route["parent_id"] and first_own is not None and index < first_own
            else "not reached")
        out.append({"index": index, "actor": actor, "envelope_id": wacp, "where": where,
                    "status": env[2] if env else None, "reason": env[3] if env else None,
                    "sent_at": env[4] if env else None, "delivered_at": env[5] if env else None,
                    "consumed_at": env[6] if env else None, "phases": phases.get(wacp, [])})
    return out


def route_detail(store: EnvelopeStore, route_id: str) -> dict[str, Any]:
    row = store.db.fetchone(Q["one"], {"id": _route_id(route_id)})
    if row is None:
        raise NotFound(f"no routed envelope {route_id!r}")
    route = _row(row)
    family = [_row(r) for r in store.db.fetchall(Q["family"], {"root": route["root_id"],
                                                               "limit": FAMILY_LIMIT + 1})]
    return {"route": route, "hops": hops(store, route),
            "parent": next((m for m in family if m["id"] == route["parent_id"]), None),
            "children": [m for m in family if m["parent_id"] == route["id"]
                         and m["id"] != route["id"]],
            "family": family[:FAMILY_LIMIT], "family_truncated": len(family) > FAMILY_LIMIT}


Limit = Annotated[int, Query(ge=1, le=500)]


@router.get("/routes")
def routes_page(request: Request, store: Store, limit: Limit = RECENT) -> Response:
    return page(request, "routes.html", nav="routes", routes=recent_routes(store, limit))


@router.get("/api/routes")
def routes_json(store: Store, limit: Limit = RECENT) -> dict[str, Any]:
    return {"routes": recent_routes(store, limit)}


@router.get("/routes/{route_id}")
def route_page(request: Request, store: Store, route_id: str) -> Response:
    return page(request, "route.html", nav="routes", **route_detail(store, route_id))


@router.get("/api/routes/{route_id}")
def route_json(store: Store, route_id: str) -> dict[str, Any]:
    return route_detail(store, route_id)
