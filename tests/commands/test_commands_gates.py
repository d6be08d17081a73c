"""SMCL gates real users can use, on a real Postgres: authorization from the workspace's role
and the permission matrix, confirmation through a blocking need (a Postgres mark space) or a
human-highway envelope, each decision recorded; forged confirmations refused; the CLI."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from agentpost.cli.commands import register
from agentpost.marks import (
    Action,
    Agent,
    InvalidMark,
    MarkSpace,
    MarkspaceError,
    MarkType,
    Need,
    PostgresMarkSpace,
    Scope,
)
from agentpost.protocol.commands import AUTHZ_POLICY, CONFIRMATION_TYPE, CommandState
from agentpost.protocol.errors import (
    AgentpostError,
    Conflict,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    NotFound,
)
from agentpost.smcl import CommandLedger
from agentpost.store import EnvelopeStore

S = CommandState
SCOPE = Scope(name="commands")
APPROVER = Agent(name="approver", scopes={"commands": (MarkType.ACTION,)})


@pytest.fixture
def world(store: EnvelopeStore) -> dict[str, str]:
    """A planner (a derived coordinator) may `book` on a worker; a worker may not book on a
    coordinator."""
    store.define_role("planner", inherits="coordinator")
    store.register_type("book", ["coordinator"], ["worker"])
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("planner", parent="boss", workspace_id="plan")
    store.create_workspace("worker", parent="boss", workspace_id="w1")
    return {"boss": "boss", "plan": "plan", "w1": "w1"}


@pytest.fixture
def space(dsn: str) -> Iterator[PostgresMarkSpace]:
    marks = PostgresMarkSpace(dsn=dsn, scopes=[SCOPE], space="cmds")
    try:
        yield marks
    finally:
        marks.close()


@pytest.fixture
def ledger(store: EnvelopeStore, space: PostgresMarkSpace) -> Iterator[CommandLedger]:
    with CommandLedger(store, marks=space) as ledger:
        yield ledger


def _bodies(ledger: CommandLedger, cid: str) -> list[dict[str, Any]]:
    return [e.body for e in ledger.evidence(cid)]


def _last(ledger: CommandLedger, cid: str, transition: str) -> dict[str, Any]:
    return [b for b in _bodies(ledger, cid) if b["lifecycle"]["transition"] == transition][-1]


def _book(ledger: CommandLedger, key: str, fn: Any = lambda: "booked", *,
          ws: str = "plan", executor: str = "w1", **kw: Any) -> Any:
    return ledger.run(ws, key, fn, action="book", mutating=True, executor=executor, **kw)


def _resolve(space: Any, need_id: str, decision: str, *, failed: bool = False) -> UUID:
    action = space.write(APPROVER, Action(scope="commands", action="decide",
                                          result={"decision": decision}, failed=failed))
    return space.resolve(UUID(need_id), action)


# ---------------------------------------------------------------------- authorization


def test_authorized_by_the_matrix_through_role_lineage(ledger: CommandLedger,
                                                       world: dict[str, str]) -> None:
    """RFC 'authorized indicates scope gates are satisfied': the requester's lineage (planner
    -> coordinator) is a sender and the executor's a receiver of the action; the decision is
    recorded with decided_by, the roles and the action."""
    done = _book(ledger, "k", auto_confirm="low-risk")
    assert done.state is S.EXECUTED
    decision = _last(ledger, done.command_id, "authz_pending→authorized")
    assert decision["decided_by"] == AUTHZ_POLICY and decision["decision"] == "allow"
    assert (decision["requester"], decision["requester_role"]) == ("plan", "planner")
    assert (decision["executor"], decision["executor_role"]) == ("w1", "worker")
    assert decision["action"] == "book"


def test_denied_by_the_matrix_is_rejected_with_a_reason(store: EnvelopeStore,
                                                        ledger: CommandLedger,
                                                        world: dict[str, str]) -> None:
    """RFC: authz deny -> rejected (terminal), reason code visible in the view; never runs."""
    ran: list[int] = []
    view = _book(ledger, "k", lambda: ran.append(1), ws="w1", executor="boss",
                 auto_confirm="low-risk")
    assert view.state is S.REJECTED and view.reason == "not_permitted" and ran == []
    assert view.terminal_outcome is S.REJECTED and view.recovery_options[0].value == "reprocess"
    decision = _last(ledger, view.command_id, "authz_pending→rejected")
    assert decision["decided_by"] == AUTHZ_POLICY and decision["reason"] == "not_permitted"
    assert _book(ledger, "k", ws="w1", executor="boss", auto_confirm="low-risk").duplicate
    assert ran == [] and store.verify_trail().ok


@pytest.mark.parametrize("state", ["suspended", "closed", "failed"])
def test_a_requester_that_cannot_act_is_rejected(store: EnvelopeStore, ledger: CommandLedger,
                                                 world: dict[str, str], state: str) -> None:
    """A suspended, closed or failed requesting workspace is denied (reason names it)."""
    store.transition("plan", state)
    view = _book(ledger, "k", auto_confirm="low-risk")
    assert view.state is S.REJECTED and view.reason == f"requester_{state}"


def test_a_closed_executor_is_rejected(store: EnvelopeStore, ledger: CommandLedger,
                                       world: dict[str, str]) -> None:
    store.transition("w1", "closed")
    assert _book(ledger, "k", auto_confirm="p").reason == "executor_closed"


def test_unknown_action_type_is_a_clear_error(store: EnvelopeStore, ledger: CommandLedger,
                                              world: dict[str, str]) -> None:
    """Bad input: an action that is no registered type is refused before anything is
    recorded."""
    entries = len(store.trail())
    with pytest.raises(InvalidInput, match="unknown action type 'teleport'"):
        ledger.run("plan", "k", lambda: 1, action="teleport", mutating=False, executor="w1")
    assert len(store.trail()) == entries and store.verify_trail().ok


def test_authorize_gate_alone(ledger: CommandLedger, world: dict[str, str]) -> None:
    """The step path: authorize() decides without starting; twice is refused (recorded)."""
    cid = ledger.submit("plan", "k", action="book", mutating=False, executor="w1").command_id
    assert ledger.authorize(cid).state is S.AUTHORIZED
    with pytest.raises(InvalidTransition):
        ledger.authorize(cid)
    assert ledger.execute(cid, lambda: 5).outcome == 5


# ---------------------------------------------------------------------- confirmation: need


def test_confirmation_through_a_blocking_need(store: EnvelopeStore, ledger: CommandLedger,
                                              space: PostgresMarkSpace,
                                              world: dict[str, str]) -> None:
    """RFC: canonicalized -> confirmation_required (mutating, not auto-confirmed); a blocking
    need asks for it; confirmed by the agent whose action resolved the need; then it runs."""
    ran: list[int] = []
    view = _book(ledger, "k", lambda: ran.append(1), args={"email": "x@y"})
    assert view.state is S.CONFIRMATION_REQUIRED and ran == [] and view.need_id
    need = space.get(UUID(view.need_id))
    assert isinstance(need, Need) and need.blocking
    assert need.context["command_id"] == view.command_id
    assert need.context["args"] == {"email": "[redacted]"}
    asked = _last(ledger, view.command_id, "canonicalized→confirmation_required")
    assert asked["need_id"] == view.need_id
    with pytest.raises(Conflict, match="not resolved"):
        ledger.confirm_from_need(view.command_id)
    _resolve(space, view.need_id, "confirm")
    confirmed = ledger.confirm_from_need(view.command_id)
    assert confirmed.state is S.CONFIRMED and confirmed.confirmed_by == f"agent:{APPROVER.id}"
    evidence = _last(ledger, view.command_id, "confirmation_required→confirmed")
    assert evidence["confirmed_by"] == f"agent:{APPROVER.id}"
    assert evidence["source"]["need_id"] == view.need_id
    done = ledger.execute(view.command_id, lambda: ran.append(1) or "ok")
    assert done.state is S.EXECUTED and ran == [1]
    assert _last(ledger, view.command_id, "authorized→started")["confirmation"] == (
        f"agent:{APPROVER.id}")
    with pytest.raises(Conflict, match="already confirmed"):
        ledger.confirm_from_need(view.command_id)
    assert store.verify_trail().ok


def test_a_declined_need_never_starts(ledger: CommandLedger, space: PostgresMarkSpace,
                                      world: dict[str, str]) -> None:
    """Decline (no RFC state): confirmation_declined evidence, the reason in the view, the
    command stays confirmation_required and any start is refused (recorded)."""
    view = _book(ledger, "k")
    _resolve(space, view.need_id, "decline")
    declined = ledger.confirm_from_need(view.command_id)
    assert declined.state is S.CONFIRMATION_REQUIRED and declined.declined
    assert declined.reason == "confirmation_declined"
    last = _bodies(ledger, view.command_id)[-1]
    assert last["lifecycle"]["evidence_type"] == "confirmation_declined"
    assert last["declined_by"] == f"agent:{APPROVER.id}"
    with pytest.raises(InvalidTransition, match="confirmation_declined"):
        ledger.execute(view.command_id, lambda: 1)
    with pytest.raises(Conflict, match="declined"):
        ledger.confirmation_envelope("alice", view.command_id)


def test_bad_need_resolutions_change_nothing(store: EnvelopeStore, ledger: CommandLedger,
                                             space: PostgresMarkSpace,
                                             world: dict[str, str]) -> None:
    """A failed resolving action (refused by the space itself), a result without a decision,
    another need's resolution: clear errors, the command unchanged, the trail verifies."""
    view = _book(ledger, "k")
    other = _book(ledger, "k2")
    count = len(_bodies(ledger, view.command_id))
    wrong = _resolve(space, other.need_id, "confirm")
    with pytest.raises(Conflict, match="not a resolution"):
        ledger.confirm_from_need(view.command_id, resolution_id=wrong)
    _resolve(space, view.need_id, "maybe")
    with pytest.raises(InvalidInput, match="decision"):
        ledger.confirm_from_need(view.command_id)
    failed = _book(ledger, "k3")
    with pytest.raises(InvalidMark, match="failed"):  # the space refuses it (the package's rule)
        _resolve(space, failed.need_id, "confirm", failed=True)
    assert ledger.view(failed.command_id).state is S.CONFIRMATION_REQUIRED
    no_need = ledger.submit("plan", "k4", action="book", mutating=True, executor="w1")
    with pytest.raises(Conflict, match="no confirmation need"):
        ledger.confirm_from_need(no_need.command_id)
    assert ledger.view(view.command_id).state is S.CONFIRMATION_REQUIRED
    assert len(_bodies(ledger, view.command_id)) == count and store.verify_trail().ok


