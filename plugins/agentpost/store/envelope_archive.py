"""The envelopes' months (sql/0088): copied beside the trail's archive, then kept or dropped
with the trail's months (docs/operations.md, "Archive and prune").

`write(store, exported, cut)` copies every row of the envelope partitions the cut lets go to
`<archive>/envelopes-<cut>/part-00000.parquet`: the row as stored (`row`, its JSON without the
partition key, content included) and the columns the Spark audit reads of a row.
`check(store, exported, cut, directory, trail_parts)` runs before anything is dropped: every
row that may leave (not open, named by no entry outside the trail's months being dropped) is
in the cut's copy as stored, or the prune is refused. `prune(store, cut)` then drops the
envelope months, once the trail's are gone, in four steps on one connection:

1. a horizon: under a moment's SHARE lock on the trail, the highest entry id given out, every
   entry up to it committed;
2. beside the agents: the rows to keep (still open, or named by an entry up to the horizon:
   `trail_partitions.KEEP` left those in Postgres) and the digest of every row of the months;
   then the rows to keep moved to `envelopes_kept`, MOVE_BATCH at a time, each batch in its
   own transaction under the envelopes' EXCLUSIVE lock;
3. the rows left in the months counted, still beside the agents, and refused unless they
   are what step 2 left (the months' rows less those moved);
4. under the envelopes' ACCESS EXCLUSIVE lock, short: the rows to keep again (opened, or
   named by an entry written since the horizon: a few), moved too; the months detached and
   dropped; and a `rows_pruned` entry in the system chain with the count and digest of the
   rows that left, which a verification since an earlier checkpoint takes off its row
   digests (`store.row_digests`).

Nothing is counted under that lock: a count there held every agent's step for as long as a
month takes to read (2.79 s for 1,800,000 rows in the growth bench). The count of step 3
holds until the drop because nothing the store writes enters an old month: a new row takes
this month's part_day, and an update keeps a row in its partition. A row put into an old
month by hand after step 3 leaves with it uncounted; it is in no archive, no checkpoint
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

__all__ = ["COLUMNS", "Pruned", "archived", "check", "prune", "write"]

#: an archived envelope's columns (the last two: the row as signed, the row as stored)
COLUMNS = ("id", "seq", "status", "sender", "recipient", "delivered", "consumed", "created_at",
           "now", "row")
_SELECT = ("SELECT e.id, e.seq, e.status, e.sender, e.recipient, e.delivered_at IS NOT NULL,"
           " e.consumed_at IS NOT NULL, e.created_at, agentpost._envelope_row(e, true)::text,"
           " (to_jsonb(e) - 'part_day')::text FROM agentpost.envelopes e")
#: the rows of the partitions dropped (their oids); the part_day bounds skip the months kept
_OLD = ("e.part_day >= '1900-01-01' AND e.part_day < %(cut)s"
        " AND e.tableoid = ANY (%(oids)s::oid[])")
#: rows read per statement
CHUNK = 20_000
#: rows kept moved per transaction beside the agents (each such move holds their writes)
MOVE_BATCH = 2_000
#: a digest over a set of rows' ids, as the checkpoint's `row_digests` query computes it
_DIGEST = ("SELECT count(*), coalesce(sum(('x' || encode(substr(sha256(%(opad)s || sha256("
           "%(ipad)s || convert_to(e.id, 'UTF8'))), 1, 8), 'hex'))::bit(64)::bigint), 0)"
           " FROM {rows} e")


def write(store: EnvelopeStore, exported: trail_export.Export, cut: date) -> tuple[str, int]:
    """Copy the rows of the envelope months `cut` lets go into the archive (replacing a copy
    of this cut a crashed run left); the directory, relative to the archive, and the rows."""
    pq, pa = trail_export.pyarrow_modules()
    name = f"envelopes-{cut.isoformat()}"
    target = Path(exported.path) / name
    schema = pa.schema([("id", pa.string()), ("seq", pa.int64()), ("status", pa.string()),
                        ("sender", pa.string()), ("recipient", pa.string()),
                        ("delivered", pa.bool_()), ("consumed", pa.bool_()),
                        ("created_at", pa.timestamp("us", tz="UTC")), ("now", pa.string()),
                        ("row", pa.string())])
    rows = 0
    try:
        target.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(str(target / "part-00000.parquet"), schema) as writer:
            for chunk in _chunks(store, cut):
                cols = list(zip(*chunk, strict=True))
                writer.write_table(pa.Table.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                    schema=schema))
                rows += len(chunk)
    except OSError as exc:
        raise InvalidInput(f"cannot write the archive under {exported.path}: "
                           f"{exc.strerror or exc}") from None
    return name, rows


def _chunks(store: EnvelopeStore, cut: date) -> Iterator[list[tuple]]:
    """The rows of the months `cut` lets go, in one snapshot, CHUNK at a time by id."""
    with store.db.transaction() as conn, conn.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur.execute("SET LOCAL TIME ZONE 'UTC'")  # the row's JSON the prune compares
        params = {"cut": cut, "oids": _oids(cur, cut), "after": ""}
        while True:
            cur.execute(f"{_SELECT} WHERE {_OLD} AND e.id > %(after)s ORDER BY e.id"
                        f" LIMIT {CHUNK}", params)
            chunk = cur.fetchall()
            if not chunk:
                return
            yield chunk
            params["after"] = chunk[-1][0]


def _oids(cur: Any, cut: date) -> list[int]:
    return trail_partitions.oids(cur, trail_partitions.droppable(cur, cut, "envelopes"))


def check(store: EnvelopeStore, exported: trail_export.Export, cut: date,
          directory: str | None, trail_parts: list[trail_partitions.Partition]) -> None:
    """Refuse (InvalidInput) unless every row of the envelope months `cut` lets go that may
    leave is in the cut's copy as stored; run before anything is dropped. May leave: not open
    and named by no entry outside `trail_parts` (the trail's months the prune drops). The
    rows `prune` drops are among these and unchanged since (changing a row writes an entry
    that names it, which keeps it)."""
    with store.db.cursor() as cur, _session(cur):
        oids = _oids(cur, cut)
        if not oids:
            return
        params = {"cut": cut, "oids": oids, "trail": trail_partitions.oids(cur, trail_parts)}
        _keep_named(cur, params, "t.tableoid <> ALL (%(trail)s::oid[])")
        _check_archived(cur, exported, directory, params)


class Pruned(NamedTuple):
    """What `prune` did: rows dropped, rows kept (moved to envelopes_kept), the longest the
    envelopes' lock was held at once (the longest an agent's step touching envelopes waited)
    and how long all the holds took together."""

    dropped: int = 0
    kept: int = 0
    locked_s: float = 0.0
    locked_total_s: float = 0.0


def prune(store: EnvelopeStore, cut: date) -> Pruned:
    """Drop the envelope months `cut` lets go (the module docstring's three steps), once
    `check` passed and the trail's months are dropped."""
    pads = [psycopg2.Binary(p) for p in key_pads(row_key(store._key))]
    with store.db.cursor() as cur, _session(cur):
        parts = trail_partitions.droppable(cur, cut, "envelopes")
        if not parts:
            return Pruned()
        params = {"cut": cut, "oids": _oids(cur, cut), "ipad": pads[0], "opad": pads[1],
                  "horizon": _horizon(cur)}
        _keep_named(cur, params, "t.id <= %(horizon)s")
        everything = _digest(cur, f"WHERE {_OLD}", params)
        moved = _move_kept(cur, params)
        left = _digest(cur, f"WHERE {_OLD}", params)
        if left != everything - moved.digest:
            raise InvalidInput(f"the envelope months changed under the prune ({left.count} "
                               f"rows left, {everything.count - moved.digest.count} expected):"
                               " nothing dropped; run it again")
        return _drop(cur, parts, params, left, cut, moved)


@contextmanager
def _session(cur: Any) -> Iterator[None]:
    """Rows as JSON in UTC (as the archive wrote them); the temporary tables dropped after."""
    cur.execute("SET TIME ZONE 'UTC'")
    try:
        yield
    finally:
        cur.execute("DROP TABLE IF EXISTS agentpost_env_keep, agentpost_env_archived")
        cur.execute("RESET TIME ZONE")


def _horizon(cur: Any) -> int:
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


def _keep_named(cur: Any, params: dict[str, Any], entries: str) -> None:
    """The rows of the months that stay: open, or named by one of the `entries` (a condition
    on the trail `t`), into agentpost_env_keep (one pass over the trail's envelope index)."""
    cur.execute("CREATE TEMP TABLE IF NOT EXISTS agentpost_env_keep (id text PRIMARY KEY)")
    cur.execute("TRUNCATE agentpost_env_keep")
    cur.execute("SET work_mem = '256MB'")
    try:
        _keep_open(cur, params)
        # (a semi-join of its own, never `IN (subquery)` under an OR: trail_partitions.KEEP)
        cur.execute(f"INSERT INTO agentpost_env_keep SELECT e.id FROM agentpost.envelopes e"
                    f" WHERE {_OLD} AND e.id IN (SELECT t.envelope_id FROM agentpost.trail t"
                    f" WHERE t.envelope_id IS NOT NULL AND {entries})"
                    f" ON CONFLICT DO NOTHING", params)
    finally:
        cur.execute("RESET work_mem")


def _keep_open(cur: Any, params: dict[str, Any]) -> None:
    """The rows of the months still open, through the partial indexes that hold only those
    (envelopes_ready, envelopes_pending: their predicates, word for word)."""
    for open_rows in ("e.status = 'acknowledged' AND e.consumed_at IS NULL",
                      "e.status = 'validated'"):
        cur.execute(f"INSERT INTO agentpost_env_keep SELECT e.id FROM agentpost.envelopes e"
                    f" WHERE {_OLD} AND {open_rows} ON CONFLICT DO NOTHING", params)


class _Moved(NamedTuple):
    """The rows kept moved beside the agents: their digest, and the seconds of each hold."""

    digest: RowDigest
    holds: list[float]


def _move_kept(cur: Any, params: dict[str, Any]) -> _Moved:
    """Step 2's rows to keep moved to envelopes_kept, MOVE_BATCH at a time, each batch under
    the envelopes' EXCLUSIVE lock for as long as it takes."""
    cur.execute("SELECT id FROM agentpost_env_keep ORDER BY id")
    ids = [r[0] for r in cur.fetchall()]
    moved, holds = RowDigest(), []
    for start in range(0, len(ids), MOVE_BATCH):
        cur.execute("BEGIN")
        try:
            cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
            cur.execute("LOCK TABLE agentpost.envelopes IN EXCLUSIVE MODE")
            locked = time.perf_counter()
            batch = _move(cur, "e.id = ANY (%(batch)s)",
                          {**params, "batch": ids[start:start + MOVE_BATCH]})
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        holds.append(time.perf_counter() - locked)
        moved += batch
    return _Moved(moved, holds)


def _move(cur: Any, which: str, params: dict[str, Any]) -> RowDigest:
    """The rows of the months that `which` names (and the keep table holds) moved to
    envelopes_kept, under a lock no agent's write holds beside (the module docstring); the
    digest of the rows moved."""
    cur.execute(f"WITH moved AS (UPDATE agentpost.envelopes e SET part_day = '-infinity'"
                f" FROM agentpost_env_keep k WHERE k.id = e.id AND {which} AND {_OLD}"
                f" RETURNING e.id) " + _DIGEST.format(rows="moved"), params)
    return _fetched(cur)


def _digest(cur: Any, where: str, params: dict[str, Any]) -> RowDigest:
    cur.execute(_DIGEST.format(rows="agentpost.envelopes") + f" {where}", params)
    return _fetched(cur)


def _fetched(cur: Any) -> RowDigest:
    count, total = cur.fetchone()
    return RowDigest(count, int(total) % MODULUS)


def _check_archived(cur: Any, exported: trail_export.Export, directory: str | None,
                    params: dict[str, Any]) -> None:
    """Every row of the months that is not kept is in the cut's copy as stored."""
    cur.execute("CREATE TEMP TABLE agentpost_env_archived (id text PRIMARY KEY, row text)")
    if directory is not None:
        for chunk in archived(exported, directory, ("id", "row")):
            buf = io.StringIO()
            for rid, row in chunk:
                buf.write(f"{_copy_text(rid)}\t{_copy_text(row)}\n")
            buf.seek(0)
            try:
                cur.copy_expert("COPY agentpost_env_archived FROM STDIN", buf)
            except psycopg2.Error as exc:
                raise InvalidInput(f"the archive's envelopes under {directory} hold an id "
                                   f"twice ({str(exc).splitlines()[0]}): nothing pruned") from None
    cur.execute(f"SELECT count(*) FROM agentpost.envelopes e"
                f" LEFT JOIN agentpost_env_archived a ON a.id = e.id"
                f" WHERE {_OLD} AND NOT EXISTS (SELECT 1 FROM agentpost_env_keep k"
                f" WHERE k.id = e.id) AND (a.id IS NULL"
                f" OR a.row IS DISTINCT FROM (to_jsonb(e) - 'part_day')::text)", params)
    missing = cur.fetchone()[0]
    if missing:
        raise InvalidInput(f"{missing} envelopes of the months to drop are not in the archive "
                           "as stored: nothing pruned; archive again")


def _drop(cur: Any, parts: list[trail_partitions.Partition], params: dict[str, Any],
          left: RowDigest, cut: date, moved: _Moved) -> Pruned:
    """Step 4 (the module docstring), in one transaction: the system chain's lock, then the
    envelopes' (so no one holds a row while it moves), the last rows kept moved, the months
    dropped, and the signed `rows_pruned` entry. `left` is the months' digest step 3 took:
    the rows that leave are those less the rows moved here."""
    cur.execute("BEGIN")
    try:
        cur.execute(f"SET LOCAL lock_timeout = {trail_partitions.LOCK_TIMEOUT_MS}")
        cur.execute("SELECT agentpost._lock_chains(ARRAY[%s])", (SYSTEM_CHAIN,))
        cur.execute("LOCK TABLE agentpost.envelopes IN ACCESS EXCLUSIVE MODE")
        locked = time.perf_counter()
        _keep_open(cur, params)
        cur.execute(f"INSERT INTO agentpost_env_keep SELECT e.id FROM agentpost.envelopes e"
                    f" WHERE {_OLD} AND e.id IN (SELECT t.envelope_id FROM agentpost.trail t"
                    f" WHERE t.id > %(horizon)s AND t.envelope_id IS NOT NULL)"
                    f" ON CONFLICT DO NOTHING", params)
        last = _move(cur, "true", params)
        gone = left - last
        dropped = trail_partitions.drop(cur, parts, rows=gone.count).rows
        kept = moved.digest + last
        if gone.count:
            body = {"kind": nr.ENVELOPE, "cut": cut.isoformat(), **gone.to_json(),
                    "partitions": [p.name for p in parts]}
            cur.execute("SELECT agentpost._trail_write(ARRAY[%s], ARRAY[%s],"
                        " ARRAY[NULL]::text[], ARRAY[%s::jsonb], true)",
                        (SYSTEM_CHAIN, nr.ROWS_PRUNED, json.dumps(body)))
        cur.execute("UPDATE agentpost.trail_prunes SET envelopes = envelopes + %s WHERE id ="
                    " (SELECT max(id) FROM agentpost.trail_prunes WHERE cut = %s)",
                    (dropped, cut))
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")
    holds = [*moved.holds, time.perf_counter() - locked]
    return Pruned(dropped, kept.count, max(holds), sum(holds))


def archived(exported: trail_export.Export, directory: str,
             columns: tuple[str, ...] = COLUMNS) -> Iterator[list[tuple]]:
    """The rows of one cut's envelope copy, `columns` of each, CHUNK at a time."""
    for _path, rows in trail_export.read_rows(Path(exported.path) / directory, columns, CHUNK):
        yield rows


def _copy_text(value: str | None) -> str:
    if value is None:
        return "\\N"
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


