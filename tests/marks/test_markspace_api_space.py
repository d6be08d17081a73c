"""Both mark spaces driven through the markspace package's API (issue 15): its constructor
(positional order), method names, keyword names and exception types, on memory and
Postgres alike. Written from the package's signatures and documented behaviour (§8, §8.3,
§8.6), not from its tests.

Cheap on purpose: one space per test, a fixed clock moved by hand, a few writes each.
"""

from __future__ import annotations

import threading
import uuid
import warnings

import pytest

from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Intent,
    MarkType,
    Need,
    Observation,
    Scope,
    Source,
    Warning,
    WatchPattern,
)
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.marks.space import (
    MarkSpace,
    NeedCluster,
    QuotaExceededError,
    ScopeError,
    ValidationError,
)
from marks_backends import T0, SpaceFactory, unique_space_name

DECAY = DecayConfig(observation_half_life=60.0, warning_half_life=30.0, intent_ttl=100.0)
OPS = Scope(name="ops", decay=DECAY, allowed_action_verbs=("did", "answered"),
            allowed_intent_verbs=("book",), observation_topics=("load", "heat"),
            conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE)
CALM = Scope(name="calm", decay=DECAY, conflict_policy=ConflictPolicy.YIELD_ALL)
ALL = [t.value for t in MarkType]
ALICE = Agent(name="alice", scopes={"ops": ALL, "calm": ALL})
BOB = Agent(name="bob", scopes={"ops": ALL, "calm": ALL})
NEEDY = Agent(name="needy", scopes={"ops": ["need"]})


@pytest.fixture
def make(new_space: SpaceFactory):
    """make(**options) -> a fresh space of the test's backend, with OPS and CALM, at T0."""
    return lambda **options: new_space([OPS, CALM], T0, **options)


def at(space, t: float) -> None:
    space.set_clock(T0 + t)


# ----------------------------------------------------------------- constructor


def test_constructors_take_the_package_positional_order(module_dsn: str) -> None:
    """MarkSpace(scopes, clock, max_marks_per_agent) positionally; PostgresMarkSpace the
    same, plus dsn= and space= by keyword."""
    spaces = [MarkSpace([OPS], T0, 1),
              PostgresMarkSpace([OPS], T0, 1, dsn=module_dsn, space=unique_space_name())]
    for space in spaces:
        assert space.now() == T0 and space.get_scope(scope_name="ops/x") == OPS
        assert space.max_marks_per_agent == 1
        space.write(ALICE, Action(scope="ops", action="did"))
        with pytest.raises(QuotaExceededError):
            space.write(ALICE, Action(scope="ops", action="did"))
        space.close()
    assert MarkSpace().max_marks_per_agent is None


def test_postgres_dsn_first_is_deprecated_but_works(module_dsn: str) -> None:
    """The old calls PostgresMarkSpace(dsn, scopes=..., space=...) and (dsn, scopes, clock,
    space) still work, with a DeprecationWarning; a DSN given twice is refused."""
    name = unique_space_name()
    with pytest.warns(DeprecationWarning, match="dsn="):
        old = PostgresMarkSpace(module_dsn, [OPS], T0, space=name)
    with old, warnings.catch_warnings():
        warnings.simplefilter("error")
        new = PostgresMarkSpace(scopes=[OPS], clock=T0, dsn=module_dsn, space=name)
        with new:
            written = old.write(ALICE, Action(scope="ops", action="did"))
            assert new.get_mark(written).id == written
    for call in (lambda: PostgresMarkSpace(module_dsn, scopes=[OPS], space=name),
                 lambda: PostgresMarkSpace(module_dsn, [OPS], None, name)):
        with pytest.warns(DeprecationWarning), call() as same:
            assert same.space == name and same.get_mark(written) is not None
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="twice"):
        PostgresMarkSpace(module_dsn, dsn=module_dsn)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_quota_argument_is_checked(bad: object) -> None:
    with pytest.raises(ValueError):
        MarkSpace([OPS], T0, bad)


# ----------------------------------------------------------------- errors


