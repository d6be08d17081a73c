"""The Spark analytics job (docs/spark.md, "The analytics job"; the tables' contract in
docs/ui.md, "Trail analytics") on a real store and a local Spark session.

One database per module: known traffic through the store's own API (sends from two senders
to three inboxes, leases, acks, nacks up to a dead letter, a duplicate delivery, a
rejection, commands with a compensation, marks with a deferred and an immediate conflict,
needs resolved and open), the job run over the window around it, and every table checked
against an independent computation in plain SQL (or Python) over the same rows. A second
window in the past holds mark writes at chosen times for the statistical envelope
(Markspace §9.7), computed by the real spark-submit and cross-checked against the guard's
own online envelope. Three job runs in all (main window, past window, main window again).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg2
import pytest

from agentpost.marks import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Guard,
    Need,
    Observation,
    Scope,
    hours,
)
from agentpost.marks.envelope import EnvelopeVerdict, StatisticalEnvelope
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.protocol.models import Status
from agentpost.spark.analytics import COLUMNS, JOB, Options, main, run_analytics
from agentpost.spark.results import Window
from agentpost.spark.settings import SparkSettings
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger

#: Spark jobs over a seeded store: minutes for the module
pytestmark = pytest.mark.slow

ALL = ["intent", "action", "observation", "warning", "need"]
ALICE = Agent(name="alice", scopes={"lot": ALL, "ops": ALL})
BOB = Agent(name="bob", scopes={"lot": ALL, "ops": ALL})
SCOPES = [Scope(name="lot", deferred=True, conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
                decay=DecayConfig(intent_ttl=hours(2))),
          Scope(name="ops", conflict_policy=ConflictPolicy.FIRST_WRITER,
                decay=DecayConfig(intent_ttl=hours(2)))]
POLICIES = {"lot": ConflictPolicy.HIGHEST_CONFIDENCE}
#: the envelope window: a past hour on 5-minute buckets aligned with the epoch, as the
#: guard's envelope aligns its windows
PAST = Window(start=datetime(2026, 1, 1, tzinfo=UTC), end=datetime(2026, 1, 1, 1, tzinfo=UTC))
BUCKET = 300.0


@dataclass
class Seeded:
    dsn: str
    window: Window
    settings: SparkSettings
    summary: dict[str, int]
    envelope_agents: dict[str, UUID]
    #: every table's rows of `window` right after the first run
    first: dict[str, set[tuple]]


def _conn(dsn: str) -> Any:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def _rows(dsn: str, sql: str, args: Any = None) -> list[tuple]:
    conn = _conn(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


def _traffic(store: EnvelopeStore) -> None:
    """Two coordinators, three workers; boss-a sends to w1, w2, w3, boss-b to w1 (a right
    boss-a granted); w1 leases, acks, nacks; one envelope is nacked into the dead letters;
    one delivered envelope is delivered again (a duplicate); one draft is rejected."""
    for boss in ("boss-a", "boss-b"):
        store.create_workspace("coordinator", workspace_id=boss)
    for w in ("w1", "w2", "w3"):
        store.create_workspace("worker", parent="boss-a", workspace_id=w)
    store.grant_right("boss-a", "boss-b", "w1")
    plan = [("boss-a", "w1", 4), ("boss-a", "w2", 3), ("boss-a", "w3", 1), ("boss-b", "w1", 2)]
    sent: dict[str, list[str]] = {}
    for sender, inbox, n in plan:
        for i in range(n):
            r = store.send(sender, inbox, "directive", f"{sender}->{inbox} {i}")
            assert r.status is Status.ACKNOWLEDGED, r
            sent.setdefault(inbox, []).append(r.envelope_id)
    leases = store.lease("w1", max=6, ttl=60)
    assert len(leases) == 6
    for lease in leases[:3]:
        store.ack(lease.token)
    store.nack(leases[3].token)  # one redelivery
    doomed = leases[4].envelope.id
    store.nack(leases[4].token)
    for _ in range(3):  # the fourth return dead-letters it
        (again,) = [x for x in store.lease("w1", max=6, ttl=60) if x.envelope.id == doomed]
        store.nack(again.token)
    assert store.get(doomed).status is Status.UNDELIVERABLE
    assert store.deliver(sent["w2"][0]) == "duplicate"
    rejected = store.send("boss-a", "w2", "no-such-type", "x")
    assert rejected.status is Status.REJECTED


def _commands(store: EnvelopeStore) -> None:
    """w1: three `book` commands (one executed, one failed then compensated, one executed
    then compensated) and one `pay` command that fails; w2: one executed `book`."""
    store.define_role("agent")
    store.register_type("book", ["worker"], ["worker"])
    store.register_type("pay", ["worker"], ["worker"])
    ledger = CommandLedger(store)
    try:
        def run(ws: str, key: str, action: str, fn: Any) -> str:
            return ledger.run(ws, key, fn, action=action, mutating=True,
                              auto_confirm="low-risk").command_id
        run("w1", "b1", "book", lambda: "ok")
        failed = run("w1", "b2", "book", lambda: 1 / 0)
        done = run("w1", "b3", "book", lambda: {"booked": 1})
        run("w1", "p1", "pay", lambda: 1 / 0)
        run("w2", "b1", "book", lambda: "ok")
        ledger.compensate(failed, "undo-b2", lambda: "refunded", auto_confirm="saga")
        ledger.compensate(done, "undo-b3", lambda: "released", auto_confirm="saga")
    finally:
        ledger.close()


def _marks(dsn: str) -> None:
    """A deferred conflict on lot/spot-1 (bob wins the boundary and acts), an immediate
    one on ops/db (alice acts, bob yields), an uncontested intent, and needs: two with one
    question (one resolved), one other (resolved), one open."""
    with PostgresMarkSpace(dsn=dsn, scopes=SCOPES, space="main") as space:
        guard = Guard(space)
        guard.pre_action(ALICE, "lot", "spot-1", "park", 0.3)
        guard.pre_action(BOB, "lot", "spot-1", "park", 0.9)
        verdicts = guard.resolve_deferred("lot", "spot-1")
        assert verdicts[BOB.id].verdict.value == "allow"
        guard.post_action(BOB, "lot", "spot-1", "parked", {})
        guard.pre_action(ALICE, "ops", "db", "migrate")
        guard.pre_action(BOB, "ops", "db", "backup")
        guard.post_action(ALICE, "ops", "db", "migrated", {})
        guard.pre_action(ALICE, "ops", "cache", "flush")
        keys = space.write(ALICE, Need(scope="ops", question="Rotate the keys?", priority=0.5))
        space.write(BOB, Need(scope="ops", question="rotate  the KEYS", priority=0.7))
        budget = space.write(ALICE, Need(scope="ops", question="Approve the budget?",
                                         priority=0.4))
        space.write(BOB, Need(scope="lot", question="Open the gate?", priority=0.9))
        for need in (keys, budget):
            answer = space.write(ALICE, Action(scope="ops", action="answer"))
            space.resolve(need, answer)


def _envelope_history(dsn: str) -> dict[str, UUID]:
    """Observations at chosen times in PAST: `steady` writes 2 per bucket in all 12 buckets,
    `bursty` 2 per bucket for 8 buckets then 30 in the ninth, `newcomer` 40 in its first and
    only bucket (cold start: never judged). Each writes its own topic (no concentration)."""
    agents = {name: Agent(name=name, scopes={"ops": ["observation"]})
              for name in ("steady", "bursty", "newcomer")}
    plan = {"steady": [2] * 12, "bursty": [2] * 8 + [30], "newcomer": [0] * 10 + [40]}
    writes = sorted((b * BUCKET + 1 + i * 0.5, name)
                    for name, counts in plan.items() for b, n in enumerate(counts)
                    for i in range(n))
    t0 = PAST.start.timestamp()
    with PostgresMarkSpace(dsn=dsn, scopes=SCOPES, space="history", clock=t0) as space:
        for offset, name in writes:
            space.set_clock(t0 + offset)
            space.write(agents[name], Observation(scope="ops", topic=name, content={}))
    return {name: a.id for name, a in agents.items()}


#: settings for tiny data (results are the same): two shuffle partitions instead of 200
#: near-empty ones, no adaptive re-planning, no whole-stage code generation (compiling each
#: plan costs more than running it on a few hundred rows)
TINY = {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false",
        "spark.sql.codegen.wholeStage": "false"}


@pytest.fixture(scope="module")
def narrow(spark: Any) -> Iterator[Any]:
    """The shared session with TINY's settings while this module runs."""
    before = {k: spark.conf.get(k) for k in TINY}
    for k, v in TINY.items():
        spark.conf.set(k, v)
    yield spark
    for k, v in before.items():
        spark.conf.set(k, v)


