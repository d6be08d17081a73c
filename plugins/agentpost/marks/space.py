"""`MarkSpace`: the mark space in memory (spec §8, §8.6, §13.3–13.4), and
`MarkSpaceProtocol`, the interface the Postgres backend shares.

Marks are immutable; strength is computed at read time from the stored fields and `now` and
never written back (P28). One `RLock` guards all state; write hooks run after it is released.

Reads never scan the space. Each written mark goes into time-ordered buckets keyed by
(scope, mark_type, resource) for intents and actions, (scope, mark_type, topic) for
observations and warnings, and (scope, mark_type). Marks enter a bucket in created_at order
(created_at is monotonic), so a read bisects past the marks too old to reach `min_strength`:
intents older than the bucket's longest TTL, observations and warnings older than
`half_life * log2(max_weight / min_strength)` (a read at min_strength <= 0 takes whole
buckets: marks at strength 0 qualify). Superseded marks (permanently at strength 0)
are dropped from the buckets when a bucket is half dead; they stay in `get()` until `gc()`.
A supersession map (superseded id -> superseding id) and a warnings-by-target map make
strength O(1) plus the number of live warnings on the mark.

Readings chosen where the spec leaves room (also in docs/design.md):

- `read(scope, ...)` is hierarchical, as the package's: it returns the marks of `scope` and
  of every scope nested under it ("research" reads "research/a" and "research/a/b", never
  "research2"), as do `get_intents` and `check_conflict`. Each mark returned is seen as
  the stricter of two rules: the READ scope's definition (its own or its nearest defined
  ancestor's, P26) with the reader's authorization for the read scope, as in the package;
  and the mark's own governing definition with `reader.can_read_content(mark.scope)`, where
  the package stops: a CLASSIFIED child under an OPEN parent stays hidden, a PROTECTED one
  is projected (P22, P25; the spec is the authority).
  `read_exact` (ours, same parameters) reads the one scope: the guard's checks on one
  (scope, resource) and `read_with_claims` use it. A scope with no defined ancestor
  raises `UnknownScope`.
- Strength: each mark decays with the DecayConfig it was written under (its governing
  scope's, stored with it). The package decays a child scope's marks with the read scope's
  config instead; we keep the mark's own, so a mark has one strength whatever scope reads it.
- `read` returns the marks with effective strength >= `min_strength` (§8.2), never a
  superseded one (§10: invisible). So a threshold <= 0 also returns unsuperseded marks at
  strength 0 (expired intents, resolved need copies, fully invalidated marks, marks written
  at strength 0), as the package does; a threshold > 0 only marks with strength > 0. Callers
  that mean "every live mark" ask for a tiny positive threshold (the guard's ACTIVE).
- Each mark keeps the DecayConfig of the scope it was written under (the Postgres backend
  stores it in the row), so re-registering a scope affects later marks only.
- `created_at = max(clock(), last created_at)`: monotonic even if the clock steps back (P32).
- `resolve(need_id, action_id)` writes the resolved copy as the need's own agent; it refuses
  an unknown need (`UnknownMark`), a mark that is not a need or is already resolved or
  superseded (`InvalidMark`), and, as the package does, an `action_id` that names no stored
  mark (`UnknownMark`) or a mark that is not a successful action (`InvalidMark`).
- Subscriptions: re-subscribing replaces the patterns AND drops what was queued (those marks
  were written before the new `subscribe()`, P49). Queued marks follow scope visibility for
  the subscriber: projected in PROTECTED scopes, never queued in CLASSIFIED ones, unless the
  subscriber has read authorization. An agent's own writes are never queued for it.
- `lock(scope, resource)` is a re-entrant lock per key; two different keys never wait on
  each other. A write made inside it is not undone if the block raises (the Postgres backend
  rolls back its transaction instead).
- Deferred verdicts (§6.2.1 phase 3) are kept by the space, not by a Guard: every Guard over
  one `MarkSpace` object answers from the same verdicts (`record_verdicts`,
  `deferred_verdict`, `consume_grant`); the Postgres backend keeps them in a table, for
  every process.
- The markspace package's API (issue 15) on both backends: its constructor order
  `(scopes, clock, max_marks_per_agent)`, `get_mark`, `get_intents`, `check_conflict`,
  `gc`, `read(max_tokens=)`, `resolve(agent=)`, `NeedCluster` and its exception names.
- Quota: `max_marks_per_agent` counts an agent's live marks (stored, not superseded). A write
  that finds the agent at the limit raises QuotaExceededError and stores nothing, even if
  it would supersede one of the agent's marks (as the package: free a place first). A
  superseded mark gives its place back to its own agent, whoever superseded it; `gc()`
  gives back what it deletes. `resolve` writes the resolved copy as the need's agent without
  a quota check (the package's rule), and the superseded need frees its place.
- `gc(grace_period)` deletes superseded marks, resolved needs, intents `grace_period` past
  their TTL and observations and warnings below 1e-10 (see `collectable`); never actions.
  Warnings do not count (P35: a warned mark may recover). Each mark uses its own stored
  decay, as reads do.
- `resolve` needs a stored, successful action (the package's rule; UnknownMark or
  InvalidMark otherwise, both ValidationErrors); the copy names it and its agent.
- `aggregate_needs` clusters as the package does: one cluster per scope, priority
  min(1, max + 0.1·log n), needs at strength 0 after warnings left out. (The web page's
  listing keeps `core.cluster_needs`, which also splits a scope by similar question.)
- Extras beyond the spec: `write_many` (all or nothing), `all_marks`, `registered_scopes`,
  `__len__`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable
from uuid import UUID, uuid4

from agentpost.config import mark_content_limit
from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    AnyMark,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkType,
    Need,
    NeedCluster,
    Observation,
    QuotaExceededError,
    Scope,
    ScopeVisibility,
    Source,
    UnauthorizedWrite,
    UnknownMark,
    UnknownScope,
    Warning,
    WatchPattern,
    authorize_write,
    check_content_size,
    cluster_needs,
    compute_strength,
    mark_resource,
    mark_topic,
    new_mark_id,
    project_mark,
    read_order_key,
    resolve_conflict,
    revalidate,
    scope_ancestors,
    scope_covers,
    trust_weight,
    visible_to,
)
from agentpost.marks.core import ConflictPolicy as ConflictPolicy
from agentpost.marks.core import ScopeError as ScopeError  # the package's names, from here too
from agentpost.marks.core import ValidationError as ValidationError
from agentpost.marks.core import effective_strength as effective_strength
from agentpost.marks.core import (
    effective_strength_with_warnings as effective_strength_with_warnings,
)
from agentpost.marks.core import reinforce as reinforce
from agentpost.marks.core import scope_contains as scope_contains
from agentpost.marks.keys import KeyInUse, KeyRecord, check_key, check_same

log = logging.getLogger(__name__)

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
    def lock(self, scope: str, resource: str): ...  # a context manager
    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int: ...
    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None: ...
    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool: ...
    def active_marks(
        self, scope: str | None = None, mark_type: MarkType | None = None
    ) -> list[Mark]: ...


# --------------------------------------------------------------------------- buckets


def _life(mark: Mark, decay: DecayConfig) -> float:
    """How long a mark can stay alive: TTL for intents, half-life for observations and
    warnings (scaled at read time), forever for actions and needs."""
    if mark.mark_type is MarkType.INTENT:
        return decay.intent_ttl
    if mark.mark_type is MarkType.OBSERVATION:
        return decay.observation_half_life
    if mark.mark_type is MarkType.WARNING:
        return decay.warning_half_life
    return math.inf


#: slack when bisecting by time, so float rounding never hides a mark that is still alive
_TIME_SLACK = 1e-6


class _Bucket:
    """Marks of one mark type under one key, in created_at order, with what a read needs
    to skip the ones too old to matter: the longest life and the strongest start."""

    __slots__ = ("dead", "kind", "marks", "max_life", "max_weight", "times")

    def __init__(self, kind: MarkType) -> None:
        self.kind = kind
        self.marks: list[Mark] = []
        self.times: list[float] = []
        self.max_life = 0.0
        self.max_weight = 0.0
        self.dead = 0

    def add(self, mark: Mark, life: float) -> None:
        self.marks.append(mark)
        self.times.append(mark.created_at)
        self.max_life = max(self.max_life, life)
        self.max_weight = max(self.max_weight, mark.initial_strength * trust_weight(mark))

    def start(self, now: float, threshold: float) -> int:
        """Index of the first mark that may still reach `threshold` at `now`."""
        if self.kind is MarkType.INTENT:
            return bisect_left(self.times, now - self.max_life - _TIME_SLACK)
        if self.kind not in (MarkType.OBSERVATION, MarkType.WARNING) or threshold <= 0.0:
            return 0
        if self.max_weight < threshold:
            return len(self.times)
        span = self.max_life * math.log2(self.max_weight / threshold)
        return bisect_left(self.times, now - span * (1 + 1e-9) - _TIME_SLACK)

    def live(self, now: float, threshold: float) -> list[Mark]:
        return self.marks[self.start(now, threshold) :]

    def compact(self, superseded: dict[UUID, UUID]) -> None:
        """Drop superseded marks once half the bucket is dead (amortized O(1) per write)."""
        self.dead += 1
        if self.dead * 2 < len(self.marks):
            return
        kept = [m for m in self.marks if m.id not in superseded]
        self.marks = kept
        self.times = [m.created_at for m in kept]
        self.dead = 0


def _keyed(mark: Mark) -> str | None:
    """The resource (intents, actions) or topic (observations, warnings) a mark is read by."""
    return mark_resource(mark) or mark_topic(mark)


def _bucket_keys(mark: Mark) -> list[BucketKey]:
    keys: list[BucketKey] = [(mark.scope, mark.mark_type, None)]
    key = _keyed(mark)
    if key is not None:
        keys.append((mark.scope, mark.mark_type, key))
    return keys


@dataclass
class _Subscription:
    agent: Agent
    patterns: tuple[WatchPattern, ...]
    queue: list[Mark] = field(default_factory=list)


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


class SpaceBase(ABC):
    """What both backends do alike: the clock, the scope registry (configuration, not
    stored), write hooks (process-local), and the checks before a need is resolved."""

    def __init__(
        self,
        scopes: Iterable[Scope] | None = None,
        clock: ClockSpec = None,
        max_marks_per_agent: int | None = None,
        max_content_bytes: int | None = None,
    ) -> None:
        #: the largest content of one mark this space stores (bytes of JSON)
        self.max_content_bytes = mark_content_limit(max_content_bytes)
        #: the most live marks one agent may hold (None: no limit); see `write`
        self.max_marks_per_agent = quota_arg(max_marks_per_agent)
        self._lock = threading.RLock()
        self._clock = make_clock(clock)
        self._scopes: dict[str, Scope] = {}
        self._hooks: dict[UUID, WriteHook] = {}
        for scope in scopes or ():
            self.register_scope(scope)

    @abstractmethod
    def get(self, mark_id: UUID) -> Mark | None:
        """The stored mark with this id, full, or None."""

    @abstractmethod
    def write_many(self, agent: Agent, marks: Sequence[Mark]) -> list[UUID]:
        """Store marks all or nothing (each backend's storage)."""

    @abstractmethod
    def _is_superseded(self, mark: Mark) -> bool:
        """Whether a stored mark supersedes this one."""

    # ----------------------------------------------------------------- clock and scopes

    def now(self) -> float:
        """The space's current time (unix seconds) from its clock."""
        return float(self._clock())

    def set_clock(self, t: float) -> None:
        """Fix time at `t` (or install another clock: None for wall time, a callable)."""
        clock = make_clock(t)
        with self._lock:
            self._clock = clock

    def register_scope(self, scope: Scope) -> None:
        """Define (or redefine) a scope in this process. Marks already written keep the
        decay they were written with."""
        if not isinstance(scope, Scope):
            raise InvalidArgument(f"expected a Scope, got {type(scope).__name__}")
        with self._lock:
            self._scopes[scope.name] = scope

    def get_scope(self, scope_name: str) -> Scope:
        """The definition governing `scope_name`: its own, else the nearest defined
        ancestor's. UnknownScope (a ValidationError) when there is none."""
        if not isinstance(scope_name, str) or not scope_name:
            raise UnknownScope(f"no scope named {scope_name!r}")
        scopes = self._scopes
        for candidate in scope_ancestors(scope_name):
            found = scopes.get(candidate)
            if found is not None:
                return found
        raise UnknownScope(f"no scope {scope_name!r} (nor any ancestor of it) is registered")

    def registered_scopes(self) -> list[Scope]:
        with self._lock:
            return list(self._scopes.values())

    def _visible(
        self, marks: list[Mark], definition: Scope, scope: str, reader: Agent | None
    ) -> list[Mark]:
        """§7.4 for a read of `scope` (governed by `definition`): each mark as the stricter
        of the read scope's rule (the package's) and its own governing definition's, so a
        CLASSIFIED child under an OPEN parent stays hidden and a PROTECTED one is projected
        for a reader not authorized for it (P22, P25; the spec over the package)."""
        shown = visible_to(marks, definition, scope, reader)
        if reader is None or reader.can_read_content(scope):
            return shown  # authorized for the read scope: for every scope under it too (P26)
        governing: dict[str, Scope] = {}
        seen: list[Mark] = []
        for mark in shown:
            if mark.scope == scope:  # the read scope's own marks: its rule already applied
                seen.append(mark)
                continue
            own = governing.get(mark.scope)
            if own is None:
                own = governing[mark.scope] = self.get_scope(mark.scope)
            seen.extend(visible_to([mark], own, mark.scope, reader))
        return seen

    # ----------------------------------------------------------------- writes and hooks

    def _checked(self, marks: Sequence[Mark]) -> list[Mark]:
        """The marks re-validated field by field and within `max_content_bytes`: the checks
        of a write that come before the scope's (InvalidMark, nothing stored)."""
        checked = [revalidate(m) for m in marks]
        for mark in checked:
            check_content_size(mark, self.max_content_bytes)
        return checked

    def write(self, agent: Agent, mark: AnyMark) -> uuid.UUID:
        """Store `mark` for `agent` with a fresh id and created_at = now (§8.1). Raises a
        typed error and stores nothing if the agent, the mark, the scope or the agent's
        quota say no."""
        return self.write_many(agent, [mark])[0]

    @abstractmethod
    def _quota_state(self, agent_id: UUID, targets: set[UUID]) -> tuple[int, set[UUID]]:
        """The agent's live marks (stored, not superseded) and which of `targets` are
        among them. Under the lock that serializes the agent's writes."""

    def _check_quota(self, agent: Agent, marks: Sequence[Mark]) -> None:
        """QuotaExceededError when writing `marks` one by one would find the agent
        already holding `max_marks_per_agent` live marks; a mark that supersedes one of the
        agent's live marks gives its place back after it is written."""
        limit = self.max_marks_per_agent
        if limit is None:
            return
        targets = {m.supersedes for m in marks if m.supersedes is not None}
        held, owned = self._quota_state(agent.id, targets)
        for mark in marks:
            if held >= limit:
                raise QuotaExceededError(
                    f"agent {agent.name!r} holds {held} live marks, its quota is {limit}; "
                    "marks come back when superseded or collected by gc()"
                )
            held += 1
            if mark.supersedes in owned:
                owned.discard(mark.supersedes)
                held -= 1

    def add_write_hook(self, hook: Callable[[uuid.UUID, AnyMark], None]) -> uuid.UUID:
        """Call `hook(agent_id, stored_mark)` after every successful write made through
        this object (§8.6). Hooks are process-local. Returns the handle that removes it."""
        if not callable(hook):
            raise InvalidArgument("a write hook must be callable")
        handle = uuid4()
        with self._lock:
            self._hooks[handle] = hook
        return handle

    def remove_write_hook(self, handle: uuid.UUID) -> bool:
        with self._lock:
            return self._hooks.pop(handle, None) is not None

    def read_with_claims(
        self, scope: str, resource: str, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[list[Mark], list[Action]]:
        """What the guard looks at on one resource: `read_exact(scope, resource=...)` for
        full marks of that one scope and `claims(scope, resource)`, together (one round trip
        on Postgres)."""
        return (self.read_exact(scope, resource=resource, min_strength=min_strength),
                self.claims(scope, resource))

    @abstractmethod
    def claims(self, scope: str, resource: str) -> list[Action]:
        """The actions holding (scope, resource), whatever warnings say (P39)."""

    def read(self, scope: str, resource: str | None = None, topic: str | None = None,
             mark_type: MarkType | None = None,
             min_strength: float = DEFAULT_MIN_STRENGTH,
             reader: Agent | None = None, max_tokens: int | None = None) -> list[AnyMark]:
        """§8.2's read, hierarchical as the package's: `scope` and the scopes nested
        under it (see the backend's `_read`)."""
        return self._read(scope, resource, topic, mark_type, min_strength, reader,
                          max_tokens, nested=True)

    def read_exact(self, scope: str, resource: str | None = None, topic: str | None = None,
                   mark_type: MarkType | None = None,
                   min_strength: float = DEFAULT_MIN_STRENGTH,
                   reader: Agent | None = None,
                   max_tokens: int | None = None) -> list[AnyMark]:
        """`read` of `scope` alone, without its nested scopes: for callers that decide per
        scope (the guard's checks on one (scope, resource))."""
        return self._read(scope, resource, topic, mark_type, min_strength, reader,
                          max_tokens, nested=False)

    @abstractmethod
    def _read(self, scope: str, resource: str | None, topic: str | None,
              mark_type: MarkType | None, min_strength: float, reader: Agent | None,
              max_tokens: int | None, *, nested: bool) -> list[AnyMark]:
        """`read` (nested) and `read_exact` (not)."""

    def get_mark(self, mark_id: uuid.UUID) -> AnyMark | None:
        """The stored mark with this id, or None (the package's name for `get`)."""
        return self.get(mark_id)

    @abstractmethod
    def get_intents(self, scope: str, resource: str) -> list[Intent]:
        """The intents on `resource` in `scope` and its child scopes that are neither
        superseded nor past their TTL (warnings do not count here), in write order."""

    def check_conflict(self, scope: str, resource: str) -> uuid.UUID | None:
        """The intent that wins `resource` under the scope's conflict policy (§5), among
        `get_intents(scope, resource)`; None when there is none or the policy yields."""
        policy = self.get_scope(scope).conflict_policy
        intents = self.get_intents(scope, resource)
        if len(intents) <= 1:
            return intents[0].id if intents else None
        return resolve_conflict(intents, policy)

    @abstractmethod
    def gc(self, grace_period: float = 0.0) -> int:
        """Delete the marks that can never be read again, `grace_period` seconds after
        they got there; returns how many. Frees quota. See `gc_rule`."""

    # ----------------------------------------------------------------- deferred verdicts

    @abstractmethod
    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int:
        """Keep a resolution boundary's verdicts on (scope, resource), replacing the previous
        boundary's there (§6.2.1 phase 3); returns the boundary's number, larger than any
        before it. Each verdict names an intent of this space on (scope, resource)."""

    @abstractmethod
    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None:
        """The agent's verdict at the latest boundary on (scope, resource), or None (no
        boundary gave it one, or its intent's TTL has passed)."""

    @abstractmethod
    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool:
        """Record that ``action_id`` used the agent's ALLOW on (scope, resource); False when
        it had none left to use."""

    # ----------------------------------------------------------------- keys (keys.py)

    @abstractmethod
    def key_record(self, key: str) -> KeyRecord | None:
        """What `key` did in this space (a write, a call), or None."""

    @abstractmethod
    def key_lock(self, key: str) -> AbstractContextManager[None]:
        """Serialize the writers of one key, like `lock` (a transaction on Postgres)."""

    @abstractmethod
    def record_key(self, record: KeyRecord) -> KeyRecord:
        """Record a write (in the open `lock`/`key_lock` transaction, with the mark) or the
        start of a call (committed at once, on its own, even inside a lock: it must survive
        the call). A call may start again after a failed one (``calls`` counts). KeyInUse
        when the key names something else or a call under way; returns the stored record."""

    @abstractmethod
    def settle_key(self, key: str, mark_id: UUID, failed: bool = False) -> None:
        """Record the action mark of a started call (in the open transaction)."""

    @abstractmethod
    def release_key(self, key: str) -> bool:
        """A person's release of a call that recorded no outcome, after checking what it did:
        the next call under the key runs. False when there was no such call."""

    def write_once(self, agent: Agent, mark: Mark, key: str,
                   write: Callable[[Agent, Mark], UUID] | None = None) -> tuple[UUID, bool]:
        """Write `mark` at most once per `key`: the first call writes it (through `write`,
        e.g. a guard's `write_mark`; default `self.write`) and records the key in the same
        transaction; a later call returns that mark's id. Returns (id, written now)."""
        key = check_key(key)
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        with self.key_lock(key):
            earlier = self.key_record(key)
            if earlier is not None:
                check_same(earlier, "write", agent.id, mark.scope, None)
                assert earlier.mark_id is not None
                return earlier.mark_id, False
            mark_id = (write or self.write)(agent, mark)
            self.record_key(KeyRecord(key=key, kind="write", agent_id=agent.id,
                                      scope=mark.scope, mark_id=mark_id,
                                      started_at=self.now()))
            return mark_id, True

    def _check_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> list[DeferredVerdict]:
        """What a boundary may store: verdicts on this (scope, resource) of a known scope,
        one per agent, at most one ALLOW (P17). InvalidArgument otherwise."""
        self.get_scope(scope)
        checked = list(verdicts)
        if not all(isinstance(v, DeferredVerdict) for v in checked):
            raise InvalidArgument("a boundary's verdicts are DeferredVerdict objects")
        if any((v.scope, v.resource) != (scope, resource) for v in checked):
            raise InvalidArgument(f"a verdict of this boundary is not on {(scope, resource)!r}")
        if len({v.agent_id for v in checked}) != len(checked):
            raise InvalidArgument("a boundary gives each agent one verdict")
        if sum(v.allowed for v in checked) > 1:
            raise InvalidArgument("a boundary allows at most one agent (P17)")
        return checked

    def _check_resolvable(self, need: Mark, action_id: UUID, agent: Agent | None) -> Action:
        """§8.3's preconditions, in the package's order: a need, not yet resolved nor
        superseded; a resolving mark stored in this space; an `agent` (if given) allowed to
        write actions in the need's scope (UnauthorizedWrite); the resolving mark a
        successful action. Returns that action."""
        if not isinstance(need, Need):
            raise InvalidMark(f"mark {need.id} is a {need.mark_type.value}, not a need")
        if need.resolved_by is not None or self._is_superseded(need):
            raise InvalidMark(f"need {need.id} is already resolved or superseded")
        if agent is not None and not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent or None, got {type(agent).__name__}")
        action = self.get(action_id) if isinstance(action_id, UUID) else None
        if action is None:
            raise UnknownMark(f"no resolving action {action_id!r} in this space")
        if agent is not None and not agent.can_write(need.scope, MarkType.ACTION):
            raise UnauthorizedWrite(
                f"agent {agent.name!r} may not resolve needs in {need.scope!r}"
            )
        if not isinstance(action, Action):
            raise InvalidMark(f"mark {action_id} is a {action.mark_type.value}, not an action")
        if action.failed:
            raise InvalidMark(f"action {action_id} failed and cannot resolve a need")
        return action


# --------------------------------------------------------------------------- the space


class MarkSpace(SpaceBase):
    """The mark space in memory: thread-safe, for one process and for fast tests."""

    def __init__(
        self,
        scopes: list[Scope] | None = None,
        clock: float | None = None,
        max_marks_per_agent: int | None = None,
        *,
        max_content_bytes: int | None = None,
    ) -> None:
        """`scopes` to register; `clock` a fixed time, None for wall time (or a callable
        returning the time); `max_marks_per_agent` the quota (None: none);
        `max_content_bytes` the largest content of one mark (default: config)."""
        self._marks: dict[UUID, Mark] = {}
        self._live: dict[UUID, int] = {}  # agent id -> stored, unsuperseded marks (quota)
        self._decay: dict[UUID, DecayConfig] = {}
        self._buckets: dict[BucketKey, _Bucket] = {}
        self._scope_names: dict[str, None] = {}  # scopes that hold marks, in first-write order
        self._superseded_by: dict[UUID, UUID] = {}
        self._warnings_on: dict[UUID, list[Warning]] = {}
        self._last_created = -math.inf
        self._subscriptions: dict[UUID, _Subscription] = {}
        self._key_locks: dict[tuple[str, str], threading.RLock] = {}
        self._verdicts: dict[tuple[str, str], dict[UUID, DeferredVerdict]] = {}
        self._keys: dict[str, KeyRecord] = {}
        self._boundaries = 0
        self._swept = 1
        super().__init__(scopes, clock, max_marks_per_agent, max_content_bytes)

    def write_many(self, agent: Agent, marks: Sequence[Mark]) -> list[UUID]:
        """Write several marks as one step: all are checked first, and if any is refused
        none is stored. Hooks fire after, once per mark, in write order."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        checked = self._checked(marks)
        with self._lock:
            scopes = [self.get_scope(m.scope) for m in checked]
            for mark, scope in zip(checked, scopes, strict=True):
                authorize(agent, mark, scope)
            self._check_quota(agent, checked)
            stored = [
                self._commit(m, agent.id, s.decay) for m, s in zip(checked, scopes, strict=True)
            ]
            hooks = list(self._hooks.values())
        for mark in stored:
            fire_hooks(hooks, [(agent.id, mark)])
        return [m.id for m in stored]

    def _commit(self, mark: Mark, agent_id: UUID | None, decay: DecayConfig) -> Mark:
        """Stamp, store and index a checked mark; queue it for subscribers. Under the lock."""
        clock = self.now()
        if not math.isfinite(clock):
            raise InvalidArgument(f"the space's clock returned {clock!r}")
        created = max(clock, self._last_created)
        self._last_created = created
        stored = mark.model_copy(
            update={"id": new_mark_id(), "agent_id": agent_id, "created_at": created}
        )
        mark_id: UUID = stored.id
        self._marks[mark_id] = stored
        self._decay[mark_id] = decay
        self._scope_names.setdefault(stored.scope, None)
        self._live[agent_id] = self._live.get(agent_id, 0) + 1
        if stored.supersedes is not None and stored.supersedes not in self._superseded_by:
            self._superseded_by[stored.supersedes] = mark_id
            target = self._marks.get(stored.supersedes)
            if target is not None:
                self._live[target.agent_id] -= 1
            self._retire(stored.supersedes)
        if isinstance(stored, Warning) and stored.invalidates is not None:
            self._warnings_on.setdefault(stored.invalidates, []).append(stored)
        self._index(stored, decay)  # resolved copies too: read(min_strength=0) returns them
        self._enqueue(stored)
        return stored

    def _index(self, mark: Mark, decay: DecayConfig) -> None:
        life = _life(mark, decay)
        for key in _bucket_keys(mark):
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(mark.mark_type)
            bucket.add(mark, life)

    def _retire(self, mark_id: UUID) -> None:
        """A superseded mark is at strength 0 for good: let its buckets shed it."""
        target = self._marks.get(mark_id)
        if target is None:
            return
        for key in _bucket_keys(target):
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.compact(self._superseded_by)

    # ----------------------------------------------------------------- read

    def get(self, mark_id: UUID) -> Mark | None:
        """The stored mark with this id, in full (no visibility rules), or None."""
        if isinstance(mark_id, str):
            try:
                mark_id = UUID(mark_id)
            except ValueError:
                return None
        with self._lock:
            return self._marks.get(mark_id)

    def _read(
        self,
        scope: str,
        resource: str | None = None,
        topic: str | None = None,
        mark_type: MarkType | None = None,
        min_strength: float = DEFAULT_MIN_STRENGTH,
        reader: Agent | None = None,
        max_tokens: int | None = None,
        *,
        nested: bool = True,
    ) -> list[AnyMark]:
        """Marks of `scope` and its nested scopes (only `scope` with `nested=False`)
        matching the filters whose effective strength (decay, trust, supersession, warnings;
        at now) is >= `min_strength`, never superseded ones (so a threshold <= 0 returns
        marks at strength 0 too, as the package), strongest first (ties: created_at, id),
        cut to `max_tokens` (see `fit_tokens`). `reader` None is infrastructure and sees full
        marks; an Agent sees each mark as the stricter of the read scope's visibility and the
        mark's own scope's (`_visible`, §7.4). No side effects (P28). Each mark decays with
        its own stored DecayConfig (the package: the read scope's)."""
        kind = mark_type_arg(mark_type)
        threshold = min_strength_arg(min_strength)
        if reader is not None and not isinstance(reader, Agent):
            raise InvalidArgument(f"reader must be an Agent or None, not {type(reader).__name__}")
        with self._lock:
            definition = self.get_scope(scope)
            if self._hidden(definition, scope, reader):
                return []
            now = self.now()
            names = self._covered(scope) if nested else (scope,)
            scored = [
                (mark, strength)
                for name in names
                for mark in self._candidates(name, resource, topic, kind, now, threshold)
                if (strength := self._strength(mark, now)) >= threshold
                and (strength > 0.0 or mark.id not in self._superseded_by)
            ]
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        return fit_tokens(self._visible([m for m, _ in scored], definition, scope, reader),
                          max_tokens)

    def _covered(self, scope: str) -> list[str]:
        """The scopes holding marks that a hierarchical read of `scope` reads: `scope` and
        the ones nested under it (a pass over the scope names, as the package does)."""
        return [name for name in self._scope_names if scope_covers(scope, name)]

    @staticmethod
    def _hidden(definition: Scope, scope: str, reader: Agent | None) -> bool:
        return (
            reader is not None
            and definition.visibility is ScopeVisibility.CLASSIFIED
            and not reader.can_read(scope)
        )

    def _candidates(
        self,
        scope: str,
        resource: str | None,
        topic: str | None,
        kind: MarkType | None,
        now: float,
        threshold: float,
    ) -> Iterator[Mark]:
        """Marks of one scope that may match, from the narrowest bucket(s); exact filters
        applied here. A threshold <= 0 takes whole buckets: marks at strength 0 count."""
        if resource is not None:
            kinds, key = (MarkType.INTENT, MarkType.ACTION), resource
        elif topic is not None:
            kinds, key = (MarkType.OBSERVATION, MarkType.WARNING), topic
        else:
            kinds, key = tuple(MarkType), None
        for each in kinds:
            if kind is not None and each is not kind:
                continue
            bucket = self._buckets.get((scope, each, key))
            if bucket is None:
                continue
            for mark in bucket.marks if threshold <= 0.0 else bucket.live(now, threshold):
                if resource is not None and topic is not None and mark_topic(mark) != topic:
                    continue
                yield mark

    def _strength(self, mark: Mark, now: float) -> float:
        """Effective strength with supersession and warnings (§4.2, §9.5, §10)."""
        mark_id = mark.id
        if mark_id in self._superseded_by:
            return 0.0
        decay = self._decay.get(mark_id) if mark_id is not None else None
        if decay is None:
            decay = self.get_scope(mark.scope).decay
        strength = compute_strength(mark, now, decay) * trust_weight(mark)
        if strength <= 0.0:
            return 0.0
        warnings = self._warnings_on.get(mark_id) if mark_id is not None else None
        if warnings:
            penalty = sum(
                compute_strength(w, now, self._decay[w.id]) * trust_weight(w)
                for w in warnings
                if w.id not in self._superseded_by
            )
            strength = max(0.0, strength - penalty)
        return strength

    def _is_superseded(self, mark: Mark) -> bool:
        return mark.id in self._superseded_by

    def claims(self, scope: str, resource: str) -> list[Action]:
        """The actions holding (scope, resource): neither failed nor superseded, whatever
        warnings say (P39: a warning contests a fact, it does not undo it, §9.5), in write
        order."""
        with self._lock:
            self.get_scope(scope)
            now = self.now()
            held = [
                m for m in self._candidates(scope, resource, None, MarkType.ACTION, now, 0.0)
                if isinstance(m, Action) and not m.failed and m.id not in self._superseded_by
            ]
        return sorted(held, key=lambda m: (m.created_at, m.id))

    def strength_of(self, mark: Mark) -> float:
        """The mark's effective strength now, as `read` computes it (a mark not in this
        space gets decay and trust only, with its scope's DecayConfig)."""
        with self._lock:
            stored = self._marks.get(mark.id) if mark.id is not None else None
            return self._strength(stored or mark, self.now())

    def active_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Marks at strength > 0 now, in one scope (exact) or all, full (infrastructure
        view: telemetry gauges, aggregators), in read order."""
        kind = mark_type_arg(mark_type)
        with self._lock:
            now = self.now()
            names = list(self._scope_names) if scope is None else [scope]
            scored = []
            for name in names:
                for each in MarkType:
                    if kind is not None and each is not kind:
                        continue
                    bucket = self._buckets.get((name, each, None))
                    if bucket is None:
                        continue
                    for mark in bucket.live(now, 0.0):
                        strength = self._strength(mark, now)
                        if strength > 0.0:
                            scored.append((mark, strength))
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        return [m for m, _ in scored]

    def all_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Every stored mark, whatever its strength, in write order (history, tests)."""
        kind = mark_type_arg(mark_type)
        with self._lock:
            return [
                m
                for m in self._marks.values()
                if (scope is None or m.scope == scope) and (kind is None or m.mark_type is kind)
            ]

    def close(self) -> None:
        """Nothing to release in memory; here so both backends can be closed alike."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._marks)

    # ----------------------------------------------------------------- needs

    def resolve(
        self,
        need_mark_id: uuid.UUID,
        resolving_action_id: uuid.UUID,
        agent: Agent | None = None,
    ) -> uuid.UUID:
        """Resolve a need (§8.3) with a stored, successful action: write a copy with
        `resolved_by` that supersedes it, so the need is at strength 0 on the next read
        (P29, P30). `agent`, if given, must be allowed to write actions in the need's scope. Returns
        the copy's id. The copy is the need's agent's mark (it takes the need's place in
        that agent's quota)."""
        with self._lock:
            need = self._marks.get(need_mark_id) if isinstance(need_mark_id, UUID) else None
            if need is None:
                raise UnknownMark(f"no mark {need_mark_id} in this space")
            action = self._check_resolvable(need, resolving_action_id, agent)
            assert isinstance(need, Need)
            copy = resolved_copy(need, action)
            stored = self._commit(copy, need.agent_id, self._decay[need.id])
            hooks = list(self._hooks.values())
        fire_hooks(hooks, [(stored.agent_id, stored)])
        return stored.id

    def get_intents(self, scope: str, resource: str) -> list[Intent]:
        """The intents on `resource` in `scope` and its child scopes that are neither
        superseded nor past their TTL (warnings do not count here), in write order."""
        with self._lock:
            self.get_scope(scope)
            now = self.now()
            found = [
                mark
                for name in self._scope_names
                if scope_covers(scope, name)
                and (bucket := self._buckets.get((name, MarkType.INTENT, resource))) is not None
                for mark in bucket.live(now, 0.0)
                if isinstance(mark, Intent) and mark.id not in self._superseded_by
                and compute_strength(mark, now, self._decay[mark.id]) > 0.0
            ]
        return sorted(found, key=lambda m: (m.created_at, m.id))

    def _quota_state(self, agent_id: UUID, targets: set[UUID]) -> tuple[int, set[UUID]]:
        owned = {
            t for t in targets
            if (m := self._marks.get(t)) is not None and m.agent_id == agent_id
            and t not in self._superseded_by
        }
        return self._live.get(agent_id, 0), owned

    def gc(self, grace_period: float = 0.0) -> int:
        """Delete superseded marks and the marks `collectable` says are garbage; rebuild
        the indexes from what is left. Returns how many marks went."""
        grace = grace_arg(grace_period)
        with self._lock:
            now = self.now()
            doomed = {
                mark_id for mark_id, mark in self._marks.items()
                if mark_id in self._superseded_by
                or collectable(mark, self._decay[mark_id], now, grace)
            }
            if doomed:
                self._drop(doomed)
        return len(doomed)

    def _drop(self, doomed: set[UUID]) -> None:
        """Forget `doomed` marks and rebuild every index over the rest. Under the lock."""
        for mark_id in doomed:
            del self._marks[mark_id]
            del self._decay[mark_id]
        self._superseded_by = {
            old: new for old, new in self._superseded_by.items() if old in self._marks
        }
        self._buckets = {}
        self._warnings_on = {}
        self._live = {}
        for mark in self._marks.values():
            if mark.id not in self._superseded_by:
                self._live[mark.agent_id] = self._live.get(mark.agent_id, 0) + 1
            if isinstance(mark, Warning) and mark.invalidates is not None:
                self._warnings_on.setdefault(mark.invalidates, []).append(mark)
            if mark.id not in self._superseded_by:
                self._index(mark, self._decay[mark.id])

    def aggregate_needs(self) -> list[NeedCluster]:
        """The open needs (unresolved, unsuperseded, strength > 0 after warnings) of
        every scope, one cluster per scope (`core.cluster_needs`, §8.4)."""
        with self._lock:
            now = self.now()
            needs = [
                mark
                for name in self._scope_names
                if (bucket := self._buckets.get((name, MarkType.NEED, None))) is not None
                for mark in bucket.marks
                if isinstance(mark, Need) and self._strength(mark, now) > 0.0
            ]
        return cluster_needs(needs)

    # ----------------------------------------------------------------- subscriptions

    def subscribe(self, agent: Agent, patterns: list[WatchPattern]) -> None:
        """Queue marks written from now on that match any pattern (§13.3). Replaces an
        earlier subscription and its queue (P48, P49)."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        patterns = tuple(patterns)
        if not patterns or not all(isinstance(p, WatchPattern) for p in patterns):
            raise InvalidArgument("subscribe needs a non-empty list of WatchPattern")
        with self._lock:
            self._subscriptions[agent.id] = _Subscription(agent, patterns)

    def unsubscribe(self, agent: Agent) -> None:
        """Drop the agent's subscription and whatever is queued for it."""
        with self._lock:
            self._subscriptions.pop(agent_id_of(agent), None)

    def get_watched_marks(self, agent: Agent, clear: bool = True) -> list[AnyMark]:
        """Marks queued for the agent since its last poll, in write order (P50–P52); with
        `clear` they are handed out once only (P51). Marks gc() deleted meanwhile are
        left out, as on Postgres."""
        with self._lock:
            sub = self._subscriptions.get(agent_id_of(agent))
            if sub is None:
                return []
            marks = [m for m in sub.queue if m.id in self._marks]
            if clear:
                sub.queue.clear()
        return marks

    def _enqueue(self, mark: Mark) -> None:
        """Queue a just-written mark for every other subscriber it matches, or whose
        patterns match the mark it supersedes (so a watcher learns its mark was replaced,
        as in the package). Under the lock."""
        if not self._subscriptions:
            return
        definition = self.get_scope(mark.scope)
        replaced = self._marks.get(mark.supersedes) if mark.supersedes is not None else None
        for sub in self._subscriptions.values():
            if sub.agent.id == mark.agent_id:
                continue
            if not any(p.matches(mark) or (replaced is not None and p.matches(replaced))
                       for p in sub.patterns):
                continue
            delivered = self._as_seen_by(mark, definition, sub.agent)
            if delivered is not None:
                sub.queue.append(delivered)

    @staticmethod
    def _as_seen_by(mark: Mark, definition: Scope, agent: Agent) -> Mark | None:
        if definition.visibility is ScopeVisibility.OPEN or agent.can_read(mark.scope):
            return mark
        if definition.visibility is ScopeVisibility.PROTECTED:
            return project_mark(mark)
        return None

    # ----------------------------------------------------------------- deferred verdicts

    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int:
        """Keep a boundary's verdicts (replacing the previous boundary's on the key), shared
        by every Guard over this object; each lasts as long as its intent."""
        checked = self._check_verdicts(scope, resource, verdicts)
        with self._lock:
            now = self.now()
            stored = {}
            for verdict in checked:
                intent = self._marks.get(verdict.intent_id)
                where = (scope, resource, verdict.agent_id)
                if not isinstance(intent, Intent) or (
                    intent.scope, intent.resource, intent.agent_id
                ) != where:
                    raise InvalidArgument(f"no intent {verdict.intent_id} of the agent there")
                expires = intent.created_at + self._decay[intent.id].intent_ttl
                stored[verdict.agent_id] = (verdict, expires)
            self._boundaries += 1
            self._verdicts[(scope, resource)] = {
                agent_id: verdict.model_copy(
                    update={"boundary": self._boundaries, "decided_at": now, "expires_at": at}
                )
                for agent_id, (verdict, at) in stored.items()
            }
            self._sweep_verdicts(now)
            return self._boundaries

    def _sweep_verdicts(self, now: float) -> None:
        """Drop keys whose verdicts have all expired, each time the number of keys has
        doubled since the last sweep (amortized O(1) per boundary). Under the lock."""
        if len(self._verdicts) < 2 * self._swept:
            return
        self._verdicts = {
            key: held
            for key, held in self._verdicts.items()
            if any(v.expires_at is not None and v.expires_at >= now for v in held.values())
        }
        self._swept = max(1, len(self._verdicts))

    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None:
        """The agent's verdict at the latest boundary on (scope, resource), while its
        intent's TTL lasts."""
        with self._lock:
            verdict = self._verdicts.get((scope, resource), {}).get(agent_id)
            if verdict is None or verdict.expires_at is None or verdict.expires_at < self.now():
                return None
            return verdict

    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool:
        """Mark the agent's unconsumed ALLOW on (scope, resource) as used by the action."""
        with self._lock:
            verdict = self.deferred_verdict(scope, resource, agent_id)
            if verdict is None or not verdict.allowed or verdict.consumed_by is not None:
                return False
            self._verdicts[(scope, resource)][agent_id] = verdict.model_copy(
                update={"consumed_by": action_id}
            )
            return True

    # ----------------------------------------------------------------- keys

    def key_record(self, key: str) -> KeyRecord | None:
        with self._lock:
            return self._keys.get(check_key(key))

    def key_lock(self, key: str) -> AbstractContextManager[None]:
        return self.lock("\x00key", check_key(key))  # no scope name holds a NUL

    def record_key(self, record: KeyRecord) -> KeyRecord:
        with self._lock:
            earlier = self._keys.get(record.key)
            if earlier is not None:
                check_same(earlier, record.kind, record.agent_id, record.scope,
                           record.resource)
                if record.kind != "execute" or not earlier.failed:
                    raise KeyInUse(f"key {record.key!r} is in use")
                record = record.model_copy(update={"calls": earlier.calls + 1})
            self._keys[record.key] = record
            return record

    def settle_key(self, key: str, mark_id: UUID, failed: bool = False) -> None:
        with self._lock:
            earlier = self._keys.get(key)
            if earlier is None or earlier.kind != "execute" or earlier.settled:
                raise KeyInUse(f"key {key!r} names no call under way")
            self._keys[key] = earlier.model_copy(update={"mark_id": mark_id, "failed": failed})

    def release_key(self, key: str) -> bool:
        with self._lock:
            earlier = self._keys.get(check_key(key))
            if earlier is None or earlier.kind != "execute" or earlier.settled:
                return False
            del self._keys[key]
            return True

    # ----------------------------------------------------------------- guard lock

    @contextmanager
    def lock(self, scope: str, resource: str) -> Iterator[None]:
        """Serialize guard decisions on one (scope, resource); re-entrant per thread."""
        key = (scope, resource)
        with self._lock:
            key_lock = self._key_locks.get(key)
            if key_lock is None:
                key_lock = self._key_locks[key] = threading.RLock()
        with key_lock:
            yield

