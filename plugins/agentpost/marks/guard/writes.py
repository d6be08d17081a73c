"""`write_mark` (spec §9.4), the single enforcement boundary of an agent's own marks: the
content policies (Markspace §9.13), the checks every write shares (budget, barrier, rate
limit, envelope) and the escalation of an envelope finding. A mixin of `Guard`
(`agentpost.marks.guard`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from contextlib import suppress
from typing import TYPE_CHECKING
from uuid import UUID

from agentpost.marks.core import (
    Action,
    Agent,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkspaceError,
    MarkType,
    Need,
    Observation,
    Scope,
    Severity,
    Warning,
    authorize_write,
    check_content_size,
    revalidate,
)
from agentpost.marks.envelope import EnvelopeVerdict, Finding
from agentpost.marks.guard.common import (
    _FLAG_LOCK,
    _REJECTIONS,
    CONTENT_FLAG_TOPIC,
    EVENT_CONTENT_POLICY,
    SYSTEM_DECAY,
    SYSTEM_SCOPE,
    ContentPolicyError,
    GuardCheck,
    GuardedMarkType,
    PolicyResult,
    PolicyVerdict,
    WriteRejected,
    _Admission,
    _budget_of,
    _policy_name,
    _Refusal,
    _require_agent,
    _rewritten,
    _Screened,
)
from agentpost.marks.rate_limit import RateDecision
from agentpost.marks.telemetry import (
    EVENT_RESTRICTION,
    EVENT_WRITE_MARK,
)

if TYPE_CHECKING:
    from agentpost.marks.core import AnyMark


class _Writes:
    """The `write_mark` and content-policy section of `Guard`."""

    # ------------------------------------------------------------------ write_mark

    def write_mark(self, agent: Agent, mark: AnyMark) -> uuid.UUID:
        """The single enforcement boundary for observations, warnings and needs (§9.7):
        budget, barrier, scope rate limit and envelope, then ``space.write``. A rejection
        stores nothing (P42) and raises a `WriteRejected`; intents and actions raise
        `GuardedMarkType` (a ValueError). Every call emits one telemetry event (P58), with
        the package's verdicts: "accepted"; "rejected" when a defence refused the write
        ("content_rejected" for a content policy); "denied" when the mark or the space did
        (unauthorized, unknown scope, bad mark, quota); "error" when the store failed. The
        event of a refusal has its reason."""
        mark_type = getattr(mark, "mark_type", None)
        scope = getattr(mark, "scope", None)
        agent_id = getattr(agent, "id", None)
        verdict, check, mark_id, reason = "denied", None, None, ""
        try:
            mark_id = self._write_mark(agent, mark)
            verdict = "accepted"
            return mark_id
        except WriteRejected as exc:
            check, reason = exc.check, str(exc)
            verdict = "content_rejected" if isinstance(exc, ContentPolicyError) else "rejected"
            raise
        except Exception as exc:
            check, reason = type(exc).__name__, str(exc)
            if not isinstance(exc, MarkspaceError | ValueError):
                verdict = "error"  # the store failed, not the write's checks
            raise
        finally:
            self._count_written(agent_id, scope, mark_type, verdict)
            self.emitter.event(
                EVENT_WRITE_MARK,
                agent_id=agent_id,
                scope=scope,
                mark_type=mark_type,
                verdict=verdict,
                check=check,
                mark_id=mark_id,
                reason=reason,
            )

    def _write_mark(self, agent: Agent, mark: Mark) -> UUID:
        _require_agent(agent)
        if isinstance(mark, Intent | Action):
            raise GuardedMarkType(
                f"Cannot write {mark.mark_type.value} via write_mark(): {mark.mark_type.value} "
                "marks go through execute() or pre_action()/post_action()"
            )
        if not isinstance(mark, Mark):
            raise InvalidMark(f"expected a mark, got {type(mark).__name__}")
        refusal = self._budget_refusal(agent) or self._barrier_refusal(
            agent, mark.scope, (mark.mark_type,)
        )
        if refusal is not None:
            self._observe_rejected(agent, mark)
            raise _REJECTIONS[refusal.check](refusal.reason, refusal.check)
        scope_def = self.space.get_scope(mark.scope)  # UnknownScope before anything is counted
        reservation = self._reserve(agent, scope_def)
        screened = _Screened(mark=mark)
        if reservation.allowed and isinstance(mark, Observation) and self._content_policies:
            screened = self._screen(agent, mark, scope_def)  # REJECT raises: nothing stored
        admitted = self._admit_reserved(agent, mark, reservation)
        if isinstance(admitted, _Refusal):
            raise _REJECTIONS[admitted.check](admitted.reason, admitted.check)
        if screened.flags:
            return self._store_flagged(agent, screened, admitted)
        return self._store(agent, screened.mark, admitted)

    # ------------------------------------------------------------------ content policies

    def _screen(self, agent: Agent, mark: Observation, scope_def: Scope) -> _Screened:
        """Markspace §9.13: the policies in order (P68); a REWRITE replaces only the content
        and feeds the next policy (P69), the first REJECT ends it with ContentPolicyError
        (P67), FLAG reasons accumulate. Runs after the rate limit and before the envelope
        records the attempt, so a rejected observation is not an envelope event (P70)."""
        current, flags, flagged_by = mark, [], []
        for policy in self._content_policies:
            name = _policy_name(policy)
            result = policy.evaluate(agent, current, scope_def)
            if not isinstance(result, PolicyResult):
                raise InvalidArgument(
                    f"content policy {name} returned {type(result).__name__}, not a PolicyResult"
                )
            verdict = PolicyVerdict(result.verdict)
            self.emitter.event(
                EVENT_CONTENT_POLICY, agent_id=agent.id, scope=mark.scope, policy=name,
                verdict=verdict, reason=result.reason or "",
            )
            if verdict is PolicyVerdict.REJECT:
                raise ContentPolicyError(result.reason or f"rejected by content policy {name}")
            if verdict is PolicyVerdict.REWRITE:
                current = _rewritten(current, result.content)
            elif verdict is PolicyVerdict.FLAG:
                flags.append(result.reason or "")
                flagged_by.append(name)
        return _Screened(mark=current, flags=tuple(flags), flagged_by=tuple(flagged_by))

    def _store_flagged(self, agent: Agent, screened: _Screened, admitted: _Admission) -> UUID:
        """A flagged observation and the `_system` warning about it, both or neither: one
        transaction on Postgres (the guard's lock), the warning checked before anything is
        stored on both backends."""
        mark = screened.mark
        self._ensure_system_scope()
        system = self._system_for(SYSTEM_SCOPE)
        reasons = "; ".join(r for r in screened.flags if r) or "no reason given"
        try:
            with self.space.lock(mark.scope, _FLAG_LOCK):
                probe = self._flag_warning(agent, mark, UUID(int=0), screened, reasons)
                self._check_system_write(system, probe)
                mark_id = self.space.write(agent, mark)
                self.space.write(
                    system, self._flag_warning(agent, mark, mark_id, screened, reasons)
                )
        except Exception:
            self.rate_limiter.release(admitted.scope, agent.id, admitted.reservation)
            raise
        return mark_id

    @staticmethod
    def _flag_warning(
        agent: Agent, mark: Observation, mark_id: UUID, screened: _Screened, reasons: str
    ) -> Warning:
        return Warning(
            scope=SYSTEM_SCOPE,
            topic=CONTENT_FLAG_TOPIC,
            reason=(
                f"content of observation {mark_id} (topic {mark.topic!r}) by agent "
                f"{agent.name!r} ({agent.id}) in scope {mark.scope!r} flagged by "
                f"{', '.join(screened.flagged_by)}: {reasons}"
            ),
            severity=Severity.CAUTION,
        )

    def _check_system_write(self, system: Agent, mark: Mark) -> None:
        """The checks the space makes before storing ``mark`` (so a refusal comes before
        anything is written, on either backend)."""
        checked = revalidate(mark)
        check_content_size(checked, self.space.max_content_bytes)
        authorize_write(system, checked, self.space.get_scope(checked.scope))

    def _ensure_system_scope(self) -> None:
        """Register `_system` (the package's decay) unless the space already defines it."""
        try:
            self.space.get_scope(SYSTEM_SCOPE)
        except MarkspaceError:
            self.space.register_scope(Scope(name=SYSTEM_SCOPE, decay=SYSTEM_DECAY))

    # ------------------------------------------------------------------ shared checks

    def _budget_refusal(self, agent: Agent) -> _Refusal | None:
        budget = _budget_of(agent)
        if not self.budgets.is_stopped(agent.id, budget):
            return None
        status = self.budgets.status(agent.id, budget)
        spent = ", ".join(d.value for d in status.exhausted) if status else ""
        return _Refusal(
            check=GuardCheck.BUDGET,
            reason=f"agent {agent.name!r} has exhausted its token budget ({spent})",
        )

    def _barrier_refusal(
        self, agent: Agent, scope: str, mark_types: Iterable[MarkType]
    ) -> _Refusal | None:
        barrier = self._barriers.get(agent.id)
        if barrier is None:
            return None
        mark_types = tuple(mark_types)
        for mark_type in mark_types:
            if not barrier.is_allowed_checked(scope, mark_type):
                return _Refusal(
                    check=GuardCheck.BARRIER,
                    reason=(
                        f"agent {agent.name!r} blocked by barrier: it may no longer write "
                        f"{MarkType(mark_type).value} marks in scope {scope!r} until the "
                        "principal restores it"
                    ),
                )
        if MarkType.NEED in mark_types or not barrier.needs_required(scope):
            return None
        if self._has_open_need(agent.id, scope):
            return None
        return _Refusal(
            check=GuardCheck.NEED_REQUIRED,
            reason=(
                f"agent {agent.name!r} must write a Need mark in scope {scope!r} before other "
                "writes there (its barrier requires one)"
            ),
        )

    def _has_open_need(self, agent_id: UUID, scope: str) -> bool:
        """Whether the agent has an unresolved Need of its own in exactly ``scope`` (what a
        barrier's need requirement asks for, as in the package)."""
        return any(
            isinstance(mark, Need) and mark.agent_id == agent_id and mark.resolved_by is None
            for mark in self._read(scope, mark_type=MarkType.NEED)
        )

    def _admit(self, agent: Agent, mark: Mark) -> _Admission | _Refusal:
        """Rate limit, then envelope, for one write about to happen. The reservation is
        undone when a later step refuses the write."""
        reservation = self._reserve(agent, self.space.get_scope(mark.scope))
        return self._admit_reserved(agent, mark, reservation)

    def _reserve(self, agent: Agent, scope_def: Scope) -> RateDecision:
        return self.rate_limiter.reserve(
            scope_def.name, agent.id, scope_def.rate_limit, self.space.now()
        )

    def _admit_reserved(
        self, agent: Agent, mark: Mark, reservation: RateDecision
    ) -> _Admission | _Refusal:
        """The envelope's look at a write whose rate-limit reservation is made (the
        envelope sees rate-limited attempts too, P64)."""
        now = self.space.now()
        scope, mark_type = mark.scope, mark.mark_type
        scope_def = self.space.get_scope(scope)
        self._register(agent)
        finding = self._observe(agent, mark, now, refused=not reservation.allowed)
        if not reservation.allowed:
            return _Refusal(check=GuardCheck.RATE_LIMIT, reason=reservation.reason)
        refusal = self._envelope_refusal(agent, scope, mark_type, finding)
        if refusal is not None:
            self.rate_limiter.release(scope_def.name, agent.id, reservation)
            return refusal
        return _Admission(scope=scope_def.name, reservation=reservation)

    def _store(self, agent: Agent, mark: Mark, admitted: _Admission) -> UUID:
        try:
            mark_id = self.space.write(agent, mark)
        except Exception:
            self.rate_limiter.release(admitted.scope, agent.id, admitted.reservation)
            raise
        if mark.mark_type is MarkType.INTENT:
            self._count_written(agent.id, mark.scope, mark.mark_type, "accepted")
        return mark_id

    def _observe(
        self, agent: Agent, mark: Mark, now: float, *, refused: bool
    ) -> Finding | None:
        """Count the write in the envelope and judge the agent. A write the guard goes on
        with is counted as the write (``record``, what the package's post-write hook does),
        before it is stored, so the write that trips the envelope is the one refused; one a
        check refused first (barrier, budget, rate limit) is an attempt (``record_attempt``,
        P64). A content policy's FLAG adds nothing to either (P70)."""
        if self.envelope is None:
            return None
        if refused:
            self.envelope.record_attempt(
                agent.id, mark.mark_type, scope=mark.scope, at=now,
                topic=getattr(mark, "topic", None),
            )
        else:
            self.envelope.record(agent.id, mark, at=now)
        finding = self.envelope.evaluate(agent.id, now)
        self._respond(agent, finding, mark.scope)
        return finding

    def _observe_rejected(self, agent: Agent, mark: Mark) -> None:
        """A write the barrier or budget refused is still an attempt the envelope sees."""
        if self.envelope is None:
            return
        self._register(agent)
        with suppress(MarkspaceError):
            self._observe(agent, mark, self.space.now(), refused=True)

    def _envelope_refusal(
        self, agent: Agent, scope: str, mark_type: MarkType, finding: Finding | None
    ) -> _Refusal | None:
        if finding is None or finding.verdict is not EnvelopeVerdict.RESTRICTED:
            return None
        barrier = self._barriers.get(agent.id)
        if barrier is None or barrier.is_allowed_checked(scope, mark_type):
            return None
        return _Refusal(
            check=GuardCheck.ENVELOPE,
            reason=f"agent {agent.name!r} is restricted by the envelope: {finding.reason}",
        )

    def _register(self, agent: Agent) -> None:
        if self.envelope is not None and not self.envelope.is_exempt(agent.id):
            self.envelope.register(agent)

    # ------------------------------------------------------------------ escalation

    def _respond(self, agent: Agent, finding: Finding, scope: str) -> None:
        if not finding.new_flag:
            return
        if finding.verdict is EnvelopeVerdict.RESTRICTED:
            self._apply_restriction(agent, finding, finding.scope or scope)
        elif finding.verdict is EnvelopeVerdict.FLAGGED:
            self._flag_concentration(finding)

    def _apply_restriction(self, agent: Agent, finding: Finding, scope: str) -> None:
        """§9.7 escalation: one scope narrowed per flag (P43); after
        ``global_escalation_threshold`` flags, needs are required everywhere."""
        barrier = self.barrier_for(agent.id)
        mark_type = finding.mark_type or MarkType.OBSERVATION
        level = barrier.record_flag(scope)
        barrier.narrow(scope, mark_type)
        if level >= self.global_escalation_threshold:
            barrier.require_need_all()
        invalidated = self._invalidate_recent(agent.id, scope, finding)
        self._ensure_need(
            scope,
            question=f"Agent {agent.name!r} was restricted by the envelope: review and restore?",
            context={
                "kind": "envelope_restriction",
                "agent_id": str(agent.id),
                "anomaly": finding.kind.value if finding.kind else None,
                "mark_type": mark_type.value,
                "window": finding.window,
                "flag_count": level,
                "reason": finding.reason,
            },
            priority=0.9,
            blocking=False,
        )
        self.emitter.event(
            EVENT_RESTRICTION,
            agent_id=agent.id,
            scope=scope,
            mark_type=mark_type,
            flag_count=level,
            global_need=level >= self.global_escalation_threshold,
            invalidated=len(invalidated),
            reason=finding.reason,
        )

    def _invalidate_recent(self, agent_id: UUID, scope: str, finding: Finding) -> list[UUID]:
        window = self.envelope.window_seconds if self.envelope else 0.0
        since = self.space.now() - window
        recent = [
            mark
            for mark in self._read(scope, mark_type=MarkType.OBSERVATION)
            if mark.agent_id == agent_id and (mark.created_at or 0.0) >= since
        ]
        warned = []
        for mark in recent:
            warning_id = self._system_write(
                Warning(
                    scope=mark.scope,
                    invalidates=mark.id,
                    topic=mark.topic,
                    reason=f"written by an agent the envelope restricted: {finding.reason}",
                    severity=Severity.CAUTION,
                )
            )
            if warning_id is not None:
                warned.append(warning_id)
        return warned

    def _flag_concentration(self, finding: Finding) -> None:
        if finding.scope is None or finding.topic is None:
            return
        self._system_write(
            Warning(
                scope=finding.scope,
                topic=finding.topic,
                reason=f"concentration: {finding.reason}",
                severity=Severity.INFO,
            )
        )
