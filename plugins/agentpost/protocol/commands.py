"""SMCL (RFC-WF-0018): the command lifecycle as data, without a database.

The states S0-S11 keep the RFC's names; ``ALLOWED`` is exactly the RFC's transition list; the
conditional rules (confirmation only for mutating commands that are not auto-confirmed, no
``started`` for a mutating command without ``confirmed`` and ``authorized``, ``compensated``
only with proof of a successful compensation) are in ``refusal()``. The store enforces the
same table in Postgres (sql/0008_commands.sql); tests check that both agree.

Decisions (the RFC leaves them open):

- ``failed`` is terminal for the command itself: a duplicate replays the failure and never
  re-executes; trying again is a ``retry`` or ``reprocess`` recovery command.
- Recovery options per state (RCP is not available to us): ``started`` may be canceled;
  ``failed`` may be retried, reprocessed or compensated; ``executed`` may be compensated;
  ``rejected`` and ``canceled`` may be reprocessed; ``compensated`` offers nothing.
- A mutating command may still take the "pre-confirm validation path"
  (canonicalized -> authz_pending); it then can never start unless it was auto-confirmed.
- A declined confirmation has no state of its own (the RFC has no confirmation_required ->
  rejected): the command records ``confirmation_declined`` evidence, keeps its state, and can
  never start (``Refusal.CONFIRMATION_DECLINED``).
- One recovery of a command stands at a time (``stands``): a recovery cannot be submitted
  while another one of its target could still start or runs (a conflict, nothing written), so
  a target is never re-run and undone at once, nor compensated or canceled twice.
- A recovery of any kind cannot start once its target's state no longer offers its kind (a
  compensated target offers nothing), nor while another recovery of its target runs, nor (a
  cancel or compensate) after a sibling of its kind ran (``Refusal.TARGET_NOT_RECOVERABLE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CommandState(StrEnum):
    RECEIVED = "received"
    CANONICALIZED = "canonicalized"
    CONFIRMATION_REQUIRED = "confirmation_required"
    CONFIRMED = "confirmed"
    AUTHZ_PENDING = "authz_pending"
    AUTHORIZED = "authorized"
    REJECTED = "rejected"
    STARTED = "started"
    EXECUTED = "executed"
    FAILED = "failed"
    CANCELED = "canceled"
    COMPENSATED = "compensated"


S = CommandState

#: the RFC's S-numbers
STATE_CODES: Mapping[CommandState, str] = {state: f"S{i}" for i, state in enumerate(S)}

#: the RFC's "Allowed Transitions", exactly
ALLOWED: frozenset[tuple[CommandState, CommandState]] = frozenset({
    (S.RECEIVED, S.CANONICALIZED),
    (S.CANONICALIZED, S.CONFIRMATION_REQUIRED),
    (S.CONFIRMATION_REQUIRED, S.CONFIRMED),
    (S.CANONICALIZED, S.AUTHZ_PENDING),
    (S.CONFIRMED, S.AUTHZ_PENDING),
    (S.AUTHZ_PENDING, S.AUTHORIZED),
    (S.AUTHZ_PENDING, S.REJECTED),
    (S.AUTHORIZED, S.STARTED),
    (S.STARTED, S.EXECUTED),
    (S.STARTED, S.FAILED),
    (S.STARTED, S.CANCELED),
    (S.FAILED, S.COMPENSATED),
    (S.EXECUTED, S.COMPENSATED),
})

TERMINAL: frozenset[CommandState] = frozenset(
    {S.REJECTED, S.EXECUTED, S.FAILED, S.CANCELED, S.COMPENSATED})

#: the lifecycle-state mapping of the RFC: the event each state's entry corresponds to
EVENTS: Mapping[CommandState, str] = {
    S.CANONICALIZED: "command.accepted",
    S.CONFIRMATION_REQUIRED: "command.confirmation.requested",
    S.CONFIRMED: "command.confirmation.satisfied",
    S.AUTHZ_PENDING: "authz.requested",
    S.AUTHORIZED: "authz.decided",
    S.REJECTED: "execution.rejected",
    S.STARTED: "execution.started",
    S.EXECUTED: "execution.executed",
    S.FAILED: "execution.failed",
    S.CANCELED: "execution.canceled",
    S.COMPENSATED: "compensation.compensated",
}


class CommandKind(StrEnum):
    PRIMARY = "primary"
    RETRY = "retry"
    CANCEL = "cancel"
    REPROCESS = "reprocess"
    COMPENSATE = "compensate"


RECOVERY_KINDS: frozenset[CommandKind] = frozenset(CommandKind) - {CommandKind.PRIMARY}

#: next allowed recovery options per state of the target command
RECOVERY_OPTIONS: Mapping[CommandState, tuple[CommandKind, ...]] = {
    S.STARTED: (CommandKind.CANCEL,),
    S.FAILED: (CommandKind.RETRY, CommandKind.REPROCESS, CommandKind.COMPENSATE),
    S.EXECUTED: (CommandKind.COMPENSATE,),
    S.REJECTED: (CommandKind.REPROCESS,),
    S.CANCELED: (CommandKind.REPROCESS,),
}


class EvidenceType(StrEnum):
    STATE_CHANGE = "state_change"
    INVALID_TRANSITION_ATTEMPT = "invalid_transition_attempt"
    DUPLICATE_DELIVERY = "duplicate_delivery"
    RECOVERY_REQUESTED = "recovery_requested"  # in the target's chain, linking the recovery
    CONFIRMATION_DECLINED = "confirmation_declined"  # a person or agent said no


class Decision(StrEnum):
    """A confirmation decision: a need's resolving Action carries ``{"decision": ...}`` in its
    result, a human-highway ``command.confirmation`` envelope in its content."""

    CONFIRM = "confirm"
    DECLINE = "decline"


#: the envelope type of a human confirmation (registered by sql/0008_commands.sql)
CONFIRMATION_TYPE = "command.confirmation"
#: who decides authorization (recorded as decided_by)
AUTHZ_POLICY = "policy:permission-matrix"
#: the reason of a started command whose executor stopped renewing its lease
EXECUTOR_LOST = "executor_lost"


#: every evidence artifact carries these (RFC "Evidence Emission")
LIFECYCLE_FIELDS: tuple[str, ...] = ("command_id", "transition", "timestamp", "evidence_type")

#: fields a transition's evidence carries besides the lifecycle block (security decisions,
#: reasons, the compensation's proof); the gates write them, tests check them
REQUIRED_CONTEXT: Mapping[tuple[CommandState, CommandState], tuple[str, ...]] = {
    (S.CONFIRMATION_REQUIRED, S.CONFIRMED): ("confirmed_by",),
    (S.AUTHZ_PENDING, S.AUTHORIZED): ("decided_by",),
    (S.AUTHZ_PENDING, S.REJECTED): ("decided_by", "reason"),
    (S.STARTED, S.FAILED): ("reason",),
    (S.STARTED, S.CANCELED): ("reason",),
    (S.FAILED, S.COMPENSATED): ("compensation_command_id",),
    (S.EXECUTED, S.COMPENSATED): ("compensation_command_id",),
}


class Refusal(StrEnum):
    """Reason codes of an ``invalid_transition_attempt``."""

    NOT_ALLOWED = "transition_not_allowed"
    CONFIRMATION_NOT_APPLICABLE = "confirmation_not_applicable"
    NOT_CONFIRMED = "not_confirmed"
    NOT_AUTHORIZED = "not_authorized"
    COMPENSATION_NOT_PROVEN = "compensation_not_proven"
    CONFIRMATION_DECLINED = "confirmation_declined"
    TARGET_NOT_RECOVERABLE = "target_not_recoverable"


class Facts(BaseModel):
    """What the conditional rules need to know about a command."""

    model_config = ConfigDict(frozen=True)

    mutating: bool
    auto_confirm: str | None = None
    confirmed: bool = False
    declined: bool = False
    authorized: bool = False
    compensation_proven: bool = False
    target_recoverable: bool = True


def refusal(facts: Facts, source: CommandState, target: CommandState) -> Refusal | None:
    """Why ``source -> target`` is refused for this command, or None if it is allowed."""
    if (source, target) not in ALLOWED:
        return Refusal.NOT_ALLOWED
    if target is S.CONFIRMATION_REQUIRED and (not facts.mutating or facts.auto_confirm):
        return Refusal.CONFIRMATION_NOT_APPLICABLE
    if target is S.STARTED:
        return _start_refusal(facts)
    if target is S.COMPENSATED and not facts.compensation_proven:
        return Refusal.COMPENSATION_NOT_PROVEN
    return None


def _start_refusal(facts: Facts) -> Refusal | None:
    if facts.mutating and not (facts.confirmed or facts.auto_confirm):
        return Refusal.CONFIRMATION_DECLINED if facts.declined else Refusal.NOT_CONFIRMED
    if not facts.authorized:
        return Refusal.NOT_AUTHORIZED
    if not facts.target_recoverable:
        return Refusal.TARGET_NOT_RECOVERABLE
    return None


def missing_context(source: CommandState, target: CommandState,
                    context: Mapping[str, Any]) -> tuple[str, ...]:
    """The required context fields this transition's context lacks."""
    return tuple(k for k in REQUIRED_CONTEXT.get((source, target), ())
                 if context.get(k) in (None, ""))


