"""Operators that send one WACP envelope per task instance.

A retried task must not send twice. Every send carries a caller-chosen envelope id derived
from the task instance (dag_id, task_id, run_id, map_index; never the try number), and the
store treats that id as the idempotency key (Courier §6.4): a retry gets the first try's
outcome back (``duplicate=True``) and nothing is sent again. A rejection (WACP §9) fails the
task without retries, with the store's reason, because resending the same envelope cannot
change it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from agentpost.operators.common import StoreOperator, instance_id, is_template
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.models import Priority
from agentpost.store.checks import name as checked_name
from agentpost.web.links import LinkSource, links_for

if TYPE_CHECKING:
    from airflow.sdk import Context

    from agentpost.protocol.models import SendResult


class EnvelopeRejected(AirflowFailException):
    """The store rejected the envelope (WACP §9); the message carries its reason."""


def _check_type(value: object) -> str:
    """An envelope type name, checked when the DAG is parsed (a clear error, not at run)."""
    if is_template(value):
        return str(value)
    try:
        return checked_name(value, "envelope type")
    except InvalidInput as exc:
        raise InvalidInput(f"bad envelope type {value!r}: {exc}") from None


def _check_priority(value: object) -> str:
    if is_template(value):
        return str(value)
    if value not in set(Priority):
        raise InvalidInput(f"priority must be one of {', '.join(Priority)}, not {value!r}")
    return str(value)


class SendEnvelopeOperator(StoreOperator):
    """Sends one envelope from `sender` to `to`; returns its id (XCom ``return_value``) and
    pushes the store's outcome (``envelope_id``, ``status``, ``reason``, ``duplicate``) under
    the XCom key ``send_result``.

    :param sender: the sending workspace (templated).
    :param to: the receiving workspace (templated).
    :param type: the envelope type (templated; a literal name is checked at parse time).
    :param content: the content (templated); a dict or list with ``format="json"``.
    :param format: the payload format (``markdown``, ``json``, ...).
    :param priority: ``normal``, ``urgent`` or ``blocking`` (templated).
    :param in_reply_to: the envelope answered (templated), e.g. an upstream task's XCom.
    :param tags, headers: Courier's tags and flat headers (templated).
    :param envelope_id: the idempotency key (templated); default: derived from the task
        instance, the same on every try (``af:<dag>:<task>:<run>[:<map>]``, hashed when that
        is not a valid id).
    """

    template_fields: Sequence[str] = ("sender", "to", "type", "content", "priority",
                                      "in_reply_to", "tags", "headers", "envelope_id",
                                      "agentpost_conn_id")
    template_fields_renderers = {"content": "json", "headers": "json"}
    agentpost_links = {"envelopes": LinkSource()}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#e3f2d9"
    #: the type a subclass fixes (None: the caller names it)
    fixed_type: str | None = None

    def __init__(self, *, sender: str, to: str, content: Any, type: str | None = None,
                 format: str = "markdown", priority: str = "normal",
                 in_reply_to: str | None = None, tags: Sequence[str] = (),
                 headers: Mapping[str, Any] | None = None, envelope_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.fixed_type is not None and type not in (None, self.fixed_type):
            raise InvalidInput(f"{self.__class__.__name__} sends {self.fixed_type!r} "
                               f"envelopes, not {type!r}")
        if self.fixed_type is None and type is None:
            raise InvalidInput("type must name an envelope type")
        self.type = _check_type(type or self.fixed_type)
        self.sender = sender
        self.to = to
        self.content = content
        self.format = format
        self.priority = _check_priority(priority)
        self.in_reply_to = in_reply_to
        self.tags = list(tags)
        self.headers = dict(headers or {})
        self.envelope_id = envelope_id

    def execute(self, context: Context) -> str:
        envelope_id = self.envelope_id or instance_id(context)
        with self.store() as store:
            result = store.send(self.sender, self.to, _check_type(self.type), self.content,
                                format=self.format, priority=self.priority,
                                in_reply_to=self.in_reply_to or None, tags=self.tags,
                                headers=self.headers or None, envelope_id=envelope_id)
        context["ti"].xcom_push(key="send_result", value=result.model_dump(mode="json"))
        return self._settle(result)

    def _settle(self, result: SendResult) -> str:
        if not result.accepted:
            detail = f" ({result.detail})" if result.detail else ""
            raise EnvelopeRejected(f"{self.task_id}: envelope {result.envelope_id} "
                                   f"{self.sender} -> {self.to} ({self.type}) was rejected: "
                                   f"{result.reason}{detail}")
        if result.duplicate:
            self.log.info("envelope %s was sent by an earlier try (%s): not sent again",
                          result.envelope_id, result.status)
        else:
            self.log.info("sent envelope %s %s -> %s (%s): %s", result.envelope_id,
                          self.sender, self.to, self.type, result.status)
        return result.envelope_id


class DirectiveOperator(SendEnvelopeOperator):
    """A ``directive`` (coordinator to worker: do this)."""

    fixed_type = "directive"


class QueryOperator(SendEnvelopeOperator):
    """A ``query`` (worker to coordinator: a question)."""

    fixed_type = "query"


class FeedbackOperator(SendEnvelopeOperator):
    """A ``feedback`` (coordinator to worker: the answer or a verdict on its work)."""

    fixed_type = "feedback"


__all__ = ["DirectiveOperator", "EnvelopeRejected", "FeedbackOperator", "QueryOperator",
           "SendEnvelopeOperator"]