@pytest.fixture(scope="module")
def seeded(module_dsn: str, narrow: Any) -> Iterator[Seeded]:
    start = datetime.now(UTC) - timedelta(seconds=1)
    store = EnvelopeStore(module_dsn, ack_timeout=0.2)
    try:
        _traffic(store)
        _commands(store)
    finally:
        store.close()
    _marks(module_dsn)
    agents = _envelope_history(module_dsn)
    window = Window(start=start, end=datetime.now(UTC) + timedelta(seconds=1))
    settings = SparkSettings.from_env(dsn=module_dsn)
    summary = run_analytics(narrow, settings, window, Options(policies=POLICIES))
    seeded = Seeded(module_dsn, window, settings, summary, agents, {})
    seeded.first.update({t: _table(seeded, t) for t in COLUMNS})
    yield seeded


@dataclass
class Submitted:
    returncode: int
    out: str
    err: str


@pytest.fixture(scope="module")
def past(seeded: Seeded, narrow: Any) -> Submitted:
    """The job over PAST (the envelope's history) through the entry point spark-submit runs
    (apps/run_analytics.py calls `main`), after the main window's run, in this worker's
    session: a JVM start fewer. spark-submit itself runs this app in
    tests/spark/test_spark_airflow.py, where TrailJobOperator submits it."""
    window = ["--start", PAST.start.isoformat(), "--end", PAST.end.isoformat()]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--dsn", seeded.dsn, "--master", "local[2]", *window])
    return Submitted(code, out.getvalue(), err.getvalue())


