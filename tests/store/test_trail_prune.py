"""Archive and prune (issue 26): old months of the trail go to Parquet with the verified
checkpoint of their cut, then leave Postgres by dropping their partitions; the trail goes on
verifying since the cut, the entries later checks read stay, and nothing is dropped unless the
archive holds it as stored.

Time is the one thing a test cannot wait for: `age` moves the entries written so far into a
month long past, as if they had been written then. It changes `part_day` only, the partition
key, which no signature covers and no check reads (sql/0086).
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentpost.protocol.errors import InvalidInput, StoreError
from agentpost.store import EnvelopeStore
from agentpost.store.trail_archive import archive, prune
from agentpost.store.trail_export import MANIFEST
from dbtools import rows
from test_cli import agentpost, assert_one_line_error
from test_trail_anchor import build


def old_month() -> date:
    """The first day of the month about four months ago."""
    back = datetime.now(UTC).date() - timedelta(days=120)
    return back.replace(day=1)


def month_after(day: date) -> date:
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def partition(day: date, table: str = "trail") -> str:
    return f"{table}_p{day:%Y%m}"


#: the tables whose months leave with the trail's, in the order a prune names them (sagas
#: before their steps: a step's month is its saga's)
ROWS = ("envelopes", "routes", "sagas", "saga_steps", "commands")


def months(day: date, tables: tuple[str, ...] = ROWS) -> list[str]:
    """The partitions of `tables` for the month of `day`."""
    return [partition(day, t) for t in tables]


def age(conn: Any, month: date) -> int:
    """Every entry so far, and every signal, envelope and route, moved into `month`'s partition
    (made for it); how many entries."""
    rows(conn, "SELECT agentpost.trail_ensure_partitions(2, %s)", (month,))
    for table in ("trail", "signals", *ROWS):
        rows(conn, f"UPDATE agentpost.{table} SET part_day = %s WHERE part_day >= '1900-01-02'",
             (month + timedelta(days=14),))
    return count(conn, partition(month))


def count(conn: Any, table: str = "trail") -> int:
    return rows(conn, f"SELECT count(*) FROM agentpost.{table}")[0][0]


def exists(conn: Any, table: str) -> bool:
    return rows(conn, "SELECT to_regclass(%s) IS NOT NULL", (f"agentpost.{table}",))[0][0]


@pytest.fixture
def aged(store: EnvelopeStore, pg: Any) -> tuple[EnvelopeStore, date, int]:
    """build()'s traffic, plus four envelopes consumed by w1 and one left waiting in w2's
    inbox, all of it four months old: (store, the cut after that month, entries aged)."""
    build(store)
    for n in range(3):
        store.send("coord", "w1", "directive", f"step {n}")
    leased = store.lease("w1", max=5)
    for lease in leased:
        store.ack(lease.token)
    month = old_month()
    return store, month_after(month), age(pg, month)


def test_archive_then_prune_and_the_trail_still_verifies(aged: tuple, pg: Any,
                                                        tmp_path: Path) -> None:
    store, cut, entries = aged
    month, envelope_month = partition(old_month()), partition(old_month(), "envelopes")
    signals = count(pg, partition(old_month(), "signals"))
    envelopes = count(pg, envelope_month)
    assert store.verify_trail().ok
    done = archive(store, str(tmp_path), cut)
    assert done.partitions == [month, *months(old_month())] and done.entries == entries
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["version"] == 2 and manifest["cuts"][0]["cut"] == cut.isoformat()
    archived = pq.read_table(str(tmp_path / done.batch)).num_rows
    assert archived == entries
    # the envelopes' rows as stored, content included
    copied = pq.read_table(str(tmp_path / manifest["cuts"][0]["envelopes"]))
    assert copied.num_rows == done.envelopes == envelopes > 0
    assert {json.loads(r)["content"] for r in copied.column("row").to_pylist()} >= {"start"}
    # after the cut: the waiting envelope (created in the old month) is leased and acked
    waiting = store.lease("w2", max=5)
    assert waiting
    for lease in waiting:
        store.ack(lease.token)
    store.send("coord", "w1", "directive", "after the cut")
    total = count(pg)
    chains = rows(pg, "SELECT count(DISTINCT chain) FROM agentpost.trail")[0][0]

    pruned = prune(store, str(tmp_path), cut)
    assert pruned.partitions == [month, *months(old_month())] and not exists(pg, month)
    assert pruned.dropped + pruned.kept == entries and 0 < pruned.kept < entries
    # the envelopes' month went too; the rows still named (the one consumed after the cut,
    # those a chain's kept head names) stay, with their whole history
    assert not exists(pg, envelope_month)
    assert pruned.envelopes + count(pg, "envelopes_kept") == envelopes
    assert 0 < pruned.envelopes < envelopes
    named = rows(pg, "SELECT count(*) FROM agentpost.envelopes_kept e WHERE NOT EXISTS"
                     " (SELECT 1 FROM agentpost.trail_kept t WHERE t.envelope_id = e.id"
                     " AND t.event IN ('envelope_created', 'envelope_rejected'))")[0][0]
    assert named == 0
    assert count(pg) == total - pruned.dropped + 1  # and the system chain's rows_pruned
    assert count(pg, "trail_kept") == pruned.kept
    # every chain's head at the cut stays, and the consumed-after-the-cut envelope's entries
    heads = rows(pg, "SELECT count(DISTINCT chain) FROM agentpost.trail_kept")[0][0]
    assert heads == chains
    for lease in waiting:
        created = rows(pg, "SELECT count(*) FROM agentpost.trail_kept WHERE envelope_id = %s"
                           " AND event = 'envelope_created'", (lease.envelope.id,))[0][0]
        assert created == 1
    result = store.verify_trail()
    assert result.ok, result.failure
    assert result.since_taken_at is not None  # since the prune's checkpoint
    # its row digests, less the rows the prune says it dropped, are the tables' to the row
    assert result.since_rows == "all" and result.rows_unaccounted == ()
    assert store.verify_trail(since=tmp_path / done.checkpoint).ok
    recorded = rows(pg, "SELECT cut, partitions, dropped, kept, envelopes"
                        " FROM agentpost.trail_prunes")
    assert recorded == [(cut, [month], pruned.dropped, pruned.kept, pruned.envelopes)]
    # the system chain says how many rows left, signed: a run since an older checkpoint
    # takes them off that checkpoint's row digests
    (body,) = rows(pg, "SELECT record::jsonb -> 'body' FROM agentpost.trail"
                       " WHERE chain = 'system' AND event = 'rows_pruned'")[0]
    assert body["kind"] == "envelope" and body["count"] == pruned.envelopes
    # the month's signals went with it; the inboxes' signals since are still read
    assert pruned.signals == signals > 0 and not exists(pg, partition(old_month(), "signals"))
    assert [s.signal for s in store.signals("coord")][-1:] == ["acknowledged"]
    # and the store goes on: new entries link to the kept heads
    store.send("w1", "coord", "query", "still there?")
    assert store.verify_trail().ok


def test_a_prune_beside_agents_at_work_fails_none_of_their_steps(aged: tuple, dsn: str,
                                                                 tmp_path: Path) -> None:
    """Two agents send, lease and ack the whole time a prune runs: none of their steps fails
    (the drop waits for them and they for it, no deadlock), and the trail verifies after."""
    store, cut, _ = aged
    archive(store, str(tmp_path), cut)
    stop, started = threading.Event(), threading.Barrier(3)
    done: list[str] = []
    errors: list[BaseException] = []

    def agent(inbox: str) -> None:
        with EnvelopeStore(dsn) as own:
            started.wait()
            while not stop.is_set():
                try:
                    done.append(own.send("coord", inbox, "directive", "beside").envelope_id)
                    for lease in own.lease(inbox, max=10):
                        own.ack(lease.token)
                except BaseException as exc:  # any step failing fails the test
                    errors.append(exc)
                    return

    agents = [threading.Thread(target=agent, args=(w,)) for w in ("w1", "w2")]
    for t in agents:
        t.start()
    started.wait()
    time.sleep(0.3)
    pruned = prune(store, str(tmp_path), cut)
    time.sleep(0.3)
    stop.set()
    for t in agents:
        t.join(timeout=60)
    assert not errors, errors
    assert pruned.dropped > 0 and len(done) > 10
    assert store.verify_trail().ok


@pytest.fixture
def backlog(store: EnvelopeStore, pg: Any) -> tuple[EnvelopeStore, date, int]:
    """build()'s traffic plus twelve envelopes waiting in w2's inbox, all four months old:
    (store, the cut, the envelope rows of the month)."""
    build(store)
    for n in range(12):
        store.send("coord", "w2", "directive", f"backlog {n}")
    month = old_month()
    age(pg, month)
    return store, month_after(month), count(pg, partition(month, "envelopes"))


def test_a_backlog_kept_moves_a_batch_at_a_time_beside_agents_at_work(
        backlog: tuple, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows kept move to envelopes_kept a few at a time, each batch under its own short
    lock, while an agent leases and acks that very backlog: none of its steps fails, every
    row of the month is dropped or kept, and the rows dropped are the ones the signed
    `rows_pruned` entry accounts for (a run since the cut finds nothing unaccounted)."""
    from agentpost.store import month_rows

    store, cut, envelopes = backlog
    monkeypatch.setattr(month_rows, "MOVE_BATCH", 3)
    archive(store, str(tmp_path), cut)
    stop, started = threading.Event(), threading.Barrier(2)
    errors: list[BaseException] = []
    acked: list[str] = []

    def agent() -> None:
        with EnvelopeStore(dsn) as own:
            started.wait()
            while not stop.is_set():
                try:
                    for lease in own.lease("w2", max=1):
                        own.ack(lease.token)
                        acked.append(lease.envelope.id)
                    own.send("coord", "w2", "directive", "more")
                except BaseException as exc:  # any step failing fails the test
                    errors.append(exc)
                    return

    worker = threading.Thread(target=agent)
    worker.start()
    started.wait()
    pruned = prune(store, str(tmp_path), cut)
    stop.set()
    worker.join(timeout=60)
    assert not errors, errors
    assert pruned.envelopes_kept >= 12 and pruned.envelopes + pruned.envelopes_kept == envelopes
    # four or more batches, each its own hold: all the holds together outlast the longest
    assert pruned.envelopes_locked_total_s > pruned.envelopes_locked_s > 0
    assert pruned.trail_locked_s > 0  # the trail's months went under its lock, timed
    assert acked  # the agent worked through the backlog while it moved
    result = store.verify_trail()
    assert result.ok, result.failure
    assert result.rows_unaccounted == ()


