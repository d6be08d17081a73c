"""The fleet file: roles, envelope types, workspaces, mark scopes and agent manifests, in YAML.

Pure: parsing and validation only, no I/O but reading the file. A fleet is checked whole
(every field, then every cross-reference) before anyone writes anything, and a bad file
raises `FleetError` naming the file, the entry and the problem on one line. docs/fleet.md
is the reference of the format.

A fleet file is self-contained: every role, envelope type and workspace it names is defined
in it, or is one of the store's built-ins (roles coordinator, worker, observer; types
directive, feedback, query). So a typo is caught here, at parse time, not by the store.

Agents follow Markspace §13.2/§14.1: permissions per scope, inputs (watch patterns, or an
inbox), outputs (marks, or envelopes of a type to a workspace), and a schedule: an interval
(a source agent, P56), ``reactive`` (activated by its inbox), or none (run on demand).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID, uuid5

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
)

from agentpost.marks.core import (
    Agent,
    AgentManifest,
    ManifestOutput,
    MarkType,
    Scope,
    TokenBudget,
    WatchPattern,
    scope_covers,
)
from agentpost.protocol.errors import InvalidInput

FORMAT_VERSION = 1
#: how deeply a fleet file may nest (mappings and lists, the top level being 1); far beyond
#: any real file, and well within what the YAML composer and later JSON encoders recurse into
MAX_DEPTH = 64
#: what the store defines before any fleet (sql/0001_registry.sql)
BUILTIN_ROLES = ("coordinator", "worker", "observer")
BUILTIN_TYPES: dict[str, tuple[tuple[str, str], ...]] = {
    "directive": (("coordinator", "worker"),),
    "feedback": (("coordinator", "worker"),),
    "query": (("worker", "coordinator"),),
}
#: agent ids are uuid5(this, "<space>/<agent name>"): the same in every process and run
AGENT_NAMESPACE = UUID("0b6f3c5e-8a51-5d1e-9a3f-6c1d2e7f4a90")
#: the tools an LLM agent may be given (`agentpost.tools.TOOLS`, which this layer may not
#: import; tests/ai holds the two lists equal)
LLM_TOOLS = ("send_envelope", "read_inbox", "reply", "ack", "read_marks", "write_mark",
             "claim", "submit_command")
#: the tools that act in the fleet's mark space (offered only when the fleet has scopes)
MARK_TOOLS = ("read_marks", "write_mark", "claim")
#: the Airflow connection of the model when the file names none (common-ai's default)
DEFAULT_LLM_CONN_ID = "pydanticai_default"

#: unknown keys refused; names are strings and flags booleans, never coerced (a quoted
#: "yes" is not true, a !!binary value not a name)
_STRICT = ConfigDict(extra="forbid", frozen=True)
RoleName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z][A-Za-z0-9._-]*$", max_length=64)]
Ident = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
CallableRef = Annotated[
    StrictStr, Field(pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$", max_length=200)
]
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class FleetError(InvalidInput):
    """A fleet file that cannot be applied as written: `source`, `entry` and `problem` say
    where and why, and str() puts them on one line."""

    def __init__(self, source: str, entry: str, problem: str) -> None:
        self.source, self.entry, self.problem = source, entry, problem
        where = f"{source}: {entry}" if entry else source
        super().__init__(f"{where}: {problem}")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``90``, ``30s``, ``5m``, ``1.5h``, ``1d``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '5m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError(f"{value!r} is not a duration (e.g. 300, '30s', '5m', '1h')")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds > 0:
        raise ValueError("a duration must be > 0")
    return seconds


class RoleDef(BaseModel):
    model_config = _STRICT

    name: RoleName
    inherits: RoleName | None = None


class TypeDef(BaseModel):
    """An envelope type and its permission rows: every sender role to every receiver role."""

    model_config = _STRICT

    name: Ident
    senders: tuple[RoleName, ...] = Field(min_length=1)
    receivers: tuple[RoleName, ...] = Field(min_length=1)
    required_fields: tuple[Ident, ...] = ()


class WorkspaceDef(BaseModel):
    model_config = _STRICT

    id: Ident
    role: RoleName
    parent: Ident | None = None
    originator: Ident = "system"
    delegation: StrictBool = False


class InboxInput(BaseModel):
    """An agent input that is a workspace's inbox (not a mark pattern)."""

    model_config = _STRICT

    inbox: Ident


class EnvelopeOutput(BaseModel):
    """An agent output that is an envelope of `envelope` type sent to workspace `to`."""

    model_config = _STRICT

    envelope: Ident
    to: Ident


class MarkOutput(BaseModel):
    model_config = _STRICT

    scope: StrictStr
    mark_type: MarkType


def _tag(key: str, present: str, absent: str) -> Discriminator:
    """Pick a union member by whether the entry has `key`, so errors are the member's."""
    return Discriminator(
        lambda v: present if (key in v if isinstance(v, Mapping) else hasattr(v, key))
        else absent)


