"""Where `InboxSensor` lived first (now `agentpost.operators.sensors`): kept importable for
DAGs written against it."""

from agentpost.operators.sensors import DEFAULT_POLL_INTERVAL, InboxSensor

__all__ = ["DEFAULT_POLL_INTERVAL", "InboxSensor"]
