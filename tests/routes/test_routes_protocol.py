"""Asya's envelope routing rules (Asya actor framework, "envelope and routing semantics") on
the pure route model `agentpost.protocol.routes`. Each test quotes the rule it checks in its
docstring; where the spec says "for all" the test is a hypothesis test. The readings where
the spec leaves room are those of the module docstring of agentpost.protocol.routes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentpost.protocol.errors import Conflict, InvalidInput
from agentpost.protocol.routes import (
    DROP_KEY,
    ERROR_END,
    HAPPY_END,
    ActorError,
    InvalidRoute,
    Member,
    Phase,
    Route,
    RoutedEnvelope,
    RouteEnded,
    RouteRewrite,
    RouteStatus,
    StepKind,
    UnknownActor,
    enrich,
    family,
    family_progress,
    family_status,
    make_route,
    parse_envelope,
    progress,
    revise,
    status,
    step,
)

actor_names = st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z").filter(
    lambda a: a not in (HAPPY_END, ERROR_END))
actor_lists = st.lists(actor_names, min_size=1, max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
keys = st.text(min_size=1, max_size=6).filter(lambda k: k not in ("error", DROP_KEY))
objects = st.dictionaries(keys, scalars, max_size=5)


@st.composite
def envelopes(draw: Any) -> RoutedEnvelope:
    actors = draw(actor_lists)
    current = draw(st.integers(0, len(actors) - 1))
    return RoutedEnvelope(id=draw(st.text("abcdef0123456789-", min_size=1, max_size=12)),
                          parent_id=draw(st.none() | st.just("p")),
                          route=Route(actors=tuple(actors), current=current),
                          headers={"trace_id": "t"}, payload=draw(objects))


# ---- route validation -----------------------------------------------------------------------


@given(actor_lists, st.sampled_from([HAPPY_END, ERROR_END]), st.data())
def test_end_actors_may_not_appear_in_a_route(actors: list[str], end: str, data: Any) -> None:
    """"Do not include happy-end or error-end in route configurations - managed by sidecar.\""""
    at = data.draw(st.integers(0, len(actors)))
    with pytest.raises(InvalidRoute, match="managed by the runtime"):
        make_route([*actors[:at], end, *actors[at:]])


@given(actor_lists, st.integers())
def test_current_index_must_point_into_the_route(actors: list[str], current: int) -> None:
    """"current: Current actor index (0-based ...)": an index outside the actor list is a
    bad index, refused with a typed error."""
    if 0 <= current < len(actors):
        assert make_route(actors, current).actor == actors[current]
    else:
        with pytest.raises(InvalidRoute, match="outside the route"):
            make_route(actors, current)


@pytest.mark.parametrize("current", ["1", 1.0, True, b"1", None, [1]])
def test_the_current_index_is_an_integer_never_coerced(current: Any) -> None:
    """"current: Current actor index": an integer. ``"1"``, ``1.0`` or ``true`` used to be
    coerced to 1 and the route started; Asya's runtime refuses them ("must be an integer"),
    whether the route is built or comes in an envelope."""
    with pytest.raises(InvalidRoute, match=r"^current: must be an integer, not "):
        make_route(["prep", "infer"], current)
    envelope = {"id": "x", "route": {"actors": ["prep", "infer"], "current": current},
                "payload": {}}
    with pytest.raises(InvalidRoute, match=r"^route\.current: must be an integer, not "):
        parse_envelope(envelope)
    assert make_route(["prep", "infer"], 1).current == 1


@pytest.mark.parametrize("field, value, words", [
    ("id", 7, "id: must be a string, not int"),
    ("id", b"x", "id: must be a string, not bytes"),
    ("parent_id", 7, "parent_id: must be a string, not int"),
    ("route", {"actors": [b"prep"]}, "route.actors.0: must be a string, not bytes"),
    ("route", {"actors": ["prep"], "end": 1}, "route.end: must be a string, not int"),
    ("fan_outs", "1", "fan_outs: must be an integer, not str"),
    ("fan_outs", 1.0, "fan_outs: must be an integer, not float"),
])
def test_envelope_fields_are_not_coerced(field: str, value: Any, words: str) -> None:
    """Strings are strings and counts integers in every field of a routed envelope: a
    number for an id or bytes for a name is refused, not converted."""
    data = {"id": "x", "route": {"actors": ["prep"]}, "payload": {}, field: value}
    with pytest.raises(InvalidRoute) as caught:
        parse_envelope(data)
    assert str(caught.value) == words


