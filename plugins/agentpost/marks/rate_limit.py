"""Scope rate limits (spec §9.12): per-agent and fleet-wide write caps per tumbling window.

The limits are declared on the scope (``Scope.rate_limit``, a `ScopeRateLimit`); `RateLimiter`
counts writes and says whether one more is allowed. The guard consults it for every write it
makes on an agent's behalf, independently of the envelope and of token budgets (P66).

Readings chosen where the spec leaves room:
- Windows are tumbling and aligned to the clock: window ``n`` is ``[n*w, (n+1)*w)``, so
  "until the window rotates" (P65) has one meaning for every process.
- Counters are keyed by the *defining* scope's name: ``a/b`` without a definition of its own
  resolves to ``a`` and shares ``a``'s counters, as it shares its other settings.
- A write is counted when it is reserved (before the store) and released if the store then
  refuses it, so two threads cannot both take the last slot.
- The counters live in the guard's process (like the envelope's statistics); several
  processes over one Postgres space each enforce the limit on their own writes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import ScopeRateLimit

__all__ = ["RateDecision", "RateLimitKind", "RateLimiter", "ScopeRateLimit"]


class RateLimitKind(StrEnum):
    AGENT = "agent"
    FLEET = "fleet"


class RateDecision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed: bool
    reason: str = ""
    kind: RateLimitKind | None = None
    window: int | None = None


@dataclass
class _Window:
    index: int
    seconds: float
    total: int = 0
    per_agent: dict[UUID, int] = field(default_factory=dict)


def window_index(now: float, seconds: float) -> int:
    return math.floor(now / seconds)


class RateLimiter:
    """Counts writes per (scope, window) and per (scope, agent, window)."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def check(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float
    ) -> RateDecision:
        """Whether one more write by ``agent_id`` to ``scope`` is allowed now (no counting)."""
        if limit is None:
            return RateDecision(allowed=True)
        with self._lock:
            return self._decide(self._current(scope, limit, now), scope, agent_id, limit)

    def reserve(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float
    ) -> RateDecision:
        """Check and, if allowed, count the write in one step."""
        if limit is None:
            return RateDecision(allowed=True)
        with self._lock:
            window = self._current(scope, limit, now)
            decision = self._decide(window, scope, agent_id, limit)
            if decision.allowed:
                window.total += 1
                window.per_agent[agent_id] = window.per_agent.get(agent_id, 0) + 1
            return decision

    def record(self, scope: str, agent_id: UUID, limit: ScopeRateLimit | None, now: float) -> None:
        """Count a write that happened without asking (a fact the guard must not refuse, such
        as the action mark recording a tool call that already ran)."""
        if limit is None:
            return
        with self._lock:
            window = self._current(scope, limit, now)
            window.total += 1
            window.per_agent[agent_id] = window.per_agent.get(agent_id, 0) + 1

    def release(self, scope: str, agent_id: UUID, decision: RateDecision) -> None:
        """Give back a reservation whose write did not happen (same window only)."""
        if decision.window is None or not decision.allowed:
            return
        with self._lock:
            window = self._windows.get(scope)
            if window is None or window.index != decision.window:
                return
            window.total = max(0, window.total - 1)
            left = window.per_agent.get(agent_id, 0) - 1
            if left > 0:
                window.per_agent[agent_id] = left
            else:
                window.per_agent.pop(agent_id, None)

    def usage(
        self, scope: str, agent_id: UUID, limit: ScopeRateLimit, now: float
    ) -> tuple[int, int]:
        """(this agent's writes, all writes) in ``scope``'s current window."""
        with self._lock:
            window = self._current(scope, limit, now)
            return window.per_agent.get(agent_id, 0), window.total

    def _current(self, scope: str, limit: ScopeRateLimit, now: float) -> _Window:
        index = window_index(now, limit.window_seconds)
        window = self._windows.get(scope)
        if window is None or window.index != index or window.seconds != limit.window_seconds:
            window = _Window(index=index, seconds=limit.window_seconds)
            self._windows[scope] = window
        return window

    @staticmethod
    def _decide(window: _Window, scope: str, agent_id: UUID, limit: ScopeRateLimit) -> RateDecision:
        fleet_cap = limit.max_total_writes_per_window
        if fleet_cap is not None and window.total >= fleet_cap:
            return RateDecision(
                allowed=False,
                kind=RateLimitKind.FLEET,
                window=window.index,
                reason=(
                    f"scope {scope!r} reached its fleet cap of {fleet_cap} writes per "
                    f"{limit.window_seconds:g} s window"
                ),
            )
        agent_cap = limit.max_writes_per_agent_per_window
        if agent_cap is not None and window.per_agent.get(agent_id, 0) >= agent_cap:
            return RateDecision(
                allowed=False,
                kind=RateLimitKind.AGENT,
                window=window.index,
                reason=(
                    f"agent {agent_id} reached its limit of {agent_cap} writes per "
                    f"{limit.window_seconds:g} s window in scope {scope!r}"
                ),
            )
        return RateDecision(allowed=True, window=window.index)
