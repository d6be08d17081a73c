"""`agentpost bench growth`'s backlog case: one inbox holding a large backlog, the other
inboxes measured, before the backlog is analysed and after.

The growth bench spreads history over many inbox pairs and analyses before each measurement,
so it never sees a store where one inbox suddenly holds `BACKLOG` waiting envelopes and
autovacuum has not run since (an outside run measured lease+ack in another inbox at 0.34 x
the empty store's there). Here: two fresh stores with autovacuum off, one of them given the
backlog through the store's own API (`send_many`, batches of 500) in an inbox nobody
consumes; then single sends and lease+ack (1 consumer, batches of 100) in *another* inbox of
each, in interleaved rounds, first with no ANALYZE since the backlog arrived, then after a
VACUUM ANALYZE of both. Every ratio (backlog ÷ empty) must be within 1.5 x.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentpost.benchmarks.common import Report, median
from agentpost.benchmarks.leases import CELLS as LEASE_CELLS
from agentpost.benchmarks.leases import vacuum

if TYPE_CHECKING:
    from agentpost.benchmarks.growth import Side

#: waiting envelopes in the one inbox (the outside run's figure)
BACKLOG = 330_000
BATCH = 500
RATE_LIMIT = 1.5
#: the measured cell: one consumer, batches of 100
CELL = LEASE_CELLS[1]
STATES = ("not analysed", "after VACUUM ANALYZE")


@dataclass
class BacklogNumbers:
    """Per state: single sends/s and lease+ack/s of the empty store and the backlogged one."""

    backlog: int = 0
    fill_s: float = 0.0
    rates: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)

    def add(self, state: str, what: str, side: str, value: float) -> None:
        self.rates.setdefault((state, what, side), []).append(value)

    def ratio(self, state: str, what: str) -> float:
        return (median(self.rates[(state, what, "backlog")])
                / median(self.rates[(state, what, "empty")]))


def fill_backlog(side: Side, count: int, content: str) -> float:
    """`count` envelopes waiting in a new inbox of `side`'s store that nobody consumes, sent
    by send_many; returns the seconds it took."""
    store, lead = side.store, side.bench.lead
    inbox = store.create_workspace("worker", parent=lead,
                                   workspace_id=f"bench-backlog-{uuid.uuid4().hex[:6]}").id
    started = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(BATCH, count - sent)
        store.send_many([{"from": lead, "to": inbox, "type": "directive",
                          "content": content}] * n)
        sent += n
    return time.perf_counter() - started


def measure(empty: Side, backlogged: Side, *, rounds: int, singles: int, leased: int,
            send_round: Callable[[Side, int], float], numbers: BacklogNumbers) -> None:
    """Interleaved rounds per state; the lease cell without its usual VACUUM ANALYZE in
    the first state."""
    for state in STATES:
        analysed = state != STATES[0]
        if analysed:
            vacuum(empty.dsn)
            vacuum(backlogged.dsn)
        for _ in range(rounds):
            for name, side in (("empty", empty), ("backlog", backlogged)):
                numbers.add(state, "send (single)", name, send_round(side, singles))
                numbers.add(state, f"lease+ack, {CELL.label}", name,
                            side.bench.run_cell(side.workers, CELL, leased,
                                                analyse=analysed))


def report_rows(report: Report, numbers: BacklogNumbers) -> float:
    """The rows of the case; returns the lowest ratio."""
    worst = float("inf")
    report.add("backlog case", f"{numbers.backlog:,} envelopes waiting in one inbox, sent by "
                               f"send_many in {numbers.fill_s:,.0f} s (not timed below); the "
                               "rates are of another inbox")
    for (state, what, side), _ in sorted(numbers.rates.items()):
        if side != "backlog":
            continue
        ratio = numbers.ratio(state, what)
        worst = min(worst, ratio)
        report.add(f"backlog, {state}: {what}",
                   f"{median(numbers.rates[(state, what, 'backlog')]):>9,.0f}/s   empty "
                   f"{median(numbers.rates[(state, what, 'empty')]):>9,.0f}/s   ratio "
                   f"{ratio:.2f}")
    return worst
