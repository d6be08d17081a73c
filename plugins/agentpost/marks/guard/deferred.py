"""Deferred resolution (spec §9.2, P14–P18): `resolve_deferred` and `resolve_all_deferred`,
the boundary that compares every active intent on a resource and records the verdicts in
the space. A mixin of `Guard` (`agentpost.marks.guard`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING
from uuid import UUID

from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    Intent,
    InvalidArgument,
    MarkspaceError,
    MarkType,
    Scope,
    winning_intent,
)
from agentpost.marks.guard.common import (
    ACTIVE,
    GuardCheck,
    GuardDecision,
    GuardVerdict,
    Verdict,
    _agents_in_order,
    _Board,
    _board_of,
    _latest,
    _lazy_lock,
    _verdicts,
)
from agentpost.marks.telemetry import EVENT_RESOLVE_DEFERRED

if TYPE_CHECKING:
    pass

#: resources per transaction of `resolve_deferred_many`: each holds an advisory lock until
#: the commit, and Postgres's shared lock table has room for about max_locks_per_transaction
#: (64 by default) times max_connections locks, shared by every session
BOUNDARY_CHUNK = 200


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
        with _lazy_lock(self.space, scope, resource):  # taken with the board's read
            board, decisions = self._boundary(scope, scope_def, self._board(scope, resource),
                                              agents)
            self.space.record_verdicts(scope, resource, _verdicts(scope, resource, decisions))
        self._emit_boundary(scope, resource, board, decisions)
        return decisions

    def resolve_deferred_many(
        self,
        scope: str,
        resources: Iterable[str],
        agents: Mapping[uuid.UUID, Agent] | None = None,
    ) -> dict[str, dict[uuid.UUID, GuardDecision]]:
        """`resolve_deferred` of every resource of ``scope`` (resource -> decisions, in
        the order given, repeats once), deciding each exactly as it would: the same board
        under the same locks, the same verdicts recorded. What differs is the cost: the
        resources are taken in sorted chunks of BOUNDARY_CHUNK, and a chunk is one
        transaction holding all its keys' locks, with one read of all its boards and one
        write of all its verdicts (a few round trips per chunk, not per resource). A chunk
        is all or nothing: if a boundary in it raises, none of its verdicts is kept."""
        keys = list(dict.fromkeys(resources))
        if not all(isinstance(r, str) for r in keys):
            raise InvalidArgument("resolve_deferred_many() takes resources as strings")
        scope_def = self.space.get_scope(scope)
        decided: dict[str, dict[UUID, GuardDecision]] = {}
        ordered = sorted(keys)
        for start in range(0, len(ordered), BOUNDARY_CHUNK):
            chunk = ordered[start:start + BOUNDARY_CHUNK]
            decided.update(self._resolve_chunk(scope, scope_def, chunk, agents))
        return {r: decided[r] for r in keys}

    def _resolve_chunk(
        self,
        scope: str,
        scope_def: Scope,
        resources: list[str],
        agents: Mapping[UUID, Agent] | None,
    ) -> dict[str, dict[UUID, GuardDecision]]:
        """One transaction of `resolve_deferred_many`: lock, read, decide, record; the
        telemetry after it, as `resolve_deferred` emits it after its commit."""
        with self.space.lock_many(scope, resources, lazy=True):
            views = self.space.read_many_with_claims(scope, resources, ACTIVE)
            decided = {r: self._boundary(scope, scope_def, _board_of(scope, *views[r]), agents)
                       for r in resources}
            self.space.record_verdicts_many(
                scope, {r: _verdicts(scope, r, decisions)
                        for r, (_, decisions) in decided.items()})
        for resource, (board, decisions) in decided.items():
            self._emit_boundary(scope, resource, board, decisions)
        return {r: decisions for r, (_, decisions) in decided.items()}

    def _boundary(
        self,
        scope: str,
        scope_def: Scope,
        board: _Board,
        agents: Mapping[UUID, Agent] | None,
    ) -> tuple[_Board, dict[UUID, GuardDecision]]:
        """A boundary's decisions on `board` (the board they were taken on: without the
        intents of agents no longer entitled to them, when ``agents`` is given)."""
        denied: dict[UUID, GuardDecision] = {}
        if agents is not None:
            board, denied = self._recheck(board, scope, agents)
        return board, {**denied, **self._batch(scope_def, board)}

    def _emit_boundary(
        self, scope: str, resource: str, board: _Board, decisions: Mapping[UUID, GuardDecision]
    ) -> None:
        self.emitter.event(
            EVENT_RESOLVE_DEFERRED,
            scope=scope,
            resource=resource,
            intents=len(board.intents),
            verdicts={str(a): d.verdict for a, d in decisions.items()},
        )

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
        of a scheduling round (P16: the harness calls this, so no intent waits for its TTL).
        Each scope's resources go through `resolve_deferred_many`: the same verdicts, a few
        round trips per chunk of resources instead of four per resource."""
        pending = sorted(
            {
                (mark.scope, mark.resource)
                for mark in self.space.active_marks(mark_type=MarkType.INTENT)
                if isinstance(mark, Intent) and self._is_deferred(mark.scope)
            }
        )
        by_scope: dict[str, list[str]] = {}
        for scope, resource in pending:
            by_scope.setdefault(scope, []).append(resource)
        return {
            (scope, resource): {agent_id: d.verdict for agent_id, d in decisions.items()}
            for scope, resources in by_scope.items()
            for resource, decisions in self.resolve_deferred_many(scope, resources).items()
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
