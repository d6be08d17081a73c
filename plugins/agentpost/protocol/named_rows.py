"""The rows a trail entry names, which must exist (WACP §3 Integrity: the trail vouches for
the rows it describes, so a row deleted outright, bypassing the store, is a failure).

An entry names rows three ways: its `envelope_id` column (an envelope), its chain (a
command's `command:<id>`, a saga's `saga:<id>`, an on-insert rule's `rule:<id>`, and a
workspace's own id; the `system` and `human:<user>` chains name no row), and, for a few
events, a field of its body (a route, a port right, a role, a type, a rule, a saga step).
Signals, marks and needs are named by no entry's identity, so nothing here covers them.

A rule is the one row the store deletes itself (`remove_rule`, which writes `rule_removed`
to the system chain): its absence is legitimate when its last definition entry is that one.

Which entry *creates* a row (`born_rows`) is what a verification since a checkpoint adds to
the checkpoint's row digests (`protocol.row_digest`): each row is inserted by the transaction
that writes that entry. Three kinds are not told by one entry: a rule or a type is defined
again by the same events that create it (`registry_change`: the system chain before the
checkpoint says whether it existed), and a route row is inserted or updated by the same
`route_progress` (an index of the trail says whether an entry before the checkpoint named it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from agentpost.protocol.chains import RESERVED_PREFIXES, SYSTEM_CHAIN

ENVELOPE = "envelope"
COMMAND = "command"
SAGA = "saga"
SAGA_STEP = "saga step"
RULE = "rule"
WORKSPACE = "workspace"
ROUTE = "route"
PORT_RIGHT = "port right"
ROLE = "role"
TYPE = "type"
#: every kind, in the order failures are reported
KINDS = (ENVELOPE, COMMAND, SAGA, SAGA_STEP, RULE, WORKSPACE, ROUTE, PORT_RIGHT, ROLE, TYPE)

#: chain prefixes that name a row (`human:` names a person, not a row)
CHAIN_KINDS = {"command:": COMMAND, "saga:": SAGA, "rule:": RULE}
#: events whose body names rows: (kind, body field)
BODY_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "route_progress": ((ROUTE, "id"), (ROUTE, "root_id")),
    "port_right_created": ((PORT_RIGHT, "right_id"),),
    "port_right_transferred": ((PORT_RIGHT, "right_id"),),
    "port_right_consumed": ((PORT_RIGHT, "right_id"),),
    "port_right_revoked": ((PORT_RIGHT, "right_id"),),
    "role_defined": ((ROLE, "role"),),
    "type_registered": ((TYPE, "type"),),
    "rule_defined": ((RULE, "id"),),
    "rule_enabled": ((RULE, "id"),),
    "rule_disabled": ((RULE, "id"),),
}
#: a saga step is named by its saga's chain and the `step` field of the entry's body
STEP_FIELD = "step"

#: events whose entry creates the envelope its `envelope_id` names (sql/0017: they sign
#: `row.fixed`)
ENVELOPE_BIRTHS = frozenset({"envelope_created", "envelope_rejected"})
#: kinds whose row is created with the first entry of its own chain
CHAIN_BIRTHS = frozenset({COMMAND, SAGA, WORKSPACE})
#: events whose entry creates the row a body field names: (kind, field); a transferred
#: `send` right is a new row, a transferred `send_once` right moves
BODY_BIRTHS = {"port_right_created": (PORT_RIGHT, "right_id"),
               "port_right_transferred": (PORT_RIGHT, "right_id"),
               "role_defined": (ROLE, "role")}
#: the step a `saga_step_planned` entry creates
STEP_BIRTH = "saga_step_planned"
#: registry events that create, define again or remove a rule or a type: (kind, field)
REGISTRY_EVENTS = {"rule_defined": (RULE, "id"), "rule_removed": (RULE, "id"),
                   "type_registered": (TYPE, "type")}
RULE_REMOVED = "rule_removed"
#: the system chain's record of the rows a prune dropped with the months it archived (sql/0088:
#: `kind`, `count`, `sum`, as a checkpoint's row digest): `row_digest.pruned` reads it
ROWS_PRUNED = "rows_pruned"

#: a row's key: its id, or (saga id, step name) for a saga step
RowKey = str | tuple[str, str]


def chain_row(chain: str) -> tuple[str, str] | None:
    """The row a chain's name implies: (kind, id), or None (`system`, `human:<user>`)."""
    if chain == SYSTEM_CHAIN:
        return None
    for prefix, kind in CHAIN_KINDS.items():
        if chain.startswith(prefix):
            return kind, chain.removeprefix(prefix)
    if chain.startswith(RESERVED_PREFIXES):
        return None
    return WORKSPACE, chain


def body_rows(chain: str, event: str, record: str) -> Iterator[tuple[str, RowKey]]:
    """The rows the body of an entry names (nothing for most events: no JSON is parsed)."""
    fields = BODY_FIELDS.get(event, ())
    saga = chain.removeprefix("saga:") if chain.startswith("saga:") else None
    if not fields and saga is None:
        return
    body = _body(record)
    for kind, name in fields:
        value = body.get(name)
        if isinstance(value, str):
            yield kind, value
    step = body.get(STEP_FIELD)
    if saga is not None and isinstance(step, str):
        yield SAGA_STEP, (saga, step)


def born_rows(chain: str, seq: int, event: str, envelope_id: str | None,
              record: str) -> Iterator[tuple[str, RowKey]]:
    """The rows an entry creates (the module docstring says which; rules, types and routes
    are not told here)."""
    if envelope_id is not None and event in ENVELOPE_BIRTHS:
        yield ENVELOPE, envelope_id
    if seq == 1:
        row = chain_row(chain)
        if row is not None and row[0] in CHAIN_BIRTHS:
            yield row
    if event == STEP_BIRTH and chain.startswith("saga:"):
        step = _body(record).get(STEP_FIELD)
        if isinstance(step, str):
            yield SAGA_STEP, (chain.removeprefix("saga:"), step)
    birth = BODY_BIRTHS.get(event)
    if birth is not None:
        body = _body(record)
        value = body.get(birth[1])
        if isinstance(value, str) and (event != "port_right_transferred"
                                       or body.get("right_type") == "send"):
            yield birth[0], value


def registry_change(event: str, record: str) -> tuple[str, str] | None:
    """(kind, id) of the rule or type a registry event defines or removes, else None."""
    spec = REGISTRY_EVENTS.get(event)
    if spec is None:
        return None
    value = _body(record).get(spec[1])
    return (spec[0], value) if isinstance(value, str) else None


def label(kind: str, key: RowKey) -> str:
    """How a report names a row: `envelope <id>`, `saga step <saga>/<step>`."""
    shown = "/".join(key) if isinstance(key, tuple) else key
    return f"{kind} {shown}"


def _body(record: str) -> dict:
    try:
        body = json.loads(record).get("body")
    except (ValueError, AttributeError):
        return {}  # the entry check reports a record that is not JSON
    return body if isinstance(body, dict) else {}
