"""Where `CommandTrigger` lived first (now `agentpost.triggers.commands`): kept because
triggers serialized into a metadata database carry this classpath, and CommandTrigger still
serializes to it."""

from agentpost.triggers.commands import (
    COMMAND_CHANNEL,
    CommandListener,
    CommandTrigger,
    lease_expired,
    waiting,
)

__all__ = ["COMMAND_CHANNEL", "CommandListener", "CommandTrigger", "lease_expired", "waiting"]
