"""Triggers that wait on the agentpost store from Airflow's triggerer.

One module per thing waited for: `inbox` (envelopes to lease), `commands` (an SMCL command
that no longer waits), `replies` (the answer to an envelope), `needs` (a Markspace need
resolved), `verdicts` (a deferred-resolution boundary's verdict), and `events`
(`InboxEventTrigger`, the BaseEventTrigger that starts a DAG run per envelope arriving in an
inbox, for asset watchers); `base` holds what they share (`StoreTrigger`, `WatchTrigger`,
their helpers). `messaging` (the `agentpost` scheme of common-messaging's
MessageQueueTrigger, which builds InboxEventTrigger) is not imported here: it needs the `ai`
extra, and Airflow loads it from the provider info's `queues`. Every trigger is importable
from here; ``agentpost.triggers.InboxTrigger`` is also the classpath InboxTrigger serializes
to, as it always has.
"""

from agentpost.triggers.base import (
    StoreTrigger,
    TriggerStore,
    WatchTrigger,
    first_check,
    one_line,
    positive,
    redact,
)
from agentpost.triggers.commands import CommandTrigger
from agentpost.triggers.events import InboxEventTrigger
from agentpost.triggers.inbox import InboxTrigger, available
from agentpost.triggers.needs import NeedResolvedTrigger
from agentpost.triggers.replies import ReplyTrigger
from agentpost.triggers.verdicts import VerdictTrigger

__all__ = [
    "CommandTrigger",
    "InboxEventTrigger",
    "InboxTrigger",
    "NeedResolvedTrigger",
    "ReplyTrigger",
    "StoreTrigger",
    "TriggerStore",
    "VerdictTrigger",
    "WatchTrigger",
    "available",
    "first_check",
    "one_line",
    "positive",
    "redact",
]
