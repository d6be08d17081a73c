"""`agentpost trail archive` and `prune`: old months of the trail (and of the signals and
the envelopes that grow with it) to Parquet, then out of Postgres, never one without the
other's proof (docs/operations.md, "Archive and prune").

`archive(store, dir, cut)` verifies the trail (since the checkpoint given, else since the last
prune's, else whole) and keeps the checkpoint that run hands back, then copies every entry not
yet exported up to the newest id of the partitions the cut lets go, into a batch of the export
directory (`trail_export`: the layout and manifest the Spark jobs read), copies the envelope
and route rows of those months (`month_rows.write`), and records the cut.
`prune(store, dir, cut)` refuses unless that cut is in the manifest, its checkpoint is signed
with the trail key, every entry it would drop is in the archive as stored (id, hashes and
MAC equal to the row's, the record hashing to the hash) and so is every envelope and route
row that may leave (`month_rows.check`); then it keeps what later checks read
(`trail_partitions.KEEP`), drops the trail's months and records the prune, drops the signals'
months, and last the envelopes' and the routes' (`month_rows.prune`, with the rules of
`envelope_archive` and `route_archive`). A prune cut short between those steps is run again:
it goes on from where it stopped.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from agentpost.protocol.anchor import Checkpoint
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.errors import InvalidAnchor, InvalidInput, StoreError
from agentpost.protocol.trail import entry_hash
from agentpost.store import history_archive, month_rows, trail_export, trail_partitions
from agentpost.store.envelope_archive import ENVELOPES
from agentpost.store.history_archive import COMMANDS, SAGA_STEPS, SAGAS
from agentpost.store.route_archive import ROUTES
from agentpost.store.trail_partitions import Partition

if TYPE_CHECKING:
    from agentpost.store.envelopes import EnvelopeStore

__all__ = ["ROW_TABLES", "ArchiveResult", "PruneResult", "archive", "due", "prune"]

#: the tables whose rows leave with the trail's months, each by its own rules
ROW_TABLES = (ENVELOPES, ROUTES, SAGAS, SAGA_STEPS, COMMANDS)

SELECT = trail_export.TRAIL_SELECT + " WHERE id BETWEEN %s AND %s ORDER BY id"
#: ids read, and archived ids checked, per statement
CHUNK = 20_000
#: a cut must be this far in the past: entries younger may still be committing
MIN_AGE = timedelta(hours=1)


class ArchiveResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    cut: date
    partitions: list[str]
    entries: int
    batch: str | None
    checkpoint: str
    envelopes: int = 0  # the envelope rows copied
    routes: int = 0  # the route rows copied
    commands: int = 0  # the command rows copied
    sagas: int = 0  # the saga rows copied
    saga_steps: int = 0  # the saga step rows copied


class PruneResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    cut: date
    partitions: list[str]
    dropped: int
    kept: int
    signals: int = 0  # the signals dropped with the months
    envelopes: int = 0  # the envelope rows dropped with the months
    envelopes_kept: int = 0  # the envelope rows of those months that stay (envelopes_kept)
    envelopes_locked_s: float = 0.0  # the longest the envelopes' lock was held at once
    envelopes_locked_total_s: float = 0.0  # all its holds together (a batch of rows kept each)
    trail_locked_s: float = 0.0  # how long the trail's lock was held (every append waits)
    routes: int = 0  # the route rows dropped with the months
    routes_kept: int = 0  # the route rows of those months that stay (routes_kept)
    routes_locked_s: float = 0.0  # the longest the routes' lock was held at once
    chains: int = 0  # the commands' and sagas' chains dropped whole with the months
    commands: int = 0  # the command rows dropped with the months
    sagas: int = 0  # the saga rows dropped with the months
    saga_steps: int = 0  # the saga step rows dropped with the months


def due(store: EnvelopeStore, cut: date) -> list[str]:
    """The partitions a cut at `cut` would archive and drop (none: nothing to do)."""
    with store.db.cursor() as cur:
        return [p.name for p in trail_partitions.droppable(cur, cut)]


def archive(store: EnvelopeStore, directory: str, cut: date, *,
            since: str | None = None, now: datetime | None = None) -> ArchiveResult:
    """Verify, copy the months before `cut` to `directory` and record the cut (above)."""
    _check_cut(cut, now)
    exported = trail_export.load(directory)
    with store.db.cursor() as cur:
        parts = trail_partitions.droppable(cur, cut)
    if not parts:
        raise InvalidInput(f"no partition of the trail is wholly older than {cut}: nothing to "
                           "archive (a month goes once the cut is at or after its end)")
    result = store.verify_trail(since=since)
    if not result.ok:
        raise StoreError(f"the trail does not verify ({result.failure}): nothing archived; "
                         "run agentpost verify")
    checkpoint = Checkpoint.from_json(result.checkpoint)
    hi = max((p.max_id for p in parts if p.max_id is not None), default=0)
    batch = _copy(store, exported, exported.upto_id + 1, hi, cut) if hi > exported.upto_id \
        else None
    copied, copies, counts = [p.name for p in parts], {}, {}
    for rows in ROW_TABLES:
        with store.db.cursor() as cur:
            months = trail_partitions.droppable(cur, cut, rows.table)
        if months:
            copies[rows.table], counts[rows.table] = month_rows.write(store, rows, exported, cut)
            copied += [p.name for p in months]
    name = f"cut-{cut.isoformat()}.json"
    _write(Path(directory) / name, checkpoint.to_json())
    exported.cuts = [c for c in exported.cuts if c.cut != cut]
    exported.cuts.append(trail_export.Cut(
        cut=cut, checkpoint=name, upto_id=exported.upto_id,
        partitions=copied, envelope_rows=counts.get("envelopes", 0),
        route_rows=counts.get("routes", 0), **copies))
    exported.save()
    return ArchiveResult(cut=cut, partitions=copied,
                         entries=0 if batch is None else batch.rows,
                         batch=None if batch is None else batch.dir, checkpoint=name,
                         **counts)


def prune(store: EnvelopeStore, directory: str, cut: date, *,
          now: datetime | None = None) -> PruneResult:
    """Check the archive of `cut`, then drop the partitions it covers (above)."""
    _check_cut(cut, now)
    exported = trail_export.load(directory)
    taken = exported.cut(cut)
    if taken is None:
        raise InvalidInput(f"{directory} holds no archive cut at {cut}: run agentpost trail "
                           f"archive --before {cut} first")
    checkpoint = _checkpoint(store, Path(directory) / taken.checkpoint)
    # first the check and the entries kept, beside the agents' writes; then the drop, short,
    # under the trail's exclusive lock. Nothing enters those months meanwhile (new entries
    # go to this month's partition), and a drop that fails leaves the kept entries kept: a
    # second prune finds them gone from the months and the rest still archived.
    # (a prune cut short is run again: the trail's months may be gone, the rest not yet)
    with store.db.cursor() as cur:
        left = {t: trail_partitions.droppable(cur, cut, t)
                for t in ("trail", *(rows.table for rows in ROW_TABLES))}
    if not any(left.values()):
        raise InvalidInput(f"no partition of the trail is wholly older than {cut}: "
                           "nothing to prune")
    horizon = _plan(store, cut, left) if left["trail"] else 0
    for rows in ROW_TABLES:
        month_rows.check(store, rows, exported, cut, getattr(taken, rows.table),
                         left["trail"])
    trail = _Trail()
    if left["trail"]:
        trail = _prune_trail(store, exported, left["trail"], cut, checkpoint, horizon)
    # the months' signals, which their signal_emitted entries (archived) repeat
    with _busy("signals"), store.db.transaction() as conn, conn.cursor() as cur:
        signals = trail_partitions.drop(
            cur, trail_partitions.droppable(cur, cut, "signals")).rows
    # and the rows of the other tables that nothing left in Postgres needs
    done = {}
    for rows in ROW_TABLES:
        with _busy(rows.table):
            done[rows.table] = month_rows.prune(store, rows, cut)
    envelopes, routes = done["envelopes"], done["routes"]
    return PruneResult(cut=cut, partitions=[p.name for months in left.values() for p in months],
                       dropped=trail.dropped, kept=trail.kept, signals=signals,
                       envelopes=envelopes.dropped, envelopes_kept=envelopes.kept,
                       envelopes_locked_s=envelopes.locked_s,
                       envelopes_locked_total_s=envelopes.locked_total_s,
                       trail_locked_s=trail.locked_s, routes=routes.dropped,
                       routes_kept=routes.kept, routes_locked_s=routes.locked_s,
                       chains=trail.chains, commands=done["commands"].dropped,
                       sagas=done["sagas"].dropped, saga_steps=done["saga_steps"].dropped)


def _plan(store: EnvelopeStore, cut: date, left: dict[str, list[Partition]]) -> int:
    """The horizon (`month_rows.horizon`), then the commands' and sagas' chains that leave
    whole planned beside it (`history_archive.choose`); the horizon."""
    with store.db.cursor() as cur:
        horizon = month_rows.horizon(cur)
    with store.db.transaction() as conn, conn.cursor() as cur:
        history_archive.choose(cur, {"cut": cut, **{
            t: trail_partitions.oids(cur, left[t]) for t in ("trail", "sagas", "commands")}})
    return horizon


class _Trail(NamedTuple):
    """What the trail's part of a prune did."""

    dropped: int = 0
    kept: int = 0
    locked_s: float = 0.0
    chains: int = 0


