"""Apply a fleet file to the store: roles, envelope types, workspaces, subscriptions.

`plan` compares the fleet with what the store holds and lists what applying would change;
a definition the store cannot change in place (a role that inherits another role, a type
with other required fields, a workspace with another role, parent, originator or
delegation) or a new workspace under a sealed one is a `FleetConflict`, found before
anything is written. `apply` then makes exactly the planned changes, each one protocol step
of the store (trailed), all in one transaction: whatever fails on the way (a change made by
someone else since the plan, a lost server) rolls back every one of them. Applying the same
file again plans nothing and writes nothing.

Apply only adds: roles, types, permission rows and workspaces absent from the file are left
as they are. Agents' watch-pattern inputs become subscriptions in the fleet's mark space
(Markspace §13.3), so marks written after the apply are queued for an agent even before its
first activation; a changed subscription is replaced, which drops its queue (P48). Every
agent's name is recorded in the mark space (`record_names`), so the pages name it before
its first mark, even when the name is not a workspace id.

The mark space is reached through its own object (`PostgresMarkSpace`), never through its
tables' writes: the store and the mark space stay independent (the plan only reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentpost.fleet.checks import effective_originator
from agentpost.fleet.model import (
    BUILTIN_ROLES,
    Fleet,
    FleetError,
    WorkspaceDef,
)
from agentpost.marks.core import WatchPattern
from agentpost.protocol.errors import Conflict
from agentpost.protocol.models import WorkspaceState
from agentpost.store.envelopes import EnvelopeStore


class FleetConflict(FleetError, Conflict):
    """The store holds a definition the fleet file changes, and the store cannot change it
    in place. Nothing was written."""


@dataclass(frozen=True)
class Change:
    """One step of applying a fleet: `kind` is role, type, permission, workspace,
    subscription or agent; `action` create, add, replace, remove or name."""

    kind: str
    name: str
    action: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.action} {self.kind} {self.name}" + (f": {self.detail}" if self.detail
                                                           else "")


@dataclass
class FleetPlan:
    fleet: Fleet
    changes: list[Change] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.changes


@dataclass
class _State:
    """What the store holds of the registry (the fleet's types and workspaces only: a
    store may hold many more) and of the fleet's subscriptions."""

    roles: dict[str, str | None]
    types: dict[str, list[str]]
    permissions: set[tuple[str, str, str]]
    workspaces: dict[str, dict[str, Any]]
    subscriptions: dict[str, tuple[set[WatchPattern], set[str]]]
    names: dict[str, str]  # agent id: the name the mark space has recorded


def _read_state(store: EnvelopeStore, fleet: Fleet) -> _State:
    db = store.db
    ids = [str(fleet.agent(a.name).id) for a in fleet.agents]
    subscriptions = {
        str(agent_id): ({WatchPattern.model_validate(p) for p in patterns}, set(read_scopes))
        for agent_id, patterns, read_scopes in db.fetchall(
            "SELECT agent_id, patterns, read_scopes FROM agentpost.mark_subscriptions"
            " WHERE space = %s AND agent_id = ANY (%s::uuid[])", (fleet.space, ids))
    }
    return _State(
        roles=dict(db.fetchall("SELECT name, inherits FROM agentpost.roles")),
        types={n: list(f) for n, f in db.fetchall(
            "SELECT name, required_fields FROM agentpost.envelope_types")},
        permissions=set(db.fetchall(
            "SELECT type, sender_role, receiver_role FROM agentpost.permissions"
            " WHERE type = ANY (%s)", ([t.name for t in fleet.types],))),
        workspaces={r[0]: {"role": r[1], "parent": r[2], "originator": r[3],
                           "delegation": r[4], "state": r[5]}
                    for r in db.fetchall("SELECT id, role, parent, originator, delegation,"
                                         " state FROM agentpost.workspaces WHERE id = ANY (%s)",
                                         ([w.id for w in fleet.workspaces],))},
        subscriptions=subscriptions,
        names={str(agent_id): name for agent_id, name in db.fetchall(
            "SELECT agent_id, name FROM agentpost.mark_agents"
            " WHERE space = %s AND agent_id = ANY (%s::uuid[])", (fleet.space, ids))},
    )