def _table(s: Seeded, table: str, window: Window | None = None) -> set[tuple]:
    w = window or s.window
    cols = ", ".join(COLUMNS[table])
    return set(_rows(s.dsn, f"SELECT {cols} FROM agentpost.{table} "
                            "WHERE window_start = %s AND window_end = %s", (w.start, w.end)))


def _approx(rows: set[tuple], expected: set[tuple], floats: int) -> None:
    """Equal sets, the last `floats` columns to a relative 1e-9."""
    key = lambda r: r[:-floats]  # noqa: E731
    assert {key(r) for r in rows} == {key(r) for r in expected}
    want = {key(r): r[-floats:] for r in expected}
    for r in rows:
        assert r[-floats:] == pytest.approx(want[key(r)], rel=1e-9, abs=1e-9), r


# -- delivery --------------------------------------------------------------------------------

_LATENCY = """
WITH d AS (
  SELECT (dl.record::jsonb -> 'body' ->> 'from') AS sender, dl.chain AS inbox,
         ((dl.record::jsonb -> 'body' -> 'row' ->> 'delivered_at_us')::bigint
          - (c.record::jsonb -> 'body' -> 'row' -> 'fixed' ->> 'created_at_us')::bigint)
         / 1000.0 AS ms
    FROM agentpost.trail dl
    JOIN agentpost.trail c ON c.envelope_id = dl.envelope_id AND c.event = 'envelope_created'
   WHERE dl.event = 'envelope_delivered' AND dl.at >= %s AND dl.at < %s)
SELECT {keys}, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ms),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
  FROM d GROUP BY {keys}
"""


def test_inbox_latency_percentiles_match_sql(seeded: Seeded) -> None:
    """Per inbox: delivered count and exact p50/p95/p99 of created -> delivered (the signed
    rows' created_at_us and delivered_at_us), as Postgres' percentile_cont computes them."""
    expected = set(_rows(seeded.dsn, _LATENCY.format(keys="inbox"),
                         (seeded.window.start, seeded.window.end)))
    assert {(r[0], r[1]) for r in expected} == {("w1", 6), ("w2", 3), ("w3", 1)}
    _approx(_table(seeded, "analytics_inbox_latency"), expected, 3)


