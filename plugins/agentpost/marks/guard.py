"""The guard (spec §9): deterministic enforcement around every tool call and every agent write.

The agent decides WHAT to do; the guard decides WHETHER it is allowed. `pre_action` checks and
writes the agent's intent, `post_action` records the result as an action mark, `execute` wraps
a tool call in both and never calls the tool unless the verdict is ALLOW (P37). `write_mark` is
the single enforcement boundary for the agent's own observations, warnings and needs (barrier,
rate limit, content policies, envelope). The optional defence layers plug in here: the
statistical envelope (`envelope.py`), absorbing barriers (`barrier.py`), token budgets
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

from __future__ import annotations

import hmac
import json
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4, uuid5

from pydantic import BaseModel, ConfigDict

from agentpost.marks import core as _core
from agentpost.marks.barrier import AgentBarrier, BarrierSnapshot
from agentpost.marks.budget import (
    BudgetDimension,
    BudgetLedger,
    BudgetStatus,
    BudgetUsage,
    TokenBudget,
)
from agentpost.marks.budget import BudgetTracker as BudgetTracker
from agentpost.marks.budget import truncate_to_budget as _truncate
from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkspaceError,
    MarkType,
    Need,
    Observation,
    Scope,
    Severity,
    Warning,
    authorize_write,
    check_content_size,
    freeze_json,
    json_bytes,
    revalidate,
    winning_intent,
)
from agentpost.marks.core import AnyMark as AnyMark
from agentpost.marks.core import QuotaExceededError as QuotaExceededError
from agentpost.marks.core import ScopeError as ScopeError
from agentpost.marks.core import ValidationError as ValidationError
from agentpost.marks.core import hours as hours
from agentpost.marks.core import resolve_conflict as resolve_conflict
from agentpost.marks.envelope import EnvelopeVerdict, Finding, StatisticalEnvelope
from agentpost.marks.keys import KeyRecord, UnsettledCall, check_key, check_same
from agentpost.marks.rate_limit import RateDecision, RateLimiter
from agentpost.marks.rate_limit import RateLimitTracker as RateLimitTracker
from agentpost.marks.space import MarkSpace as MarkSpace
from agentpost.marks.telemetry import (
    ACTIVE_MARKS,
    BUDGET_REMAINING,
    CONFLICTS_RESOLVED,
    EVENT_EXECUTE,
    EVENT_PRE_ACTION,
    EVENT_RESOLVE_DEFERRED,
    EVENT_RESTRICTION,
    EVENT_ROUND,
    EVENT_SYSTEM_WRITE_FAILED,
    EVENT_WRITE_MARK,
    MARKS_READ,
    MARKS_WRITTEN,
    NEEDS_PENDING,
    ROUND_DURATION,
    TOKENS_INPUT,
    TOKENS_OUTPUT,
    TOTAL_MARKS,
    Emitter,
    NullSink,
    TelemetrySink,
)
from agentpost.marks.telemetry import TelemetryEvent as TelemetryEvent

if TYPE_CHECKING:
    from agentpost.marks.core import AnyMark
    from agentpost.marks.space import MarkSpace

#: the tool a guarded call runs (``tool_fn(*tool_args, **tool_kwargs)``)
ToolFn = Callable[..., Any]

#: reads of the guard count marks with effective strength at least this as active
ACTIVE = 1e-6
#: the guard's system agent (its Needs and warnings): one fixed id for every process
SYSTEM_AGENT_ID = uuid5(UUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8"), "agentpost:marks:guard")
SYSTEM_AGENT_NAME = "markspace-guard"
SYSTEM_TYPES = (MarkType.WARNING, MarkType.NEED)
SUPERSEDED_TOPIC = "superseded-action"
#: the scope of the guard's content-policy flags (Markspace §9.13), registered when missing
SYSTEM_SCOPE = "_system"
#: its decay, as the package registers it: observations a day, warnings half a day, intents 1 h
SYSTEM_DECAY = DecayConfig(
    observation_half_life=24 * 3600.0, warning_half_life=12 * 3600.0, intent_ttl=3600.0
)
CONTENT_FLAG_TOPIC = "content-policy-flag"
EVENT_CONTENT_POLICY = "markspace.content_policy"
#: the lock key (resource) under which a flagged write and its warning share a transaction
_FLAG_LOCK = "\x00content-policy-flag"
#: the package's exception for writes a defence refuses (ours until core defines it)
_ScopeError: type[MarkspaceError] = getattr(_core, "ScopeError", MarkspaceError)


class GuardVerdict(StrEnum):
    """The guard's verdict (Markspace §9.3), the package's enum and values."""

    ALLOW = "allow"
    CONFLICT = "conflict"
    BLOCKED = "blocked"
    DENIED = "denied"


#: deprecated name of `GuardVerdict`
Verdict = GuardVerdict


class GuardCheck(StrEnum):
    """Which check decided a DENIED or BLOCKED verdict, or rejected a write."""

    AUTHORIZATION = "authorization"
    VERB = "verb"
    BUDGET = "budget"
    BARRIER = "barrier"
    NEED_REQUIRED = "need_required"
    RATE_LIMIT = "rate_limit"
    ENVELOPE = "envelope"
    CLAIMED = "claimed"
    CONFLICT_POLICY = "conflict_policy"
    DEFERRED = "deferred"
    CONTENT_POLICY = "content_policy"


@dataclass
class GuardDecision:
    """The guard's answer (§9.3), with enough context for the agent to choose an alternative
    (P38): CONFLICT carries ``winning_intent``, or ``winning_action`` when another agent's
    action holds the resource (``winning_intent`` is then None, as in the package); BLOCKED
    and DENIED carry a ``reason`` and the ``check`` that decided. The first five fields are
    the package's, in its order; ours (``winning_action``, ``need_id``, ``check``) are
    keyword-only."""

    verdict: GuardVerdict
    reason: str
    intent_id: uuid.UUID | None = None
    winning_intent: Intent | None = None
    conflicting_intents: list[Intent] = field(default_factory=list)
    winning_action: Action | None = field(default=None, kw_only=True)
    need_id: UUID | None = field(default=None, kw_only=True)
    check: GuardCheck | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.verdict = GuardVerdict(self.verdict)
        self.conflicting_intents = list(self.conflicting_intents)

    @property
    def allowed(self) -> bool:
        return self.verdict is GuardVerdict.ALLOW


# --------------------------------------------------------------------------- content policies


class PolicyVerdict(StrEnum):
    """A content policy's verdict (Markspace §9.13), the package's values."""

    ALLOW = "allow"
    REWRITE = "rewrite"
    REJECT = "reject"
    FLAG = "flag"


@dataclass
class PolicyResult:
    """One policy's outcome: ``content`` is the new content (REWRITE only), ``reason`` a
    human-readable why, ``metadata`` anything for telemetry."""

    verdict: PolicyVerdict
    content: Any = None
    reason: str | None = None
    metadata: dict | None = None


class ContentPolicy(ABC):
    """Inspects an Observation's content before the guard stores it (Markspace §9.13).

    Only observations written through `Guard.write_mark` are evaluated (P69). ``mark.content``
    is any JSON value (a policy for text should ALLOW other content). Must be thread-safe:
    several writes may be evaluated at once. Order cheap policies before expensive ones."""

    @abstractmethod
    def evaluate(self, agent: Agent, mark: Observation, scope: Scope) -> PolicyResult:
        """The verdict on ``mark`` (as rewritten by the policies before this one)."""

    @property
    def name(self) -> str:
        """The policy's name in telemetry and reasons."""
        return type(self).__name__


# --------------------------------------------------------------------------- errors


class GuardedMarkType(InvalidMark):
    """`write_mark` refuses intents and actions: they go through pre_action / post_action."""


class WriteRejected(_ScopeError, PermissionError):
    """A defence layer refused an agent's write; nothing was stored (P42). A ScopeError, the
    class the package raises for these refusals."""

    check: GuardCheck = GuardCheck.BARRIER

    def __init__(self, message: str, check: GuardCheck | None = None) -> None:
        super().__init__(message)
        if check is not None:
            self.check = check


class BarrierDenied(WriteRejected):
    check = GuardCheck.BARRIER


class EnvelopeRestricted(WriteRejected):
    check = GuardCheck.ENVELOPE