def test_a_prune_cut_short_after_moving_rows_kept_goes_on_when_run_again(
        backlog: tuple, pg: Any, dsn: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The envelopes' last step cannot have its lock (the system chain is held): the rows
    already moved stay kept, the month stays, the store verifies; run again, the prune drops
    the rest and accounts for exactly the rows that left."""
    import psycopg2

    from agentpost.store import month_rows, trail_partitions

    store, cut, envelopes = backlog
    monkeypatch.setattr(month_rows, "MOVE_BATCH", 4)
    monkeypatch.setattr(trail_partitions, "LOCK_TIMEOUT_MS", 300)
    archive(store, str(tmp_path), cut)
    holder = psycopg2.connect(dsn)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT agentpost._lock_chains(ARRAY['system'])")
        with pytest.raises(StoreError, match="envelopes stayed busy"):
            prune(store, str(tmp_path), cut)
    finally:
        holder.close()
    month = partition(old_month(), "envelopes")
    moved = count(pg, "envelopes_kept")
    assert exists(pg, month) and moved >= 12
    assert count(pg, month) + moved == envelopes
    assert store.verify_trail().ok
    again = prune(store, str(tmp_path), cut)
    assert again.partitions == months(old_month())
    assert not exists(pg, month)
    assert moved + again.envelopes_kept + again.envelopes == envelopes
    result = store.verify_trail()
    assert result.ok and result.rows_unaccounted == ()


def test_a_row_entering_the_month_while_rows_kept_move_refuses_the_drop(
        backlog: tuple, pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The envelope months are counted beside the agents, not under the drop's lock: a row
    put into the month by hand once the rows kept have moved makes that count differ from
    what the months held less what moved, and the prune stops before the lock, dropping
    nothing. Without the hand row, the same prune drops the month."""
    from agentpost.store import month_rows

    store, cut, envelopes = backlog
    archive(store, str(tmp_path), cut)
    month = partition(old_month(), "envelopes")
    real_move = month_rows._move_kept

    def move_then_forge(cur: Any, table: Any, params: dict) -> Any:
        moved = real_move(cur, table, params)
        columns = [c for (c,) in rows(
            pg, "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid ="
                " 'agentpost.envelopes'::regclass AND attnum > 0 AND NOT attisdropped"
                " AND attgenerated = '' ORDER BY attnum")]
        forged = {"id": "'forged-row'", "part_day": f"'{old_month():%Y-%m-%d}'::date"}
        values = [forged.get(c, c) for c in columns]
        rows(pg, f"INSERT INTO agentpost.envelopes ({', '.join(columns)})"
                 f" SELECT {', '.join(values)} FROM agentpost.envelopes LIMIT 1")
        return moved

    monkeypatch.setattr(month_rows, "_move_kept", move_then_forge)
    with pytest.raises(InvalidInput, match=r"envelopes months changed under the prune "
                                           r"\(\d+ rows left, \d+ expected\): nothing dropped"):
        prune(store, str(tmp_path), cut)
    moved = count(pg, "envelopes_kept")
    assert exists(pg, month) and count(pg, month) + moved == envelopes + 1
    assert rows(pg, "SELECT count(*) FROM agentpost.trail WHERE event = 'rows_pruned'"
                    " AND record::jsonb -> 'body' ->> 'kind' = 'envelope'") == [(0,)]
    rows(pg, "DELETE FROM agentpost.envelopes WHERE id = 'forged-row'")
    monkeypatch.setattr(month_rows, "_move_kept", real_move)
    again = prune(store, str(tmp_path), cut)
    assert again.partitions == months(old_month())
    assert not exists(pg, month)
    assert moved + again.envelopes_kept + again.envelopes == envelopes
    result = store.verify_trail()
    assert result.ok and result.rows_unaccounted == ()


def test_after_a_prune_tampering_is_still_caught(aged: tuple, pg: Any,
                                                 tmp_path: Path) -> None:
    store, cut, _ = aged
    archive(store, str(tmp_path), cut)
    prune(store, str(tmp_path), cut)
    (kept_id,) = rows(pg, "SELECT id FROM agentpost.trail_kept WHERE chain = 'w3'")[0]
    rows(pg, "UPDATE agentpost.trail SET record = replace(record, '\"body\"', '\"body\" ')"
             " WHERE id = %s", (kept_id,))
    result = store.verify_trail()
    assert not result.ok and result.failure_chain == "w3"


def test_a_deleted_open_envelope_is_caught_after_the_prune(aged: tuple, pg: Any,
                                                           tmp_path: Path) -> None:
    store, cut, _ = aged
    archive(store, str(tmp_path), cut)
    prune(store, str(tmp_path), cut)
    (waiting,) = rows(pg, "SELECT id FROM agentpost.envelopes WHERE recipient = 'w2'")[0]
    rows(pg, "DELETE FROM agentpost.signals WHERE ref = %s", (waiting,))
    rows(pg, "DELETE FROM agentpost.envelopes WHERE id = %s", (waiting,))
    result = store.verify_trail()
    assert not result.ok
    assert [(r.kind, r.id) for r in result.missing_rows] == [("envelope", waiting)]


def test_a_kept_row_deleted_after_the_prune_is_caught(aged: tuple, pg: Any,
                                                     tmp_path: Path) -> None:
    """WACP §3 Integrity across a prune: a row kept because a chain's kept head names it,
    which no entry since the cut's checkpoint names, deleted outright: the row digests (the
    checkpoint's, less the prune's `rows_pruned`) differ from the table's, and the run looks
    for every row the trail still names."""
    store, cut, _ = aged
    archive(store, str(tmp_path), cut)
    prune(store, str(tmp_path), cut)
    assert store.verify_trail().ok
    (kept,) = rows(pg, "SELECT e.id FROM agentpost.envelopes_kept e WHERE e.consumed_at IS NOT"
                       " NULL AND NOT EXISTS (SELECT 1 FROM agentpost.trail t WHERE"
                       " t.envelope_id = e.id AND t.part_day > '1900-01-01') LIMIT 1")[0]
    rows(pg, "DELETE FROM agentpost.envelopes WHERE id = %s", (kept,))
    result = store.verify_trail()
    assert not result.ok
    assert [(r.kind, r.id) for r in result.missing_rows] == [("envelope", kept)]


def test_a_prune_cut_short_before_the_envelopes_goes_on_when_run_again(
        aged: tuple, pg: Any, tmp_path: Path) -> None:
    """A prune that stopped after dropping the trail's month (a lost connection, say) leaves
    a store that verifies; run again, it drops the envelopes' month it had not reached."""
    from agentpost.store import trail_export, trail_partitions
    from agentpost.store.trail_archive import _plan, _prune_trail

    store, cut, _ = aged
    done = archive(store, str(tmp_path), cut)
    with store.db.cursor() as cur:
        left = {t: trail_partitions.droppable(cur, cut, t) for t in ("trail", *ROWS)}
    horizon = _plan(store, cut, left)
    _prune_trail(store, trail_export.load(str(tmp_path)), left["trail"], cut,
                 (tmp_path / done.checkpoint).read_text(), horizon)
    envelopes = partition(old_month(), "envelopes")
    assert not exists(pg, partition(old_month())) and exists(pg, envelopes)
    assert store.verify_trail().ok
    again = prune(store, str(tmp_path), cut)
    assert again.partitions == months(old_month())
    assert again.dropped == 0 and again.envelopes > 0
    assert not exists(pg, envelopes)
    result = store.verify_trail()
    assert result.ok and result.rows_unaccounted == ()


def _rewrite(path: Path, change: Any) -> None:
    table = pq.read_table(str(path))
    pq.write_table(change(table), str(path))


def _edit_record(table: pa.Table) -> pa.Table:
    records = table.column("record").to_pylist()
    records[0] = records[0].replace('"body"', '"body" ')
    return table.set_column(table.schema.get_field_index("record"), "record",
                            pa.array(records, type=pa.string()))


def _drop_row(table: pa.Table) -> pa.Table:
    return table.slice(1)


def _edit_mac(table: pa.Table) -> pa.Table:
    macs = table.column("mac").to_pylist()
    macs[0] = bytes(32)
    return table.set_column(table.schema.get_field_index("mac"), "mac",
                            pa.array(macs, type=pa.binary()))


def _edit_envelope(table: pa.Table) -> pa.Table:
    """An archived envelope that leaves (`step 0`, consumed, no chain's head) with its
    content changed."""
    stored = table.column("row").to_pylist()
    at = next(i for i, r in enumerate(stored) if json.loads(r)["content"] == "step 0")
    stored[at] = stored[at].replace('"step 0"', '"step 9"')
    return table.set_column(table.schema.get_field_index("row"), "row",
                            pa.array(stored, type=pa.string()))


def _drop_envelope(table: pa.Table) -> pa.Table:
    keep = [json.loads(r)["content"] != "step 0" for r in table.column("row").to_pylist()]
    return table.filter(pa.array(keep))


@pytest.mark.parametrize("damage", ["no cut", "checkpoint", "record", "row", "mac", "file",
                                    "envelope edited", "envelope missing"])
def test_prune_refuses_unless_the_archive_and_its_checkpoint_verify(
        aged: tuple, pg: Any, tmp_path: Path, damage: str) -> None:
    """Nothing is dropped, of the trail or of the envelopes, unless the cut's checkpoint
    verifies and every entry and every envelope row that would leave is archived as stored."""
    store, cut, _ = aged
    done = archive(store, str(tmp_path), cut)
    files = sorted((tmp_path / done.batch).rglob("*.parquet"))
    envelope_files = sorted((tmp_path / f"envelopes-{cut}").rglob("*.parquet"))
    if damage == "no cut":
        manifest = json.loads((tmp_path / MANIFEST).read_text())
        manifest["cuts"] = []
        (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "checkpoint":
        path = tmp_path / done.checkpoint
        text = path.read_text()
        at = text.index('"hash": "') + len('"hash": "')
        path.write_text(text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:])
    elif damage == "file":
        files[0].write_bytes(b"not parquet")
    elif damage.startswith("envelope"):
        _rewrite(envelope_files[0], _edit_envelope if damage.endswith("edited")
                 else _drop_envelope)
    else:
        _rewrite(files[0], {"record": _edit_record, "row": _drop_row, "mac": _edit_mac}[damage])
    total = count(pg)
    with pytest.raises(InvalidInput) as refused:
        prune(store, str(tmp_path), cut)
    assert "\n" not in str(refused.value)
    assert count(pg) == total and exists(pg, partition(old_month()))
    assert exists(pg, partition(old_month(), "envelopes"))
    assert count(pg, "trail_kept") == 0 and count(pg, "trail_prunes") == 0
    assert count(pg, "envelopes_kept") == 0


def test_a_batch_a_crashed_archive_left_is_written_afresh(aged: tuple, pg: Any,
                                                         tmp_path: Path) -> None:
    """A batch directory no manifest lists (an archive that crashed before listing it) is
    replaced whole, so nothing it held is read as archived."""
    store, cut, entries = aged
    stale = tmp_path / "batch-000001" / "day=2000-01-01"
    stale.mkdir(parents=True)
    (stale / "part-00000.parquet").write_bytes(b"left by a crash")
    done = archive(store, str(tmp_path), cut)
    assert done.batch == "batch-000001" and not stale.exists()
    assert pq.read_table(str(tmp_path / done.batch)).num_rows == entries
    assert prune(store, str(tmp_path), cut).dropped > 0


def test_archive_refuses_a_cut_too_recent_or_with_nothing_before_it(store: EnvelopeStore,
                                                                    tmp_path: Path) -> None:
    build(store)
    with pytest.raises(InvalidInput, match="in the past"):
        archive(store, str(tmp_path), datetime.now(UTC).date() + timedelta(days=1))
    with pytest.raises(InvalidInput, match="nothing to archive"):
        archive(store, str(tmp_path), old_month())
    assert list(tmp_path.iterdir()) == []


def test_archive_refuses_a_trail_that_does_not_verify(aged: tuple, pg: Any,
                                                      tmp_path: Path) -> None:
    store, cut, _ = aged
    rows(pg, "UPDATE agentpost.trail SET record = replace(record, '\"body\"', '\"body\" ')"
             " WHERE id = (SELECT min(id) FROM agentpost.trail)")
    with pytest.raises(StoreError, match="does not verify"):
        archive(store, str(tmp_path), cut)
    assert list(tmp_path.iterdir()) == []


def test_a_new_store_has_no_legacy_partitions(pg: Any) -> None:
    """sql/0089: the legacy partitions of a store created partitioned hold nothing and are
    gone (each would cost every look-up that cannot prune by month); the months, the kept
    and the default partitions stay."""
    today = datetime.now(UTC).date()
    for table in ("trail", "signals", "envelopes"):
        assert not exists(pg, f"{table}_legacy")
        assert exists(pg, f"{table}_default") and exists(pg, partition(today, table))
    assert exists(pg, "trail_kept") and exists(pg, "envelopes_kept")


def test_a_month_without_its_partition_moves_out_of_the_default_one(store: EnvelopeStore,
                                                                    pg: Any) -> None:
    """Entries of a month no partition was made for land in trail_default; making the month
    moves them into it, and the trail still verifies."""
    build(store)
    far = (datetime.now(UTC).date() + timedelta(days=5 * 366)).replace(day=1)
    rows(pg, "UPDATE agentpost.trail SET part_day = %s WHERE chain = 'w3'", (far,))
    moved = count(pg, "trail_default")
    assert moved > 0
    months = (far.year - datetime.now(UTC).year) * 12 + far.month - datetime.now(UTC).month
    made = rows(pg, "SELECT agentpost.trail_ensure_partitions(%s)", (months,))
    assert (partition(far),) in made
    assert count(pg, "trail_default") == 0 and count(pg, partition(far)) == moved
    assert store.verify_trail().ok


def test_maintenance_makes_the_months_ahead(store: EnvelopeStore, pg: Any) -> None:
    from agentpost.store.maintenance import maintain

    ahead = month_after(month_after(datetime.now(UTC).date().replace(day=1)))
    for table in ("trail", "signals"):
        rows(pg, f"DROP TABLE agentpost.{partition(ahead, table)}")
    assert maintain(store, vacuum=False)["trail_partitions_made"] == [
        partition(ahead), partition(ahead, "signals")]
    assert exists(pg, partition(ahead))
    assert maintain(store, vacuum=False)["trail_partitions_made"] == []


def test_cli_trail_archive_and_prune(aged: tuple, dsn: str, tmp_path: Path) -> None:
    _, cut, entries = aged
    archived = agentpost(dsn, "trail", "archive", "--before", cut.isoformat(),
                         "--archive", str(tmp_path))
    assert archived.code == 0, archived.err
    assert f"archived {entries:,} entries" in archived.out
    too_soon = agentpost(dsn, "trail", "prune", "--before", "2999-01-01",
                         "--archive", str(tmp_path))
    assert "in the past" in assert_one_line_error(too_soon, 2)
    not_a_day = agentpost(dsn, "trail", "prune", "--before", "soon", "--archive", str(tmp_path))
    assert not_a_day.code == 2 and "not a day" in not_a_day.err
    pruned = agentpost(dsn, "trail", "prune", "--before", cut.isoformat(),
                       "--archive", str(tmp_path))
    assert pruned.code == 0, pruned.err
    assert "entries dropped" in pruned.out and "kept" in pruned.out
    assert re.search(r"[1-9]\d* envelope rows dropped, [1-9]\d* kept", pruned.out), pruned.out
    assert re.search(r"\d+ route rows dropped, \d+ kept", pruned.out), pruned.out
    verified = agentpost(dsn, "verify")
    assert verified.code == 0 and "since the checkpoint" in verified.out


def test_a_store_upgraded_to_the_partitioned_trail_keeps_verifying_and_prunes_its_legacy(
        empty_dsn: str, tmp_path: Path) -> None:
    """sql/0086 on a store with history: its entries become trail_legacy, the trail still
    verifies, new entries continue the ids and chains, and the legacy history is archived
    and pruned whole once all of it is older than the cut."""
    from agentpost.pg.migrations import migrate
    from dbtools import connect

    sql = Path(__file__).resolve().parents[2] / "sql"
    before = tmp_path / "before"
    before.mkdir()
    for path in sql.glob("[0-9]*_*.sql"):
        if int(path.name.split("_")[0]) < 86:
            (before / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    migrate(empty_dsn, source=before)
    with EnvelopeStore(empty_dsn) as old:
        build(old)
    conn = connect(empty_dsn)
    try:
        (last,) = rows(conn, "SELECT max(id) FROM agentpost.trail")[0]
        assert migrate(empty_dsn) == ["0086_trail_partitions.sql", "0087_signals_partitions.sql",
                                      "0088_envelopes_partitions.sql",
                                      "0089_empty_legacy_partitions.sql",
                                      "0090_history_partitions.sql",
                                      "0091_route_prunes.sql", "0092_pruned_chains.sql"]
        legacy = count(conn, "trail_legacy")
        envelopes = count(conn, "envelopes_legacy")
        assert envelopes == count(conn, "envelopes") > 0
        assert legacy == count(conn) > 0
        with EnvelopeStore(empty_dsn) as store:
            assert store.verify_trail().ok
            store.send("coord", "w1", "directive", "after the upgrade")
            assert rows(conn, "SELECT min(id) FROM agentpost.trail WHERE part_day > "
                              "'1900-01-01'")[0][0] > last
            assert store.verify_trail().ok
            # all of the legacy history is older than a cut taken tomorrow
            tomorrow = datetime.now(UTC).date() + timedelta(days=1)
            later = datetime.now(UTC) + timedelta(days=1, hours=2)
            done = archive(store, str(tmp_path / "archive"), tomorrow, now=later)
            assert "trail_legacy" in done.partitions
            pruned = prune(store, str(tmp_path / "archive"), tomorrow, now=later)
            assert pruned.partitions[0] == "trail_legacy" and not exists(conn, "trail_legacy")
            assert pruned.signals > 0 and not exists(conn, "signals_legacy")
            assert pruned.dropped + pruned.kept == legacy
            assert "envelopes_legacy" in pruned.partitions and not exists(conn, "envelopes_legacy")
            assert pruned.envelopes + count(conn, "envelopes_kept") == envelopes
            assert store.verify_trail().ok
    finally:
        conn.close()