def test_an_in_memory_space_confirms_with_the_resolution_id(store: EnvelopeStore,
                                                            world: dict[str, str]) -> None:
    """Any mark space works when the caller passes what space.resolve returned."""
    memory = MarkSpace(scopes=[SCOPE])
    with CommandLedger(store, marks=memory) as ledger:
        view = _book(ledger, "k")
        with pytest.raises(InvalidInput, match="resolution_id"):
            ledger.confirm_from_need(view.command_id)
        resolution = _resolve(memory, view.need_id, "confirm")
        assert ledger.confirm_from_need(view.command_id, resolution).state is S.CONFIRMED


# ---------------------------------------------------------------------- confirmation: human


def test_confirmation_through_a_human_envelope(store: EnvelopeStore, world: dict[str, str]
                                               ) -> None:
    """A person confirms through the human highway; confirmed_by is the person, the evidence
    names the envelope."""
    with CommandLedger(store) as ledger:
        view = _book(ledger, "k")
        assert view.state is S.CONFIRMATION_REQUIRED and view.need_id is None
        sent = store.inject("alice", "plan", CONFIRMATION_TYPE,
                            {"command_id": view.command_id, "decision": "confirm"},
                            format="json")
        confirmed = ledger.confirm_from_envelope(sent.envelope_id)
        assert confirmed.confirmed_by == "human:alice"
        evidence = _last(ledger, view.command_id, "confirmation_required→confirmed")
        assert evidence["source"] == {"envelope_id": sent.envelope_id, "user": "alice"}
        assert ledger.execute(view.command_id, lambda: "ok").state is S.EXECUTED