def plan(store: EnvelopeStore, fleet: Fleet) -> FleetPlan:
    """What applying `fleet` would change; FleetConflict for what it cannot."""
    state = _read_state(store, fleet)
    conflicts: list[tuple[str, str]] = []
    result = FleetPlan(fleet)
    for step in (_plan_roles, _plan_types, _plan_workspaces, _plan_subscriptions,
                 _plan_names):
        for entry, item in step(fleet, state):
            if isinstance(item, Change):
                result.changes.append(item)
            else:
                conflicts.append((entry, item))
    if conflicts:
        entry, problem = conflicts[0]
        more = f" (and {len(conflicts) - 1} more conflict(s))" if len(conflicts) > 1 else ""
        raise FleetConflict(fleet.source, entry, problem + more)
    return result


Planned = Iterator[tuple[str, "Change | str"]]


def _plan_roles(fleet: Fleet, state: _State) -> Planned:
    for role in _roles_in_order(fleet):
        where = f"roles[{fleet.roles.index(role)}] ({role.name})"
        if role.name not in state.roles:
            yield where, Change("role", role.name, "create",
                                f"inherits {role.inherits}" if role.inherits else "")
        elif state.roles[role.name] != role.inherits:
            yield where, (f"the store's role {role.name!r} inherits "
                          f"{state.roles[role.name]!r}, the file says {role.inherits!r}; "
                          "a role's inheritance cannot change in place")


def _roles_in_order(fleet: Fleet) -> list[Any]:
    """The file's roles, each after the role it inherits (built-ins exist already)."""
    mine = [r for r in fleet.roles if r.name not in BUILTIN_ROLES]
    return _parents_first(mine, lambda r: r.name, lambda r: r.inherits, set(BUILTIN_ROLES))


def _parents_first(items: list[Any], key: Callable[[Any], str],
                   parent: Callable[[Any], str | None], done: set[str]) -> list[Any]:
    """`items` in an order where each comes after its parent (the file is checked acyclic,
    and parents outside `items` are in `done`)."""
    ordered: list[Any] = []
    pending = list(items)
    while pending:
        ready = [i for i in pending if parent(i) is None or parent(i) in done]
        if not ready:
            raise ValueError("parent references form a cycle")  # validated before: never
        ordered += ready
        done = done | {key(i) for i in ready}
        pending = [i for i in pending if i not in ready]
    return ordered


def _plan_types(fleet: Fleet, state: _State) -> Planned:
    for index, etype in enumerate(fleet.types):
        where = f"types[{index}] ({etype.name})"
        stored = state.types.get(etype.name)
        if stored is not None and set(stored) != set(etype.required_fields):
            yield where, (f"the store's type {etype.name!r} requires fields {sorted(stored)}, "
                          f"the file says {sorted(etype.required_fields)}; required fields "
                          "cannot change in place")
            continue
        rows = {(etype.name, s, r) for s in etype.senders for r in etype.receivers}
        missing = sorted(rows - state.permissions)
        if stored is None:
            yield where, Change("type", etype.name, "create", _pairs(missing))
        elif missing:
            yield where, Change("permission", etype.name, "add", _pairs(missing))


