"""A fleet's cross-references: every role, type, workspace, scope and agent it names is
defined (in the file or among the store's built-ins), with nothing defined twice, and what an
agent's inputs, outputs and LLM tools need is granted. Run on every fleet before it is
returned (`agentpost.fleet.files.checked`); each problem is (entry, message)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from agentpost.fleet.model import (
    BUILTIN_ROLES,
    BUILTIN_TYPES,
    MARK_TOOLS,
    AgentDef,
    Fleet,
    InboxInput,
    MarkOutput,
    WorkspaceDef,
)
from agentpost.marks.core import (
    MarkType,
    scope_covers,
)

# -- cross-references -----------------------------------------------------------------------


def check_references(fleet: Fleet) -> Iterator[tuple[str, str]]:
    """Every problem across entries, as (entry, problem): duplicates, unknown names,
    cycles, outputs an agent may not produce (P54), envelopes the matrix would refuse."""
    yield from _duplicates(fleet)
    yield from _check_roles(fleet)
    yield from _check_types(fleet)
    yield from _check_workspaces(fleet)
    yield from _check_agents(fleet)


def _label(kind: str, index: int, name: str) -> str:
    return f"{kind}[{index}] ({name})"


def _duplicates(fleet: Fleet) -> Iterator[tuple[str, str]]:
    groups: dict[str, Iterable[str]] = {
        "roles": (r.name for r in fleet.roles),
        "types": (t.name for t in fleet.types),
        "workspaces": (w.id for w in fleet.workspaces),
        "scopes": (s.name for s in fleet.scopes),
        "agents": (a.name for a in fleet.agents),
    }
    for kind, names in groups.items():
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                yield _label(kind, index, name), f"{name!r} is defined twice"
            seen.add(name)


def _roles(fleet: Fleet) -> set[str]:
    return set(BUILTIN_ROLES) | {r.name for r in fleet.roles}


def _check_roles(fleet: Fleet) -> Iterator[tuple[str, str]]:
    known = _roles(fleet)
    for index, role in enumerate(fleet.roles):
        where = _label("roles", index, role.name)
        if role.name in BUILTIN_ROLES and role.inherits is not None:
            yield where, f"{role.name!r} is a built-in role and inherits nothing"
        elif role.inherits is not None and role.inherits not in known:
            yield where, f"inherits unknown role {role.inherits!r}"
        elif _inherits_itself(fleet, role.name):
            yield where, "its inheritance is a cycle"


def _inherits_itself(fleet: Fleet, name: str) -> bool:
    parents = {r.name: r.inherits for r in fleet.roles}
    seen: set[str] = set()
    current = parents.get(name)
    while current is not None and current not in seen:
        if current == name:
            return True
        seen.add(current)
        current = parents.get(current)
    return False


def _check_types(fleet: Fleet) -> Iterator[tuple[str, str]]:
    known = _roles(fleet)
    for index, etype in enumerate(fleet.types):
        for role in etype.senders + etype.receivers:
            if role not in known:
                yield _label("types", index, etype.name), f"unknown role {role!r}"


def _check_workspaces(fleet: Fleet) -> Iterator[tuple[str, str]]:
    known, ids = _roles(fleet), {w.id: w for w in fleet.workspaces}
    for index, ws in enumerate(fleet.workspaces):
        where = _label("workspaces", index, ws.id)
        if ws.role not in known:
            yield where, f"unknown role {ws.role!r}"
        if ws.parent is not None and ws.parent not in ids:
            yield where, f"unknown parent workspace {ws.parent!r}"
        elif _ancestors(ws, ids) is None:
            yield where, "its parents form a cycle"
        else:
            inherited = next((a.originator for a in _ancestors(ws, ids) or ()
                              if a.originator != "system"), None)
            if inherited and ws.originator not in ("system", inherited):
                yield where, (f"originator is immutable: it inherits {inherited!r} from its "
                              f"parents, not {ws.originator!r}")


def _ancestors(ws: WorkspaceDef, ids: Mapping[str, WorkspaceDef]) -> list[WorkspaceDef] | None:
    """The parent chain of `ws`, nearest first; None for a cycle."""
    chain: list[WorkspaceDef] = []
    current = ids.get(ws.parent) if ws.parent else None
    while current is not None:
        if current.id == ws.id or current in chain:
            return None
        chain.append(current)
        current = ids.get(current.parent) if current.parent else None
    return chain


def effective_originator(fleet: Fleet, ws: WorkspaceDef) -> str:
    """The originator the store will record: a parent's user propagates (WACP §3)."""
    ids = {w.id: w for w in fleet.workspaces}
    chain = [ws, *(_ancestors(ws, ids) or ())]
    return next((w.originator for w in reversed(chain) if w.originator != "system"), "system")


