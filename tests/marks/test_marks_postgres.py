"""What only the Postgres mark space has to show: durability across objects and processes,
many spaces side by side in one database, cheap construction, strength computed in SQL equal
to the core functions, the guard lock across processes, and its transaction.

The behaviour both backends share (every P-number) is tested by the parametrized suites
(test_marks_properties.py and friends); these tests are about the database underneath.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg2.extensions import make_dsn

from agentpost.marks import (
    Action,
    Agent,
    DecayConfig,
    Intent,
    InvalidArgument,
    MarkType,
    Need,
    Observation,
    Scope,
    ScopeVisibility,
    Severity,
    Source,
    UnauthorizedWrite,
    UnknownScope,
    Warning,
    WatchPattern,
    compute_strength,
    effective_strength_with_warnings,
    trust_weight,
)
from agentpost.marks.core import TRUST_WEIGHTS
from agentpost.marks.postgres import FADE_FLOOR, PostgresMarkSpace
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import (
    ConfigurationError,
    StoreError,
    StoreUnavailable,
)
from dbtools import connect, query, rows
from marks_backends import ALIVE

T0 = 1_700_000_000.0

CAL = Scope(
    name="cal",
    decay=DecayConfig(observation_half_life=3600.0, warning_half_life=600.0, intent_ttl=1800.0),
)
NEWS = Scope(name="news", visibility=ScopeVisibility.PROTECTED)
ALL_TYPES = [t.value for t in MarkType]
WRITER = Agent(name="writer", scopes={"cal": ALL_TYPES, "news": ALL_TYPES})
READER = Agent(name="reader", scopes={"cal": ["intent"]})


def space_name() -> str:
    return f"s_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def space(dsn: str) -> Iterator[PostgresMarkSpace]:
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL, NEWS], clock=T0, space=space_name()) as s:
        yield s


def some_marks(space: PostgresMarkSpace) -> list[uuid.UUID]:
    """One mark of each type (plus a superseding action and a warning on the observation)."""
    intent = space.write(WRITER, Intent(scope="cal", resource="r1", action="book",
                                        confidence=0.7))
    action = space.write(WRITER, Action(scope="cal", resource="r1", action="booked",
                                        result={"n": 1.5e16, "s": "é"}, supersedes=intent))
    obs = space.write(WRITER, Observation(scope="cal", topic="t", content={"a": [1, 2.0]},
                                          confidence=0.4, source=Source.EXTERNAL_VERIFIED))
    warning = space.write(WRITER, Warning(scope="cal", topic="t", invalidates=obs,
                                          reason="stale", severity=Severity.CRITICAL,
                                          initial_strength=0.25))
    need = space.write(WRITER, Need(scope="cal", question="which?", context={"k": None},
                                    priority=0.9, blocking=True))
    return [intent, action, obs, warning, need]


# --------------------------------------------------------------------------- durability


def test_marks_outlive_the_object_that_wrote_them(dsn: str) -> None:
    """A new object on the same space sees exactly what was stored, field for field, with
    the same strengths; nothing is kept in the writing object."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as first:
        ids = some_marks(first)
        before = first.all_marks()
        strengths = [first.strength_of(m) for m in before]
        first.set_clock(T0 + 900)
        later = [first.strength_of(m) for m in before]
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as second:
        assert [m.id for m in second.all_marks()] == ids
        assert second.all_marks() == before
        assert [second.get(i) for i in ids] == before
        assert [second.strength_of(m) for m in before] == strengths
        second.set_clock(T0 + 900)
        assert [second.strength_of(m) for m in before] == later
        assert len(second) == 5


def _write_from_another_process(dsn: str, name: str, count: int, out: Any) -> None:
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0 + 5, space=name) as space:
        ids = [space.write(WRITER, Observation(scope="cal", topic="far", content={"i": i}))
               for i in range(count)]
    out.put([str(i) for i in ids])


def test_marks_and_queues_are_shared_across_processes(dsn: str) -> None:
    """A spawned process (its own pool, scopes and clock) writes; this one reads the marks,
    and a subscription made here before gets them queued, in write order, once."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as here:
        here.subscribe(READER, [WatchPattern(scope="cal", topic="far")])
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        proc = ctx.Process(target=_write_from_another_process, args=(dsn, name, 12, out))
        proc.start()
        ids = [uuid.UUID(i) for i in out.get(timeout=120)]
        proc.join(timeout=60)
        assert proc.exitcode == 0
        assert {m.id for m in here.read("cal", topic="far")} == set(ids)
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], space=name) as poller:  # yet another object
        assert [m.id for m in poller.get_watched_marks(READER, clear=False)] == ids
        assert [m.id for m in poller.get_watched_marks(READER)] == ids
        assert poller.get_watched_marks(READER) == []


def test_created_at_never_goes_back_whatever_the_writer_s_clock(dsn: str) -> None:
    """P32 across objects (processes): a writer whose clock is behind the latest mark in the
    space stamps that mark's time, not its own."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0 + 100, space=name) as ahead, \
            PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as behind:
        first = ahead.get(ahead.write(WRITER, Intent(scope="cal", resource="a", action="x")))
        second = behind.get(behind.write(WRITER, Intent(scope="cal", resource="b", action="x")))
        assert first is not None and second is not None
        assert second.created_at == first.created_at == T0 + 100
        behind.set_clock(T0 + 200)
        third = behind.get(behind.write(WRITER, Intent(scope="cal", resource="c", action="x")))
        assert third is not None and third.created_at == T0 + 200


