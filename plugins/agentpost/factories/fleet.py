"""One DAG per agent manifest of a fleet file (Markspace §13.2, §14).

- a source agent (``schedule: 5m``) runs every interval: ``schedule=timedelta(...)``, one
  active run at a time and no catchup, so activations never overlap and a missed interval
  is not made up (P56);
- a reactive agent (``schedule: reactive``) runs when its inbox has work: the DAG is
  scheduled on an Asset whose AssetWatcher runs ``agentpost.triggers.InboxEventTrigger``;
- an agent without a schedule runs on demand (a manual trigger).

Each activation is one task, ``activate``, that opens the store through the hook and calls
the agent's code with an `AgentContext`: the store, the fleet's mark space, a Guard over it,
the agent's workspace, its Markspace Agent (a stable id, the same in every process) and its
manifest. The code is a function ``fn(ctx) -> JSON-able`` named in the manifest as
``module:function`` (imported when the DAG is built, so a missing module fails the parse;
the fleet file's directory is on the path) or
given to the factory in Python (``callables={"driver-a": park}``), which wins. Its return
value is the task's XCom.

An agent whose manifest has an ``llm:`` block runs a language model instead of code: its
task, ``agent``, is common-ai's ``AgentOperator`` (the ``ai`` extra) with one toolset,
`agentpost.ai.AgentpostToolset`, seated as the agent's workspace and, when the fleet has
scopes, as its Markspace agent in the fleet's mark space. It is scheduled exactly as a code
agent is. ``agent_operator_class`` replaces AgentOperator by a subclass of it (a test's
scripted model, a deployment's own defaults).

Nothing touches the store at parse time. A fleet that is wrong where the file alone can tell
(an unknown role, type, workspace or scope) fails when the DAG file is parsed; what only the
store can tell (the fleet was never applied) fails the task with the store's reason.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentpost.factories.common import (
    DEFAULT_CONN_ID,
    FleetLike,
    dag_kwargs,
    fleet_of,
    store_errors,
)
from agentpost.fleet.model import AgentDef, Fleet, FleetError

if TYPE_CHECKING:
    from airflow.sdk import DAG, Asset

    from agentpost.marks.core import Agent, AgentManifest, Mark
    from agentpost.marks.guard import Guard
    from agentpost.marks.postgres import PostgresMarkSpace
    from agentpost.protocol.models import SendResult
    from agentpost.store import EnvelopeStore


@dataclass
class AgentContext:
    """What one activation of an agent works with; built by the `activate` task."""

    store: EnvelopeStore
    space: PostgresMarkSpace
    guard: Guard
    workspace_id: str | None
    manifest: AgentManifest
    agent: Agent
    spec: AgentDef
    fleet: Fleet
    #: the Airflow task context (params, run ids, ...)
    airflow: Mapping[str, Any] = field(default_factory=dict)
    #: a reactive agent's triggering inbox events (their payloads); empty otherwise
    events: list[Any] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        """The agent's ``config`` from the fleet file."""
        return self.spec.config

    def send(self, type: str, to: str, content: Any, **kwargs: Any) -> SendResult:
        """Send an envelope from the agent's workspace (a rejection is returned, not
        raised: the agent decides)."""
        if self.workspace_id is None:
            raise FleetError(self.fleet.source, f"agent {self.spec.name!r}",
                             "has no workspace to send from")
        return self.store.send(self.workspace_id, to, type, content, **kwargs)

    def watched(self) -> list[Mark]:
        """Marks queued for the agent by its watch-pattern inputs since it last took them."""
        return self.space.get_watched_marks(self.agent)


AgentCallable = Callable[[AgentContext], Any]


def agent_dag(fleet: FleetLike, name: str, *, fn: AgentCallable | None = None,
              agentpost_conn_id: str = DEFAULT_CONN_ID, dag_id: str | None = None,
              agent_operator_class: type[Any] | None = None, **dag_args: Any) -> DAG:
    """The DAG of agent `name` of `fleet` (a Fleet or the path of its file). `dag_args`
    go to the DAG (default_args, tags, start_date, ...). An LLM agent's task is an
    AgentOperator, or `agent_operator_class` (a subclass of it) when given."""
    from airflow.sdk import DAG, task

    fleet = fleet_of(fleet)
    spec = fleet.agent_def(name)
    if spec.llm is not None and fn is not None:
        raise FleetError(fleet.source, f"agent {spec.name!r}", "is an LLM agent (llm:): it "
                         "runs its model, not a callable given to the factory")
    operator = _operator_class(fleet, spec, agent_operator_class) if spec.llm else None
    code = None if spec.llm else fn or _import_callable(fleet, spec)
    tags = ["agentpost", "agent", *(["llm"] if spec.llm else [])]
    with DAG(dag_id=dag_id or f"agent_{fleet.name}_{spec.name}",
             schedule=_schedule(fleet, spec, agentpost_conn_id),
             description=f"agent {spec.name} of fleet {fleet.name} ({spec.kind}"
                         f"{', LLM' if spec.llm else ''})",
             **dag_kwargs(**{"tags": tags, **dag_args})) as dag:
        if operator is not None:
            _llm_task(fleet, spec, operator, agentpost_conn_id)
        else:
            assert code is not None
            task(task_id="activate")(_activation(fleet, spec, code, agentpost_conn_id))()
    return dag


