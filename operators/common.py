"""What the agentpost operators share: the store behind a task, stable ids per task instance,
and the translation of the store's typed errors into Airflow's.

Airflow retries a task instance with the same dag_id, task_id, run_id and map_index; only the
try number changes. Ids derived from those four are therefore the same on every try, which is
what makes a retried send or a retried saga step a replay rather than a second effect.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from agentpost.hooks import AgentpostHook
from agentpost.protocol.errors import AgentpostError, StoreError
from agentpost.protocol.validation import CLIENT_ID

if TYPE_CHECKING:
    from airflow.sdk import Context

    from agentpost.store import EnvelopeStore

#: characters an envelope id may not hold, replaced in the readable part of a derived id
_NOT_ID = re.compile(r"[^A-Za-z0-9._:-]")
#: a derived id: at most 128 characters (Courier §6.4 ids are 1-128 of [A-Za-z0-9._:-])
MAX_CLIENT_ID = 128


def instance_parts(context: Context) -> list[str]:
    """dag_id, task_id, run_id and (when mapped) map_index: the same for every try."""
    ti = context["ti"]
    parts = [ti.dag_id, ti.task_id, ti.run_id]
    if ti.map_index is not None and ti.map_index >= 0:
        parts.append(str(ti.map_index))
    return parts


def client_id(*parts: str) -> str:
    """An envelope id for `parts`: the parts joined by ``:`` when that is a valid id, else a
    readable prefix and a hash of the whole (distinct parts give distinct ids)."""
    natural = ":".join(["af", *parts])
    if CLIENT_ID.fullmatch(natural):
        return natural
    digest = hashlib.sha256(natural.encode()).hexdigest()[:32]
    readable = _NOT_ID.sub("-", natural)[: MAX_CLIENT_ID - len(digest) - 1]
    return f"{readable}.{digest}"


def instance_id(context: Context, *extra: str) -> str:
    """The stable id of this task instance (plus `extra` parts), for caller-chosen ids."""
    return client_id(*instance_parts(context), *extra)


def fit(text: str, limit: int) -> str:
    """`text` if it fits `limit` characters, else a prefix and a hash of the whole."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return f"{text[:limit - 33]}#{digest}"


def is_template(value: Any) -> bool:
    """Whether `value` is a Jinja template, to be checked only once it is rendered."""
    return isinstance(value, str) and "{{" in value


class ClearErrors:
    """Turns the store's typed errors into Airflow's: bad input, a forbidden or conflicting
    request fail the task without retries (one line); a store that is away fails the try."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is None or not isinstance(exc, AgentpostError):
            return
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        message = f"{self.task_id}: {type(exc).__name__}: {line}"
        if isinstance(exc, StoreError):
            raise AirflowException(message) from exc
        raise AirflowFailException(message) from exc


@contextmanager
def open_store(conn_id: str, task_id: str) -> Iterator[EnvelopeStore]:
    """The store of connection `conn_id`, closed afterwards; its typed errors become one-line
    failures of task `task_id` (bad input, forbidden, not found: no retry; a store that is
    away: a retry)."""
    with ClearErrors(task_id), AgentpostHook(conn_id).get_store() as store:
        yield store


class StoreOperator(BaseOperator):
    """An operator that talks to the envelope store through the ``agentpost`` connection.

    :param agentpost_conn_id: the ``agentpost`` connection (else AGENTPOST_DSN).
    """

    def __init__(self, *, agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.agentpost_conn_id = agentpost_conn_id

    def store(self) -> AbstractContextManager[EnvelopeStore]:
        """The store (see `open_store`)."""
        return open_store(self.agentpost_conn_id, self.task_id)

    def errors(self) -> ClearErrors:
        """Turns the store's typed errors into Airflow's, one line each."""
        return ClearErrors(self.task_id)


__all__ = ["ClearErrors", "StoreOperator", "client_id", "fit", "instance_id", "instance_parts",
           "is_template", "open_store"]
