"""`Guard.pre_action` (spec §9.2): the checks before a tool call, in order (scope,
authorization, budget, barrier, a claiming action, rate limit, envelope), the intent it
writes and the scope's conflict policy. A mixin of `Guard` (`agentpost.marks.guard`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING
from uuid import UUID

from agentpost.marks.core import (
    Action,
    Agent,
    ConflictPolicy,
    DeferredVerdict,
    Intent,
    MarkType,
    Scope,
    winning_intent,
)
from agentpost.marks.guard.common import (
    ACTIVE,
    SYSTEM_AGENT_NAME,
    GuardCheck,
    GuardDecision,
    Verdict,
    _Admission,
    _Board,
    _board_of,
    _denied,
    _lazy_lock,
    _Refusal,
    _require_agent,
    _same_plan,
)
from agentpost.marks.telemetry import EVENT_PRE_ACTION

if TYPE_CHECKING:
    pass


class _PreAction:
    """The `pre_action` section of `Guard`."""

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
        # lazy: on Postgres the lock goes out with the first read of the resource
        with _lazy_lock(self.space, scope, resource):
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
            held, board = self._write_intent(agent, proposed, own, admitted)
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
    ) -> tuple[Intent, _Board]:
        """Write the intent; it supersedes the agent's previous one on the resource (§10).
        Then read the resource again (§9.2 step 4), in the same round trip on Postgres:
        the intent as stored, and the board with it."""
        intent = proposed.model_copy(update={"supersedes": own.id if own else None})
        try:
            mark_id, seen = self.space.write_and_read_with_claims(agent, intent, ACTIVE)
        except Exception:
            self.rate_limiter.release(admitted.scope, agent.id, admitted.reservation)
            raise
        self._count_written(agent.id, intent.scope, intent.mark_type, "accepted")
        held = intent.model_copy(update={"id": mark_id, "agent_id": agent.id})
        return held, _board_of(proposed.scope, *seen)

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
