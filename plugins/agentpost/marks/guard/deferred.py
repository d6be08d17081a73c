"""Deferred resolution (spec §9.2, P14–P18): `resolve_deferred` and `resolve_all_deferred`,
the boundary that compares every active intent on a resource and records the verdicts in
the space. A mixin of `Guard` (`agentpost.marks.guard`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING
from uuid import UUID

from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    Intent,
    MarkspaceError,
    MarkType,
    Scope,
    winning_intent,
)
from agentpost.marks.guard.common import (
    GuardCheck,
    GuardDecision,
    GuardVerdict,
    Verdict,
    _agents_in_order,
    _Board,
    _latest,
    _verdicts,
)
from agentpost.marks.telemetry import EVENT_RESOLVE_DEFERRED

if TYPE_CHECKING:
    pass


class _Deferred:
    """The deferred-resolution section of `Guard`."""

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
