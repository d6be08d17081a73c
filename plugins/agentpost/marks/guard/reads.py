"""The guard's telemetry gauges, its reads of a (scope, resource), and the best-effort writes
of its system agent. A mixin of `Guard` (`agentpost.marks.guard`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import UUID

from agentpost.marks.core import (
    Agent,
    ConflictPolicy,
    Mark,
    MarkspaceError,
    MarkType,
    Need,
)
from agentpost.marks.guard.common import (
    ACTIVE,
    SYSTEM_AGENT_ID,
    SYSTEM_AGENT_NAME,
    SYSTEM_TYPES,
    Verdict,
    _Board,
    _board_of,
    _same_request,
)
from agentpost.marks.telemetry import (
    ACTIVE_MARKS,
    CONFLICTS_RESOLVED,
    EVENT_SYSTEM_WRITE_FAILED,
    MARKS_WRITTEN,
    NEEDS_PENDING,
    TOTAL_MARKS,
)

if TYPE_CHECKING:
    pass


class _Reads:
    """The gauges, reads and system-writes section of `Guard`."""

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
        """The active intents on (scope, resource) and the actions holding it (`_board_of`),
        one round trip on Postgres."""
        return _board_of(scope, *self.space.read_with_claims(scope, resource, ACTIVE))

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