def test_the_deciding_envelope_is_consumed(store: EnvelopeStore, world: dict[str, str]
                                          ) -> None:
    """Issue 22: a confirmation envelope that decided its command was acted on, so it is
    consumed; before, the demo left dana's answer in the travel desk's inbox, where it looked
    stuck. One the ledger refused (a bad decision) stays, unconsumed, for a person to see."""
    with CommandLedger(store) as ledger:
        view = _book(ledger, "k")
        bad = store.inject("alice", "plan", CONFIRMATION_TYPE,
                           {"command_id": view.command_id, "decision": "maybe"},
                           format="json").envelope_id
        with pytest.raises(InvalidInput):
            ledger.confirm_from_envelope(bad)
        confirmed = ledger.confirmation_envelope("alice", view.command_id)
        assert confirmed.state is S.CONFIRMED
        [answer] = [e for e in store.trail(event="envelope_created")
                    if e.envelope_id != bad and e.body.get("type") == CONFIRMATION_TYPE]
        assert store.get(answer.envelope_id).consumed_at is not None
        assert [e.id for e in store.inbox("plan")] == [bad]
        assert store.verify_trail().ok


def test_a_decision_whose_envelope_cannot_be_consumed_is_not_taken(
        store: EnvelopeStore, pg: Any, world: dict[str, str]) -> None:
    """The decision and the consumption of the envelope that made it commit together: when
    consuming fails (here a real trigger refuses it, as a crash between two commits would
    leave it), the command stays undecided, nothing of the decision is on the trail, and the
    envelope waits in the inbox to be answered again."""
    with CommandLedger(store) as ledger:
        view = _book(ledger, "k")
        sent = store.inject("alice", "plan", CONFIRMATION_TYPE,
                            {"command_id": view.command_id, "decision": "confirm"},
                            format="json").envelope_id
        before = len(store.trail())
        with pg.cursor() as cur:
            cur.execute("""
                CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN RAISE EXCEPTION 'consuming refused by the test'; END $$;
                CREATE TRIGGER refuse_consume BEFORE UPDATE OF consumed_at
                    ON agentpost.envelopes FOR EACH ROW
                    WHEN (NEW.consumed_at IS NOT NULL) EXECUTE FUNCTION pg_temp.refuse();""")
        try:
            with pytest.raises(AgentpostError):
                ledger.confirm_from_envelope(sent)
        finally:
            with pg.cursor() as cur:
                cur.execute("DROP TRIGGER refuse_consume ON agentpost.envelopes")
        assert ledger.view(view.command_id).state is view.state
        assert len(store.trail()) == before
        assert [e.id for e in store.inbox("plan")] == [sent]
        assert ledger.confirm_from_envelope(sent).state is S.CONFIRMED
        assert store.inbox("plan") == []
        assert store.verify_trail().ok


