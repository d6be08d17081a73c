"""Agents: per seat (a workspace an agent acts as through `agentpost.tools.AgentTools`), its
tool calls newest first, each with the run that made it, linked to the Airflow task
instance when the run was one (docs/agents.md, "Identity and the run on the trail").

What is shown is what the store recorded: an envelope sent carries the run in its
``meta.tool_call``; a lease (``read_inbox``) and an ack name the run's ``ref`` as holder on
the inbox's trail entries; a command records the run as its context, in the first entry of
its chain ``command:<id>``; a mark (``write_mark``, and the intent a ``claim`` writes) has
its run beside it in ``agentpost.mark_runs`` (sql/0079), by its seat.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response

from agentpost.pg.queries import load_queries
from agentpost.protocol.validation import MAX_ID
from agentpost.store import EnvelopeStore
from agentpost.web.auth import require_viewer
from agentpost.web.context import Store
from agentpost.web.links import run_link
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "agents.sql")

Ws = Annotated[str, Path(max_length=MAX_ID, description="workspace id")]
Limit = Annotated[int, Query(ge=1, le=500, description="tool calls shown, newest first")]
After = Annotated[str, Query(max_length=MAX_ID, description="the last workspace id shown")]

CALLS = 100
SEATS = 25
#: the seat's chain entries looked through: on its page, and per seat on the index
WINDOW = 20_000
INDEX_WINDOW = 2_000
_COLUMNS = ("kind", "at", "key", "tool", "envelope_id", "command_id", "what", "to", "run",
            "holder", "state", "mark_id", "space")


def calls(store: EnvelopeStore, ws: str, limit: int, window: int = WINDOW
          ) -> list[dict[str, Any]]:
    """The seat's most recent `limit` tool calls, newest first, each with its `run` as
    `run_link` shows it: among the last `window` entries of its chain, and its last
    `limit` commands."""
    out = []
    for row in store.db.fetchall(Q["calls"], {"ws": ws, "limit": limit, "scan": limit,
                                              "window": window}):
        call = dict(zip(_COLUMNS, row, strict=True))
        call["run"] = run_link(call["run"], call.pop("holder"))
        call.pop("key")
        out.append(call)
    return out


def seats(store: EnvelopeStore, after: str) -> dict[str, Any]:
    """A page of workspaces by id, each with its latest tool call (or None)."""
    ids = [r[0] for r in store.db.fetchall(Q["workspaces"], {"after": after,
                                                             "limit": SEATS + 1})]
    shown = ids[:SEATS]
    return {"seats": [{"workspace_id": ws,
                       "last": next(iter(calls(store, ws, 1, INDEX_WINDOW)), None)}
                      for ws in shown],
            "next": shown[-1] if len(ids) > SEATS else None}


def seat(store: EnvelopeStore, ws: str, limit: int) -> dict[str, Any]:
    store.workspace(ws)  # NotFound (404) for an unknown workspace, InvalidInput for a bad id
    return {"workspace_id": ws, "calls": calls(store, ws, limit), "limit": limit,
            "window": f"{WINDOW:,}"}


def _json(call: dict[str, Any]) -> dict[str, Any]:
    return {**call, "at": call["at"].isoformat()}


@router.get("/agents")
def agents_page(request: Request, store: Store, after: After = "") -> Response:
    return page(request, "agents.html", nav="agents", after=after, **seats(store, after))


@router.get("/api/agents")
def agents_json(store: Store, after: After = "") -> dict[str, Any]:
    found = seats(store, after)
    return {"seats": [{**s, "last": s["last"] and _json(s["last"])} for s in found["seats"]],
            "next": found["next"]}


@router.get("/agents/{ws}")
def agent_page(request: Request, store: Store, ws: Ws, limit: Limit = CALLS) -> Response:
    return page(request, "agent.html", nav="agents", **seat(store, ws, limit))


@router.get("/api/agents/{ws}")
def agent_json(store: Store, ws: Ws, limit: Limit = CALLS) -> dict[str, Any]:
    found = seat(store, ws, limit)
    return {**found, "calls": [_json(c) for c in found["calls"]]}