def recovery_options(state: CommandState) -> tuple[CommandKind, ...]:
    return RECOVERY_OPTIONS.get(state, ())


#: the states in which a recovery command may still start
WAITING: frozenset[CommandState] = frozenset(
    {S.CANONICALIZED, S.CONFIRMATION_REQUIRED, S.CONFIRMED, S.AUTHZ_PENDING, S.AUTHORIZED})


def stands(kind: CommandKind, state: CommandState, declined: bool,
           target_state: CommandState) -> bool:
    """Does a recovery of `kind` in `state` stand in the way of another recovery of its
    target (now in `target_state`)? It does while it runs, and while it waits and could
    still start: not declined, and the target's state still offers its kind."""
    if state is S.STARTED:
        return True
    return state in WAITING and not declined and kind in recovery_options(target_state)


def transition_name(source: CommandState, target: CommandState) -> str:
    return f"{source.value}→{target.value}"


REDACTED = "[redacted]"


class RedactionPolicy(BaseModel):
    """Which context fields never reach the trail in clear (RFC: sensitive fields such as user
    identifiers MUST be redacted). Matching is by key, case-insensitive, at any depth."""

    model_config = ConfigDict(frozen=True)

    fields: frozenset[str] = Field(default=frozenset(
        {"user_id", "phone", "phone_number", "email", "name", "address", "ip"}))

    def redact(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: REDACTED if str(k).lower() in self._lower else self.redact(v)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact(v) for v in value]
        return value

    @property
    def _lower(self) -> frozenset[str]:
        return frozenset(f.lower() for f in self.fields)


