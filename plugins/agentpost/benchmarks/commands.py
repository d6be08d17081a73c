"""`agentpost bench commands`: command lifecycles and routed hops, each priced in envelope sends.

Measured in one run, on one database, rounds interleaved so that machine noise hits every
cell alike:
- send: `EnvelopeStore.send`, one envelope per call (validated, trail written, delivered) —
  the unit every other cell is priced in;
- lifecycle: `CommandLedger.run` of a mutating command, auto-confirmed by a named policy,
  authorized through the permission matrix, started and executed, with the evidence of every
  transition signed into the trail (received → canonicalized → authz_pending → authorized →
  started → executed);
- lifecycle (read-only): the same for a read-only command (no confirmation gate);
- routed hop: one actor handling one envelope of a 3-actor route whose first actor fans out
  to 10 (see `agentpost.benchmarks.routes` for the exact definition), actors taking up to
  100 hops per call; and the same with one hop per call (a runtime streaming single
  envelopes), printed for comparison.

The server runs with autovacuum off here, so each round starts with VACUUM ANALYZE (untimed).

A cell's cost in sends is `send rate / cell rate`: how many single sends fit in the time one
lifecycle or one hop takes. Goals (issue 5): a lifecycle ≤ 3 sends, a hop ≤ 1.5 sends.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from agentpost.benchmarks.common import Report, median, rate, scratch_database
from agentpost.benchmarks.leases import vacuum
from agentpost.benchmarks.routes import measure_routes
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger

ROUNDS = 5
FANOUT = 10
CONTENT = "Book the meeting room for the quarterly review."
ACTION = "bench.book-room"
LIFECYCLE_GOAL = 3.0
HOP_GOAL = 1.5


@dataclass
class Cells:
    """Rates per cell, one entry per round."""

    send: list[float] = field(default_factory=list)
    mutating: list[float] = field(default_factory=list)
    readonly: list[float] = field(default_factory=list)
    hops: list[float] = field(default_factory=list)
    envelopes: list[float] = field(default_factory=list)
    streamed: list[float] = field(default_factory=list)


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    singles = max(20, int(300 * scale))
    routes = max(1, int(20 * scale))
    with (scratch_database(dsn, "agentpost_bench_commands") as bench_dsn,
          EnvelopeStore(bench_dsn) as store):
        cells, verified = _measure(store, singles, routes)
    _report(cells, singles, routes, verified).print()
    return 0 if verified.ok else 1


def _measure(store: EnvelopeStore, singles: int, routes: int):
    tag = uuid.uuid4().hex[:6]
    lead = store.create_workspace("coordinator", workspace_id=f"bench-lead-{tag}").id
    worker = store.create_workspace("worker", parent=lead,
                                    workspace_id=f"bench-worker-{tag}").id
    store.register_type(ACTION, senders=["coordinator"], receivers=["worker"])
    ledger = CommandLedger(store)
    keys = count()

    def send_round() -> None:
        for _ in range(singles):
            store.send(lead, worker, "directive", CONTENT)

    def lifecycles(mutating: bool) -> Callable[[], None]:
        def one_round() -> None:
            for _ in range(singles):
                view = ledger.run(lead, f"bench-{tag}-{next(keys)}", _effect, action=ACTION,
                                  mutating=mutating, executor=worker,
                                  auto_confirm="bench-policy" if mutating else None)
                if view.state.value != "executed":
                    raise RuntimeError(f"a benchmark command ended {view.state.value}")
        return one_round

    mutating_round, readonly_round = lifecycles(True), lifecycles(False)
    send_round()  # warm up connections, plans and caches on every path
    mutating_round()
    measure_routes(store, routes=1, fanout=FANOUT)
    cells = Cells()
    for _ in range(ROUNDS):
        vacuum(store.dsn)
        cells.send.append(rate(singles, send_round))
        cells.mutating.append(rate(singles, mutating_round))
        cells.readonly.append(rate(singles, readonly_round))
        routed = measure_routes(store, routes=routes, fanout=FANOUT)
        cells.hops.append(routed["hops_per_s"])
        cells.envelopes.append(routed["envelopes_per_s"])
        streamed = measure_routes(store, routes=max(1, routes // 4), fanout=FANOUT, batch=1)
        cells.streamed.append(streamed["hops_per_s"])
    return cells, store.verify_trail()


def _effect() -> dict[str, bool]:
    return {"booked": True}


def _report(cells: Cells, singles: int, routes: int, verified) -> Report:
    send, mutating = median(cells.send), median(cells.mutating)
    readonly, hops = median(cells.readonly), median(cells.hops)
    report = Report(f"agentpost bench commands ({ROUNDS} interleaved rounds, medians; "
                    f"{singles} sends and {singles} lifecycles of each kind per round; "
                    f"{routes} routes of 3 actors, fan-out {FANOUT}, per round)")
    report.add("send (single envelope)", f"{send:,.0f} envelopes/s")
    report.add("lifecycle, mutating, auto-confirmed", f"{mutating:,.0f} commands/s")
    report.add("lifecycle, read-only", f"{readonly:,.0f} commands/s")
    report.add("routed hops (3 actors, fan-out 10)", f"{hops:,.0f} hops/s")
    report.add("routed envelopes", f"{median(cells.envelopes):,.0f} envelopes/s")
    streamed = median(cells.streamed)
    report.add("routed hops, one per call (streaming)", f"{streamed:,.0f} hops/s")
    report.add("cost of a mutating lifecycle", f"{send / mutating:.2f} sends")
    report.add("cost of a read-only lifecycle", f"{send / readonly:.2f} sends")
    report.add("cost of a routed hop (batches of 100)", f"{send / hops:.2f} sends")
    report.add("cost of a routed hop (one per call)", f"{send / streamed:.2f} sends")
    report.add("trail after the run", f"{verified.entries:,} entries, "
                                      f"{'verified' if verified.ok else 'FAILED'}")
    report.goal(f"a full command lifecycle costs <= {LIFECYCLE_GOAL:g} envelope sends",
                send / mutating <= LIFECYCLE_GOAL)
    report.goal(f"a routed hop costs <= {HOP_GOAL:g} envelope sends (batches of 100)",
                send / hops <= HOP_GOAL)
    return report
