"""`AgentpostToolset`: one agentpost seat as tools of an Airflow agent (``AgentOperator``,
``@task.agent``).

The seat (workspace, mark space, agent) is fixed by the DAG; the model only chooses which
tool to call and with what. Each call runs `agentpost.tools.AgentTools` in a worker thread
(`run_blocking`); a refusal (`ToolRefused`) reaches the model as `ModelRetry` with its reason,
anything else (the store away, a database failure) fails the task. The run recorded with
every call is the task instance (`run_info`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from airflow.providers.common.ai.utils.toolset_base import AirflowToolset
from pydantic import BaseModel
from pydantic_ai.exceptions import ApprovalRequired, ModelRetry
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset

from agentpost.ai import approval
from agentpost.hooks import AgentpostHook
from agentpost.marks import Agent, MarkType, Scope
from agentpost.tools import TOOLS, AgentTools, RunInfo, ToolRefused

if TYPE_CHECKING:
    from pydantic_ai import RunContext


class _ArgsValidator:
    """Validates a tool's arguments with its model and hands on plain JSON (what
    `execute_tool` and tool logging expect); a ValidationError goes back to the model."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def validate_python(self, input: Any, **_: Any) -> dict[str, Any]:
        return self.model.model_validate(input).model_dump(mode="json")

    def validate_json(self, input: str | bytes | bytearray, **_: Any) -> dict[str, Any]:
        return self.model.model_validate_json(input).model_dump(mode="json")


def run_info(context: Any = None) -> RunInfo:
    """The run recorded with each call: the running task instance (dag_id, task_id,
    run_id, map_index, try_number), its label ``af:<dag>:<task>:<run>[:<map>]`` the lease
    holder; outside a task, a ``python`` run."""
    if context is None:
        try:
            from airflow.sdk import get_current_context

            context = get_current_context()
        except Exception:  # no task is running: a plain run
            return RunInfo(by="python", ref="python")
    ti = context["ti"]
    map_index = getattr(ti, "map_index", None)
    parts = ["af", ti.dag_id, ti.task_id, ti.run_id]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    ref = ":".join(parts)[:200]
    return RunInfo(by="airflow", ref=ref, attrs={
        "dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
        "map_index": map_index, "try_number": getattr(ti, "try_number", None)})


