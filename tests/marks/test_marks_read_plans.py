"""The mark space's reads on Postgres stay index reads as history grows: what the in-memory
space promises ("a read touches its own bucket ... never the whole space", docs/marks.md)
and `marks/space/postgres.py` says of Postgres ("reads skip faded marks in the index instead of
computing their strength").

One space holds a few hundred thousand marks of history: twenty top scopes, each with
nested scopes ("desk/east", "desk/east/n1", ...), hundreds of resources and topics, every
mark type, almost all of it faded long ago (observations and warnings decayed, intents past
their TTL, resolved needs' copies at 0), some of it superseded. The history is copied with
INSERT ... SELECT generate_series from template marks written through the store, so every
row is a mark the store reads back (checked). A handful of live marks sit in "desk" and
"desk/east". Then `read` (hierarchical), `read_exact` and the guard's `read_with_claims`
run through a real `PostgresMarkSpace` on a session where auto_explain logs the plan of
every statement, nested ones included (generic plans, real parameters, with the rows each
node gave), under statistics taken while the space was small (stale), none, and fresh.

The property held each time, for every statement reading agentpost.marks: no sequential
scan; each branch of `mark_read_at` (Markspace §8.2 on sql/0068) walks the index of its access
path (marks_resource / marks_topic / marks_scope for the exact scope, marks_tree_* for the
nested ones); above min_strength 0 the walk is bounded by fades_at in its Index Cond, so the
faded history is not even fetched; and the supersession probe of a strength-0 row (§10) runs
only in reads at min_strength <= 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from agentpost.marks.core import (
    Action,
    Agent,
    DecayConfig,
    Intent,
    MarkType,
    Need,
    Observation,
    Scope,
    Warning,
)
from agentpost.marks.guard import ACTIVE, Guard, GuardVerdict
from agentpost.marks.postgres import PostgresMarkSpace
from dbtools import Plans, connect, plan_nodes, rows
from marks_backends import T0, unique_space_name

HISTORY = 300_000
DAY = 86_400.0
DECAY = DecayConfig(observation_half_life=60.0, warning_half_life=60.0, intent_ttl=100.0)
TOPS = ["desk", *(f"s{i:02d}" for i in range(19))]
SCOPES = [top + sub for top in TOPS for sub in ("", "/east", "/west", "/east/n1")]
ALL = [t.value for t in MarkType]
WRITER = Agent(name="writer", scopes={s: ALL for s in [*SCOPES, "tmpl"]})
NOW = T0 + 10.0  # the reads' clock: the live marks are 10 s old, the history days

#: the index of each branch's main walk: (nested part?, filter) -> index
MAIN = {
    (False, "resource"): "marks_resource", (False, "topic"): "marks_topic",
    (False, "mark_type"): "marks_scope", (False, None): "marks_scope",
    (True, "resource"): "marks_tree_resource", (True, "topic"): "marks_tree_topic",
    (True, "mark_type"): "marks_tree", (True, None): "marks_tree",
}
#: the probes every mark's strength makes (supersession, warnings against it)
PROBES = {"marks_supersedes", "marks_invalidates"}

# Copies of the template marks (the marks of scope "tmpl"): type by g (4 observations, 2
# warnings, 2 intents, 1 action, 1 need in 10; of the needs, 9 in 10 resolved copies), in
# blocks of 10 (one of each kind) over every scope in turn, a scope's blocks over 200
# resources and 200 topics, created between 30 and 1 days before T0.
_HISTORY_SQL = """
INSERT INTO agentpost.marks (id, space, seq, mark_type, agent_id, scope, created_at,
    initial_strength, supersedes, resource, action, topic, confidence, source, invalidates,
    severity, priority, blocking, resolved_by, failed, half_life, ttl, fades_at, body)
