"""The rows of a history table's months (the envelopes', sql/0088; the routes', sql/0090):
copied beside the trail's archive, then kept or dropped with the trail's months
(docs/operations.md, "Archive and prune"). What differs per table is a `Rows`: which rows of
the months stay (`envelope_archive.ENVELOPES`, `route_archive.ROUTES`).

`write(store, rows, exported, cut)` copies every row of the table's months the cut lets go to
`<archive>/<table>-<cut>/part-00000.parquet`: the row as stored (`row`, its JSON without the
partition key) and the columns the Spark audit reads of a row.
`check(store, rows, exported, cut, directory, trail_parts)` runs before anything is dropped:
every row that may leave (kept by none of the table's rules, reading the entries outside
the trail's months being dropped) is in the cut's copy as stored, or the prune is refused.
`prune(store, rows, cut)` then drops the months, once the trail's are gone, in four steps on
one connection:

1. a horizon: under a moment's SHARE lock on the trail, the highest entry id given out, every
   entry up to it committed;
2. beside the agents: the rows to keep (the table's rules over the entries up to the
   horizon) and the digest of every row of the months; then the rows to keep moved to
   `<table>_kept`, MOVE_BATCH at a time, each batch in its own transaction under the
   table's EXCLUSIVE lock;
3. the rows left in the months counted, still beside the agents, and refused unless they
   are what step 2 left (the months' rows less those moved);
4. under the table's ACCESS EXCLUSIVE lock, short: the rows to keep again (`Rows.again`:
   opened, or named by an entry written since the horizon: a few), moved too; the months
   detached and dropped; and a `rows_pruned` entry in the system chain with the kind, count
   and digest of the rows that left, which a verification since an earlier checkpoint takes
   off its row digests (`store.row_digests`).

Nothing is counted under that lock: a count there held every agent's step for as long as a
month takes to read (2.79 s for 1,800,000 envelopes in the growth bench). The count of
step 3 holds until the drop because nothing the store writes enters an old month: a new row
takes this month's part_day, and an update keeps a row in its partition. A row put into an
old month by hand after step 3 leaves with it uncounted; it is in no archive, no checkpoint
taken before the prune and no entry, so a verification since a later checkpoint reports it
deleted (docs/operations.md).

Moving a row to another partition while an agent updates it would fail the agent's statement
("moved to another partition"), so every move runs under a table lock that no agent's write
holds beside it. A backlog of kept rows is moved in batches so that an agent waits for one
batch at most, never for the whole backlog; EXCLUSIVE (not ACCESS EXCLUSIVE) lets plain reads
(the page, verification) go on meanwhile. A prune cut short between batches leaves rows it
moved kept, which is what they were to be: a second run computes what is left.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg2

from agentpost.protocol import named_rows as nr
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.row_digest import MODULUS, RowDigest, row_key
from agentpost.protocol.trail import key_pads
from agentpost.store import trail_export, trail_partitions

if TYPE_CHECKING:
    from agentpost.store.envelopes import EnvelopeStore

__all__ = ["OLD", "Pruned", "Rows", "archived", "check", "horizon", "prune", "write"]

#: the rows (alias x) of the partitions dropped (their oids); the part_day bounds skip the
#: months kept
OLD = ("x.part_day >= '1900-01-01' AND x.part_day < %(cut)s"
       " AND x.tableoid = ANY (%(oids)s::oid[])")
#: the temporary table of the ids kept, which `Rows.keep` and `Rows.again` insert into
KEEP_TABLE = "agentpost_rows_keep"
#: rows read per statement
CHUNK = 20_000
#: rows kept moved per transaction beside the agents (each such move holds their writes)
MOVE_BATCH = 2_000
#: a digest over a set of rows' keys `{k}` (bytea), as the checkpoint's `row_digests` query
#: computes it
_DIGEST = ("SELECT count(*), coalesce(sum(('x' || encode(substr(sha256(%(opad)s || sha256("
           "%(ipad)s || {k})), 1, 8), 'hex'))::bit(64)::bigint), 0) FROM {rows}")


@dataclass(frozen=True)
class Rows:
    """One table's months: what is archived of a row and which rows stay.

    `columns` are the archive's columns, (name, pyarrow type name), the first `id` (the
    row's `key`), the last `row`; `select` reads them (alias x). `keep` are the statements
    that put the keys of the rows of the months to keep into KEEP_TABLE (`{old}`: OLD;
    `{entries}`: the condition on the trail `t` of the entries that stay); `again` the few
    that add what step 4 keeps beside them."""

    table: str
    kind: str
    columns: tuple[tuple[str, str], ...]
    select: str
    keep: tuple[str, ...]
    again: tuple[str, ...]
    #: the column of agentpost.trail_prunes that counts the rows dropped
    counted: str
    #: a row's key, as text (what KEEP_TABLE holds), and as the row digest hashes it
    key: str = "x.id"
    digest_key: str = "convert_to(x.id, 'UTF8')"
    #: the rules `check` keeps by, where they differ from `keep` (a plan not yet carried out)
    keep_check: tuple[str, ...] = ()

    def keeping(self, entries: str, *, checking: bool = False) -> tuple[str, ...]:
        rules = self.keep_check if checking and self.keep_check else self.keep
        return tuple(s.format(old=OLD, entries=entries, keep=KEEP_TABLE) for s in rules)

    def keeping_again(self) -> tuple[str, ...]:
        return tuple(s.format(old=OLD, entries="t.id > %(horizon)s", keep=KEEP_TABLE)
                     for s in self.again)


def write(store: EnvelopeStore, rows: Rows, exported: trail_export.Export,
          cut: date) -> tuple[str, int]:
    """Copy the rows of the months `cut` lets go into the archive (replacing a copy of this
    cut a crashed run left); the directory, relative to the archive, and the rows."""
    pq, pa = trail_export.pyarrow_modules()
    name = f"{rows.table}-{cut.isoformat()}"
    target = Path(exported.path) / name
    schema = pa.schema([(n, _arrow_type(pa, t)) for n, t in rows.columns])
    written = 0
    try:
        target.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(str(target / "part-00000.parquet"), schema) as writer:
            for chunk in _chunks(store, rows, cut):
                cols = list(zip(*chunk, strict=True))
                writer.write_table(pa.Table.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                    schema=schema))
                written += len(chunk)
    except OSError as exc:
        raise InvalidInput(f"cannot write the archive under {exported.path}: "
                           f"{exc.strerror or exc}") from None
    return name, written


def _arrow_type(pa: Any, name: str) -> Any:
    return pa.timestamp("us", tz="UTC") if name == "timestamp" else getattr(pa, name)()


def _chunks(store: EnvelopeStore, rows: Rows, cut: date) -> Iterator[list[tuple]]:
    """The rows of the months `cut` lets go, in one snapshot, CHUNK at a time (one pass of
    a server-side cursor)."""
    with store.db.transaction() as conn, conn.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur.execute("SET LOCAL TIME ZONE 'UTC'")  # the row's JSON the prune compares
        params = {"cut": cut, "oids": _oids(cur, rows, cut)}
        cur.execute(f"DECLARE agentpost_month_rows NO SCROLL CURSOR FOR {rows.select}"
                    f" WHERE {OLD}", params)
        while True:
            cur.execute(f"FETCH {CHUNK} FROM agentpost_month_rows")
            chunk = cur.fetchall()
            if not chunk:
                return
            yield chunk


def _oids(cur: Any, rows: Rows, cut: date) -> list[int]:
    return trail_partitions.oids(cur, trail_partitions.droppable(cur, cut, rows.table))


def check(store: EnvelopeStore, rows: Rows, exported: trail_export.Export, cut: date,
          directory: str | None, trail_parts: list[trail_partitions.Partition]) -> None:
    """Refuse (InvalidInput) unless every row of the months `cut` lets go that may leave is
    in the cut's copy as stored; run before anything is dropped. May leave: kept by none of
    `rows.keep` over the entries outside `trail_parts` (the trail's months the prune drops).
    The rows `prune` drops are among these and unchanged since (changing a row writes an
    entry that names it, which keeps it)."""
    with store.db.cursor() as cur, _session(cur):
        oids = _oids(cur, rows, cut)
        if not oids:
            return
        params = {"cut": cut, "oids": oids, "trail": trail_partitions.oids(cur, trail_parts)}
        _keep(cur, rows.keeping("t.tableoid <> ALL (%(trail)s::oid[])", checking=True), params,
              fresh=True)
        _check_archived(cur, rows, exported, directory, params)


class Pruned(NamedTuple):
    """What `prune` did: rows dropped, rows kept (moved to <table>_kept), the longest the
    table's lock was held at once (the longest an agent's step touching it waited) and how
    long all the holds took together."""

    dropped: int = 0
    kept: int = 0
    locked_s: float = 0.0
    locked_total_s: float = 0.0


def prune(store: EnvelopeStore, rows: Rows, cut: date) -> Pruned:
    """Drop the months of `rows.table` that `cut` lets go (the module docstring's four
    steps), once `check` passed and the trail's months are dropped."""
    pads = [psycopg2.Binary(p) for p in key_pads(row_key(store._key))]
    with store.db.cursor() as cur, _session(cur):
        parts = trail_partitions.droppable(cur, cut, rows.table)
        if not parts:
            return Pruned()
        params = {"cut": cut, "oids": _oids(cur, rows, cut), "ipad": pads[0], "opad": pads[1],
                  "horizon": horizon(cur)}
        _keep(cur, rows.keeping("t.id <= %(horizon)s"), params, fresh=True)
        everything = _digest(cur, rows, params)
        moved = _move_kept(cur, rows, params)
        left = _digest(cur, rows, params)
        if left != everything - moved.digest:
            raise InvalidInput(f"the {rows.table} months changed under the prune ({left.count} "
                               f"rows left, {everything.count - moved.digest.count} expected):"
                               " nothing dropped; run it again")
        return _drop(cur, rows, parts, params, left, cut, moved)


