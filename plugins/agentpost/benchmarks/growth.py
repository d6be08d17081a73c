"""`agentpost bench growth`: does the cost of a step stay flat as the store grows?

The store is filled to 0, 100,000 and 1,000,000 envelopes of history (10,000,000 more with
`--large`; `--scale` shrinks every size and count). At each size, measured side by side with a
fresh empty store in the same interleaved rounds (so a ratio never compares two moments of a
noisy machine):
- single `send`/s and `send_many`/s (batches of 500);
- lease+ack/s with 1 and 4 consumer processes on one inbox, batches of 100;
- send→consumer latency p50/p95 (paced sends, a LISTEN/NOTIFY subscriber);
- `verify_trail(since=checkpoint)` over the last 100,000 entries: a checkpoint, then 100,000
  entries written through the store's API (20,000 envelopes sent, leased and acked), then the
  timed verification. If the installed store has no `since` parameter the cell says so.
- `verify_trail()` over the whole trail (at the 100,000 size only: it costs minutes at 1M):
  the price `since` avoids,
  and the proof that the filled history is a store the store's own checker accepts.
The backlog case (growth_backlog.py): one inbox given 330,000 waiting envelopes, another
inbox's single sends and lease+ack beside a fresh store's, before ANALYZE and after.
On the empty store only: a raw single-row INSERT+COMMIT (interleaved with single sends) and
a boundary over 1,000 contested resources on Postgres (one `resolve_deferred_many` call, as
`bench marks` judges it).

History is generated inside SQL (`growth_fill.py` says how): consumed, dead-lettered and
rejected envelopes with their signals, counters and trail entries in the inboxes' own chains,
and a waiting backlog of 10 % in those other inboxes. Its chains are hashed by a window
aggregate rather than `_trail_write`'s loop, but every entry is the one the store would have
written, so the whole store verifies; the last 100,000 entries verified with `since` are
written by the real API.

Every table of the scratch databases has autovacuum off; each measurement is preceded by an
untimed VACUUM ANALYZE of its database, as in `bench leases`. Both databases are dropped at the
end, even when the run fails.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg2

from agentpost.benchmarks import growth_backlog, growth_fill, growth_prune
from agentpost.benchmarks.common import Report, median, percentile, rate
from agentpost.benchmarks.envelopes import _RAW_INSERT, _RAW_TABLE
from agentpost.benchmarks.leases import CELLS as LEASE_CELLS
from agentpost.benchmarks.leases import (
    GOAL_CELL,
    LATENCY_COUNT,
    PROCESSES,
    Agentpost,
    Latency,
    Workers,
    vacuum,
)
from agentpost.pg.bootstrap import create_database, drop_database, find_server
from agentpost.pg.migrations import migrate
from agentpost.pg.server import dsn_for_database, libpq_dsn
from agentpost.store import EnvelopeStore

SIZES = (100_000, 1_000_000)
LARGE = 10_000_000
ROUNDS = 3
SINGLES = 400
BATCHES = 4
BATCH = 500
LEASE_COUNT = 3_000  # envelopes per lease+ack cell
TAIL = 100_000  # trail entries verified with `since`
TAIL_ENTRIES_PER_ENVELOPE = 5  # created, delivered, acknowledged, leased, consumed
CONTESTED = 1_000
CELLS = (LEASE_CELLS[1], GOAL_CELL)  # 1 and 4 consumers, batches of 100
CONTENT = growth_fill.CONTENT
MISSING = "not measured: verify_trail(since=) missing"
RATE_LIMIT = 1.5  # at 1M, every rate within 1.5x of the empty store's


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of one run, from --scale and --large."""

    scale: float
    sizes: tuple[int, ...]
    goal_size: int
    full_verify_up_to: int
    singles: int
    batches: int
    lease_count: int
    latency_count: int
    tail: int
    contested: int
    backlog: int
    large: int | None = None  # the large size, whose older half is archived and pruned

    @classmethod
    def make(cls, scale: float, large: bool) -> Plan:
        sized = [max(1_000, round(s * scale)) for s in (*SIZES, *((LARGE,) if large else ()))]
        return cls(scale=scale, sizes=(0, *sorted(set(sized))),
                   goal_size=max(1_000, round(SIZES[-1] * scale)),
                   full_verify_up_to=max(1_000, round(SIZES[0] * scale)),
                   singles=max(20, round(SINGLES * scale)), batches=max(1, round(BATCHES * scale)),
                   lease_count=max(100, round(LEASE_COUNT * scale)),
                   latency_count=max(30, round(LATENCY_COUNT * scale / ROUNDS)),
                   tail=max(500, round(TAIL * scale)),
                   contested=CONTESTED if scale >= 1 else max(20, round(CONTESTED * scale)),
                   backlog=max(1_000, round(growth_backlog.BACKLOG * scale)),
                   large=max(1_000, round(LARGE * scale)) if large else None)