class RateLimited(WriteRejected):
    check = GuardCheck.RATE_LIMIT


class BudgetExhausted(WriteRejected):
    check = GuardCheck.BUDGET


class ContentPolicyError(WriteRejected):
    """A content policy rejected an observation; nothing was stored (P67). Built like any
    exception (the package's): ``ContentPolicyError(reason)``."""

    check = GuardCheck.CONTENT_POLICY

    def __init__(self, /, *args, **kwargs):
        Exception.__init__(self, *args, **kwargs)


_REJECTIONS: dict[GuardCheck, type[WriteRejected]] = {
    GuardCheck.BARRIER: BarrierDenied,
    GuardCheck.NEED_REQUIRED: BarrierDenied,
    GuardCheck.ENVELOPE: EnvelopeRestricted,
    GuardCheck.RATE_LIMIT: RateLimited,
    GuardCheck.BUDGET: BudgetExhausted,
}


class _Refusal(BaseModel):
    """An internal "no" from one of the checks, before it becomes a verdict or an error."""

    model_config = ConfigDict(frozen=True)

    check: GuardCheck
    reason: str


class _Admission(BaseModel):
    """A write the rate limit and the envelope let through (the reservation to undo if the
    store then refuses it)."""

    model_config = ConfigDict(frozen=True)

    scope: str
    reservation: RateDecision


class _Screened(BaseModel):
    """An observation after the content policies: the mark to store (maybe rewritten) and
    the reasons of the FLAG verdicts (a warning to store with it)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    mark: Any
    flags: tuple[str, ...] = ()
    flagged_by: tuple[str, ...] = ()


class _Board(BaseModel):
    """What is active on one (scope, resource), in write order."""

    model_config = ConfigDict(frozen=True)

    intents: tuple[Intent, ...]
    actions: tuple[Action, ...]

    def claim(self, exclude: UUID | None) -> Action | None:
        """The latest non-failed action not by ``exclude``: the resource's holder (P39)."""
        return _latest([a for a in self.actions if not a.failed and a.agent_id != exclude])

    def own(self, agent_id: UUID) -> Intent | None:
        return _latest([i for i in self.intents if i.agent_id == agent_id])

    def others(self, agent_id: UUID) -> tuple[Intent, ...]:
        return tuple(i for i in self.intents if i.agent_id != agent_id)


# --------------------------------------------------------------------------- the guard