def test_header_values_keep_their_json_type() -> None:
    """Headers are flat scalars: each keeps the type it was given ("1" stays a string, true
    a boolean), nothing is converted."""
    headers = {"a": "1", "b": 1, "c": True, "d": 1.5, "e": None}
    envelope = parse_envelope({"id": "x", "route": {"actors": ["prep"]}, "payload": {},
                               "headers": headers})
    assert [(k, type(v)) for k, v in envelope.headers.items()] == [
        (k, type(v)) for k, v in headers.items()]


@pytest.mark.parametrize("actors", [[], "prep", ["Prep"], ["a b"], [""], ["-x"], [1]])
def test_malformed_routes_are_refused(actors: Any) -> None:
    """"route (required): Actor list and current position": a route with no actors or
    with something that is not an actor name (queue ``asya-{actor_name}``) is refused."""
    with pytest.raises(InvalidRoute):
        make_route(actors)


@given(actor_lists, actor_names)
def test_unknown_actors_are_refused(actors: list[str], stranger: str) -> None:
    """Each actor is an agent with an inbox (issue 5): a route naming an actor without one is
    refused with `UnknownActor`, a typed `InvalidInput`."""
    known = set(actors) - {stranger}
    route = [*actors, stranger]
    with pytest.raises(UnknownActor, match=stranger):
        make_route(route, known=known)
    assert issubclass(UnknownActor, InvalidInput)


@pytest.mark.parametrize("data", [
    {"route": {"actors": ["a"], "current": 0}, "payload": {}},
    {"id": "x", "payload": {}},
    {"id": "x", "route": {"actors": ["a"]}},
    {"id": "x", "route": {"actors": ["a"], "current": 1}, "payload": {}},
    {"id": "x", "route": {"actors": ["a"]}, "payload": {}, "extra": 1},
    {"id": "", "route": {"actors": ["a"]}, "payload": {}},
])
def test_envelope_required_fields(data: dict[str, Any]) -> None:
    """"id (required) ... route (required) ... payload (required)": an envelope missing
    one, or with a bad index or unknown field, raises `InvalidRoute`."""
    with pytest.raises(InvalidRoute):
        parse_envelope(data)


def test_spec_envelope_example_parses() -> None:
    """The spec's envelope structure example is a valid routed envelope."""
    env = parse_envelope({"id": "unique-envelope-id", "parent_id": "original-envelope-id",
                          "route": {"actors": ["prep", "infer", "post"], "current": 0},
                          "headers": {"trace_id": "abc-123", "priority": "high"},
                          "payload": {"text": "Hello world"}})
    assert env.route.actor == "prep"
    assert status(env.route, Phase.QUEUED) is RouteStatus.PENDING


# ---- the step function ----------------------------------------------------------------------


@given(envelopes(), objects)
def test_single_response_advances(env: RoutedEnvelope, result: dict[str, Any]) -> None:
    """"Single Response ... Sidecar creates envelope → Increments current → Routes to next
    actor"; past the last actor it goes to happy-end ("when no more actors in route")."""
    out = step(env, result)
    assert out.kind is StepKind.ADVANCE
    (nxt,) = out.envelopes
    assert (nxt.id, nxt.parent_id, nxt.headers) == (env.id, env.parent_id, env.headers)
    assert nxt.route.current == env.route.current + 1
    last = env.route.current == len(env.route.actors) - 1
    assert nxt.route.end == (HAPPY_END if last else None)


