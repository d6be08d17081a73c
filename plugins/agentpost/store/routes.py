"""Asya routes on the WACP store: routed envelopes travel as ordinary envelopes between actor
workspaces, each hop is one transaction, and where every envelope stands lives in
``agentpost.routes`` (sql/0009_routes.sql). docs/asya.md has the decisions.

- **An actor is a workspace** whose id is the actor name; ``happy-end`` and ``error-end`` are
  workspaces too (`RouteStore.setup` creates them all with the role `ACTOR_ROLE` and grants
  every actor a send right to every actor, itself included, since routes are decided at run
  time).
- **A hop is one WACP envelope** of type `ENVELOPE_TYPE`, ``format="json"``, content = the
  Asya payload, headers = the Asya headers,
  ``meta["asya"]`` = ``{id, parent_id, route, fan_outs}``. Its WACP id is `wacp_id`
  (``asya:{id}:{current}``, ``:{end}`` appended at an end actor).
- **Handling a hop is one transaction** (``agentpost.route_step``): the lease is acked, the
  envelopes the result routes on are accepted, and the status rows are recorded with their
  ``route_progress`` trail entries together; a crash leaves all of it or none of it. Leasing
  reports the hop ``received`` in the lease's own transaction (``agentpost.route_lease``).
  So a hop costs two calls, and both take batches: `receive` (``max``) and `complete_many`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, JsonValue

from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.protocol.leases import Lease, make_token, split_token
from agentpost.protocol.routes import (
    END_ACTORS,
    ERROR_END,
    InvalidRoute,
    Member,
    Phase,
    Route,
    RoutedEnvelope,
    RouteStatus,
    Step,
    family_progress,
    family_status,
    parse_envelope,
    step,
)
from agentpost.protocol.validation import normalize_draft
from agentpost.store.checks import ref as _ref
from agentpost.store.envelopes import EnvelopeStore
from agentpost.store.leases import MAX_BATCH, _seconds

ACTOR_ROLE = "asya-actor"
ENVELOPE_TYPE = "asya.envelope"
#: the workspace that starts routes when the caller names none
GATEWAY = "asya-gateway"

_COLUMNS = ("id, root_id, parent_id, actors, current, end_actor, phase, status, progress,"
            " envelope_id, error")
_STEP = ("CALL agentpost.route_step(%s, %s, %s::uuid[], %s::jsonb, %s::jsonb, %s, %s, %s, %s,"
         " %s, NULL)")
#: the columns of agentpost.route_lease, in order
_LEASED = ("id", "sender", "recipient", "originator", "type", "format", "content",
           "attachments", "in_reply_to", "rights", "priority", "created_at", "origin", "status",
           "seq", "reason", "delivered_at", "consumed_at", "attempts", "tags", "headers", "meta",
           "redeliveries", "lease_token", "leases", "lease_until", "lease_holder", "routed")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RouteView(_Frozen):
    """One routed envelope as the status table holds it."""

    id: str
    root_id: str
    parent_id: str | None
    route: Route
    phase: Phase | None
    status: RouteStatus
    progress: float
    envelope_id: str
    error: dict[str, JsonValue] | None

    def member(self) -> Member:
        return Member(id=self.id, parent_id=self.parent_id, route=self.route, phase=self.phase)


class FamilyView(_Frozen):
    """A fan-out family: the envelope that started a route and every envelope descending
    from it; status and progress by `family_status` / `family_progress`."""

    root_id: str
    status: RouteStatus
    progress: float
    members: tuple[RouteView, ...]


class Hop(NamedTuple):
    """A leased hop: the lease (ack it through `complete`) and the routed envelope."""

    lease: Lease
    envelope: RoutedEnvelope


class Outcome(NamedTuple):
    """What an actor's handler made of a hop: its result, and its revised route, if any."""

    hop: Hop
    result: Any
    actors: Sequence[str] | None = None


#: an envelope to route on, the actor error that ended it, and its phase at its new actor
_Move = tuple[RoutedEnvelope, dict[str, Any] | None, Phase | None]


