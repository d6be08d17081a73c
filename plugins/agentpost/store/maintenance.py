"""The periodic housekeeping of the whole store, in one call to schedule.

`EnvelopeStore.maintain` keeps the envelope layer (leases, redeliveries, rule firings,
VACUUM ANALYZE); commands and routes each add a sweep that only a schedule can run, because
what they catch is an absence: an executor that stopped heartbeating, a hop whose leases ran
out. The sweeps run after the envelope layer returned expired leases (a hop dead-lettered by
that is swept in the same call) and before the vacuum, which then sees their writes.
"""

from __future__ import annotations

from typing import Any

from agentpost.store.commands import CommandLedger
from agentpost.store.envelopes import EnvelopeStore
from agentpost.store.event_claims import drop_event_watchers, prune_event_claims
from agentpost.store.event_handled import DEFAULT_HANDLED_KEEP, prune_event_handled
from agentpost.store.routes import RouteStore
from agentpost.store.trail_partitions import ensure_partitions


def maintain(store: EnvelopeStore, *, vacuum: bool = True,
             drop_watchers_idle: float | None = None,
             keep_handled: float = DEFAULT_HANDLED_KEEP) -> dict[str, Any]:
    """The envelope layer's housekeeping, then: fail started commands whose executor is
    gone (`executor_lost`), move routed envelopes whose hop was dead-lettered to error-end
    (`timeout`), delete event claims no watcher can need again, delete which-run-handled
    marks older than `keep_handled` seconds (default 30 days: they must outlive a stranded
    asset event, which comes back in a later run's window), and VACUUM ANALYZE.
    `drop_watchers_idle` (seconds, off by default): first forget event watchers no trigger
    asked for that long, with their marks; one that comes back then starts afresh, so only
    a person who knows the trigger is gone should pass it. Makes the trail's monthly
    partitions two months ahead. Returns what each step did."""
    result = store.maintain(vacuum=False)
    with CommandLedger(store) as ledger:
        result["commands_failed"] = ledger.sweep_stuck()
    result["routes_timed_out"] = RouteStore(store).sweep_timeouts()
    if drop_watchers_idle is not None:
        result["event_watchers_dropped"] = drop_event_watchers(store, drop_watchers_idle)
    result["event_claims_pruned"] = prune_event_claims(store)
    result["event_handled_pruned"] = prune_event_handled(store, keep_handled)
    with store.db.cursor() as cur:  # the trail's months, two ahead (sql/0086)
        result["trail_partitions_made"] = ensure_partitions(cur)
    result["vacuumed"] = store.vacuum() if vacuum else []
    return result


__all__ = ["maintain"]