@given(envelopes(), st.lists(objects, min_size=2, max_size=6))
def test_fan_out_ids(env: RoutedEnvelope, items: list[dict[str, Any]]) -> None:
    """"First envelope retains original ID ... Subsequent envelopes receive suffixed IDs:
    {original_id}-{index} ... All fanout children have parent_id set to original envelope
    ID", and each is routed to the next actor."""
    out = step(env, items)
    assert out.kind is StepKind.FAN_OUT
    assert len(out.envelopes) == len(items)
    first, *rest = out.envelopes
    assert (first.id, first.parent_id) == (env.id, env.parent_id)
    for i, child in enumerate(rest, start=1):
        assert (child.id, child.parent_id) == (f"{env.id}-{i}", env.id)
    assert {c.route for c in out.envelopes} == {out.envelopes[0].route}
    assert first.route.current == env.route.current + 1


def test_fan_out_spec_example() -> None:
    """"Example: Envelope abc-123 returns 3 items" → abc-123 (parent null), abc-123-1 and
    abc-123-2 (parent abc-123)."""
    env = parse_envelope({"id": "abc-123", "route": {"actors": ["split", "embed"]},
                          "payload": {"doc": "d"}})
    out = step(env, [{"chunk": 1}, {"chunk": 2}, {"chunk": 3}])
    assert [(c.id, c.parent_id) for c in out.envelopes] == [
        ("abc-123", None), ("abc-123-1", "abc-123"), ("abc-123-2", "abc-123")]
    assert [c.payload for c in out.envelopes][1] == {"doc": "d", "chunk": 2}


@given(envelopes(), st.sampled_from([None, []]))
def test_empty_response_goes_to_happy_end_without_increment(
        env: RoutedEnvelope, result: Any) -> None:
    """"Runtime returns null or []: Sidecar routes envelope to happy-end (no increment)"."""
    out = step(env, result)
    assert out.kind is StepKind.HAPPY_END
    (done,) = out.envelopes
    assert (done.route.end, done.route.current) == (HAPPY_END, env.route.current)
    assert done.payload == env.payload


@given(envelopes(), st.text(min_size=1, max_size=10), st.none() | st.text(max_size=10))
def test_error_response_goes_to_error_end_keeping_the_index(
        env: RoutedEnvelope, code: str, message: str | None) -> None:
    """"Runtime returns error object ... Sidecar routes to error-end (no increment)"."""
    result = {"error": code} if message is None else {"error": code, "message": message}
    for res in (result, ActorError(error=code, message=message)):
        out = step(env, res)
        assert out.kind is StepKind.ERROR_END
        assert out.error is not None and out.error.error == code
        (done,) = out.envelopes
        assert (done.route.end, done.route.current) == (ERROR_END, env.route.current)


@given(envelopes(), st.sampled_from([[None], [[1]], [{"error": "x"}],
                                     {"a": 1, DROP_KEY: "a"}]))
def test_malformed_results_go_to_error_end(env: RoutedEnvelope, result: Any) -> None:
    """A result that is none of the four response patterns is the actor's error ("routed
    when runtime returns error"): error-end with ``invalid_result``, index kept."""
    out = step(env, result)
    assert out.kind is StepKind.ERROR_END and out.error is not None
    assert out.error.error == "invalid_result"
    assert out.envelopes[0].route.current == env.route.current


@given(envelopes(), st.one_of(st.none(), objects, st.lists(objects, max_size=3)))
def test_end_actors_never_advance(env: RoutedEnvelope, result: Any) -> None:
    """End actors never advance the index (issue 5; end queues are terminal in the spec):
    stepping an envelope at happy-end or error-end raises `RouteEnded`."""
    for end in (step(env, None).envelopes[0], step(env, {"error": "e"}).envelopes[0]):
        with pytest.raises(RouteEnded):
            step(end, result)
    assert issubclass(RouteEnded, Conflict)


