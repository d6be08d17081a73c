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

# Every name core.py had stays importable from here: the names values.py and rules.py
# define are re-exported.
# ruff: noqa: F401

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, NamedTuple
from uuid import UUID, uuid4

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    field_validator,
)
from pydantic import ValidationError as PydanticValidationError

from agentpost.marks.values import (
    _FROZEN,
    _SCOPE_SEGMENT,
    MAX_LABEL,
    FrozenDict,
    FrozenList,
    JsonObject,
    JsonValue,
    MarkPayload,
    Name,
    Positive,
    ScopeName,
    Text,
    Unit,
    _freeze_object,
    check_scope_name,
    check_text,
    freeze_json,
    scope_ancestors,
    scope_contains,
    scope_covers,
)
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


# The pure functions over these types live in rules.py (which imports this module); they
# are names of this module too. agentpost.marks imports core before anything else, so
# this import always runs with every type above already defined.
from agentpost.marks.rules import (  # noqa: E402
    _NON_WORD,
    _TRUST_RANK,
    _WRITES,
    DEFAULT_DECAY,
    DEFAULT_MIN_STRENGTH,
    REINFORCEMENT_CAP,
    REINFORCEMENT_FACTOR,
    TRUST_WEIGHTS,
    DecaySource,
    _created_key,
    _decay_for,
    _half_life_decay,
    _tiebreak,
    authorize_write,
    check_scope_rules,
    check_write,
    cluster_needs,
    compute_strength,
    effective_strength,
    effective_strength_with_warnings,
    intent_order_key,
    new_mark_id,
    project_mark,
    question_key,
    read_order_key,
    reinforce,
    resolve_conflict,
    trust_weight,
    visible_to,
    winning_intent,
)