@dataclass
class Numbers:
    """What one store measured at one size."""

    send: list[float] = field(default_factory=list)
    many: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    lease: dict[str, list[float]] = field(default_factory=dict)
    latency: Latency = field(default_factory=lambda: Latency([], [], []))
    since: float | str = MISSING  # seconds, or why there is no number
    since_entries: int = 0
    full: tuple[float, int, bool] | None = None  # seconds, entries, verified
    deferred_s: float | None = None
    trail_entries: int = 0
    #: the signed checkpoint `verify_trail(since=)` handed back (None if it failed)
    checkpoint: dict[str, Any] | None = None


@dataclass
class Side:
    """One scratch store: its benchmark workspaces and its consumer processes."""

    dsn: str
    store: EnvelopeStore
    bench: Agentpost
    workers: Workers
    worker: str
    tail_inbox: str
    raw: Any = None  # psycopg2 connection for the raw INSERT baseline (empty store, size 0)

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.store.db.scalar(sql, params)


# --------------------------------------------------------------------------- databases


def _admin_dsn(dsn: str | None) -> str:
    """The server to make scratch databases on: that of --dsn, else discovery's."""
    if dsn is None:
        return find_server().dsn
    return dsn_for_database(libpq_dsn(dsn), "postgres")


def autovacuum_off(dsn: str) -> None:
    """Turn autovacuum off on every table of the scratch database, so results do not depend
    on the server's setting (the bench vacuums, untimed, before each measurement)."""
    conn = psycopg2.connect(libpq_dsn(dsn))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE c.relkind = 'r' AND n.nspname IN ('agentpost', 'public')")
            for (table,) in cur.fetchall():
                cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off, "
                            "toast.autovacuum_enabled = off)")
    finally:
        conn.close()


@contextmanager
def scratch_store(admin: str, label: str) -> Iterator[Side]:
    """A fresh, migrated database with autovacuum off, its workspaces and PROCESSES consumer
    processes; all dropped afterwards."""
    name = f"agentpost_bench_growth_{os.getpid()}_{label}"
    dsn = create_database(admin, name, fresh=True)
    try:
        migrate(dsn)
        with EnvelopeStore(dsn) as store:
            _create_raw_table(dsn)
            autovacuum_off(dsn)
            bench = Agentpost.setup(store)
            tag = uuid.uuid4().hex[:6]
            worker = store.create_workspace("worker", parent=bench.lead,
                                            workspace_id=f"bench-send-{tag}").id
            tail = store.create_workspace("worker", parent=bench.lead,
                                          workspace_id=f"bench-tail-{tag}").id
            with Workers(dsn, PROCESSES) as workers:
                side = Side(dsn, store, bench, workers, worker, tail)
                try:
                    yield side
                finally:
                    if side.raw is not None:
                        side.raw.close()
    finally:
        drop_database(admin, name)


def _create_raw_table(dsn: str) -> None:
    conn = psycopg2.connect(libpq_dsn(dsn))
    try:
        with conn.cursor() as cur:
            cur.execute(_RAW_TABLE)
        conn.commit()
    finally:
        conn.close()


# --------------------------------------------------------------------------- measurements