@contextmanager
def _session(cur: Any) -> Iterator[None]:
    """Rows as JSON in UTC (as the archive wrote them); the temporary tables dropped after."""
    cur.execute("SET TIME ZONE 'UTC'")
    try:
        yield
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {KEEP_TABLE}, agentpost_rows_archived")
        cur.execute("RESET TIME ZONE")


def horizon(cur: Any) -> int:
    """The highest trail id given out, once every entry up to it has committed: an entry
    with a higher id commits later (an append takes its id inside its INSERT, which holds the
    trail's ROW EXCLUSIVE lock, so SHARE waits for the appends under way)."""
    cur.execute("BEGIN")
    try:
        cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
        cur.execute("LOCK TABLE agentpost.trail IN SHARE MODE")
        cur.execute("SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END"
                    " FROM agentpost.trail_id_seq")
        return cur.fetchone()[0]
    finally:
        cur.execute("COMMIT")


def _keep(cur: Any, statements: tuple[str, ...], params: dict[str, Any], *,
          fresh: bool = False, own: bool = True) -> None:
    """Run `statements` (a table's keep rules) into KEEP_TABLE, emptied first if `fresh`, in
    a transaction of their own unless `own` is False (the caller's). Each rule is a
    semi-join of its own, never `IN (subquery)` under an OR (trail_partitions.KEEP says
    why)."""
    if own:
        cur.execute("BEGIN")
    try:
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {KEEP_TABLE} (id text PRIMARY KEY)")
        if fresh:
            cur.execute(f"TRUNCATE {KEEP_TABLE}")
        cur.execute("SET LOCAL work_mem = '256MB'")
        for statement in statements:
            cur.execute(statement, params)
    except BaseException:
        if own:
            cur.execute("ROLLBACK")
        raise
    if own:
        cur.execute("COMMIT")


