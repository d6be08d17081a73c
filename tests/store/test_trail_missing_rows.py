"""A row deleted outright is found (WACP §3 Integrity: the trail vouches for the rows it
names, so a row that vanishes from under its entries is a failure, not a quiet pass).

Each kind of row a trail entry names (protocol/named_rows.py: envelopes, commands, sagas and
their steps, rules, workspaces, routes, port rights, roles, types) is made through the store,
then deleted as the database's owner could, with its triggers (foreign keys included) off.
`verify_trail()` and `verify_trail(since=...)` each report it by kind and id, whether the
entries since the checkpoint name it or only entries before it do (the checkpoint's row
digests). A rule removed through the store (`remove_rule`, the one row the store deletes
itself) is not reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentpost.protocol import named_rows as nr
from agentpost.protocol.anchor import Checkpoint
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


@pytest.mark.parametrize("make", KINDS, ids=lambda f: f.__name__.strip("_"))
def test_wacp_3_integrity_since_finds_a_row_named_only_before_the_checkpoint(
        world: EnvelopeStore, pg: Any, make: Callable[[EnvelopeStore], Made]) -> None:
    """WACP §3 Integrity, the realistic case: a checkpoint is verified, then a row whose
    entries all lie before it is deleted outright (the entries since name other rows). The
    run since the checkpoint names it by kind and id, as the full run does (the checkpoint's
    row digests differ from the table's; every row of that kind the trail names is looked
    for). It used to pass (only the rows the new entries name were looked for)."""
    kind, row_id, table, columns, values = make(world)
    cp = world.verify_trail().checkpoint
    world.define_role("later")  # entries since the checkpoint, naming another row
    clean = world.verify_trail(since=cp)
    assert clean.ok
    delete_outright(pg, table, columns, values)
    since, full = world.verify_trail(since=cp), world.verify_trail()
    _names(since, kind, row_id)
    assert since.missing_rows == full.missing_rows
    assert world.verify_trail(since=cp, workers=2).missing_rows == full.missing_rows
    assert cp["version"] == 2 and set(cp["rows"]) == set(nr.KINDS)
    for result in (clean, since):
        assert result.since_rows == "all" and result.rows_unaccounted == ()


def _copy_row(pg: Any, table: str, key: str, old: str, new: str) -> None:
    """Insert a copy of a row under another key (its stored columns, triggers off)."""
    columns = [c for (c,) in rows(
        pg, "SELECT column_name FROM information_schema.columns WHERE table_schema ="
            " 'agentpost' AND table_name = %s AND is_generated = 'NEVER' AND column_name"
            " <> %s ORDER BY ordinal_position", (table, key))]
    listed = ", ".join(columns)
    rows(pg, "BEGIN")
    rows(pg, "SET LOCAL session_replication_role = replica")
    rows(pg, f"INSERT INTO agentpost.{table} ({key}, {listed})"
             f" SELECT %s, {listed} FROM agentpost.{table} WHERE {key} = %s", (new, old))
    rows(pg, "COMMIT")


def test_wacp_3_integrity_since_a_row_replaced_or_renamed_is_found(
        world: EnvelopeStore, pg: Any, tmp_path: Path) -> None:
    """WACP §3 Integrity, against a count: an envelope deleted and an unrelated fake one
    inserted in its place, and a command whose id was changed, leave every table's row count
    as it was; the checkpoint's digests (keyed hashes of the rows' ids) still differ, so the
    run since it names both missing rows, and says the tables hold rows the trail does not
    account for."""
    _, eid, *_ = _envelope(world)
    _, other, *_ = _envelope(world)
    _, cid, *_ = _command(world)
    cp = world.verify_trail().checkpoint
    counts = _counts(pg)
    _copy_row(pg, "envelopes", "id", other, "a-fake-envelope")
    delete_outright(pg, "envelopes", ("id",), (eid,))
    rows(pg, "BEGIN")
    rows(pg, "SET LOCAL session_replication_role = replica")
    rows(pg, "UPDATE agentpost.commands SET id = 'a-fake-command' WHERE id = %s", (cid,))
    rows(pg, "COMMIT")
    assert _counts(pg) == counts
    since = world.verify_trail(since=cp)
    assert not since.ok
    assert {(m.kind, m.id) for m in since.missing_rows} == {("envelope", eid),
                                                             ("command", cid)}
    assert since.rows_unaccounted == ("envelope", "command")
    (tmp_path / "cp.json").write_text(json.dumps(cp))
    run = agentpost(world.dsn, "verify", "--since", str(tmp_path / "cp.json"))
    assert run.code == 1 and f"missing row: envelope {eid}" in run.err
    assert "note: the tables of envelope, command hold rows that no entry" in run.err


def _counts(pg: Any) -> list[tuple[Any, ...]]:
    return rows(pg, "SELECT (SELECT count(*) FROM agentpost.envelopes),"
                    " (SELECT count(*) FROM agentpost.commands)")


def test_wacp_3_integrity_since_an_old_checkpoint_still_verifies(
        world: EnvelopeStore, pg: Any, tmp_path: Path) -> None:
    """A version 1 checkpoint (no row digests, as written before them) is still accepted:
    the run since it looks for the rows the new entries name only, and says so
    (`since_rows`); the checkpoint it hands on has no row digests either, since it vouched
    for no row named before. A row named since it is still found."""
    _, eid, *_ = _envelope(world)
    verified = Checkpoint.from_json(world.verify_trail().checkpoint)
    old = Checkpoint.sign(world.settings.trail_key.encode(), verified.taken, verified.heads)
    manifest = old.to_dict()
    assert manifest["version"] == 1 and "rows" not in manifest
    result = world.verify_trail(since=manifest)
    assert result.ok and result.since_rows == "named since"
    assert result.checkpoint["version"] == 1 and "rows" not in result.checkpoint
    (tmp_path / "old.json").write_text(old.to_json())
    run = agentpost(world.dsn, "verify", "--since", str(tmp_path / "old.json"))
    assert run.code == 0 and "a checkpoint without row digests" in run.out
    delete_outright(pg, "envelopes", ("id",), (eid,))
    assert world.verify_trail(since=manifest).ok  # what an old checkpoint cannot show
    _, later, *_ = _envelope(world)
    delete_outright(pg, "envelopes", ("id",), (later,))
    result = world.verify_trail(since=manifest)
    _names(result, "envelope", later)
    assert result.since_rows == "named since"


def test_wacp_3_integrity_since_a_rule_removed_by_the_store_is_not_missing(
        world: EnvelopeStore, pg: Any) -> None:
    """Two rules defined before a checkpoint: one removed through the store since
    (rule_removed: its row's absence is accounted for), one deleted outright. The run since
    names only the second; defined again, removed and defined anew since, rules stay
    accounted for."""
    _rule(world)
    world.add_rule({"id": "other", "when": {"to": "a"},
                    "do": [{"action": "notify", "to": "b", "type": "book"}]})
    cp = world.verify_trail().checkpoint
    world.remove_rule("copy-to-a")
    assert world.verify_trail(since=cp).ok
    delete_outright(pg, "rules", ("id",), ("other",))
    result = world.verify_trail(since=cp)
    _names(result, "rule", "other")
    assert result.rows_unaccounted == ()
    _rule(world)
    world.remove_rule("copy-to-a")
    world.add_rule({"id": "other", "when": {"to": "a"},
                    "do": [{"action": "notify", "to": "b", "type": "book"}]})
    world.add_rule({"id": "other", "when": {"to": "b"},
                    "do": [{"action": "notify", "to": "a", "type": "book"}]}, replace=True)
    again = world.verify_trail(since=cp)
    assert again.ok and again.rows_unaccounted == (), again


def _busy_since(store: EnvelopeStore, routes: RouteStore) -> None:
    """Everything that creates, defines again, moves or removes a row the trail names, much
    of it on rows made before the checkpoint: sends (one a rule copies), rights granted,
    spent and carried, a workspace with its rights, a role, types registered anew and again,
    rules replaced, removed and defined again, commands and a saga step of an old saga,
    routes moving, fanning out and starting."""
    store.send("a", "b", "book", "the rule copies this")
    store.grant_right("b", "a", "b", kind="send_once")
    store.send("a", "b", "book", "carries a right", rights=[("send", "a")])
    store.create_workspace("agent", parent="a", workspace_id="child")
    store.define_role("reviewer")
    store.register_type("memo", ["agent"], ["agent", "reviewer"])  # defined again
    store.register_type("note", ["agent"], ["agent"])
    store.add_rule({"id": "copy-to-a", "when": {"to": "b"},
                    "do": [{"action": "notify", "to": "a", "type": "memo"}]}, replace=True)
    store.add_rule({"id": "brief", "when": {"to": "a"},
                    "do": [{"action": "notify", "to": "b", "type": "book"}]})
    store.remove_rule("brief")
    store.add_rule({"id": "stays", "when": {"to": "a"},
                    "do": [{"action": "notify", "to": "b", "type": "note"}]})
    store.remove_rule("copy-to-a")
    store.add_rule({"id": "copy-to-a", "when": {"type": "memo"},
                    "do": [{"action": "notify", "to": "a", "type": "book"}]})
    with CommandLedger(store) as ledger:
        runner = SagaRunner(ledger, {"cancel": lambda args: None})
        fresh = runner.begin("b", "new-trip")
        fresh.step("train", lambda: {"seat": 3}, action="book", auto_confirm="policy")
        fresh.complete()
        saga = runner.begin("a", "old-trip")
        saga.step("flight", lambda: {"seat": 1}, action="book",
                  compensation=("cancel", {"seat": 1}), auto_confirm="policy")
        saga.step("hotel", lambda: {"room": 2}, action="book",
                  compensation=("cancel", {"room": 2}), auto_confirm="policy")
        saga.complete()
        ledger.run("b", "book-2", lambda: {"room": 2}, action="book", mutating=True,
                   auto_confirm="low-risk")
    for hop in routes.receive("prep", max=10):
        routes.complete("prep", hop.lease, hop.envelope, [{"part": 0}, {"part": 1}])
    routes.start({"id": "r-2", "route": {"actors": ["prep", "post"], "current": 0},
                  "payload": {"text": "later"}})


def test_wacp_3_integrity_since_a_busy_store_accounts_for_every_row(
        world: EnvelopeStore) -> None:
    """Every path that creates or removes a row the trail names is accounted for by the
    entries it writes: after a busy stretch since a checkpoint (rows made before it moved,
    defined again or removed; new ones made), the tables' digests are exactly the
    checkpoint's brought up to date by the entries since (no row unaccounted for, no
    kind looked for whole), serially and in parallel, and the checkpoint handed on holds
    the tables' digests as a fresh checkpoint and a full run see them."""
    for make in KINDS:
        make(world)
    with CommandLedger(world) as ledger:
        saga = SagaRunner(ledger, {"cancel": lambda args: None}).begin("a", "old-trip")
        saga.step("flight", lambda: {"seat": 1}, action="book",
                  compensation=("cancel", {"seat": 1}), auto_confirm="policy")
    routes = RouteStore(world)
    routes.setup(["post"])
    routes.start({"id": "r-old", "route": {"actors": ["prep", "post"], "current": 0},
                  "payload": {"text": "before"}})
    cp = world.verify_trail().checkpoint
    _busy_since(world, routes)
    for workers in (1, 2):
        since = world.verify_trail(since=cp, workers=workers)
        assert since.ok and since.since_rows == "all", since
        assert since.rows_unaccounted == (), since
    assert since.checkpoint["rows"] == world.checkpoint().to_dict()["rows"] \
        == world.verify_trail().checkpoint["rows"]


def test_wacp_3_integrity_the_spark_audit_looks_for_every_kind() -> None:
    """The Spark audit's rows_exist (spark/audit_checks.py) finds the rows the entries name
    from protocol/named_rows.py itself; the tables it reads them from are listed by hand
    (spark/audit.py), so they are held to the same kinds: a kind the store learns to check
    is one the audit reads."""
    from agentpost.spark.audit import PRESENT_KINDS

    assert sorted(PRESENT_KINDS) == sorted(nr.KINDS)
    assert len(PRESENT_KINDS) == len(set(PRESENT_KINDS))
