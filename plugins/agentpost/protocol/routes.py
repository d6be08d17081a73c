"""Asya actor routes (Asya actor framework, "envelope and routing semantics"), pure, no I/O.

A routed envelope carries a route: an ordered tuple of actors and the index of the current
one. An actor's *result* decides what happens next (`step`):

- one payload (a JSON object, or any non-list JSON value) advances the route by one; past the
  last actor the envelope goes to ``happy-end`` (the index then equals ``len(actors)``);
- a non-empty list fans out: one envelope per item, all advanced. Child 0 keeps the id (and
  its own ``parent_id``), child ``i >= 1`` gets the id ``{id}-{i}`` and ``parent_id = id``
  (`fan_out_id`: from the second fan-out of the same id on, ``{id}.{k}-{i}``);
- ``None`` or ``[]`` ends the route at ``happy-end`` without advancing the index;
- an error object (`ActorError`, or a JSON object ``{"error": str, "message"?: str,
  "details"?: any}`` and nothing else) ends it at ``error-end``, keeping the index.

Decisions where the spec leaves room (docs/asya.md lists them all, with the store's):

- **Where an envelope is.** ``Route.end`` is ``None`` while an actor of the route holds the
  envelope (``current < len(actors)``), otherwise the end actor it went to. End actors never
  advance: stepping an ended envelope raises `RouteEnded` and changes nothing.
- **Enrichment is the default.** A payload result is merged onto the actor's input (top-level
  keys; the result's value wins for a key both have). An actor *means to drop* fields by
  listing them under the reserved key ``"$drop"`` (a list of strings) in its result; the key
  itself is never stored. A result that is not a JSON object, or an input that is not one,
  cannot be merged: the result replaces the payload. Fan-out items are merged the same way,
  each onto the parent's input.
- **A misbehaving actor is an actor error, not a caller error.** A malformed result (a list
  holding ``None``, a nested list or an error object; a bad ``"$drop"``) sends the envelope
  to ``error-end`` with ``{"error": "invalid_result", ...}``. Malformed *routes* and bad
  route revisions are the caller's fault and raise typed errors (`InvalidRoute`,
  `UnknownActor`, `RouteRewrite`).
- **Revising a route.** A handler may pass the route it wants (`step(..., actors=...)`): it
  must start with the travelled part, ``actors[:current + 1]`` (the current actor included);
  what follows is free, so a handler can append actors or replace ones not yet reached.
- **Status** comes from where the envelope is and what the runtime last reported about the
  current actor (`Phase`): ``pending`` (queued at the first actor, nobody picked it up),
  ``running``, ``succeeded`` (``happy-end``), ``failed`` (``error-end``), ``unknown`` (at the
  first actor with no report to tell pending from running). **Progress** is the share of the
  route's actors completed: ``current / n``, ``(current + 1) / n`` once the current actor
  reported ``completed``, 1 at ``happy-end`` (an empty response finishes the pipeline).
- **Fan-out ids are unique in a family.** The spec's ``{id}-{i}`` collides when the same id
  fans out twice (child 0 keeps the id, so ``X`` fanning out at two actors would name two
  children ``X-1``). An envelope counts the fan-outs its id made (`RoutedEnvelope.fan_outs`,
  carried along by child 0): the first names its children ``{id}-{i}`` as the spec says, the
  k-th after it ``{id}.{k}-{i}``. A member's id is its root's id plus a suffix of ``-{i}`` and
  ``.{k}-{i}`` steps that reads back one way only, and each (id, k, i) is named once (one
  envelope's fan-outs happen one after the other), so no two members of a family share an id,
  whatever the order in which branches complete; the ids depend on the tree alone.
- **Families.** A fan-out family is an envelope and every envelope descending from it through
  ``parent_id`` (the first child *is* the parent, continuing). A family's progress is the
  mean of its members'; its status is ``failed`` if any member failed and all have ended,
  ``succeeded`` if all succeeded, ``pending`` if all are pending, ``unknown`` if any member is
  unknown and none tells otherwise, else ``running``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from agentpost.protocol.errors import (  # re-exported: the route errors live with the rest
    InvalidInput,
    InvalidRoute,
    RouteEnded,
    RouteRewrite,
    UnknownActor,
)

HAPPY_END = "happy-end"
ERROR_END = "error-end"
END_ACTORS = frozenset({HAPPY_END, ERROR_END})
#: the reserved key of a payload result that lists the fields the actor means to drop
DROP_KEY = "$drop"
#: an actor name: a lowercase DNS label, so that ``asya-{name}`` is a valid queue name
ACTOR_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
#: the longest envelope id: a hop's WACP id, ``asya:{id}:{current}:{end}``, must stay within
#: the store's 128 characters of a caller-chosen id
MAX_ID = 96
#: an envelope id: the characters a WACP caller-chosen id may use
ENVELOPE_ID = rf"^[A-Za-z0-9._:-]{{1,{MAX_ID}}}$"
_ERROR_KEYS = frozenset({"error", "message", "details"})


class RouteStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


class Phase(StrEnum):
    """What the runtime last reported about the envelope at its current actor (Asya's
    progress points), or that it is queued there and nobody picked it up yet."""

    QUEUED = "queued"
    RECEIVED = "received"
    PROCESSING = "processing"
    COMPLETED = "completed"


class StepKind(StrEnum):
    ADVANCE = "advance"
    FAN_OUT = "fan_out"
    HAPPY_END = "happy_end"
    ERROR_END = "error_end"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _route_problem(actors: tuple[str, ...], current: int, end: str | None) -> str | None:
    """Why (actors, current, end) is not a route, or None if it is one."""
    if not actors:
        return "a route needs at least one actor"
    for actor in actors:
        if actor in END_ACTORS:
            return f"{actor!r} is managed by the runtime and may not appear in a route"
        if not ACTOR_NAME.match(actor):
            return f"{actor!r} is not an actor name (lowercase letters, digits, '-')"
    top = len(actors) if end == HAPPY_END else len(actors) - 1
    if not 0 <= current <= top:
        return f"current index {current} is outside the route (0..{top})"
    return None


class Route(_Frozen):
    """Strict types: an index is an integer (``"1"``, ``1.0`` or ``true`` is refused, as
    Asya's runtime refuses them, not coerced), a name a string."""

    actors: tuple[StrictStr, ...]
    current: StrictInt = 0
    #: the end actor the envelope went to, None while an actor of the route holds it
    end: StrictStr | None = None

    @model_validator(mode="after")
    def _check(self) -> Route:
        if self.end is not None and self.end not in END_ACTORS:
            raise ValueError(f"end must be {HAPPY_END!r}, {ERROR_END!r} or null")
        problem = _route_problem(self.actors, self.current, self.end)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def ended(self) -> bool:
        return self.end is not None

    @property
    def actor(self) -> str:
        """Who holds the envelope: the current actor, or the end actor."""
        return self.end or self.actors[self.current]

    @property
    def travelled(self) -> tuple[str, ...]:
        """The actors the envelope reached so far, the current one included."""
        return self.actors[: min(self.current + 1, len(self.actors))]


#: a header value: routing metadata is flat (WACP headers hold scalars only)
Header = str | int | float | bool | None


class RoutedEnvelope(_Frozen):
    id: StrictStr = Field(pattern=ENVELOPE_ID)
    parent_id: StrictStr | None = Field(default=None, pattern=ENVELOPE_ID)
    route: Route
    headers: dict[StrictStr, Header] = Field(default_factory=dict)
    payload: JsonValue
    #: how many fan-outs this id made so far (runtime bookkeeping, not in Asya's shape): it
    #: names the children of the next one (`fan_out_id`)
    fan_outs: StrictInt = Field(default=0, ge=0)


class ActorError(_Frozen):
    """An actor's error result (Asya's error object)."""

    error: StrictStr = Field(min_length=1)
    message: StrictStr | None = None
    details: JsonValue = None


class Step(_Frozen):
    """What an actor's result did: the envelopes to route on (one, or a fan-out family)."""

    kind: StepKind
    envelopes: tuple[RoutedEnvelope, ...]
    error: ActorError | None = None


# ---- building and validating --------------------------------------------------------------


#: the strict types' refusals, in the words of Asya's runtime ("must be an integer")
_STRICT_WORDS = {"int_type": "an integer", "string_type": "a string"}


def _invalid(exc: ValidationError) -> InvalidRoute:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "route"
    kind = _STRICT_WORDS.get(first["type"])
    if kind is not None:
        given = type(first.get("input")).__name__
        return InvalidRoute(f"{where}: must be {kind}, not {given}")
    return InvalidRoute(f"{where}: {first['msg'].removeprefix('Value error, ')}")


def check_known(actors: Iterable[str], known: Collection[str] | None) -> None:
    """Raise `UnknownActor` for the first actor not in `known` (None: any actor is known)."""
    if known is None:
        return
    for actor in actors:
        if actor not in known:
            raise UnknownActor(f"unknown actor {actor!r}: no such inbox")


def make_route(actors: Sequence[str], current: int = 0, *, end: str | None = None,
               known: Collection[str] | None = None) -> Route:
    """A validated route; raises `InvalidRoute` (or `UnknownActor`) and builds nothing else."""
    if isinstance(actors, str):
        raise InvalidRoute("actors must be a list of actor names, not a string")
    try:
        route = Route(actors=tuple(actors), current=current, end=end)
    except ValidationError as exc:
        raise _invalid(exc) from None
    check_known(route.actors, known)
    return route


def parse_envelope(data: Mapping[str, Any], *,
                   known: Collection[str] | None = None) -> RoutedEnvelope:
    """A routed envelope from its JSON shape (Asya's: id, parent_id, route, headers,
    payload); raises `InvalidRoute` / `UnknownActor` for bad input."""
    try:
        envelope = RoutedEnvelope.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None
    check_known(envelope.route.actors, known)
    return envelope


def revise(route: Route, actors: Sequence[str], *,
           known: Collection[str] | None = None) -> Route:
    """The route with a handler's revised actor list: it must keep the travelled part."""
    if route.ended:
        raise RouteEnded(f"the route is at {route.end}: it can no longer change")
    if isinstance(actors, str) or tuple(actors[: len(route.travelled)]) != route.travelled:
        raise RouteRewrite(
            f"a handler may not rewrite the travelled part {list(route.travelled)!r}")
    return make_route(actors, route.current, known=known)


# ---- results --------------------------------------------------------------------------------


def as_error(result: Any) -> ActorError | None:
    """The error object `result` is, or None. A JSON object is an error object when it has a
    non-empty string ``error`` and no keys besides ``error``, ``message`` and ``details``."""
    if isinstance(result, ActorError):
        return result
    if not isinstance(result, Mapping) or not result.keys() <= _ERROR_KEYS:
        return None
    if not isinstance(result.get("error"), str) or not result["error"]:
        return None
    try:
        return ActorError.model_validate(dict(result))
    except ValidationError:
        return None


def enrich(payload: JsonValue, result: JsonValue) -> JsonValue:
    """The payload after an actor returned `result` (enrichment, see the module docstring).
    Raises `InvalidInput` for a malformed ``"$drop"``."""
    if not isinstance(result, dict):
        return result
    drop = result.get(DROP_KEY, [])
    if not isinstance(drop, list) or not all(isinstance(k, str) for k in drop):
        raise InvalidInput(f"{DROP_KEY!r} must be a list of field names")
    added = {k: v for k, v in result.items() if k != DROP_KEY}
    if not isinstance(payload, dict):
        return added
    return {**{k: v for k, v in payload.items() if k not in drop}, **added}


def _forward(route: Route) -> Route:
    nxt = route.current + 1
    end = HAPPY_END if nxt == len(route.actors) else None
    return route.model_copy(update={"current": nxt, "end": end})


def _ended(envelope: RoutedEnvelope, end: str) -> RoutedEnvelope:
    route = envelope.route.model_copy(update={"end": end})
    return envelope.model_copy(update={"route": route})


def fan_out_id(envelope_id: str, fan_outs: int, index: int) -> str:
    """The id of child `index` (>= 1) of the fan-out of `envelope_id` that follows its
    `fan_outs` earlier ones: the spec's ``{id}-{index}`` for the first, ``{id}.{k}-{index}``
    for the k-th after it (the spec's id is taken by then: every fan-out names a child 1)."""
    return f"{envelope_id}-{index}" if fan_outs == 0 else f"{envelope_id}.{fan_outs}-{index}"


def _child(envelope: RoutedEnvelope, index: int, route: Route, payload: JsonValue, *,
           fanned: bool = False) -> RoutedEnvelope:
    """Child `index` of `envelope`'s step; `fanned`: the step is a fan-out (it named ids)."""
    if index == 0:
        return envelope.model_copy(update={"route": route, "payload": payload,
                                           "fan_outs": envelope.fan_outs + int(fanned)})
    return envelope.model_copy(update={
        "id": fan_out_id(envelope.id, envelope.fan_outs, index), "parent_id": envelope.id,
        "route": route, "payload": payload, "fan_outs": 0})


def _error_step(envelope: RoutedEnvelope, error: ActorError) -> Step:
    return Step(kind=StepKind.ERROR_END, envelopes=(_ended(envelope, ERROR_END),),
                error=error)


def _invalid_result(envelope: RoutedEnvelope, message: str) -> Step:
    return _error_step(envelope, ActorError(error="invalid_result", message=message))


def _fan_out(envelope: RoutedEnvelope, items: list[Any]) -> Step:
    for item in items:
        if item is None or isinstance(item, list) or as_error(item) is not None:
            return _invalid_result(envelope, "a fan-out item must be a payload")
    fanned = len(items) > 1
    if fanned and len(fan_out_id(envelope.id, envelope.fan_outs, len(items) - 1)) > MAX_ID:
        return _invalid_result(envelope, f"fan-out child ids would exceed {MAX_ID} characters")
    try:
        payloads = [enrich(envelope.payload, item) for item in items]
    except InvalidInput as exc:
        return _invalid_result(envelope, str(exc))
    route = _forward(envelope.route)
    children = tuple(_child(envelope, i, route, p, fanned=fanned)
                     for i, p in enumerate(payloads))
    kind = StepKind.FAN_OUT if fanned else StepKind.ADVANCE
    return Step(kind=kind, envelopes=children)


def _advance(envelope: RoutedEnvelope, result: Any) -> Step:
    try:
        payload = enrich(envelope.payload, result)
    except InvalidInput as exc:
        return _invalid_result(envelope, str(exc))
    return Step(kind=StepKind.ADVANCE,
                envelopes=(_child(envelope, 0, _forward(envelope.route), payload),))


def step(envelope: RoutedEnvelope, result: Any, *, actors: Sequence[str] | None = None,
         known: Collection[str] | None = None) -> Step:
    """What the current actor's `result` does to `envelope` (see the module docstring).
    `actors` is the handler's revised route, if it revised it (checked by `revise`).
    Raises `RouteEnded` at an end actor, `InvalidRoute` for a bad revision."""
    if envelope.route.ended:
        raise RouteEnded(f"envelope {envelope.id!r} is at {envelope.route.end}: "
                         "end actors never advance")
    if actors is not None:
        envelope = envelope.model_copy(update={"route": revise(envelope.route, actors,
                                                                known=known)})
    if result is None or result == []:
        return Step(kind=StepKind.HAPPY_END, envelopes=(_ended(envelope, HAPPY_END),))
    error = as_error(result)
    if error is not None:
        return _error_step(envelope, error)
    if isinstance(result, list):
        return _fan_out(envelope, result)
    return _advance(envelope, result)


# ---- status and progress ------------------------------------------------------------------


def status(route: Route, phase: Phase | None = None) -> RouteStatus:
    """The status of an envelope on `route`, given the runtime's last report about its
    current actor (None: no report known)."""
    if route.end == HAPPY_END:
        return RouteStatus.SUCCEEDED
    if route.end == ERROR_END:
        return RouteStatus.FAILED
    if route.current > 0 or phase not in (None, Phase.QUEUED):
        return RouteStatus.RUNNING
    return RouteStatus.PENDING if phase is Phase.QUEUED else RouteStatus.UNKNOWN


def progress(route: Route, phase: Phase | None = None) -> float:
    """The share of the route's actors completed, in [0, 1]."""
    if route.end == HAPPY_END:
        return 1.0
    done = route.current + (1 if phase is Phase.COMPLETED and not route.ended else 0)
    return done / len(route.actors)


class Member(_Frozen):
    """One envelope of a family as the status functions see it."""

    id: str
    parent_id: str | None = None
    route: Route
    phase: Phase | None = None


def family(root_id: str, members: Iterable[Member]) -> list[Member]:
    """The members descending from `root_id` through ``parent_id`` (the root included)."""
    pool = list(members)
    ids = {root_id}
    grew = True
    while grew:
        grew = False
        for m in pool:
            if m.parent_id in ids and m.id not in ids:
                ids.add(m.id)
                grew = True
    return [m for m in pool if m.id in ids]


def family_status(members: Sequence[Member]) -> RouteStatus:
    """The status of a fan-out family (see the module docstring); unknown when empty."""
    statuses = {status(m.route, m.phase) for m in members}
    if not statuses:
        return RouteStatus.UNKNOWN
    if statuses <= {RouteStatus.SUCCEEDED, RouteStatus.FAILED}:
        return RouteStatus.FAILED if RouteStatus.FAILED in statuses else RouteStatus.SUCCEEDED
    if statuses == {RouteStatus.PENDING}:
        return RouteStatus.PENDING
    if RouteStatus.UNKNOWN in statuses and RouteStatus.RUNNING not in statuses:
        return RouteStatus.UNKNOWN
    return RouteStatus.RUNNING


def family_progress(members: Sequence[Member]) -> float:
    """The mean progress of a family's members (0 for an empty family)."""
    if not members:
        return 0.0
    return sum(progress(m.route, m.phase) for m in members) / len(members)