class _Moved(NamedTuple):
    """The rows kept moved beside the agents: their digest, and the seconds of each hold."""

    digest: RowDigest
    holds: list[float]


def _move_kept(cur: Any, rows: Rows, params: dict[str, Any]) -> _Moved:
    """Step 2's rows to keep moved to <table>_kept, MOVE_BATCH at a time, each batch under
    the table's EXCLUSIVE lock for as long as it takes."""
    cur.execute(f"SELECT id FROM {KEEP_TABLE} ORDER BY id")
    ids = [r[0] for r in cur.fetchall()]
    moved, holds = RowDigest(), []
    for start in range(0, len(ids), MOVE_BATCH):
        cur.execute("BEGIN")
        try:
            cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
            cur.execute(f"LOCK TABLE agentpost.{rows.table} IN EXCLUSIVE MODE")
            locked = time.perf_counter()
            batch = _move(cur, rows, f"{rows.key} = ANY (%(batch)s)",
                          {**params, "batch": ids[start:start + MOVE_BATCH]})
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        holds.append(time.perf_counter() - locked)
        moved += batch
    return _Moved(moved, holds)


def _move(cur: Any, rows: Rows, which: str, params: dict[str, Any]) -> RowDigest:
    """The rows of the months that `which` names (and KEEP_TABLE holds) moved to
    <table>_kept, under a lock no agent's write holds beside (the module docstring); the
    digest of the rows moved."""
    cur.execute(f"WITH moved AS (UPDATE agentpost.{rows.table} x SET part_day = '-infinity'"
                f" FROM {KEEP_TABLE} k WHERE k.id = {rows.key} AND {which} AND {OLD}"
                f" RETURNING {rows.digest_key} AS k) " + _DIGEST.format(k="k", rows="moved"),
                params)
    return _fetched(cur)


