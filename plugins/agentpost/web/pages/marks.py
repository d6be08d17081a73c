"""The mark space pages (Markspace): the spaces of the store, one space's scopes, marks,
live intents, deferred conflicts and verdicts, need clusters; one mark with its decay; and
the human highway's "resolve a need".

Strength is never stored (Markspace §3, P28): the page computes it in SQL at its render
clock with the store's own functions, and embeds each mark's decay terms so the browser
recomputes it every second by the same law (`strength_at` here, `markStrength` in the
template). Every list is LIMITed in index order (web/marks.sql, sql/0058_mark_pages.sql).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from agentpost.marks.core import (
    TRUST_WEIGHTS,
    Action,
    Agent,
    InvalidMark,
    MarkType,
    Need,
    Scope,
    ScopeVisibility,
    UnknownMark,
    check_scope_name,
    check_text,
    cluster_needs,
    question_key,
)
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.protocol.trail import key_pads
from agentpost.store import EnvelopeStore
from agentpost.web.actions import confirm_then, form_fields
from agentpost.web.auth import Actor, require_viewer, user_name
from agentpost.web.context import Store, web_context
from agentpost.web.names import PEOPLE as PEOPLE  # people's agent ids (docs/ui.md)
from agentpost.web.names import page_names, person_id
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
QUERIES = load_queries("agentpost.web", "marks.sql")

PAGE = 50            # marks per page of a scope
RECENT = 20          # newest marks on a space's default view
LISTED = 200         # spaces listed
INTENTS = 100        # live intents listed
SCOPES = 100         # scopes listed
NEEDS = 200          # newest open needs clustered
INTENT_WINDOW = 300  # newest live intents read before dropping superseded ones
NEED_WINDOW = 600    # newest unresolved need marks read before dropping superseded ones
CLUSTERS = 20        # need clusters shown
PER_CLUSTER = 5      # needs of a cluster shown (each with its resolve form)
VERDICTS = 20        # latest verdicts listed
SAMPLE = 1000        # latest verdicts counted by outcome
SPACE_CAP = 10_000   # counts stop here ("10000+")
SCOPE_CAP = 500
MAX_ACTION_TEXT = 2000
HORIZON = 7 * 86400.0  # the decay chart's longest span
RESOLVE_VERB = "resolve_need"
OUTCOMES = ("won", "won, acted", "lost", "no winner")


# --------------------------------------------------------------------------- input


def _space_arg(value: str | None) -> str:
    """A space name as PostgresMarkSpace accepts it, else 400."""
    if value is None or not value.strip():
        raise InvalidInput("space: give the name of a mark space (?space=...)")
    if len(value) > 200:
        raise InvalidInput("space: a space name has at most 200 characters")
    try:
        check_text(value)
    except ValueError as exc:
        raise InvalidInput(f"space: {exc}") from None
    return value


def _scope_arg(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    try:
        return check_scope_name(value)
    except ValueError as exc:
        raise InvalidInput(f"scope: {exc}") from None


def _mark_id(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise InvalidInput(f"{value[:60]!r} is not a mark id (a UUID)") from None


def _require_space(store: EnvelopeStore, space: str) -> None:
    if not store.db.scalar(QUERIES["space_exists"], {"space": space}):
        raise NotFound(f"no mark space {space!r} in this store (a space exists once it "
                       "holds a mark)")


# --------------------------------------------------------------------------- the decay law


def decay_terms(row: dict[str, Any]) -> dict[str, Any]:
    """What `strength_at` needs of a mark: the columns its effective strength depends on."""
    return {"type": row["mark_type"], "initial": row["initial_strength"],
            "created": row["created_at"], "half_life": row["half_life"], "ttl": row["ttl"],
            "resolved": row["resolved_by"] is not None,
            "trust": TRUST_WEIGHTS.get(row["source"], 1.0) if row["source"] else 1.0,
            "superseded": bool(row["superseded"]), "warnings": row["warnings"] or []}


def _base(kind: str, initial: float, created: float, half_life: float | None,
          ttl: float | None, resolved: bool, now: float) -> float:
    """Markspace §3.1 decay before trust: actions stay, needs hold until resolved, intents
    until their TTL, observations and warnings halve every half-life."""
    age = max(0.0, now - created)
    if kind == "action":
        return initial
    if kind == "need":
        return 0.0 if resolved else initial
    if kind == "intent":
        return initial if age <= (ttl or 0.0) else 0.0
    return initial * 0.5 ** (age / half_life) if half_life else 0.0


def strength_at(terms: dict[str, Any], now: float) -> float:
    """Effective strength at `now` (§4.2, §9.5, §10) as the store computes it: 0 when
    superseded, else decay times trust minus the live warnings against the mark, >= 0."""
    base = terms["trust"] * _base(terms["type"], terms["initial"], terms["created"],
                                  terms["half_life"], terms["ttl"], terms["resolved"], now)
    if terms["superseded"] or base <= 0:
        return 0.0
    penalty = sum(_base("warning", i, c, h, None, False, now) for i, c, h in terms["warnings"])
    return max(0.0, base - penalty)


def decay_series(terms: dict[str, Any], now: float, points: int = 121) -> list[list[float]]:
    """[times, strengths] from creation until the strength falls under 1% of its start, an
    intent's TTL is well past, or HORIZON; the law above, sampled evenly."""
    start = terms["created"]
    if terms["type"] in ("observation", "warning") and terms["half_life"]:
        span = terms["half_life"] * math.log2(100)
    elif terms["type"] == "intent":
        span = 1.5 * (terms["ttl"] or 1.0)
    else:
        span = max(now - start, 3600.0)
    span = min(span, HORIZON)
    xs = [start + span * k / (points - 1) for k in range(points)]
    return [xs, [strength_at(terms, x) for x in xs]]