def test_package_exception_types(make) -> None:
    """ScopeError for an unauthorized write; ValidationError for an unknown scope, a verb or
    topic the scope refuses; nothing stored either way."""
    space = make()
    for agent, mark, error in (
        (NEEDY, Action(scope="ops", action="did"), ScopeError),
        (ALICE, Action(scope="nowhere", action="did"), ValidationError),
        (ALICE, Action(scope="ops", action="fly"), ValidationError),
        (ALICE, Intent(scope="ops", resource="r", action="fly"), ValidationError),
        (ALICE, Observation(scope="ops", topic="weather", content={"v": "x"}), ValidationError),
    ):
        with pytest.raises(error):
            space.write(agent, mark)
    assert len(space) == 0
    with pytest.raises(ValidationError):
        space.get_scope("nowhere")
    with pytest.raises(ValidationError):
        space.read("nowhere")


def test_observation_above_max_source_is_a_scope_error(make) -> None:
    """§4.1: an agent capped at EXTERNAL_VERIFIED may not claim FLEET trust."""
    space = make()
    outsider = Agent(name="out", scopes={"ops": ["observation"]},
                     max_source=Source.EXTERNAL_VERIFIED)
    with pytest.raises(ScopeError):
        space.write(outsider, Observation(scope="ops", topic="load", content={"v": 1},
                                          source=Source.FLEET))
    assert len(space) == 0
    space.write(outsider, Observation(scope="ops", topic="load", content={"v": 1},
                                      source=Source.EXTERNAL_UNVERIFIED))
    assert len(space) == 1


# ----------------------------------------------------------------- quota


def test_quota_refuses_frees_on_supersession_and_gc(make) -> None:
    """max_marks_per_agent counts an agent's live marks: a write past it is a
    QuotaExceededError (nothing stored, other agents unaffected); a mark superseded (by
    anyone) gives its place back; gc() gives back what it deletes."""
    space = make(max_marks_per_agent=2)
    first = space.write(ALICE, Intent(scope="ops", resource="r", action="book"))
    space.write(ALICE, Action(scope="ops", action="did"))
    with pytest.raises(QuotaExceededError):
        space.write(ALICE, Action(scope="ops", action="did"))
    with pytest.raises(QuotaExceededError):  # at the limit even a supersession is refused
        space.write(ALICE, Intent(scope="ops", resource="r", action="book", supersedes=first))
    assert len(space) == 2
    replaced = space.write(BOB, Intent(scope="ops", resource="r", action="book",
                                       supersedes=first))
    third = space.write(ALICE, Intent(scope="ops", resource="s", action="book"))
    with pytest.raises(QuotaExceededError):
        space.write(ALICE, Action(scope="ops", action="did"))
    at(space, DECAY.intent_ttl + 1)  # `third` and Bob's intent expire
    assert space.gc() == 3  # the superseded intent, the two expired ones
    assert space.get_mark(third) is None and space.get_mark(replaced) is None
    space.write(ALICE, Action(scope="ops", action="did"))
    with pytest.raises(QuotaExceededError):
        space.write(ALICE, Action(scope="ops", action="did"))


def test_quota_of_a_batch_is_all_or_nothing(make) -> None:
    space = make(max_marks_per_agent=3)
    space.write(ALICE, Action(scope="ops", action="did"))
    with pytest.raises(QuotaExceededError):
        space.write_many(ALICE, [Action(scope="ops", action="did")] * 3)
    assert len(space) == 1
    space.write_many(ALICE, [Action(scope="ops", action="did")] * 2)
    assert len(space) == 3


def test_quota_holds_across_postgres_objects(module_dsn: str) -> None:
    """The count is the database's, under an advisory lock per (space, agent): eight
    objects (eight connections) racing for one agent's last place let exactly one in."""
    name = unique_space_name()
    spaces = [PostgresMarkSpace([OPS], T0, 3, dsn=module_dsn, space=name, pool_size=8)
              for _ in range(8)]
    try:
        spaces[0].write_many(ALICE, [Action(scope="ops", action="did")] * 2)
        start = threading.Barrier(len(spaces))
        outcomes: list[str] = []

        def race(space: PostgresMarkSpace) -> None:
            start.wait()
            try:
                space.write(ALICE, Action(scope="ops", action="did"))
                outcomes.append("written")
            except QuotaExceededError:
                outcomes.append("refused")

        threads = [threading.Thread(target=race, args=(s,)) for s in spaces]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused"] * 7 + ["written"]
        assert len(spaces[1]) == 3
    finally:
        for space in spaces:
            space.close()


# ----------------------------------------------------------------- gc