def _prune_trail(store: EnvelopeStore, exported: trail_export.Export, parts: list[Partition],
                 cut: date, checkpoint: str, horizon: int) -> _Trail:
    """The trail's months: checked, what stays kept, then dropped with the chains planned
    to leave whole (sealed under the lock: `history_archive.seal`)."""
    with store.db.transaction() as conn, conn.cursor() as cur:
        _check_archived(cur, exported, parts, cut)
        kept = trail_partitions.keep(cur, parts, cut)
    with _busy("trail"), store.db.transaction() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO agentpost.trail_prunes (cut, checkpoint, partitions,"
                    " dropped, kept, archive) VALUES (%s, %s, %s, 0, %s, %s) RETURNING id",
                    (cut, checkpoint, [p.name for p in parts], kept,
                     str(exported.path)[:4096]))
        prune_id = cur.fetchone()[0]
        cur.execute("SELECT EXISTS (SELECT 1 FROM agentpost.trail_pruned_chains"
                    " WHERE prune IS NULL)")
        chains: list[int] = []
        seal = None
        if cur.fetchone()[0]:  # the system chain's lock before the trail's (see `drop`)
            cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
            cur.execute("SELECT agentpost._lock_chains(ARRAY[%s])", (SYSTEM_CHAIN,))

            def seal(c: Any) -> None:
                chains.append(history_archive.seal(c, store._key, cut, prune_id, horizon))
        dropped, locked_s = trail_partitions.drop(cur, parts, under_lock=seal)
        cur.execute("UPDATE agentpost.trail_prunes SET dropped = %s WHERE id = %s",
                    (dropped, prune_id))
    return _Trail(dropped, kept, locked_s, sum(chains))


