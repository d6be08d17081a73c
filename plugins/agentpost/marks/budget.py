"""Token budgets (spec §9.10): lifetime tracking, the one-time warning and the hard stop.

The budget itself is declared on the agent's manifest (``AgentManifest.budget``, a
`TokenBudget`); `BudgetTracker` keeps the running totals the guard records each round.

Readings chosen where the spec leaves room:
- An agent whose manifest has no budget is neither tracked nor limited (P59). Usage starts
  counting from the first round recorded while it has a budget.
- Usage is keyed by agent id, so a principal "updates the manifest" by handing the guard the
  same agent (same id) with a larger budget: the history stays (P63), the ceiling moves (P62).
- The warning is owed once per (agent, dimension, total budget) (P60): raising the budget
  re-arms it for the new ceiling.
- The hard stop compares lifetime usage with the total: ``used >= total`` stops (P61).
- Per-round input budgets are applied with `truncate_to_budget`: marks in the order the space
  returns them (effective strength, descending), cut where the estimate would exceed the budget.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import MarkspaceError, TokenBudget

__all__ = [
    "BudgetDimension",
    "BudgetStatus",
    "BudgetTracker",
    "InvalidTokenCount",
    "RoundRecord",
    "TokenBudget",
    "estimate_tokens",
    "truncate_to_budget",
]

T = TypeVar("T")


class InvalidTokenCount(MarkspaceError, ValueError):
    """A negative or non-integral token count."""


class BudgetDimension(StrEnum):
    INPUT = "input"
    OUTPUT = "output"


class BudgetStatus(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: UUID
    input_used: int
    output_used: int
    input_total: int | None
    output_total: int | None
    exhausted: tuple[BudgetDimension, ...] = ()

    @property
    def stopped(self) -> bool:
        return bool(self.exhausted)

    def remaining(self, dimension: BudgetDimension) -> int | None:
        total, used = self._pair(dimension)
        return None if total is None else max(0, total - used)

    def _pair(self, dimension: BudgetDimension) -> tuple[int | None, int]:
        if dimension is BudgetDimension.INPUT:
            return self.input_total, self.input_used
        return self.output_total, self.output_used


class RoundRecord(BaseModel):
    """What recording one round changed: the status after it and the warnings now owed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: BudgetStatus | None
    warnings: tuple[BudgetDimension, ...] = ()


def lifetime_total(budget: TokenBudget, dimension: BudgetDimension) -> int | None:
    if dimension is BudgetDimension.INPUT:
        return budget.max_input_tokens_total
    return budget.max_output_tokens_total


class BudgetTracker:
    """Running token totals per agent; monotonically non-decreasing (P63)."""

    def __init__(self) -> None:
        self._used: dict[UUID, dict[BudgetDimension, int]] = {}
        self._warned: set[tuple[UUID, BudgetDimension, int]] = set()
        self._lock = threading.Lock()

    def record(
        self,
        agent_id: UUID,
        budget: TokenBudget | None,
        input_tokens: int,
        output_tokens: int,
    ) -> RoundRecord:
        """Add one round's usage; returns the dimensions whose warning is owed now."""
        counts = {
            BudgetDimension.INPUT: _checked(input_tokens, "input_tokens"),
            BudgetDimension.OUTPUT: _checked(output_tokens, "output_tokens"),
        }
        if budget is None:
            return RoundRecord(status=None)
        with self._lock:
            used = self._used.setdefault(agent_id, dict.fromkeys(BudgetDimension, 0))
            for dimension, count in counts.items():
                used[dimension] += count
            warnings = tuple(
                dimension
                for dimension in BudgetDimension
                if self._claim_warning(agent_id, budget, dimension, used[dimension])
            )
            return RoundRecord(status=self._status(agent_id, budget, used), warnings=warnings)

    def status(self, agent_id: UUID, budget: TokenBudget | None) -> BudgetStatus | None:
        if budget is None:
            return None
        with self._lock:
            used = self._used.get(agent_id, dict.fromkeys(BudgetDimension, 0))
            return self._status(agent_id, budget, used)

    def usage(self, agent_id: UUID) -> tuple[int, int]:
        """(input, output) tokens recorded for the agent so far."""
        with self._lock:
            used = self._used.get(agent_id, {})
            return used.get(BudgetDimension.INPUT, 0), used.get(BudgetDimension.OUTPUT, 0)

    def _claim_warning(
        self, agent_id: UUID, budget: TokenBudget, dimension: BudgetDimension, used: int
    ) -> bool:
        total = lifetime_total(budget, dimension)
        if total is None or used < budget.warning_fraction * total:
            return False
        key = (agent_id, dimension, total)
        if key in self._warned:
            return False
        self._warned.add(key)
        return True

    @staticmethod
    def _status(
        agent_id: UUID, budget: TokenBudget, used: dict[BudgetDimension, int]
    ) -> BudgetStatus:
        exhausted = tuple(
            dimension
            for dimension in BudgetDimension
            if (total := lifetime_total(budget, dimension)) is not None and used[dimension] >= total
        )
        return BudgetStatus(
            agent_id=agent_id,
            input_used=used[BudgetDimension.INPUT],
            output_used=used[BudgetDimension.OUTPUT],
            input_total=budget.max_input_tokens_total,
            output_total=budget.max_output_tokens_total,
            exhausted=exhausted,
        )


def _checked(count: int, name: str) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidTokenCount(f"{name} must be a non-negative integer, got {count!r}")
    return count


def estimate_tokens(item: Any) -> int:
    """A rough token count (about four characters per token of the item's JSON form)."""
    if hasattr(item, "model_dump_json"):
        text = item.model_dump_json()
    else:
        text = json.dumps(item, default=str, sort_keys=True)
    return max(1, math.ceil(len(text) / 4))


def truncate_to_budget(
    items: Sequence[T] | Iterable[T],
    max_tokens: int | None,
    estimate: Callable[[T], int] = estimate_tokens,
) -> list[T]:
    """The longest prefix of ``items`` whose estimated size fits ``max_tokens`` (rule 1)."""
    items = list(items)
    if max_tokens is None:
        return items
    kept: list[T] = []
    spent = 0
    for item in items:
        cost = estimate(item)
        if spent + cost > max_tokens:
            break
        kept.append(item)
        spent += cost
    return kept