SELECT agentpost.mark_id(k.seq), t.space, k.seq, t.mark_type, t.agent_id, k.scope, k.c,
       t.initial_strength, t.supersedes, CASE WHEN t.resource IS NOT NULL THEN k.resource END,
       t.action, CASE WHEN t.topic IS NOT NULL THEN k.topic END, t.confidence, t.source,
       t.invalidates, t.severity, t.priority, t.blocking, t.resolved_by, t.failed,
       t.half_life, t.ttl,
       CASE WHEN t.fades_at IN ('Infinity', '-Infinity') THEN t.fades_at
            ELSE agentpost._mark_fades_at(k.c, t.fades_at - t.created_at) END,
       t.body
  FROM generate_series(1, %(n)s) g
 CROSS JOIN LATERAL (SELECT CASE WHEN g %% 10 < 4 THEN 'observation'
                                 WHEN g %% 10 < 6 THEN 'warning'
                                 WHEN g %% 10 < 8 THEN 'intent'
                                 WHEN g %% 10 = 8 THEN 'action'
                                 WHEN g %% 100 = 99 THEN 'need'
                                 ELSE 'resolved' END AS kind) w
  JOIN (SELECT m.*, CASE WHEN m.resolved_by IS NOT NULL THEN 'resolved' ELSE m.mark_type END
                    AS kind
          FROM agentpost.marks m
         WHERE m.space = %(space)s AND m.scope = 'tmpl'
           AND NOT EXISTS (SELECT 1 FROM agentpost.marks x
                            WHERE x.space = m.space AND x.supersedes = m.id)) t
    ON t.kind = w.kind
 CROSS JOIN LATERAL (
       SELECT (%(scopes)s::text[])[1 + (g / 10) %% cardinality(%(scopes)s::text[])] AS scope,
              'r' || (g / 800) %% 200 AS resource, 't' || (g / 800) %% 200 AS topic,
              %(t0)s::float8 - 30 * %(day)s + g * (29 * %(day)s / %(n)s) AS c,
              nextval('agentpost.marks_seq') AS seq) k
"""

# One in 23 history observations and intents superseded by a copy a second younger.
_SUPERSEDE_SQL = """
INSERT INTO agentpost.marks (id, space, seq, mark_type, agent_id, scope, created_at,
    initial_strength, supersedes, resource, action, topic, confidence, source, invalidates,
    severity, priority, blocking, resolved_by, failed, half_life, ttl, fades_at, body)
SELECT agentpost.mark_id(k.seq), m.space, k.seq, m.mark_type, m.agent_id, m.scope,
       m.created_at + 1, m.initial_strength, m.id, m.resource, m.action, m.topic,
       m.confidence, m.source, m.invalidates, m.severity, m.priority, m.blocking,
       m.resolved_by, m.failed, m.half_life, m.ttl, m.fades_at + 1, m.body
  FROM agentpost.marks m
 CROSS JOIN LATERAL (SELECT nextval('agentpost.marks_seq') AS seq) k
 WHERE m.space = %(space)s AND m.scope <> 'tmpl' AND m.seq %% 23 = 0
   AND m.mark_type IN ('observation', 'intent') AND m.created_at < %(t0)s - %(day)s
"""


class Clock:
    """The space's clock, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _write_templates(space: PostgresMarkSpace, clock: Clock) -> None:
    """One mark of each kind in scope "tmpl", 40 days before T0: the rows history copies."""
    clock.now = T0 - 40 * DAY
    w = WRITER
    obs = space.write(w, Observation(scope="tmpl", topic="t", content={"seen": 1},
                                     confidence=0.8))
    space.write(w, Warning(scope="tmpl", topic="t", invalidates=obs, reason="stale"))
    space.write(w, Intent(scope="tmpl", resource="r", action="book", confidence=0.7))
    done = space.write(w, Action(scope="tmpl", resource="r", action="book", result={"ok": 1}))
    space.write(w, Need(scope="tmpl", question="who?", context={"k": 1}))
    space.resolve(space.write(w, Need(scope="tmpl", question="which?")), done)


