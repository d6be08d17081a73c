"""SMCL (RFC-WF-0018) as pure data: states, transitions, conditional rules, redaction, view."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from agentpost.protocol.commands import (
    ALLOWED,
    EVENTS,
    RECOVERY_KINDS,
    REDACTED,
    REQUIRED_CONTEXT,
    STATE_CODES,
    TERMINAL,
    CommandKind,
    CommandState,
    CommandView,
    Facts,
    RedactionPolicy,
    Refusal,
    missing_context,
    recovery_options,
    refusal,
    stands,
    transition_name,
)

S = CommandState
READ_ONLY = Facts(mutating=False, authorized=True)
CONFIRMED = Facts(mutating=True, confirmed=True, authorized=True)


def test_states_keep_the_rfc_names_and_numbers() -> None:
    """RFC 'Primary-Command Lifecycle States': S0 received ... S11 compensated."""
    assert [STATE_CODES[s] for s in S] == [f"S{i}" for i in range(12)]
    assert S.RECEIVED.value == "received" and S.COMPENSATED.value == "compensated"
    assert STATE_CODES[S.STARTED] == "S7"


def test_allowed_transitions_are_exactly_the_rfc_list() -> None:
    """RFC 'Allowed Transitions': the thirteen listed transitions and no others."""
    expected = {
        ("received", "canonicalized"), ("canonicalized", "confirmation_required"),
        ("confirmation_required", "confirmed"), ("canonicalized", "authz_pending"),
        ("confirmed", "authz_pending"), ("authz_pending", "authorized"),
        ("authz_pending", "rejected"), ("authorized", "started"), ("started", "executed"),
        ("started", "failed"), ("started", "canceled"), ("failed", "compensated"),
        ("executed", "compensated"),
    }
    assert {(a.value, b.value) for a, b in ALLOWED} == expected


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_pair_outside_the_table_is_refused(source: CommandState,
                                                 target: CommandState) -> None:
    """RFC 'Invalid Transitions': an attempt outside the table MUST be rejected."""
    facts = Facts(mutating=False, authorized=True, compensation_proven=True)
    result = refusal(facts, source, target)
    if (source, target) in ALLOWED:
        assert result is not Refusal.NOT_ALLOWED
    else:
        assert result is Refusal.NOT_ALLOWED


def test_executed_to_started_is_the_rfc_example() -> None:
    """RFC 'Invalid Transitions' (e.g., executed → started) and terminal-state protection."""
    assert refusal(CONFIRMED, S.EXECUTED, S.STARTED) is Refusal.NOT_ALLOWED


def test_terminal_states() -> None:
    """RFC: rejected, executed, failed (for primary execution), canceled, compensated."""
    assert {s.value for s in TERMINAL} == {
        "rejected", "executed", "failed", "canceled", "compensated"}
    for state in TERMINAL:
        assert refusal(CONFIRMED, state, S.STARTED) is Refusal.NOT_ALLOWED


def test_mutating_never_starts_without_confirmed() -> None:
    """RFC: for any mutating command, started MUST NOT occur unless confirmed occurred."""
    facts = Facts(mutating=True, authorized=True)
    assert refusal(facts, S.AUTHORIZED, S.STARTED) is Refusal.NOT_CONFIRMED
    assert refusal(CONFIRMED, S.AUTHORIZED, S.STARTED) is None


def test_policy_auto_confirm_allows_start_and_skips_confirmation() -> None:
    """RFC: an explicit, policy-declared safe auto-confirm (auditable) may replace confirmed."""
    facts = Facts(mutating=True, auto_confirm="low-risk-writes", authorized=True)
    assert refusal(facts, S.AUTHORIZED, S.STARTED) is None
    assert refusal(facts, S.CANONICALIZED, S.CONFIRMATION_REQUIRED) is (
        Refusal.CONFIRMATION_NOT_APPLICABLE)


def test_never_starts_without_authorized() -> None:
    """RFC: started MUST NOT occur unless authorized has occurred."""
    facts = Facts(mutating=True, confirmed=True, authorized=False)
    assert refusal(facts, S.AUTHORIZED, S.STARTED) is Refusal.NOT_AUTHORIZED


def test_read_only_may_skip_confirmation() -> None:
    """RFC notes: read-only commands MAY skip S2/S3; canonicalized → confirmation_required
    is only 'if mutating and not auto-confirmed by policy'."""
    assert refusal(READ_ONLY, S.CANONICALIZED, S.AUTHZ_PENDING) is None
    assert refusal(READ_ONLY, S.AUTHORIZED, S.STARTED) is None
    assert refusal(READ_ONLY, S.CANONICALIZED, S.CONFIRMATION_REQUIRED) is (
        Refusal.CONFIRMATION_NOT_APPLICABLE)


def test_declined_confirmation_never_starts() -> None:
    """RFC: started MUST NOT occur unless confirmed; a decline (no RFC state) blocks it."""
    facts = Facts(mutating=True, declined=True, authorized=True)
    assert refusal(facts, S.AUTHORIZED, S.STARTED) is Refusal.CONFIRMATION_DECLINED


def test_recovery_acting_on_a_moved_target_never_starts() -> None:
    """RFC 'Recovery-Command Rules' + append-only compensation: a target is compensated or
    canceled once."""
    facts = Facts(mutating=False, authorized=True, target_recoverable=False)
    assert refusal(facts, S.AUTHORIZED, S.STARTED) is Refusal.TARGET_NOT_RECOVERABLE


def test_compensated_only_with_proof() -> None:
    """RFC 'Compensation Model': compensated only when the plan succeeded."""
    assert refusal(CONFIRMED, S.FAILED, S.COMPENSATED) is Refusal.COMPENSATION_NOT_PROVEN
    proven = Facts(mutating=True, compensation_proven=True)
    assert refusal(proven, S.EXECUTED, S.COMPENSATED) is None


def test_required_context_names_the_security_decisions() -> None:
    """RFC 'Evidence Emission': security decisions (confirmation, authz) and reasons."""
    assert missing_context(S.CONFIRMATION_REQUIRED, S.CONFIRMED, {}) == ("confirmed_by",)
    assert missing_context(S.AUTHZ_PENDING, S.REJECTED, {"decided_by": "ws"}) == ("reason",)
    assert missing_context(S.STARTED, S.EXECUTED, {}) == ()
    assert set(REQUIRED_CONTEXT) <= ALLOWED


def test_every_entered_state_has_an_event() -> None:
    """RFC 'Lifecycle State Mapping': each stored state corresponds to an event."""
    assert set(EVENTS) == set(S) - {S.RECEIVED}
    assert EVENTS[S.CANONICALIZED] == "command.accepted"
    assert transition_name(S.RECEIVED, S.CANONICALIZED) == "received→canonicalized"


def test_recovery_kinds_and_options() -> None:
    """RFC 'Recovery-Command Rules' / section X: retry, cancel, reprocess, compensate, and the
    next allowed recovery options of a state."""
    assert {k.value for k in RECOVERY_KINDS} == {"retry", "cancel", "reprocess", "compensate"}
    assert recovery_options(S.COMPENSATED) == ()
    assert CommandKind.COMPENSATE in recovery_options(S.EXECUTED)
    assert recovery_options(S.STARTED) == (CommandKind.CANCEL,)


def test_a_recovery_stands_while_it_could_still_start() -> None:
    """One recovery of a command at a time: a recovery stands while it runs, or waits
    undeclined for a start its target's state still allows; ended, declined or stranded
    (its target moved on) it does not."""
    R, C = CommandKind.RETRY, CommandKind.CANCEL
    assert stands(R, S.CONFIRMED, False, S.FAILED)
    assert stands(R, S.CANONICALIZED, False, S.FAILED)
    assert stands(C, S.STARTED, False, S.EXECUTED)  # running, whatever its target did
    assert not stands(R, S.CONFIRMATION_REQUIRED, True, S.FAILED)  # declined
    assert not stands(R, S.AUTHORIZED, False, S.COMPENSATED)  # can never start
    assert not stands(C, S.CONFIRMED, False, S.EXECUTED)
    assert not any(stands(R, state, False, S.FAILED) for state in TERMINAL)


def test_redaction_policy_masks_sensitive_fields_at_any_depth() -> None:
    """RFC 'Security & Privacy': sensitive fields MUST be redacted per the privacy policy."""
    policy = RedactionPolicy()
    out = policy.redact({"User_ID": "u1", "amount": 3, "who": [{"phone": "+1"}]})
    assert out == {"User_ID": REDACTED, "amount": 3, "who": [{"phone": REDACTED}]}
    custom = RedactionPolicy(fields=frozenset({"card"}))
    assert custom.redact({"card": "4111", "email": "a@b"}) == {"card": REDACTED,
                                                               "email": "a@b"}


def test_view_exposes_the_observability_fields() -> None:
    """RFC section X: current state, last transition time, terminal outcome, reason code,
    next allowed recovery options."""
    now = datetime.now(UTC)
    view = CommandView(command_id="c", kind="primary", workspace="w", idempotency_key="k",
                       mutating=True, action="book", executor="w", state="failed",
                       last_transition_at=now, reason="boom", args={"email": "a@b"})
    assert view.terminal_outcome is S.FAILED and view.reason == "boom"
    assert view.last_transition_at == now and not view.in_progress
    assert CommandKind.RETRY in view.recovery_options
    report = view.report()
    assert report["terminal_outcome"] == "failed" and report["recovery_options"] == [
        "retry", "reprocess", "compensate"]
    assert "args" not in report and report["reason"] == "boom"
    with pytest.raises(ValidationError):
        CommandView(**{**view.model_dump(), "state": "bogus"})