def wacp_id(envelope: RoutedEnvelope) -> str:
    """The WACP envelope id of a hop (also its idempotency key)."""
    route = envelope.route
    suffix = f":{route.end}" if route.end else ""
    return f"asya:{envelope.id}:{route.current}{suffix}"


def _view(row: Sequence[Any]) -> RouteView:
    rid, root, parent, actors, current, end, phase, status, prog, eid, error = row
    return RouteView(id=rid, root_id=root, parent_id=parent,
                     route=Route(actors=tuple(actors), current=current, end=end),
                     phase=phase, status=status, progress=prog, envelope_id=eid, error=error)


def _row(envelope: RoutedEnvelope, error: dict[str, Any] | None,
         phase: Phase | None) -> dict[str, Any]:
    route = envelope.route
    return {"id": envelope.id, "parent_id": envelope.parent_id, "actors": list(route.actors),
            "current": route.current, "end": route.end, "phase": phase,
            "envelope_id": wacp_id(envelope), "error": error}


def _moves(out: Step) -> list[_Move]:
    error = out.error.model_dump() if out.error else None
    return [(e, error, None if e.route.ended else Phase.QUEUED) for e in out.envelopes]


class RouteStore:
    """Routes over an `EnvelopeStore` (composition: the store stays what it is)."""

    def __init__(self, store: EnvelopeStore) -> None:
        self.store = store
        self._actors: frozenset[str] = frozenset()

    # -- set-up ---------------------------------------------------------------------------

    def setup(self, actors: Iterable[str], *, gateway: str = GATEWAY) -> list[str]:
        """Create the actor workspaces (and the end actors and the gateway) that do not exist
        yet, and the send rights between them, each to itself included (a route may name an
        actor twice in a row). Returns the workspace ids created."""
        wanted = [*dict.fromkeys([*actors, *sorted(END_ACTORS), gateway])]
        existing = {w.id: w.role for w in self.store.workspaces()}
        self._ensure_role_and_type()
        created = [n for n in wanted if n not in existing]
        for name in created:
            self.store.create_workspace(ACTOR_ROLE, workspace_id=name)
        names = [*created, *(w for w, role in existing.items() if role == ACTOR_ROLE)]
        for target in names:
            for holder in names:
                if holder in created or target in created:
                    self.store.grant_right(target, holder, target)
        self._actors = frozenset()
        return created

    def _ensure_role_and_type(self) -> None:
        try:
            self.store.define_role(ACTOR_ROLE)
        except Conflict:
            pass
        self.store.register_type(ENVELOPE_TYPE, [ACTOR_ROLE], [ACTOR_ROLE])

    def known(self, actors: Iterable[str] = ()) -> frozenset[str]:
        """The actors (workspaces of `ACTOR_ROLE`, end actors aside), from a cache that is
        refreshed when it lacks one of `actors` (so a hop costs no workspace scan)."""
        if not self._actors or not {a for a in actors if isinstance(a, str)} <= self._actors:
            self._actors = frozenset(w.id for w in self.store.workspaces()
                                     if w.role == ACTOR_ROLE) - END_ACTORS
        return self._actors

    # -- moving envelopes ------------------------------------------------------------------

    def start(self, data: dict[str, Any], *, sender: str = GATEWAY) -> RouteView:
        """Start a routed envelope (Asya's JSON shape) at its current actor. Raises
        `InvalidRoute`/`UnknownActor` for bad input and `Conflict` if the id is already
        routed otherwise, or if `parent_id` names a routed envelope; starting the same
        envelope again changes nothing."""
        (envelope,) = self.start_many([data], sender=sender)
        return self.get(envelope.id)

    def start_many(self, datas: Iterable[dict[str, Any]], *,
                   sender: str = GATEWAY) -> list[RoutedEnvelope]:
        """Start many routed envelopes in one transaction, all or nothing."""
        envelopes = []
        for data in datas:
            if not isinstance(data, dict):
                raise InvalidInput("a routed envelope is a JSON object")
            route = data.get("route")
            named = route.get("actors") if isinstance(route, dict) else None
            envelope = parse_envelope(data, known=self.known(
                named if isinstance(named, list) else ()))
            if envelope.route.ended:
                raise InvalidRoute("a route cannot start at an end actor")
            envelopes.append(envelope)
        if len({e.id for e in envelopes}) < len(envelopes):
            raise InvalidInput("the same envelope id twice in one start")
        self._call(sender, [], [(e, None, Phase.QUEUED) for e in envelopes], start=True)
        return envelopes

    def receive(self, actor: str, *, max: int = 1, ttl: float = 30.0) -> list[Hop]:
        """Lease up to `max` hops from `actor`'s inbox, each reported ``received`` (status
        running) in the same transaction. An envelope there that is not the current hop of a
        routed envelope (sent outside the runtime, a forged ``meta.asya``) is given back
        (its redeliveries run out and it is dead-lettered), not returned."""
        return self._hops(self.store.db.fetchall(
            "SELECT * FROM agentpost.route_lease(%s, %s, %s, %s)",
            (_ref(actor, "actor"), *_lease_args(actor, max, ttl))))

    def _hops(self, rows: Iterable[Sequence[Any]]) -> list[Hop]:
        """Hops from rows of route_lease; the leases of non-hops are given back."""
        hops, foreign = [], []
        for row in rows:
            *env, token, attempt, until, holder, routed = row
            envelope = self.store._envelope_row(env)
            lease = Lease(token=make_token(envelope.id, str(token)), envelope=envelope,
                          attempt=attempt, expires_at=until, holder=holder)
            if routed:
                hops.append(Hop(lease, decode(lease)))
            else:
                foreign.append(lease.token)
        for token in foreign:
            self.store.nack(token)
        return hops

    def complete(self, actor: str, lease: Lease, envelope: RoutedEnvelope, result: Any, *,
                 actors: Sequence[str] | None = None) -> Step:
        """Route `envelope` on by its actor's `result` (`agentpost.protocol.routes.step`):
        one transaction acks the lease, sends the resulting envelopes and records where each
        stands. A bad revision or a refused hop raises and changes nothing."""
        return self.complete_many(actor, [Outcome(Hop(lease, envelope), result, actors)])[0]

    def complete_many(self, actor: str, outcomes: Iterable[Outcome | tuple[Any, ...]],
                      ) -> list[Step]:
        """`complete` for many hops of one actor in one transaction, all or nothing."""
        return self._complete(actor, outcomes, None)[0]

    def complete_and_receive(self, actor: str,
                             outcomes: Iterable[Outcome | tuple[Any, ...]], *, max: int = 1,
                             ttl: float = 30.0) -> tuple[list[Step], list[Hop]]:
        """`complete_many`, then `receive` up to `max` further hops, in the same transaction
        (one call, one durable commit): the loop of a runtime that streams hops."""
        return self._complete(actor, outcomes, (max, ttl))

    def _complete(self, actor: str, outcomes: Iterable[Outcome | tuple[Any, ...]],
                  then: tuple[int, float] | None) -> tuple[list[Step], list[Hop]]:
        steps, tokens, moves = [], [], []
        for item in outcomes:
            hop, result, actors = _outcome(item)
            revised = actors is not None
            out = step(hop.envelope, result, actors=actors,
                       known=self.known(actors or ()) if revised else None)
            steps.append(out)
            tokens.append(hop.lease.token)
            moves.extend(_moves(out))
        if len(set(tokens)) < len(tokens):
            raise InvalidInput("the same lease twice in one step")
        if not tokens and then is None:
            return steps, []
        return steps, self._call(actor, tokens, moves, then=then)

    def report(self, actor: str, envelope: RoutedEnvelope, phase: Phase | str) -> RouteView:
        """Record the runtime's progress point (Asya's received / processing / completed)
        for `envelope` at `actor`, its current actor."""
        if phase not in set(Phase):
            raise InvalidInput(f"phase must be one of {', '.join(Phase)}, not {phase!r}")
        if envelope.route.ended or envelope.route.actor != actor:
            raise InvalidInput(f"{envelope.id!r} is not at actor {actor!r}")
        self.store.db.scalar("SELECT agentpost.route_record(%s, %s::jsonb)", (actor, json.dumps(
            [_row(envelope, None, Phase(phase))], ensure_ascii=False)))
        return self.get(envelope.id)

    def finish(self, lease: Lease) -> RoutedEnvelope:
        """What an end actor does with an envelope: take it out of its inbox. End actors never
        advance: the route row already says succeeded or failed."""
        envelope = decode(lease)
        self.finish_many([Hop(lease, envelope)])
        return envelope

    def finish_many(self, hops: Iterable[Hop]) -> int:
        """`finish` for many envelopes of end actors, in one transaction."""
        return self.store.ack_many(_ended_tokens(hops))

    def finish_and_receive(self, actor: str, hops: Iterable[Hop], *, max: int = 1,
                           ttl: float = 30.0) -> list[Hop]:
        """`finish_many` at end actor `actor`, then `receive` up to `max` more, in one
        transaction."""
        if actor not in END_ACTORS:
            raise InvalidInput(f"{actor!r} is not an end actor")
        return self._call(actor, _ended_tokens(hops), [], then=(max, ttl))

    def sweep_timeouts(self) -> list[str]:
        """Asya's "routed to error-end on timeout": returns the expired leases first
        (`expire_leases`, which dead-letters a hop whose redeliveries ran out), then moves
        every routed envelope whose current hop was dead-lettered to error-end, index kept,
        error ``timeout``, one transaction per actor. Returns the ids moved. Schedule it
        (CLI: ``agentpost route sweep``)."""
        self.store.expire_leases()
        views = [_view(r) for r in self.store.db.fetchall(
            f"SELECT {_COLUMNS} FROM agentpost.route_timed_out()")]
        by_actor: dict[str, list[_Move]] = {}
        for view in views:
            hop = self.store.get(view.envelope_id)
            failed = RoutedEnvelope(
                id=view.id, parent_id=view.parent_id,
                route=view.route.model_copy(update={"end": ERROR_END}),
                headers=hop.headers, payload=json.loads(hop.content or "null"),
                fan_outs=hop.meta.get("asya", {}).get("fan_outs", 0))
            error = {"error": "timeout", "message": f"hop {hop.id} {hop.reason}"}
            by_actor.setdefault(view.route.actor, []).append((failed, error, None))
        for actor, moves in sorted(by_actor.items()):
            self._call(actor, [], moves)
        return [v.id for v in views]

    def _call(self, actor: str, tokens: list[str], moves: list[_Move], *,
              start: bool = False, then: tuple[int, float] | None = None) -> list[Hop]:
        """One ``agentpost.route_step``: ack `tokens`, send and record `moves`, and lease
        `then` = (max, ttl) further hops. Returns those hops."""
        ids, uuids = zip(*map(split_token, tokens), strict=True) if tokens else ((), ())
        drafts = [self._draft(actor, e, i) for i, (e, _, _) in enumerate(moves)]
        rows = [_row(e, error, phase) for e, error, phase in moves]
        nxt, ttl_ms, holder = _lease_args(actor, *then) if then else (0, 0, None)
        result = self.store.db.scalar(_STEP, (
            _ref(actor, "actor"), list(ids), list(uuids), json.dumps(drafts, ensure_ascii=False),
            json.dumps(rows, ensure_ascii=False), start, self.store._timeout_ms, nxt, ttl_ms,
            holder))
        if then and result["leased"] is None:  # expired leases wait: they need a lease apart
            return self.receive(actor, max=then[0], ttl=then[1])
        return self._hops([tuple(r[c] for c in _LEASED) for r in result["leased"]])

    def _draft(self, sender: str, envelope: RoutedEnvelope, index: int) -> dict[str, Any]:
        draft = normalize_draft(
            {"from": sender, "to": envelope.route.actor, "type": ENVELOPE_TYPE,
             "content": json.dumps(envelope.payload, ensure_ascii=False), "format": "json",
             "envelope_id": wacp_id(envelope), "headers": dict(envelope.headers),
             "meta": {"asya": {"id": envelope.id, "parent_id": envelope.parent_id,
                               "route": envelope.route.model_dump(),
                               "fan_outs": envelope.fan_outs}}},
            index=index, max_content_bytes=self.store.settings.max_content_bytes)
        if draft.problem is not None:
            raise InvalidInput(f"envelope {envelope.id!r} cannot travel: {draft.problem}")
        return draft.row

    # -- status -----------------------------------------------------------------------------

    def get(self, envelope_id: str) -> RouteView:
        """Where a routed envelope stands (one primary-key probe)."""
        views = self.get_many([envelope_id])
        if not views:
            raise NotFound(f"no routed envelope {envelope_id!r}")
        return views[0]

    def get_many(self, envelope_ids: Iterable[str]) -> list[RouteView]:
        """The routed envelopes among `envelope_ids`, in id order (unknown ids left out)."""
        ids = list(envelope_ids)
        if not all(isinstance(i, str) for i in ids):
            raise InvalidInput("envelope ids are strings")
        return [_view(r) for r in self.store.db.fetchall(
            f"SELECT {_COLUMNS} FROM agentpost.route_get(%s)", (ids,))]

    def family(self, envelope_id: str) -> FamilyView:
        """The fan-out family of `envelope_id` (its root, or any member): every envelope
        sharing its root, by one scan of the ``routes_family`` index."""
        root = envelope_id
        rows = self._family_rows(root)
        if not rows:
            root = self.get(envelope_id).root_id
            rows = self._family_rows(root)
        views = tuple(map(_view, rows))
        members = [v.member() for v in views]
        return FamilyView(root_id=root, status=family_status(members),
                          progress=family_progress(members), members=views)

    def _family_rows(self, root: str) -> list[Any]:
        if not isinstance(root, str):
            raise InvalidInput("an envelope id is a string")
        return self.store.db.fetchall(f"SELECT {_COLUMNS} FROM agentpost.route_family(%s)",
                                      (root,))


