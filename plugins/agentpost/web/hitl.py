"""A person's decision on a waiting command, taken on the agentpost page, settles the Airflow
approval request of the agent that waits for it (the page's side of agentpost.ai.approval).

The command's task instance is the run recorded with it (its first evidence entry's
``context.tool_call.run``, written by the toolset, never by the model). Its approval request
is answered with Airflow's own handler (`update_hitl_detail`, the HITL REST API's): the same
locks, option checks, assigned-user check and event-driven resume as an answer given in the
Required Actions view, as the page's signed-in user. That answer and the ledger's decision are
taken together: the Airflow side is written in a session that commits only once the ledger has
recorded the decision, and rolls back when the ledger refuses (decided already). A request
answered in Airflow first refuses the page's decision (409): the resumed task records that
answer in the ledger, so both sides keep the first decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import HTTPException

from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import Conflict, Forbidden
from agentpost.store import EnvelopeStore
from agentpost.web.links import run_link

Q = load_queries("agentpost.web", "commands.sql")

def waiting_task(store: EnvelopeStore, command_id: str) -> dict[str, Any] | None:
    """dag_id, task_id, run_id, map_index of the Airflow task instance that submitted the
    command through the agent tools, or None (submitted otherwise)."""
    context = store.db.scalar(Q["command_context"], {"id": command_id})
    tool_call = context.get("tool_call") if isinstance(context, dict) else None
    run = tool_call.get("run") if isinstance(tool_call, dict) else None
    link = run_link(run)
    return link["task"] if link["by"] == "airflow" else None


def _authorized(user: Any, dag_id: str) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    return bool(get_auth_manager().is_authorized_dag(
        method="PUT", access_entity=DagAccessEntity.HITL_DETAIL,
        details=DagDetails(id=dag_id), user=user))


@contextmanager
def answering(task: dict[str, Any] | None, user: Any, approve: bool,
              reason: str) -> Iterator[Callable[[], str]]:
    """Answer `task`'s open approval request as `user` inside the block; committed when the
    block ends normally, rolled back when it raises. Yields a function saying what became of
    the request. Forbidden (before anything is written) when `user` may not answer it."""
    if task is None:
        yield lambda: "no Airflow task waits for it"
        return
    if not _authorized(user, task["dag_id"]):
        raise Forbidden(f"you may not answer the approval requests of DAG {task['dag_id']!r}")
    from airflow.api_fastapi.core_api.datamodels.hitl import UpdateHITLDetailPayload
    from airflow.api_fastapi.core_api.routes.public.hitl import update_hitl_detail

    # an agent's task waits: common-ai runs it, and its request offers these options
    from airflow.providers.common.ai.mixins.approval import LLMApprovalMixin as Options
    from airflow.utils.session import create_session

    payload = UpdateHITLDetailPayload(
        chosen_options=[Options.APPROVE if approve else Options.REJECT],
        params_input={} if approve else {"reason": reason})
    with create_session() as session:
        try:
            update_hitl_detail(dag_id=task["dag_id"], dag_run_id=task["run_id"],
                               task_id=task["task_id"], update_hitl_detail_payload=payload,
                               user=user, session=session,
                               map_index=task["map_index"] if task["map_index"] is not None
                               else -1)
            said = (f"the approval request of task {task['task_id']} was answered "
                    f"({payload.chosen_options[0]}); the agent resumes")
        except HTTPException as exc:
            if exc.status_code == 403:
                raise Forbidden(str(exc.detail)) from None
            if exc.status_code == 409:  # a person answered in Airflow first: theirs stands
                raise Conflict("the agent's task was answered in Airflow already; the "
                               "command is settled with that answer when the task "
                               "resumes") from None
            session.rollback()  # 404: the agent has not paused (yet), or never will
            said = f"the task's approval request was not answered here: {exc.detail}"
        try:
            yield lambda: said
        except BaseException:
            session.rollback()
            raise


__all__ = ["answering", "waiting_task"]
