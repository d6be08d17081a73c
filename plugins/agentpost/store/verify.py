"""Verifying the trail (WACP §3 Integrity): whole, or since a verified signed checkpoint, on
one connection or on several that share one snapshot.

The work is a list of spans, one per chain: where its check starts (seq 1, or the head a
`since` checkpoint anchors, re-read and compared) and how many entries that is, known from
the chain's head before anything is read. Spans are read as range scans of the trail's
unique index (chain, chain_seq): a long chain on its own cursor, short ones many to a query.
With `workers` > 1 the spans are shared out by entry count among processes (the checks are
CPU-bound Python and hold the GIL), each in a REPEATABLE READ transaction that imports the
coordinator's exported snapshot, so every part sees the same trail. The rows under the
trail are then checked in the coordinator's snapshot (store/row_checks.py): every row named
by the entries read must exist (since a checkpoint, every row named before it too, through
its row digests: store/row_digests.py), and the rows signed under the trail (sql/0017:
envelopes, commands, routes) must be as signed: all of them, or since a checkpoint those that
the new entries name.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg2

from agentpost.pg.db import Database, one_line, translate
from agentpost.protocol.anchor import ChainHead, Checkpoint
from agentpost.protocol.errors import AgentpostError, StoreError
from agentpost.protocol.models import ChainMismatch, MissingRow
from agentpost.protocol.trail import ChainCheck, StoredEntry
from agentpost.store.anchor import anchor_mismatches
from agentpost.store.queries import QUERIES
from agentpost.store.row_checks import Touched, check_missing, check_rows
from agentpost.store.row_digests import RowDigest, RowsSince, rows_since, table_digests

#: a chain with more entries to read than this gets a cursor of its own (no sort at all)
LONG_CHAIN = 20_000
#: short chains are read this many entries (or chains) to a query
BATCH_ENTRIES = 20_000
BATCH_CHAINS = 2_000
#: rows fetched per round trip
FETCH = 5_000
MAX_WORKERS = 32
#: missing rows a TrailVerification names (each one is counted among its failures)
MAX_NAMED_ROWS = 100
_WORKER = "from agentpost.store.verify import _worker_main; _worker_main()"


@dataclass(frozen=True)
class Span:
    """One chain's part of a verification: entries from `start` on (`count` of them, head
    included); with `anchored`, entry `start` is a checkpoint's head and must hash to it."""

    chain: str
    start: int
    count: int
    anchored: bytes | None = None


def plan(cur: Any, since: Checkpoint | None, skip: set[str]) -> list[Span]:
    """Every chain's span in the caller's snapshot: from seq 1, or from the head `since`
    anchors (chains in `skip`, already reported against it, are left out)."""
    anchored = {} if since is None else {h.chain: h for h in since.heads}
    cur.execute(QUERIES["chain_heads"])
    spans = []
    for chain, seq, _digest in cur.fetchall():
        if chain in skip:
            continue
        head = anchored.get(chain)
        if head is None:
            spans.append(Span(chain, 1, seq))
        else:
            spans.append(Span(chain, head.seq, seq - head.seq + 1, head.hash))
    return spans


def check_spans(cur: Any, key: bytes, spans: list[Span], births: bool = False
                ) -> tuple[ChainCheck, Touched]:
    """Check `spans` in the caller's snapshot: every entry's hash, signature, columns and
    link, each anchored head against its checkpoint; and note the rows the entries name
    (with `births`, and those they create)."""
    check, touched = ChainCheck(key), Touched(births=births)
    for batch in _batches(spans):
        by_chain = {s.chain: s for s in batch}
        for e in _entries(cur, batch):
            span = by_chain[e.chain]
            if span.anchored is not None and e.seq == span.start:
                check.resume(e, span.anchored)
            else:
                check.feed(e)
                touched.note(e)
    return check, touched


def _batches(spans: list[Span]) -> Iterator[list[Span]]:
    batch: list[Span] = []
    size = 0
    for span in spans:
        if span.count > LONG_CHAIN:
            yield [span]
            continue
        batch.append(span)
        size += span.count
        if size >= BATCH_ENTRIES or len(batch) >= BATCH_CHAINS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _entries(cur: Any, batch: list[Span]) -> Iterator[StoredEntry]:
    if len(batch) == 1 and batch[0].count > LONG_CHAIN:
        query, params = QUERIES["verify_chain"], {"chain": batch[0].chain,
                                                  "start": batch[0].start}
    else:
        query, params = QUERIES["verify_chains"], {"chains": [s.chain for s in batch],
                                                   "starts": [s.start for s in batch]}
    cur.execute("DECLARE verify_cursor NO SCROLL CURSOR FOR " + query, params)
    try:
        while True:
            cur.execute(f"FETCH {FETCH} FROM verify_cursor")
            rows = cur.fetchall()
            if not rows:
                return
            for r in rows:
                yield StoredEntry(id=r[0], chain=r[1], seq=r[2], event=r[3], envelope_id=r[4],
                                  at_us=r[5], record=r[6], prev_hash=bytes(r[7]),
                                  hash=bytes(r[8]), mac=bytes(r[9]))
    finally:
        cur.execute("CLOSE verify_cursor")


def share(spans: list[Span], workers: int) -> list[list[Span]]:
    """Spans in `workers` parts of about equal entry counts (largest first, each to the
    lightest part), each part in chain order."""
    parts: list[list[Span]] = [[] for _ in range(min(workers, len(spans)) or 1)]
    loads = [0] * len(parts)
    for span in sorted(spans, key=lambda s: s.count, reverse=True):
        i = loads.index(min(loads))
        parts[i].append(span)
        loads[i] += span.count
    return [sorted(p, key=lambda s: s.chain) for p in parts if p]


