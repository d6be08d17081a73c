"""A row deleted outright is found (WACP §3 Integrity: the trail vouches for the rows it
names, so a row that vanishes from under its entries is a failure, not a quiet pass).

Each kind of row a trail entry names (protocol/named_rows.py: envelopes, commands, sagas and
their steps, rules, workspaces, routes, port rights, roles, types) is made through the store,
then deleted as the database's owner could, with its triggers (foreign keys included) off.
`verify_trail()` and `verify_trail(since=...)` each report it by kind and id. A rule removed
through the store (`remove_rule`, the one row the store deletes itself) is not reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentpost.protocol.models import MissingRow, TrailVerification
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.routes import RouteStore
from agentpost.store.sagas import SagaRunner
from dbtools import rows
from test_cli import agentpost

#: (kind, id, table, key columns, key values) of a row made through the store
Made = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]


@pytest.fixture
def world(store: EnvelopeStore) -> EnvelopeStore:
    """Two agents that may send each other `book` envelopes."""
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    for ws in ("a", "b"):
        store.create_workspace("agent", workspace_id=ws)
    store.grant_right("b", "a", "b")
    store.grant_right("a", "b", "a")
    return store


def delete_outright(pg: Any, table: str, columns: tuple[str, ...],
                    values: tuple[str, ...]) -> None:
    """DELETE the row as a superuser could: triggers, foreign keys among them, off."""
    where = " AND ".join(f"{c} = %s" for c in columns)
    rows(pg, "BEGIN")
    rows(pg, "SET LOCAL session_replication_role = replica")
    rows(pg, f"DELETE FROM agentpost.{table} WHERE {where}", values)
    rows(pg, "COMMIT")


def _envelope(store: EnvelopeStore) -> Made:
    """A delivered envelope waiting in b's inbox."""
    sent = store.send("a", "b", "book", "a room")
    assert sent.status == "acknowledged"
    return "envelope", sent.envelope_id, "envelopes", ("id",), (sent.envelope_id,)


def _command(store: EnvelopeStore) -> Made:
    with CommandLedger(store) as ledger:
        view = ledger.run("a", "book-1", lambda: {"room": 1}, action="book", mutating=True,
                          auto_confirm="low-risk")
    return "command", view.command_id, "commands", ("id",), (view.command_id,)


def _saga_run(store: EnvelopeStore) -> str:
    with CommandLedger(store) as ledger:
        saga = SagaRunner(ledger, {"cancel": lambda args: None}).begin("a", "trip")
        saga.step("flight", lambda: {"seat": 1}, action="book",
                  compensation=("cancel", {"seat": 1}), auto_confirm="policy")
        return saga.complete().saga_id


def _saga(store: EnvelopeStore) -> Made:
    saga = _saga_run(store)
    return "saga", saga, "sagas", ("id",), (saga,)


def _saga_step(store: EnvelopeStore) -> Made:
    saga = _saga_run(store)
    return "saga step", f"{saga}/flight", "saga_steps", ("saga_id", "name"), (saga, "flight")


def _rule(store: EnvelopeStore) -> Made:
    store.add_rule({"id": "copy-to-a", "when": {"to": "b"},
                    "do": [{"action": "notify", "to": "a", "type": "book"}]})
    return "rule", "copy-to-a", "rules", ("id",), ("copy-to-a",)


def _workspace(store: EnvelopeStore) -> Made:
    store.create_workspace("agent", workspace_id="c")
    return "workspace", "c", "workspaces", ("id",), ("c",)


def _route(store: EnvelopeStore) -> Made:
    routes = RouteStore(store)
    routes.setup(["prep"])
    routes.start({"id": "r-1", "route": {"actors": ["prep"], "current": 0},
                  "payload": {"text": "hi"}})
    return "route", "r-1", "routes", ("id",), ("r-1",)


def _port_right(store: EnvelopeStore) -> Made:
    right = store.grant_right("a", "b", "a", kind="send_once")
    return "port right", right, "port_rights", ("id",), (right,)


def _role(store: EnvelopeStore) -> Made:
    store.define_role("auditor")
    return "role", "auditor", "roles", ("name",), ("auditor",)


def _type(store: EnvelopeStore) -> Made:
    store.register_type("memo", ["agent"], ["agent"])
    return "type", "memo", "envelope_types", ("name",), ("memo",)


KINDS: list[Callable[[EnvelopeStore], Made]] = [
    _envelope, _command, _saga, _saga_step, _rule, _workspace, _route, _port_right, _role,
    _type]