def agent_dags(fleet: FleetLike, *, callables: Mapping[str, AgentCallable] | None = None,
               kinds: Iterable[str] | None = None, **kwargs: Any) -> dict[str, DAG]:
    """The DAGs of every agent of `fleet` (of the given `kinds`: source, reactive, manual),
    by dag_id. Assign them to module globals (or just build them in a DAG file). `kwargs`
    go to `agent_dag` (agentpost_conn_id, agent_operator_class, DAG arguments)."""
    fleet = fleet_of(fleet)
    wanted = None if kinds is None else set(kinds)
    callables = callables or {}
    unknown = sorted(set(callables) - {a.name for a in fleet.agents})
    if unknown:
        raise FleetError(fleet.source, f"agent {unknown[0]!r}",
                         "a callable was given for an agent the fleet does not declare")
    dags = [agent_dag(fleet, spec.name, fn=callables.get(spec.name), **kwargs)
            for spec in fleet.agents if wanted is None or spec.kind in wanted]
    return {dag.dag_id: dag for dag in dags}


# -- LLM agents: common-ai's AgentOperator with the agent's seat as its toolset ----------------

AI_EXTRA = "pip install 'airflow-agentpost[ai]'"


def _operator_class(fleet: Fleet, spec: AgentDef, given: type[Any] | None) -> type[Any]:
    """AgentOperator (imported only for an LLM agent: fleets of code agents need no ai
    extra), or `given`, which must be a subclass of it."""
    where = f"agent {spec.name!r}"
    try:
        from airflow.providers.common.ai.operators.agent import AgentOperator

        import agentpost.ai  # noqa: F401  (its own ImportError names the extra too)
    except ImportError as exc:
        raise ImportError(f"{fleet.source}: {where} is an LLM agent (llm:), which needs "
                          f"Airflow's common-ai provider and pydantic-ai: {AI_EXTRA} "
                          f"({exc})") from exc
    if given is None:
        return AgentOperator
    if not (isinstance(given, type) and issubclass(given, AgentOperator)):
        raise TypeError(f"agent_operator_class must be AgentOperator or a subclass of it, "
                        f"not {given!r}")
    return given


def llm_toolset(fleet: Fleet, spec: AgentDef, conn_id: str = DEFAULT_CONN_ID) -> Any:
    """The AgentpostToolset of an LLM agent: its workspace, and, when the fleet has scopes,
    the fleet's mark space with its scopes and the agent's Markspace Agent (the same id and
    write permissions as a code agent of that name)."""
    from agentpost.ai import AgentpostToolset

    assert spec.llm is not None and spec.workspace is not None  # checked with the fleet
    marks = bool(fleet.scopes)
    return AgentpostToolset(
        spec.workspace, agentpost_conn_id=conn_id,
        space=fleet.space if marks else None, scopes=fleet.scopes if marks else (),
        agent=fleet.agent(spec.name) if marks else None,
        tools=list(spec.llm.tools) if spec.llm.tools is not None else None,
        lease_ttl=float(spec.llm.lease_ttl), max_retries=spec.llm.max_retries,
        command_approval=spec.llm.command_approval)


def _llm_task(fleet: Fleet, spec: AgentDef, operator: type[Any], conn_id: str) -> Any:
    llm = spec.llm
    assert llm is not None
    limits = llm.usage_limits.model_dump(exclude_none=True) if llm.usage_limits else None
    timeout = (timedelta(seconds=llm.approval_timeout) if llm.approval_timeout is not None
               else None)
    return operator(
        task_id="agent", prompt=llm.prompt, system_prompt=llm.system_prompt,
        llm_conn_id=llm.llm_conn_id, model_id=llm.model_id,
        toolsets=[llm_toolset(fleet, spec, conn_id)], usage_limits=limits or None,
        tool_approval_timeout=timeout,
        doc_md=f"LLM agent **{spec.name}** of fleet `{fleet.name}`, seated as workspace "
               f"`{spec.workspace}`" + (f" in mark space `{fleet.space}`"
                                        if fleet.scopes else "") + ".")


