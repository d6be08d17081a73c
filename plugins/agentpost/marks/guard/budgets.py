"""Token budgets (spec §9.9, P61): activation, usage per round, the budget Needs, and the
budgeted `read`. A mixin of `Guard` (`agentpost.marks.guard`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentpost.marks.budget import (
    BudgetDimension,
    BudgetStatus,
    BudgetUsage,
    TokenBudget,
)
from agentpost.marks.budget import truncate_to_budget as _truncate
from agentpost.marks.core import (
    Agent,
    InvalidArgument,
    Mark,
    MarkType,
    Need,
)
from agentpost.marks.guard.common import (
    SYSTEM_SCOPE,
    GuardDecision,
    Verdict,
    _budget_of,
    _denied,
    _same_token,
)
from agentpost.marks.telemetry import (
    BUDGET_REMAINING,
    EVENT_ROUND,
    MARKS_READ,
    ROUND_DURATION,
    TOKENS_INPUT,
    TOKENS_OUTPUT,
)

if TYPE_CHECKING:
    pass


class _Budgets:
    """The token-budget section of `Guard`."""

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
