"""An event-driven agent: a DAG that runs when envelopes arrive in an agent's inbox.

The DAG is scheduled on an Asset whose watcher is `InboxEventTrigger`: every envelope that
arrives in the inbox becomes one asset event (claimed in the store, so never reported
twice, docs/airflow.md "Sensors and triggers"), and the scheduler starts a run for it.
The trigger paces its events (`min_interval`) so that each arrival normally gets its own
run. Airflow may still put several asset events into one run, or strand one: stored while
the DAG's queued run was being created, it is newer than that run's window and would wait
for the next arrival's run (forever, if none comes). So a run handles its own arrivals
plus every arrival its watcher has claimed that no run of this DAG has handled yet: the
stranded one's claim is in the store before the stranding run's task starts. Which run
took each arrival is recorded in the store (`agentpost.store.event_handled`), so each
arrival is handled by exactly one run of the DAG (a retry of that run gets it again); the
run whose window finally holds a taken arrival skips it. So a run that fails for good keeps
the arrivals it took, swept ones included: clear it (same run id) to handle them again.
Which-run marks are kept 30 days (`maintain`): a stranded event coming back in a run's
window after its mark was pruned would be handled twice.

A run started by hand handles the arrivals its conf names, ``{"arrivals": [payload, ...]}``
(each at least ``{"envelope_id": ...}``), taken the same way (one another run took is
skipped): to replay the one run a triggerer killed between claim and event loses, or where
no triggerer runs at all (`dag.test()`: the headless demo hands it the event the trigger
yielded). A DAG whose asset has no `InboxEventTrigger` handles exactly its own arrivals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from agentpost.hooks import AgentpostHook
from agentpost.protocol.leases import workspace_of
from agentpost.store.event_handled import take_arrivals
from agentpost.triggers.events import InboxEventTrigger, arrival

#: what a handler gets: the arrival (envelope id and routing fields) and the open store
Handler = Callable[[dict[str, Any], Any], Any]


def inbox_asset(workspace_id: str, *, name: str | None = None, watcher: str | None = None,
                agentpost_conn_id: str = AgentpostHook.default_conn_name,
                poll_interval: float = 30.0) -> Asset:
    """The Asset that gets an event per envelope arriving in `workspace_id`'s inbox."""
    ws = workspace_of(workspace_id)
    asset_name = name or f"agentpost-inbox-{ws}"
    trigger = InboxEventTrigger(ws, agentpost_conn_id=agentpost_conn_id,
                                watcher=watcher or f"asset:{asset_name}",
                                poll_interval=poll_interval)
    return Asset(name=asset_name, uri=f"agentpost://inbox/{ws}",
                 watchers=[AssetWatcher(name=f"{asset_name}-watcher", trigger=trigger)])


def arrivals(triggering_asset_events: Mapping[Any, Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The arrivals a run was started for: the payloads InboxEventTrigger put in the asset
    events' extra, oldest first (events from elsewhere are skipped)."""
    found = []
    for events in (triggering_asset_events or {}).values():
        for event in events:
            payload = (getattr(event, "extra", None) or {}).get("payload")
            if isinstance(payload, dict) and "envelope_id" in payload:
                found.append(payload)
    return sorted(found, key=lambda p: (p.get("delivered_at") or "", p["envelope_id"]))


def manual_arrivals(conf: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The arrivals a manually started run was given in its conf (``arrivals``), in order;
    entries without an ``envelope_id`` are refused, not skipped: a typo must not pass as
    "nothing arrived"."""
    given = (conf or {}).get("arrivals") or []
    if not isinstance(given, list) or not all(isinstance(a, dict) and a.get("envelope_id")
                                              for a in given):
        raise ValueError("conf 'arrivals' must be a list of {'envelope_id': ...} payloads")
    return list(given)


def asset_watcher(asset: Any) -> str | None:
    """The watcher name of `asset`'s `InboxEventTrigger`, None if it has none."""
    for watcher in getattr(asset, "watchers", None) or ():
        trigger = getattr(watcher, "trigger", None)
        if isinstance(trigger, InboxEventTrigger):
            return trigger.watcher
    return None


def held_arrivals(store: Any, dag_run: Any, watcher: str,
                  todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The arrivals this run holds in the store: those of `todo` no other run of the DAG
    took, plus `watcher`'s claimed ones no run took yet (built from the envelope), in
    arrival order; a retry of the run gets the same ones."""
    given = {a["envelope_id"]: a for a in todo}
    held = take_arrivals(store, dag_run.dag_id, watcher,
                         f"{dag_run.dag_id}/{dag_run.run_id}", list(given))
    return [given.get(i) or arrival(store.get(i), watcher) for i in held]


def reactive_agent_dag(dag_id: str, workspace_id: str, handler: Handler | None = None, *,
                       agentpost_conn_id: str = AgentpostHook.default_conn_name,
                       asset: Asset | None = None, poll_interval: float = 30.0,
                       start_date: datetime | None = None, **dag_kwargs: Any) -> DAG:
    """A DAG that runs when envelopes arrive in `workspace_id`'s inbox. Its task
    ``handle_arrivals`` calls ``handler(arrival, store)`` for each arrival of the run (the
    envelope itself: ``store.get(arrival["envelope_id"])``) and returns
    ``[{"envelope_id", "result"}]``; without a handler it returns the arrivals. A run
    without asset events takes its arrivals from its conf (`manual_arrivals`). The run's
    arrivals are those it holds in the store (`held_arrivals`): its own that no other run
    took, plus what the asset's watcher claimed that no run took yet.

    :param asset: the Asset to schedule on (default `inbox_asset(workspace_id)`).
    :param dag_kwargs: passed to the DAG (tags, default_args, max_active_runs, ...).
    """
    watched = asset or inbox_asset(workspace_id, agentpost_conn_id=agentpost_conn_id,
                                   poll_interval=poll_interval)
    watcher = asset_watcher(watched)
    dag_kwargs.setdefault("catchup", False)
    with DAG(dag_id, schedule=[watched], start_date=start_date or datetime(2026, 1, 1),
             **dag_kwargs) as dag:

        @task(task_id="handle_arrivals")
        def handle_arrivals(triggering_asset_events: Any = None,
                            dag_run: Any = None) -> list[dict[str, Any]]:
            todo = arrivals(triggering_asset_events) or manual_arrivals(
                getattr(dag_run, "conf", None))
            if handler is None and watcher is None:
                return todo
            with AgentpostHook(agentpost_conn_id=agentpost_conn_id).get_store() as store:
                if watcher is not None:
                    todo = held_arrivals(store, dag_run, watcher, todo)
                if handler is None:
                    return todo
                return [{"envelope_id": a["envelope_id"], "result": handler(a, store)}
                        for a in todo]

        handle_arrivals()
    return dag
