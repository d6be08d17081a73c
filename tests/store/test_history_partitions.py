"""The commands, the sagas with their steps, and the routes, partitioned by month (sql/0090;
issue 26, "the history tables that grow with it"): a key is one key across every month, the
references among these tables hold without foreign keys, their months are made with the
trail's, and a store upgraded with history keeps it and goes on with it."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2.errors
import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.routes import RouteStore
from agentpost.store.trail_partitions import droppable
from dbtools import connect, rows

TABLES = ("commands", "sagas", "saga_steps", "routes")
ACTORS = ["prep", "post"]
#: command_submit's arguments after the id and the key: a primary, mutating `book`
#: command auto-confirmed as low-risk, not advanced
_SUBMIT = ("SELECT agentpost.command_submit(%s, 'desk', %s, 'primary', NULL, true, 'low-risk',"
           " 'book', 'desk', '{}'::jsonb, '{}'::jsonb, false, 30000)")


def _month_after(day: Any) -> Any:
    return day.replace(year=day.year + day.month // 12, month=day.month % 12 + 1, day=1)


def _setup(store: EnvelopeStore) -> None:
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="desk")


def _book(store: EnvelopeStore, key: str, calls: list[str]) -> str:
    with CommandLedger(store) as ledger:
        view = ledger.run("desk", key, lambda: calls.append(key) or {"booked": key},
                          action="book", mutating=True, auto_confirm="low-risk")
    return view.command_id


def _saga(store: EnvelopeStore, key: str) -> str:
    saga = store.db.scalar("SELECT agentpost.saga_begin(%s, 'desk', %s)",
                           (str(uuid.uuid4()), key))
    _plan(store, saga["saga_id"], 1, "flight")
    return saga["saga_id"]


def _plan(store: EnvelopeStore, saga: str, position: int, name: str) -> None:
    store.db.scalar("SELECT agentpost.saga_plan_step(%s, %s, %s, 'book', NULL, NULL,"
                    " '{}'::jsonb)", (saga, position, name))


def _refused(conn: Any, error: type[Exception], sql: str, params: Any = ()) -> str:
    """`sql` fails with `error`; the constraint it names."""
    with pytest.raises(error) as caught:
        rows(conn, sql, params)
    return caught.value.diag.constraint_name


def _counts(conn: Any) -> tuple[int, ...]:
    return tuple(rows(conn, f"SELECT count(*) FROM agentpost.{t}")[0][0] for t in TABLES)


@pytest.fixture
def desk(store: EnvelopeStore) -> EnvelopeStore:
    _setup(store)
    return store


def test_a_key_held_in_another_month_is_still_held(desk: EnvelopeStore, pg: Any) -> None:
    """A command, a saga and a route moved into next month's partition keep their keys: the
    same idempotency key replays the command (its function is not called again), the same
    saga key finds the saga, and an insert of any key they hold, in any month, is refused
    with the error the key gave before partitioning. A row moves between months (what a
    prune's keep does) without tripping over its own key."""
    calls: list[str] = []
    command = _book(desk, "trip-1", calls)
    saga = _saga(desk, "journey-1")
    routes = RouteStore(desk)
    routes.setup(ACTORS)
    routes.start({"id": "r-1", "route": {"actors": ACTORS, "current": 0}, "payload": {}})
    nxt = _month_after(datetime.now(UTC).date())
    for table, key in (("commands", command), ("sagas", saga), ("routes", "r-1")):
        rows(pg, f"UPDATE agentpost.{table} SET part_day = %s WHERE id = %s", (nxt, key))
    rows(pg, "UPDATE agentpost.saga_steps SET part_day = %s WHERE saga_id = %s", (nxt, saga))
    month = f"_p{nxt:%Y%m}"
    assert rows(pg, f"SELECT count(*) FROM agentpost.commands{month}")[0][0] == 1
    assert rows(pg, f"SELECT count(*) FROM agentpost.saga_steps{month}")[0][0] == 1

    assert _book(desk, "trip-1", calls) == command and calls == ["trip-1"]
    again = desk.db.scalar("SELECT agentpost.saga_begin(%s, 'desk', 'journey-1')",
                           (str(uuid.uuid4()),))
    assert again["saga_id"] == saga and again["existing"] is True
    before = _counts(pg)
    copy = ("INSERT INTO agentpost.commands SELECT {id}, workspace, {key}, kind,"
            " target_command_id, mutating, auto_confirm, action, executor, args, state,"
            " confirmed, confirmed_by, declined, need_id, authorized, outcome, reason,"
            " lease_expires_at, created_at, updated_at FROM agentpost.commands WHERE id = %s")
    assert _refused(pg, psycopg2.errors.UniqueViolation,
                    copy.format(id="'c-new'", key="idempotency_key"),
                    (command,)) == "commands_workspace_idempotency_key_key"
    assert _refused(pg, psycopg2.errors.UniqueViolation,
                    copy.format(id="id", key="'another-key'"), (command,)) == "commands_pkey"
    assert _refused(pg, psycopg2.errors.UniqueViolation,
                    "INSERT INTO agentpost.sagas (id, workspace, saga_key)"
                    " VALUES ('s-new', 'desk', 'journey-1')") == "sagas_workspace_saga_key_key"
    assert _refused(pg, psycopg2.errors.UniqueViolation,
                    "INSERT INTO agentpost.sagas (id, workspace, saga_key)"
                    " VALUES (%s, 'desk', 'journey-2')", (saga,)) == "sagas_pkey"
    assert _refused(pg, psycopg2.errors.UniqueViolation,
                    "INSERT INTO agentpost.routes (id, root_id, actors, current, envelope_id)"
                    " VALUES ('r-1', 'r-1', ARRAY['prep'], 0, 'r-1')") == "routes_pkey"
    assert _counts(pg) == before
    # the moved route goes on where it is
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, {"ok": True})
    assert routes.get("r-1").route.current == 1
    assert rows(pg, f"SELECT current FROM agentpost.routes{month}")[0][0] == 1
    assert desk.verify_trail().ok