@contextmanager
def _busy(table: str) -> Iterator[None]:
    """A lock not had in time as a one-line StoreError that says what to do."""
    try:
        yield
    except StoreError as exc:
        if "lock timeout" not in str(exc):
            raise
        raise StoreError(f"the {table} stayed busy for {trail_partitions.LOCK_TIMEOUT_MS // 1000}"
                         " s: its months were not dropped; run the prune again") from None


def _check_cut(cut: date, now: datetime | None) -> None:
    now = now or datetime.now(UTC)
    if datetime(cut.year, cut.month, cut.day, tzinfo=UTC) > now - MIN_AGE:
        raise InvalidInput(f"--before must be at least {MIN_AGE} in the past: entries younger "
                           "than that may still be committing")


def _checkpoint(store: EnvelopeStore, path: Path) -> str:
    """The cut's checkpoint text, refused unless signed with the trail key."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the cut's checkpoint {path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        Checkpoint.from_json(text).verify(store._key)
    except InvalidAnchor as exc:
        raise InvalidInput(f"the cut's checkpoint {path} does not verify: {exc}") from None
    return text


def _copy(store: EnvelopeStore, exported: trail_export.Export, lo: int, hi: int,
          cut: date) -> trail_export.Batch:
    """Entries lo..hi, in one snapshot, to a new batch, by day of `at`; then listed."""
    pq, pa = trail_export.pyarrow_modules()
    batch_dir = exported.next_dir()
    writers: dict[str, Any] = {}
    rows = 0
    # a batch a crashed run left (never listed): written afresh, not added to
    shutil.rmtree(Path(exported.path) / batch_dir, ignore_errors=True)
    try:
        for day, table in _tables(store, lo, hi, pa):
            if day not in writers:
                target = Path(exported.path) / batch_dir / f"day={day}"
                target.mkdir(parents=True, exist_ok=True)
                writers[day] = pq.ParquetWriter(str(target / "part-00000.parquet"),
                                                table.schema)
            writers[day].write_table(table)
            rows += table.num_rows
    except OSError as exc:
        raise InvalidInput(f"cannot write the archive under {exported.path}: "
                           f"{exc.strerror or exc}") from None
    finally:
        for writer in writers.values():
            writer.close()
    before = datetime(cut.year, cut.month, cut.day, tzinfo=UTC)
    batch = trail_export.Batch(dir=batch_dir, from_id=lo, to_id=hi, rows=rows, before=before)
    exported.batches.append(batch)
    exported.upto_id = hi
    return batch


def _tables(store: EnvelopeStore, lo: int, hi: int, pa: Any) -> Iterator[tuple[str, Any]]:
    """The rows lo..hi, in one snapshot, as Arrow tables of one day each, CHUNK ids at a
    time."""
    schema = pa.schema([("id", pa.int64()), ("chain", pa.string()), ("chain_seq", pa.int64()),
                        ("event", pa.string()), ("envelope_id", pa.string()),
                        ("at", pa.timestamp("us", tz="UTC")), ("at_us", pa.int64()),
                        ("record", pa.string()), ("prev_hash", pa.binary()),
                        ("hash", pa.binary()), ("mac", pa.binary())])
    with store.db.transaction() as conn, conn.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for start in range(lo, hi + 1, CHUNK):
            cur.execute(SELECT, (start, min(start + CHUNK - 1, hi)))
            by_day: dict[str, list[tuple]] = {}
            for row in cur.fetchall():
                by_day.setdefault(row[5].astimezone(UTC).date().isoformat(), []).append(row)
            for day, part in by_day.items():
                cols = list(zip(*part, strict=True))
                yield day, pa.Table.from_arrays(
                    [pa.array([bytes(v) for v in c] if f.type == pa.binary() else c,
                              type=f.type) for c, f in zip(cols, schema, strict=True)],
                    schema=schema)


def _check_archived(cur: Any, exported: trail_export.Export, parts: list[Partition],
                    cut: date) -> None:
    """Every entry of `parts` is in the archive as stored, or the prune is refused."""
    ids = [(p.min_id, p.max_id) for p in parts if p.max_id is not None]
    if not ids:
        return
    lo, hi = min(i[0] for i in ids), max(i[1] for i in ids)
    if hi > exported.upto_id:
        raise InvalidInput(f"entries up to id {hi} would be dropped but the archive holds ids "
                           f"only up to {exported.upto_id}: archive again before pruning")
    cur.execute("CREATE TEMP TABLE agentpost_archived (id bigint PRIMARY KEY, prev_hash bytea,"
                " hash bytea, mac bytea) ON COMMIT DROP")
    buf = io.StringIO()
    for n, row in enumerate(_archived_rows(exported, lo, hi), 1):
        buf.write("\t".join((str(row[0]), *("\\\\x" + v.hex() for v in row[1:]))) + "\n")
        if n % CHUNK == 0:
            _copy_in(cur, buf)
            buf = io.StringIO()
    _copy_in(cur, buf)
    names = ", ".join(f"'agentpost.{p.name}'::regclass" for p in parts)
    # (the part_day bounds keep the months that stay out of the scan)
    cur.execute(f"SELECT count(*) FROM agentpost.trail t LEFT JOIN agentpost_archived a"
                f" USING (id) WHERE t.part_day >= '1900-01-01' AND t.part_day < %s"
                f" AND t.tableoid IN ({names}) AND (a.id IS NULL OR (a.prev_hash, a.hash,"
                f" a.mac) IS DISTINCT FROM (t.prev_hash, t.hash, t.mac))", (cut,))
    missing = cur.fetchone()[0]
    if missing:
        raise InvalidInput(f"{missing} entries of the partitions to drop are not in the archive "
                           "as stored: nothing pruned; archive again")


def _copy_in(cur: Any, buf: io.StringIO) -> None:
    buf.seek(0)
    try:
        cur.copy_expert("COPY agentpost_archived FROM STDIN", buf)
    except Exception as exc:  # an id twice: a batch listed twice, or overlapping batches
        raise InvalidInput(f"the archive's batches overlap ({str(exc).splitlines()[0]}): "
                           "nothing pruned") from None


def _archived_rows(exported: trail_export.Export, lo: int, hi: int) -> Iterator[tuple]:
    """(id, prev_hash, hash, mac) of every archived entry with an id in lo..hi, each checked
    to hash its record (refused otherwise)."""
    for b in exported.batches:
        if b.to_id < lo or b.from_id > hi:
            continue
        for path, rows in trail_export.read_rows(Path(exported.path) / b.dir,
                                                 ("id", "record", "prev_hash", "hash", "mac"),
                                                 CHUNK):
            yield from _checked(rows, path, lo, hi)


def _checked(rows: list[tuple], path: Path, lo: int, hi: int) -> Iterator[tuple]:
    for i, rec, prev, digest, mac in rows:
        if not lo <= i <= hi:
            continue
        if entry_hash(prev, rec) != digest:
            raise InvalidInput(f"the archive's entry #{i} ({path}) does not hash to its stored "
                               "hash: nothing pruned")
        yield i, prev, digest, mac


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