def _raw_round(side: Side, count: int) -> float:
    """Single-row INSERT+COMMIT through psycopg2 into a table as wide as `envelopes`."""
    if side.raw is None:
        side.raw = psycopg2.connect(libpq_dsn(side.dsn))
    conn = side.raw
    cur = conn.cursor()

    def run() -> None:
        for _ in range(count):
            cur.execute(_RAW_INSERT, (str(uuid.uuid4()), 0, CONTENT))
            conn.commit()

    return rate(count, run)


def _send_round(side: Side, count: int) -> float:
    def run() -> None:
        for _ in range(count):
            side.store.send(side.bench.lead, side.worker, "directive", CONTENT)

    return rate(count, run)


def _many_round(side: Side, batches: int) -> float:
    drafts = [{"from": side.bench.lead, "to": side.worker, "type": "directive",
               "content": CONTENT}] * BATCH

    def run() -> None:
        for _ in range(batches):
            side.store.send_many(drafts)

    return rate(batches * BATCH, run)


def _round(side: Side, numbers: Numbers, plan: Plan, *, raw: bool, keep: bool) -> None:
    """Every throughput and latency measurement once, each after an untimed vacuum. A
    warm-up round (keep=False) runs small counts and keeps nothing."""
    singles, batches, leased, paced = ((plan.singles, plan.batches, plan.lease_count,
                                        plan.latency_count) if keep else (50, 1, 200, 30))
    vacuum(side.dsn)
    raw_rate = _raw_round(side, singles) if raw else 0.0
    send_rate = _send_round(side, singles)
    many_rate = _many_round(side, batches)
    lease = {cell.label: side.bench.run_cell(side.workers, cell, leased) for cell in CELLS}
    latency = side.bench.latency(side.workers, paced)
    if not keep:
        return
    if raw:
        numbers.raw.append(raw_rate)
    numbers.send.append(send_rate)
    numbers.many.append(many_rate)
    for label, value in lease.items():
        numbers.lease.setdefault(label, []).append(value)
    numbers.latency.extend(latency)