def _pairs(rows: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{s} -> {r}" for _, s, r in rows)


def _plan_workspaces(fleet: Fleet, state: _State) -> Planned:
    for ws in _workspaces_in_order(fleet):
        where = f"workspaces[{fleet.workspaces.index(ws)}] ({ws.id})"
        wanted = {"role": ws.role, "parent": ws.parent,
                  "originator": effective_originator(fleet, ws), "delegation": ws.delegation}
        stored = state.workspaces.get(ws.id)
        if stored is None:
            parent = state.workspaces.get(ws.parent) if ws.parent else None
            if parent is not None and parent["state"] in SEALED:
                yield where, (f"the store's workspace {ws.parent!r}, its parent, is "
                              f"{parent['state']} and cannot have new children")
                continue
            yield where, Change("workspace", ws.id, "create", f"role {ws.role}" + (
                f", parent {ws.parent}" if ws.parent else ""))
            continue
        for key, value in wanted.items():  # (state is not the file's: not compared)
            if stored[key] != value:
                yield where, (f"the store's workspace {ws.id!r} has {key} {stored[key]!r}, the "
                              f"file says {value!r}; a workspace's {key} cannot change in place")
                break


#: workspace states that take no new children (WACP §5: sealed)
SEALED = frozenset({WorkspaceState.INTEGRATING.value, WorkspaceState.CLOSED.value,
                    WorkspaceState.FAILED.value})


def _workspaces_in_order(fleet: Fleet) -> list[WorkspaceDef]:
    """Parents before their children."""
    return _parents_first(list(fleet.workspaces), lambda w: w.id, lambda w: w.parent, set())


def _plan_subscriptions(fleet: Fleet, state: _State) -> Planned:
    for index, spec in enumerate(fleet.agents):
        where = f"agents[{index}] ({spec.name})"
        agent = fleet.agent(spec.name)
        stored = state.subscriptions.get(str(agent.id))
        wanted = (set(spec.patterns), set(agent.read_scopes))
        if spec.patterns and stored is None:
            yield where, Change("subscription", spec.name, "create",
                                f"{len(spec.patterns)} watch pattern(s)")
        elif spec.patterns and stored != wanted:
            yield where, Change("subscription", spec.name, "replace",
                                "its queued marks are dropped (Markspace P48)")
        elif not spec.patterns and stored is not None:
            yield where, Change("subscription", spec.name, "remove")


def _plan_names(fleet: Fleet, state: _State) -> Planned:
    for index, spec in enumerate(fleet.agents):
        agent = fleet.agent(spec.name)
        if state.names.get(str(agent.id)) != agent.name:
            yield f"agents[{index}] ({spec.name})", Change("agent", spec.name, "name",
                                                            f"id {agent.id}")


def apply(store: EnvelopeStore, fleet: Fleet, *, dry_run: bool = False) -> FleetPlan:
    """Make the store hold `fleet`: plan (nothing written on a conflict), then every change
    in one transaction, so a failing one leaves the store as it was. With `dry_run`, only
    the plan."""
    result = plan(store, fleet)
    if dry_run or result.empty:
        return result
    space = None
    try:
        with store.db.transaction() as conn:
            for change in result.changes:
                if change.kind not in ("subscription", "agent"):
                    _register(store, fleet, change)
                    continue
                space = space or _mark_space(store, fleet)
                with space.joined(conn):
                    _in_mark_space(space, fleet, change)
    finally:
        if space is not None:
            space.close()
    return result


def _register(store: EnvelopeStore, fleet: Fleet, change: Change) -> None:
    """A role, type (or its new permission rows) or workspace change, as one store step."""
    if change.kind == "role":
        role = next(r for r in fleet.roles if r.name == change.name)
        store.define_role(role.name, role.inherits)
    elif change.kind in ("type", "permission"):
        etype = next(t for t in fleet.types if t.name == change.name)
        store.register_type(etype.name, etype.senders, etype.receivers, etype.required_fields)
    else:
        ws = next(w for w in fleet.workspaces if w.id == change.name)
        store.create_workspace(ws.role, parent=ws.parent, originator=ws.originator,
                               delegation=ws.delegation, workspace_id=ws.id)


def _mark_space(store: EnvelopeStore, fleet: Fleet) -> Any:
    from agentpost.marks.postgres import PostgresMarkSpace

    return PostgresMarkSpace(dsn=store.dsn, scopes=fleet.scopes, space=fleet.space, pool_size=1)


def _in_mark_space(space: Any, fleet: Fleet, change: Change) -> None:
    """A subscription change, or an agent's name, through the fleet's mark space."""
    agent = fleet.agent(change.name)
    if change.kind == "agent":
        space.record_names([agent])
    elif change.action == "remove":
        space.unsubscribe(agent)
    else:
        space.subscribe(agent, fleet.agent_def(change.name).patterns)


def describe(result: FleetPlan, *, applied: bool) -> str:
    """The plan for a person: one line per change, or that the store already matches."""
    fleet = result.fleet
    head = (f"fleet {fleet.name!r} ({fleet.source}): {len(fleet.roles)} roles, "
            f"{len(fleet.types)} types, {len(fleet.workspaces)} workspaces, "
            f"{len(fleet.scopes)} scopes, {len(fleet.agents)} agents")
    if result.empty:
        return head + "\nnothing to change: the store already holds this fleet"
    verb = "applied" if applied else "would apply (dry run)"
    lines = [f"{verb} {len(result.changes)} change(s):"]
    lines += [f"  {change}" for change in result.changes]
    return "\n".join([head, *lines])


__all__ = ["Change", "FleetConflict", "FleetPlan", "apply", "describe", "plan"]