def _lease_args(actor: str, max: int, ttl: float) -> tuple[int, int, str]:
    """Checked (max, ttl in ms, holder) of a lease by `actor`'s runtime."""
    if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= MAX_BATCH:
        raise InvalidInput(f"max must be between 1 and {MAX_BATCH}")
    return max, _seconds(ttl, "ttl", allow_zero=False), f"asya-{actor}"


def _outcome(item: Any) -> Outcome:
    if not isinstance(item, tuple) or not 2 <= len(item) <= 3 or not isinstance(item[0], Hop):
        raise InvalidInput("an outcome is (hop, result) or (hop, result, actors)")
    return Outcome(*item)


def _ended_tokens(hops: Iterable[Hop]) -> list[str]:
    tokens = []
    for hop in hops:
        if not hop.envelope.route.ended:
            raise InvalidInput(f"{hop.envelope.id!r} is not at an end actor")
        tokens.append(hop.lease.token)
    return tokens


def decode(lease: Lease) -> RoutedEnvelope:
    """The routed envelope a leased hop carries; `InvalidInput` for any other envelope."""
    env = lease.envelope
    asya = env.meta.get("asya")
    if not isinstance(asya, dict) or env.type != ENVELOPE_TYPE:
        raise InvalidInput(f"envelope {env.id} is not a routed envelope")
    return parse_envelope({"id": asya.get("id"), "parent_id": asya.get("parent_id"),
                           "route": asya.get("route"), "headers": env.headers,
                           "payload": json.loads(env.content or "null"),
                           "fan_outs": asya.get("fan_outs", 0)})


__all__ = ["ACTOR_ROLE", "ENVELOPE_TYPE", "GATEWAY", "FamilyView", "Hop", "Outcome",
           "RouteStore", "RouteView", "decode", "wacp_id"]