def _write_live(space: PostgresMarkSpace, clock: Clock) -> dict[str, UUID]:
    """The live marks of "desk" and "desk/east" at T0 (and what hides or zeroes some)."""
    clock.now = T0
    w = WRITER
    live = {
        "intent": space.write(w, Intent(scope="desk", resource="r7", action="book")),
        "action": space.write(w, Action(scope="desk/east", resource="r7", action="book")),
        "obs": space.write(w, Observation(scope="desk", topic="t7", confidence=0.9)),
        "obs_east": space.write(w, Observation(scope="desk/east", topic="t7")),
        "old": space.write(w, Observation(scope="desk", topic="t7")),
        "zero": space.write(w, Observation(scope="desk/east", topic="t7",
                                           initial_strength=0.0)),
        "need": space.write(w, Need(scope="desk", question="open?")),
        "asked": space.write(w, Need(scope="desk", question="answered?")),
    }
    live["new"] = space.write(w, Observation(scope="desk", topic="t7", supersedes=live["old"]))
    live["warning"] = space.write(w, Warning(scope="desk", topic="t7", initial_strength=0.3,
                                             invalidates=live["obs_east"], reason="doubt"))
    live["copy"] = space.resolve(live["asked"], live["action"])
    return live


@pytest.fixture(scope="module")
def big(module_dsn: str) -> Iterator[dict[str, Any]]:
    """A space analysed while small, then grown by HISTORY marks (no ANALYZE since)."""
    clock = Clock(T0)
    scopes = [Scope(name=s, decay=DECAY) for s in [*SCOPES, "tmpl"]]
    name = unique_space_name()
    conn = connect(module_dsn)
    try:
        with PostgresMarkSpace(dsn=module_dsn, scopes=scopes, clock=clock, space=name) as space:
            _write_templates(space, clock)
            rows(conn, "ANALYZE agentpost.marks")
            params = {"space": name, "n": HISTORY, "scopes": SCOPES, "t0": T0, "day": DAY}
            rows(conn, _HISTORY_SQL, params)
            rows(conn, _SUPERSEDE_SQL, params)
            live = _write_live(space, clock)
        clock.now = NOW
        yield {"dsn": module_dsn, "scopes": scopes, "clock": clock, "conn": conn,
               "live": live, "name": name}
    finally:
        conn.close()


def _space(big: dict[str, Any]) -> PostgresMarkSpace:
    """The big space on a pool (and so a session) of its own: no plan cached before."""
    return PostgresMarkSpace(dsn=big["dsn"], scopes=big["scopes"], clock=big["clock"],
                             space=big["name"], pool_size=1)


