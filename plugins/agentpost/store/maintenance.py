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
from agentpost.store.routes import RouteStore


def maintain(store: EnvelopeStore, *, vacuum: bool = True) -> dict[str, Any]:
    """The envelope layer's housekeeping, then: fail started commands whose executor is
    gone (`executor_lost`), move routed envelopes whose hop was dead-lettered to error-end
    (`timeout`), and VACUUM ANALYZE. Returns what each step did."""
    result = store.maintain(vacuum=False)
    with CommandLedger(store) as ledger:
        result["commands_failed"] = ledger.sweep_stuck()
    result["routes_timed_out"] = RouteStore(store).sweep_timeouts()
    result["vacuumed"] = store.vacuum() if vacuum else []
    return result


__all__ = ["maintain"]