class CommandView(BaseModel):
    """The observability view (RFC section X) of one command."""

    model_config = ConfigDict(frozen=True)

    command_id: str
    kind: CommandKind
    workspace: str
    idempotency_key: str
    target_command_id: str | None = None
    mutating: bool
    auto_confirm: str | None = None
    action: str
    executor: str
    args: Any = None
    state: CommandState
    confirmed_by: str | None = None
    declined: bool = False
    need_id: str | None = None
    last_transition_at: datetime
    reason: str | None = None
    outcome: Any = None
    lease_expires_at: datetime | None = None
    duplicate: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def terminal_outcome(self) -> CommandState | None:
        return self.state if self.terminal else None

    @property
    def in_progress(self) -> bool:
        return self.state is S.STARTED

    @property
    def recovery_options(self) -> tuple[CommandKind, ...]:
        return recovery_options(self.state)

    def report(self) -> dict[str, Any]:
        """The RFC section X fields (and what a person needs beside them), JSON-ready."""
        return {**self.model_dump(mode="json", exclude={"args", "outcome"}),
                "terminal_outcome": self.terminal_outcome and self.terminal_outcome.value,
                "in_progress": self.in_progress,
                "recovery_options": [k.value for k in self.recovery_options],
                "outcome_present": self.outcome is not None}