def _names(result: TrailVerification, kind: str, row_id: str) -> None:
    """`result` fails, naming exactly that one row as missing, by kind and id."""
    assert not result.ok and result.checkpoint is None
    assert [(m.kind, m.id) for m in result.missing_rows] == [(kind, row_id)], result
    assert result.failures == 1, result
    assert f"{kind} {row_id} is named by the trail" in result.failure
    assert "its row is missing" in result.failure
    assert result.failure_chain == result.missing_rows[0].chain


@pytest.mark.parametrize("make", KINDS, ids=lambda f: f.__name__.strip("_"))
def test_wacp_3_integrity_a_row_deleted_outright_is_found(
        world: EnvelopeStore, pg: Any, make: Callable[[EnvelopeStore], Made]) -> None:
    """WACP §3 Integrity: a row the trail names, deleted in the table with triggers off,
    fails the full run and the run since a checkpoint taken before the row was made, each
    naming the row's kind and id (and one chain whose entries name it)."""
    cp = world.verify_trail().checkpoint
    kind, row_id, table, columns, values = make(world)
    assert world.verify_trail().ok and world.verify_trail(since=cp).ok
    delete_outright(pg, table, columns, values)
    full, since = world.verify_trail(), world.verify_trail(since=cp)
    _names(full, kind, row_id)
    _names(since, kind, row_id)
    assert since.missing_rows == full.missing_rows
    assert world.verify_trail(workers=2).missing_rows == full.missing_rows


def test_wacp_3_integrity_a_deleted_waiting_envelope_leaves_the_inbox_and_is_found(
        world: EnvelopeStore, pg: Any) -> None:
    """The issue's case: a delivered envelope waiting in the inbox is deleted; it is gone
    from the inbox, and verification names it (it passed with 0 failures before), in the
    API and in `agentpost verify` (exit 1)."""
    _, eid, *_ = _envelope(world)
    assert [e.id for e in world.inbox("b")] == [eid]
    delete_outright(pg, "envelopes", ("id",), (eid,))
    assert world.inbox("b") == []
    result = world.verify_trail()
    _names(result, "envelope", eid)
    assert result.missing_rows == (MissingRow(kind="envelope", id=eid, chain="a"),)
    run = agentpost(world.dsn, "verify")
    assert run.code == 1 and f"missing row: envelope {eid} (named in chain a)" in run.err


def test_smcl_idempotency_a_deleted_command_frees_its_key_and_is_found(
        world: EnvelopeStore, pg: Any) -> None:
    """A command's row deleted outright frees its idempotency key: the same request runs its
    action a second time, under a new command. Verification names the deleted command (the
    new one is sound)."""
    ran: list[int] = []
    with CommandLedger(world) as ledger:
        first = ledger.run("a", "charge-1", lambda: ran.append(1), action="book",
                           mutating=True, auto_confirm="low-risk")
        delete_outright(pg, "commands", ("id",), (first.command_id,))
        again = ledger.run("a", "charge-1", lambda: ran.append(1), action="book",
                           mutating=True, auto_confirm="low-risk")
    assert ran == [1, 1] and again.command_id != first.command_id
    _names(world.verify_trail(), "command", first.command_id)


def test_wacp_3_integrity_a_rule_removed_by_the_store_is_not_missing(
        world: EnvelopeStore, pg: Any) -> None:
    """remove_rule deletes the rule's row and says so in the system chain (rule_removed):
    its `rule:<id>` chain and definition entries then name no missing row, whole or since a
    checkpoint taken while it existed. Defined again and deleted outright, it is missing."""
    _rule(world)
    world.send("a", "b", "book", "fires the rule")
    assert any(e.from_ == "rule:copy-to-a" for e in world.inbox("a"))
    cp = world.verify_trail().checkpoint
    world.remove_rule("copy-to-a")
    world.send("a", "b", "book", "nothing fires now")
    assert world.verify_trail().ok and world.verify_trail(since=cp).ok
    _rule(world)
    cp = world.verify_trail().checkpoint
    world.send("a", "b", "book", "fires it again")
    delete_outright(pg, "rules", ("id",), ("copy-to-a",))
    _names(world.verify_trail(), "rule", "copy-to-a")
    _names(world.verify_trail(since=cp), "rule", "copy-to-a")


def test_wacp_3_integrity_since_checks_rows_the_new_entries_name(
        world: EnvelopeStore, pg: Any) -> None:
    """What `since` does not check, shown: an envelope whose entries all lie before the
    checkpoint, deleted after it, fails the full run only (as an edited row does)."""
    _, eid, *_ = _envelope(world)
    cp = world.verify_trail().checkpoint
    delete_outright(pg, "envelopes", ("id",), (eid,))
    assert world.verify_trail(since=cp).ok
    _names(world.verify_trail(), "envelope", eid)