@given(envelopes(), st.lists(actor_names, max_size=3), objects)
def test_handler_may_extend_the_route(env: RoutedEnvelope, more: list[str],
                                      result: dict[str, Any]) -> None:
    """A handler may extend the route (issue 5): the appended actors are routed to."""
    actors = [*env.route.actors, *more]
    (nxt,) = step(env, result, actors=actors).envelopes
    assert nxt.route.actors == tuple(actors)
    if env.route.current + 1 < len(actors):
        assert nxt.route.actor == actors[env.route.current + 1]


@given(envelopes(), actor_names, st.data())
def test_handler_may_not_rewrite_the_travelled_part(env: RoutedEnvelope, other: str,
                                                    data: Any) -> None:
    """... "but never rewrite the part already travelled" (issue 5): changing any actor up
    to and including the current one raises `RouteRewrite` and changes nothing."""
    at = data.draw(st.integers(0, env.route.current))
    actors = list(env.route.actors)
    if actors[at] == other:
        other = other + "x" if len(other) < 63 else "z"
    actors[at] = other
    before = env.model_dump()
    with pytest.raises(RouteRewrite):
        step(env, {"a": 1}, actors=actors)
    with pytest.raises(RouteRewrite):
        revise(env.route, actors[: env.route.current])  # dropping travelled actors too
    assert env.model_dump() == before


@given(envelopes())
def test_revision_checks_actors(env: RoutedEnvelope) -> None:
    """A revised route is a route: no end actors, only known actors."""
    with pytest.raises(InvalidRoute):
        step(env, {}, actors=[*env.route.actors, HAPPY_END])
    with pytest.raises(UnknownActor):
        step(env, {}, actors=[*env.route.actors, "zz-new"], known=set(env.route.actors))


# ---- payload enrichment -------------------------------------------------------------------


@given(objects, objects)
def test_enrichment_keeps_fields(payload: dict[str, Any], result: dict[str, Any]) -> None:
    """"Recommended: Actors append results to payload instead of replacing it": every input
    field survives unless the result sets it, and every result field is in the output."""
    out = enrich(payload, result)
    assert isinstance(out, dict)
    assert all(out[k] == v for k, v in result.items())
    assert all(out[k] == v for k, v in payload.items() if k not in result)


@given(objects, objects, st.data())
def test_enrichment_drops_only_what_is_meant(payload: dict[str, Any],
                                             result: dict[str, Any], data: Any) -> None:
    """Actors never drop fields unless they mean to (issue 5): they mean to by listing them
    under ``"$drop"``; exactly those go, and ``"$drop"`` itself is never stored."""
    drop = data.draw(st.lists(st.sampled_from(sorted(payload)), unique=True)
                     if payload else st.just([]))
    out = enrich(payload, {**result, DROP_KEY: drop})
    assert isinstance(out, dict) and DROP_KEY not in out
    assert set(out) == (set(payload) - set(drop)) | set(result)


def test_enrichment_spec_example() -> None:
    """The spec's data-loader → recipe-generator → llm-judge example, through `step`."""
    env = parse_envelope({"id": "r", "route": {"actors": [
        "data-loader", "recipe-generator", "llm-judge"]}, "payload": {"product_id": "123"}})
    for result in ({"product_name": "Ice-cream Bourgignon"},
                   {"recipe": "Cook ice-cream in tomato sauce for 3 hours"},
                   {"recipe_eval": "INVALID", "recipe_eval_details": "Recipe is nonsense"}):
        (env,) = step(env, result).envelopes
    assert env.route.end == HAPPY_END
    assert list(env.payload) == ["product_id", "product_name", "recipe", "recipe_eval",
                                 "recipe_eval_details"]


# ---- status and progress ------------------------------------------------------------------


def test_progress_spec_example() -> None:
    """"Route ["prep", "infer", "post"] (3 actors) - Actor prep completed → 33% - Actor
    infer completed → 66% - Actor post completed → 100%"."""
    r = make_route(["prep", "infer", "post"])
    assert progress(r, Phase.QUEUED) == 0
    assert progress(r, Phase.COMPLETED) == pytest.approx(1 / 3)
    assert progress(make_route(r.actors, 1), Phase.COMPLETED) == pytest.approx(2 / 3)
    assert progress(make_route(r.actors, 3, end=HAPPY_END)) == 1


