"""The names of trail chains that are not workspaces.

A workspace's id names its trail chain (its local trail, WACP §10), so a workspace id must
never be the name of a chain the store writes for something else: the registry's `system`
chain, the human highway's `human:<user>`, a command's `command:<id>`, a saga's `saga:<id>`,
an on-insert rule's `rule:<id>` (the sender of what the rule sends). `create_workspace` in
sql/0015_reserved_names.sql holds the same list.
"""

from __future__ import annotations

#: the registry's chain (roles, types, rules)
SYSTEM_CHAIN = "system"
#: prefixes of the chains of people, commands, sagas and rules
RESERVED_PREFIXES = ("human:", "command:", "saga:", "rule:")


def reserved_chain(name: str) -> bool:
    """Whether `name` is, or could be, a chain that is not a workspace's."""
    return name == SYSTEM_CHAIN or name.startswith(RESERVED_PREFIXES)


def reserved_message(name: str) -> str:
    """Why a workspace may not take the id `name` (the database says the same)."""
    return (f"workspace id {name!r} is reserved: it names a trail chain that is not a "
            f"workspace's ({SYSTEM_CHAIN!r}, or one starting with "
            f"{', '.join(RESERVED_PREFIXES)})")
