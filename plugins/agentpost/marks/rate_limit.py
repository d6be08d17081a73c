"""Scope rate limits (Markspace §9.12): per-agent and fleet-wide write caps per sliding window.

The limits are declared on the scope (``Scope.rate_limit``, a `ScopeRateLimit`).
`RateLimitTracker` is the package's tracker (``check_and_record``); `RateLimiter` is what
the guard uses: the same sliding windows, plus a reservation that is given back when the store
then refuses the write. The guard consults it for every write it makes on an agent's behalf,
independently of the envelope and of token budgets (P66).

Readings chosen where the spec leaves room:
- Windows slide, as in the package: a write counts while ``now - window_seconds <= t``, so a
  cap lifts as the oldest counted write ages out (P65); the per-agent cap is checked first.
- Counters are keyed by the *defining* scope's name: ``a/b`` without a definition of its own
  resolves to ``a`` and shares ``a``'s counters, as it shares its other settings.
- Refusals start with the package's words ("Rate limit exceeded", "Fleet rate limit
  exceeded"), which callers match on, and go on with ours (who, what cap, which window).
- A write is counted when it is reserved (before the store) and released if the store then
  refuses it, so two threads cannot both take the last slot.
- The counters live in the guard's process (like the envelope's statistics); several
  processes over one Postgres space each enforce the limit on their own writes.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import ScopeRateLimit

__all__ = [
    "RateDecision",
    "RateLimitKind",
    "RateLimitTracker",
    "RateLimiter",
    "ScopeRateLimit",
]


class RateLimitKind(StrEnum):
    AGENT = "agent"
    FLEET = "fleet"


class RateDecision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed: bool
    reason: str = ""
    kind: RateLimitKind | None = None
    #: the time the reservation was counted at (what `release` takes back)
    at: float | None = None


def _prune(stamps: deque[float], start: float) -> deque[float]:
    while stamps and stamps[0] < start:
        stamps.popleft()
    return stamps


@dataclass
class RateLimitTracker:
    """Write times per (scope, agent) and per scope, in sliding windows (the package's
    tracker). Not locked: its owner serializes calls."""

    _per_agent: dict[tuple[str, uuid.UUID], deque[float]] = field(default_factory=dict)
    _per_scope: dict[str, deque[float]] = field(default_factory=dict)

    def refusal(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit, now: float
    ) -> RateDecision | None:
        """Why one more write would break a cap now, or None (counts nothing)."""
        start = now - limit.window_seconds
        agent_cap = limit.max_writes_per_agent_per_window
        if agent_cap is not None:
            mine = _prune(self._per_agent.setdefault((scope, agent_id), deque()), start)
            if len(mine) >= agent_cap:
                return RateDecision(
                    allowed=False, kind=RateLimitKind.AGENT,
                    reason=(f"Rate limit exceeded: agent {agent_id} reached its limit of "
                            f"{agent_cap} writes per {limit.window_seconds:g} s window in "
                            f"scope {scope!r}"))
        fleet_cap = limit.max_total_writes_per_window
        if fleet_cap is not None:
            everyone = _prune(self._per_scope.setdefault(scope, deque()), start)
            if len(everyone) >= fleet_cap:
                return RateDecision(
                    allowed=False, kind=RateLimitKind.FLEET,
                    reason=(f"Fleet rate limit exceeded: scope {scope!r} reached its fleet cap "
                            f"of {fleet_cap} writes per {limit.window_seconds:g} s window"))
        return None

    def record(self, scope: str, agent_id: UUID, limit: ScopeRateLimit, now: float) -> None:
        """Count a write at ``now`` against the caps the limit sets."""
        if limit.max_writes_per_agent_per_window is not None:
            self._per_agent.setdefault((scope, agent_id), deque()).append(now)
        if limit.max_total_writes_per_window is not None:
            self._per_scope.setdefault(scope, deque()).append(now)

    def check_and_record(
        self, scope: str, agent_id: uuid.UUID, limit: ScopeRateLimit, now: float
    ) -> str | None:
        """The package's call: the reason a write is refused (P64, P65), or None after
        counting it."""
        refused = self.refusal(scope, agent_id, limit, now)
        if refused is not None:
            return refused.reason
        self.record(scope, agent_id, limit, now)
        return None

    def forget(self, scope: str, agent_id: UUID, at: float) -> None:
        """Take back one write counted at ``at`` (a reservation whose store failed)."""
        for stamps in (self._per_agent.get((scope, agent_id)), self._per_scope.get(scope)):
            if stamps is not None and at in stamps:
                stamps.remove(at)

    def counts(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit, now: float
    ) -> tuple[int, int]:
        start = now - limit.window_seconds
        mine = _prune(self._per_agent.get((scope, agent_id), deque()), start)
        everyone = _prune(self._per_scope.get(scope, deque()), start)
        return len(mine), len(everyone)


class RateLimiter:
    """The guard's rate limiter: a `RateLimitTracker` behind a lock, with reservations."""

    def __init__(self) -> None:
        self.tracker = RateLimitTracker()
        self._lock = threading.Lock()

    def check(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float
    ) -> RateDecision:
        """Whether one more write by ``agent_id`` to ``scope`` is allowed now (no counting)."""
        if limit is None:
            return RateDecision(allowed=True)
        with self._lock:
            return self.tracker.refusal(scope, agent_id, limit, now) or RateDecision(
                allowed=True, at=now
            )

    def reserve(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float
    ) -> RateDecision:
        """Check and, if allowed, count the write in one step."""
        if limit is None:
            return RateDecision(allowed=True)
        with self._lock:
            refused = self.tracker.refusal(scope, agent_id, limit, now)
            if refused is not None:
                return refused
            self.tracker.record(scope, agent_id, limit, now)
            return RateDecision(allowed=True, at=now)

    def record(self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float) -> None:
        """Count a write that happened without asking (a fact the guard must not refuse, such
        as the action mark recording a tool call that already ran)."""
        if limit is None:
            return
        with self._lock:
            self.tracker.record(scope, agent_id, limit, now)

    def release(self, scope: str, agent_id: UUID, decision: RateDecision) -> None:
        """Give back a reservation whose write did not happen."""
        if decision.at is None or not decision.allowed:
            return
        with self._lock:
            self.tracker.forget(scope, agent_id, decision.at)

    def usage(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit, now: float
    ) -> tuple[int, int]:
        """(this agent's writes, all writes) in ``scope``'s current window."""
        with self._lock:
            return self.tracker.counts(scope, agent_id, limit, now)