def test_decay_is_fixed_when_the_mark_is_written(dsn: str) -> None:
    """Processes may register a scope with different DecayConfigs; a mark decays by the one
    it was written under, for every reader, so they all agree on its strength."""
    name = space_name()
    short = Scope(name="cal", decay=DecayConfig(intent_ttl=10.0, observation_half_life=10.0))
    long = Scope(name="cal", decay=DecayConfig(intent_ttl=1000.0, observation_half_life=1e4))
    with PostgresMarkSpace(dsn=dsn, scopes=[short], clock=T0, space=name) as writer, \
            PostgresMarkSpace(dsn=dsn, scopes=[long], clock=T0 + 20, space=name) as reader:
        intent = writer.write(WRITER, Intent(scope="cal", resource="r", action="x"))
        obs = writer.write(WRITER, Observation(scope="cal", topic="t"))
        assert reader.read("cal", resource="r") == []
        assert reader.strength_of(reader.get(intent)) == 0.0
        assert reader.strength_of(reader.get(obs)) == pytest.approx(0.25, rel=1e-12)


# --------------------------------------------------------------------------- many spaces


def test_spaces_in_one_database_never_see_each_other(dsn: str) -> None:
    """Same scopes, same resources, ids that point across: nothing crosses a space."""
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=space_name()) as a, \
            PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=space_name()) as b:
        a.subscribe(READER, [WatchPattern(scope="cal")])
        ids_a = some_marks(a)
        obs_a = ids_a[2]
        # b supersedes and warns against a's observation by id: a must not care
        b.write(WRITER, Observation(scope="cal", topic="t", supersedes=obs_a))
        b.write(WRITER, Warning(scope="cal", topic="t", invalidates=obs_a, initial_strength=9))
        b.write(WRITER, Need(scope="cal", question="other?"))
        assert a.strength_of(a.get(obs_a)) == pytest.approx(0.7 - 0.25)
        assert [m.id for m in a.read("cal", resource="r1")] == [ids_a[1]]
        assert b.read("cal", resource="r1") == []
        assert b.get(ids_a[0]) is None
        assert len(a) == 5 and len(b) == 3
        assert [c.needs[0].question for c in a.aggregate_needs()] == ["which?"]
        assert [c.needs[0].question for c in b.aggregate_needs()] == ["other?"]
        assert len(a.get_watched_marks(READER)) == 5
        assert b.get_watched_marks(READER) == []
        # the guard lock is per space: the same (scope, resource) in two spaces is two keys
        entered = threading.Event()

        def other_space() -> None:
            with b.lock("cal", "r1"):
                entered.set()

        with a.lock("cal", "r1"):
            thread = threading.Thread(target=other_space)
            thread.start()
            assert entered.wait(10)
        thread.join()


def test_constructing_a_space_does_no_io() -> None:
    """No DDL, no scan, not even a connection: a space on a server that does not exist is
    built at once; the first call that needs the database fails with a typed error."""
    dsn = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
    started = time.perf_counter()
    spaces = [PostgresMarkSpace(dsn=dsn, scopes=[CAL], space=f"s{i}") for i in range(2000)]
    assert time.perf_counter() - started < 2.0
    with pytest.raises(StoreUnavailable):
        spaces[0].read("cal", resource="r")
    for s in spaces:
        s.close()