@given(envelopes(), st.none() | st.sampled_from(list(Phase)))
def test_status_values(env: RoutedEnvelope, phase: Phase | None) -> None:
    """"pending: Envelope created, not yet processing; running: being processed by actors;
    succeeded: happy-end; failed: error-end; unknown: status cannot be determined"."""
    r = env.route
    got = status(r, phase)
    if r.current == 0 and phase is Phase.QUEUED:
        assert got is RouteStatus.PENDING
    elif r.current == 0 and phase is None:
        assert got is RouteStatus.UNKNOWN
    else:
        assert got is RouteStatus.RUNNING
    assert status(step(env, None).envelopes[0].route, phase) is RouteStatus.SUCCEEDED
    assert status(step(env, {"error": "e"}).envelopes[0].route, phase) is RouteStatus.FAILED


@given(envelopes(), st.lists(objects, max_size=4), st.sampled_from(list(Phase)))
def test_progress_never_decreases_along_a_step(env: RoutedEnvelope, result: list[Any],
                                               phase: Phase) -> None:
    """"progress_percent = (actors_completed / total_actors) * 100": within [0, 1], and a
    successful step never lowers it (a completed actor stays completed)."""
    before = progress(env.route, Phase.COMPLETED)
    assert 0 <= progress(env.route, phase) <= 1
    for child in step(env, result).envelopes:
        assert before <= progress(child.route, phase) <= 1


def _members(envs: list[RoutedEnvelope], phase: Phase | None = None) -> list[Member]:
    return [Member(id=e.id, parent_id=e.parent_id, route=e.route, phase=phase) for e in envs]


@given(envelopes(), st.lists(objects, min_size=2, max_size=5))
def test_family_status_and_progress(env: RoutedEnvelope, items: list[Any]) -> None:
    """Status and progress per fan-out family (issue 5): a family is running until every
    member ended, failed if any member failed, succeeded if all succeeded; its progress is
    the mean of its members'."""
    env = env.model_copy(update={"parent_id": None})
    children = list(step(env, items).envelopes)
    fam = family(env.id, _members(children, Phase.QUEUED))
    assert len(fam) == len(items)
    ended = [step(c, None).envelopes[0] if c.route.end is None else c for c in children]
    assert family_status(_members(ended)) is RouteStatus.SUCCEEDED
    assert family_progress(_members(ended)) == 1
    if children[0].route.end is None:
        assert family_status(_members([ended[0], *children[1:]], Phase.RECEIVED)) \
            is RouteStatus.RUNNING
        failed = step(children[1], {"error": "e"}).envelopes[0]
        assert family_status(_members([*ended[:1], failed, *ended[2:]])) \
            is RouteStatus.FAILED
    mixed = _members(children, Phase.QUEUED)
    assert family_progress(mixed) == pytest.approx(
        sum(progress(m.route, m.phase) for m in mixed) / len(mixed))


def test_family_follows_nested_fan_outs() -> None:
    """Fan-out children that fan out again stay in the family of the first envelope."""
    env = parse_envelope({"id": "a", "route": {"actors": ["s", "t", "u"]}, "payload": {}})
    first = step(env, [{"x": 1}, {"x": 2}]).envelopes
    second = step(first[1], [{"y": 1}, {"y": 2}]).envelopes
    members = _members([first[0], *second], Phase.QUEUED)
    assert [m.id for m in family("a", members)] == ["a", "a-1", "a-1-1"]
    assert [m.id for m in family("a-1", members)] == ["a-1", "a-1-1"]
    assert family_status([]) is RouteStatus.UNKNOWN