def _scope_defined(fleet: Fleet, scope: str) -> bool:
    return any(scope_covers(s.name, scope) for s in fleet.scopes)


def _check_agents(fleet: Fleet) -> Iterator[tuple[str, str]]:
    workspaces = {w.id: w for w in fleet.workspaces}
    for index, spec in enumerate(fleet.agents):
        where = _label("agents", index, spec.name)
        if spec.workspace is not None and spec.workspace not in workspaces:
            yield where, f"unknown workspace {spec.workspace!r}"
        named = [*spec.scopes, *spec.read_scopes, *(p.scope for p in spec.patterns),
                 *(o.scope for o in spec.outputs if isinstance(o, MarkOutput))]
        for scope in named:
            if not _scope_defined(fleet, scope):
                yield where, f"unknown scope {scope!r} (define it under scopes)"
        for inbox in (i.inbox for i in spec.inputs if isinstance(i, InboxInput)):
            if inbox not in workspaces:
                yield where, f"input inbox {inbox!r} is not a workspace of the fleet"
        yield from ((where, p) for p in _output_problems(fleet, spec, workspaces))
        if spec.kind == "reactive" and not spec.inboxes:
            yield where, "a reactive agent needs an inbox input or a workspace"
        if spec.llm is not None:
            yield from ((where, p) for p in _llm_problems(fleet, spec))


def _llm_problems(fleet: Fleet, spec: AgentDef) -> Iterator[str]:
    """An LLM agent runs the model instead of code, acts as its workspace, and is offered
    mark tools only where the fleet has a mark space with scopes."""
    assert spec.llm is not None
    if spec.callable is not None:
        yield ("declares both callable and llm: an agent runs either its code or a model "
               "(make two agents)")
    if spec.workspace is None:
        yield "an LLM agent needs a workspace: the seat its tools act as"
    for inbox in (i.inbox for i in spec.inputs if isinstance(i, InboxInput)):
        if spec.workspace is not None and inbox != spec.workspace:
            yield (f"input inbox {inbox!r} is not the agent's workspace: an LLM agent reads "
                   f"only its own inbox ({spec.workspace!r}) with read_inbox")
    named_marks = [t for t in spec.llm.tools or () if t in MARK_TOOLS]
    if named_marks and not fleet.scopes:
        yield (f"llm.tools names {named_marks[0]!r} but the fleet defines no scopes (mark "
               "tools act in the fleet's mark space)")
    elif any(t in ("write_mark", "claim") for t in named_marks) and not spec.scopes:
        tool = next(t for t in named_marks if t in ("write_mark", "claim"))
        yield (f"llm.tools names {tool!r} but the agent may write no marks (give it scopes: "
               "{scope: [mark types]})")
    elif "claim" in named_marks and not any(
            MarkType.INTENT in types and MarkType.ACTION in types
            for types in spec.scopes.values()):
        yield ("llm.tools names 'claim' but no scope lets the agent write both intent and "
               "action marks (the guard denies a claim without them)")


def _output_problems(fleet: Fleet, spec: AgentDef,
                     workspaces: Mapping[str, WorkspaceDef]) -> Iterator[str]:
    for out in spec.outputs:
        if isinstance(out, MarkOutput):
            if not any(out.mark_type in types and scope_covers(granted, out.scope)
                       for granted, types in spec.scopes.items()):
                yield (f"declares output {out.mark_type.value} on {out.scope!r} but may not "
                       "write it (Markspace P54)")
            continue
        rows = _permission_rows(fleet, out.envelope)
        if rows is None:
            yield f"output envelope type {out.envelope!r} is not defined"
        elif out.to not in workspaces:
            yield f"output envelope to unknown workspace {out.to!r}"
        elif spec.workspace is None:
            yield "sends envelopes but has no workspace to send from"
        elif spec.workspace in workspaces:  # (an unknown one is reported already)
            sender = fleet.lineage(workspaces[spec.workspace].role)
            receiver = fleet.lineage(workspaces[out.to].role)
            if not any(s in sender and r in receiver for s, r in rows):
                yield (f"may not send {out.envelope!r} from {spec.workspace!r} to {out.to!r}: "
                       "no sender/receiver role pair of the type allows it")


def _permission_rows(fleet: Fleet, etype: str) -> list[tuple[str, str]] | None:
    """The (sender role, receiver role) rows of a type, as the fleet leaves the matrix."""
    declared = [t for t in fleet.types if t.name == etype]
    if not declared and etype not in BUILTIN_TYPES:
        return None
    rows = list(BUILTIN_TYPES.get(etype, ()))
    for t in declared:
        rows += [(s, r) for s in t.senders for r in t.receivers]
    return rows

__all__ = [
    "check_references",
    "effective_originator",
]