def test_channel_latency_per_sender_and_inbox(seeded: Seeded) -> None:
    expected = set(_rows(seeded.dsn, _LATENCY.format(keys="sender, inbox"),
                         (seeded.window.start, seeded.window.end)))
    assert {r[:3] for r in expected} == {("boss-a", "w1", 4), ("boss-a", "w2", 3),
                                         ("boss-a", "w3", 1), ("boss-b", "w1", 2)}
    _approx(_table(seeded, "analytics_channel_latency"), expected, 3)


def test_delivery_outcomes_count_redeliveries_dead_letters_and_rejections(
        seeded: Seeded) -> None:
    """WACP §7 redelivery and dead letters, §9 rejections: w1 had 5 nack returns (one
    envelope nacked once, one four times: three redeliveries and a dead letter), w2 one
    duplicate delivery and one rejection. Rates: envelopes with the outcome / envelopes of
    the inbox in play (w1: 6 sent; w2: 3 sent + 1 rejected)."""
    rows = _table(seeded, "analytics_delivery_outcomes")
    assert {r[:4] for r in rows} == {
        ("w1", "redelivered", "nacked", 4),
        ("w1", "dead_lettered", "redelivery_exhausted", 1),
        ("w2", "redelivered", "duplicate", 1),
        ("w2", "rejected", "invalid_type", 1)}
    rates = {(r[0], r[1]): r[4] for r in rows}
    assert rates == pytest.approx({("w1", "redelivered"): 2 / 6, ("w1", "dead_lettered"): 1 / 6,
                                   ("w2", "redelivered"): 1 / 4, ("w2", "rejected"): 1 / 4})
    # the same counts straight from the trail
    trail = dict(_rows(seeded.dsn, "SELECT event, count(*) FROM agentpost.trail "
                                   "WHERE at >= %s AND at < %s GROUP BY event",
                       (seeded.window.start, seeded.window.end)))
    assert trail["lease_nacked"] == 5 and trail["envelope_undeliverable"] == 1
    assert trail["envelope_redelivered"] == 1 and trail["envelope_rejected"] == 1


# -- commands, conflicts, needs ------------------------------------------------------------


def test_commands_by_outcome_and_compensation_rate(seeded: Seeded) -> None:
    """SMCL outcomes per workspace and action (current state), compensation rate =
    compensated / ended executed or failed; recovery commands are not counted as the action's
    commands. Checked against the commands table in SQL."""
    expected = set(_rows(seeded.dsn, """
        SELECT workspace, action, count(*),
               count(*) FILTER (WHERE state = 'executed'),
               count(*) FILTER (WHERE state = 'failed'),
               count(*) FILTER (WHERE state = 'rejected'),
               count(*) FILTER (WHERE state = 'canceled'),
               count(*) FILTER (WHERE state = 'compensated'),
               coalesce(count(*) FILTER (WHERE state = 'compensated')::float8
                        / nullif(count(*) FILTER (WHERE state IN ('executed', 'failed',
                                                                  'compensated')), 0), 0)
          FROM agentpost.commands
         WHERE kind IN ('primary', 'retry', 'reprocess') AND created_at >= %s AND created_at < %s
         GROUP BY 1, 2""", (seeded.window.start, seeded.window.end)))
    assert expected == {("w1", "book", 3, 1, 0, 0, 0, 2, 2 / 3),
                        ("w1", "pay", 1, 0, 1, 0, 0, 0, 0.0),
                        ("w2", "book", 1, 1, 0, 0, 0, 0, 0.0)}
    _approx(_table(seeded, "analytics_commands"), expected, 1)


def test_conflict_outcomes_per_scope_and_policy(seeded: Seeded) -> None:
    """Markspace §6: the deferred conflict on lot (policy given: highest_confidence) by its
    boundary's verdicts, the immediate one on ops (no policy given: 'unknown') by who acted;
    the uncontested intent on ops/cache is no conflict."""
    assert _table(seeded, "analytics_conflicts") == {
        ("lot", "highest_confidence", "won, acted", 1),
        ("lot", "highest_confidence", "lost", 1),
        ("ops", "unknown", "acted", 1),
        ("ops", "unknown", "yielded", 1)}