def check_in_snapshot(dsn: str, key: bytes, snapshot: str, spans: list[Span],
                      births: bool = False) -> tuple[ChainCheck, Touched]:
    """`check_spans` on a connection of its own, in the exported `snapshot` (a worker)."""
    try:
        conn = psycopg2.connect(dsn, application_name="agentpost-verify")
    except psycopg2.Error as exc:
        raise translate(exc) from None
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            result = check_spans(cur, key, spans, births)
            cur.execute("COMMIT")
            return result
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()


def check_parallel(cur: Any, dsn: str, key: bytes, spans: list[Span], workers: int, *,
                   threads: bool = False, births: bool = False) -> tuple[ChainCheck, Touched]:
    """`check_spans` shared out among `workers` processes (or threads: measured slower, the
    checks hold the GIL) in the snapshot of `cur`'s transaction, exported; it stays open
    until every worker is done."""
    cur.execute("SELECT pg_export_snapshot()")
    snapshot = cur.fetchone()[0]
    parts = share(spans, workers)
    run_part = check_in_snapshot if threads else _check_in_process
    check, touched = ChainCheck(key), Touched()
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        futures = [pool.submit(run_part, dsn, key, snapshot, p, births) for p in parts]
        for future in futures:
            part, seen = future.result()
            check.merge(part)
            touched.update(seen)
    return check, touched


def _check_in_process(dsn: str, key: bytes, snapshot: str, spans: list[Span],
                      births: bool) -> tuple[ChainCheck, Touched]:
    """`check_in_snapshot` in a new interpreter (`_worker_main`), its
    arguments and result pickled over pipes: unlike multiprocessing, it never re-imports
    the caller's main module, so a script or an Airflow task needs no `__main__` guard."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", _WORKER], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(pickle.dumps((dsn, key, snapshot, spans, births)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or not out:
        last = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise StoreError(f"a trail verification worker failed: {one_line(last)}")
    status, value = pickle.loads(out)
    if status == "error":
        raise value
    return value


def _worker_main() -> None:
    """A worker process: arguments pickled on stdin, ("ok", result) or ("error", a typed
    agentpost error) pickled on stdout."""
    dsn, key, snapshot, spans, births = pickle.load(sys.stdin.buffer)
    try:
        result: tuple[str, Any] = ("ok", check_in_snapshot(dsn, key, snapshot, spans, births))
    except AgentpostError as exc:
        result = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()


def run(db: Database, key: bytes, *, since: Checkpoint | None, anchor: Checkpoint | None,
        workers: int) -> Outcome:
    """One verification in one snapshot (see the module docstring); `since` and `anchor`
    already loaded and their signatures checked."""
    with db.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            return _run(cur, db.dsn, key, since, anchor, workers)
        finally:
            cur.execute("COMMIT")


def _run(cur: Any, dsn: str, key: bytes, since: Checkpoint | None,
         anchor: Checkpoint | None, workers: int) -> Outcome:
    # the snapshot's time, and a flush of every commit it sees (as a checkpoint's): the
    # heads this run verifies may become the next run's `since`
    cur.execute(QUERIES["verify_start"])
    taken_at = cur.fetchone()[0]
    gaps = ChainCheck(key)
    behind = [] if since is None else anchor_mismatches(cur, gaps, since)
    spans = plan(cur, since, {m.chain for m in behind})
    births = since is not None and since.rows is not None
    if workers > 1 and len(spans) > 1:
        check, touched = check_parallel(cur, dsn, key, spans, workers, births=births)
    else:
        check, touched = check_spans(cur, key, spans, births)
    check.merge(gaps)
    rows, look = None, touched
    if since is not None:
        chains = [s.chain for s in spans] + [m.chain for m in behind if m.seq > 0]
        rows, look = rows_since(cur, key, since, touched, chains)
    missing, gone = check_missing(cur, check, look)
    check_rows(cur, check, None if since is None else touched)
    outcome = Outcome(check, taken_at, since, behind, missing=missing, rows=rows)
    if rows is not None:
        outcome.unaccounted = rows.unaccounted(gone, key)
    if anchor is not None:
        from agentpost.store.anchor import check_anchor

        outcome.anchored = check_anchor(cur, check, anchor)
    if since is None and not check.failures:
        outcome.digests = table_digests(cur, key)
    elif rows is not None:
        outcome.digests = rows.table
    return outcome


@dataclass
class Outcome:
    """What a run found, before it becomes a TrailVerification."""

    check: ChainCheck
    taken_at: datetime
    since: Checkpoint | None = None
    since_mismatches: list[ChainMismatch] = field(default_factory=list)
    missing: list[MissingRow] = field(default_factory=list)
    anchored: dict[str, Any] = field(default_factory=dict)
    #: since a checkpoint: what was checked of the rows named before it
    rows: RowsSince | None = None
    #: kinds whose table holds rows the trail does not account for (not failures)
    unaccounted: list[str] = field(default_factory=list)
    #: the tables' row digests, when this run vouches for them: a full run, or one since a
    #: checkpoint that has them (one without them checked no row named before it)
    digests: dict[str, RowDigest] | None = None

    def verified_checkpoint(self) -> Checkpoint | None:
        """The signed heads (and row digests) this run verified (None if it failed): the
        `since` of the next."""
        if self.check.failures:
            return None
        heads = [ChainHead(c, seq, digest) for c, (seq, digest) in self.check.heads().items()]
        return Checkpoint.sign(self.check.key, self.taken_at, heads, self.digests)
