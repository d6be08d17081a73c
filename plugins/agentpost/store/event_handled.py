"""Which run of a DAG handled each arrival (sql/0071_event_handled.sql).

Airflow's scheduler can strand an asset event: stored while the DAG's queued run was being
created, it is newer than that run's window and waits for the next event's run, forever if
no envelope follows. Its claim (`agentpost.store.event_claims`) is visible before that run's
task starts, so a run takes its own arrivals plus every claimed arrival no run of its DAG
took yet: each arrival is handled by exactly one run per consumer (DAG), at least once
within that run's retries.

Marks are pruned by age (`prune_event_handled`, default 30 days): an arrival whose event
comes back in a run's window after its mark was pruned is handled a second time.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentpost.protocol.errors import InvalidInput
from agentpost.store import checks
from agentpost.store.envelopes import EnvelopeStore

_TAKE = "SELECT agentpost.take_arrivals(%s, %s, %s, %s::text[])"
_PRUNE = "SELECT agentpost.prune_event_handled(make_interval(secs => %s))"

#: how long a mark is kept: far longer than any stranded event waits for a later run
DEFAULT_HANDLED_KEEP = 30 * 86400.0
#: a run key is dag_id/run_id (Airflow allows 250 characters each)
_KEY_LIMIT = 512


def _key(value: object, what: str) -> str:
    text = checks.text(value, what, limit=_KEY_LIMIT)
    if not text.strip():
        raise InvalidInput(f"{what} must not be empty")
    return text


def take_arrivals(store: EnvelopeStore, consumer: str, watcher: str, run_key: str,
                  own: Iterable[str]) -> list[str]:
    """Take for run `run_key` of `consumer` (a DAG id) its `own` arrival ids not taken by
    another run, plus every arrival `watcher` claimed that no run of `consumer` took yet;
    return the ids the run holds, in arrival order (a retry gets the same ones again).

    An unknown watcher sweeps nothing. Bad names or ids raise `InvalidInput`, an unknown
    envelope `NotFound`; either way nothing is taken."""
    consumer = _key(consumer, "consumer")
    run_key = _key(run_key, "run key")
    watcher = checks.ref(watcher, "watcher")
    ids = [checks.ref(i, "envelope id") for i in checks.strings(own, "arrival ids")]
    return list(store.db.scalar(_TAKE, (consumer, watcher, run_key, ids)) or ())


def prune_event_handled(store: EnvelopeStore, keep: float = DEFAULT_HANDLED_KEEP) -> int:
    """Delete marks taken more than `keep` seconds ago (nothing older is swept again).
    Returns how many went."""
    if isinstance(keep, bool) or not isinstance(keep, int | float) or not keep > 0:
        raise InvalidInput("keep must be a positive number of seconds")
    return store.db.scalar(_PRUNE, (float(keep),))


__all__ = ["DEFAULT_HANDLED_KEEP", "prune_event_handled", "take_arrivals"]