def test_spaces_share_one_pool_per_database(dsn: str) -> None:
    """Many space objects on one DSN use the connections of one pool; closing the last of
    them closes the pool."""
    dbname = query(dsn, "SELECT current_database()")[0][0]
    count = ("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
             " AND application_name = 'agentpost'")
    spaces = [PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=space_name())
              for _ in range(50)]
    assert query(dsn, count, (dbname,)) == [(0,)]
    for s in spaces:
        s.write(WRITER, Intent(scope="cal", resource="r", action="x"))
        assert len(s.read("cal", resource="r")) == 1
    assert query(dsn, count, (dbname,))[0][0] <= 4
    for s in spaces:
        s.close()
    deadline = time.monotonic() + 10
    while query(dsn, count, (dbname,)) != [(0,)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert query(dsn, count, (dbname,)) == [(0,)]


def test_a_role_that_can_create_nothing_runs_every_operation(dsn: str) -> None:
    """A space needs no DDL: a login role with only these grants (SELECT and INSERT on the
    marks, which are never updated or deleted; the subscription tables; the agents' names,
    which a write records; the identity sequence) runs every operation."""
    role = f"marks_only_{uuid.uuid4().hex[:8]}"
    admin = connect(dsn)
    try:
        rows(admin, f"CREATE ROLE {role} LOGIN")
        rows(admin, f"GRANT USAGE ON SCHEMA agentpost TO {role}")
        rows(admin, f"GRANT SELECT, INSERT ON agentpost.marks TO {role}")
        rows(admin, f"GRANT SELECT, INSERT, UPDATE, DELETE ON agentpost.mark_subscriptions,"
                    f" agentpost.mark_watch TO {role}")
        rows(admin, f"GRANT SELECT, INSERT, UPDATE ON agentpost.mark_agents TO {role}")
        rows(admin, f"GRANT USAGE ON SEQUENCE agentpost.marks_seq TO {role}")
        limited = make_dsn(libpq_dsn(dsn), user=role)
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            query(limited, "CREATE TABLE agentpost.x (i int)")
        with PostgresMarkSpace(dsn=limited, scopes=[CAL], clock=T0, space=space_name()) as s:
            s.subscribe(READER, [WatchPattern(scope="cal")])
            ids = some_marks(s)
            assert len(s.read("cal", topic="t")) == 2
            assert s.strength_of(s.get(ids[2])) == pytest.approx(0.7 - 0.25)
            with s.lock("cal", "r9"):
                s.write(WRITER, Intent(scope="cal", resource="r9", action="x"))
            resolved = s.resolve(ids[4], ids[1])
            assert s.get(resolved) is not None and s.aggregate_needs() == []
            assert {m.mark_type for m in s.active_marks()} >= {MarkType.ACTION}
            assert len(s.get_watched_marks(READER)) == 7
            s.unsubscribe(READER)
    finally:
        rows(admin, f"DROP OWNED BY {role}")
        rows(admin, f"DROP ROLE {role}")
        admin.close()


# --------------------------------------------------------------------------- strength in SQL

HYPOTHESIS = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])

half_lives = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False)
strengths = st.one_of(
    st.floats(min_value=0.0, max_value=5.0),
    st.sampled_from([0.0, 1e-300, 5e-324, 1.0]),
)
ages = st.one_of(
    st.floats(min_value=-1e4, max_value=1e7),
    st.sampled_from([0.0, 1e-9, 1e12]),
)


@st.composite
def targets(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(list(MarkType)))
    initial = draw(strengths)
    if kind is MarkType.INTENT:
        return Intent(scope="cal", resource="r", action="x", initial_strength=initial,
                      confidence=draw(st.floats(0, 1)))
    if kind is MarkType.ACTION:
        return Action(scope="cal", resource="r", action="x", initial_strength=initial)
    if kind is MarkType.OBSERVATION:
        return Observation(scope="cal", topic="t", initial_strength=initial,
                           source=draw(st.sampled_from(list(Source))))
    if kind is MarkType.WARNING:
        return Warning(scope="cal", topic="t", initial_strength=initial)
    return Need(scope="cal", question="q", initial_strength=initial,
                resolved_by=draw(st.one_of(st.none(), st.just(uuid.uuid4()))))


@given(
    target=targets(),
    decay=st.builds(DecayConfig, observation_half_life=half_lives,
                    warning_half_life=half_lives, intent_ttl=half_lives),
    warnings=st.lists(st.tuples(strengths, st.booleans(), ages), max_size=4),
    superseded=st.booleans(),
    age=ages,
)
@HYPOTHESIS
def test_strength_computed_in_sql_equals_the_core_functions(
    module_dsn: str, target: Any, decay: DecayConfig,
    warnings: list[tuple[float, bool, float]], superseded: bool, age: float,
) -> None:
    """For random marks, decay configs, warnings (some superseded, written at other times)
    and read times: the strength SQL computes (strength_of, read, active_marks) is
    core.effective_strength_with_warnings over the unsuperseded warnings, with each mark's
    own DecayConfig; 0 once superseded. Extreme ages and strengths included: where IEEE
    arithmetic underflows, SQL must give 0 (or a denormal), not an error."""
    scope = Scope(name="cal", decay=decay)
    with PostgresMarkSpace(dsn=module_dsn, scopes=[scope], clock=T0, space=space_name()) as space:
        target_id = space.write(WRITER, target)
        live = []
        for strength, dropped, when in warnings:
            space.set_clock(T0 + max(0.0, when))
            wid = space.write(WRITER, Warning(scope="cal", topic="t", invalidates=target_id,
                                              initial_strength=strength))
            if dropped:
                space.write(WRITER, Warning(scope="cal", topic="t", supersedes=wid,
                                            initial_strength=0.0))
            else:
                live.append(space.get(wid))
        if superseded:
            space.write(WRITER, Action(scope="cal", action="x", supersedes=target_id))
        now = T0 + age
        space.set_clock(now)
        stored = space.get(target_id)
        expected = 0.0 if superseded else effective_strength_with_warnings(
            stored, live, now, decay_config=decay)
        got = space.strength_of(stored)
        assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-300), (got, expected)
        read = {m.id for m in space.read("cal", mark_type=stored.mark_type, min_strength=0.0)}
        assert (target_id in read) == (not superseded)  # at 0: strength 0 too (§8.2)
        alive = {m.id for m in space.read("cal", mark_type=stored.mark_type, min_strength=ALIVE)}
        assert (target_id in alive) == (got > 0.0)
        active = {m.id for m in space.active_marks("cal", stored.mark_type)}
        assert (target_id in active) == (got > 0.0)


