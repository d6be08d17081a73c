"""SMCL confirmation through common-ai's tool approval: the task side.

A mutating `submit_command` of an `AgentpostToolset` (``command_approval="airflow"``) submits
the command and asks for its confirmation (SMCL: ``confirmation_required``), then raises
pydantic-ai's `ApprovalRequired`: `AgentOperator` parks the task in ``awaiting_input`` with an
approval request in Airflow's Required Actions view. The command waits in the ledger at the
same time, so the agentpost page shows it too.

Whoever decides first settles both (one ledger):

- A person answers in Airflow. The task resumes; on the resumed run's first tool listing the
  toolset reads the answer (the resume event Airflow hands the task: `resume_event`) and
  records it in the ledger as the command's confirmation, declined or confirmed by
  ``human:<that person>`` (SMCL's human highway). pydantic-ai then re-runs the approved
  call, which finds the command decided; a rejected call is not re-run and the model reads
  the person's reason.
- A person decides on the agentpost page. The page records the decision in the ledger and
  answers the task instance's approval request as that person (agentpost.web.hitl); the task
  resumes as above and finds the command already decided.

What must survive the pause lives in the task instance's state store: the commands waiting
(`PENDING_KEY`) and the envelopes the run leased and has not acknowledged (`LEASES_KEY`), so
the resumed run can acknowledge them (while their leases last).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.providers.common.ai.mixins.approval import LLMApprovalMixin

from agentpost.protocol.commands import CommandState
from agentpost.smcl import CommandLedger
from agentpost.tools import AgentTools

log = logging.getLogger(__name__)

#: the task state store's key for the commands this task instance asked a person about
PENDING_KEY = "agentpost_commands_awaiting_approval"
#: the task state store's key for the leases the paused run held
LEASES_KEY = "agentpost_leases_across_approval"


def task_context() -> Mapping[str, Any] | None:
    """The running task's context when it has a task state store (Airflow 3.3+ running a
    task), else None: outside such a task a command waits in the ledger only."""
    try:
        from airflow.sdk import get_current_context

        context = get_current_context()
    except Exception:  # no task is running
        return None
    return context if context.get("task_state_store") is not None else None


def _retain() -> Any:
    from airflow.sdk.execution_time.context import NEVER_EXPIRE

    return NEVER_EXPIRE


def remember(context: Mapping[str, Any], command_id: str) -> None:
    """Note that this task instance waits for a person's decision on `command_id`."""
    store = context["task_state_store"]
    pending = list(store.get(PENDING_KEY) or [])
    if command_id not in pending:
        store.set(PENDING_KEY, [*pending, command_id], retention=_retain())


def keep_leases(context: Mapping[str, Any], seat: AgentTools) -> None:
    """The run paused: keep its unacknowledged leases for the resumed run."""
    context["task_state_store"].set(LEASES_KEY, seat.held(), retention=_retain())


def restore_leases(context: Mapping[str, Any], seat: AgentTools) -> None:
    """The resumed run takes over the leases its paused half held."""
    store = context["task_state_store"]
    held = store.get(LEASES_KEY)
    if isinstance(held, dict):
        seat.adopt({str(k): str(v) for k, v in held.items()})
        store.delete(LEASES_KEY)


def person(user: Any) -> str | None:
    """The name recorded for the person who answered (a HITL user, ``{"id", "name"}``): its
    name, else its id."""
    if not isinstance(user, dict):
        return None
    name = user.get("name") or user.get("id")
    return str(name) if name else None


def resume_event(context: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer this task instance resumes with after a tool approval pause: the event
    Airflow stored for the resumed method (``chosen_options``, ``params_input``,
    ``responded_by_user``, ``timedout``), or None when the task did not resume from one.

    Read from the task instance's run context as the task runner reads it: the Task SDK
    gives a task no call for its own approval request's answer (the worker's supervisor
    does not serve `GetHITLDetailResponse`), and `AgentOperator` passes the event to its
    resume method only."""
    server = getattr(context["ti"], "_ti_context_from_server", None)
    if server is None or server.next_method != "resume_after_tool_approval":
        return None
    from airflow.sdk.serde import deserialize

    try:
        kwargs = deserialize(server.next_kwargs or {})
    except (ImportError, KeyError, AttributeError, TypeError):
        from airflow.serialization.serialized_objects import BaseSerialization

        kwargs = BaseSerialization.deserialize(server.next_kwargs or {})
    event = kwargs.get("event") if isinstance(kwargs, dict) else None
    return event if isinstance(event, dict) else None


def settle(context: Mapping[str, Any], seat: AgentTools) -> list[str]:
    """Record the person's answer this task instance resumed with as the decision on each
    command it waited for; the ids settled. Nothing is decided for an answer with no person
    (a timeout denies the call but decides nothing: the command keeps waiting in the ledger
    for a person)."""
    store = context["task_state_store"]
    pending = [str(c) for c in store.get(PENDING_KEY) or []]
    if not pending:
        return []
    answer = resume_event(context)
    if answer is None:  # not resumed from the approval: still waiting (or a retry)
        return []
    store.delete(PENDING_KEY)
    who = person(answer.get("responded_by_user"))
    if who is None:
        log.warning("commands %s: the approval request ended without a person's answer; "
                    "they keep waiting in the ledger", ", ".join(pending))
        return []
    approved = LLMApprovalMixin.APPROVE in (answer.get("chosen_options") or [])
    with seat.ledger() as ledger:
        for command_id in pending:
            decide(ledger, command_id, who, "confirm" if approved else "decline",
                   key=f"hitl:{context['ti'].id}:{command_id}")
    return pending


def decide(ledger: CommandLedger, command_id: str, who: str, decision: str, *,
           key: str) -> None:
    """`who`'s decision on `command_id` through the human highway, unless it was decided
    already (on the page, by the CLI): the first decision stands. `key` makes a replay
    send nothing new."""
    view = ledger.view(command_id)
    if view.state is not CommandState.CONFIRMATION_REQUIRED or view.declined:
        return  # decided already (a declined command stays confirmation_required)
    ledger.confirmation_envelope(who, command_id, decision, envelope_id=key[:120])


__all__ = ["LEASES_KEY", "PENDING_KEY", "decide", "keep_leases",
           "person", "remember", "restore_leases", "resume_event", "settle", "task_context"]