def test_two_racing_submits_of_one_key_make_one_command(desk: EnvelopeStore, pg: Any) -> None:
    """The second submit of a key whose first is not yet committed waits for the key's lock
    (the job ON CONFLICT did before partitioning) and then replays the first: one row."""
    answer: list[Any] = []
    racer = threading.Thread(
        target=lambda: answer.append(desk.db.scalar(_SUBMIT, ("c-second", "race"))))
    with desk.db.transaction() as conn:
        with conn.cursor() as cur:
            cur.execute(_SUBMIT, ("c-first", "race"))
        racer.start()
        waited = _waits(pg)
    racer.join(timeout=30)
    assert waited and not racer.is_alive()
    assert answer[0]["status"] == "duplicate" and answer[0]["view"]["command_id"] == "c-first"
    assert rows(pg, "SELECT id FROM agentpost.commands WHERE idempotency_key = 'race'"
                ) == [("c-first",)]


def _waits(conn: Any) -> bool:
    """Whether a session of this database comes to wait for a lock (within 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if rows(conn, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND database ="
                      " (SELECT oid FROM pg_database WHERE datname = current_database()))"
                )[0][0]:
            return True
        time.sleep(0.05)
    return False


def test_a_bulk_insert_is_checked_without_a_lock_per_row(desk: EnvelopeStore, pg: Any) -> None:
    """The trigger looks and takes no lock: more routes than the server's lock table holds,
    inserted by hand in one statement, go in (a lock per row, held to the commit, ran such
    an insert out of shared memory), and a statement that repeats one of their ids is
    refused whole."""
    (table,) = rows(pg, "SELECT current_setting('max_locks_per_transaction')::int"
                        " * (current_setting('max_connections')::int"
                        " + current_setting('max_prepared_transactions')::int)")[0]
    many = 3 * table  # the table has slack: 15,000 ran a 6,400-lock table out here
    bulk = ("INSERT INTO agentpost.routes (id, root_id, actors, current, envelope_id)"
            " SELECT 'bulk-' || g, 'bulk-' || g, ARRAY['prep'], 0, 'bulk-' || g"
            " FROM generate_series(%s, %s) g")
    rows(pg, bulk, (1, many))
    assert rows(pg, "SELECT count(*) FROM agentpost.routes")[0][0] == many
    assert _refused(pg, psycopg2.errors.UniqueViolation, bulk, (many, many + 100)) == "routes_pkey"
    assert rows(pg, "SELECT count(*) FROM agentpost.routes")[0][0] == many


def test_the_references_among_them_hold_without_foreign_keys(desk: EnvelopeStore,
                                                             pg: Any) -> None:
    """A recovery names a command that exists, a step its saga (and is written into the
    saga's partition), a step's compensation a command that exists: each refused otherwise
    with the error its foreign key gave, and nothing written."""
    saga = _saga(desk, "journey-1")
    before = _counts(pg)
    assert _refused(pg, psycopg2.errors.ForeignKeyViolation,
                    "INSERT INTO agentpost.commands (id, workspace, idempotency_key, kind,"
                    " target_command_id, mutating, action, executor, state) VALUES ('c-r',"
                    " 'desk', 'k-r', 'retry', 'nope', true, 'book', 'desk', 'canonicalized')"
                    ) == "commands_target_command_id_fkey"
    step = ("INSERT INTO agentpost.saga_steps (saga_id, position, name, workspace,"
            " command_key, action, part_day) VALUES (%s, 2, 'hotel', 'desk', 'k', 'book', %s)")
    today = datetime.now(UTC).date()
    assert _refused(pg, psycopg2.errors.ForeignKeyViolation, step,
                    ("no-saga", today)) == "saga_steps_saga_id_fkey"
    assert _refused(pg, psycopg2.errors.CheckViolation, step,
                    (saga, _month_after(today))) == "saga_steps_part_day"
    assert _refused(pg, psycopg2.errors.ForeignKeyViolation,
                    "UPDATE agentpost.saga_steps SET compensation_id = 'nope'"
                    " WHERE saga_id = %s", (saga,)) == "saga_steps_compensation_id_fkey"
    assert _counts(pg) == before
    assert rows(pg, "SELECT compensation_id FROM agentpost.saga_steps") == [(None,)]


def test_their_months_are_made_with_the_trails(pg: Any) -> None:
    """A new store has each table's month and the two ahead, its kept and default partitions,
    and no legacy one; a month dropped is made again by the trail's own call."""
    today = datetime.now(UTC).date().replace(day=1)
    ahead = _month_after(_month_after(today))
    for table in TABLES:
        for month in (today, ahead):
            assert rows(pg, "SELECT to_regclass(%s) IS NOT NULL",
                        (f"agentpost.{table}_p{month:%Y%m}",))[0][0]
        names = {r[0] for r in rows(pg, "SELECT c.relname FROM pg_inherits i JOIN pg_class c"
                                        " ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
                                    (f"agentpost.{table}",))}
        assert {f"{table}_kept", f"{table}_default"} <= names
        assert f"{table}_legacy" not in names
    rows(pg, f"DROP TABLE agentpost.commands_p{ahead:%Y%m}")
    made = rows(pg, "SELECT agentpost.trail_ensure_partitions(2)")
    assert made == [(f"commands_p{ahead:%Y%m}",)]


def test_a_store_upgraded_keeps_its_commands_sagas_and_routes(empty_dsn: str,
                                                             tmp_path: Path) -> None:
    """sql/0090 on a store with history: its rows become each table's legacy partition and
    everything goes on with them: a replayed key finds its command, a step planned later
    joins its saga in the legacy partition, a route started before advances, the trail
    verifies."""
    from agentpost.pg.migrations import migrate

    sql = Path(__file__).resolve().parents[2] / "sql"
    before = tmp_path / "before"
    before.mkdir()
    for path in sql.glob("[0-9]*_*.sql"):
        if int(path.name.split("_")[0]) < 90:
            (before / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    migrate(empty_dsn, source=before)
    conn = connect(empty_dsn)
    calls: list[str] = []
    try:
        with EnvelopeStore(empty_dsn) as old:
            _setup(old)
            command = _book(old, "trip-1", calls)
            saga = _saga(old, "journey-1")
            RouteStore(old).setup(ACTORS)
            RouteStore(old).start({"id": "r-1", "route": {"actors": ACTORS, "current": 0},
                                   "payload": {}})
        assert migrate(empty_dsn) == ["0090_history_partitions.sql", "0091_route_prunes.sql",
                                      "0092_pruned_chains.sql"]
        for table, held in zip(TABLES, (1, 1, 1, 1), strict=True):
            assert rows(conn, f"SELECT count(*) FROM agentpost.{table}_legacy")[0][0] == held
        with EnvelopeStore(empty_dsn) as store:
            assert _book(store, "trip-1", calls) == command and calls == ["trip-1"]
            _plan(store, saga, 2, "hotel")
            assert rows(conn, "SELECT name FROM agentpost.saga_steps_legacy ORDER BY position"
                        ) == [("flight",), ("hotel",)]
            routes = RouteStore(store)
            ((lease, env),) = routes.receive("prep")
            routes.complete("prep", lease, env, {"ok": True})
            assert rows(conn, "SELECT current FROM agentpost.routes_legacy")[0][0] == 1
            _book(store, "trip-2", calls)
            assert rows(conn, "SELECT count(*) FROM agentpost.commands_legacy")[0][0] == 1
            assert store.verify_trail().ok
            # the steps' legacy partition goes when the sagas' does, never before: a cut
            # after every command but before the saga's last change lets neither go
            rows(conn, "UPDATE agentpost.sagas SET updated_at = now() + interval '3 days'")
            tomorrow = datetime.now(UTC).date() + timedelta(days=1)
            with store.db.cursor() as cur:
                due = {t: [p.name for p in droppable(cur, tomorrow, t)]
                       for t in ("commands", "sagas", "saga_steps")}
            assert due["commands"][:1] == ["commands_legacy"]
            assert "sagas_legacy" not in due["sagas"]
            assert "saga_steps_legacy" not in due["saga_steps"]
            rows(conn, "UPDATE agentpost.sagas SET updated_at = now()")
            with store.db.cursor() as cur:
                assert droppable(cur, tomorrow, "saga_steps")[0].name == "saga_steps_legacy"
    finally:
        conn.close()