class Guard:
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

    # ------------------------------------------------------------------ pre_action

    def pre_action(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        action: str,
        confidence: float = 0.5,
    ) -> GuardDecision:
        """§9.2: check, write the agent's intent, resolve conflicts. Serialized per
        (scope, resource) through ``space.lock``."""
        _require_agent(agent)
        proposed = Intent(scope=scope, resource=resource, action=action, confidence=confidence)
        scope_def = self.space.get_scope(scope)
        with self.space.lock(scope, resource):
            decision = self._decide(agent, scope_def, proposed)
        self.emitter.event(
            EVENT_PRE_ACTION,
            agent_id=agent.id,
            scope=scope,
            resource=resource,
            action=action,
            verdict=decision.verdict,
            check=decision.check,
            reason=decision.reason,
        )
        return decision

    def _decide(self, agent: Agent, scope_def: Scope, proposed: Intent) -> GuardDecision:
        refusal = self._authorize(agent, scope_def, proposed)
        if refusal is not None:
            return _denied(refusal)
        board = self._board(proposed.scope, proposed.resource)
        claim = board.claim(exclude=agent.id)
        if claim is not None:
            return self._claimed(claim)
        own = board.own(agent.id)
        held = own if _same_plan(own, proposed) else None
        if held is None:
            admitted = self._admit(agent, proposed)
            if isinstance(admitted, _Refusal):
                return _denied(admitted)
            held = self._write_intent(agent, proposed, own, admitted)
            board = self._board(proposed.scope, proposed.resource)  # §9.2 step 4: read again
        if scope_def.deferred:
            return self._advisory(agent, held, board)
        return self._resolve_now(agent, scope_def, held, board)

    def _authorize(self, agent: Agent, scope_def: Scope, intent: Intent) -> _Refusal | None:
        for mark_type in (MarkType.INTENT, MarkType.ACTION):
            if not agent.can_write(intent.scope, mark_type):
                return _Refusal(
                    check=GuardCheck.AUTHORIZATION,
                    reason=(
                        f"agent {agent.name!r} is not authorized to write {mark_type.value} "
                        f"marks in scope {intent.scope!r}"
                    ),
                )
        return self._budget_refusal(agent) or self._barrier_refusal(
            agent, intent.scope, (MarkType.INTENT, MarkType.ACTION)
        )

    def _claimed(self, claim: Action) -> GuardDecision:
        """CONFLICT because another agent's action already holds the resource (P39)."""
        return GuardDecision(
            verdict=Verdict.CONFLICT,
            reason=(
                f"resource {claim.resource!r} in scope {claim.scope!r} is already claimed by "
                f"agent {claim.agent_id}'s action {claim.action!r}"
            ),
            winning_action=claim,
            check=GuardCheck.CLAIMED,
        )

    def _intent_behind(self, claim: Action) -> Intent:
        if claim.supersedes is not None:
            earlier = self.space.get(claim.supersedes)
            if isinstance(earlier, Intent):
                return earlier
        return Intent(
            id=claim.id,
            agent_id=claim.agent_id,
            scope=claim.scope,
            created_at=claim.created_at,
            resource=claim.resource or "",
            action=claim.action,
            confidence=1.0,
        )

    def _write_intent(
        self, agent: Agent, proposed: Intent, own: Intent | None, admitted: _Admission
    ) -> Intent:
        """Write the intent; it supersedes the agent's previous one on the resource (§10)."""
        intent = proposed.model_copy(update={"supersedes": own.id if own else None})
        mark_id = self._store(agent, intent, admitted)
        return intent.model_copy(update={"id": mark_id, "agent_id": agent.id})

    def _advisory(self, agent: Agent, held: Intent, board: _Board) -> GuardDecision:
        """Deferred scope: phase 1 collects the intent and the verdict waits (§6.2.3). Once
        a boundary has decided about this very intent, its stored verdict answers (phase
        3), whichever process or Guard ran the boundary: the winner's unused ALLOW lets its
        `execute` proceed; a loser learns who won while that intent is active."""
        others = board.others(agent.id)
        verdict = self.space.deferred_verdict(held.scope, held.resource, agent.id)
        if verdict is not None and verdict.intent_id == held.id:
            if verdict.allowed and verdict.consumed_by is None:
                return GuardDecision(
                    verdict=Verdict.ALLOW,
                    reason=(
                        f"won {held.resource!r} at resolution boundary {verdict.boundary}"
                    ),
                    intent_id=held.id,
                    conflicting_intents=tuple(others),
                )
            winner = next((i for i in board.intents if i.id == verdict.winner_id), None)
            if not verdict.allowed and (winner is not None or verdict.winner_id is None):
                return self._lost(held, verdict, winner, others)
        return GuardDecision(
            verdict=Verdict.BLOCKED,
            reason=(
                f"scope {held.scope!r} resolves conflicts in batches: intent recorded, pending "
                f"resolution of {held.resource!r} at the next boundary"
            ),
            intent_id=held.id,
            conflicting_intents=tuple(others),
            check=GuardCheck.DEFERRED,
        )

    def _lost(
        self,
        held: Intent,
        verdict: DeferredVerdict,
        winner: Intent | None,
        others: tuple[Intent, ...],
    ) -> GuardDecision:
        """BLOCKED by the latest boundary (§6.2.1 phase 3 step 4), with its winner (P38);
        no winner: YIELD_ALL left it to the principal, or an action held the resource."""
        outcome = (
            f"lost to agent {winner.agent_id}"
            if winner is not None
            else "no agent was allowed (the principal decides, or an action holds it)"
        )
        return GuardDecision(
            verdict=Verdict.BLOCKED,
            reason=(
                f"{held.resource!r} in scope {held.scope!r}: {outcome} at resolution "
                f"boundary {verdict.boundary}; a new intent waits for the next boundary"
            ),
            intent_id=held.id,
            winning_intent=winner,
            conflicting_intents=others,
            check=GuardCheck.DEFERRED,
        )

    def _resolve_now(
        self, agent: Agent, scope_def: Scope, held: Intent, board: _Board
    ) -> GuardDecision:
        intents = list(board.intents)
        others = board.others(agent.id)
        if not others:
            return GuardDecision(verdict=Verdict.ALLOW, reason="no conflict", intent_id=held.id)
        policy = scope_def.conflict_policy
        if policy is ConflictPolicy.YIELD_ALL:
            author = agent if agent.can_write(held.scope, MarkType.NEED) else None
            decision = self._yield_all(agent.id, held, others, author=author, system=False)
        else:
            decision = self._pick(agent, policy, held, intents, others)
        self._count_conflict(held.scope, policy, decision.verdict)
        return decision

    def _pick(
        self,
        agent: Agent,
        policy: ConflictPolicy,
        held: Intent,
        intents: list[Intent],
        others: tuple[Intent, ...],
    ) -> GuardDecision:
        winner = winning_intent(intents, policy)
        if winner is not None and winner.agent_id == agent.id:
            return GuardDecision(
                verdict=Verdict.ALLOW,
                reason=f"won the conflict on {held.resource!r} under {policy.value}",
                intent_id=held.id,
                conflicting_intents=others,
            )
        return GuardDecision(
            verdict=Verdict.CONFLICT,
            reason=(
                f"agent {winner.agent_id if winner else None}'s intent wins {held.resource!r} "
                f"under {policy.value}"
            ),
            intent_id=held.id,
            winning_intent=winner,
            conflicting_intents=others,
            check=GuardCheck.CONFLICT_POLICY,
        )

    def _yield_all(
        self,
        agent_id: UUID,
        held: Intent,
        others: tuple[Intent, ...],
        *,
        author: Agent | None = None,
        system: bool = True,
    ) -> GuardDecision:
        """BLOCKED for the principal (§6.1). The Need is the agent's own (`author`, as the
        package files it) when it may write needs there, none when it may not; a deferred
        boundary (``system``), which has no agent at hand, files it as the system agent."""
        need_id = None
        if author is not None or system:
            need_id = self._yield_need(agent_id, held, others, author)
        filed = "; a need was filed" if need_id is not None else ""
        return GuardDecision(
            verdict=Verdict.BLOCKED,
            reason=(
                f"scope {held.scope!r} yields all conflicts to the principal: "
                f"{len({i.agent_id for i in others})} other agent(s) intend to act on "
                f"{held.resource!r}{filed}"
            ),
            intent_id=held.id,
            conflicting_intents=others,
            need_id=need_id,
            check=GuardCheck.CONFLICT_POLICY,
        )

    def _yield_need(
        self, agent_id: UUID, held: Intent, others: Iterable[Intent], author: Agent | None
    ) -> UUID | None:
        """The blocking Need of a YIELD_ALL conflict: the package's context (resource,
        action, agent's name) and ours (kind, agent id, intent, rivals)."""
        rivals = sorted({str(i.agent_id) for i in others if i.agent_id != agent_id})
        return self._ensure_need(
            held.scope,
            question=(
                f"Conflict on {held.resource!r} in {held.scope!r}: several agents intend to "
                f"{held.action}. Who proceeds?"
            ),
            context={
                "kind": "yield_all",
                "agent_id": str(agent_id),
                "agent": author.name if author is not None else SYSTEM_AGENT_NAME,
                "resource": held.resource,
                "action": held.action,
                "intent_id": str(held.id),
                "rivals": rivals,
            },
            priority=0.8,
            blocking=True,
            author=author,
        )

    # ------------------------------------------------------------------ deferred resolution

    def resolve_deferred(
        self, scope: str, resource: str, agents: dict[uuid.UUID, Agent] | None = None
    ) -> dict[uuid.UUID, GuardDecision]:
        """A resolution boundary for (scope, resource) (§6.2, P14–P18): agent id -> decision.
        With ``agents`` (id -> current Agent), an intent whose agent is missing, may no
        longer write intents and actions there, or is barred by its barrier is DENIED at
        the boundary and left out of the comparison."""
        scope_def = self.space.get_scope(scope)
        with self.space.lock(scope, resource):
            board = self._board(scope, resource)
            denied: dict[UUID, GuardDecision] = {}
            if agents is not None:
                board, denied = self._recheck(board, scope, agents)
            decisions = {**denied, **self._batch(scope_def, board)}
            intents = board.intents
            self.space.record_verdicts(scope, resource, _verdicts(scope, resource, decisions))
        self.emitter.event(
            EVENT_RESOLVE_DEFERRED,
            scope=scope,
            resource=resource,
            intents=len(intents),
            verdicts={str(a): d.verdict for a, d in decisions.items()},
        )
        return decisions

    def resolve_deferred_decisions(self, scope: str, resource: str) -> dict[UUID, GuardDecision]:
        """Deprecated: `resolve_deferred` returns the decisions now."""
        return self.resolve_deferred(scope, resource)

    def _recheck(
        self, board: _Board, scope: str, agents: Mapping[UUID, Agent]
    ) -> tuple[_Board, dict[UUID, GuardDecision]]:
        """The board without the intents of agents no longer entitled to them, and a DENIED
        decision for each such agent (its latest intent)."""
        denied: dict[UUID, GuardDecision] = {}
        for intent in board.intents:
            if intent.agent_id is None or intent.agent_id in denied:
                continue
            reason = self._entitlement(agents.get(intent.agent_id), scope)
            if reason is not None:
                mine = board.own(intent.agent_id)
                denied[intent.agent_id] = GuardDecision(
                    GuardVerdict.DENIED, reason, mine.id if mine else intent.id,
                    check=GuardCheck.AUTHORIZATION,
                )
        kept = tuple(i for i in board.intents if i.agent_id not in denied)
        return board.model_copy(update={"intents": kept}), denied

    def _entitlement(self, agent: Agent | None, scope: str) -> str | None:
        """Why ``agent`` may not take part in a boundary on ``scope`` now, or None."""
        if agent is None:
            return "agent not known at the resolution boundary"
        if not all(agent.can_write(scope, t) for t in (MarkType.INTENT, MarkType.ACTION)):
            return f"agent {agent.name!r} may no longer write intents and actions in {scope!r}"
        refusal = self._barrier_refusal(agent, scope, (MarkType.INTENT,))
        return None if refusal is None else refusal.reason

    def resolve_all_deferred(self) -> dict[tuple[str, str], dict[UUID, Verdict]]:
        """A boundary for every deferred (scope, resource) with active intents, e.g. at the end
        of a scheduling round (P16: the harness calls this, so no intent waits for its TTL)."""
        pending = sorted(
            {
                (mark.scope, mark.resource)
                for mark in self.space.active_marks(mark_type=MarkType.INTENT)
                if isinstance(mark, Intent) and self._is_deferred(mark.scope)
            }
        )
        return {
            key: {agent_id: d.verdict for agent_id, d in self.resolve_deferred(*key).items()}
            for key in pending
        }

    def _is_deferred(self, scope: str) -> bool:
        with suppress(MarkspaceError):
            return bool(self.space.get_scope(scope).deferred)
        return False

    def _batch(self, scope_def: Scope, board: _Board) -> dict[UUID, GuardDecision]:
        intents = list(board.intents)
        agents = _agents_in_order(intents)
        if not agents:
            return {}
        claim = board.claim(exclude=None)
        if claim is not None:
            return self._batch_claimed(claim, agents, intents)
        policy = scope_def.conflict_policy
        if policy is ConflictPolicy.YIELD_ALL and len(agents) > 1:
            return self._batch_yield(intents, agents)
        winner = winning_intent(intents, policy) or intents[0]
        decisions = {
            agent_id: self._batch_verdict(agent_id, winner, intents, policy) for agent_id in agents
        }
        for decision in decisions.values():
            self._count_conflict(winner.scope, policy, decision.verdict)
        return decisions

    def _batch_verdict(
        self, agent_id: UUID, winner: Intent, intents: list[Intent], policy: ConflictPolicy
    ) -> GuardDecision:
        mine = _latest([i for i in intents if i.agent_id == agent_id])
        others = tuple(i for i in intents if i.agent_id != agent_id)
        if agent_id == winner.agent_id:
            return GuardDecision(
                verdict=Verdict.ALLOW,
                reason=f"won {winner.resource!r} at the resolution boundary ({policy.value})",
                intent_id=winner.id,
                conflicting_intents=others,
            )
        return GuardDecision(
            verdict=Verdict.BLOCKED,
            reason=(
                f"lost {winner.resource!r} at the resolution boundary to agent "
                f"{winner.agent_id} ({policy.value})"
            ),
            intent_id=mine.id if mine else None,
            winning_intent=winner,
            conflicting_intents=others,
            check=GuardCheck.DEFERRED,
        )

    def _batch_claimed(
        self, claim: Action, agents: list[UUID], intents: list[Intent]
    ) -> dict[UUID, GuardDecision]:
        holder = self._intent_behind(claim)
        decisions: dict[UUID, GuardDecision] = {}
        for agent_id in agents:
            mine = _latest([i for i in intents if i.agent_id == agent_id])
            if agent_id == claim.agent_id:
                decisions[agent_id] = GuardDecision(
                    verdict=Verdict.ALLOW,
                    reason="this agent's action already holds the resource",
                    intent_id=mine.id if mine else None,
                )
                continue
            decisions[agent_id] = GuardDecision(
                verdict=Verdict.BLOCKED,
                reason=self._claimed(claim).reason,
                intent_id=mine.id if mine else None,
                winning_intent=holder,
                winning_action=claim,
                check=GuardCheck.CLAIMED,
            )
        return decisions

    def _batch_yield(self, intents: list[Intent], agents: list[UUID]) -> dict[UUID, GuardDecision]:
        decisions: dict[UUID, GuardDecision] = {}
        for agent_id in agents:
            mine = _latest([i for i in intents if i.agent_id == agent_id])
            assert mine is not None
            others = tuple(i for i in intents if i.agent_id != agent_id)
            decisions[agent_id] = self._yield_all(agent_id, mine, others)
        return decisions

    # ------------------------------------------------------------------ post_action

    def post_action(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        action: str,
        result: Any,
        intent_id: uuid.UUID | None = None,
        *,
        failed: bool = False,
    ) -> uuid.UUID:
        """§9.2: record the outcome as an action mark that supersedes the intent; a race
        with another agent's action is settled by §6.3 (the later action wins). A result
        that is not a JSON object is stored as `as_result` shapes it."""
        _require_agent(agent)
        if not isinstance(result, Mapping):
            result = as_result(result)
        lock_resource = resource if resource is not None else ""
        with self.space.lock(scope, lock_resource):
            return self._record_action(agent, scope, resource, action, result, intent_id, failed)

    def _record_action(
        self,
        agent: Agent,
        scope: str,
        resource: str | None,
        action: str,
        result: Mapping[str, Any] | None,
        intent_id: UUID | None,
        failed: bool,
    ) -> UUID:
        earlier = None
        if resource is not None:
            board = self._board(scope, resource)
            earlier = None if failed else board.claim(exclude=agent.id)
            if intent_id is None:
                own = board.own(agent.id)
                intent_id = own.id if own else None
        supersedes = earlier.id if earlier is not None else intent_id
        mark = Action(
            scope=scope,
            resource=resource,
            action=action,
            result=dict(result or {}),
            failed=failed,
            supersedes=supersedes,
        )
        mark_id = self.space.write(agent, mark)
        if resource is not None and self.space.get_scope(scope).deferred:
            self.space.consume_grant(scope, resource, agent.id, mark_id)
        self._after_fact(agent, mark)
        if earlier is not None:
            self._warn_superseded(earlier, mark_id, agent)
        return mark_id

    def _after_fact(self, agent: Agent, mark: Mark) -> None:
        """Count a write the guard could not refuse (rate limit, envelope, telemetry)."""
        now = self.space.now()
        scope_def = self.space.get_scope(mark.scope)
        self.rate_limiter.record(scope_def.name, agent.id, scope_def.rate_limit, now)
        self._count_written(agent.id, mark.scope, mark.mark_type, "accepted")
        if self.envelope is None:
            return
        self._register(agent)
        self.envelope.record(agent.id, mark, at=now)
        self._respond(agent, self.envelope.evaluate(agent.id, now), mark.scope)

    def _warn_superseded(self, earlier: Action, new_id: UUID, agent: Agent) -> None:
        self._system_write(
            Warning(
                scope=earlier.scope,
                invalidates=earlier.id,
                topic=SUPERSEDED_TOPIC,
                reason=(
                    f"your action {earlier.action!r} on {earlier.resource!r} was superseded by "
                    f"a later action ({new_id}) of agent {agent.name!r} ({agent.id})"
                ),
                severity=Severity.CAUTION,
            )
        )

    # ------------------------------------------------------------------ execute

    def execute(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: ToolFn,
        confidence: float = 0.5,
        tool_args: tuple[Any, ...] = (),
        tool_kwargs: dict[str, Any] | None = None,
    ) -> tuple[GuardDecision, Any]:
        """§9.2: pre_action, ``tool_fn(*tool_args, **tool_kwargs)`` only on ALLOW (P37), then
        post_action. The whole check-act-record runs under ``space.lock(scope, resource)``, so
        the next agent on the resource finds the committed action (P39), not a pending
        intent."""
        call = _bound(tool_fn, tool_args, tool_kwargs)
        decision, result, _ = self._traced(
            agent, scope, resource, intent_action, result_action, call, confidence, None
        )
        return decision, result

    def execute_once(
        self,
        key: str,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: ToolFn,
        confidence: float = 0.5,
        tool_args: tuple[Any, ...] = (),
        tool_kwargs: dict[str, Any] | None = None,
    ) -> tuple[GuardDecision, Any, bool]:
        """`execute` at most once per caller-chosen `key` (keys.py), for callers that retry
        (an Airflow task's tries share a key). Returns (decision, result, replayed): a key
        whose call recorded its action replays it (ALLOW, the action's recorded result, the
        tool not called, nothing written); a key whose call started and recorded nothing
        raises `UnsettledCall` (it may have acted); a key whose call raised calls again.
        Otherwise as `execute`, with the key's record committed before the tool runs."""
        key = check_key(key)
        call = _bound(tool_fn, tool_args, tool_kwargs)
        return self._traced(
            agent, scope, resource, intent_action, result_action, call, confidence, key
        )

    def _traced(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: Callable[[], Any],
        confidence: float,
        key: str | None,
    ) -> tuple[GuardDecision, Any, bool]:
        """`execute` and `execute_once`, with their telemetry event (P58)."""
        outcome: dict[str, Any] = {"verdict": None, "tool_called": False, "failed": False}
        try:
            decision, result, error = self._execute(
                agent, scope, resource, intent_action, result_action, tool_fn, confidence,
                outcome, key,
            )
            if error is not None:
                outcome["failed"] = True
                raise error
            return decision, result, bool(outcome.get("replayed"))
        except Exception as exc:
            outcome["error"] = type(exc).__name__
            raise
        finally:
            self.emitter.event(
                EVENT_EXECUTE, agent_id=agent.id, scope=scope, resource=resource, **outcome
            )

    def _execute(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: Callable[[], Any],
        confidence: float,
        outcome: dict[str, Any],
        key: str | None = None,
    ) -> tuple[GuardDecision, Any, Exception | None]:
        gate = self._verb_gate(agent, scope, result_action)
        if gate is not None:
            outcome.update(verdict=gate.verdict, check=gate.check, reason=gate.reason)
            return gate, None, None
        with self.space.lock(scope, resource):
            replay = self._replay(key, agent, scope, resource) if key is not None else None
            if replay is not None:
                outcome.update(verdict=Verdict.ALLOW, replayed=True)
                return replay[0], replay[1], None
            decision = self.pre_action(agent, scope, resource, intent_action, confidence)
            outcome.update(verdict=decision.verdict, check=decision.check, reason=decision.reason)
            if decision.verdict is not Verdict.ALLOW:
                return decision, None, None
            if key is not None:  # committed now: a crash in the tool cannot take it back
                self.space.record_key(KeyRecord(
                    key=key, kind="execute", agent_id=agent.id, scope=scope,
                    resource=resource, intent_id=decision.intent_id,
                    started_at=self.space.now()))
            outcome["tool_called"] = True
            result, error = _call(tool_fn)
            action_id = self._record_outcome(
                agent, scope, resource, result_action, decision, result, error
            )
            if key is not None:  # in the action's transaction
                self.space.settle_key(key, action_id, failed=error is not None)
            outcome["action_id"] = action_id
        return decision, result, error

    def _replay(
        self, key: str, agent: Agent, scope: str, resource: str
    ) -> tuple[GuardDecision, Any] | None:
        """What an earlier call under `key` decides (under the resource's lock): its
        recorded action replayed, UnsettledCall, or None (no call yet, or a failed one)."""
        _require_agent(agent)
        earlier = self.space.key_record(key)
        if earlier is None:
            return None
        check_same(earlier, "execute", agent.id, scope, resource)
        if not earlier.settled:
            raise UnsettledCall(earlier)
        if earlier.failed:
            return None
        action = self.space.get(earlier.mark_id)
        result = json.loads(json.dumps(action.result)) if isinstance(action, Action) else {}
        decision = GuardDecision(
            verdict=Verdict.ALLOW,
            reason=f"replayed: key {key!r} already ran as action {earlier.mark_id}",
            intent_id=earlier.intent_id,
        )
        return decision, result

    def _verb_gate(self, agent: Agent, scope: str, result_action: str) -> GuardDecision | None:
        scope_def = self.space.get_scope(scope)
        if _verb_allowed(scope_def.allowed_action_verbs, result_action):
            return None
        return _denied(
            _Refusal(
                check=GuardCheck.VERB,
                reason=f"action verb {result_action!r} is not allowed in scope {scope!r}",
            )
        )

    def _record_outcome(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        result_action: str,
        decision: GuardDecision,
        result: Any,
        error: Exception | None,
    ) -> UUID:
        """The action mark of a tool call: its result, or a failed action if it raised."""
        if error is None:
            return self.post_action(
                agent, scope, resource, result_action, self._fit(as_result(result)),
                decision.intent_id,
            )
        return self.post_action(
            agent,
            scope,
            resource,
            result_action,
            _failure(error, self.space.max_content_bytes),
            intent_id=decision.intent_id,
            failed=True,
        )

    def _fit(self, result: dict[str, Any]) -> dict[str, Any]:
        """A tool's result as its action mark can hold it: a result larger than the space's
        content bound is replaced by its size (the tool has run, and the action that records
        it must be stored to hold the resource, P39; the caller still gets the result)."""
        limit = self.space.max_content_bytes
        size = json_bytes(result)
        return result if size <= limit else {"oversize": True, "bytes": size, "limit": limit}

    # ------------------------------------------------------------------ write_mark

    def write_mark(self, agent: Agent, mark: AnyMark) -> uuid.UUID:
        """The single enforcement boundary for observations, warnings and needs (§9.7):
        budget, barrier, scope rate limit and envelope, then ``space.write``. A rejection
        stores nothing (P42) and raises a `WriteRejected`; intents and actions raise
        `GuardedMarkType` (a ValueError). Every call emits one telemetry event (P58), with
        the package's verdicts: "accepted"; "rejected" when a defence refused the write
        ("content_rejected" for a content policy); "denied" when the mark or the space did
        (unauthorized, unknown scope, bad mark, quota); "error" when the store failed. The
        event of a refusal has its reason."""
        mark_type = getattr(mark, "mark_type", None)
        scope = getattr(mark, "scope", None)
        agent_id = getattr(agent, "id", None)
        verdict, check, mark_id, reason = "denied", None, None, ""
        try:
            mark_id = self._write_mark(agent, mark)
            verdict = "accepted"
            return mark_id
        except WriteRejected as exc:
            check, reason = exc.check, str(exc)
            verdict = "content_rejected" if isinstance(exc, ContentPolicyError) else "rejected"
            raise
        except Exception as exc:
            check, reason = type(exc).__name__, str(exc)
            if not isinstance(exc, MarkspaceError | ValueError):
                verdict = "error"  # the store failed, not the write's checks
            raise
        finally:
            self._count_written(agent_id, scope, mark_type, verdict)
            self.emitter.event(
                EVENT_WRITE_MARK,
                agent_id=agent_id,
                scope=scope,
                mark_type=mark_type,
                verdict=verdict,
                check=check,
                mark_id=mark_id,
                reason=reason,
            )

    def _write_mark(self, agent: Agent, mark: Mark) -> UUID:
        _require_agent(agent)
        if isinstance(mark, Intent | Action):
            raise GuardedMarkType(
                f"Cannot write {mark.mark_type.value} via write_mark(): {mark.mark_type.value} "
                "marks go through execute() or pre_action()/post_action()"
            )
        if not isinstance(mark, Mark):
            raise InvalidMark(f"expected a mark, got {type(mark).__name__}")
        refusal = self._budget_refusal(agent) or self._barrier_refusal(
            agent, mark.scope, (mark.mark_type,)
        )
        if refusal is not None:
            self._observe_rejected(agent, mark)
            raise _REJECTIONS[refusal.check](refusal.reason, refusal.check)
        scope_def = self.space.get_scope(mark.scope)  # UnknownScope before anything is counted
        reservation = self._reserve(agent, scope_def)
        screened = _Screened(mark=mark)
        if reservation.allowed and isinstance(mark, Observation) and self._content_policies:
            screened = self._screen(agent, mark, scope_def)  # REJECT raises: nothing stored
        admitted = self._admit_reserved(agent, mark, reservation)
        if isinstance(admitted, _Refusal):
            raise _REJECTIONS[admitted.check](admitted.reason, admitted.check)
        if screened.flags:
            return self._store_flagged(agent, screened, admitted)
        return self._store(agent, screened.mark, admitted)

    # ------------------------------------------------------------------ content policies

    def _screen(self, agent: Agent, mark: Observation, scope_def: Scope) -> _Screened:
        """Markspace §9.13: the policies in order (P68); a REWRITE replaces only the content
        and feeds the next policy (P69), the first REJECT ends it with ContentPolicyError
        (P67), FLAG reasons accumulate. Runs after the rate limit and before the envelope
        records the attempt, so a rejected observation is not an envelope event (P70)."""
        current, flags, flagged_by = mark, [], []
        for policy in self._content_policies:
            name = _policy_name(policy)
            result = policy.evaluate(agent, current, scope_def)
            if not isinstance(result, PolicyResult):
                raise InvalidArgument(
                    f"content policy {name} returned {type(result).__name__}, not a PolicyResult"
                )
            verdict = PolicyVerdict(result.verdict)
            self.emitter.event(
                EVENT_CONTENT_POLICY, agent_id=agent.id, scope=mark.scope, policy=name,
                verdict=verdict, reason=result.reason or "",
            )
            if verdict is PolicyVerdict.REJECT:
                raise ContentPolicyError(result.reason or f"rejected by content policy {name}")
            if verdict is PolicyVerdict.REWRITE:
                current = _rewritten(current, result.content)
            elif verdict is PolicyVerdict.FLAG:
                flags.append(result.reason or "")
                flagged_by.append(name)
        return _Screened(mark=current, flags=tuple(flags), flagged_by=tuple(flagged_by))

    def _store_flagged(self, agent: Agent, screened: _Screened, admitted: _Admission) -> UUID:
        """A flagged observation and the `_system` warning about it, both or neither: one
        transaction on Postgres (the guard's lock), the warning checked before anything is
        stored on both backends."""
        mark = screened.mark
        self._ensure_system_scope()
        system = self._system_for(SYSTEM_SCOPE)
        reasons = "; ".join(r for r in screened.flags if r) or "no reason given"
        try:
            with self.space.lock(mark.scope, _FLAG_LOCK):
                probe = self._flag_warning(agent, mark, UUID(int=0), screened, reasons)
                self._check_system_write(system, probe)
                mark_id = self.space.write(agent, mark)
                self.space.write(
                    system, self._flag_warning(agent, mark, mark_id, screened, reasons)
                )
        except Exception:
            self.rate_limiter.release(admitted.scope, agent.id, admitted.reservation)
            raise
        return mark_id

    @staticmethod
    def _flag_warning(
        agent: Agent, mark: Observation, mark_id: UUID, screened: _Screened, reasons: str
    ) -> Warning:
        return Warning(
            scope=SYSTEM_SCOPE,
            topic=CONTENT_FLAG_TOPIC,
            reason=(
                f"content of observation {mark_id} (topic {mark.topic!r}) by agent "
                f"{agent.name!r} ({agent.id}) in scope {mark.scope!r} flagged by "
                f"{', '.join(screened.flagged_by)}: {reasons}"
            ),
            severity=Severity.CAUTION,
        )

    def _check_system_write(self, system: Agent, mark: Mark) -> None:
        """The checks the space makes before storing ``mark`` (so a refusal comes before
        anything is written, on either backend)."""
        checked = revalidate(mark)
        check_content_size(checked, self.space.max_content_bytes)
        authorize_write(system, checked, self.space.get_scope(checked.scope))

    def _ensure_system_scope(self) -> None:
        """Register `_system` (the package's decay) unless the space already defines it."""
        try:
            self.space.get_scope(SYSTEM_SCOPE)
        except MarkspaceError:
            self.space.register_scope(Scope(name=SYSTEM_SCOPE, decay=SYSTEM_DECAY))

    # ------------------------------------------------------------------ shared checks

    def _budget_refusal(self, agent: Agent) -> _Refusal | None:
        budget = _budget_of(agent)
        if not self.budgets.is_stopped(agent.id, budget):
            return None
        status = self.budgets.status(agent.id, budget)
        spent = ", ".join(d.value for d in status.exhausted) if status else ""
        return _Refusal(
            check=GuardCheck.BUDGET,
            reason=f"agent {agent.name!r} has exhausted its token budget ({spent})",
        )

    def _barrier_refusal(
        self, agent: Agent, scope: str, mark_types: Iterable[MarkType]
    ) -> _Refusal | None:
        barrier = self._barriers.get(agent.id)
        if barrier is None:
            return None
        mark_types = tuple(mark_types)
        for mark_type in mark_types:
            if not barrier.is_allowed_checked(scope, mark_type):
                return _Refusal(
                    check=GuardCheck.BARRIER,
                    reason=(
                        f"agent {agent.name!r} blocked by barrier: it may no longer write "
                        f"{MarkType(mark_type).value} marks in scope {scope!r} until the "
                        "principal restores it"
                    ),
                )
        if MarkType.NEED in mark_types or not barrier.needs_required(scope):
            return None
        if self._has_open_need(agent.id, scope):
            return None
        return _Refusal(
            check=GuardCheck.NEED_REQUIRED,
            reason=(
                f"agent {agent.name!r} must write a Need mark in scope {scope!r} before other "
                "writes there (its barrier requires one)"
            ),
        )

    def _has_open_need(self, agent_id: UUID, scope: str) -> bool:
        """Whether the agent has an unresolved Need of its own in exactly ``scope`` (what a
        barrier's need requirement asks for, as in the package)."""
        return any(
            isinstance(mark, Need) and mark.agent_id == agent_id and mark.resolved_by is None
            for mark in self._read(scope, mark_type=MarkType.NEED)
        )

    def _admit(self, agent: Agent, mark: Mark) -> _Admission | _Refusal:
        """Rate limit, then envelope, for one write about to happen. The reservation is
        undone when a later step refuses the write."""
        reservation = self._reserve(agent, self.space.get_scope(mark.scope))
        return self._admit_reserved(agent, mark, reservation)

    def _reserve(self, agent: Agent, scope_def: Scope) -> RateDecision:
        return self.rate_limiter.reserve(
            scope_def.name, agent.id, scope_def.rate_limit, self.space.now()
        )

    def _admit_reserved(
        self, agent: Agent, mark: Mark, reservation: RateDecision
    ) -> _Admission | _Refusal:
        """The envelope's look at a write whose rate-limit reservation is made (the
        envelope sees rate-limited attempts too, P64)."""
        now = self.space.now()
        scope, mark_type = mark.scope, mark.mark_type
        scope_def = self.space.get_scope(scope)
        self._register(agent)
        finding = self._observe(agent, mark, now, refused=not reservation.allowed)
        if not reservation.allowed:
            return _Refusal(check=GuardCheck.RATE_LIMIT, reason=reservation.reason)
        refusal = self._envelope_refusal(agent, scope, mark_type, finding)
        if refusal is not None:
            self.rate_limiter.release(scope_def.name, agent.id, reservation)
            return refusal
        return _Admission(scope=scope_def.name, reservation=reservation)

    def _store(self, agent: Agent, mark: Mark, admitted: _Admission) -> UUID:
        try:
            mark_id = self.space.write(agent, mark)
        except Exception:
            self.rate_limiter.release(admitted.scope, agent.id, admitted.reservation)
            raise
        if mark.mark_type is MarkType.INTENT:
            self._count_written(agent.id, mark.scope, mark.mark_type, "accepted")
        return mark_id

    def _observe(
        self, agent: Agent, mark: Mark, now: float, *, refused: bool
    ) -> Finding | None:
        """Count the write in the envelope and judge the agent. A write the guard goes on
        with is counted as the write (``record``, what the package's post-write hook does),
        before it is stored, so the write that trips the envelope is the one refused; one a
        check refused first (barrier, budget, rate limit) is an attempt (``record_attempt``,
        P64). A content policy's FLAG adds nothing to either (P70)."""
        if self.envelope is None:
            return None
        if refused:
            self.envelope.record_attempt(
                agent.id, mark.mark_type, scope=mark.scope, at=now,
                topic=getattr(mark, "topic", None),
            )
        else:
            self.envelope.record(agent.id, mark, at=now)
        finding = self.envelope.evaluate(agent.id, now)
        self._respond(agent, finding, mark.scope)
        return finding

    def _observe_rejected(self, agent: Agent, mark: Mark) -> None:
        """A write the barrier or budget refused is still an attempt the envelope sees."""
        if self.envelope is None:
            return
        self._register(agent)
        with suppress(MarkspaceError):
            self._observe(agent, mark, self.space.now(), refused=True)

    def _envelope_refusal(
        self, agent: Agent, scope: str, mark_type: MarkType, finding: Finding | None
    ) -> _Refusal | None:
        if finding is None or finding.verdict is not EnvelopeVerdict.RESTRICTED:
            return None
        barrier = self._barriers.get(agent.id)
        if barrier is None or barrier.is_allowed_checked(scope, mark_type):
            return None
        return _Refusal(
            check=GuardCheck.ENVELOPE,
            reason=f"agent {agent.name!r} is restricted by the envelope: {finding.reason}",
        )

    def _register(self, agent: Agent) -> None:
        if self.envelope is not None and not self.envelope.is_exempt(agent.id):
            self.envelope.register(agent)

    # ------------------------------------------------------------------ escalation

    def _respond(self, agent: Agent, finding: Finding, scope: str) -> None:
        if not finding.new_flag:
            return
        if finding.verdict is EnvelopeVerdict.RESTRICTED:
            self._apply_restriction(agent, finding, finding.scope or scope)
        elif finding.verdict is EnvelopeVerdict.FLAGGED:
            self._flag_concentration(finding)

    def _apply_restriction(self, agent: Agent, finding: Finding, scope: str) -> None:
        """§9.7 escalation: one scope narrowed per flag (P43); after
        ``global_escalation_threshold`` flags, needs are required everywhere."""
        barrier = self.barrier_for(agent.id)
        mark_type = finding.mark_type or MarkType.OBSERVATION
        level = barrier.record_flag(scope)
        barrier.narrow(scope, mark_type)
        if level >= self.global_escalation_threshold:
            barrier.require_need_all()
        invalidated = self._invalidate_recent(agent.id, scope, finding)
        self._ensure_need(
            scope,
            question=f"Agent {agent.name!r} was restricted by the envelope: review and restore?",
            context={
                "kind": "envelope_restriction",
                "agent_id": str(agent.id),
                "anomaly": finding.kind.value if finding.kind else None,
                "mark_type": mark_type.value,
                "window": finding.window,
                "flag_count": level,
                "reason": finding.reason,
            },
            priority=0.9,
            blocking=False,
        )
        self.emitter.event(
            EVENT_RESTRICTION,
            agent_id=agent.id,
            scope=scope,
            mark_type=mark_type,
            flag_count=level,
            global_need=level >= self.global_escalation_threshold,
            invalidated=len(invalidated),
            reason=finding.reason,
        )

    def _invalidate_recent(self, agent_id: UUID, scope: str, finding: Finding) -> list[UUID]:
        window = self.envelope.window_seconds if self.envelope else 0.0
        since = self.space.now() - window
        recent = [
            mark
            for mark in self._read(scope, mark_type=MarkType.OBSERVATION)
            if mark.agent_id == agent_id and (mark.created_at or 0.0) >= since
        ]
        warned = []
        for mark in recent:
            warning_id = self._system_write(
                Warning(
                    scope=mark.scope,
                    invalidates=mark.id,
                    topic=mark.topic,
                    reason=f"written by an agent the envelope restricted: {finding.reason}",
                    severity=Severity.CAUTION,
                )
            )
            if warning_id is not None:
                warned.append(warning_id)
        return warned

    def _flag_concentration(self, finding: Finding) -> None:
        if finding.scope is None or finding.topic is None:
            return
        self._system_write(
            Warning(
                scope=finding.scope,
                topic=finding.topic,
                reason=f"concentration: {finding.reason}",
                severity=Severity.INFO,
            )
        )

    # ------------------------------------------------------------------ budgets

    def budget_status(self, agent: Agent) -> BudgetUsage | None:
        """The agent's usage against its manifest's budget (None without one)."""
        return self.budgets.status(agent.id, _budget_of(agent))

    def get_budget_status(self, agent_id: uuid.UUID) -> tuple[int, int, bool] | None:
        """(input used, output used, exhausted) for a tracked agent, else None."""
        return self.budgets.snapshot(agent_id)

    def check_budget_activation(self, agent: Agent) -> str | None:
        """Why the agent may not be activated (its budget is spent, P61), or None (also
        for agents without a budget, P59)."""
        refusal = self._budget_refusal(agent)
        return None if refusal is None else refusal.reason

    def update_budget(
        self, agent: Agent, new_budget: TokenBudget, principal_token: uuid.UUID
    ) -> bool:
        """The principal raises (or sets) the agent's budget: a stopped agent whose usage is
        below the new totals resumes (P62). False, nothing changed, for a wrong token. The
        agent's manifest is not changed (agents are frozen): keep passing the budget on it,
        or the manifest's own budget applies again at the next check."""
        if not isinstance(new_budget, TokenBudget):
            raise InvalidArgument(f"expected a TokenBudget, got {type(new_budget).__name__}")
        if not _same_token(principal_token, self._principal_token):
            return False
        self.budgets.clear(agent.id, new_budget)
        return True

    def can_activate(self, agent: Agent) -> bool:
        return self._budget_refusal(agent) is None

    def check_activation(self, agent: Agent) -> GuardDecision:
        """ALLOW, or DENIED once the lifetime budget is spent (P61); a larger budget on the
        agent's manifest makes it eligible again (P62)."""
        refusal = self._budget_refusal(agent)
        if refusal is not None:
            return _denied(refusal)
        return GuardDecision(verdict=Verdict.ALLOW, reason="within budget")

    def record_round_tokens(
        self,
        agent: Agent,
        input_tokens: int,
        output_tokens: int,
        *,
        duration: float | None = None,
    ) -> BudgetStatus:
        """Add one activation's token usage (P63: totals only grow); writes the one-time
        non-blocking warning Need per dimension (P60). No budget: no tracking, OK (P59).
        Returns the package's status for the round (a warning before exhaustion)."""
        record = self.budgets.record(agent.id, _budget_of(agent), input_tokens, output_tokens)
        labels = {"agent_id": agent.id}
        self.emitter.count(TOKENS_INPUT, labels, input_tokens)
        self.emitter.count(TOKENS_OUTPUT, labels, output_tokens)
        if duration is not None:
            self.emitter.observe(ROUND_DURATION, labels, duration)
        for dimension in record.warnings:
            self._budget_need(agent, dimension, record.usage)
        if record.usage is not None:
            for dimension in BudgetDimension:
                remaining = record.usage.remaining(dimension)
                if remaining is not None:
                    self.emitter.gauge(
                        BUDGET_REMAINING,
                        {"agent_id": agent.id, "dimension": dimension.value},
                        remaining,
                    )
        self.emitter.event(
            EVENT_ROUND,
            agent_id=agent.id,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            stopped=bool(record.usage and record.usage.stopped),
            status=record.status,
        )
        return record.status

    def input_token_limit(self, agent: Agent) -> int | None:
        budget = _budget_of(agent)
        return budget.max_input_tokens_per_round if budget else None

    def output_token_limit(self, agent: Agent) -> int | None:
        """The ``max_tokens`` to configure the agent's LLM call with (§9.10 rule 2)."""
        budget = _budget_of(agent)
        return budget.max_output_tokens_per_round if budget else None

    def read(
        self,
        agent: Agent,
        scope: str,
        *,
        resource: str | None = None,
        topic: str | None = None,
        mark_type: MarkType | None = None,
        min_strength: float = 0.01,
        estimate: Callable[[Mark], int] | None = None,
    ) -> list[Mark]:
        """An agent's read (its visibility applies), cut to its per-round input budget
        (§9.10 rule 1: strongest first), counted in telemetry."""
        marks = self.space.read(
            scope,
            resource=resource,
            topic=topic,
            mark_type=mark_type,
            min_strength=min_strength,
            reader=agent,
        )
        limit = self.input_token_limit(agent)
        if estimate is None:
            marks = _truncate(marks, limit)
        else:
            marks = _truncate(marks, limit, estimate)
        self.emitter.count(MARKS_READ, {"agent_id": agent.id, "scope": scope}, len(marks))
        return marks

    def _budget_need(
        self, agent: Agent, dimension: BudgetDimension, status: BudgetUsage | None
    ) -> None:
        scope = self.notice_scope or SYSTEM_SCOPE
        if status is None:
            return
        total = status.input_total if dimension is BudgetDimension.INPUT else status.output_total
        used = status.input_used if dimension is BudgetDimension.INPUT else status.output_used
        self._system_write(
            Need(
                scope=scope,
                question=(
                    f"Agent {agent.name!r} has used {used} of its {total} {dimension.value} "
                    "tokens: raise its budget?"
                ),
                context={
                    "kind": "budget_warning",
                    "agent_id": str(agent.id),
                    "agent_name": agent.name,
                    "dimension": dimension.value,
                    "used": used,
                    "consumed": used,
                    "total": total,
                    "warning_fraction": _budget_of(agent).warning_fraction,
                },
                priority=0.7,
                blocking=False,
            )
        )

    # ------------------------------------------------------------------ telemetry gauges

    def emit_gauges(self) -> None:
        """Gauges of §9.11 from the space: active marks and pending needs per scope."""
        try:
            active = list(self.space.active_marks())
        except Exception:
            return
        counts: dict[tuple[str, str], int] = {}
        pending: dict[str, int] = {}
        for mark in active:
            key = (mark.scope, mark.mark_type.value)
            counts[key] = counts.get(key, 0) + 1
            if isinstance(mark, Need) and mark.resolved_by is None:
                pending[mark.scope] = pending.get(mark.scope, 0) + 1
        for (scope, mark_type), count in sorted(counts.items()):
            self.emitter.gauge(ACTIVE_MARKS, {"scope": scope, "mark_type": mark_type}, count)
        for scope, count in sorted(pending.items()):
            self.emitter.gauge(NEEDS_PENDING, {"scope": scope}, count)
        self._emit_totals()

    def _emit_totals(self) -> None:
        count_marks = getattr(self.space, "count_marks", None)
        if not callable(count_marks):
            return
        try:
            totals = count_marks()
        except Exception:
            return
        for (scope, mark_type), count in sorted(dict(totals).items()):
            self.emitter.gauge(TOTAL_MARKS, {"scope": scope, "mark_type": str(mark_type)}, count)

    def _count_written(self, agent_id: Any, scope: Any, mark_type: Any, verdict: str) -> None:
        self.emitter.count(
            MARKS_WRITTEN,
            {
                "agent_id": agent_id,
                "scope": scope,
                "mark_type": getattr(mark_type, "value", mark_type),
                "verdict": verdict,
            },
        )

    def _count_conflict(self, scope: str, policy: ConflictPolicy, verdict: Verdict) -> None:
        self.emitter.count(
            CONFLICTS_RESOLVED,
            {"scope": scope, "policy": policy.value, "outcome": verdict.value},
        )

    # ------------------------------------------------------------------ reading helpers

    def _read(
        self, scope: str, *, resource: str | None = None, mark_type: MarkType | None = None
    ) -> list[Any]:
        """The active marks of exactly `scope`: the guard decides per (scope, resource), so
        its checks read one scope (`read_exact`), not the hierarchy `read` returns."""
        return self.space.read_exact(scope, resource=resource, mark_type=mark_type,
                                     min_strength=ACTIVE)

    def _board(self, scope: str, resource: str) -> _Board:
        """The active intents on (scope, resource) and the actions holding it. Actions come
        from `claims`, not from a read: a warning lowers an action's strength (§9.5) but the
        action still happened, and P39 makes any action a claim."""
        read, claims = self.space.read_with_claims(scope, resource, ACTIVE)
        marks = sorted((m for m in read if m.scope == scope), key=_write_order)
        return _Board(
            intents=tuple(m for m in marks if isinstance(m, Intent)),
            actions=tuple(claims),
        )

    # ------------------------------------------------------------------ system writes

    def _ensure_need(
        self,
        scope: str,
        *,
        question: str,
        context: dict[str, Any],
        priority: float,
        blocking: bool,
        author: Agent | None = None,
    ) -> UUID | None:
        """An unresolved Need of `author` (default: the system agent) with this context,
        written if missing (P36: asking again files nothing new)."""
        author_id = author.id if author is not None else self._system.id
        for mark in self._read(scope, mark_type=MarkType.NEED):
            if (
                isinstance(mark, Need)
                and mark.agent_id == author_id
                and mark.resolved_by is None
                and _same_request(mark.context, context)
            ):
                return mark.id
        need = Need(
            scope=scope, question=question, context=context, priority=priority, blocking=blocking
        )
        return self._system_write(need, author)

    def _system_write(self, mark: Mark, author: Agent | None = None) -> UUID | None:
        """Best effort: the guard's own marks (and the Needs it files for an agent) never
        change the agent's verdict."""
        try:
            return self.space.write(author or self._system_for(mark.scope), mark)
        except MarkspaceError as exc:
            self.emitter.event(
                EVENT_SYSTEM_WRITE_FAILED,
                scope=mark.scope,
                mark_type=mark.mark_type,
                error=type(exc).__name__,
                message=str(exc),
            )
            return None

    def _system_for(self, scope: str) -> Agent:
        """The system agent, with warnings and needs allowed under ``scope``'s root."""
        if self._fixed_system is not None:
            return self._fixed_system
        root = scope.split("/", 1)[0]
        with self._lock:
            if root not in self._system_grants:
                self._system_grants[root] = SYSTEM_TYPES
                self._system = Agent(
                    id=SYSTEM_AGENT_ID,
                    name=SYSTEM_AGENT_NAME,
                    scopes=dict(self._system_grants),
                )
            return self._system


