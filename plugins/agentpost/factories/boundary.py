"""Resolution boundaries as a DAG (Markspace §6.2.1 phase 2 and 3, P12, P16, P17).

A deferred scope collects intents until a boundary decides. `boundary_dag` runs one on a
schedule (P16: no intent waits for its TTL) and on demand: a manual trigger with params
``scopes`` (a subset of the fleet's deferred scopes) and ``resource`` (one resource only).
The task builds a `PostgresMarkSpace` of the fleet's space and a `Guard`, and calls
`Guard.resolve_all_deferred` (or `resolve_deferred` per scope for one resource). The
verdicts are durable in the space (``agentpost.mark_verdicts``, written in the boundary's
own lock transaction), every insert NOTIFYs ``agentpost_verdict`` (sql/0040), and agents
learn theirs by asking the guard again (`pre_action` or `execute` with the same intent).
The XCom is a summary: per (scope, resource), the winner and each agent's verdict, by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from agentpost.factories.common import (
    DEFAULT_CONN_ID,
    FleetLike,
    dag_kwargs,
    fleet_of,
    store_errors,
)
from agentpost.fleet.model import Fleet, FleetError
from agentpost.protocol.errors import InvalidInput

if TYPE_CHECKING:
    from airflow.sdk import DAG


def boundary_dag(fleet: FleetLike, *, schedule: Any = timedelta(minutes=1),
                 agentpost_conn_id: str = DEFAULT_CONN_ID, dag_id: str | None = None,
                 **dag_args: Any) -> DAG:
    """The boundary DAG of `fleet`'s deferred scopes, run every `schedule` (a timedelta, a
    cron string, or None for on demand only) and by a manual trigger with params."""
    from airflow.sdk import DAG, Param, get_current_context, task

    fleet = fleet_of(fleet)
    deferred = [s.name for s in fleet.deferred_scopes()]
    if not deferred:
        raise FleetError(fleet.source, "scopes", "no scope is deferred: a boundary DAG would "
                         "have nothing to resolve")
    params = {
        "scopes": Param(deferred, type="array", items={"type": "string", "enum": deferred},
                        description="the deferred scopes to resolve"),
        "resource": Param(None, type=["null", "string"],
                          description="resolve this resource only (default: every resource "
                                      "with pending intents)"),
    }
    with DAG(dag_id=dag_id or f"boundary_{fleet.name}", schedule=schedule, params=params,
             description=f"resolution boundary of {', '.join(deferred)} ({fleet.name})",
             **dag_kwargs(**{"tags": ["agentpost", "boundary"], **dag_args})) as dag:

        @task(task_id="resolve")
        def resolve() -> list[dict[str, Any]]:
            """Resolve every pending (scope, resource) of the chosen scopes; the verdicts
            are stored (and announced) by the space."""
            from agentpost.hooks import AgentpostHook

            params = get_current_context()["params"]
            with store_errors(f"boundary of {fleet.name}"):
                dsn = AgentpostHook(agentpost_conn_id).get_dsn()
                return run_boundary(dsn, fleet, params.get("scopes"), params.get("resource"))

        resolve()
    return dag


def run_boundary(dsn: str, fleet: Fleet, scopes: Iterable[str] | None = None,
                 resource: str | None = None) -> list[dict[str, Any]]:
    """One boundary over `fleet`'s deferred `scopes` (default: all) in its mark space, for
    every resource with pending intents or for `resource` only. Returns per (scope,
    resource) the winner's name (None: nobody won) and every agent's verdict."""
    from agentpost.factories.metrics import AirflowStatsSink, boundary_timer
    from agentpost.marks.guard import Guard
    from agentpost.marks.postgres import PostgresMarkSpace

    chosen = _chosen(fleet, scopes)
    # Only the chosen scopes are registered: resolve_all_deferred skips the others.
    space = PostgresMarkSpace(dsn=dsn, scopes=chosen, space=fleet.space, pool_size=1)
    try:
        guard = Guard(space, telemetry=AirflowStatsSink())
        with boundary_timer(len(chosen)):
            if resource is None:
                outcome = guard.resolve_all_deferred()
            else:
                outcome = {(s.name, resource): {
                    agent_id: decision.verdict
                    for agent_id, decision in guard.resolve_deferred(s.name, resource).items()}
                    for s in chosen}
    finally:
        space.close()
    names = {fleet.agent(a.name).id: a.name for a in fleet.agents}
    return [
        {"scope": scope, "resource": res,
         "winner": next((names.get(a, str(a)) for a, v in verdicts.items()
                         if v.value == "allow"), None),
         "verdicts": {names.get(a, str(a)): v.value for a, v in verdicts.items()}}
        for (scope, res), verdicts in sorted(outcome.items())
    ]


def _chosen(fleet: Fleet, scopes: Iterable[str] | None) -> list[Any]:
    deferred = {s.name: s for s in fleet.deferred_scopes()}
    names = list(deferred) if scopes is None else list(scopes)
    if not names:
        raise InvalidInput("no scope to resolve")
    for name in names:
        if name not in deferred:
            raise InvalidInput(f"{name!r} is not a deferred scope of fleet {fleet.name!r} "
                               f"(its deferred scopes: {', '.join(deferred)})")
    return [deferred[n] for n in names]


__all__ = ["boundary_dag", "run_boundary"]