EXTREMES = [0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1.0, 1e300, 8.98846567431158e307,
            1.7976931348623157e308]
finite = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EXTREMES + [-x for x in EXTREMES]),
)
positive = st.one_of(
    st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False),
    st.sampled_from(EXTREMES[1:]),
)


@given(
    kind=st.sampled_from(["observation", "warning"]),
    initial=st.one_of(st.just(0.0), positive), created=finite, now=finite, half_life=positive,
    source=st.sampled_from([None, *[s.value for s in Source]]),
)
@settings(max_examples=300, deadline=None)
def test_sql_decay_never_fails_on_any_float(
    module_dsn: str, kind: str, initial: float, created: float, now: float, half_life: float,
    source: str | None,
) -> None:
    """mark_base_strength over the whole float range: never an SQL error (Postgres raises on
    underflow and overflow where Python returns 0 or inf), and equal to core's decay times
    trust wherever core itself does not overflow."""
    source = source if kind == "observation" else None
    conn = connect(module_dsn)
    try:
        got = rows(conn, "SELECT agentpost.mark_base_strength(%s, %s, %s, %s, %s, NULL, false,"
                         " %s)", (kind, initial, created, now, half_life, source))[0][0]
    finally:
        conn.close()
    mark = (Observation(scope="cal", topic="t", initial_strength=initial,
                        source=source or Source.FLEET, created_at=created)
            if kind == "observation" else
            Warning(scope="cal", topic="t", initial_strength=initial, created_at=created))
    decay = DecayConfig(observation_half_life=half_life, warning_half_life=half_life)
    try:
        expected = compute_strength(mark, now, decay) * trust_weight(mark)
    except OverflowError:  # now - created overflowed in Python: nothing to compare
        return
    assert 0.0 <= got <= initial
    assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-320), (got, expected)


def test_warnings_too_strong_to_add_up_saturate_instead_of_failing(dsn: str) -> None:
    """Two warnings of strength 1e308 on one mark: Python's sum is inf and the mark is at
    0; the SQL sum must say the same, not raise an overflow error on every read."""
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=space_name()) as space:
        target = space.write(WRITER, Action(scope="cal", resource="r", action="x",
                                            initial_strength=1.7e308))
        for _ in range(2):
            space.write(WRITER, Warning(scope="cal", topic="t", invalidates=target,
                                        initial_strength=1e308))
        stored = space.get(target)
        assert space.strength_of(stored) == 0.0
        assert space.read("cal", resource="r", min_strength=ALIVE) == []
        assert [m.id for m in space.read("cal", resource="r", min_strength=0.0)] == [target]
        assert effective_strength_with_warnings(
            stored, space.read("cal", topic="t"), T0, decay_config=CAL.decay) == 0.0


def test_trust_weights_in_sql_are_the_core_weights(module_dsn: str) -> None:
    for source, weight in TRUST_WEIGHTS.items():
        assert query(module_dsn, "SELECT agentpost.mark_trust_weight(%s)",
                     (source.value,)) == [(weight,)]
    assert query(module_dsn, "SELECT agentpost.mark_trust_weight(NULL)") == [(1.0,)]


def test_the_index_prunes_nothing_a_read_should_return(dsn: str) -> None:
    """Reads skip faded marks in the index (fades_at); at the exact boundaries (an intent at
    age == ttl, an observation right around 1e-6) the result is what core computes."""
    decay = DecayConfig(intent_ttl=30.0, observation_half_life=1.0)
    scope = Scope(name="cal", decay=decay)
    with PostgresMarkSpace(dsn=dsn, scopes=[scope], clock=T0, space=space_name()) as space:
        intent = space.get(space.write(WRITER, Intent(scope="cal", resource="r", action="x")))
        obs = space.get(space.write(WRITER, Observation(scope="cal", topic="t")))
        for now in (T0 + 30.0, math.nextafter(T0 + 30.0, math.inf), T0 + 31):
            space.set_clock(now)
            expected = compute_strength(intent, now, decay) > 0
            assert bool(space.read("cal", resource="r", min_strength=ALIVE)) == expected
            assert space.read("cal", resource="r", min_strength=0.0)  # expired or not
            assert bool(space.read("cal", resource="r")) == expected
        # 2^-20 = 9.5e-7 < FADE_FLOOR < 2^-19 = 1.9e-6
        for halvings in (18.0, 19.0, 19.9, 20.0, 21.0, 60.0, 2000.0):
            now = T0 + halvings
            space.set_clock(now)
            s = compute_strength(obs, now, decay)
            for threshold in (0.0, ALIVE, 1e-9, FADE_FLOOR / 2, FADE_FLOOR, 1e-5):
                got = space.read("cal", topic="t", min_strength=threshold)
                assert bool(got) == (s >= threshold), (halvings, threshold)


# --------------------------------------------------------------------------- subscriptions in SQL

names = st.sampled_from(["a", "a/b", "a/b/c", "ab", "b", "a/bc"])