# --------------------------------------------------------------------------- helpers


def _require_agent(agent: object) -> None:
    if not isinstance(agent, Agent):
        raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")


def _bound(
    tool_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> Callable[[], Any]:
    """The tool call `execute` makes: ``tool_fn(*args, **kwargs)``."""
    if not callable(tool_fn):
        raise InvalidArgument(f"tool_fn must be callable, got {type(tool_fn).__name__}")
    if not args and not kwargs:
        return tool_fn
    return lambda: tool_fn(*args, **(kwargs or {}))


def _checked_policies(policies: Sequence[ContentPolicy] | None) -> tuple[ContentPolicy, ...]:
    """The guard's content policies, in order; each must have an ``evaluate`` method."""
    if policies is None:
        return ()
    if isinstance(policies, str | bytes) or not isinstance(policies, Iterable):
        raise InvalidArgument("content_policies must be a list of ContentPolicy objects")
    checked = tuple(policies)
    for policy in checked:
        if not callable(getattr(policy, "evaluate", None)):
            raise InvalidArgument(
                f"a content policy needs an evaluate() method: {type(policy).__name__}"
            )
    return checked


def _verb_allowed(allowed: Sequence[str], verb: str) -> bool:
    """The space's rule for a scope's verb list (§7.1): empty allows every verb, else the
    verb or ``"*"`` must be listed (so the guard's early DENIED matches the store)."""
    return not allowed or verb in allowed or "*" in allowed


def _rewritten(mark: Observation, content: Any) -> Observation:
    """``mark`` with only its content replaced (P69), re-validated (InvalidMark if the new
    content is not a JSON value the mark can hold)."""
    checked = revalidate(mark.model_copy(update={"content": content}))
    assert isinstance(checked, Observation)
    return checked


def _failure(error: Exception, limit: int) -> dict[str, Any]:
    """A failed action's result, the package's ``{"error": str(exc), "status": "failed"}``;
    a message too long for the space's content bound is cut (the action must be stored)."""
    message = str(error)
    result = {"error": message, "status": "failed"}
    if json_bytes(result) > limit:
        result["error"] = message[: max(0, limit // 8 - 64)]  # JSON escapes: <= 6 bytes a char
    return result


def _policy_name(policy: Any) -> str:
    name = getattr(policy, "name", None)
    return name if isinstance(name, str) and name else type(policy).__name__


def _call(tool_fn: Callable[[], Any]) -> tuple[Any, Exception | None]:
    try:
        return tool_fn(), None
    except Exception as exc:
        return None, exc


def _denied(refusal: _Refusal) -> GuardDecision:
    return GuardDecision(verdict=Verdict.DENIED, reason=refusal.reason, check=refusal.check)


def _same_plan(own: Intent | None, proposed: Intent) -> bool:
    return own is not None and (own.action, own.confidence) == (
        proposed.action,
        proposed.confidence,
    )


def _write_order(mark: Mark) -> tuple[float, str]:
    return (mark.created_at or 0.0, str(mark.id))


def _latest(marks: list[Any]) -> Any:
    return max(marks, key=_write_order) if marks else None


def _agents_in_order(intents: list[Intent]) -> list[UUID]:
    seen: dict[UUID, None] = {}
    for intent in intents:
        if intent.agent_id is not None:
            seen.setdefault(intent.agent_id, None)
    return list(seen)


def _verdicts(
    scope: str, resource: str, decisions: Mapping[UUID, GuardDecision]
) -> list[DeferredVerdict]:
    """A boundary's decisions as the verdicts the space keeps (one per agent, each about
    the intent its decision names)."""
    winner = next((d.intent_id for d in decisions.values() if d.allowed), None)
    return [
        DeferredVerdict(
            scope=scope,
            resource=resource,
            agent_id=agent_id,
            intent_id=decision.intent_id,
            allowed=decision.allowed,
            winner_id=winner,
        )
        for agent_id, decision in decisions.items()
        if decision.intent_id is not None
    ]


def _same_token(given: object, expected: UUID | str) -> bool:
    if not isinstance(given, UUID | str):
        return False
    return hmac.compare_digest(str(given).encode(), str(expected).encode())


def _same_request(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    keys = ("kind", "agent_id", "resource", "action", "mark_type", "window")
    return all(stored.get(key) == wanted.get(key) for key in keys)


def _budget_of(agent: Agent) -> Any:
    return agent.manifest.budget if agent.manifest is not None else None


def as_result(value: Any) -> dict[str, Any]:
    """A tool's return value as the JSON object an action mark stores: a JSON object as is,
    any other JSON value under ``"value"``, anything else as its ``repr`` under ``"repr"``."""
    if value is None:
        return {}
    try:
        frozen = freeze_json(value)
    except ValueError:
        return {"repr": repr(value)[:10_000]}
    return dict(frozen) if isinstance(frozen, dict) else {"value": frozen}


__all__ = [
    "ACTIVE",
    "SYSTEM_AGENT_ID",
    "SYSTEM_SCOPE",
    "BarrierDenied",
    "BudgetExhausted",
    "ContentPolicy",
    "ContentPolicyError",
    "EnvelopeRestricted",
    "Guard",
    "GuardCheck",
    "GuardDecision",
    "GuardVerdict",
    "GuardedMarkType",
    "PolicyResult",
    "PolicyVerdict",
    "RateLimited",
    "Verdict",
    "WriteRejected",
    "as_result",
]