class AgentpostToolset(AirflowToolset):
    """The agentpost tools for one seat.

    :param workspace_id: the workspace the agent acts as (templated).
    :param agentpost_conn_id: the ``agentpost`` connection (templated).
    :param space: the mark space (a `PostgresMarkSpace` in the store's database) for
        read_marks, write_mark and claim (templated); None: no mark tools.
    :param scopes: the scopes of that space (`Scope` objects), as for the mark operators.
    :param agent: the mark-space agent: an `Agent` with a fixed id, or a name (its id
        derived from it, writing observations, warnings and needs and claiming in every
        scope given); default: the workspace id.
    :param tools: the tool names to offer (default: all).
    :param lease_ttl: seconds a read_inbox lease lasts.
    :param max_retries: how often the model may correct a refused call (default: the run's).
    :param command_approval: how a mutating `submit_command` waits for a person:
        ``"airflow"`` (default) pauses the agent through common-ai's tool approval, the
        command waiting in the ledger at the same time (agentpost.ai.approval; needs
        `AgentOperator` on Airflow 3.3+, and outside a task it acts as ``"ledger"``);
        ``"ledger"`` returns ``confirmation_required`` at once and the agent goes on.
    """

    agent_template_fields: Sequence[str] = ("workspace_id", "agentpost_conn_id", "space")

    def __init__(self, workspace_id: str, *, agentpost_conn_id: str = "agentpost_default",
                 space: str | None = None, scopes: Sequence[Scope] = (),
                 agent: Agent | str | None = None, tools: Sequence[str] | None = None,
                 lease_ttl: float = 300.0, max_retries: int | None = None,
                 command_approval: Literal["airflow", "ledger"] = "airflow") -> None:
        known = {spec.name for spec in TOOLS}
        if tools is not None and not set(tools) <= known:
            raise ValueError(f"unknown tools {sorted(set(tools) - known)}; known: {sorted(known)}")
        self.workspace_id = workspace_id
        self.agentpost_conn_id = agentpost_conn_id
        self.space = space
        self.scopes = list(scopes)
        self.agent = agent
        self.tools = list(tools) if tools is not None else None
        self.lease_ttl = lease_ttl
        self._max_retries = max_retries
        if command_approval not in ("airflow", "ledger"):
            raise ValueError(f"command_approval must be 'airflow' or 'ledger', got "
                             f"{command_approval!r}")
        self.command_approval = command_approval
        self._seat: AgentTools | None = None
        self._closers: list[Any] = []
        self._task: Any = None  # the task context, when a person is asked through Airflow
        self._paused = False

    @property
    def id(self) -> str:
        return f"agentpost-{self.workspace_id}"

    def _agent(self) -> Agent:
        if isinstance(self.agent, Agent):
            return self.agent
        import uuid

        name = self.agent or self.workspace_id
        kinds = (MarkType.INTENT, MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
                 MarkType.NEED)
        return Agent(id=uuid.uuid5(uuid.NAMESPACE_URL, f"agentpost-agent:{name}"), name=name,
                     scopes={scope.name: kinds for scope in self.scopes})

    def _open(self) -> AgentTools:
        """The seat, opened on first use in a run: the store (and mark space) of the
        connection, the task instance as the run."""
        if self._seat is not None:
            return self._seat
        hook = AgentpostHook(self.agentpost_conn_id)
        store = hook.get_store()
        self._closers.append(store)
        marks = agent = None
        if self.space is not None:
            from agentpost.marks.postgres import PostgresMarkSpace

            marks = PostgresMarkSpace(dsn=hook.get_dsn(), scopes=self.scopes, space=self.space)
            self._closers.append(marks)
            agent = self._agent()
        seat = AgentTools(store, workspace_id=self.workspace_id, marks=marks,
                          agent=agent, run=run_info(), lease_ttl=self.lease_ttl)
        self._task = approval.task_context() if self.command_approval == "airflow" else None
        if self._task is not None:  # a run resumed after a person's answer: settle it first
            approval.restore_leases(self._task, seat)
            approval.settle(self._task, seat)
        self._seat, self._paused = seat, False
        return seat

    def _call(self, name: str, tool_args: dict[str, Any], call_id: str | None
              ) -> dict[str, Any]:
        return self._open().call(name, tool_args, call_id=call_id)

    def _close(self) -> None:
        seat, self._seat = self._seat, None
        try:
            if seat is not None and self._paused and self._task is not None:
                approval.keep_leases(self._task, seat)  # the resumed run acknowledges them
            elif seat is not None:
                seat.release()
        finally:
            closers, self._closers = self._closers, []
            for closer in reversed(closers):
                closer.close()

    async def __aexit__(self, *args: Any) -> bool | None:
        await self.run_blocking(self._close)
        return None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        seat = await self.run_blocking(self._open)
        try:
            specs = await self.run_blocking(seat.specs)
        except ToolRefused as exc:  # the seat itself is unusable (an unknown workspace)
            raise ValueError(f"agentpost toolset {self.id}: {exc.reason}") from None
        return {
            spec.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(name=spec.name, description=spec.description,
                                        parameters_json_schema=spec.args.model_json_schema()),
                max_retries=self._get_tool_max_retries(ctx),
                args_validator=_ArgsValidator(spec.args))
            for spec in specs if self.tools is None or spec.name in self.tools
        }

    async def execute_tool(self, name: str, tool_args: dict[str, Any], *,
                           ctx: RunContext[Any], tool: ToolsetTool[Any]) -> dict[str, Any]:
        try:  # one worker-thread hop per call: the seat opens (first call) inside it
            result = await self.run_blocking(self._call, name, tool_args, ctx.tool_call_id)
        except ToolRefused as exc:
            raise ModelRetry(exc.reason) from None
        if (name == "submit_command" and self._task is not None
                and result.get("state") == "confirmation_required"
                and not ctx.tool_call_approved):
            # SMCL's confirmation gate: pause for a person (agentpost.ai.approval)
            await self.run_blocking(approval.remember, self._task, result["command_id"])
            self._paused = True
            raise ApprovalRequired(metadata={"command_id": result["command_id"]})
        return result

    def guarded(self, toolset: AbstractToolset[Any], *, scope: str,
                resource: str | Callable[[str, dict[str, Any]], str], intent_action: str,
                result_action: str, confidence: float = 0.5) -> GuardedToolset:
        """`toolset` whose every tool runs only on the guard's ALLOW for (`scope`,
        `resource`), as this seat's mark-space agent, with the action mark `result_action`
        written after it (`Guard.execute`). `resource` is a name, or a function of the tool
        name and its arguments. Any other verdict reaches the model as a ModelRetry naming
        the verdict and the reason; the tool is not called. Needs `space`; the seat's
        templated fields are not rendered through the wrapper (give it literal values)."""
        if self.space is None:
            raise ValueError("guarded tools need a mark space (space=...)")
        return GuardedToolset(wrapped=toolset, seat=self, scope=scope, resource=resource,
                              intent_action=intent_action, result_action=result_action,
                              confidence=confidence)


@dataclass
class GuardedToolset(WrapperToolset[Any]):
    """See `AgentpostToolset.guarded`."""

    seat: AgentpostToolset | None = None
    scope: str = ""
    resource: str | Callable[[str, dict[str, Any]], str] = ""
    intent_action: str = ""
    result_action: str = ""
    confidence: float = 0.5

    async def __aexit__(self, *args: Any) -> bool | None:
        try:
            return await super().__aexit__(*args)
        finally:
            if self.seat is not None:
                await self.seat.__aexit__(*args)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        assert self.seat is not None
        seat = await self.seat.run_blocking(self.seat._open)
        resource = (self.resource(name, tool_args) if callable(self.resource)
                    else self.resource)
        loop = asyncio.get_running_loop()

        def run_tool() -> Any:  # in the guard's thread, under the resource's lock
            return asyncio.run_coroutine_threadsafe(
                self.wrapped.call_tool(name, tool_args, ctx, tool), loop).result()

        try:
            # not run_blocking: the wrapped tool may use it, and its lock is process-wide
            return await asyncio.to_thread(
                seat.guarded_call, run_tool, scope=self.scope, resource=resource,
                intent_action=self.intent_action, result_action=self.result_action,
                confidence=self.confidence)
        except ToolRefused as exc:
            raise ModelRetry(exc.reason) from None


__all__ = ["AgentpostToolset", "GuardedToolset", "run_info"]
