"""`post_action`, `execute` and `execute_once` (spec §9.2, P37, P39): the action mark after a
tool call, the guarded call itself, a keyed call's replay. A mixin of `Guard`
(`agentpost.marks.guard`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from agentpost.marks.core import (
    Action,
    Agent,
    Mark,
    Severity,
    Warning,
    json_bytes,
)
from agentpost.marks.guard.common import (
    SUPERSEDED_TOPIC,
    GuardCheck,
    GuardDecision,
    ToolFn,
    Verdict,
    _bound,
    _call,
    _denied,
    _failure,
    _Refusal,
    _require_agent,
    _verb_allowed,
    as_result,
)
from agentpost.marks.keys import KeyRecord, UnsettledCall, check_key, check_same
from agentpost.marks.telemetry import EVENT_EXECUTE

if TYPE_CHECKING:
    pass


class _Execution:
    """The `post_action` / `execute` section of `Guard`."""

    # ------------------------------------------------------------------ post_action

    def post_action(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        action: str,
        result: Any,
        intent_id: uuid.UUID | None = None,
        *,
        failed: bool = False,
    ) -> uuid.UUID:
        """§9.2: record the outcome as an action mark that supersedes the intent; a race
        with another agent's action is settled by §6.3 (the later action wins). A result
        that is not a JSON object is stored as `as_result` shapes it."""
        _require_agent(agent)
        if not isinstance(result, Mapping):
            result = as_result(result)
        lock_resource = resource if resource is not None else ""
        with self.space.lock(scope, lock_resource):
            return self._record_action(agent, scope, resource, action, result, intent_id, failed)

    def _record_action(
        self,
        agent: Agent,
        scope: str,
        resource: str | None,
        action: str,
        result: Mapping[str, Any] | None,
        intent_id: UUID | None,
        failed: bool,
    ) -> UUID:
        earlier = None
        if resource is not None:
            board = self._board(scope, resource)
            earlier = None if failed else board.claim(exclude=agent.id)
            if intent_id is None:
                own = board.own(agent.id)
                intent_id = own.id if own else None
        supersedes = earlier.id if earlier is not None else intent_id
        mark = Action(
            scope=scope,
            resource=resource,
            action=action,
            result=dict(result or {}),
            failed=failed,
            supersedes=supersedes,
        )
        mark_id = self.space.write(agent, mark)
        if resource is not None and self.space.get_scope(scope).deferred:
            self.space.consume_grant(scope, resource, agent.id, mark_id)
        self._after_fact(agent, mark)
        if earlier is not None:
            self._warn_superseded(earlier, mark_id, agent)
        return mark_id

    def _after_fact(self, agent: Agent, mark: Mark) -> None:
        """Count a write the guard could not refuse (rate limit, envelope, telemetry)."""
        now = self.space.now()
        scope_def = self.space.get_scope(mark.scope)
        self.rate_limiter.record(scope_def.name, agent.id, scope_def.rate_limit, now)
        self._count_written(agent.id, mark.scope, mark.mark_type, "accepted")
        if self.envelope is None:
            return
        self._register(agent)
        self.envelope.record(agent.id, mark, at=now)
        self._respond(agent, self.envelope.evaluate(agent.id, now), mark.scope)

    def _warn_superseded(self, earlier: Action, new_id: UUID, agent: Agent) -> None:
        self._system_write(
            Warning(
                scope=earlier.scope,
                invalidates=earlier.id,
                topic=SUPERSEDED_TOPIC,
                reason=(
                    f"your action {earlier.action!r} on {earlier.resource!r} was superseded by "
                    f"a later action ({new_id}) of agent {agent.name!r} ({agent.id})"
                ),
                severity=Severity.CAUTION,
            )
        )

    # ------------------------------------------------------------------ execute

    def execute(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: ToolFn,
        confidence: float = 0.5,
        tool_args: tuple[Any, ...] = (),
        tool_kwargs: dict[str, Any] | None = None,
    ) -> tuple[GuardDecision, Any]:
        """§9.2: pre_action, ``tool_fn(*tool_args, **tool_kwargs)`` only on ALLOW (P37), then
        post_action. The whole check-act-record runs under ``space.lock(scope, resource)``, so
        the next agent on the resource finds the committed action (P39), not a pending
        intent."""
        call = _bound(tool_fn, tool_args, tool_kwargs)
        decision, result, _ = self._traced(
            agent, scope, resource, intent_action, result_action, call, confidence, None
        )
        return decision, result

    def execute_once(
        self,
        key: str,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: ToolFn,
        confidence: float = 0.5,
        tool_args: tuple[Any, ...] = (),
        tool_kwargs: dict[str, Any] | None = None,
    ) -> tuple[GuardDecision, Any, bool]:
        """`execute` at most once per caller-chosen `key` (keys.py), for callers that retry
        (an Airflow task's tries share a key). Returns (decision, result, replayed): a key
        whose call recorded its action replays it (ALLOW, the action's recorded result, the
        tool not called, nothing written); a key whose call started and recorded nothing
        raises `UnsettledCall` (it may have acted); a key whose call raised calls again.
        Otherwise as `execute`, with the key's record committed before the tool runs."""
        key = check_key(key)
        call = _bound(tool_fn, tool_args, tool_kwargs)
        return self._traced(
            agent, scope, resource, intent_action, result_action, call, confidence, key
        )

    def _traced(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: Callable[[], Any],
        confidence: float,
        key: str | None,
    ) -> tuple[GuardDecision, Any, bool]:
        """`execute` and `execute_once`, with their telemetry event (P58)."""
        outcome: dict[str, Any] = {"verdict": None, "tool_called": False, "failed": False}
        try:
            decision, result, error = self._execute(
                agent, scope, resource, intent_action, result_action, tool_fn, confidence,
                outcome, key,
            )
            if error is not None:
                outcome["failed"] = True
                raise error
            return decision, result, bool(outcome.get("replayed"))
        except Exception as exc:
            outcome["error"] = type(exc).__name__
            raise
        finally:
            self.emitter.event(
                EVENT_EXECUTE, agent_id=agent.id, scope=scope, resource=resource, **outcome
            )

    def _execute(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        intent_action: str,
        result_action: str,
        tool_fn: Callable[[], Any],
        confidence: float,
        outcome: dict[str, Any],
        key: str | None = None,
    ) -> tuple[GuardDecision, Any, Exception | None]:
        gate = self._verb_gate(agent, scope, result_action)
        if gate is not None:
            outcome.update(verdict=gate.verdict, check=gate.check, reason=gate.reason)
            return gate, None, None
        with self.space.lock(scope, resource):
            replay = self._replay(key, agent, scope, resource) if key is not None else None
            if replay is not None:
                outcome.update(verdict=Verdict.ALLOW, replayed=True)
                return replay[0], replay[1], None
            decision = self.pre_action(agent, scope, resource, intent_action, confidence)
            outcome.update(verdict=decision.verdict, check=decision.check, reason=decision.reason)
            if decision.verdict is not Verdict.ALLOW:
                return decision, None, None
            if key is not None:  # committed now: a crash in the tool cannot take it back
                self.space.record_key(KeyRecord(
                    key=key, kind="execute", agent_id=agent.id, scope=scope,
                    resource=resource, intent_id=decision.intent_id,
                    started_at=self.space.now()))
            outcome["tool_called"] = True
            result, error = _call(tool_fn)
            action_id = self._record_outcome(
                agent, scope, resource, result_action, decision, result, error
            )
            if key is not None:  # in the action's transaction
                self.space.settle_key(key, action_id, failed=error is not None)
            outcome["action_id"] = action_id
        return decision, result, error

    def _replay(
        self, key: str, agent: Agent, scope: str, resource: str
    ) -> tuple[GuardDecision, Any] | None:
        """What an earlier call under `key` decides (under the resource's lock): its
        recorded action replayed, UnsettledCall, or None (no call yet, or a failed one)."""
        _require_agent(agent)
        earlier = self.space.key_record(key)
        if earlier is None:
            return None
        check_same(earlier, "execute", agent.id, scope, resource)
        if not earlier.settled:
            raise UnsettledCall(earlier)
        if earlier.failed:
            return None
        action = self.space.get(earlier.mark_id)
        result = json.loads(json.dumps(action.result)) if isinstance(action, Action) else {}
        decision = GuardDecision(
            verdict=Verdict.ALLOW,
            reason=f"replayed: key {key!r} already ran as action {earlier.mark_id}",
            intent_id=earlier.intent_id,
        )
        return decision, result

    def _verb_gate(self, agent: Agent, scope: str, result_action: str) -> GuardDecision | None:
        scope_def = self.space.get_scope(scope)
        if _verb_allowed(scope_def.allowed_action_verbs, result_action):
            return None
        return _denied(
            _Refusal(
                check=GuardCheck.VERB,
                reason=f"action verb {result_action!r} is not allowed in scope {scope!r}",
            )
        )

    def _record_outcome(
        self,
        agent: Agent,
        scope: str,
        resource: str,
        result_action: str,
        decision: GuardDecision,
        result: Any,
        error: Exception | None,
    ) -> UUID:
        """The action mark of a tool call: its result, or a failed action if it raised."""
        if error is None:
            return self.post_action(
                agent, scope, resource, result_action, self._fit(as_result(result)),
                decision.intent_id,
            )
        return self.post_action(
            agent,
            scope,
            resource,
            result_action,
            _failure(error, self.space.max_content_bytes),
            intent_id=decision.intent_id,
            failed=True,
        )

    def _fit(self, result: dict[str, Any]) -> dict[str, Any]:
        """A tool's result as its action mark can hold it: a result larger than the space's
        content bound is replaced by its size (the tool has run, and the action that records
        it must be stored to hold the resource, P39; the caller still gets the result)."""
        limit = self.space.max_content_bytes
        size = json_bytes(result)
        return result if size <= limit else {"oversize": True, "bytes": size, "limit": limit}