# --------------------------------------------------------------------------- reading


def _rows(store: EnvelopeStore, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """A query's rows as dicts (column name -> value)."""
    with store.db.cursor() as cur:
        cur.execute(QUERIES[name], params)
        names = [c.name for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _marks(store: EnvelopeStore, space: str, now: float, *, ident: UUID | None = None,
           scope: str | None = None, before: int | None = None,
           limit: int | None = None) -> list[dict[str, Any]]:
    """Marks with their strength at `now`: one by id, a page of a scope's (seq below
    `before`), or the newest of the space (marks.sql, `marks`)."""
    return _rows(store, "marks", {"space": space, "now": now, "scope": scope,
                                  "id": None if ident is None else str(ident),
                                  "before": before, "limit": limit})


def _label(row: dict[str, Any]) -> str:
    """What a mark is about: its resource or topic, and verb; a need's question."""
    if row["mark_type"] == "need":
        return str((row.get("body") or {}).get("question", ""))[:200]
    what = row.get("resource") or row.get("topic") or ""
    return f"{row['action']} {what}".strip() if row.get("action") else what


def _mark_view(row: dict[str, Any]) -> dict[str, Any]:
    terms = decay_terms(row)
    return {"id": str(row["id"]), "seq": row["seq"], "type": row["mark_type"],
            "agent": str(row["agent_id"]), "scope": row["scope"], "about": _label(row),
            "created_at": row["created_at"], "strength": row["strength"], "decay": terms}


def _intents(store: EnvelopeStore, space: str, scope: str | None,
             now: float) -> list[dict[str, Any]]:
    rows = _rows(store, "intents", {"space": space, "scope": scope, "now": now,
                                    "limit": INTENTS, "window": INTENT_WINDOW})
    return [{"id": str(r["id"]), "agent": str(r["agent_id"]), "resource": r["resource"],
             "scope": r["scope"], "action": r["action"],
             "confidence": r["confidence"], "expires_at": r["created_at"] + r["ttl"],
             "verdict": _verdict_word(r)} for r in rows]


def _verdict_word(row: dict[str, Any]) -> str:
    if not row["decided"]:
        return "pending"
    return "won" if row["allowed"] else ("lost" if row["winner_id"] else "no winner")


def _by_resource(intents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Live intents grouped per (scope, resource), and whether they are a pending deferred
    conflict: intents of two or more agents, one of them not yet decided by a boundary."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for intent in intents:
        groups.setdefault((intent["scope"], intent["resource"]), []).append(intent)
    return [{"scope": s, "resource": r, "intents": group,
             "pending_conflict": len({i["agent"] for i in group}) > 1
             and any(i["verdict"] == "pending" for i in group)}
            for (s, r), group in sorted(groups.items())]


def _needs(store: EnvelopeStore, space: str, scope: str | None) -> list[dict[str, Any]]:
    """Need clusters by effective priority (§8.4) over the newest open needs."""
    rows = _rows(store, "open_needs", {"space": space, "scope": scope, "limit": NEEDS,
                                       "window": NEED_WINDOW})
    # stored marks were validated when written: model_construct skips doing it again
    needs = [Need.model_construct(id=r["id"], agent_id=r["agent_id"], scope=r["scope"],
                                  created_at=r["created_at"],
                                  initial_strength=r["initial_strength"],
                                  priority=r["priority"], blocking=r["blocking"],
                                  question=r["body"].get("question", ""),
                                  context=r["body"].get("context"))
             for r in rows]
    return [{"scope": c.scope, "priority": c.effective_priority, "blocking": c.blocking_count,
             "question": c.needs[0].question, "size": len(c.needs),
             "needs": [{"id": str(n.id), "agent": str(n.agent_id), "question": n.question,
                        "priority": n.priority, "blocking": n.blocking,
                        "context": n.context} for n in c.needs[:PER_CLUSTER]]}
            for c in cluster_needs(needs, lambda n: question_key(n.question))[:CLUSTERS]]


def _verdicts(store: EnvelopeStore, space: str, scope: str | None) -> dict[str, Any]:
    rows = _rows(store, "verdicts", {"space": space, "scope": scope, "limit": VERDICTS})
    counts = dict(store.db.fetchall(QUERIES["verdict_outcomes"],
                                    {"space": space, "scope": scope, "sample": SAMPLE}))
    latest = [{**{k: (str(v) if isinstance(v, UUID) else v) for k, v in r.items()},
               "outcome": _verdict_word({**r, "decided": True})} for r in rows]
    return {"latest": latest, "outcomes": {o: int(counts.get(o, 0)) for o in OUTCOMES}}


def space_view(store: EnvelopeStore, space: str, scope: str | None, before: int | None,
               now: float) -> dict[str, Any]:
    """Everything the space page shows (and /api/marks returns), at render clock `now`."""
    _require_space(store, space)
    scopes = [{"scope": s, "count": int(n), "capped": int(n) >= SCOPE_CAP} for s, n in
              store.db.fetchall(QUERIES["scopes"], {"space": space, "cap": SCOPE_CAP,
                                                    "limit": SCOPES})]
    if scope is not None and scope not in {s["scope"] for s in scopes}:
        raise NotFound(f"no marks in scope {scope!r} of space {space!r}")
    if scope is None:
        rows = _marks(store, space, now, limit=RECENT)
    else:
        rows = _marks(store, space, now, scope=scope, before=before or 2**63 - 1, limit=PAGE)
    marks = [_mark_view(r) for r in rows]
    more = scope is not None and len(marks) == PAGE
    return {"space": space, "scope": scope, "now": now, "scopes": scopes, "marks": marks,
            "next_before": marks[-1]["seq"] if more else None,
            "resources": _by_resource(_intents(store, space, scope, now)),
            "needs": _needs(store, space, scope), "verdicts": _verdicts(store, space, scope)}


def _json_ready(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# --------------------------------------------------------------------------- pages


@router.get("/marks", response_class=HTMLResponse)
def marks_page(request: Request, store: Store, space: str | None = None,
               scope: str | None = None, before: Annotated[int | None, Query(ge=1)] = None,
               done: str | None = None) -> Response:
    """The spaces of the store; with ?space=, that space (and ?scope=, one scope)."""
    if space is None:
        spaces = [{"space": s, "count": int(n), "capped": int(n) >= SPACE_CAP}
                  for s, n in store.db.fetchall(QUERIES["spaces"],
                                                {"cap": SPACE_CAP, "limit": LISTED})]
        return page(request, "marks.html", nav="marks", spaces=spaces)
    view = space_view(store, _space_arg(space), _scope_arg(scope), before, time.time())
    return page(request, "marks_space.html", nav="marks", done=done, **view,
                names=page_names(request, store, [view["space"]], view),
                decay={m["id"]: m["decay"] for m in view["marks"]},
                outcomes=[list(OUTCOMES), [view["verdicts"]["outcomes"][o] for o in OUTCOMES]])


@router.get("/api/marks")
def marks_api(store: Store, space: str | None = None, scope: str | None = None,
              before: Annotated[int | None, Query(ge=1)] = None) -> JSONResponse:
    """The space page's data as JSON (strengths at the response's `now`)."""
    view = space_view(store, _space_arg(space), _scope_arg(scope), before, time.time())
    return JSONResponse(_json_ready(view))


@router.get("/marks/{mark_id}", response_class=HTMLResponse)
def mark_page(request: Request, store: Store, mark_id: str,
              space: str | None = None) -> Response:
    """One mark: its fields, its strength now and a chart of its decay."""
    name, ident = _space_arg(space), _mark_id(mark_id)
    now = time.time()
    rows = _marks(store, name, now, ident=ident)
    if not rows:
        raise NotFound(f"no mark {ident} in space {name!r}")
    row = rows[0]
    terms = decay_terms(row)
    fields = {k: v for k, v in row.items() if k not in ("body", "superseded", "warnings")
              and v is not None}
    return page(request, "mark.html", nav="marks", space=name, mark=row, fields=fields,
                body=row["body"], now=now, decay=terms,
                names=page_names(request, store, [name], row),
                series=decay_series(terms, now))


# --------------------------------------------------------------------------- resolve a need


class PersonSpace(PostgresMarkSpace):
    """The mark space as the web app writes it for a person: adds the trail entry of the
    person's resolution to the open lock() transaction (the marks' own sessions do not sign
    the trail, so the pads are set for that transaction only)."""

    def record_trail(self, key: bytes, user: str, body: dict[str, Any]) -> None:
        ipad, opad = key_pads(key)
        with self._cursor() as cur:
            cur.execute(QUERIES["trail_resolution"], {
                "ipad": ipad.hex(), "opad": opad.hex(), "chain": f"human:{user}",
                "body": json.dumps(body)})


def person_agent(user: str, scope: str) -> Agent:
    """A person as a mark-space agent: a deterministic id per user name, allowed to write
    actions to the one scope it resolves a need in."""
    return Agent(id=person_id(user), name=f"human:{user}", scopes={scope: (MarkType.ACTION,)})


def _open_need(store: EnvelopeStore, space: str, need_id: UUID) -> dict[str, Any]:
    """The need about to be resolved: 404 unknown, 400 not a need, 409 already resolved."""
    rows = store.db.fetchall(QUERIES["need_state"], {"id": str(need_id), "space": space})
    if not rows:
        raise NotFound(f"no mark {need_id} in space {space!r}")
    kind, scope, body, resolved = rows[0]
    if kind != "need":
        raise InvalidInput(f"mark {need_id} is a {kind}, not a need")
    if resolved:
        raise Conflict(f"need {need_id} is already resolved")
    return {"scope": scope, "question": body.get("question", ""),
            "resource": _resource_of(body.get("context") or {})}


def _resource_of(context: dict[str, Any]) -> str | None:
    """The resource a need is about, when its context names one (the guard's needs do)."""
    value = context.get("resource")
    return value if isinstance(value, str) and 0 < len(value) <= 200 else None


def _action_text(fields: dict[str, str]) -> str:
    text = fields.get("action_taken", "").strip()
    if not text:
        raise InvalidInput("action_taken: describe the action you took")
    if len(text) > MAX_ACTION_TEXT:
        raise InvalidInput(f"action_taken: at most {MAX_ACTION_TEXT} characters")
    try:
        return check_text(text)
    except ValueError as exc:
        raise InvalidInput(f"action_taken: {exc}") from None


def resolve_need(dsn: str, key: bytes, space: str, need_id: UUID, need: dict[str, Any],
                 user: str, text: str) -> dict[str, str]:
    """Write the person's action, resolve the need with it (§8.3) and sign the trail entry,
    in one transaction: all three or none."""
    agent = person_agent(user, need["scope"])
    with PersonSpace(dsn=dsn, space=space) as marks:
        marks.register_scope(Scope(name=need["scope"], visibility=ScopeVisibility.CLASSIFIED))
        try:
            with marks.lock(need["scope"], f"need:{need_id}"):
                action_id = marks.write(agent, Action(
                    scope=need["scope"], resource=None, action=RESOLVE_VERB,
                    result={"action_taken": text, "need_id": str(need_id), "by": user,
                            "about": need["resource"]}))
                resolution_id = marks.resolve(need_id, action_id)
                body = {"originator": user, "space": space, "scope": need["scope"],
                        "need_id": str(need_id), "question": need["question"],
                        "action_id": str(action_id), "resolution_id": str(resolution_id),
                        "agent_id": str(agent.id), "action_taken": text}
                marks.record_trail(key, user, body)
        except UnknownMark:
            raise NotFound(f"no mark {need_id} in space {space!r}") from None
        except InvalidMark:  # resolved by someone else since the check
            raise Conflict(f"need {need_id} is already resolved") from None
    return body


@router.post("/marks/needs/{need_id}/resolve")
async def resolve_page(request: Request, user: Actor, store: Store, need_id: str,
                       space: str | None = None) -> Response:
    """Resolve a need with an action the person took (the human highway: confirm, then act)."""
    fields = await form_fields(request)
    name = _space_arg(space or fields.get("space"))
    ident = _mark_id(need_id)
    text = _action_text(fields)
    need = await asyncio.to_thread(_open_need, store, name, ident)
    person = user_name(user)
    dsn, key = web_context(request).dsn, store.settings.trail_key.encode("utf-8")

    def act(confirmation: str) -> str:  # a need resolves once: no key needed below
        resolve_need(dsn, key, name, ident, need, person, text)
        return "/marks?" + urlencode({"space": name, "scope": need["scope"]})

    return await confirm_then(
        request, title="resolve a need", fields={**fields, "space": name},
        summary=[("space", name), ("scope", need["scope"]), ("need", str(ident)),
                 ("question", need["question"]), ("action taken", text),
                 ("action mark", f"{RESOLVE_VERB} about {need['resource'] or '(no resource)'}"
                                 f" as human:{person}")],
        back="/marks?" + urlencode({"space": name, "scope": need["scope"]}), act=act)
