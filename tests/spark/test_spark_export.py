"""The trail's Parquet export (`agentpost.spark.export`): old entries copied out by day, and
the jobs' reads of Parquet plus the live tail equal to a read of Postgres alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentpost.benchmarks.spark_fill import Plan, fill
from agentpost.protocol.errors import InvalidInput
from agentpost.spark import archive
from agentpost.spark.export import main, run_export
from agentpost.spark.settings import SparkSettings
from agentpost.spark.source import Snapshot
from agentpost.store import EnvelopeStore
from dbtools import rows

KEY = b"agentpost-test-trail-key"
TEN_DAYS_AGO = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - \
    timedelta(days=10)


@pytest.fixture
def history(dsn: str) -> str:
    """A day of synthetic traffic ten days ago (about 2,300 entries), then live sends now."""
    fill(dsn, KEY, Plan(envelopes=500, start_us=int(TEN_DAYS_AGO.timestamp() * 1e6)),
         parts=1)
    with EnvelopeStore(dsn) as store:
        coordinator = store.create_workspace("coordinator")
        worker = store.create_workspace("worker", parent=coordinator.id)
        for i in range(5):
            store.send(coordinator.id, worker.id, "directive", f"live {i}")
    return dsn


def _rows(frame) -> list[tuple]:
    return sorted((r.id, r.chain, r.chain_seq, r.event, r.envelope_id, r.at_us, r.record,
                   bytes(r.prev_hash), bytes(r.hash), bytes(r.mac)) for r in frame.collect())


def test_export_copies_old_entries_by_day_and_reads_equal_postgres(spark, history: str,
                                                                   tmp_path: Path) -> None:
    plain = SparkSettings(dsn=history)
    with Snapshot(spark, plain) as snap:
        everything = _rows(snap.trail())
    settings = SparkSettings(dsn=history, archive=str(tmp_path))
    cut = TEN_DAYS_AGO + timedelta(days=2)

    batch = run_export(spark, settings, cut)

    assert batch is not None and batch.dir == "batch-000001" and batch.from_id == 1
    old = [r for r in everything if r[0] <= batch.to_id]
    assert batch.rows == len(old) > 2_000
    days = sorted(p.name for p in (tmp_path / "batch-000001").glob("day=*"))
    assert days == [f"day={(TEN_DAYS_AGO + timedelta(days=d)).date()}" for d in (0, 1)]
    manifest = json.loads((tmp_path / archive.MANIFEST).read_text())
    assert manifest["upto_id"] == batch.to_id and len(manifest["batches"]) == 1
    # every live entry is newer than the cut: the export stopped before the first of them
    assert min(r[0] for r in everything if r[5] >= cut.timestamp() * 1e6) == batch.to_id + 1
    half_day = {"start": TEN_DAYS_AGO, "end": TEN_DAYS_AGO + timedelta(hours=12)}
    with Snapshot(spark, settings) as snap:
        merged = _rows(snap.trail())
        window = _rows(snap.trail(**half_day))
        # the count the analytics record as source_rows: exported and live entries alike
        counted = (snap.trail_count(), snap.trail_count(**half_day))
    assert merged == everything
    assert counted == (len(everything), len(window))
    assert window and window == [r for r in everything
                                 if TEN_DAYS_AGO.timestamp() * 1e6 <= r[5]
                                 < (TEN_DAYS_AGO + timedelta(hours=12)).timestamp() * 1e6]


def test_a_second_export_adds_only_new_old_entries(spark, history: str, tmp_path: Path) -> None:
    settings = SparkSettings(dsn=history, archive=str(tmp_path))
    first = run_export(spark, settings, TEN_DAYS_AGO + timedelta(hours=6))
    second = run_export(spark, settings, TEN_DAYS_AGO + timedelta(days=2))
    again = run_export(spark, settings, TEN_DAYS_AGO + timedelta(days=2))
    assert first is not None and second is not None and again is None
    assert second.from_id == first.to_id + 1 and second.dir == "batch-000002"
    with Snapshot(spark, SparkSettings(dsn=history)) as snap:
        plain = _rows(snap.trail())
    with Snapshot(spark, settings) as snap:
        assert _rows(snap.trail()) == plain


def test_a_batch_left_by_a_crashed_export_is_never_read_and_is_replaced(spark, history: str,
                                                                          tmp_path: Path) -> None:
    """A batch directory the manifest does not list (the run died before listing it) is
    not part of the export: reads ignore it, and the next run writes over it."""
    stray = tmp_path / "batch-000001" / "day=2000-01-01"
    stray.mkdir(parents=True)
    (stray / "part-crashed.parquet").write_bytes(b"not parquet")
    settings = SparkSettings(dsn=history, archive=str(tmp_path))
    with Snapshot(spark, SparkSettings(dsn=history)) as snap:
        plain = _rows(snap.trail())
    with Snapshot(spark, settings) as snap:
        assert _rows(snap.trail()) == plain
    batch = run_export(spark, settings, TEN_DAYS_AGO + timedelta(days=2))
    assert batch is not None and batch.dir == "batch-000001"
    assert not stray.exists()
    with Snapshot(spark, settings) as snap:
        assert _rows(snap.trail()) == plain


def test_bad_input_is_refused_and_writes_nothing(spark, history: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    settings = SparkSettings(dsn=history, archive=str(tmp_path))
    with pytest.raises(InvalidInput, match="at least 1:00:00 in the past"):
        run_export(spark, settings, datetime.now(UTC))
    with pytest.raises(InvalidInput, match="no export directory"):
        run_export(spark, SparkSettings(dsn=history), TEN_DAYS_AGO)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / archive.MANIFEST).write_text('{"format": "something else"}')
    assert main(["--dsn", history, "--archive", str(tmp_path), "--before",
                 TEN_DAYS_AGO.isoformat()]) == 2
    err = capsys.readouterr().err
    assert "is not a usable trail export manifest" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.MANIFEST]


def test_after_a_prune_the_jobs_read_archive_plus_live_and_the_audit_passes(
        spark, dsn: str, pg, tmp_path: Path) -> None:
    """Issue 26: once `agentpost trail prune` dropped a month, the jobs read its entries from
    the archive and the rest from Postgres, each once (the entries kept in Postgres are read
    from the archive), and the Spark audit verifies every chain across the cut; the envelope
    route, command, saga and saga step rows the prune dropped are read from the archive too, so
    every row the entries name is found and checked."""
    from agentpost.protocol.routes import HAPPY_END
    from agentpost.spark.audit import run_audit
    from agentpost.store.commands import CommandLedger
    from agentpost.store.routes import RouteStore
    from agentpost.store.sagas import SagaRunner
    from agentpost.store.trail_archive import archive as take_archive
    from agentpost.store.trail_archive import prune
    from test_trail_anchor import build
    from test_trail_prune import age, old_month

    with EnvelopeStore(dsn) as store:
        build(store)
        for n in range(3):  # consumed in the old month: their rows leave with it
            store.send("coord", "w1", "directive", f"step {n}")
        for lease in store.lease("w1", max=5):
            store.ack(lease.token)
        store.register_type("book", ["worker"], ["worker"])
        with CommandLedger(store) as ledger:  # a command and a saga over: they leave too
            ledger.run("w1", "old-command", lambda: {"ok": 1}, action="book",
                       mutating=True, auto_confirm="low-risk")
            saga = SagaRunner(ledger, {}).begin("w1", "old-saga")
            saga.step("only", lambda: {"ok": 2}, action="book", auto_confirm="policy")
            saga.complete()
        routes = RouteStore(store)  # routes run to their end: the first one's row leaves
        routes.setup(["a"])  # (the last one's entries are their chains' heads: it stays)
        for rid in ("r-old", "r-last"):
            routes.start({"id": rid, "route": {"actors": ["a"]}, "payload": {}})
            (hop,) = routes.receive("a")
            routes.complete("a", hop.lease, hop.envelope, {"done": True})
            routes.finish_many(routes.receive(HAPPY_END))
        month = old_month()
        age(pg, month)
        cut = month.replace(month=month.month % 12 + 1, year=month.year + month.month // 12)
        take_archive(store, str(tmp_path), cut)
        for lease in store.lease("w2", max=5):  # open at the cut: its entries are kept
            store.ack(lease.token)
        store.send("coord", "w1", "directive", "after the cut")
        with Snapshot(spark, SparkSettings(dsn=dsn)) as snap:
            everything = _rows(snap.trail())
        pruned = prune(store, str(tmp_path), cut)
        key = store.settings.trail_key
    assert pruned.dropped > 0 and pruned.kept > 0 and pruned.envelopes > 0
    assert pruned.routes == 1 and not rows(pg, "SELECT 1 FROM agentpost.routes WHERE id ="
                                           " 'r-old'")
    assert (pruned.commands, pruned.sagas, pruned.saga_steps) == (2, 1, 1)
    settings = SparkSettings(dsn=dsn, archive=str(tmp_path), trail_key=key)
    with Snapshot(spark, settings) as snap:
        read = _rows(snap.trail())
        assert [r for r in read if r[3] not in ("rows_pruned", "chains_pruned")] == everything
        # and the prune's entries: rows_pruned for each of five tables, chains_pruned
        assert snap.trail_count() == len(everything) + 6
    report = run_audit(spark, settings)
    assert report.ok, {n: c.first for n, c in report.checks.items() if c.failed}
    live = rows(pg, "SELECT count(*) FROM agentpost.envelopes")[0][0]
    assert report.checks["envelope_rows"].checked == live + pruned.envelopes
    assert report.checks["route_rows"].checked == 1 + rows(
        pg, "SELECT count(*) FROM agentpost.routes")[0][0]
    # without the archive, the audit sees chains that start past seq 1 and fails
    assert not run_audit(spark, SparkSettings(dsn=dsn, trail_key=key)).ok
