"""The mark space's interface (`MarkSpaceProtocol`), its clock, and the checks and helpers
both backends share (`agentpost.marks.space` re-exports every name).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable
from uuid import UUID

from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    AnyMark,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    Mark,
    MarkType,
    Need,
    NeedCluster,
    Observation,
    Scope,
    Source,
    UnauthorizedWrite,
    Warning,
    WatchPattern,
    authorize_write,
    compute_strength,
    trust_weight,
)

log = logging.getLogger("agentpost.marks.space")  # the name it had in space.py

WriteHook = Callable[[UUID, Mark], object]
Clock = Callable[[], float]
ClockSpec = Clock | float | int | None

#: bucket keys: (scope, mark_type, resource-or-topic) and (scope, mark_type, None)
BucketKey = tuple[str, MarkType, str | None]


def make_clock(spec: ClockSpec) -> Clock:
    """`None` -> wall time, a number -> time fixed there, a callable -> used as is."""
    if spec is None:
        return time.time
    if callable(spec):
        return spec
    if isinstance(spec, bool) or not isinstance(spec, int | float) or not math.isfinite(spec):
        raise InvalidArgument(f"a clock is None, a finite number or a callable, not {spec!r}")
    fixed = float(spec)
    return lambda: fixed


@runtime_checkable
class MarkSpaceProtocol(Protocol):
    """What both backends offer, with the same behaviour (the spec's operation names)."""

    def now(self) -> float: ...
    def set_clock(self, t: float) -> None: ...
    def register_scope(self, scope: Scope) -> None: ...
    def get_scope(self, scope_name: str) -> Scope: ...
    def write(self, agent: Agent, mark: AnyMark) -> uuid.UUID: ...
    def get(self, mark_id: UUID) -> Mark | None: ...
    def get_mark(self, mark_id: uuid.UUID) -> AnyMark | None: ...
    def read(
        self,
        scope: str,
        resource: str | None = None,
        topic: str | None = None,
        mark_type: MarkType | None = None,
        min_strength: float = DEFAULT_MIN_STRENGTH,
        reader: Agent | None = None,
        max_tokens: int | None = None,
    ) -> list[AnyMark]: ...
    def read_exact(
        self,
        scope: str,
        resource: str | None = None,
        topic: str | None = None,
        mark_type: MarkType | None = None,
        min_strength: float = DEFAULT_MIN_STRENGTH,
        reader: Agent | None = None,
        max_tokens: int | None = None,
    ) -> list[AnyMark]: ...
    def get_intents(self, scope: str, resource: str) -> list[Intent]: ...
    def check_conflict(self, scope: str, resource: str) -> uuid.UUID | None: ...
    def gc(self, grace_period: float = 0.0) -> int: ...
    def strength_of(self, mark: Mark) -> float: ...
    def claims(self, scope: str, resource: str) -> list[Action]: ...
    def read_with_claims(
        self, scope: str, resource: str, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[list[Mark], list[Action]]: ...
    def resolve(
        self,
        need_mark_id: uuid.UUID,
        resolving_action_id: uuid.UUID,
        agent: Agent | None = None,
    ) -> uuid.UUID: ...
    def aggregate_needs(self) -> list[NeedCluster]: ...
    def add_write_hook(self, hook: Callable[[uuid.UUID, AnyMark], None]) -> uuid.UUID: ...
    def remove_write_hook(self, handle: uuid.UUID) -> bool: ...
    def subscribe(self, agent: Agent, patterns: list[WatchPattern]) -> None: ...
    def unsubscribe(self, agent: Agent) -> None: ...
    def get_watched_marks(self, agent: Agent, clear: bool = True) -> list[AnyMark]: ...
    def lock(self, scope: str, resource: str, *, lazy: bool = False): ...  # a context manager
    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int: ...
    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None: ...
    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool: ...
    def lock_many(  # a context manager
        self, scope: str, resources: Iterable[str], *, lazy: bool = False): ...
    def write_and_read_with_claims(
        self, agent: Agent, mark: Mark, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[UUID, tuple[list[Mark], list[Action]]]: ...
    def read_many_with_claims(
        self, scope: str, resources: Iterable[str], min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> dict[str, tuple[list[Mark], list[Action]]]: ...
    def record_verdicts_many(
        self, scope: str, verdicts: Mapping[str, Sequence[DeferredVerdict]]
    ) -> dict[str, int]: ...
    def active_marks(
        self, scope: str | None = None, mark_type: MarkType | None = None
    ) -> list[Mark]: ...



# --------------------------------------------------------------------------- shared by both


def agent_id_of(agent: Agent | UUID) -> UUID:
    if isinstance(agent, Agent):
        return agent.id
    if isinstance(agent, UUID):
        return agent
    raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")


def mark_type_arg(mark_type: MarkType | str | None) -> MarkType | None:
    if mark_type is None:
        return None
    try:
        return MarkType(mark_type)
    except ValueError:
        raise InvalidArgument(f"unknown mark type {mark_type!r}") from None


def quota_arg(limit: object) -> int | None:
    """`max_marks_per_agent`: None (no limit) or a count >= 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgument(f"max_marks_per_agent is None or an int >= 0, not {limit!r}")
    return limit


def fit_tokens(marks: list[Mark], max_tokens: int | None) -> list[Mark]:
    """The longest prefix of `marks` (strongest first) whose estimated tokens, 4
    characters of `str(mark.model_dump())` each, add up to at most `max_tokens`: the
    package's read budget. What is left out stays in the space."""
    if max_tokens is None:
        return marks
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise InvalidArgument(f"max_tokens is None or an int, not {max_tokens!r}")
    kept: list[Mark] = []
    used = 0
    for mark in marks:
        used += len(str(mark.model_dump())) // 4
        if used > max_tokens:
            break
        kept.append(mark)
    return kept


#: observations and warnings below this decay-times-trust strength are garbage (gc)
GC_EPSILON = 1e-10


def collectable(mark: Mark, decay: DecayConfig, now: float, grace_period: float) -> bool:
    """Whether `gc(grace_period)` deletes an unsuperseded `mark` (superseded marks always
    go): an intent `grace_period` after its TTL, a resolved need at once, an observation or
    warning once its decay-times-trust strength (warnings not counted: P35, a warned mark may
    recover) is below GC_EPSILON and `grace_period` has passed since it got there; never an
    action (P2)."""
    age = now - mark.created_at
    if isinstance(mark, Intent):
        return compute_strength(mark, now, decay) <= 0.0 and age >= decay.intent_ttl + grace_period
    if isinstance(mark, Need):
        return mark.resolved_by is not None
    if not isinstance(mark, Observation | Warning):
        return False
    if compute_strength(mark, now, decay) * trust_weight(mark) >= GC_EPSILON:
        return False
    if grace_period <= 0.0:
        return True
    half_life = (decay.observation_half_life if isinstance(mark, Observation)
                 else decay.warning_half_life)
    faded = (half_life * math.log2(mark.initial_strength / GC_EPSILON)
             if mark.initial_strength > GC_EPSILON else 0.0)
    return age >= faded + grace_period


def min_strength_arg(min_strength: object) -> float:
    """`read`'s threshold: any number but NaN (<= 0 also returns marks at strength 0)."""
    if isinstance(min_strength, bool) or not isinstance(min_strength, int | float):
        raise InvalidArgument(f"min_strength must be a number, not {min_strength!r}")
    value = float(min_strength)
    if math.isnan(value):
        raise InvalidArgument("min_strength must be a number, not NaN")
    return value


def grace_arg(grace_period: object) -> float:
    if isinstance(grace_period, bool) or not isinstance(grace_period, int | float):
        raise InvalidArgument(f"grace_period must be a number, not {grace_period!r}")
    if not grace_period >= 0:
        raise InvalidArgument(f"grace_period must be non-negative, got {grace_period}")
    return float(grace_period)


def resolved_copy(need: Need, action: Action) -> Need:
    """The copy of `need` that resolves it with `action` (§8.3): it supersedes the need
    and names the action and the agent that took it."""
    update: dict[str, object] = {"resolved_by": action.id, "supersedes": need.id}
    if "resolved_by_agent" in Need.model_fields:
        update["resolved_by_agent"] = action.agent_id
    return need.model_copy(update=update)


#: sources from least to most trusted (§4.1): an agent may claim up to its `max_source`
_SOURCE_RANK = {Source.EXTERNAL_UNVERIFIED: 0, Source.EXTERNAL_VERIFIED: 1, Source.FLEET: 2}


def authorize(agent: Agent, mark: Mark, scope: Scope) -> None:
    """`authorize_write`, then the agent's trust ceiling: an observation may not claim a
    source more trusted than `agent.max_source` (UnauthorizedWrite, a ScopeError), so an
    external agent cannot pass its findings off as the fleet's."""
    authorize_write(agent, mark, scope)
    ceiling = getattr(agent, "max_source", None)
    if (isinstance(mark, Observation) and ceiling is not None
            and _SOURCE_RANK[Source(mark.source)] > _SOURCE_RANK[Source(ceiling)]):
        raise UnauthorizedWrite(
            f"agent {agent.name!r} (max_source={Source(ceiling).value}) cannot write "
            f"observations with source={Source(mark.source).value}"
        )


def fire_hooks(hooks: Sequence[WriteHook], writes: Sequence[tuple[UUID, Mark]]) -> None:
    """Run snapshotted write hooks outside any lock; a failing hook changes nothing (P33)."""
    for agent_id, mark in writes:
        for hook in hooks:
            try:
                hook(agent_id, mark)
            except Exception:
                log.debug("mark space write hook failed", exc_info=True)
