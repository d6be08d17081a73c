"""The route DAG factory: an Asya route (docs/asya.md) as a DAG, each actor a task, fan-out
by dynamic task mapping.

``route_dag("enrich", [("fetch", fetch), ("split", split), ("store", store)])`` builds::

    setup >> start >> receive_fetch >> fetch[*] >> receive_split >> split[*]
          >> receive_store >> store[*] >> finish

- ``setup`` creates the actor workspaces (idempotent, `RouteStore.setup`);
- ``start`` starts one routed envelope per payload (``dag_run.conf["payloads"]``, else the
  factory's `payloads`), with ids derived from the DAG run, so a retried start starts nothing
  twice; its XCom is the list of ids;
- ``receive_<actor>`` leases every hop waiting at the actor (up to `max_hops`) and returns
  one JSON object per hop; ``<actor>`` is mapped over them (``.expand``): one task instance
  per hop, so an actor that fans out to n envelopes gives the next actor n mapped tasks. Each
  calls the actor's handler with the payload and completes the hop in one transaction
  (`RouteStore.complete`): a dict advances, a list fans out, None or [] ends at happy-end, an
  exception ends at error-end (and fails that task instance, with the error);
- ``finish`` takes the envelopes out of the end actors and returns each started envelope's
  family status; it fails when one ended at error-end (`fail_on_error`).

Every receive and finish task runs whatever its upstream did (trigger rule ``all_done``),
so one failed hop does not stop the others. A retried hop task whose hop has already moved on
does nothing. Runs of one route DAG share its actors' inboxes, so the factory sets
``max_active_runs=1``; two runs at once would handle each other's hops.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task
from airflow.sdk.exceptions import AirflowFailException

from agentpost.operators.common import open_store
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import Lease
from agentpost.protocol.routes import END_ACTORS, Route
from agentpost.store.routes import GATEWAY, Hop, RouteStore, decode, wacp_id

Handler = Callable[[Any], Any]
#: the default lease of a hop: until its mapped task runs
DEFAULT_TTL = 300.0
DEFAULT_CONN = "agentpost_default"


Actors = Sequence[tuple[str, Handler]] | Mapping[str, Handler]


def _actors(actors: Actors) -> list[tuple[str, Handler]]:
    """Checked (name, handler) pairs in route order; bad ones fail when the DAG is parsed."""
    pairs = list(actors.items()) if isinstance(actors, Mapping) else list(actors)
    if not pairs:
        raise InvalidInput("a route needs at least one actor")
    names = [name for name, _ in pairs]
    Route(actors=tuple(names), current=0)  # the route's own name rules
    if len(set(names)) < len(names):
        raise InvalidInput("an actor comes twice in the route: one task per actor")
    for name, handler in pairs:
        if not callable(handler):
            raise InvalidInput(f"the handler of actor {name!r} is not callable")
    return pairs


def root_ids(dag_id: str, run_id: str, count: int) -> list[str]:
    """The ids of a run's routed envelopes: the same on every try of ``start``."""
    digest = hashlib.sha256(f"{dag_id}/{run_id}".encode()).hexdigest()[:20]
    return [f"r{digest}_{i}" for i in range(count)]


def hop_json(hop: Hop) -> dict[str, Any]:
    """A leased hop as XCom carries it to its mapped task."""
    lease = hop.lease
    return {"token": lease.token, "envelope_id": lease.envelope.id, "attempt": lease.attempt,
            "expires_at": lease.expires_at.isoformat(), "holder": lease.holder,
            "id": hop.envelope.id, "current": hop.envelope.route.current}


def _hop(store: Any, data: dict[str, Any]) -> Hop:
    lease = Lease(token=data["token"], envelope=store.get(data["envelope_id"]),
                  attempt=data["attempt"], expires_at=data["expires_at"],
                  holder=data["holder"])
    return Hop(lease, decode(lease))


