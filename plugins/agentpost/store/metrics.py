"""What the store's operators watch, read in one snapshot: per inbox depth, in flight, oldest
waiting age, redeliveries and dead letters; delivery latency; rejections by reason; commands
by state; the event-claim backlog; how long ago the trail last verified.

Each number comes from an index of the live state (sql/0082_metrics.sql), so a scrape costs
what is waiting, not what has happened. The label set is bounded: the `top` deepest inboxes
are named, the rest summed as one `others` row (`top=None` names every inbox, for a fleet
small enough). The metrics endpoint (agentpost.web.metrics) and the maintenance DAG's Airflow
metrics both read this.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import InvalidInput

QUERIES = load_queries("agentpost.store", "metrics.sql")
#: inboxes named by default; the rest are one `others` row
DEFAULT_TOP = 20
#: the most recent leased deliveries per named inbox the latency histogram counts
LATENCY_SAMPLE = 100
#: the latency histogram's upper bounds, seconds
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InboxMetrics(_Frozen):
    """One inbox, or the sum of the inboxes not named (`inbox` None; its oldest is the
    oldest among them)."""

    inbox: str | None
    depth: int
    in_flight: int
    oldest_waiting_s: float | None
    redeliveries: int
    dead_letters: int


class StoreMetrics(_Frozen):
    inboxes: tuple[InboxMetrics, ...]
    #: every inbox, named or not, summed (the one series a dashboard needs most)
    total: InboxMetrics
    #: how many inboxes the `others` row sums
    others_count: int
    #: cumulative counts per upper bound (LATENCY_BUCKETS, then +Inf), and their sum (s)
    latency_buckets: tuple[tuple[float, int], ...]
    latency_sum: float
    rejections: dict[str, int] = Field(default_factory=dict)
    commands: dict[str, int] = Field(default_factory=dict)
    event_claim_backlog: int = 0
    verified_age_s: float | None = None
    last_verification_ok: bool | None = None


def read_metrics(db: Any, *, top: int | None = DEFAULT_TOP) -> StoreMetrics:
    """The snapshot, from `db` (the store's `Database`, or a read replica's)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise InvalidInput("top is a whole number of inboxes, 0 or more, or None (all)")
    rows = [_inbox(r) for r in db.fetchall(QUERIES["inboxes"])]
    named, rest = (rows, []) if top is None else (rows[:top], rows[top:])
    latencies = [r[0] for r in db.fetchall(QUERIES["latencies"], {
        "inboxes": [m.inbox for m in named], "sample": LATENCY_SAMPLE})]
    age, ok = db.fetchone(QUERIES["verified"])
    return StoreMetrics(
        inboxes=tuple(named) + ((_sum(rest),) if rest else ()), total=_sum(rows),
        others_count=len(rest), latency_buckets=_buckets(latencies),
        latency_sum=float(sum(latencies)),
        rejections={reason: int(n) for reason, n in db.fetchall(QUERIES["rejections"])},
        commands={state: int(n) for state, n in db.fetchall(QUERIES["commands"])},
        event_claim_backlog=int(db.scalar(QUERIES["backlog"])),
        verified_age_s=age, last_verification_ok=ok)


def record_verification(db: Any, *, ok: bool, entries: int, anchor: str | None,
                        by: str) -> None:
    """Keep that the trail was verified (and how it went), for `verified_age_s`."""
    with db.cursor() as cur:
        cur.execute(QUERIES["record_verification"],
                    {"ok": bool(ok), "entries": int(entries), "anchor": anchor, "by": by})


def _inbox(row: tuple[Any, ...]) -> InboxMetrics:
    inbox, depth, in_flight, oldest, redeliveries, dead = row
    return InboxMetrics(inbox=inbox, depth=depth, in_flight=in_flight, oldest_waiting_s=oldest,
                        redeliveries=redeliveries, dead_letters=dead)


def _sum(rows: list[InboxMetrics]) -> InboxMetrics:
    ages = [r.oldest_waiting_s for r in rows if r.oldest_waiting_s is not None]
    return InboxMetrics(inbox=None, depth=sum(r.depth for r in rows),
                        in_flight=sum(r.in_flight for r in rows),
                        oldest_waiting_s=max(ages, default=None),
                        redeliveries=sum(r.redeliveries for r in rows),
                        dead_letters=sum(r.dead_letters for r in rows))


def _buckets(values: list[float]) -> tuple[tuple[float, int], ...]:
    bounds = (*LATENCY_BUCKETS, float("inf"))
    return tuple((bound, sum(1 for v in values if v <= bound)) for bound in bounds)
