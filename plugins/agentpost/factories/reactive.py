"""An event-driven agent: a DAG that runs when envelopes arrive in an agent's inbox.

The DAG is scheduled on an Asset whose watcher is `InboxEventTrigger`: every envelope that
arrives in the inbox becomes one asset event (claimed in the store, so never reported
twice, docs/airflow.md "Sensors and triggers"), and the scheduler starts a run for it.
The trigger paces its events (`min_interval`) so that each arrival normally gets its own
run; a run still handles every arrival in its ``triggering_asset_events`` (Airflow may put
several asset events into one run, or leave one stored while a run was being created to the
next run).

A run started by hand handles the arrivals its conf names, ``{"arrivals": [payload, ...]}``
(each at least ``{"envelope_id": ...}``): to handle an arrival again, to replay the one run
a triggerer killed between claim and event loses, or where no triggerer runs at all
(`dag.test()`: the headless demo hands it the event the trigger yielded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from agentpost.hooks import AgentpostHook
from agentpost.protocol.leases import workspace_of
from agentpost.triggers.events import InboxEventTrigger

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


def reactive_agent_dag(dag_id: str, workspace_id: str, handler: Handler | None = None, *,
                       agentpost_conn_id: str = AgentpostHook.default_conn_name,
                       asset: Asset | None = None, poll_interval: float = 30.0,
                       start_date: datetime | None = None, **dag_kwargs: Any) -> DAG:
    """A DAG that runs when envelopes arrive in `workspace_id`'s inbox. Its task
    ``handle_arrivals`` calls ``handler(arrival, store)`` for each arrival of the run (the
    envelope itself: ``store.get(arrival["envelope_id"])``) and returns
    ``[{"envelope_id", "result"}]``; without a handler it returns the arrivals. A run
    without asset events takes its arrivals from its conf (`manual_arrivals`).

    :param asset: the Asset to schedule on (default `inbox_asset(workspace_id)`).
    :param dag_kwargs: passed to the DAG (tags, default_args, max_active_runs, ...).
    """
    watched = asset or inbox_asset(workspace_id, agentpost_conn_id=agentpost_conn_id,
                                   poll_interval=poll_interval)
    dag_kwargs.setdefault("catchup", False)
    with DAG(dag_id, schedule=[watched], start_date=start_date or datetime(2026, 1, 1),
             **dag_kwargs) as dag:

        @task(task_id="handle_arrivals")
        def handle_arrivals(triggering_asset_events: Any = None,
                            dag_run: Any = None) -> list[dict[str, Any]]:
            todo = arrivals(triggering_asset_events) or manual_arrivals(
                getattr(dag_run, "conf", None))
            if handler is None:
                return todo
            with AgentpostHook(agentpost_conn_id=agentpost_conn_id).get_store() as store:
                return [{"envelope_id": a["envelope_id"], "result": handler(a, store)}
                        for a in todo]

        handle_arrivals()
    return dag
