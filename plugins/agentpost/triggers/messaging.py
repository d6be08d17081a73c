"""agentpost as a common-messaging queue: ``MessageQueueTrigger(scheme="agentpost",
workspace_id=...)`` starts a DAG run per envelope arriving in that inbox.

Airflow's common-messaging provider (the ``ai`` extra) builds a `MessageQueueTrigger`'s
trigger from whichever provider's ``queues`` entry matches: this one is listed in
``agentpost.provider_info`` and hands over `InboxEventTrigger` itself, so the asset watcher
runs our trigger, with its exactly-once claims, and stores it under its own class path
(``agentpost.triggers.events.InboxEventTrigger``): a stored watcher does not depend on
common-messaging to be rebuilt.

Two ways in, as common-messaging offers them:

- by scheme: ``MessageQueueTrigger(scheme="agentpost", workspace_id="triage", ...)``; every
  keyword goes to `InboxEventTrigger` as is (``watcher``, ``agentpost_conn_id``,
  ``poll_interval``, ``min_interval``, ``claim_timeout``, ``dsn``);
- by queue URI (deprecated by common-messaging): ``MessageQueueTrigger(
  queue="agentpost://triage")`` or ``agentpost://agents/triage/inbox``, the inbox's stream
  name; the other keywords go to the trigger as above.

This module needs common-messaging: without it, importing it raises Airflow's
`AirflowOptionalProviderFeatureException` (Airflow's provider discovery then skips the
queue quietly). Nothing else in agentpost imports it.
"""

from __future__ import annotations

from typing import Any

from airflow.exceptions import AirflowOptionalProviderFeatureException

try:
    from airflow.providers.common.messaging.providers.base_provider import (
        BaseMessageQueueProvider,
    )
except ImportError as exc:  # without the ai extra (tests/airflow/test_airflow_queue.py)
    raise AirflowOptionalProviderFeatureException(
        "MessageQueueTrigger(scheme='agentpost') needs Airflow's common-messaging provider: "
        "install airflow-agentpost[ai] (apache-airflow-providers-common-messaging)"
    ) from exc

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import workspace_of
from agentpost.triggers.events import InboxEventTrigger

SCHEME = "agentpost"
QUEUE_PREFIX = f"{SCHEME}://"
CLASSPATH = "agentpost.triggers.messaging.AgentpostMessageQueueProvider"


class AgentpostMessageQueueProvider(BaseMessageQueueProvider):
    """The ``agentpost`` scheme of common-messaging: an inbox as a message queue, each
    arriving envelope one event (one DAG run) per watcher, as `InboxEventTrigger` claims it."""

    scheme = SCHEME

    def trigger_class(self) -> type[InboxEventTrigger]:
        return InboxEventTrigger

    def queue_matches(self, queue: str) -> bool:
        return isinstance(queue, str) and queue.startswith(QUEUE_PREFIX)

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """``agentpost://<workspace>`` (or ``agentpost://agents/<workspace>/inbox``) as the
        trigger's `workspace_id`; the inbox is named once, by the URI."""
        if "workspace_id" in kwargs:
            raise InvalidInput(f"the queue {queue!r} names the inbox already: drop "
                               "workspace_id, or use scheme='agentpost' with workspace_id")
        workspace = queue[len(QUEUE_PREFIX):] if self.queue_matches(queue) else ""
        if not workspace or any(c in workspace for c in "?#"):
            raise InvalidInput(f"an agentpost queue is agentpost://<workspace>, not {queue!r}")
        try:
            return {"workspace_id": workspace_of(workspace)}
        except InvalidInput as exc:
            raise InvalidInput(f"queue {queue!r}: {exc}") from exc
