"""The fleet file's model: roles, envelope types, workspaces, mark scopes and agent manifests.

Pure: the pydantic models and their field rules. Reading a file is `agentpost.fleet.files`,
the cross-references `agentpost.fleet.checks`; a fleet is checked whole (every field, then
every cross-reference) before anyone writes anything, and a bad file raises `FleetError`
naming the file, the entry and the problem on one line. docs/fleet.md is the reference of
the format.

A fleet file is self-contained: every role, envelope type and workspace it names is defined
in it, or is one of the store's built-ins (roles coordinator, worker, observer; types
directive, feedback, query). So a typo is caught here, at parse time, not by the store.

Agents follow Markspace §13.2/§14.1: permissions per scope, inputs (watch patterns, or an
inbox), outputs (marks, or envelopes of a type to a workspace), and a schedule: an interval
(a source agent, P56), ``reactive`` (activated by its inbox), or none (run on demand).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from uuid import UUID, uuid5

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
    #: how a mutating command waits for a person: the agent pauses for Airflow's tool
    #: approval ("airflow"), or the command waits in the ledger and the agent goes on
    command_approval: Literal["airflow", "ledger"] = "airflow"
    #: seconds a paused agent waits for the person's answer before its task fails
    #: (default: no limit)
    approval_timeout: Annotated[StrictFloat | StrictInt, Field(gt=0, le=30 * 86_400)
                                ] | None = None

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

__all__ = [
    "AGENT_NAMESPACE",
    "BUILTIN_ROLES",
    "BUILTIN_TYPES",
    "DEFAULT_LLM_CONN_ID",
    "FORMAT_VERSION",
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
    "parse_duration",
]