def _write_tail(side: Side, entries: int) -> None:
    """`entries` trail entries through the API: envelopes sent, then leased and acked."""
    count = max(1, entries // TAIL_ENTRIES_PER_ENVELOPE)
    for start in range(0, count, BATCH):
        side.store.send_many([{"from": side.bench.lead, "to": side.tail_inbox,
                               "type": "directive", "content": CONTENT}
                              for _ in range(min(BATCH, count - start))])
    while leases := side.store.lease(side.tail_inbox, max=100, ttl=60.0, holder="bench-tail"):
        side.store.ack_many([lease.token for lease in leases])


def _verify_since(side: Side, numbers: Numbers, entries: int) -> None:
    """A checkpoint, `entries` entries written after it, then `verify_trail(since=cp)` timed;
    the cell says so when the installed store has no `since` parameter."""
    if "since" not in inspect.signature(side.store.verify_trail).parameters:
        numbers.since = MISSING
        return
    last_id = side.scalar("SELECT coalesce(max(id), 0) FROM agentpost.trail")
    checkpoint = side.store.checkpoint()
    _write_tail(side, entries)
    numbers.since_entries = side.scalar(
        "SELECT count(*) FROM agentpost.trail WHERE id > %s", (last_id,))
    vacuum(side.dsn)
    started = time.perf_counter()
    result = side.store.verify_trail(since=checkpoint)  # type: ignore[call-arg]
    seconds = time.perf_counter() - started
    numbers.since = seconds if result.ok else f"FAILED: {result.failure}"
    numbers.checkpoint = result.checkpoint


def _verify_full(side: Side, numbers: Numbers) -> None:
    started = time.perf_counter()
    result = side.store.verify_trail()
    numbers.full = (time.perf_counter() - started, result.entries, result.ok)
    if not result.ok:
        print(f"agentpost bench growth: the trail does not verify: {result.failure}")


def _deferred(side: Side, contested: int) -> float:
    """A boundary over `contested` resources on Postgres, one `resolve_deferred_many` call,
    as `bench marks` judges it."""
    from agentpost.benchmarks.marks import SCOPES
    from agentpost.benchmarks.marks import _deferred_many as resolve_all
    from agentpost.marks.postgres import PostgresMarkSpace

    space = PostgresMarkSpace(dsn=side.dsn, scopes=SCOPES, space=f"growth-{uuid.uuid4().hex[:6]}")
    try:
        return resolve_all(space, contested)
    finally:
        space.close()


def _measure_size(sides: list[Side], plan: Plan, *, raw: bool, verify_full: bool,
                  ) -> list[Numbers]:
    """A warm-up round, then ROUNDS rounds over the stores in turn, then the verifications."""
    results = [Numbers() for _ in sides]
    for keep in (False, *([True] * ROUNDS)):
        for side, numbers in zip(sides, results, strict=True):
            _round(side, numbers, plan, raw=raw, keep=keep)
    for side, numbers in zip(sides, results, strict=True):
        _verify_since(side, numbers, plan.tail)
        if verify_full:
            _verify_full(side, numbers)
        numbers.trail_entries = side.scalar("SELECT count(*) FROM agentpost.trail")
    return results


# --------------------------------------------------------------------------- the run


def run(*, dsn: str | None = None, scale: float = 1.0, large: bool = False) -> int:
    plan = Plan.make(scale, large)
    admin = _admin_dsn(dsn)
    progress = _Progress()
    results: dict[int, tuple[Numbers, Numbers | None]] = {}
    filled = growth_fill.Filled()
    pruned: tuple[growth_prune.PruneNumbers, Numbers, Numbers] | None = None
    with ExitStack() as stack:
        grown: Side | None = None
        for index, size in enumerate(plan.sizes):
            with scratch_store(admin, f"empty{index}") as empty:
                if size == 0:
                    (numbers,) = _measure_size([empty], plan, raw=True, verify_full=True)
                    numbers.deferred_s = _deferred(empty, plan.contested)
                    results[0] = (numbers, None)
                    continue
                if grown is None:
                    grown = stack.enter_context(scratch_store(admin, "filled"))
                    with grown.store.db.cursor() as cur:
                        growth_fill.install_helpers(cur)
                        if plan.large:
                            growth_prune.plan_old_half(cur, filled, plan.large)
                _fill(grown, filled, size)
                progress.say(f"filled {size:,} envelopes")
                pair = _measure_size([empty, grown], plan, raw=False,
                                     verify_full=size <= plan.full_verify_up_to)
                results[size] = (pair[0], pair[1])
                progress.say(f"measured at {size:,}")
                if size == plan.large:
                    # as the maintenance DAG does: verified since the checkpoint it kept
                    done = growth_prune.archive_and_prune(grown, filled, pair[1].checkpoint)
                    progress.say("archived and pruned the older half")
                    vacuum(grown.dsn)
                    after = _measure_size([empty, grown], plan, raw=False, verify_full=False)
                    pruned = (done, after[0], after[1])
                    progress.say("measured after the prune")
        backlog = _backlog_case(admin, plan)
    report = _report(plan, results, filled, backlog, pruned)
    report.print()
    checked = {**results, -1: pruned[1:]} if pruned else results
    return 0 if _all_verified(checked) else 1


class _Progress:
    """Each step's end on stderr with the time since the start (a large run takes hours;
    the report comes at the end, so a run cut short says how far it got)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def say(self, step: str) -> None:
        minutes = (time.perf_counter() - self.started) / 60
        print(f"agentpost bench growth: {step} ({minutes:,.1f} min)", file=sys.stderr,
              flush=True)


def _backlog_case(admin: str, plan: Plan) -> growth_backlog.BacklogNumbers:
    """One inbox of one store given `plan.backlog` waiting envelopes, another inbox of it
    measured beside a fresh store's, before and after ANALYZE (growth_backlog.py)."""
    numbers = growth_backlog.BacklogNumbers(backlog=plan.backlog)
    with scratch_store(admin, "backlog-empty") as empty, \
            scratch_store(admin, "backlog") as backlogged:
        numbers.fill_s = growth_backlog.fill_backlog(backlogged, plan.backlog, CONTENT)
        growth_backlog.measure(empty, backlogged, rounds=ROUNDS, singles=plan.singles,
                               leased=plan.lease_count, send_round=_send_round,
                               numbers=numbers)
    return numbers


def _fill(side: Side, filled: growth_fill.Filled, size: int) -> None:
    with side.store.db.cursor() as cur:
        growth_fill.grow(cur, filled, size)
    autovacuum_off(side.dsn)
    vacuum(side.dsn)


def _all_verified(results: dict[int, tuple[Numbers, Numbers | None]]) -> bool:
    for pair in results.values():
        for numbers in pair:
            if numbers is None:
                continue
            if numbers.full is not None and not numbers.full[2]:
                return False
            if isinstance(numbers.since, str) and numbers.since.startswith("FAILED"):
                return False
    return True


# --------------------------------------------------------------------------- the report


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def _s(value: float) -> str:
    return f"{value:.2f} s"


def _beside(value: float, empty: float, shown: Callable[[float], str]) -> str:
    return f"{shown(value):>12}   empty {shown(empty):>10}   ratio {value / empty:.2f}"


@dataclass
class Figures:
    """The medians of one store at one size, by measurement."""

    values: dict[str, float]
    since: float | str
    since_entries: int

    @classmethod
    def of(cls, n: Numbers) -> Figures:
        lat = n.latency.total
        values = {"send (single)": median(n.send),
                  "send_many (batches of 500)": median(n.many),
                  **{f"lease+ack, {label}": median(v) for label, v in n.lease.items()},
                  "send→consumer p50": percentile(lat, 0.50),
                  "send→consumer p95": percentile(lat, 0.95)}
        return cls(values, n.since, n.since_entries)


RATES = ("send (single)", "send_many (batches of 500)",
         *(f"lease+ack, {cell.label}" for cell in CELLS))
TIMES = ("send→consumer p50", "send→consumer p95")


def _report(plan: Plan, results: dict[int, tuple[Numbers, Numbers | None]],
            filled: growth_fill.Filled, backlog: growth_backlog.BacklogNumbers,
            pruned: tuple[growth_prune.PruneNumbers, Numbers, Numbers] | None) -> Report:
    sizes = ", ".join(f"{s:,}" for s in plan.sizes)
    report = Report(
        f"agentpost bench growth (scale {plan.scale:g}; sizes {sizes} envelopes of history; "
        f"{ROUNDS} interleaved rounds per size, medians; each size beside a fresh empty store "
        "measured in the same rounds, ratio = this size / empty; autovacuum off on the "
        "bench's tables, VACUUM ANALYZE before each measurement, untimed)")
    empty0 = results[0][0]
    _empty_rows(report, empty0, plan)
    for size in plan.sizes[1:]:
        empty, grown = results[size]
        assert grown is not None
        _size_rows(report, f"{size:,} envelopes", empty, grown)
    if pruned is not None:
        growth_prune.report_rows(report, pruned[0])
        _size_rows(report, f"{plan.large:,}, half pruned", pruned[1], pruned[2])
    report.add("history filled", f"{filled.envelopes:,} envelopes in {filled.pairs:,} inbox "
                                 f"pairs, {filled.seconds:,.0f} s in SQL (not timed above)")
    worst_backlog = growth_backlog.report_rows(report, backlog)
    _goals(report, plan, results)
    if pruned is not None:
        done, empty, grown = pruned
        worst = _worst(empty, grown)
        report.goal(f"after archiving and pruning half of {plan.large:,} envelopes every rate "
                    f"within {RATE_LIMIT:g}x of the empty store's (lowest ratio {worst:.2f})",
                    worst >= 1 / RATE_LIMIT)
        growth_prune.goal(report, done)
    report.goal(f"with {backlog.backlog:,} envelopes waiting in one inbox, another inbox's "
                f"rates within {RATE_LIMIT:g}x of the empty store's, analysed or not (lowest "
                f"ratio {worst_backlog:.2f})", worst_backlog >= 1 / RATE_LIMIT)
    return report


def _since_cell(figure: float | str, entries: int) -> str:
    return figure if isinstance(figure, str) else f"{_s(figure)} for {entries:,} entries"


def _full_cell(full: tuple[float, int, bool] | None) -> str:
    if full is None:
        return "skipped at this size"
    seconds, entries, ok = full
    return f"{_s(seconds)} for {entries:,} entries, {'verified' if ok else 'FAILED'}"


def _empty_rows(report: Report, n: Numbers, plan: Plan) -> None:
    f = Figures.of(n)
    name = "empty store"
    report.add(f"{name}: raw INSERT+COMMIT (psycopg2)", _rate(median(n.raw)))
    for label in RATES:
        report.add(f"{name}: {label}", _rate(f.values[label]))
    report.add(f"{name}: send→consumer p50 / p95",
               f"{_ms(f.values[TIMES[0]])} / {_ms(f.values[TIMES[1]])}")
    report.add(f"{name}: verify_trail(since=) last entries", _since_cell(f.since,
                                                                         f.since_entries))
    report.add(f"{name}: verify_trail() whole trail", _full_cell(n.full))
    report.add(f"{name}: resolve_deferred_many over {plan.contested:,} (Postgres)",
               _s(n.deferred_s or 0.0))


def _size_rows(report: Report, name: str, empty: Numbers, grown: Numbers) -> None:
    e, g = Figures.of(empty), Figures.of(grown)
    for label in RATES:
        report.add(f"{name}: {label}", _beside(g.values[label], e.values[label], _rate))
    for label in TIMES:
        report.add(f"{name}: {label}", _beside(g.values[label], e.values[label], _ms))
    if isinstance(g.since, float) and isinstance(e.since, float):
        since = (_beside(g.since, e.since, _s)
                 + f"   ({g.since_entries:,} / {e.since_entries:,} entries)")
    else:
        since = f"{_since_cell(g.since, g.since_entries)}   empty: " \
                f"{_since_cell(e.since, e.since_entries)}"
    report.add(f"{name}: verify_trail(since=) last entries", since)
    report.add(f"{name}: verify_trail() whole trail",
               f"{_full_cell(grown.full)}   empty: {_full_cell(empty.full)}")


def _worst(empty: Numbers, grown: Numbers) -> float:
    """The lowest ratio of a rate of `grown` to the same of `empty`."""
    e, g = Figures.of(empty), Figures.of(grown)
    return min(g.values[label] / e.values[label] for label in RATES)


def _goals(report: Report, plan: Plan,
           results: dict[int, tuple[Numbers, Numbers | None]]) -> None:
    empty0 = results[0][0]
    f0 = Figures.of(empty0)
    at = plan.goal_size
    empty, grown = results[at]
    assert grown is not None
    e, g = Figures.of(empty), Figures.of(grown)
    worst = _worst(empty, grown)
    report.goal(f"at {at:,} envelopes every rate within {RATE_LIMIT:g}x of the empty store's "
                f"(lowest ratio {worst:.2f})", worst >= 1 / RATE_LIMIT)
    if isinstance(g.since, float) and isinstance(e.since, float):
        report.goal(f"verify_trail(since=) over the last {plan.tail:,} entries independent of "
                    f"total size (at {at:,} within {RATE_LIMIT:g}x of the empty store's; "
                    f"ratio {g.since / e.since:.2f})", g.since <= RATE_LIMIT * e.since)
    else:
        report.goal(f"verify_trail(since=) over the last {plan.tail:,} entries independent of "
                    f"total size ({g.since if isinstance(g.since, str) else e.since})", False)
    raw = median(empty0.raw)
    send = f0.values["send (single)"]
    report.goal(f"empty store: single send >= 0.5 x raw single-row INSERT+COMMIT "
                f"(ratio {send / raw:.2f})", send >= 0.5 * raw)
    report.goal("empty store: send_many >= 20,000 envelopes/s",
                f0.values["send_many (batches of 500)"] >= 20_000)
    report.goal("empty store: lease+ack >= 10,000/s with 4 consumers, batches of 100",
                f0.values[f"lease+ack, {GOAL_CELL.label}"] >= 10_000)
    report.goal("empty store: send→consumer p95 < 5 ms", f0.values[TIMES[1]] < 5.0)
    deferred = empty0.deferred_s or 0.0
    report.goal(f"empty store: a boundary over {plan.contested:,} resources < 1 s on "
                f"Postgres ({deferred:.2f} s)", deferred < 1.0)