def route_dag(dag_id: str, actors: Actors, *,
              payloads: Sequence[Any] | Callable[[], Sequence[Any]] = (),
              max_hops: int = 100, ttl: float = DEFAULT_TTL, fail_on_error: bool = True,
              agentpost_conn_id: str = DEFAULT_CONN, schedule: Any = None,
              start_date: datetime = datetime(2026, 1, 1), **dag_kwargs: Any) -> DAG:
    """A DAG that routes payloads through `actors` (name -> handler(payload), in order).

    :param payloads: the default payloads of a run (a run's ``conf["payloads"]`` wins), or a
        callable returning them at run time.
    :param max_hops: at most this many hops per actor per run (one mapped task each).
    :param ttl: seconds a hop's lease lasts, until its mapped task completes it.
    :param fail_on_error: fail ``finish`` when an envelope ended at error-end.
    """
    pairs = _actors(actors)
    names = [name for name, _ in pairs]
    if isinstance(max_hops, bool) or not isinstance(max_hops, int) or max_hops < 1:
        raise InvalidInput("max_hops must be a positive whole number")
    dag_kwargs.setdefault("max_active_runs", 1)
    dag_kwargs.setdefault("catchup", False)
    with DAG(dag_id, schedule=schedule, start_date=start_date, **dag_kwargs) as dag:

        @task(task_id="setup")
        def setup() -> list[str]:
            with open_store(agentpost_conn_id, "setup") as store:
                return RouteStore(store).setup(names)

        @task(task_id="start")
        def start(dag_run: Any = None, ti: Any = None) -> list[str]:
            conf = (dag_run.conf or {}) if dag_run is not None else {}
            items = conf.get("payloads")
            if items is None:
                items = payloads() if callable(payloads) else payloads
            ids = root_ids(ti.dag_id, ti.run_id, len(items))
            with open_store(agentpost_conn_id, "start") as store:
                RouteStore(store).start_many(
                    [{"id": i, "route": {"actors": names, "current": 0}, "payload": p}
                     for i, p in zip(ids, items, strict=True)], sender=GATEWAY)
            return ids

        def receive(actor: str) -> Any:
            @task(task_id=f"receive_{actor}", trigger_rule="all_done")
            def leased() -> list[dict[str, Any]]:
                with open_store(agentpost_conn_id, f"receive_{actor}") as store:
                    hops = RouteStore(store).receive(actor, max=max_hops, ttl=ttl)
                return [hop_json(h) for h in hops]
            return leased()

        def handle(actor: str, handler: Handler, hops: Any) -> Any:
            @task(task_id=actor)
            def hop_task(hop: dict[str, Any]) -> str:
                with open_store(agentpost_conn_id, actor) as store:
                    routes = RouteStore(store)
                    view = routes.get(hop["id"])
                    if view.route.ended or view.route.current != hop["current"]:
                        return f"{hop['id']} has moved on (an earlier try handled it)"
                    leased = _hop(store, hop)
                    try:
                        result, error = handler(leased.envelope.payload), None
                    except Exception as exc:
                        result = {"error": type(exc).__name__, "message": str(exc)[:1000]}
                        error = exc
                    out = routes.complete(actor, leased.lease, leased.envelope, result)
                if error is not None:
                    raise AirflowFailException(f"{actor}: envelope {hop['id']} went to "
                                               f"error-end: {result['error']}: "
                                               f"{result['message']}") from error
                return f"{hop['id']} -> {[wacp_id(e) for e in out.envelopes]}"
            return hop_task.expand(hop=hops)

        @task(task_id="finish", trigger_rule="all_done")
        def finish(started: list[str]) -> dict[str, str]:
            with open_store(agentpost_conn_id, "finish") as store:
                routes = RouteStore(store)
                for end in sorted(END_ACTORS):
                    while hops := routes.finish_and_receive(end, [], max=max_hops, ttl=ttl):
                        routes.finish_many(hops)
                statuses = {root: routes.family(root).status.value for root in started or []}
            failed = sorted(r for r, s in statuses.items() if s != "succeeded")
            if failed and fail_on_error:
                raise AirflowFailException(f"finish: route families not succeeded: "
                                           f"{ {r: statuses[r] for r in failed} }")
            return statuses

        started = start()
        setup() >> started
        previous: Any = started
        for name, handler in pairs:
            hops = receive(name)
            previous >> hops
            previous = handle(name, handler, hops)
        done = finish(started)
        previous >> done
    return dag


__all__ = ["hop_json", "root_ids", "route_dag"]
