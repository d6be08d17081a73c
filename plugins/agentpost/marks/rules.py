"""The pure functions every backend computes with (spec §6–§8): the write checks, strength
and decay, trust, reinforcement, conflict resolution, projection and read order, need
clustering, and mark ids. `agentpost.marks.core` re-exports every name.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any
from uuid import UUID

from agentpost.marks.core import (
    CONTENT_FIELDS,
    REDACTED,
    SCOPE_DECAY,
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkType,
    Need,
    NeedCluster,
    Observation,
    Scope,
    ScopeVisibility,
    Source,
    UnauthorizedWrite,
    Warning,
    _allows,
    revalidate,
)

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
