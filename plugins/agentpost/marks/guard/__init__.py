"""The guard (spec §9): deterministic enforcement around every tool call and every agent write.

The agent decides WHAT to do; the guard decides WHETHER it is allowed. `pre_action` checks and
writes the agent's intent, `post_action` records the result as an action mark, `execute` wraps
a tool call in both and never calls the tool unless the verdict is ALLOW (P37). `write_mark` is
the single enforcement boundary for the agent's own observations, warnings and needs (barrier,
rate limit, content policies, envelope). The optional defence layers plug in here: the
statistical envelope (`envelope/`), absorbing barriers (`barrier.py`), token budgets
(`budget.py`), scope rate limits (`rate_limit.py`), content policies (Markspace §9.13,
`ContentPolicy` here) and telemetry (`telemetry.py`).

The public API is the markspace package's (`Guard(space, envelope, principal_token, telemetry,
content_policies)`, `GuardVerdict`, `GuardDecision`, `resolve_deferred` returning decisions,
...); our additions are keyword-only or extra methods, and our older names (`Verdict`,
`barrier_for`, `resolve_deferred_decisions`) remain as deprecated aliases.

The guard talks to the space only through the interface both backends share (`write`, `read`,
`get`, `lock`, `now`, `get_scope`, `active_marks`, the deferred verdicts), and serializes every
decision on a (scope, resource) with `space.lock(scope, resource)`: a per-key lock in memory,
a transaction-scoped advisory lock on Postgres, so decisions are serialized across processes.

Readings chosen where the spec leaves room (docs/design.md repeats them):

- Order of the checks in `pre_action`: the scope must exist (else `UnknownScope` is raised:
  configuration, not a verdict); authorization for intents *and* actions in the scope (a tool
  call ends in an action mark, so an agent that may not write one is DENIED up front); the
  token budget; the barrier (a revoked intent *or action* type: DENIED; a
  "require need" without an unresolved Need of the agent's own in the scope: DENIED, as in
  the package); an active action of another agent on (scope, resource):
  CONFLICT (P39, also in deferred scopes); the scope's rate limit and the envelope: DENIED; then
  the intent is written (an intent verb the scope does not list raises the space's
  `InvalidMark` there, nothing written, as the package's space refuses it) and the conflict
  policy applied.
- A CONFLICT caused by an action has ``winning_intent`` None, as in the package (no intent
  won); the action itself is `winning_action` (P38).
- An agent's repeated `pre_action` on the same (scope, resource) with the same verb and
  confidence reuses its active intent (same state, same verdict: P36); a different verb or
  confidence writes a new intent that supersedes the old one (§10).
- Active means effective strength > 0; reads ask for ``min_strength=ACTIVE`` (1e-6), so a mark
  written with an initial strength below that counts as absent.
- YIELD_ALL: with intents of two or more agents on the resource, every one of them is BLOCKED.
  In `pre_action` the blocked agent's own blocking Need is filed (§6.1: the agents write it),
  as the package does, only if the agent may write needs in the scope, once per agent and
  resource while unresolved; a deferred boundary, with no agent at hand, files them as the
  guard's system agent. The principal settles it by invalidating the losing intents (warnings) or by
  waiting for their TTL.
- Deferred scopes: `pre_action` writes the intent and answers BLOCKED (pending resolution);
  `resolve_deferred` is the boundary. It compares every active intent (P14, P18) under the
  scope's policy and gives exactly one agent ALLOW (P17) unless the policy is YIELD_ALL with
  several agents (all BLOCKED, Needs filed) or another agent's action already claims the
  resource (P39: only that agent may be allowed). The verdicts are kept by the space
  (`space.record_verdicts`, in the boundary's lock), not by this object, so every Guard in
  every process answers from them: each is about the agent's intent at the boundary; the
  next boundary on (scope, resource) replaces them; the winner's `pre_action` / `execute`
  with that same intent is ALLOWed until its action consumes the grant (`post_action`, in the
  same lock); a loser is BLOCKED with the winning intent; all of it ends with the intent's
  TTL. A new intent (another verb or confidence) waits for the next boundary.
  `resolve_all_deferred` is a boundary for every pending deferred resource (P16).
- Mutual exclusion: `execute` holds ``space.lock(scope, resource)`` from the check through
  the tool call to the action mark, so the next agent finds the committed action (P39). A bare
  `pre_action` followed later by `post_action` follows §9.2 literally: under
  HIGHEST_CONFIDENCE a later, more confident agent is allowed too, and §6.3 settles it.
- `post_action` does not consult the barrier or the rate limits: the tool has already run, and
  the action mark records a fact. It supersedes the given intent (or the agent's own active
  intent on the resource). When another agent's active action is already on the resource (a
  race, §6.3) the new action supersedes *that* action instead, and the guard warns its agent
  with a warning that `invalidates` the superseded action.
- `execute_once` keys a call (keys.py): the key's record is committed before the tool runs,
  outside the lock's transaction, and settled with the action in the action's; a settled key
  replays the action's result, an unsettled one (the caller died in the tool) raises
  `UnsettledCall` and calls nothing, a failed one calls again.
- `execute` records a raising tool as a failed action (which claims nothing; its result the
  package's ``{"error": str(exc), "status": "failed"}``) and re-raises;
  a result larger than the space's content bound is recorded as its size
  (``{"oversize": true, "bytes": n, "limit": m}``), since the action must be stored.
- The guard's own marks (other Needs for the principal, warnings) are written by a system agent with
  a fixed id (`SYSTEM_AGENT_ID`), allowed warnings and needs in every scope the guard touches;
  the system agent is exempt from the envelope and from rate limits. Its writes are best
  effort: a scope that refuses them (a warning topic not in its list, say) is reported to
  telemetry and does not change the agent's verdict.
- Budgets: a stopped agent (lifetime usage >= total) is refused activation, tool calls
  (DENIED) and writes (`BudgetExhausted`) until the principal raises its budget (on the
  manifest or through `update_budget`). The package only refuses activation
  (`check_budget_activation`); we keep the stricter reading of P61. Budget warning Needs go to
  the `_system` scope (registered by the constructor, as in the package) unless
  ``notice_scope`` names another.
- Content policies (Markspace §9.13): observations written through `write_mark` only (P69),
  after the barrier and the rate limit and before the envelope records the attempt, so a
  REJECT is neither stored (P67) nor seen by the envelope or the barrier (P70); its rate-limit
  slot stays used, as in the package. A FLAG stores the observation and one `_system` warning
  (topic ``content-policy-flag``, every flag's reason, the observation's id) both or neither:
  in one transaction on Postgres, the warning checked before anything is stored on both
  backends (a `_system` that refuses it fails the write; the package would store the mark
  alone). A policy's exception propagates (nothing stored); a result that is not a
  `PolicyResult` raises `InvalidArgument`.
- Where we keep a reading other than the package's: a repeated `pre_action` with the same
  verb and confidence reuses the agent's intent (P36) where the package writes a second one
  and may make the agent yield to itself; an action revoked by the barrier denies
  `pre_action` (the package checks the intent type only).
- Telemetry never affects an outcome (P57); every `write_mark` and `execute` emits one event
  (P58), accepted or not.
"""