def test_gc_collects_what_can_never_be_read_again(make) -> None:
    """gc(grace_period): intents grace seconds past their TTL, resolved needs, superseded
    marks, observations decayed below 1e-10; never actions nor live marks. Reads are the
    same before and after."""
    space = make()
    intent = space.write(ALICE, Intent(scope="ops", resource="r", action="book"))
    act = space.write(ALICE, Action(scope="ops", action="did"))
    need = space.write(ALICE, Need(scope="ops", question="which?"))
    copy = space.resolve(need, act)
    old = space.write(ALICE, Observation(scope="ops", topic="load", content={"v": 1}))
    space.write(ALICE, Observation(scope="ops", topic="load", content={"v": 2}, supersedes=old))
    faint = space.write(ALICE, Observation(scope="ops", topic="load", content={"v": 3},
                                           initial_strength=1e-3))
    assert space.gc() == 3  # the resolved need, its resolved copy, the superseded reading
    gone = {need, copy, old}
    assert all(space.get_mark(m) is None for m in gone)
    assert space.get_mark(intent) is not None and space.get_mark(faint) is not None
    at(space, DECAY.intent_ttl + 10)
    assert space.gc(grace_period=20) == 0  # intent expired 10 s ago, grace is 20
    before = [m.id for m in space.read("ops", min_strength=0.0)]
    assert space.gc(grace_period=5) == 1 and space.get_mark(intent) is None
    at(space, 60 * 25)  # 1e-3 * 2^-25 < 1e-10
    assert space.gc() == 1 and space.get_mark(faint) is None
    assert space.get_mark(act) is not None
    assert [m.id for m in space.read("ops", min_strength=0.0)] == [
        m for m in before if m not in (intent, faint)]
    with pytest.raises(ValueError):
        space.gc(-1.0)


# ----------------------------------------------------------------- intents and conflicts


def test_get_intents_and_check_conflict(make) -> None:
    """get_intents covers child scopes and skips superseded and expired intents;
    check_conflict applies the scope's policy (None under YIELD_ALL or with no intent)."""
    space = make()
    low = space.write(ALICE, Intent(scope="ops", resource="r", action="book", confidence=0.2))
    high = space.write(BOB, Intent(scope="ops/team", resource="r", action="book",
                                   confidence=0.9))
    space.write(ALICE, Intent(scope="ops", resource="other", action="book"))
    assert [i.id for i in space.get_intents("ops", "r")] == [low, high]
    assert [i.id for i in space.get_intents("ops/team", "r")] == [high]
    assert space.check_conflict("ops", "r") == high
    assert space.check_conflict("ops/team", "r") == high  # one intent: it wins
    assert space.check_conflict("ops", "nothing") is None
    newer = space.write(BOB, Intent(scope="ops/team", resource="r", action="book",
                                    confidence=0.1, supersedes=high))
    assert space.check_conflict("ops", "r") == low
    assert [i.id for i in space.get_intents("ops", "r")] == [low, newer]
    at(space, DECAY.intent_ttl + 1)
    assert space.get_intents("ops", "r") == [] and space.check_conflict("ops", "r") is None
    space.write(ALICE, Intent(scope="calm", resource="r", action="go"))
    space.write(BOB, Intent(scope="calm", resource="r", action="go"))
    assert space.check_conflict("calm", "r") is None
    with pytest.raises(ValidationError):
        space.get_intents("nowhere", "r")


# ----------------------------------------------------------------- read, hooks, resolve