Input = Annotated[
    Annotated[InboxInput, Tag("InboxInput")] | Annotated[WatchPattern, Tag("WatchPattern")],
    _tag("inbox", "InboxInput", "WatchPattern"),
]
Output = Annotated[
    Annotated[EnvelopeOutput, Tag("EnvelopeOutput")] | Annotated[MarkOutput, Tag("MarkOutput")],
    _tag("envelope", "EnvelopeOutput", "MarkOutput"),
]


PositiveInt = Annotated[StrictInt, Field(gt=0)]
Text = Annotated[StrictStr, Field(min_length=1, max_length=100_000)]


class UsageLimitsDef(BaseModel):
    """Caps on one run of an LLM agent (pydantic-ai's `UsageLimits`); a run that would pass
    one fails its task."""

    model_config = _STRICT

    request_limit: PositiveInt | None = None
    tool_calls_limit: PositiveInt | None = None
    input_tokens_limit: PositiveInt | None = None
    output_tokens_limit: PositiveInt | None = None
    total_tokens_limit: PositiveInt | None = None


class LlmDef(BaseModel):
    """An agent whose activation is a language model with the agentpost tools of its seat
    (its workspace and its mark-space agent), run by common-ai's AgentOperator."""

    model_config = _STRICT

    prompt: Text
    system_prompt: Annotated[StrictStr, Field(max_length=100_000)] = ""
    llm_conn_id: Ident = DEFAULT_LLM_CONN_ID
    model_id: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = None
    #: the tools offered (default: every tool the seat has)
    tools: tuple[StrictStr, ...] | None = None
    usage_limits: UsageLimitsDef | None = None
    #: seconds a read_inbox lease lasts
    lease_ttl: Annotated[StrictFloat | StrictInt, Field(gt=0, le=86_400)] = 300
    #: how often the model may correct a refused tool call (default: the run's)
    max_retries: Annotated[StrictInt, Field(ge=0, le=20)] | None = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return value
        unknown = [t for t in value if t not in LLM_TOOLS]
        if unknown:
            raise ValueError(f"unknown tool {unknown[0]!r}; the tools are "
                             f"{', '.join(LLM_TOOLS)}")
        if len(set(value)) != len(value):
            twice = next(t for t in value if value.count(t) > 1)
            raise ValueError(f"tool {twice!r} is listed twice")
        if not value:
            raise ValueError("an empty tool list offers the model nothing: leave tools out "
                             "for every tool, or name some")
        return value


class AgentDef(BaseModel):
    """One agent manifest of the file (Markspace §13.2, §14.1) and how to run it."""

    model_config = _STRICT

    name: Ident
    id: UUID | None = None
    workspace: Ident | None = None
    scopes: dict[str, tuple[MarkType, ...]] = Field(default_factory=dict)
    read_scopes: tuple[StrictStr, ...] = ()
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    schedule: float | Literal["reactive"] | None = None
    callable: CallableRef | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    expected_activity: dict[MarkType, StrictFloat] = Field(default_factory=dict)
    budget: TokenBudget | None = None
    llm: LlmDef | None = None

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: object) -> object:
        if value is None or value == "reactive":
            return value
        return parse_duration(value)

    @property
    def kind(self) -> Literal["source", "reactive", "manual"]:
        """source: runs every `schedule` seconds; reactive: on its inbox; manual: on demand."""
        if self.schedule == "reactive":
            return "reactive"
        return "manual" if self.schedule is None else "source"

    @property
    def interval(self) -> float | None:
        return self.schedule if isinstance(self.schedule, float) else None

    @property
    def patterns(self) -> tuple[WatchPattern, ...]:
        return tuple(i for i in self.inputs if isinstance(i, WatchPattern))

    @property
    def inboxes(self) -> tuple[str, ...]:
        """The inboxes a reactive agent runs on: its inbox inputs, else its workspace's."""
        named = tuple(i.inbox for i in self.inputs if isinstance(i, InboxInput))
        return named or ((self.workspace,) if self.workspace else ())


class Fleet(BaseModel):
    """A whole fleet file, validated. `agent(name)` gives the Markspace Agent."""

    model_config = _STRICT

    version: Literal[1] = FORMAT_VERSION
    name: Ident
    space: Annotated[StrictStr, Field(min_length=1, max_length=200)] = "default"
    roles: tuple[RoleDef, ...] = ()
    types: tuple[TypeDef, ...] = ()
    workspaces: tuple[WorkspaceDef, ...] = ()
    scopes: tuple[Scope, ...] = ()
    agents: tuple[AgentDef, ...] = ()
    _source: str = PrivateAttr("<fleet>")

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        """The integer 1: not true, 1.0 or "1" (a Literal compares equal to them)."""
        if type(value) is not int:
            raise ValueError(f"Input should be 1, the integer, not {type(value).__name__}")
        return value

    @property
    def source(self) -> str:
        """The file (or name) it was read from, for messages."""
        return self._source

    def agent_def(self, name: str) -> AgentDef:
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise FleetError(self.source, f"agent {name!r}", "no such agent in the fleet file")

    def agent(self, name: str) -> Agent:
        """The Markspace Agent of `name`, with its stable id (the same in every process)."""
        spec = self.agent_def(name)
        manifest = AgentManifest(
            inputs=spec.patterns,
            outputs=tuple(ManifestOutput(o.scope, o.mark_type) for o in spec.outputs
                          if isinstance(o, MarkOutput)),
            schedule_interval=spec.interval,
            expected_activity={k.value: v for k, v in spec.expected_activity.items()},
            budget=spec.budget,
        )
        return Agent(id=spec.id or uuid5(AGENT_NAMESPACE, f"{self.space}/{spec.name}"),
                     name=spec.name, scopes=spec.scopes, read_scopes=spec.read_scopes,
                     manifest=manifest)

    def deferred_scopes(self) -> tuple[Scope, ...]:
        return tuple(s for s in self.scopes if s.deferred)

    def lineage(self, role: str) -> tuple[str, ...]:
        """The role and its ancestors (the file's roles and the built-ins)."""
        parents = {r.name: r.inherits for r in self.roles}
        chain: list[str] = []
        current: str | None = role
        while current is not None and current not in chain:
            chain.append(current)
            current = parents.get(current)
        return tuple(chain)