@given(
    patterns=st.lists(st.builds(
        WatchPattern, scope=names,
        mark_type=st.one_of(st.none(), st.sampled_from(list(MarkType))),
        topic=st.one_of(st.none(), st.sampled_from(["t", "u"])),
        resource=st.one_of(st.none(), st.sampled_from(["r", "s"])),
    ), min_size=1, max_size=3),
    scope=names,
    kind=st.sampled_from(list(MarkType)),
    key=st.sampled_from(["t", "u", "r", "s"]),
    read_scopes=st.lists(names, max_size=2),
)
@HYPOTHESIS
def test_queueing_in_sql_matches_watch_patterns_and_read_authorization(
    module_dsn: str, patterns: list[WatchPattern], scope: str, kind: MarkType, key: str,
    read_scopes: list[str],
) -> None:
    """The SQL that picks subscribers at write time agrees with WatchPattern.matches (P50)
    and Agent.can_read (P23, P26) for any patterns, scopes and read authorizations."""
    fields: dict[str, Any] = {"scope": scope}
    if kind in (MarkType.INTENT, MarkType.ACTION):
        fields.update(resource=key, action="x")
    elif kind is MarkType.NEED:
        fields.update(question="q")
    else:
        fields.update(topic=key)
    cls = {MarkType.INTENT: Intent, MarkType.ACTION: Action, MarkType.OBSERVATION: Observation,
           MarkType.WARNING: Warning, MarkType.NEED: Need}[kind]
    mark = cls(**fields)
    agent = Agent(name="sub", read_scopes=tuple(read_scopes))
    matched, readable = query(
        module_dsn,
        "SELECT agentpost.mark_watch_matches(%s::jsonb, %s, %s, %s, %s),"
        " agentpost.mark_can_read(%s::text[], %s)",
        (json.dumps([p.model_dump(mode="json") for p in patterns]), scope, kind.value,
         getattr(mark, "topic", None), getattr(mark, "resource", None), read_scopes, scope),
    )[0]
    assert matched == any(p.matches(mark) for p in patterns)
    assert readable == agent.can_read(scope)


# --------------------------------------------------------------------------- the guard lock


def _claim_resources(dsn: str, name: str, resources: list[str], seed: int, out: Any) -> None:
    """A racing process: for each resource, under lock(), read-check-write an action
    claiming it unless one exists; reports how many it claimed."""
    import random

    agent = Agent(name=f"racer-{seed}", scopes={"cal": ALL_TYPES})
    order = list(resources)
    random.Random(seed).shuffle(order)
    claimed = 0
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], space=name) as space:
        for resource in order:
            with space.lock("cal", resource):
                if not space.read("cal", resource=resource, mark_type=MarkType.ACTION):
                    time.sleep(0.002)  # widen the window a broken lock would leave open
                    space.write(agent, Action(scope="cal", resource=resource, action="took"))
                    claimed += 1
    out.put(claimed)


def test_lock_serializes_read_check_write_across_processes(dsn: str) -> None:
    """N processes race a read-check-write on the same resources under lock(scope,
    resource): every resource is claimed exactly once."""
    name = space_name()
    resources = [f"slot-{i}" for i in range(25)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_resources, args=(dsn, name, resources, seed, out))
             for seed in range(4)]
    for p in procs:
        p.start()
    claimed = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(claimed) == len(resources)
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], space=name) as space:
        assert sorted(m.resource for m in space.all_marks()) == sorted(resources)


