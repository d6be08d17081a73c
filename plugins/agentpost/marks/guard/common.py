"""The guard's vocabulary (spec §9): verdicts, decisions, content-policy types, the errors a
refused write raises, the constants of its system agent, and the pure helpers its sections
share. `agentpost.marks.guard` re-exports every public name.
"""

from __future__ import annotations

import hmac
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid5

from pydantic import BaseModel, ConfigDict

from agentpost.marks import core as _core
from agentpost.marks.core import (
    Action,
    Agent,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkspaceError,
    MarkType,
    Observation,
    Scope,
    freeze_json,
    json_bytes,
    revalidate,
)
from agentpost.marks.rate_limit import RateDecision

if TYPE_CHECKING:
    pass


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


def _board_of(scope: str, read: Iterable[Mark], claims: Iterable[Action]) -> _Board:
    """The guard's view of one resource from `read_with_claims`: the active intents of
    exactly `scope`, in write order, and the actions holding it. Actions come from the
    claims, not the read: a warning lowers an action's strength (§9.5) but the action still
    happened, and P39 makes any action a claim."""
    marks = sorted((m for m in read if m.scope == scope), key=_write_order)
    return _Board(intents=tuple(m for m in marks if isinstance(m, Intent)),
                  actions=tuple(claims))


def _lazy_lock(space: Any, scope: str, resource: str) -> AbstractContextManager[None]:
    """``space.lock(scope, resource, lazy=True)`` (on Postgres, taken with the block's first
    statement), or the plain lock of a space whose lock() takes no ``lazy`` (a wrapper
    written to the interface before it had one)."""
    try:
        return space.lock(scope, resource, lazy=True)
    except TypeError:
        return space.lock(scope, resource)


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