# What the guard's single module exported stays importable from here: its `__all__`, the
# names it re-exported on purpose (the package's), and its public constants (`__all__` below).

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from uuid import UUID, uuid4

from agentpost.marks.barrier import AgentBarrier, BarrierSnapshot
from agentpost.marks.budget import (
    BudgetLedger,
    BudgetTracker,
)
from agentpost.marks.core import (
    Agent,
    AnyMark,
    InvalidArgument,
    MarkType,
    QuotaExceededError,
    ScopeError,
    ValidationError,
    hours,
    resolve_conflict,
)
from agentpost.marks.envelope import StatisticalEnvelope
from agentpost.marks.guard.admission import _PreAction
from agentpost.marks.guard.budgets import _Budgets
from agentpost.marks.guard.common import (
    ACTIVE,
    CONTENT_FLAG_TOPIC,
    EVENT_CONTENT_POLICY,
    SUPERSEDED_TOPIC,
    SYSTEM_AGENT_ID,
    SYSTEM_AGENT_NAME,
    SYSTEM_DECAY,
    SYSTEM_SCOPE,
    SYSTEM_TYPES,
    BarrierDenied,
    BudgetExhausted,
    ContentPolicy,
    ContentPolicyError,
    EnvelopeRestricted,
    GuardCheck,
    GuardDecision,
    GuardedMarkType,
    GuardVerdict,
    PolicyResult,
    PolicyVerdict,
    RateLimited,
    ToolFn,
    Verdict,
    WriteRejected,
    _checked_policies,
    as_result,
)
from agentpost.marks.guard.deferred import _Deferred
from agentpost.marks.guard.execution import _Execution
from agentpost.marks.guard.reads import _Reads
from agentpost.marks.guard.writes import _Writes
from agentpost.marks.rate_limit import RateLimiter, RateLimitTracker
from agentpost.marks.space import MarkSpace
from agentpost.marks.telemetry import (
    Emitter,
    NullSink,
    TelemetryEvent,
    TelemetrySink,
)

if TYPE_CHECKING:
    from agentpost.marks.core import AnyMark
    from agentpost.marks.space import MarkSpace

# --------------------------------------------------------------------------- the guard


