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


# What `agentpost.marks.space` exported when it was one module stays importable from here:
# the names it defined, the package's names it re-exported on purpose, and the mark types and
# errors callers import from it.

from __future__ import annotations

from agentpost.marks.core import (
    AnyMark,
    ConflictPolicy,
    NeedCluster,
    QuotaExceededError,
    ScopeError,  # the package's names, from here too
    ValidationError,
    effective_strength,
    effective_strength_with_warnings,
    reinforce,
    scope_contains,
)
from agentpost.marks.space.base import SpaceBase
from agentpost.marks.space.memory import MarkSpace
from agentpost.marks.space.protocol import (
    GC_EPSILON,
    BucketKey,
    Clock,
    ClockSpec,
    MarkSpaceProtocol,
    WriteHook,
    agent_id_of,
    authorize,
    collectable,
    fire_hooks,
    fit_tokens,
    grace_arg,
    make_clock,
    mark_type_arg,
    min_strength_arg,
    quota_arg,
    resolved_copy,
)

__all__ = [
    "GC_EPSILON",
    "AnyMark",
    "BucketKey",
    "Clock",
    "ClockSpec",
    "ConflictPolicy",
    "MarkSpace",
    "MarkSpaceProtocol",
    "NeedCluster",
    "QuotaExceededError",
    "ScopeError",
    "SpaceBase",
    "ValidationError",
    "WriteHook",
    "agent_id_of",
    "authorize",
    "collectable",
    "effective_strength",
    "effective_strength_with_warnings",
    "fire_hooks",
    "fit_tokens",
    "grace_arg",
    "make_clock",
    "mark_type_arg",
    "min_strength_arg",
    "quota_arg",
    "reinforce",
    "resolved_copy",
    "scope_contains",
]