def test_need_clusters_and_time_to_resolution(seeded: Seeded) -> None:
    """Markspace §8.4 clusters (scope, question key): opened, resolved, still open, and the
    time to resolution against the marks table (resolved copy created_at - need's)."""
    rows = {r[:6]: r[6:] for r in _table(seeded, "analytics_needs")}
    assert set(rows) == {("main", "ops", "rotate the keys", 2, 1, 1),
                         ("main", "ops", "approve the budget", 1, 1, 0),
                         ("main", "lot", "open the gate", 1, 0, 1)}
    ttr = dict(_rows(seeded.dsn, """
        SELECT lower(o.body ->> 'question'), c.created_at - o.created_at
          FROM agentpost.marks c JOIN agentpost.marks o ON o.id = c.supersedes
         WHERE c.mark_type = 'need' AND c.resolved_by IS NOT NULL AND c.space = 'main'"""))
    assert rows[("main", "ops", "approve the budget", 1, 1, 0)] == pytest.approx(
        (ttr["approve the budget?"],) * 2)
    assert rows[("main", "ops", "rotate the keys", 2, 1, 1)] == pytest.approx(
        (ttr["rotate the keys?"],) * 2)
    assert rows[("main", "lot", "open the gate", 1, 0, 1)] == (None, None)


# -- agents ------------------------------------------------------------------------------------


def test_agent_activity_counts(seeded: Seeded) -> None:
    """sent (created or rejected), received (delivered), acked (consumed), nacked, commands
    (submitted, every kind) per workspace; marks per mark-space agent (its UUID)."""
    rows = {r[0]: r[1:7] for r in _table(seeded, "analytics_agent_activity")}
    assert rows["boss-a"] == (9, 0, 0, 0, 0, 0)
    assert rows["boss-b"] == (2, 0, 0, 0, 0, 0)
    assert rows["w1"] == (0, 6, 3, 5, 0, 6)  # 4 book/pay + 2 compensations
    assert rows["w2"] == (0, 3, 0, 0, 0, 1)
    marks = dict(_rows(seeded.dsn, """
        SELECT agent_id::text, count(*) FROM agentpost.marks
         WHERE space = 'main' AND NOT (mark_type = 'need' AND resolved_by IS NOT NULL)
         GROUP BY 1"""))
    assert {a: rows[a][4] for a in marks} == marks
    assert str(ALICE.id) in marks and str(BOB.id) in marks
    assert not any(r[7] for r in _table(seeded, "analytics_agent_activity"))


def _online_envelope(dsn: str) -> dict[str, bool]:
    """The guard's own StatisticalEnvelope fed the same writes in order: restricted ever?"""
    env = StatisticalEnvelope(window_seconds=BUCKET)
    restricted: dict[str, bool] = {}
    for agent, created_at in _rows(dsn, "SELECT agent_id::text, created_at FROM agentpost.marks"
                                        " WHERE space = 'history' ORDER BY seq"):
        env.record_attempt(UUID(agent), "observation", scope="ops", at=created_at, topic=agent)
        verdict = env.evaluate(UUID(agent), created_at).verdict
        restricted[agent] = restricted.get(agent, False) or verdict is EnvelopeVerdict.RESTRICTED
    return restricted


def test_statistical_envelope_flags_the_burst_not_the_steady(seeded: Seeded,
                                                               past: Submitted) -> None:
    """Markspace §9.7 offline: `bursty` (30 writes after 8 buckets of 2) is flagged with a
    rate reason; `steady` is not; `newcomer` (40 writes in its first bucket) is not judged
    (P41, cold start: no score). The guard's online envelope agrees on every agent."""
    assert past.returncode == 0, past.err[-2000:]
    rows = {r[0]: r for r in _table(seeded, "analytics_agent_activity", PAST)}
    ids = {name: str(i) for name, i in seeded.envelope_agents.items()}
    bursty, steady, newcomer = rows[ids["bursty"]], rows[ids["steady"]], rows[ids["newcomer"]]
    assert bursty[5] == 46 and steady[5] == 24 and newcomer[5] == 40
    assert bursty[7] is True and bursty[8] == pytest.approx(30 / (2 + 3.5))
    assert bursty[9].startswith("observation rate: 30 > threshold 5.50")
    assert "bucket 8 of 300 s" in bursty[9]
    assert steady[7] is False and steady[9] is None and steady[8] == pytest.approx(2 / 5.5)
    assert newcomer[7] is False and newcomer[8] is None and newcomer[9] is None
    online = _online_envelope(seeded.dsn)
    assert {a: rows[a][7] for a in online} == online