def test_read_max_tokens_keeps_the_strongest_prefix(make) -> None:
    """max_tokens: marks in strength order while their estimated tokens
    (len(str(model_dump())) // 4) fit; 0 tokens, nothing; None, everything."""
    space = make()
    for strength in (0.5, 1.0, 0.8):
        space.write(ALICE, Observation(scope="ops", topic="load", content={"text": "x" * 40},
                                       initial_strength=strength))
    full = space.read("ops", topic="load")
    costs = [len(str(m.model_dump())) // 4 for m in full]
    assert [m.initial_strength for m in full] == [1.0, 0.8, 0.5]
    assert space.read("ops", topic="load", max_tokens=costs[0] + costs[1]) == full[:2]
    assert space.read("ops", topic="load", max_tokens=costs[0] + costs[1] - 1) == full[:1]
    assert space.read("ops", topic="load", max_tokens=0) == []
    assert space.read("ops", topic="load", max_tokens=None) == full
    with pytest.raises(ValueError):
        space.read("ops", max_tokens="many")


def test_write_hook_gets_agent_id_and_stored_mark(make) -> None:
    """§8.6: add_write_hook(hook) -> handle; hook(agent_id, mark) after each write."""
    space = make()
    seen = []
    handle = space.add_write_hook(hook=lambda agent_id, mark: seen.append((agent_id, mark.id)))
    written = space.write(ALICE, Action(scope="ops", action="did"))
    assert seen == [(ALICE.id, written)]
    assert space.remove_write_hook(handle) is True and space.remove_write_hook(handle) is False
    space.write(ALICE, Action(scope="ops", action="did"))
    assert len(seen) == 1


def test_resolve_checks_like_the_package(make) -> None:
    """§8.3, P29: resolve(need, action, agent=None) needs a stored, successful action
    (ValidationError otherwise, as for an unknown or non-need mark); an agent that may not
    write actions in the need's scope is a ScopeError. Nothing is written on refusal."""
    space = make()
    need = space.write(ALICE, Need(scope="ops", question="which room?"))
    done = space.write(BOB, Action(scope="ops", action="did"))
    failed = space.write(BOB, Action(scope="ops", action="did", failed=True))
    intent = space.write(BOB, Intent(scope="ops", resource="r", action="book"))
    for args, error in (
        ((need, uuid.uuid4()), ValidationError),
        ((need, failed), ValidationError),
        ((need, intent), ValidationError),
        ((done, done), ValidationError),
        ((uuid.uuid4(), done), ValidationError),
        ((need, done, NEEDY), ScopeError),
    ):
        with pytest.raises(error):
            space.resolve(*args)
    assert len(space) == 4
    copy = space.get_mark(space.resolve(need, done, agent=BOB))
    assert (copy.resolved_by, copy.supersedes, copy.agent_id) == (done, need, ALICE.id)
    if "resolved_by_agent" in Need.model_fields:
        assert copy.resolved_by_agent == BOB.id
    assert space.read("ops", mark_type=MarkType.NEED) == [] and space.aggregate_needs() == []
    with pytest.raises(ValidationError):
        space.resolve(need, done)


def test_warning_does_not_hide_an_intent_from_get_intents(make) -> None:
    """get_intents counts decay only (as the package): a warning lowers read strength but
    the intent still holds its claim until its TTL."""
    space = make()
    intent = space.write(ALICE, Intent(scope="ops", resource="r", action="book"))
    space.write(BOB, Warning(scope="ops", topic="t", invalidates=intent))
    assert space.read("ops", resource="r") == []
    assert [i.id for i in space.get_intents("ops", "r")] == [intent]


def test_aggregate_needs_one_cluster_per_scope(make) -> None:
    """§8.4 as the package presents it: one NeedCluster per scope (its needs in write
    order), priority min(1, max + 0.1 * ln n), blocking count, contexts; a need at strength
    0 after a warning is left out; clusters highest priority first."""
    space = make()
    space.write(ALICE, Need(scope="ops", question="Which room?", priority=0.5,
                            context={"n": 1}))
    space.write(BOB, Need(scope="ops", question="Budget?", priority=0.95, blocking=True))
    calm = space.write(ALICE, Need(scope="calm", question="Lunch?", priority=0.97))
    muted = space.write(ALICE, Need(scope="calm", question="Muted?", priority=0.99))
    space.write(BOB, Warning(scope="calm", topic="t", invalidates=muted))
    clusters = space.aggregate_needs()
    assert [(c.scope, c.blocking_count) for c in clusters] == [("ops", 1), ("calm", 0)]
    assert clusters[0].effective_priority == 1.0  # 0.95 + 0.1 * ln 2, capped
    assert [n.question for n in clusters[0].needs] == ["Which room?", "Budget?"]
    assert clusters[0].contexts == [{"n": 1}, None]
    assert clusters[1] == NeedCluster("calm", [space.get_mark(calm)], 0.97, 0, [None])


def test_watchers_of_a_superseded_mark_hear_of_its_replacement(make) -> None:
    """§13.3-§13.4 as the package does it: a mark that supersedes a watched one is queued
    for the watcher even when the new mark no longer matches the pattern itself (P50-P52)."""
    space = make()
    space.subscribe(BOB, [WatchPattern(scope="ops", topic="load")])
    old = space.write(ALICE, Observation(scope="ops", topic="load", content={"v": 1}))
    moved = space.write(ALICE, Observation(scope="ops", topic="heat", content={"v": 2},
                                           supersedes=old))
    space.write(ALICE, Observation(scope="ops", topic="heat", content={"v": 3}))
    assert [m.id for m in space.get_watched_marks(BOB)] == [old, moved]
    assert space.get_watched_marks(BOB) == []