def test_lock_blocks_the_same_key_only(dsn: str) -> None:
    """Another connection (object, process) waits for the same (scope, resource) until the
    holder's transaction ends; a different resource does not wait."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as holder, \
            PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name,
                              pool_size=2) as other:
        same, different = threading.Event(), threading.Event()

        def take(resource: str, flag: threading.Event) -> None:
            with other.lock("cal", resource):
                flag.set()

        with holder.lock("cal", "r"):
            threads = [threading.Thread(target=take, args=("r", same)),
                       threading.Thread(target=take, args=("q", different))]
            for t in threads:
                t.start()
            assert different.wait(10)
            assert not same.wait(0.5)
        assert same.wait(10)
        for t in threads:
            t.join()


def test_calls_inside_lock_run_in_its_transaction(space: PostgresMarkSpace, dsn: str) -> None:
    """Inside lock(): this thread's calls see their own writes, other connections do not
    until the block ends; hooks fire after the commit; a nested lock() joins the
    transaction."""
    fired: list[uuid.UUID] = []
    space.add_write_hook(lambda agent_id, mark: fired.append(mark.id))
    count = "SELECT count(*) FROM agentpost.marks WHERE space = %s"
    with space.lock("cal", "r"):
        first = space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
        assert [m.id for m in space.read("cal", resource="r")] == [first]
        assert query(dsn, count, (space.space,)) == [(0,)]
        with space.lock("cal", "other"):  # re-entrant, same transaction
            second = space.write(WRITER, Intent(scope="cal", resource="other", action="x"))
        assert query(dsn, count, (space.space,)) == [(0,)]
        assert fired == []
    assert query(dsn, count, (space.space,)) == [(2,)]
    assert fired == [first, second]


def test_raising_inside_lock_rolls_back(space: PostgresMarkSpace) -> None:
    """A block that raises leaves nothing behind: its writes are undone (unlike in memory,
    where they stay) and their hooks never fire."""
    fired: list[uuid.UUID] = []
    space.add_write_hook(lambda agent_id, mark: fired.append(mark.id))
    with pytest.raises(RuntimeError), space.lock("cal", "r"):
        written = space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
        raise RuntimeError("the tool failed")
    assert space.get(written) is None and fired == [] and len(space) == 0
    # and the space (and its pooled connection) work normally afterwards
    with space.lock("cal", "r"):
        space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
    assert len(space) == 1 and len(fired) == 1


def test_a_deadlock_between_locks_is_a_typed_error_and_undoes_the_block(dsn: str) -> None:
    """Two threads take the same two keys in opposite orders: Postgres breaks the deadlock,
    the victim gets a StoreError (even if it swallows it inside the block, leaving the block
    raises, since its transaction is gone), and the other completes."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as space:
        both_in = threading.Barrier(2)
        outcomes: dict[str, object] = {}

        def run(first: str, second: str) -> None:
            try:
                with space.lock("cal", first):
                    space.write(WRITER, Intent(scope="cal", resource=first, action="x"))
                    both_in.wait(10)
                    try:
                        with space.lock("cal", second):
                            pass
                    except StoreError as exc:
                        outcomes[first + "-caught"] = exc
                outcomes[first] = "committed"
            except StoreError as exc:
                outcomes[first] = exc

        threads = [threading.Thread(target=run, args=("a", "b")),
                   threading.Thread(target=run, args=("b", "a"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        victims = [k for k in ("a", "b") if isinstance(outcomes.get(k), StoreError)]
        assert len(victims) == 1, outcomes
        assert isinstance(outcomes[victims[0] + "-caught"], StoreError)
        winner = "b" if victims == ["a"] else "a"
        assert outcomes[winner] == "committed"
        assert [m.resource for m in space.all_marks()] == [winner]


def test_a_connection_lost_inside_lock_is_a_typed_error(space: PostgresMarkSpace,
                                                        dsn: str) -> None:
    """The server ends the session while a lock() is open: the calls fail with
    StoreUnavailable, nothing of the block is stored, and the next lock() works (the broken
    connection left the pool)."""
    with pytest.raises(StoreUnavailable), space.lock("cal", "r"):
        space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
        query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_locks"
                   " WHERE locktype = 'advisory' AND pid <> pg_backend_pid() AND database ="
                   " (SELECT oid FROM pg_database WHERE datname = current_database())")
        space.read("cal", resource="r")
    with space.lock("cal", "r"):
        space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
    assert len(space.read("cal", resource="r")) == 1


# --------------------------------------------------------------------------- reads and queues


def test_reads_write_nothing(dsn: str) -> None:
    """P28 at the database: with every session read-only, all reading operations still
    work and return what they did before, and a write fails with a typed error."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL, NEWS], clock=T0, space=name) as space:
        space.subscribe(READER, [WatchPattern(scope="cal")])
        ids = some_marks(space)
        before = query(dsn, "SELECT xmin::text, * FROM agentpost.marks ORDER BY seq")
    dbname = query(dsn, "SELECT current_database()")[0][0]
    admin = connect(dsn)
    try:
        rows(admin, f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
        readonly = make_dsn(libpq_dsn(dsn), application_name="agentpost-ro")
        with PostgresMarkSpace(dsn=readonly, scopes=[CAL, NEWS], clock=T0 + 60,
                               space=name) as space:
            assert len(space.read("cal", topic="t")) == 2
            assert space.read("news", reader=READER) == []
            assert space.strength_of(space.get(ids[2])) > 0
            assert len(space.active_marks()) == 4 and len(space.all_marks()) == 5
            assert len(space.aggregate_needs()) == 1 and len(space) == 5
            assert len(space.get_watched_marks(READER, clear=False)) == 5
            with space.lock("cal", "r1"):
                assert len(space.read("cal", resource="r1")) == 1
            with pytest.raises(StoreError):
                space.write(WRITER, Intent(scope="cal", resource="r2", action="x"))
    finally:
        rows(admin, f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        admin.close()
    assert query(dsn, "SELECT xmin::text, * FROM agentpost.marks ORDER BY seq") == before


def test_a_rejected_write_sends_nothing(space: PostgresMarkSpace, dsn: str) -> None:
    """Bad input is refused in Python before any statement: not even the identity sequence
    moves, also when one bad mark spoils a batch (all or nothing)."""
    space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
    seq = "SELECT last_value FROM agentpost.marks_seq"
    before = query(dsn, seq)
    with pytest.raises(UnauthorizedWrite):
        space.write(READER, Action(scope="cal", resource="r", action="x"))
    with pytest.raises(UnknownScope):
        space.write_many(WRITER, [Intent(scope="cal", resource="s", action="x"),
                                  Intent(scope="elsewhere", resource="s", action="x")])
    assert query(dsn, seq) == before and len(space) == 1


def test_concurrent_polls_hand_out_each_mark_once(dsn: str) -> None:
    """P51 across pollers: threads on separate objects poll one agent's queue while marks
    are written; together they get every mark exactly once, each poll in write order."""
    name = space_name()
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=name) as writer:
        writer.subscribe(READER, [WatchPattern(scope="cal")])
        pollers = [PostgresMarkSpace(dsn=dsn, scopes=[CAL], space=name) for _ in range(3)]
        done = threading.Event()
        got: list[list[Any]] = [[] for _ in pollers]

        def poll(i: int) -> None:
            while True:
                finished = done.is_set()
                batch = pollers[i].get_watched_marks(READER)
                got[i].append(batch)
                if finished and not batch:
                    return

        threads = [threading.Thread(target=poll, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        written = [writer.write(WRITER, Observation(scope="cal", topic=f"t{i}"))
                   for i in range(150)]
        done.set()
        for t in threads:
            t.join(60)
        for p in pollers:
            p.close()
    delivered = [m.id for polls in got for batch in polls for m in batch]
    assert sorted(delivered) == sorted(written)
    order = {mark_id: i for i, mark_id in enumerate(written)}
    for polls in got:
        for batch in polls:
            assert [order[m.id] for m in batch] == sorted(order[m.id] for m in batch)


def test_without_the_schema_the_error_says_so(empty_dsn: str) -> None:
    """Database errors never leak: an unmigrated database is a ConfigurationError."""
    with PostgresMarkSpace(dsn=empty_dsn, scopes=[CAL], space=space_name()) as space:
        with pytest.raises(ConfigurationError, match="migrate"):
            space.read("cal", resource="r")
        with pytest.raises(ConfigurationError):
            space.write(WRITER, Intent(scope="cal", resource="r", action="x"))


def test_marks_queued_under_old_patterns_are_not_delivered(space: PostgresMarkSpace,
                                                           dsn: str) -> None:
    """P50 under a race: a write that read the subscription just before a re-subscribe can
    queue a mark for the old patterns after the re-subscribe dropped the queue (simulated
    here by queueing it by hand). A poll delivers only what matches the current patterns,
    and drops the rest."""
    space.subscribe(READER, [WatchPattern(scope="cal", topic="old")])
    space.subscribe(READER, [WatchPattern(scope="cal", topic="new")])
    old = space.write(WRITER, Observation(scope="cal", topic="old"))
    new = space.write(WRITER, Observation(scope="cal", topic="new"))
    query(dsn, "INSERT INTO agentpost.mark_watch (space, agent_id, seq, mark_id, projected)"
               " SELECT space, %s, seq, id, false FROM agentpost.marks WHERE id = %s",
          (str(READER.id), str(old)))
    assert [m.id for m in space.get_watched_marks(READER, clear=False)] == [new]
    assert [m.id for m in space.get_watched_marks(READER)] == [new]
    assert query(dsn, "SELECT count(*) FROM agentpost.mark_watch") == [(0,)]


def test_count_marks_counts_every_stored_mark(space: PostgresMarkSpace) -> None:
    """The guard's total_marks gauge: (scope, mark type) -> stored marks, any strength."""
    some_marks(space)
    space.write(WRITER, Observation(scope="news", topic="t"))
    assert space.count_marks() == {("cal", "intent"): 1, ("cal", "action"): 1,
                                   ("cal", "observation"): 1, ("cal", "warning"): 1,
                                   ("cal", "need"): 1, ("news", "observation"): 1}


# --------------------------------------------------------------------------- agent names


def _names(dsn: str, space: str) -> list[tuple[Any, ...]]:
    """(agent id, name, the row's xmin) of every name recorded in `space`."""
    return query(dsn, "SELECT agent_id::text, name, xmin::text FROM agentpost.mark_agents"
                      " WHERE space = %s ORDER BY agent_id", (space,))


def test_a_write_records_its_agent_s_name_once_and_a_rename_replaces_it(
        space: PostgresMarkSpace, dsn: str) -> None:
    """sql/0076: a write records (space, agent id, name) in its own statement, whatever the
    agent's id (here a random one) and name (here not a workspace id); writing again under
    the same name writes nothing (the row is untouched), a batch records its agent once,
    and writing under a new name replaces the old one (the pages show the newest)."""
    poller = Agent(name="weather-poller", scopes={"cal": ALL_TYPES})
    space.write(poller, Observation(scope="cal", topic="forecast"))
    [(ident, name, xmin)] = _names(dsn, space.space)
    assert (ident, name) == (str(poller.id), "weather-poller")
    space.write_many(poller, [Observation(scope="cal", topic="forecast"),
                              Intent(scope="cal", resource="r", action="x")])
    assert _names(dsn, space.space) == [(ident, name, xmin)], "an unchanged name is rewritten"
    # what a process that has not recorded it yet sends: a probe, nothing written
    assert query(dsn, "SELECT * FROM agentpost.mark_name_agents(%s, %s::uuid[], %s, false)",
                 (space.space, [ident], ["weather-poller"])) == [(0, 0)]
    assert _names(dsn, space.space) == [(ident, name, xmin)]
    renamed = Agent(id=poller.id, name="rain-poller", scopes={"cal": ALL_TYPES})
    space.write(renamed, Observation(scope="cal", topic="forecast"))
    assert space.agent_names() == {poller.id: "rain-poller"}
    assert space.agent_names([poller.id, WRITER.id]) == {poller.id: "rain-poller"}
    with PostgresMarkSpace(dsn=dsn, scopes=[CAL], clock=T0, space=space_name()) as other:
        assert other.agent_names() == {}, "names are per space"


def test_names_are_recorded_with_the_marks_or_not_at_all(space: PostgresMarkSpace,
                                                        dsn: str) -> None:
    """A write rolled back with its lock() block records no name; an empty name is not
    recorded, a long one is cut to 200 characters; record_names (a fleet apply) records
    agents that never wrote, refuses anything but Agents, and says how many were new."""
    ghost = Agent(name="ghost", scopes={"cal": ALL_TYPES})
    with pytest.raises(RuntimeError), space.lock("cal", "r"):
        space.write(ghost, Intent(scope="cal", resource="r", action="x"))
        raise RuntimeError("the tool failed")
    assert space.agent_names() == {}
    space.write(ghost, Observation(scope="cal", topic="t"))
    assert space.agent_names() == {ghost.id: "ghost"}, "a rolled-back name is not remembered"
    nameless = Agent(name="", scopes={"cal": ALL_TYPES})
    long = Agent(name="n" * 300, scopes={"cal": ALL_TYPES})
    space.write(nameless, Observation(scope="cal", topic="t"))
    space.write(long, Observation(scope="cal", topic="t"))
    assert space.agent_names() == {ghost.id: "ghost", long.id: "n" * 199 + "…"}
    porter = Agent(name="porter", scopes={"cal": ALL_TYPES})
    with pytest.raises(InvalidArgument):
        space.record_names([porter, "driver-a"])  # type: ignore[list-item]
    assert porter.id not in space.agent_names()
    assert space.record_names([porter, WRITER]) == 2
    assert space.record_names([porter, WRITER]) == 0
    assert space.agent_names([porter.id, WRITER.id]) == {porter.id: "porter",
                                                         WRITER.id: "writer"}


def test_a_write_never_waits_for_a_name_another_transaction_is_recording(
        space: PostgresMarkSpace) -> None:
    """A lock() transaction records a new agent's name and stays open: another thread's
    write of that agent neither waits for it nor records the name; when the transaction
    rolls back, the agent's next write records it."""
    racer = Agent(name="racer", scopes={"cal": ALL_TYPES})
    wrote = threading.Event()

    def elsewhere() -> None:
        space.write(racer, Observation(scope="cal", topic="t"))
        wrote.set()

    with pytest.raises(RuntimeError), space.lock("cal", "r"):
        space.write(racer, Intent(scope="cal", resource="r", action="x"))
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join(20)
        assert wrote.is_set(), "a write waited for another transaction's name row"
        raise RuntimeError("the tool failed")
    assert space.agent_names() == {} and len(space) == 1
    space.write(racer, Observation(scope="cal", topic="t"))
    assert space.agent_names() == {racer.id: "racer"}


# --------------------------------------------------------------------------- lazy lock (issue 25)


def test_a_lazy_lock_is_taken_with_the_block_s_first_statement(space: PostgresMarkSpace
                                                                ) -> None:
    """lock(lazy=True) sends BEGIN and the lock with the block's first statement: before it,
    another thread takes the key; from it to the end of the block, another thread waits."""
    key = ("cal", "r'%(key)s %s \\ ")  # quotes, percent signs and a backslash in the key
    with space.lock(*key, lazy=True):
        before_free = threading.Event()

        def take_and_leave() -> None:
            with space.lock(*key):
                before_free.set()

        first = threading.Thread(target=take_and_leave)
        first.start()
        assert before_free.wait(10), "a lazy lock was held before any statement"
        first.join()
        written = space.write(WRITER, Intent(scope="cal", resource=key[1], action="x"))
        waited = threading.Event()

        def wait_for_it() -> None:
            with space.lock(*key):
                waited.set()

        second = threading.Thread(target=wait_for_it)
        second.start()
        assert not waited.wait(0.5), "the lock was not held after the first statement"
    assert waited.wait(10)
    second.join()
    assert space.get(written) is not None


def test_a_lazy_block_that_sends_nothing_begins_nothing(space: PostgresMarkSpace) -> None:
    """No statement, no transaction: the block ends without COMMIT or error, raising in it
    rolls back nothing, and the pooled connection works afterwards."""
    with space.lock("cal", "r", lazy=True):
        pass
    with pytest.raises(RuntimeError), space.lock("cal", "r", lazy=True):
        raise RuntimeError("before any statement")
    with space.lock("cal", "r", lazy=True):
        space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
    assert len(space) == 1


def test_a_lazy_block_whose_first_statement_fails_rolls_back(space: PostgresMarkSpace) -> None:
    """The first statement carries BEGIN: when it fails, lock() rolls the transaction back
    and says so; the space works afterwards."""
    with pytest.raises(StoreError), space.lock("cal", "r", lazy=True), pytest.raises(StoreError):
        space._rows("get", {"id": "not a uuid"})
    with space.lock("cal", "r", lazy=True):
        space.write(WRITER, Intent(scope="cal", resource="r", action="x"))
    assert len(space) == 1