class Guard(_PreAction, _Deferred, _Execution, _Writes, _Budgets, _Reads):
    """Deterministic enforcement over a mark space (§9)."""

    def __init__(
        self,
        space: MarkSpace,
        envelope: StatisticalEnvelope | None = None,
        principal_token: uuid.UUID | None = None,
        telemetry: TelemetrySink | None = None,
        content_policies: list[ContentPolicy] | None = None,
        *,
        barriers: Mapping[UUID, AgentBarrier] | None = None,
        barrier_factory: Callable[[UUID], AgentBarrier] | None = None,
        system_agent: Agent | None = None,
        rate_limiter: RateLimiter | None = None,
        budget_ledger: BudgetLedger | None = None,
        global_escalation_threshold: int = 3,
        notice_scope: str | None = None,
    ) -> None:
        if global_escalation_threshold < 1:
            raise ValueError("global_escalation_threshold must be >= 1")
        self.space = space
        self.envelope = envelope
        self._principal_token: UUID | str = principal_token or uuid4()
        self._content_policies = _checked_policies(content_policies)
        self._barriers: dict[UUID, AgentBarrier] = dict(barriers or {})
        self._barrier_factory = barrier_factory or (
            lambda agent_id: AgentBarrier(agent_id, self._principal_token)
        )
        self.emitter = Emitter(telemetry if telemetry is not None else NullSink(), space.now)
        self.rate_limiter = rate_limiter or RateLimiter()
        self.budgets = budget_ledger or BudgetLedger()
        self.global_escalation_threshold = global_escalation_threshold
        self.notice_scope = notice_scope
        self._fixed_system = system_agent
        self._system_grants: dict[str, tuple[MarkType, ...]] = {}
        self._system: Agent = system_agent or Agent(id=SYSTEM_AGENT_ID, name=SYSTEM_AGENT_NAME)
        self._lock = threading.RLock()
        self._ensure_system_scope()
        if envelope is not None:
            envelope.exempt(self._system.id)

    # ------------------------------------------------------------------ accessors

    @property
    def system_agent(self) -> Agent:
        return self._system

    @property
    def telemetry(self) -> TelemetrySink:
        return self.emitter.sink

    @property
    def content_policies(self) -> tuple[ContentPolicy, ...]:
        return self._content_policies

    def get_or_create_barrier(self, agent_id: uuid.UUID) -> AgentBarrier:
        """The agent's (mutable) barrier, created clear on first use."""
        with self._lock:
            barrier = self._barriers.get(agent_id)
            if barrier is None:
                barrier = self._barrier_factory(agent_id)
                self._barriers[agent_id] = barrier
            return barrier

    barrier_for = get_or_create_barrier  # deprecated name

    def get_barrier(self, agent_id: uuid.UUID) -> BarrierSnapshot | None:
        """A frozen snapshot of the agent's barrier (None if it has none): inspecting it
        cannot change the guard's state."""
        with self._lock:
            barrier = self._barriers.get(agent_id)
        return None if barrier is None else barrier.snapshot()

    def set_barrier(self, agent_id: uuid.UUID, barrier: AgentBarrier) -> None:
        """Install a barrier for the agent (a principal's action)."""
        if not isinstance(barrier, AgentBarrier):
            raise InvalidArgument(f"expected an AgentBarrier, got {type(barrier).__name__}")
        with self._lock:
            self._barriers[agent_id] = barrier

    def cleanup_locks(self) -> int:
        """The package frees idle per-resource locks here; ours live in the space (an RLock
        per key in memory, advisory locks on Postgres), so there is nothing to free: 0."""
        return 0

    def exempt(self, agent_id: UUID) -> None:
        """Keep an infrastructure agent (a diagnostic probe, say) out of the envelope."""
        if self.envelope is not None:
            self.envelope.exempt(agent_id)


__all__ = [
    "ACTIVE",
    "CONTENT_FLAG_TOPIC",
    "EVENT_CONTENT_POLICY",
    "SUPERSEDED_TOPIC",
    "SYSTEM_AGENT_ID",
    "SYSTEM_AGENT_NAME",
    "SYSTEM_DECAY",
    "SYSTEM_SCOPE",
    "SYSTEM_TYPES",
    "AnyMark",
    "BarrierDenied",
    "BudgetExhausted",
    "BudgetTracker",
    "ContentPolicy",
    "ContentPolicyError",
    "EnvelopeRestricted",
    "Guard",
    "GuardCheck",
    "GuardDecision",
    "GuardVerdict",
    "GuardedMarkType",
    "MarkSpace",
    "PolicyResult",
    "PolicyVerdict",
    "QuotaExceededError",
    "RateLimitTracker",
    "RateLimited",
    "ScopeError",
    "TelemetryEvent",
    "ToolFn",
    "ValidationError",
    "Verdict",
    "WriteRejected",
    "as_result",
    "hours",
    "resolve_conflict",
]