def _import_callable(fleet: Fleet, spec: AgentDef) -> AgentCallable:
    where = f"agent {spec.name!r}"
    if spec.callable is None:
        raise FleetError(fleet.source, where, "names no callable (module:function) and the "
                         "factory was given none")
    module_name, _, attr = spec.callable.partition(":")
    _beside_the_file(fleet)
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise FleetError(fleet.source, where, f"cannot load {spec.callable}: {exc}") from None
    if not callable(found):
        raise FleetError(fleet.source, where, f"{spec.callable} is not callable")
    return found


def _beside_the_file(fleet: Fleet) -> None:
    """Agent code may live next to its fleet file (in the DAGs folder, usually on sys.path
    anyway): that directory goes at the end of sys.path, shadowing nothing."""
    home = Path(fleet.source).resolve().parent
    if Path(fleet.source).is_file() and str(home) not in sys.path:
        sys.path.append(str(home))


def _schedule(fleet: Fleet, spec: AgentDef, conn_id: str) -> Any:
    if spec.kind == "source":
        return timedelta(seconds=spec.interval or 0)
    if spec.kind == "reactive":
        from airflow.sdk import AssetAny

        # any of its inboxes wakes it (a list would wait for all of them)
        return AssetAny(*(inbox_asset(fleet, spec, inbox, conn_id) for inbox in spec.inboxes))
    return None


# -- reactive agents: the lead wires InboxEventTrigger at merge --------------------------------


def inbox_asset(fleet: Fleet, spec: AgentDef, inbox: str, conn_id: str) -> Asset:
    """The Asset a reactive agent is scheduled on: the same inbox asset as the reactive
    factory's (its watcher runs InboxEventTrigger, which claims each arrival it reports)."""
    from agentpost.factories.reactive import inbox_asset as reactive_inbox

    return reactive_inbox(inbox, agentpost_conn_id=conn_id)


# -- the activation task --------------------------------------------------------------------------


def _activation(fleet: Fleet, spec: AgentDef, code: AgentCallable,
                conn_id: str) -> Callable[[], Any]:
    def activate() -> Any:
        """One activation of the agent: open the store, build its context, run its code."""
        from airflow.sdk import get_current_context

        context = get_current_context()
        with store_errors(f"agent {spec.name}"):
            return run_agent(fleet, spec.name, code, conn_id, airflow=context,
                             events=_events(context))

    activate.__name__ = f"activate_{spec.name}"
    return activate


def run_agent(fleet: Fleet, name: str, code: AgentCallable,
              conn_id: str = DEFAULT_CONN_ID, **extra: Any) -> Any:
    """Open the store through the hook, check the agent's workspace exists there (else
    NotFound, with a hint), and run `code` with the agent's context."""
    from agentpost.factories.metrics import AirflowStatsSink
    from agentpost.hooks import AgentpostHook
    from agentpost.marks.guard import Guard
    from agentpost.marks.postgres import PostgresMarkSpace
    from agentpost.protocol.errors import NotFound

    spec = fleet.agent_def(name)
    agent = fleet.agent(name)
    with AgentpostHook(conn_id).get_store() as store:
        if spec.workspace is not None:
            try:
                store.workspace(spec.workspace)
            except NotFound as exc:
                raise NotFound(f"{exc} (apply the fleet first: agentpost fleet apply "
                               f"{fleet.source})") from None
        space = PostgresMarkSpace(dsn=store.dsn, scopes=fleet.scopes, space=fleet.space,
                                  pool_size=1)
        try:
            guard = Guard(space, telemetry=AirflowStatsSink())  # verdicts in Airflow's metrics
            ctx = AgentContext(store=store, space=space, guard=guard,
                               workspace_id=spec.workspace, manifest=agent.manifest,
                               agent=agent, spec=spec, fleet=fleet, **extra)
            return code(ctx)
        finally:
            space.close()


def _events(context: Mapping[str, Any]) -> list[Any]:
    """The arrivals that triggered this run (reactive agents), oldest first."""
    from agentpost.factories.reactive import arrivals

    return arrivals(context.get("triggering_asset_events"))


__all__ = ["AI_EXTRA", "AgentCallable", "AgentContext", "agent_dag", "agent_dags",
           "inbox_asset", "llm_toolset", "run_agent"]
