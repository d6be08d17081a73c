"""Token budgets (Markspace §9.10): lifetime tracking, the one-time warning and the hard stop.

The budget itself is declared on the agent's manifest (``AgentManifest.budget``, a
`TokenBudget`). As in the markspace package, `BudgetTracker` is one agent's running totals
and flags and `BudgetStatus` the enum a check answers; `BudgetLedger` keeps the trackers of
every agent for the guard (our older multi-agent tracker; `BudgetUsage` is our older status).

Readings chosen where the spec leaves room:
- An agent whose manifest has no budget is neither tracked nor limited (P59). Usage starts
  counting from the first round recorded while it has a budget.
- Usage is keyed by agent id, so a principal "updates the manifest" by handing the guard the
  same agent (same id) with a larger budget: the history stays (P63), the ceiling moves and a
  stopped agent resumes (P62), as it does through `Guard.update_budget`.
- The warning is owed once per (agent, dimension) (P60), as in the package; a round that
  crosses both thresholds writes both warning Needs at once, while the status it reports and
  the tracker's flags are the package's (the input warning now, the output one next round).
- The hard stop compares lifetime usage with the total: ``used >= total`` stops (P61), and
  stays until a budget above the usage is seen.
- Per-round input budgets are applied with `truncate_to_budget`: marks in the order the space
  returns them (effective strength, descending), cut where the estimate would exceed the budget.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import MarkspaceError, TokenBudget

__all__ = [
    "BudgetDimension",
    "BudgetLedger",
    "BudgetStatus",
    "BudgetTracker",
    "BudgetUsage",
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


class BudgetStatus(StrEnum):
    """The result of a lifetime budget check (the package's enum): the most severe finding,
    warnings before exhaustion so that the warning is never skipped (P60 before P61)."""

    OK = "ok"
    WARNING_INPUT = "warning_input"
    WARNING_OUTPUT = "warning_output"
    EXHAUSTED_INPUT = "exhausted_input"
    EXHAUSTED_OUTPUT = "exhausted_output"


WARNINGS = {BudgetStatus.WARNING_INPUT: BudgetDimension.INPUT,
            BudgetStatus.WARNING_OUTPUT: BudgetDimension.OUTPUT}
EXHAUSTIONS = frozenset({BudgetStatus.EXHAUSTED_INPUT, BudgetStatus.EXHAUSTED_OUTPUT})


class BudgetUsage(BaseModel):
    """One agent's usage against its budget (what `BudgetStatus` was in our older API)."""

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
    """What recording one round changed: the status the package reports for it, the usage
    after it and the warnings now owed (every dimension that crossed, P60)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: BudgetStatus = BudgetStatus.OK
    usage: BudgetUsage | None = None
    warnings: tuple[BudgetDimension, ...] = ()


def lifetime_total(budget: TokenBudget, dimension: BudgetDimension) -> int | None:
    if dimension is BudgetDimension.INPUT:
        return budget.max_input_tokens_total
    return budget.max_output_tokens_total


@dataclass
class BudgetTracker:
    """One agent's running totals and warning/exhaustion flags (the package's tracker).
    Totals only grow (P63); exhaustion is sticky until a budget above the usage clears it
    (P61, P62). Not locked: its owner (`BudgetLedger`, the guard) serializes calls."""

    total_input_consumed: int = 0
    total_output_consumed: int = 0
    warning_emitted_input: bool = False
    warning_emitted_output: bool = False
    exhausted: bool = False

    def record_input(self, tokens: int) -> None:
        self.total_input_consumed += _checked(tokens, "tokens")

    def record_output(self, tokens: int) -> None:
        self.total_output_consumed += _checked(tokens, "tokens")

    def used(self, dimension: BudgetDimension) -> int:
        if dimension is BudgetDimension.INPUT:
            return self.total_input_consumed
        return self.total_output_consumed

    def _warned(self, dimension: BudgetDimension) -> bool:
        if dimension is BudgetDimension.INPUT:
            return self.warning_emitted_input
        return self.warning_emitted_output

    def mark_warned(self, dimension: BudgetDimension) -> None:
        if dimension is BudgetDimension.INPUT:
            self.warning_emitted_input = True
        else:
            self.warning_emitted_output = True

    def _over(self, budget: TokenBudget, dimension: BudgetDimension, share: float) -> bool:
        total = lifetime_total(budget, dimension)
        return total is not None and self.used(dimension) >= total * share

    def check_lifetime(self, budget: TokenBudget) -> BudgetStatus:
        """The most severe status: an owed warning first (input, then output), then
        exhaustion (which it records); the caller marks a warning emitted once written."""
        for status, dimension in WARNINGS.items():
            if not self._warned(dimension) and self._over(budget, dimension,
                                                          budget.warning_fraction):
                return status
        for status, dimension in zip(
            (BudgetStatus.EXHAUSTED_INPUT, BudgetStatus.EXHAUSTED_OUTPUT), BudgetDimension,
            strict=True,
        ):
            if self._over(budget, dimension, 1.0):
                self.exhausted = True
                return status
        return BudgetStatus.OK

    def is_exhausted(self, budget: TokenBudget) -> bool:
        """Sticky hard stop (P61): once exhausted, until `try_clear_exhaustion`."""
        if not self.exhausted:
            self.exhausted = any(self._over(budget, d, 1.0) for d in BudgetDimension)
        return self.exhausted

    def try_clear_exhaustion(self, budget: TokenBudget) -> bool:
        """Resume a stopped agent whose budget now exceeds its usage in every dimension
        (P62); True if it was stopped and is now cleared."""
        if not self.exhausted or any(self._over(budget, d, 1.0) for d in BudgetDimension):
            return False
        self.exhausted = False
        return True


class BudgetLedger:
    """The trackers of every budgeted agent, by agent id, behind one lock (what the guard
    keeps; our older `BudgetTracker`)."""

    def __init__(self) -> None:
        self._trackers: dict[UUID, BudgetTracker] = {}
        self._warned: dict[UUID, set[BudgetDimension]] = {}
        self._lock = threading.Lock()

    def tracker(self, agent_id: UUID) -> BudgetTracker | None:
        with self._lock:
            return self._trackers.get(agent_id)

    def record(
        self,
        agent_id: UUID,
        budget: TokenBudget | None,
        input_tokens: int,
        output_tokens: int,
    ) -> RoundRecord:
        """Add one round's usage (bad counts refused before anything changes). The status and
        the tracker's flags are the package's (one finding per round); `warnings` lists every
        dimension past its threshold whose one warning Need is not written yet (P60), claimed
        here so concurrent rounds cannot both owe it."""
        tokens_in = _checked(input_tokens, "input_tokens")
        tokens_out = _checked(output_tokens, "output_tokens")
        if budget is None:
            return RoundRecord()
        with self._lock:
            tracker = self._trackers.setdefault(agent_id, BudgetTracker())
            tracker.record_input(tokens_in)
            tracker.record_output(tokens_out)
            status = tracker.check_lifetime(budget)
            if status in WARNINGS:
                tracker.mark_warned(WARNINGS[status])
            warned = self._warned.setdefault(agent_id, set())
            warnings = [
                d for d in BudgetDimension
                if d not in warned and tracker._over(budget, d, budget.warning_fraction)
            ]
            warned.update(warnings)
            usage = _usage(agent_id, budget, tracker)
        return RoundRecord(status=status, usage=usage, warnings=tuple(warnings))

    def is_stopped(self, agent_id: UUID, budget: TokenBudget | None) -> bool:
        """The hard stop (P61), lifted by a budget above the usage, whether the principal
        passed it to `Guard.update_budget` or put it on the agent's manifest (P62)."""
        if budget is None:
            return False
        with self._lock:
            tracker = self._trackers.get(agent_id)
            if tracker is None:
                return False
            tracker.try_clear_exhaustion(budget)
            return tracker.is_exhausted(budget)

    def clear(self, agent_id: UUID, budget: TokenBudget) -> bool:
        with self._lock:
            tracker = self._trackers.get(agent_id)
            return tracker is not None and tracker.try_clear_exhaustion(budget)

    def snapshot(self, agent_id: UUID) -> tuple[int, int, bool] | None:
        """(input, output, exhausted) or None for an agent never tracked."""
        with self._lock:
            tracker = self._trackers.get(agent_id)
            if tracker is None:
                return None
            return (tracker.total_input_consumed, tracker.total_output_consumed,
                    tracker.exhausted)

    def status(self, agent_id: UUID, budget: TokenBudget | None) -> BudgetUsage | None:
        if budget is None:
            return None
        with self._lock:
            tracker = self._trackers.get(agent_id) or BudgetTracker()
            return _usage(agent_id, budget, tracker)

    def usage(self, agent_id: UUID) -> tuple[int, int]:
        """(input, output) tokens recorded for the agent so far."""
        with self._lock:
            tracker = self._trackers.get(agent_id) or BudgetTracker()
            return tracker.total_input_consumed, tracker.total_output_consumed


def _usage(agent_id: UUID, budget: TokenBudget, tracker: BudgetTracker) -> BudgetUsage:
    exhausted = tuple(d for d in BudgetDimension if tracker._over(budget, d, 1.0))
    return BudgetUsage(
        agent_id=agent_id,
        input_used=tracker.total_input_consumed,
        output_used=tracker.total_output_consumed,
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