def _digest(cur: Any, rows: Rows, params: dict[str, Any]) -> RowDigest:
    cur.execute(_DIGEST.format(k=rows.digest_key, rows=f"agentpost.{rows.table} x")
                + f" WHERE {OLD}", params)
    return _fetched(cur)


def _fetched(cur: Any) -> RowDigest:
    count, total = cur.fetchone()
    return RowDigest(count, int(total) % MODULUS)


def _check_archived(cur: Any, rows: Rows, exported: trail_export.Export,
                    directory: str | None, params: dict[str, Any]) -> None:
    """Every row of the months that is not kept is in the cut's copy as stored."""
    cur.execute("CREATE TEMP TABLE agentpost_rows_archived (id text PRIMARY KEY, row text)")
    if directory is not None:
        for chunk in archived(exported, directory, ("id", "row")):
            buf = io.StringIO()
            for rid, row in chunk:
                buf.write(f"{_copy_text(rid)}\t{_copy_text(row)}\n")
            buf.seek(0)
            try:
                cur.copy_expert("COPY agentpost_rows_archived FROM STDIN", buf)
            except psycopg2.Error as exc:
                raise InvalidInput(f"the archive's {rows.table} under {directory} hold an id "
                                   f"twice ({str(exc).splitlines()[0]}): nothing pruned") from None
    cur.execute(f"SELECT count(*) FROM agentpost.{rows.table} x"
                f" LEFT JOIN agentpost_rows_archived a ON a.id = {rows.key}"
                f" WHERE {OLD} AND NOT EXISTS (SELECT 1 FROM {KEEP_TABLE} k"
                f" WHERE k.id = {rows.key}) AND (a.id IS NULL"
                f" OR a.row IS DISTINCT FROM (to_jsonb(x) - 'part_day')::text)", params)
    missing = cur.fetchone()[0]
    if missing:
        raise InvalidInput(f"{missing} {rows.table} rows of the months to drop are not in the "
                           "archive as stored: nothing pruned; archive again")


def _drop(cur: Any, rows: Rows, parts: list[trail_partitions.Partition],
          params: dict[str, Any], left: RowDigest, cut: date, moved: _Moved) -> Pruned:
    """Step 4 (the module docstring), in one transaction: the system chain's lock, then the
    table's (so no one holds a row while it moves), the last rows kept moved, the months
    dropped, and the signed `rows_pruned` entry. `left` is the months' digest step 3 took:
    the rows that leave are those less the rows moved here."""
    cur.execute("BEGIN")
    try:
        cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
        cur.execute("SELECT agentpost._lock_chains(ARRAY[%s])", (SYSTEM_CHAIN,))
        cur.execute(f"LOCK TABLE agentpost.{rows.table} IN ACCESS EXCLUSIVE MODE")
        locked = time.perf_counter()
        _keep(cur, rows.keeping_again(), params, own=False)
        last = _move(cur, rows, "true", params)
        gone = left - last
        dropped = trail_partitions.drop(cur, parts, rows=gone.count).rows
        if gone.count:
            body = {"kind": rows.kind, "cut": cut.isoformat(), **gone.to_json(),
                    "partitions": [p.name for p in parts]}
            cur.execute("SELECT agentpost._trail_write(ARRAY[%s], ARRAY[%s],"
                        " ARRAY[NULL]::text[], ARRAY[%s::jsonb], true)",
                        (SYSTEM_CHAIN, nr.ROWS_PRUNED, json.dumps(body)))
        cur.execute(f"UPDATE agentpost.trail_prunes SET {rows.counted} = {rows.counted} + %s"
                    " WHERE id = (SELECT max(id) FROM agentpost.trail_prunes WHERE cut = %s)",
                    (dropped, cut))
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")
    holds = [*moved.holds, time.perf_counter() - locked]
    return Pruned(dropped, (moved.digest + last).count, max(holds), sum(holds))


def archived(exported: trail_export.Export, directory: str,
             columns: tuple[str, ...]) -> Iterator[list[tuple]]:
    """The rows of one cut's copy of a table, `columns` of each, CHUNK at a time."""
    for _path, rows in trail_export.read_rows(Path(exported.path) / directory, columns, CHUNK):
        yield rows


def _copy_text(value: str | None) -> str:
    if value is None:
        return "\\N"
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))
