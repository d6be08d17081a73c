"""The vocabulary of the mark space (Markspace spec §2–§7, §11, §13): enums, frozen models,
the DSL helpers, typed errors, and the pure functions every backend computes strength with.

Nothing here does I/O or keeps state, so both backends (`space.MarkSpace` in memory and
`postgres.PostgresMarkSpace`) validate writes and compute strength with the *same* code and
cannot drift apart.

Readings chosen where the spec leaves room (also in docs/design.md):

- Enum values are the spec's lowercase words (`MarkType.INTENT == "intent"`).
- A mark built with bad fields raises `MarkValidationError`, which is at once an
  `InvalidMark` (our typed error, a `ValueError`) and a pydantic `ValidationError`, so callers
  may catch either. The space re-validates every mark it is handed, so a mark made with
  `model_construct` or `model_copy(update=...)` cannot slip bad values in.
- Text fields refuse NUL bytes and lone surrogates and dict fields must be JSON (string
  keys, finite numbers): what one backend stores, the other (Postgres, jsonb) can store too.
  Dict fields are deep-frozen (`FrozenDict`, `FrozenList`) so a stored mark cannot be changed
  through a reference the caller still holds (P30).
- Defaults where the proto has a MUST field with an obvious neutral value: confidence 1.0,
  source FLEET, severity CAUTION, reason "", priority 0.5, blocking False, empty dicts.
- Bounds the spec leaves open: a scope name, resource, verb or topic has at most `MAX_LABEL`
  characters; a mark's content (`content_bytes`) at most the space's `max_content_bytes`
  (`check_content_size`; docs/marks.md).
- Scope lists: an *empty* verb or topic list means "unrestricted"; `"*"` in a list also means
  "any" (§6.2.3). Topic lists default to `("*",)`, verb lists to `()`.
- `resolve_conflict` returns the winner's id (spec: `resolve(intents) → winner_id`), or None
  when there is no winner (no intents, or YIELD_ALL, as in the package); `winning_intent`
  returns the mark itself, and under YIELD_ALL a lone intent (no conflict, §6.1 step 2).
- Intent strength is full while `age <= ttl` and 0 after (P4 only needs 0 for t > ttl). A
  negative age (the clock was set back) counts as age 0, so decay never amplifies (P7).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType
from typing import Annotated, Any, Literal, NamedTuple
from uuid import UUID, uuid4

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic import ValidationError as PydanticValidationError

from agentpost.protocol.errors import AgentpostError

# --------------------------------------------------------------------------- errors


class MarkspaceError(AgentpostError):
    """Base of every error the mark space raises on purpose."""


class ScopeError(MarkspaceError):
    """An agent is not authorized for the write (the `markspace` package's name)."""


class ValidationError(MarkspaceError, ValueError):
    """A mark or a request fails validation against its scope (the `markspace` package's
    name). Not pydantic's `ValidationError`: `MarkValidationError` is both."""


class QuotaExceededError(MarkspaceError):
    """An agent already has the space's `max_marks_per_agent` live marks."""


class UnauthorizedWrite(ScopeError, PermissionError):
    """The agent has no write permission for this (scope, mark type) (P19, P23), or claims
    a higher source than its `max_source` allows."""


class UnknownScope(ValidationError, LookupError):
    """No scope with this name, nor any ancestor of it, is registered."""


class UnknownMark(ValidationError, LookupError):
    """A mark id (for example the need given to `resolve`) is not in the space."""


class InvalidMark(ValidationError):
    """The mark is malformed, or breaks its scope's rules (verb, topic). Nothing is stored."""


class MarkValidationError(InvalidMark, PydanticValidationError):
    """A mark's fields failed validation at construction: both an `InvalidMark` and the
    pydantic `ValidationError` it came from, so either `except` clause catches it."""


class InvalidArgument(MarkspaceError, ValueError):
    """A space operation got an argument of the wrong kind (not an Agent, empty patterns...)."""


# --------------------------------------------------------------------------- enums


class MarkType(StrEnum):
    INTENT = "intent"
    ACTION = "action"
    OBSERVATION = "observation"
    WARNING = "warning"
    NEED = "need"


class Source(StrEnum):
    """Where an observation came from; trust follows this total order (§4.1)."""

    FLEET = "fleet"
    EXTERNAL_VERIFIED = "external_verified"
    EXTERNAL_UNVERIFIED = "external_unverified"


class Severity(StrEnum):
    INFO = "info"
    CAUTION = "caution"
    CRITICAL = "critical"


class ConflictPolicy(StrEnum):
    HIGHEST_CONFIDENCE = "highest_confidence"
    FIRST_WRITER = "first_writer"
    YIELD_ALL = "yield_all"


class ScopeVisibility(StrEnum):
    OPEN = "open"
    PROTECTED = "protected"
    CLASSIFIED = "classified"


# --------------------------------------------------------------------------- DSL helpers


def hours(n: float) -> float:
    """`n` hours in seconds: the DSL writes durations as `hours(1)`, time is in seconds."""
    return float(n) * 3600.0


def minutes(n: float) -> float:
    """`n` minutes in seconds."""
    return float(n) * 60.0


# --------------------------------------------------------------------------- frozen JSON


class FrozenDict(dict):
    """A dict that refuses changes: dict fields of frozen marks stay frozen (P30), while
    still comparing equal to (and serializing like) a plain dict."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("marks are immutable; build a new mark instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list):
    """A list that refuses changes (the array counterpart of `FrozenDict`)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("marks are immutable; build a new mark instead")

    __setitem__ = __delitem__ = append = extend = insert = remove = pop = _refuse
    clear = sort = reverse = __iadd__ = __imul__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def check_text(value: str) -> str:
    """Refuse text Postgres cannot store (NUL bytes, lone surrogates), so both backends
    accept exactly the same marks."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def freeze_json(value: Any, _depth: int = 0) -> Any:
    """A deep-frozen copy of a JSON value; raises ValueError for anything JSON cannot hold
    (non-string keys, NaN/inf, sets, objects)."""
    if _depth > 64:
        raise ValueError("JSON value nested too deeply")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON numbers must be finite")
        return value
    if isinstance(value, str):
        return check_text(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("JSON object keys must be strings")
            out[check_text(key)] = freeze_json(item, _depth + 1)
        return FrozenDict(out)
    if isinstance(value, list | tuple):
        return FrozenList(freeze_json(item, _depth + 1) for item in value)
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _freeze_object(value: dict[str, Any]) -> FrozenDict:
    return freeze_json(value)


#: the longest scope name, resource, verb or topic (characters)
MAX_LABEL = 200

Text = Annotated[str, AfterValidator(check_text)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_LABEL), AfterValidator(check_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_freeze_object)]
#: any JSON value, deep-frozen: the content of a mark (the package's `MarkPayload` is `Any`;
#: ours must be JSON, which the Postgres backend stores)
JsonValue = Annotated[Any, AfterValidator(freeze_json)]
#: the type of a mark's payload fields (Action.result, Observation.content, Need.context), the
#: `markspace` package's name for it
MarkPayload = Any
Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Positive = Annotated[float, Field(gt=0.0)]


_SCOPE_SEGMENT = re.compile(r"[^/\s]+")


@lru_cache(maxsize=4096)
def check_scope_name(name: str) -> str:
    """A scope name is one or more non-empty `/`-separated segments without whitespace
    (`"calendar"`, `"research/topic/X"`); anything else would make hierarchy matching
    ambiguous."""
    check_text(name)
    if len(name) > MAX_LABEL:
        raise ValueError(f"a scope name has at most {MAX_LABEL} characters")
    if not name or not all(_SCOPE_SEGMENT.fullmatch(seg) for seg in name.split("/")):
        raise ValueError(f"invalid scope name {name!r}")
    return name


ScopeName = Annotated[str, AfterValidator(check_scope_name)]


def scope_ancestors(name: str) -> list[str]:
    """`"a/b/c"` -> `["a/b/c", "a/b", "a"]`: nearest first, for hierarchical lookups."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def scope_contains(parent: str, child: str) -> bool:
    """Whether `child` is `parent` or nested under it (P23 hierarchy)."""
    return child == parent or child.startswith(parent + "/")


#: our earlier name of `scope_contains`
scope_covers = scope_contains


_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# --------------------------------------------------------------------------- marks


class Mark(BaseModel):
    """Fields every mark has (§2.1). `id`, `agent_id` and `created_at` are assigned by the
    space on write; whatever the caller puts there is replaced. A mark built in code has a
    random provisional `id` (as in the package), so the pure functions work on it before
    it is written: `resolve_conflict` names a winner (P11, P12) and a Warning can point at
    it (`invalidates`, P34); `agent_id` and `created_at` stay None until the write."""

    model_config = _FROZEN

    id: UUID | None = Field(default_factory=uuid4)
    mark_type: MarkType
    agent_id: UUID | None = None
    scope: ScopeName
    created_at: float | None = None
    initial_strength: Annotated[float, Field(ge=0.0)] = 1.0
    supersedes: UUID | None = None
    projected: bool = False

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except PydanticValidationError as exc:
            raise as_mark_error(exc) from None


def as_mark_error(exc: PydanticValidationError) -> InvalidMark:
    """Re-raise a pydantic error as our typed `MarkValidationError` (keeps the details)."""
    try:
        return MarkValidationError.from_exception_data(exc.title, exc.errors(include_url=False))
    except Exception:  # an error type from_exception_data cannot rebuild
        return InvalidMark(str(exc))


class Intent(Mark):
    """An agent plans to act on a resource (§2.2); lives until the scope's intent TTL."""

    mark_type: Literal[MarkType.INTENT] = MarkType.INTENT
    resource: Name
    action: Name
    confidence: Unit = 0.5


class Action(Mark):
    """Something an agent did (§2.3): a fact, never decays; `failed` ones claim nothing."""

    mark_type: Literal[MarkType.ACTION] = MarkType.ACTION
    resource: Name | None = None
    action: Name
    result: JsonValue = None
    failed: bool = False


class Observation(Mark):
    """Something perceived (§2.4); decays with the scope's observation half-life."""

    mark_type: Literal[MarkType.OBSERVATION] = MarkType.OBSERVATION
    topic: Name
    content: JsonValue = None
    confidence: Unit = 0.5
    source: Source = Source.FLEET


class Warning(Mark):
    """A prior mark or assumption is no longer valid (§2.5); decays with the warning
    half-life and, while alive, subtracts its strength from the mark it `invalidates`."""

    mark_type: Literal[MarkType.WARNING] = MarkType.WARNING
    invalidates: UUID | None = None
    topic: Name
    reason: Text = ""
    severity: Severity = Severity.INFO


class Need(Mark):
    """A request for principal input (§2.6): full strength until resolved, then 0."""

    mark_type: Literal[MarkType.NEED] = MarkType.NEED
    question: Text
    context: JsonValue = None
    priority: Unit = 0.5
    blocking: bool = False
    resolved_by: UUID | None = None
    resolved_by_agent: UUID | None = None


AnyMark = Intent | Action | Observation | Warning | Need

MARK_CLASSES: dict[MarkType, type[Mark]] = {
    MarkType.INTENT: Intent,
    MarkType.ACTION: Action,
    MarkType.OBSERVATION: Observation,
    MarkType.WARNING: Warning,
    MarkType.NEED: Need,
}

#: the content fields of each mark type, which a projected read redacts (§7.4)
CONTENT_FIELDS: dict[MarkType, tuple[str, ...]] = {
    MarkType.INTENT: (),
    MarkType.ACTION: ("result",),
    MarkType.OBSERVATION: ("content",),
    MarkType.WARNING: ("reason",),
    MarkType.NEED: ("question", "context"),
}
#: what a projected read leaves in each content field
REDACTED: dict[str, Any] = {"result": None, "content": None, "reason": "", "question": "",
                            "context": None}


def json_bytes(value: Any) -> int:
    """The size of a JSON value as compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def content_bytes(mark: Mark) -> int:
    """The size of a mark's content fields (result, content, reason, question, context) as
    compact UTF-8 JSON: what `check_content_size` bounds."""
    return sum(json_bytes(getattr(mark, name)) for name in CONTENT_FIELDS[mark.mark_type])


def check_content_size(mark: Mark, limit: int) -> None:
    """Refuse a mark whose content is larger than ``limit`` bytes (the space's
    ``max_content_bytes``, AGENTPOST_MAX_MARK_CONTENT_BYTES) with InvalidMark."""
    size = content_bytes(mark)
    if size > limit:
        raise InvalidMark(
            f"the {mark.mark_type.value} mark's content is {size} bytes of JSON, more than "
            f"the {limit} allowed (AGENTPOST_MAX_MARK_CONTENT_BYTES)"
        )


def mark_from_record(record: Mapping[str, Any]) -> Mark:
    """Build the right mark class from a dict (e.g. a database row) keyed by `mark_type`."""
    try:
        cls = MARK_CLASSES[MarkType(record["mark_type"])]
    except (KeyError, ValueError):
        raise InvalidMark(f"unknown mark_type {record.get('mark_type')!r}") from None
    data = {k: v for k, v in record.items() if k in cls.model_fields}
    return cls(**data)


def revalidate(mark: object) -> Mark:
    """The mark re-checked field by field, as one of the five mark classes exactly.

    The space calls this on every write, because frozen models can still be built without
    validation (`model_construct`, `model_copy(update=...)`)."""
    if not isinstance(mark, Mark) or type(mark) not in MARK_CLASSES.values():
        raise InvalidMark(f"expected one of the five mark types, got {type(mark).__name__}")
    try:
        return type(mark).model_validate(dict(mark.__dict__))
    except PydanticValidationError as exc:
        raise as_mark_error(exc) from None
    except (TypeError, ValueError) as exc:
        raise InvalidMark(str(exc)) from None


# --------------------------------------------------------------------------- scopes


class DecayConfig(BaseModel):
    """Half-lives and the intent TTL of a scope (§7.2), in seconds, all > 0. The spec's
    SHOULD (warning half-life <= observation half-life) is not enforced: its own §12.1
    example breaks it."""

    model_config = _FROZEN

    observation_half_life: Positive = hours(1)
    warning_half_life: Positive = minutes(30)
    intent_ttl: Positive = minutes(30)


#: the decay of a Scope built without one (the `markspace` package's default)
SCOPE_DECAY = DecayConfig(observation_half_life=hours(6), warning_half_life=hours(2),
                          intent_ttl=minutes(30))


class ScopeRateLimit(BaseModel):
    """Per-agent and fleet-wide write caps per window (§9.12); None means no cap."""

    model_config = _FROZEN

    max_writes_per_agent_per_window: Annotated[int, Field(ge=0)] | None = None
    max_total_writes_per_window: Annotated[int, Field(ge=0)] | None = None
    window_seconds: Positive = 300.0


def _names(allowed: tuple[str, ...], value: str) -> bool:
    return value in allowed or "*" in allowed


def _allows(allowed: tuple[str, ...], value: str) -> bool:
    return not allowed or _names(allowed, value)


class Scope(BaseModel):
    """A namespace with its rules (§7.1). See the module docstring for list semantics."""

    model_config = _FROZEN

    name: ScopeName
    visibility: ScopeVisibility = ScopeVisibility.OPEN
    allowed_intent_verbs: tuple[Name, ...] = ()
    allowed_action_verbs: tuple[Name, ...] = ()
    observation_topics: tuple[Name, ...] = ("*",)
    warning_topics: tuple[Name, ...] = ("*",)
    decay: DecayConfig = Field(default_factory=lambda: SCOPE_DECAY)
    conflict_policy: ConflictPolicy = ConflictPolicy.HIGHEST_CONFIDENCE
    deferred: bool = False
    rate_limit: ScopeRateLimit | None = None

    def allows_intent_verb(self, action: str) -> bool:
        """Whether the verb list names `action` (or `"*"`). An empty list names nothing;
        the space treats it as "unrestricted" (`check_scope_rules`)."""
        return _names(self.allowed_intent_verbs, action)

    def allows_action_verb(self, action: str) -> bool:
        """As `allows_intent_verb`, for action verbs."""
        return _names(self.allowed_action_verbs, action)

    def allows_observation_topic(self, topic: str) -> bool:
        return _allows(self.observation_topics, topic)

    def allows_warning_topic(self, topic: str) -> bool:
        return _allows(self.warning_topics, topic)


# --------------------------------------------------------------------------- agents


class TokenBudget(BaseModel):
    """Token limits of an agent (§9.10); None means no limit. Tracking is in budget.py."""

    model_config = _FROZEN

    max_input_tokens_per_round: Annotated[int, Field(ge=0)] | None = None
    max_output_tokens_per_round: Annotated[int, Field(ge=0)] | None = None
    max_input_tokens_total: Annotated[int, Field(ge=0)] | None = None
    max_output_tokens_total: Annotated[int, Field(ge=0)] | None = None
    #: the warning comes before the hard stop (§9.10's runway), so strictly below 1
    warning_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.8


class WatchPattern(BaseModel):
    """A set of marks an agent is interested in (§13.1). Unset filters match anything; the
    scope matches hierarchically."""

    model_config = _FROZEN

    scope: ScopeName
    mark_type: MarkType | None = None
    topic: Name | None = None
    resource: Name | None = None

    def matches(self, mark: Mark) -> bool:
        """Pure field comparison (P55): no state is read or written."""
        if not scope_covers(self.scope, mark.scope):
            return False
        if self.mark_type is not None and mark.mark_type != self.mark_type:
            return False
        if self.topic is not None and mark_topic(mark) != self.topic:
            return False
        return self.resource is None or mark_resource(mark) == self.resource


_RESOURCE_TYPES = (MarkType.INTENT, MarkType.ACTION)
_TOPIC_TYPES = (MarkType.OBSERVATION, MarkType.WARNING)


def mark_resource(mark: Mark) -> str | None:
    """The resource of an intent or action; None for the other types."""
    return mark.resource if mark.mark_type in _RESOURCE_TYPES else None


def mark_topic(mark: Mark) -> str | None:
    """The topic of an observation or warning; None for the other types."""
    return mark.topic if mark.mark_type in _TOPIC_TYPES else None


class ManifestOutput(NamedTuple):
    """One declared output of a manifest; a plain `(scope, mark_type)` tuple works too."""

    scope: str
    mark_type: MarkType


class AgentManifest(BaseModel):
    """An agent's declared input/output contract (§13.2); purely declarative."""

    model_config = _FROZEN

    inputs: tuple[WatchPattern, ...] = ()
    outputs: tuple[ManifestOutput, ...] = ()
    #: §14.1 schedules intervals > 0; like the package's, a manifest may carry 0 or a
    #: negative one, which the Scheduler treats as "not scheduled" (finite, as every float)
    schedule_interval: float | None = None
    expected_activity: JsonObject | None = None
    budget: TokenBudget | None = None

    def produces(self, scope: str, mark_type: MarkType) -> bool:
        """Whether the manifest declares writing `mark_type` to exactly `scope`."""
        return (scope, MarkType(mark_type)) in self.outputs

    def consumes_pattern(self, pattern: WatchPattern) -> bool:
        """Whether the manifest declares `pattern` among its inputs."""
        return pattern in self.inputs

    @field_validator("expected_activity")
    @classmethod
    def _activity_keys(cls, value: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        for key, rate in (value or {}).items():
            MarkType(key)  # ValueError for anything but a mark type value
            if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
                raise ValueError(f"expected_activity[{key!r}] must be a rate >= 0")
        return value

    @field_validator("outputs")
    @classmethod
    def _output_scopes(cls, value: tuple[ManifestOutput, ...]) -> tuple[ManifestOutput, ...]:
        for out in value:
            check_scope_name(out.scope)
        return value


class Agent(BaseModel):
    """An identity with write permissions per scope and read authorization (§11.1).

    `scopes={"calendar": ["intent", "action"]}` is the DSL form of the proto's
    `permissions`. Authorization is hierarchical (P23): a permission for "a" covers "a/b/c".
    Read authorization comes from `read_scopes` only; write permission does not imply it."""

    model_config = _FROZEN

    id: UUID = Field(default_factory=uuid4)
    name: Text
    scopes: Annotated[dict[ScopeName, tuple[MarkType, ...]], AfterValidator(FrozenDict)] = Field(
        default_factory=FrozenDict
    )
    read_scopes: tuple[ScopeName, ...] = ()
    #: the most trusted source this agent may claim on an observation
    max_source: Source = Source.FLEET
    manifest: AgentManifest | None = None

    def can_write(self, scope_name: str, mark_type: MarkType | str) -> bool:
        """Whether some permission on `scope_name` or an ancestor lists `mark_type`."""
        return any(
            mark_type in types and scope_covers(granted, scope_name)
            for granted, types in self.scopes.items()
        )

    def can_read_content(self, scope_name: str) -> bool:
        """Content access to PROTECTED/CLASSIFIED `scope_name` (hierarchical, P23/P26)."""
        return any(scope_covers(granted, scope_name) for granted in self.read_scopes)

    can_read = can_read_content

    def __eq__(self, other: object) -> bool:
        """Agents are identities: two with the same id are the same agent."""
        if not isinstance(other, Agent):
            return NotImplemented
        return self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)


@dataclass
class NeedCluster:
    """A group of similar unresolved needs in one scope, for the principal (§8.4); a
    dataclass with the `markspace` package's fields, in its order."""

    scope: str
    needs: list[Need]
    effective_priority: float
    blocking_count: int
    contexts: list[Any]


# --------------------------------------------------------------------------- deferred verdicts


class DeferredVerdict(BaseModel):
    """One agent's verdict at a resolution boundary on (scope, resource) (§6.2.1 phase 3),
    as the space keeps it, so that every process and every Guard over the space sees the
    same verdicts (P12, P16, P17).

    A verdict is about one intent (``intent_id``, the agent's latest active intent at the
    boundary). It is replaced, with every other verdict on (scope, resource), by the next
    boundary there (``boundary`` grows); an ALLOW is used once (``consumed_by``: the action
    that used it); and it ends with its intent's TTL (``expires_at``), after which the space
    no longer returns it. ``winner_id`` is the intent that won (None: no winner, YIELD_ALL).
    The space assigns ``boundary``, ``decided_at`` and ``expires_at``."""

    model_config = _FROZEN

    scope: ScopeName
    resource: Name
    agent_id: UUID
    intent_id: UUID
    allowed: bool
    winner_id: UUID | None = None
    boundary: int = 0
    decided_at: float | None = None
    expires_at: float | None = None
    consumed_by: UUID | None = None


# --------------------------------------------------------------------------- write checks


_TRUST_RANK = {Source.EXTERNAL_UNVERIFIED: 0, Source.EXTERNAL_VERIFIED: 1, Source.FLEET: 2}


def check_write(agent: object, mark: object, scope: Scope) -> Mark:
    """Everything a write must satisfy besides the scope existing (§8.1), in order:
    a well-formed mark, an authorized agent (P19), then the scope's verbs and topics.
    Returns the re-validated mark; raises a typed error and changes nothing otherwise.
    `scope` is the definition that governs `mark.scope` (itself or nearest ancestor)."""
    if not isinstance(agent, Agent):
        raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
    mark = revalidate(mark)
    authorize_write(agent, mark, scope)
    return mark


def authorize_write(agent: Agent, mark: Mark, scope: Scope) -> None:
    """The checks of `check_write` after the mark's own fields: not a projection, the
    agent's permission for (mark.scope, mark_type), the scope's verbs and topics. For callers
    that already hold a re-validated mark (the space re-validates before the scope lookup)."""
    if mark.projected:
        raise InvalidMark("a projected mark is a redacted copy and cannot be written")
    if not agent.can_write(mark.scope, mark.mark_type):
        raise UnauthorizedWrite(
            f"agent {agent.name!r} is not authorized to write {mark.mark_type.value} marks "
            f"to scope {mark.scope!r}"
        )
    check_scope_rules(mark, scope)
    if isinstance(mark, Observation) and _TRUST_RANK[mark.source] > _TRUST_RANK[agent.max_source]:
        raise UnauthorizedWrite(
            f"agent {agent.name!r} (max_source={agent.max_source.value}) cannot write "
            f"observations with source={mark.source.value}"
        )


def check_scope_rules(mark: Mark, scope: Scope) -> None:
    """The scope's verb and topic lists (§7.1); InvalidMark when the mark breaks them."""
    if isinstance(mark, Intent) and not _allows(scope.allowed_intent_verbs, mark.action):
        raise InvalidMark(f"intent verb {mark.action!r} is not allowed in {scope.name!r}")
    if isinstance(mark, Action) and not _allows(scope.allowed_action_verbs, mark.action):
        raise InvalidMark(f"action verb {mark.action!r} is not allowed in {scope.name!r}")
    if isinstance(mark, Observation) and not scope.allows_observation_topic(mark.topic):
        raise InvalidMark(f"observation topic {mark.topic!r} is not allowed in {scope.name!r}")
    if isinstance(mark, Warning) and not scope.allows_warning_topic(mark.topic):
        raise InvalidMark(f"warning topic {mark.topic!r} is not allowed in {scope.name!r}")


# --------------------------------------------------------------------------- strength

#: the decay `compute_strength` uses when given none: a default Scope's
DEFAULT_DECAY = SCOPE_DECAY
#: trust weights (§4.1), read-only: the order fleet > verified > unverified is P6's
TRUST_WEIGHTS: Mapping[Source, float] = MappingProxyType({
    Source.FLEET: 1.0,
    Source.EXTERNAL_VERIFIED: 0.7,
    Source.EXTERNAL_UNVERIFIED: 0.3,
})
REINFORCEMENT_FACTOR = 0.3
REINFORCEMENT_CAP = 2.0
#: marks below this strength are left out of reads by default (§2.4 RECOMMENDED)
DEFAULT_MIN_STRENGTH = 0.01

DecaySource = DecayConfig | Scope | Callable[[Mark], DecayConfig] | None


def _decay_for(mark: Mark, decay: DecaySource) -> DecayConfig:
    if decay is None:
        return DEFAULT_DECAY
    if isinstance(decay, DecayConfig):
        return decay
    if isinstance(decay, Scope):
        return decay.decay
    return decay(mark)


def _half_life_decay(initial: float, age: float, half_life: float) -> float:
    return initial * 0.5 ** (age / half_life)


def compute_strength(mark: Mark, now: float, decay_config: DecaySource = None) -> float:
    """Base strength at `now` by the decay rules of §3.1, before trust, supersession and
    warnings. `decay_config` is the governing scope's DecayConfig (or the Scope, or a
    function of the mark); default a default Scope's. An unwritten mark (no created_at) has
    age 0."""
    decay = decay_config
    initial = mark.initial_strength
    age = 0.0 if mark.created_at is None else max(0.0, now - mark.created_at)
    kind = mark.mark_type
    if kind is MarkType.ACTION:
        return initial
    if kind is MarkType.NEED:
        return 0.0 if mark.resolved_by is not None else initial
    config = _decay_for(mark, decay)
    if kind is MarkType.INTENT:
        return initial if age <= config.intent_ttl else 0.0
    if kind is MarkType.OBSERVATION:
        return _half_life_decay(initial, age, config.observation_half_life)
    return _half_life_decay(initial, age, config.warning_half_life)


def trust_weight(source: Source | str | Mark | None) -> float:
    """Weight of a source (§4.1): fleet 1.0 > verified 0.7 > unverified 0.3. Marks without
    a source (everything but observations), or None, weigh 1.0."""
    if isinstance(source, Mark):
        # only observations carry a source (and a missing attribute is slow on pydantic)
        source = source.source if source.mark_type is MarkType.OBSERVATION else None
    if source is None:
        return 1.0
    weight = TRUST_WEIGHTS.get(source)  # a StrEnum member and its value hash alike
    return TRUST_WEIGHTS[Source(source)] if weight is None else weight


def effective_strength(mark: Mark, now: float, decay_config: DecaySource = None) -> float:
    """`compute_strength * trust_weight` (§4.2), in [0, initial_strength] (P7)."""
    return compute_strength(mark, now, decay_config) * trust_weight(mark)


def effective_strength_with_warnings(
    mark: Mark, warnings: Iterable[Warning], now: float, decay_config: DecaySource = None
) -> float:
    """§9.5: effective strength minus the live strength of the warnings that invalidate this
    mark, never below 0 (P34). Only warnings whose `invalidates` is this mark's id count, so
    callers may pass any warnings. Supersession is the space's business, not this one's."""
    base = effective_strength(mark, now, decay_config)
    if base <= 0.0 or mark.id is None:
        return max(0.0, base)
    penalty = sum(effective_strength(w, now, decay_config)
                  for w in warnings if w.invalidates == mark.id)
    return max(0.0, base - penalty)


def reinforce(
    strengths: Iterable[float],
    factor: float = REINFORCEMENT_FACTOR,
    cap: float = REINFORCEMENT_CAP,
) -> float:
    """Aggregate strength of marks on one (scope, topic) or (scope, resource) (§5.1): the
    strongest counts in full, each other one `factor` times, capped at `cap`. Sublinear
    (P8), bounded (P9) and monotonic in additions (P10). Strengths <= 0 add nothing."""
    if not 0.0 < factor < 1.0:
        raise ValueError("reinforcement factor must be in (0, 1)")
    if not math.isfinite(cap):
        raise ValueError("reinforcement cap must be finite")
    ordered = sorted((s for s in strengths if s > 0.0), reverse=True)
    if not ordered:
        return 0.0
    total = ordered[0] + factor * math.fsum(ordered[1:])
    return min(total, cap)


def _created_key(mark: Mark) -> tuple[bool, float]:
    return (mark.created_at is None, mark.created_at or 0.0)


def _tiebreak(intent: Intent) -> tuple[str, str, str, str]:
    return (str(intent.id or ""), str(intent.agent_id or ""), intent.resource, intent.action)


def intent_order_key(intent: Intent, policy: ConflictPolicy) -> tuple[Any, ...]:
    """Total order of intents under `policy`; the smallest key wins. Ties fall through to
    created_at, then id (P32), then other fields, so the winner never depends on the order
    the intents are given in (P11)."""
    first = -intent.confidence if policy is ConflictPolicy.HIGHEST_CONFIDENCE else 0.0
    return (first, *_created_key(intent), *_tiebreak(intent))


def winning_intent(intents: Sequence[Intent], policy: ConflictPolicy) -> Intent | None:
    """The intent that wins under `policy` (§6.1), or None: no intents, or YIELD_ALL with a
    real conflict (more than one intent), which only the principal can settle."""
    if not intents:
        return None
    policy = ConflictPolicy(policy)
    if policy is ConflictPolicy.YIELD_ALL and len(intents) > 1:
        return None
    return min(intents, key=lambda i: intent_order_key(i, policy))


def resolve_conflict(intents: Sequence[Intent], policy: ConflictPolicy) -> UUID | None:
    """`resolve(intents) → winner_id` (§6.4 P11): pure and deterministic. It settles a
    conflict, so under YIELD_ALL it names nobody (the principal decides), as the package's;
    a lone intent proceeds without it (§6.1 step 2, `winning_intent`)."""
    if ConflictPolicy(policy) is ConflictPolicy.YIELD_ALL:
        return None
    winner = winning_intent(intents, policy)
    return None if winner is None else winner.id


def project_mark(mark: Mark) -> Mark:
    """The projected copy an unauthorized reader of a PROTECTED scope sees (§7.4): every
    structural and coordination field kept (P24), content fields emptied, `projected=True`."""
    update: dict[str, Any] = {name: REDACTED[name] for name in CONTENT_FIELDS[mark.mark_type]}
    update["projected"] = True
    return mark.model_copy(update=update)


def visible_to(
    marks: list[Mark], scope: Scope, scope_name: str, reader: Agent | None
) -> list[Mark]:
    """Apply §7.4 to marks read from `scope_name` (governed by `scope`): full marks for
    infrastructure (reader None), OPEN scopes and authorized readers; projections for
    PROTECTED; nothing for CLASSIFIED (P20–P22, P25, P26)."""
    if reader is None or scope.visibility is ScopeVisibility.OPEN or reader.can_read(scope_name):
        return marks
    if scope.visibility is ScopeVisibility.PROTECTED:
        return [project_mark(m) for m in marks]
    return []


def read_order_key(mark: Mark, strength: float) -> tuple[float, float, int]:
    """Read order: strength descending, then (created_at, id), the total write order (ids
    compare as their 128-bit integers, which is how UUIDs order)."""
    return (-strength, mark.created_at or 0.0, 0 if mark.id is None else mark.id.int)


# --------------------------------------------------------------------------- needs

_NON_WORD = re.compile(r"[^\w]+")


def question_key(question: str) -> str:
    """Questions equal after lowercasing and dropping punctuation and extra whitespace: the
    similarity the trail analytics group needs by (agentpost.spark.analytics)."""
    return " ".join(_NON_WORD.sub(" ", question.casefold()).split())


def cluster_needs(needs: Iterable[Need], similar: Callable[[Need], str] | None = None
                  ) -> list[NeedCluster]:
    """§8.4 over the given (unresolved) needs. The similarity of step 2 is left to
    implementations: by default, as the `markspace` package, every need of a scope is one
    cluster; `similar` (e.g. the question's `question_key`, as the web page does) splits a
    scope's needs by its value. Score `max(priority) + log(size) * 0.1`, at most 1.0 (the
    package's cap: a priority stays in [0, 1]); sorted by score descending, then by the
    cluster's first write."""
    groups: dict[tuple[str, str], list[Need]] = {}
    for need in sorted(needs, key=lambda n: (_created_key(n), str(n.id or ""))):
        groups.setdefault((need.scope, similar(need) if similar else ""), []).append(need)
    clusters = [
        NeedCluster(
            scope=scope,
            needs=members,
            effective_priority=min(1.0, max(n.priority for n in members)
                                   + math.log(len(members)) * 0.1),
            blocking_count=sum(1 for n in members if n.blocking),
            contexts=[n.context for n in members],
        )
        for (scope, _), members in groups.items()
    ]
    clusters.sort(key=lambda c: -c.effective_priority)
    return clusters


_WRITES = itertools.count(1)


def new_mark_id() -> UUID:
    """A fresh mark id: unique without coordination (80 random bits, P31), and increasing in
    write order within a process, since its top 48 bits count the writes, so that
    (created_at, id) orders marks of one created_at as they were written (P32). The layout
    is an RFC 9562 version-8 UUID, the same as the Postgres backend's (sql/0007_marks.sql)."""
    value = ((next(_WRITES) & (1 << 48) - 1) << 80) | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x8 << 76)  # version 8
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122/9562 variant
    return UUID(int=value)