def _under_subplan(plan: dict[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """Each node, and whether it sits in a subplan (a probe made per row of its parent)."""
    def walk(node: dict[str, Any], inside: bool) -> Iterator[tuple[dict[str, Any], bool]]:
        yield node, inside
        for child in node.get("Plans", ()):
            sub = child.get("Parent Relationship") in ("SubPlan", "InitPlan")
            yield from walk(child, inside or sub)
    return walk(plan, False)


def _branches(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plans of mark_read_at's branch queries, in the order they ran."""
    return [p for p in plans if "agentpost.mark_reads(" in p["Query Text"]]


def _main_scans(branch: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n, inside in _under_subplan(branch["Plan"])
            if not inside and n.get("Index Name")]


def _zero_probes(branch: dict[str, Any]) -> list[dict[str, Any]]:
    """mark_reads' supersession probe of strength-0 rows: the subplan on marks_supersedes
    that the main scan's Filter tests for IS NULL (marks_at's own probe sits in the
    strength's CASE, not in a Filter)."""
    found = []
    for node, inside in _under_subplan(branch["Plan"]):
        test = node.get("Filter", "") + node.get("Join Filter", "")
        for child in [] if inside else node.get("Plans", ()):
            name = child.get("Subplan Name", "")
            if name and f"({name}) IS NULL" in test:
                found.append(child)
    return found


def _marks_scans(plans: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(statement, node, in a subplan?) for every scan of agentpost.marks or its indexes."""
    for entry in plans:
        query = " ".join(entry["Query Text"].split())
        for node, inside in _under_subplan(entry["Plan"]):
            if node.get("Relation Name") == "marks" or node.get("Index Name", "").startswith(
                    "marks"):
                yield query, node, inside


def _check_reads(plans: list[dict[str, Any]], what: str, walks: set[str]) -> None:
    """No sequential scan of marks, nor any other walk of it: outside subplans only the
    walks of `walks` (and the nested-scope probe's marks_tree), inside them only probes of
    one mark's id (marks_supersedes, marks_invalidates), never a walk of the space."""
    scans = list(_marks_scans(plans))
    assert scans, f"{what}: no read of marks was explained"
    bad = []
    for query, node, inside in scans:
        if node["Node Type"] == "Bitmap Heap Scan":
            continue  # its Bitmap Index Scans below are judged
        index, cond = node.get("Index Name", ""), node.get("Index Cond", "")
        by_id = index in PROBES and re.search(r"\((supersedes|invalidates) = ", cond)
        nested_probe = query.startswith("p_nested AND EXISTS") and index == "marks_tree"
        if not (by_id or nested_probe or (index in walks and not inside)):
            bad.append((query[:100], node["Node Type"], index, cond, node.get("Filter", "")))
    assert not bad, f"{what} reads marks outside its indexes: {bad}"


def _check_branch(branch: dict[str, Any], index: str, threshold: float, what: str) -> None:
    """The branch walks `index`; above 0 bounded by fades_at, with no probe of strength-0
    rows; at 0 the probe is made for the rows at 0 (of which the history has plenty)."""
    scans = _main_scans(branch)
    assert [n["Index Name"] for n in scans] == [index], f"{what}: {scans}"
    cond = scans[0].get("Index Cond", "")
    probes = _zero_probes(branch)
    ran = sum(n.get("Actual Loops", 0) for probe in probes for n in plan_nodes(probe)
              if n.get("Index Name") == "marks_supersedes")
    if threshold > 0:
        assert "fades_at" in cond, f"{what}: the walk of {index} is not bounded: {cond}"
        assert ran == 0, f"{what}: strength-0 rows probed for supersession above 0"
    else:
        assert ran > 0, f"{what}: strength-0 rows not probed for supersession at 0"


def _nested_probes(plans: list[dict[str, Any]]) -> int:
    """How often mark_read_at's probe for nested marks (one marks_tree lookup) ran."""
    return sum(n.get("Actual Loops", 0) for query, n, _ in _marks_scans(plans)
               if query.startswith("p_nested AND EXISTS"))


def _check_fetched(branches: list[dict[str, Any]], returned: int, live: int, threshold: float,
                   what: str) -> None:
    """Above 0 the walks fetch what the read returns, give or take the live marks it drops
    (superseded, at 0): not one faded mark of the history."""
    fetched = sum(n["Actual Rows"] * n["Actual Loops"] for b in branches for n in _main_scans(b))
    if threshold > 0:
        assert fetched <= returned + live, f"{what}: fetched {fetched} to return {returned}"


def _read_call(space: PostgresMarkSpace, nested: bool, kind: str | None, threshold: float
               ) -> Any:
    read = space.read if nested else space.read_exact
    args: dict[str, Any] = {"min_strength": threshold}
    if kind == "resource":
        args["resource"] = "r7"
    elif kind == "topic":
        args["topic"] = "t7"
    elif kind == "mark_type":
        args["mark_type"] = MarkType.OBSERVATION
    return lambda: read("desk", **args)


def _expect(result: list[Any], live: dict[str, UUID], nested: bool, kind: str | None,
            threshold: float, what: str) -> None:
    """The reads return what they should on this store: the live marks of their filter,
    at 0 also the strength-0 ones, never a superseded one, and from the history only what
    never fades (actions, unresolved needs) above 0."""
    ids = {m.id for m in result}
    assert not ids & {live["old"], live["asked"]}, f"{what}: a superseded mark was read"
    want = {"resource": {"intent", "action"}, "topic": {"obs", "obs_east", "new", "zero"},
            "mark_type": {"obs", "obs_east", "new", "zero"},
            None: {"intent", "action", "obs", "obs_east", "new", "zero", "need", "warning",
                   "copy"}}[kind]
    if not nested:
        want = {k for k in want if k not in {"action", "obs_east", "zero"}}
    if threshold > 0:
        want -= {"zero", "copy"}
    assert {live[k] for k in want} <= ids, f"{what}: {want}"
    if threshold > 0:
        stale = [m for m in result if m.id not in live.values()
                 and m.mark_type not in (MarkType.ACTION, MarkType.NEED)]
        assert not stale, f"{what}: faded history returned: {stale[:3]}"
    else:
        assert len(ids) > len(want), f"{what}: no strength-0 history returned at 0"
    for m in result:
        assert m.scope == "desk" or (nested and m.scope.startswith("desk/")), what


def _exercise(big: dict[str, Any], label: str) -> None:
    """Every read path of the space, each at the default threshold and at 0, on a session
    that logs their plans. read_exact and the guard never probe for nested marks."""
    with _space(big) as space:
        _exercise_on(space, big["live"], label)


def _exercise_on(space: PostgresMarkSpace, live: dict[str, UUID], label: str) -> None:
    plans = Plans(space._cursor, analyze=True)
    for nested in (False, True):
        for kind in ("resource", "topic", "mark_type", None):
            for threshold in (0.01, 0.0):
                what = f"{label}: {'read' if nested else 'read_exact'}({kind}, {threshold})"
                result, p = plans.of(_read_call(space, nested, kind, threshold))
                _expect(result, live, nested, kind, threshold, what)
                walks = {MAIN[(False, kind)]} | ({MAIN[(True, kind)]} if nested else set())
                _check_reads(p, what, walks)
                branches = _branches(p)
                assert len(branches) == (2 if nested else 1), what
                assert _nested_probes(p) == (1 if nested else 0), what
                for part, branch in zip((False, True), branches, strict=False):
                    _check_branch(branch, MAIN[(part, kind)], threshold, what)
                _check_fetched(branches, len(result), len(live), threshold, what)
    for threshold in (ACTIVE, 0.0):
        what = f"{label}: read_with_claims({threshold})"
        (read, claims), p = plans.of(lambda t=threshold: space.read_with_claims("desk", "r7", t))
        assert live["intent"] in {m.id for m in read}, what
        assert all(m.scope == "desk" for m in read + claims), what
        _check_reads(p, what, {"marks_resource"})
        branches = _branches(p)
        assert len(branches) == 1 and _nested_probes(p) == 0, what
        _check_branch(branches[0], "marks_resource", threshold, what)
        _check_fetched(branches, len(read), len(live), threshold, what)


@pytest.mark.slow  # the module's space takes about half a minute to build
def test_history_rows_are_marks_the_store_reads(big: dict[str, Any]):
    """The copied history is valid: the store reads its marks back, each kind as itself,
    at the strength its age gives (faded marks at 0, actions and open needs in full)."""
    conn = big["conn"]
    with _space(big) as space:
        _check_history(space, conn, big["name"])


def _check_history(space: PostgresMarkSpace, conn: Any, name: str) -> None:
    sample = rows(conn, "SELECT DISTINCT ON (mark_type, resolved_by IS NULL) id, mark_type"
                        " FROM agentpost.marks WHERE space = %s AND scope <> 'tmpl'"
                        " AND created_at < %s",
                  (name, T0 - DAY))
    assert len(sample) == 6
    for mark_id, kind in sample:
        mark = space.get(UUID(str(mark_id)))
        assert mark is not None and mark.mark_type.value == kind
        strength = space.strength_of(mark)
        assert strength == (1.0 if kind in ("action", "need") and
                            getattr(mark, "resolved_by", None) is None else 0.0), mark
    assert len(space) > HISTORY


@pytest.mark.slow
def test_p14_a_boundary_fetches_its_intents_by_id_as_history_grows(big: dict[str, Any]):
    """Markspace §6.2.1 / P14 on Postgres: `resolve_deferred` on the big space (statistics
    taken while it was small: this test runs before the reads test analyses it) touches
    marks only by the board's index walk (marks_resource), the per-mark probes, the
    nested-scope probe and primary-key fetches of its own intents: no sequential scan, no
    hash or merge join over marks."""
    with _space(big) as space:
        _check_boundary(space, "s01")


def test_p14_a_boundary_on_a_small_store_plans_no_join_over_marks(dsn: str):
    """The boundary's record on a store of a few hundred marks, analysed: where a join over
    marks is cheapest, so a plan made then (a session caches its plans) would scan every mark
    once the store had grown. (The board's reads may walk a small space's index whole: they
    are planned again when the store's statistics change.) Before sql/0070 the INSERT of
    the verdicts joined marks: a fresh store planned it as a hash join over a sequential
    scan, which bench marks measured at 170 ms per boundary at 1,000,000 marks."""
    scopes = [Scope(name="s01", decay=DECAY)]
    name = unique_space_name()
    clock = Clock(T0)
    with PostgresMarkSpace(dsn=dsn, scopes=scopes, clock=clock, space=name,
                           pool_size=1) as space:
        w = Agent(name="filler", scopes={"s01": ALL})
        space.write_many(w, [Observation(scope="s01", topic=f"t{i}", content=i)
                             for i in range(300)])
        conn = connect(dsn)
        try:
            rows(conn, "ANALYZE agentpost.marks")
        finally:
            conn.close()
        _check_boundary(space, "s01", reads=False)


def _check_boundary(space: PostgresMarkSpace, scope: str, *, reads: bool = True) -> None:
    """A boundary on (scope, "contested") with four intents: the statements recording its
    verdicts (mark_record_boundary) read marks by primary key only, with no join over
    marks; with `reads`, the board's reads are index reads too."""
    bidders = [Agent(name=f"bidder-{i}", scopes={scope: ALL}) for i in range(4)]
    for i, agent in enumerate(bidders):
        space.write(agent, Intent(scope=scope, resource="contested", action="book",
                                  confidence=(i + 1) / 10))
    plans = Plans(space._cursor, analyze=True)
    decisions, p = plans.of(lambda: Guard(space).resolve_deferred(scope, "contested"))
    verdicts = [d.verdict for d in decisions.values()]
    assert verdicts.count(GuardVerdict.ALLOW) == 1, verdicts
    assert verdicts.count(GuardVerdict.BLOCKED) == 3, verdicts
    record = [e for e in p if "json_to_recordset" in e["Query Text"]]
    assert record, "the boundary's record was not explained"
    by_key = [(n["Node Type"], n.get("Index Name", "")) for _, n, _ in _marks_scans(record)
              if n.get("Index Name") != "marks_pkey"]
    assert not by_key, f"the boundary's record reads marks other than by id: {by_key}"
    joins = [n["Node Type"] for entry in record for n in plan_nodes(entry["Plan"])
             if n["Node Type"] in ("Hash Join", "Merge Join")
             and any(c.get("Relation Name") == "marks" for c in plan_nodes(n))]
    assert not joins, f"the boundary joins marks wholesale: {joins}"
    if reads:
        bad = [(q[:100], n["Node Type"], n.get("Index Name", ""), n.get("Index Cond", ""))
               for q, n, _ in _marks_scans(p)
               if n["Node Type"] != "Bitmap Heap Scan"
               and n.get("Index Name") not in {"marks_pkey", "marks_resource", *PROBES}
               and not (q.startswith("p_nested AND EXISTS")
                        and n.get("Index Name") == "marks_tree")]
        assert not bad, f"the boundary reads marks outside its indexes: {bad}"


@pytest.mark.slow
def test_mark_reads_stay_index_reads_as_history_grows(big: dict[str, Any]):
    """Markspace §8.2 on Postgres, property "reads stay index reads as history grows": on a
    space with HISTORY marks of faded, superseded and live history over nested scopes,
    read (hierarchical), read_exact and the guard's read_with_claims, at their default
    threshold and at 0, read marks only through the index of their access path and the
    per-mark probes (supersession, warnings), never a sequential scan, under stale,
    missing and fresh statistics; above 0 the walk is bounded by fades_at and no strength-0
    row is probed for supersession; at 0 that probe runs. They return the live marks,
    never a superseded one, and the faded history only at 0."""
    conn = big["conn"]
    _exercise(big, "stale statistics (analysed while small)")
    rows(conn, "DELETE FROM pg_statistic WHERE starelid = 'agentpost.marks'::regclass")
    rows(conn, "UPDATE pg_class SET reltuples = -1 WHERE oid = 'agentpost.marks'::regclass")
    _exercise(big, "no statistics")
    rows(conn, "ANALYZE agentpost.marks")
    _exercise(big, "fresh statistics")