# -- the contract: every table, idempotent re-runs, windows apart --------------------------


def test_every_table_of_the_window_is_filled(seeded: Seeded) -> None:
    for table in COLUMNS:
        assert _table(seeded, table), table
        assert seeded.summary[table] == len(_table(seeded, table))
    (runs,) = _rows(seeded.dsn, "SELECT count(*), max(source_rows) FROM agentpost.analytics_runs"
                                " WHERE job = %s AND window_start = %s AND window_end = %s",
                    (JOB, seeded.window.start, seeded.window.end))
    entries = _rows(seeded.dsn, "SELECT count(*) FROM agentpost.trail WHERE at >= %s AND at < %s",
                    (seeded.window.start, seeded.window.end))[0][0]
    assert runs == (1, entries) and seeded.summary["source_rows"] == entries


def test_a_rerun_replaces_its_window_and_leaves_others(seeded: Seeded, past: Submitted,
                                                       narrow: Any) -> None:
    """The contract of sql/0061: a run of another window (PAST) left the first window's rows
    as they were; a re-run of the first gives the same rows again and still one run row."""
    assert {t: _table(seeded, t) for t in COLUMNS} == seeded.first
    assert past.returncode == 0 and _table(seeded, "analytics_agent_activity", PAST)
    run_analytics(narrow, seeded.settings, seeded.window, Options(policies=POLICIES))
    assert {t: _table(seeded, t) for t in COLUMNS} == seeded.first
    assert _rows(seeded.dsn, "SELECT count(*) FROM agentpost.analytics_runs WHERE job = %s AND "
                             "window_start = %s AND window_end = %s",
                 (JOB, seeded.window.start, seeded.window.end))[0][0] == 1


# -- entry points ------------------------------------------------------------------------------


def _runs(dsn: str) -> int:
    return _rows(dsn, "SELECT count(*) FROM agentpost.analytics_runs")[0][0]


@pytest.mark.parametrize(("args", "message"), [
    (["--start", "2026-01-02T00:00", "--end", "2026-01-01T00:00"], "end must be after"),
    (["--start", "2026-01-01", "--end", "tomorrow"], "not an ISO 8601 time"),
    (["--start", "2026-01-01", "--end", "2026-01-02", "--policies", "lot=loudest"],
     "unknown conflict policy 'loudest'"),
    (["--start", "2026-01-01", "--end", "2026-01-02", "--policies", "lot"],
     "is not scope=policy"),
    (["--start", "2026-01-01"], "--end"),
])
def test_bad_input_exits_2_and_writes_nothing(seeded: Seeded, args: list[str], message: str,
                                              capsys: Any) -> None:
    before = _runs(seeded.dsn)
    assert main(["--dsn", seeded.dsn, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _runs(seeded.dsn) == before


def test_no_dsn_exits_2(seeded: Seeded, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.delenv("AGENTPOST_DSN", raising=False)
    before = _runs(seeded.dsn)
    assert main(["--start", "2026-01-01", "--end", "2026-01-02"]) == 2
    assert "AGENTPOST_DSN" in capsys.readouterr().err
    assert _runs(seeded.dsn) == before


def test_the_app_entry_point_runs_the_job(seeded: Seeded, past: Submitted) -> None:
    """apps/run_analytics.py's `main`: exit 0, the summary printed, the window's rows and
    its run row written (under spark-submit: tests/spark/test_spark_airflow.py)."""
    assert past.returncode == 0, past.err[-2000:]
    assert "analytics_agent_activity 3" in past.out and "source_rows 0" in past.out
    assert _rows(seeded.dsn, "SELECT count(*) FROM agentpost.analytics_runs WHERE job = %s AND "
                             "window_start = %s AND window_end = %s",
                 (JOB, PAST.start, PAST.end))[0][0] == 1