def test_an_envelope_answer_closes_the_open_need(ledger: CommandLedger,
                                                space: PostgresMarkSpace,
                                                world: dict[str, str]) -> None:
    """A person answering by envelope resolves the command's blocking need too (with an
    Action recording the answer), so the question does not stay open."""
    view = _book(ledger, "k")
    assert view.need_id in {str(n.id) for c in space.aggregate_needs() for n in c.needs}
    ledger.confirmation_envelope("alice", view.command_id)
    assert view.need_id not in {str(n.id) for c in space.aggregate_needs() for n in c.needs}
    with pytest.raises(MarkspaceError):
        _resolve(space, view.need_id, "confirm")


def test_a_need_for_a_command_that_moved_on_is_withdrawn(ledger: CommandLedger,
                                                        space: PostgresMarkSpace,
                                                        world: dict[str, str]) -> None:
    """The command moves on between the need's write and the request (forced here by a write
    hook): the request is refused (recorded) and the need resolved as withdrawn, so no
    blocking question is left about a command that no longer waits."""
    cid = ledger.submit("plan", "k", action="book", mutating=True, executor="w1").command_id
    hook = space.add_write_hook(
        lambda _agent, mark: isinstance(mark, Need) and mark.resolved_by is None
        and ledger.transition(cid, S.AUTHZ_PENDING))
    try:
        with pytest.raises(InvalidTransition, match="transition_not_allowed"):
            ledger.request_confirmation(cid)
    finally:
        space.remove_write_hook(hook)
    assert ledger.view(cid).state is S.AUTHZ_PENDING
    assert not [n for c in space.aggregate_needs() for n in c.needs
                if n.context.get("command_id") == cid]