# -- loading --------------------------------------------------------------------------------


class _TooDeep(yaml.composer.ComposerError):
    """A document nested deeper than MAX_DEPTH."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping with the same key twice (PyYAML keeps the
    last silently, which would hide half of a definition) and nesting deeper than
    MAX_DEPTH (PyYAML composes nodes recursively: 5,000 levels were a RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.ScalarEvent, yaml.AliasEvent):  # no level of its own
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(None, None, f"nested deeper than {MAX_DEPTH} levels",
                           self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_fleet(path: str | Path) -> Fleet:
    """The fleet of the YAML file at `path`, validated whole; FleetError otherwise."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(source, "", f"cannot read it: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    return parse_fleet(text, source)


def parse_fleet(text: str, source: str = "<fleet>") -> Fleet:
    """The fleet of YAML `text`; `source` names it in errors."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if not isinstance(exc, _TooDeep):
            problem = f"not valid YAML: {problem}"
        raise FleetError(source, line, problem) from None
    return fleet_from_dict(data, source)


def fleet_from_dict(data: object, source: str = "<fleet>") -> Fleet:
    """The fleet of an already parsed document (a mapping)."""
    if not isinstance(data, Mapping):
        raise FleetError(source, "", "a fleet file is a mapping with name, roles, types, "
                         "workspaces, scopes and agents")
    if _too_deep(data):
        raise FleetError(source, "", f"nested deeper than {MAX_DEPTH} levels")
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FleetError(source, _entry(data, first["loc"]), _problem(first)) from None
    fleet._source = source
    return checked(fleet)


def _too_deep(data: object) -> bool:
    """Whether `data` nests mappings and lists deeper than MAX_DEPTH, without recursing. A
    node shared by several parents (a YAML alias) is walked again only when reached deeper
    than before, so shared nodes cost no exponential walk."""
    deepest: dict[int, int] = {}
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Mapping | list | tuple):
            continue
        if depth > MAX_DEPTH:
            return True
        if deepest.get(id(node), 0) >= depth:
            continue
        deepest[id(node)] = depth
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((child, depth + 1) for child in children)
    return False


def checked(fleet: Fleet) -> Fleet:
    """`fleet` if its entries agree with each other, else FleetError for the first problem
    (a Fleet built directly, not from a file, has had its fields checked only)."""
    problems = list(check_references(fleet))
    if problems:
        entry, problem = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise FleetError(fleet.source, entry, problem + more)
    return fleet


def _entry(data: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    """``agents[2] (driver-c).schedule`` from a pydantic location in the document. Steps
    that are no key of the document (a union member's name) are left out, but for the
    last (a missing or unknown field)."""
    parts: list[str] = []
    node: Any = data
    for position, item in enumerate(loc):
        if isinstance(item, int) and parts:
            node = node[item] if isinstance(node, list) and item < len(node) else None
            label = node.get("name") or node.get("id") if isinstance(node, Mapping) else None
            parts[-1] += f"[{item}]" + (f" ({label})" if isinstance(label, str) else "")
        elif isinstance(node, Mapping) and item in node:
            parts.append(str(item))
            node = node[item]
        elif position == len(loc) - 1:
            parts.append(str(item))
    return ".".join(parts)


def _problem(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "missing":
        return "missing (required)"
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    return message.removeprefix("Value error, ").splitlines()[0]


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
    "AGENT_NAMESPACE",
    "BUILTIN_ROLES",
    "BUILTIN_TYPES",
    "DEFAULT_LLM_CONN_ID",
    "LLM_TOOLS",
    "MARK_TOOLS",
    "MAX_DEPTH",
    "AgentDef",
    "EnvelopeOutput",
    "Fleet",
    "FleetError",
    "InboxInput",
    "LlmDef",
    "MarkOutput",
    "RoleDef",
    "TypeDef",
    "UsageLimitsDef",
    "WorkspaceDef",
    "check_references",
    "checked",
    "effective_originator",
    "fleet_from_dict",
    "load_fleet",
    "parse_duration",
    "parse_fleet",
]
