"""The names of trail chains that are not workspaces.

A workspace's id names its trail chain (its local trail, WACP §10), so a workspace id must
never be the name of a chain the store writes for something else: the registry's `system`
chain, the human highway's `human:<user>`, a command's `command:<id>`, a saga's `saga:<id>`,
an on-insert rule's `rule:<id>` (the sender of what the rule sends), an inbox's consumer
lanes `lane:<k>:<inbox>` (sql/0083: where its leases and acks go while another consumer
holds the inbox's chain). `_reserved_chain` in sql/0015_reserved_names.sql and
sql/0083_consumer_lanes.sql holds the same list.
"""

from __future__ import annotations

#: the registry's chain (roles, types, rules)
SYSTEM_CHAIN = "system"
#: prefixes of the chains of people, commands, sagas, rules and consumer lanes
RESERVED_PREFIXES = ("human:", "command:", "saga:", "rule:", "lane:")
#: the prefix of an inbox's consumer lanes, `lane:<k>:<inbox>`
LANE_PREFIX = "lane:"
#: what a lane's name holds before its inbox's (`agentpost.lane_inbox` strips the same)
LANE_PATTERN = r"^lane:[0-9]+:"


def reserved_chain(name: str) -> bool:
    """Whether `name` is, or could be, a chain that is not a workspace's."""
    return name == SYSTEM_CHAIN or name.startswith(RESERVED_PREFIXES)


def reserved_message(name: str) -> str:
    """Why a workspace may not take the id `name` (the database says the same)."""
    return (f"workspace id {name!r} is reserved: it names a trail chain that is not a "
            f"workspace's ({SYSTEM_CHAIN!r}, or one starting with "
            f"{', '.join(RESERVED_PREFIXES)})")


def lane_inbox(chain: str) -> str:
    """The inbox whose lease and ack entries `chain` holds: a lane's inbox, else `chain`
    (sql/0083 `agentpost.lane_inbox`)."""
    if not chain.startswith(LANE_PREFIX):
        return chain
    return chain.split(":", 2)[2]