def test_fan_out_child_ids_must_fit_a_hop_id() -> None:
    """Decision: an id is at most MAX_ID characters (a hop's WACP id must fit the store's
    128); a fan-out whose child ids would exceed it is the actor's error (invalid_result)."""
    from agentpost.protocol.routes import MAX_ID

    env = RoutedEnvelope(id="x" * (MAX_ID - 1), route=Route(actors=("a", "b")), payload={})
    out = step(env, [{"k": 0}, {"k": 1}])
    assert out.kind is StepKind.ERROR_END and out.error is not None
    assert out.error.error == "invalid_result"
    assert step(env, [{"k": 0}]).kind is StepKind.ADVANCE  # child 0 keeps the id
    with pytest.raises(InvalidRoute):
        parse_envelope({"id": "x" * (MAX_ID + 1), "route": {"actors": ["a"]}, "payload": {}})


def test_a_later_fan_out_of_an_id_is_named_apart() -> None:
    """Asya §Fan-Out, "Fanout ID semantics", nested: child 0 keeps the id, so an id can fan
    out again at a later actor; its children there are ``{id}.{k}-{i}`` (k: the fan-outs the
    id made before), not a second ``{id}-{i}``. A child's own first fan-out keeps the spec's
    ``{id}-{i}``."""
    env = parse_envelope({"id": "X", "route": {"actors": ["a", "b", "c", "d"]}, "payload": {}})
    x, x1 = step(env, [{"p": 0}, {"p": 1}]).envelopes
    again = step(x, [{"q": 0}, {"q": 1}, {"q": 2}]).envelopes
    assert [(e.id, e.parent_id, e.fan_outs) for e in again] == [
        ("X", None, 2), ("X.1-1", "X", 0), ("X.1-2", "X", 0)]
    assert [e.id for e in step(again[0], [{}, {}]).envelopes] == ["X", "X.2-1"]
    assert [e.id for e in step(x1, [{}, {}]).envelopes] == ["X-1", "X-1-1"]
    assert step(x1, [{}]).envelopes[0].fan_outs == 0  # one item is an advance: no ids named
    from agentpost.protocol.routes import MAX_ID

    long = RoutedEnvelope(id="x" * (MAX_ID - 3), route=Route(actors=("a", "b")), payload={})
    assert step(long, [{}, {}]).kind is StepKind.FAN_OUT  # x…x-1 fits
    later = step(long.model_copy(update={"fan_outs": 1}), [{}, {}])
    assert later.error is not None and later.error.error == "invalid_result"  # x…x.1-1 not


@st.composite
def fan_out_trees(draw: Any) -> tuple[RoutedEnvelope, list[RoutedEnvelope],
                                       list[RoutedEnvelope]]:
    """A random fan-out tree: a route of 2-4 actors, each hop returning a payload, a fan-out
    of 2-3 items, or nothing. Returns the root, the envelopes the fan-outs named (children
    ``i >= 1``) and the latest state of every member."""
    actors = [f"s{i}" for i in range(draw(st.integers(2, 4)))]
    root = parse_envelope({"id": draw(st.sampled_from(["X", "X-1", "a.1-1"])),
                           "route": {"actors": actors}, "payload": {}})
    named, latest, todo = [], {root.id: root}, [root]
    while todo:
        env = todo.pop(draw(st.integers(0, len(todo) - 1)))
        first, *rest = step(env, draw(st.sampled_from([{}, [{}, {}], [{}, {}, {}], None])))\
            .envelopes
        named.extend(rest)
        for child in (first, *rest):
            latest[child.id] = child
            if not child.route.ended:
                todo.append(child)
    return root, named, list(latest.values())


@given(fan_out_trees())
def test_fan_out_ids_are_unique_in_a_family(
        tree: tuple[RoutedEnvelope, list[RoutedEnvelope], list[RoutedEnvelope]]) -> None:
    """Asya §Envelope Structure, "id: Unique envelope identifier", under nested fan-outs, in
    any order of the hops: every id a fan-out names is new (no two members of a family share
    one), and the family found through parent_id is every member."""
    root, named, members = tree
    ids = [root.id, *(e.id for e in named)]
    assert len(set(ids)) == len(ids)
    assert len(members) == len(ids)
    assert {m.id for m in family(root.id, _members(members))} == set(ids)