def test_forged_or_invalid_confirmations_change_nothing(store: EnvelopeStore,
                                                        world: dict[str, str]) -> None:
    """Not from a person, wrong workspace, unknown command, bad decision, stale, already
    confirmed, reused: clear typed errors, nothing changed, the trail verifies."""
    store.register_type(CONFIRMATION_TYPE, ["coordinator"], ["planner"],
                        required_fields=("command_id", "decision"))
    store.grant_right("plan", "boss", "plan")
    with CommandLedger(store) as ledger:
        early = store.inject("alice", "plan", CONFIRMATION_TYPE,
                             {"command_id": "later", "decision": "confirm"}, format="json")
        view = _book(ledger, "k")
        cid = view.command_id
        count = len(_bodies(ledger, cid))

        def envelope(content: dict[str, Any], to: str = "plan") -> str:
            return store.inject("alice", to, CONFIRMATION_TYPE, content,
                                format="json").envelope_id

        agent = store.send("boss", "plan", CONFIRMATION_TYPE,
                           {"command_id": cid, "decision": "confirm"}, format="json")
        assert agent.status != "rejected", agent
        cases: list[tuple[type[Exception], str]] = [
            (Forbidden, agent.envelope_id),
            (Forbidden, envelope({"command_id": cid, "decision": "confirm"}, to="w1")),
            (NotFound, envelope({"command_id": "no-such", "decision": "confirm"})),
            (InvalidInput, envelope({"command_id": cid, "decision": "yes please"})),
            (NotFound, "no-such-envelope"),
            (InvalidInput, store.inject("alice", "plan", "book", "hi").envelope_id),
        ]
        for error, eid in cases:
            with pytest.raises(error):
                ledger.confirm_from_envelope(eid)
        store.db.scalar("UPDATE agentpost.envelopes SET content = %s WHERE id = %s RETURNING 1",
                        (json.dumps({"command_id": cid, "decision": "confirm"}),
                         early.envelope_id))
        with pytest.raises(Conflict, match="predates"):
            ledger.confirm_from_envelope(early.envelope_id)
        assert ledger.view(cid).state is S.CONFIRMATION_REQUIRED
        assert len(_bodies(ledger, cid)) == count
        good = envelope({"command_id": cid, "decision": "confirm"})
        ledger.confirm_from_envelope(good)
        for eid in (good, envelope({"command_id": cid, "decision": "confirm"})):
            with pytest.raises(Conflict, match="already confirmed"):
                ledger.confirm_from_envelope(eid)
        # The trail verifies but for the one row edited above to make a stale confirmation,
        # which it names (WACP §3: rows are signed under the trail, sql/0017).
        verification = store.verify_trail()
        assert verification.failures == 1, verification
        assert early.envelope_id in verification.failure, verification
        assert "content_sha256" in verification.failure, verification


def test_a_confirmation_before_it_was_requested_is_refused(store: EnvelopeStore,
                                                           world: dict[str, str]) -> None:
    with CommandLedger(store) as ledger:
        cid = ledger.submit("plan", "k", action="book", mutating=True,
                            executor="w1").command_id
        with pytest.raises(Conflict, match="no confirmation was requested"):
            ledger.confirmation_envelope("alice", cid)
        assert ledger.view(cid).state is S.CANONICALIZED


# ---------------------------------------------------------------------- CLI


def _cli(dsn: str, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="agentpost")
    parser.add_argument("--dsn")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["--dsn", dsn, *argv])
    return args.func(args)


def test_cli_submit_confirm_view_evidence_sweep(dsn: str, store: EnvelopeStore,
                                                world: dict[str, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`agentpost command ...`: a person submits, confirms, views and reads the evidence."""
    assert _cli(dsn, "command", "submit", "plan", "k1", "--action", "book", "--mutating",
                "--executor", "w1", "--args", '{"email": "a@b"}') == 0
    submitted = json.loads(capsys.readouterr().out)
    assert submitted["state"] == "confirmation_required"
    assert submitted["args"] == {"email": "[redacted]"}
    cid = submitted["command_id"]
    assert _cli(dsn, "command", "confirm", cid, "--user", "alice") == 0
    assert json.loads(capsys.readouterr().out)["confirmed_by"] == "human:alice"
    assert _cli(dsn, "command", "view", cid) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["state"] == "confirmed" and view["recovery_options"] == []
    assert {"last_transition_at", "terminal_outcome", "reason"} <= set(view)
    assert _cli(dsn, "command", "evidence", cid) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[3] for line in lines] == [
        "received→canonicalized", "canonicalized→confirmation_required",
        "confirmation_required→confirmed"]
    assert _cli(dsn, "command", "evidence", cid, "--json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert _cli(dsn, "command", "submit", "plan", "k2", "--action", "book", "--mutating",
                "--executor", "w1") == 0
    other = json.loads(capsys.readouterr().out)["command_id"]
    assert _cli(dsn, "command", "decline", other, "--user", "bob") == 0
    assert json.loads(capsys.readouterr().out)["declined"] is True
    assert _cli(dsn, "command", "sweep") == 0
    assert json.loads(capsys.readouterr().out) == []


def test_cli_bad_input_raises_typed_errors(dsn: str, store: EnvelopeStore,
                                           world: dict[str, str]) -> None:
    """The CLI's errors are the typed ones cli.main turns into one line and an exit code."""
    with pytest.raises(InvalidInput, match="--args"):
        _cli(dsn, "command", "submit", "plan", "k", "--action", "book", "--args", "{")
    with pytest.raises(NotFound):
        _cli(dsn, "command", "view", "no-such-command")
    with pytest.raises(InvalidInput, match="unknown action type"):
        _cli(dsn, "command", "submit", "plan", "k", "--action", "nope")
