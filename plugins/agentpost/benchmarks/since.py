"""`agentpost bench since`: what the row digests cost a verification since a checkpoint.

A scratch store is filled with 200,000 envelopes of history (`growth_fill`, `--scale` shrinks
it), a checkpoint is taken, 20,000 more trail entries are written through the API (envelopes
sent, leased and acked, and a few routes moved), then `verify_trail(since=...)` is timed, in
interleaved rounds, from that checkpoint (version 2: every row named before it is looked for
through its row digests) and from the same heads signed without digests (version 1: only the
rows the new entries name, as before). Also timed: the digests' query alone, `checkpoint()`,
and the run since the checkpoint after an envelope of the history was deleted outright (its
digest differs, so every envelope the trail names is looked for). Each new query's plan is
shown (EXPLAIN ANALYZE): none may read the trail whole.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from agentpost.benchmarks import growth_fill
from agentpost.benchmarks.common import Report, median, scratch_database
from agentpost.benchmarks.leases import vacuum
from agentpost.protocol.anchor import Checkpoint
from agentpost.protocol.trail import key_pads
from agentpost.store import EnvelopeStore
from agentpost.store.queries import QUERIES
from agentpost.store.routes import RouteStore

HISTORY = 200_000
TAIL_ENVELOPES = 4_000  # sent, delivered, acknowledged, leased, consumed: 20,000 entries
ROUTES = 50
ROUNDS = 3
BATCH = 500


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    history = max(2_000, round(HISTORY * scale))
    tail = max(100, round(TAIL_ENVELOPES * scale))
    with scratch_database(dsn, "agentpost_bench_since") as bench_dsn, \
            EnvelopeStore(bench_dsn) as store:
        report = Report(f"verify_trail(since=) with and without row digests "
                        f"({history:,} envelopes of history)")
        _fill(store, history)
        setup = _routes(store)
        vacuum(bench_dsn)
        checkpoint = store.checkpoint()
        old = Checkpoint.sign(store.settings.trail_key.encode(), checkpoint.taken,
                              checkpoint.heads)
        entries = _tail(store, setup, tail)
        vacuum(bench_dsn)
        with_rows, without = [], []
        for _ in range(ROUNDS):
            with_rows.append(_timed(store, checkpoint))
            without.append(_timed(store, old))
        report.add("trail entries since the checkpoint", f"{entries:,}")
        report.add("since, version 2 (row digests)", f"{median(with_rows):.2f} s")
        report.add("since, version 1 (new entries' rows)", f"{median(without):.2f} s")
        report.add("row digests query alone", f"{_digest_seconds(store):.2f} s")
        report.add("checkpoint()", f"{_checkpoint_seconds(store):.2f} s")
        _delete_one(store)
        report.add("since, version 2, one envelope deleted",
                   f"{_timed(store, checkpoint, expect_ok=False):.2f} s")
        report.print()
        _plans(store, checkpoint)
    return 0


def _fill(store: EnvelopeStore, envelopes: int) -> None:
    with store.db.cursor() as cur:
        growth_fill.install_helpers(cur)
        growth_fill.grow(cur, growth_fill.Filled(), envelopes)


def _routes(store: EnvelopeStore) -> RouteStore:
    """A few routes before the checkpoint, to move after it (route_entries is probed)."""
    routes = RouteStore(store)
    routes.setup(["prep", "post"])
    routes.start_many([{"id": f"r-{n}", "route": {"actors": ["prep", "post"], "current": 0},
                        "payload": {"n": n}} for n in range(ROUTES)])
    return routes


def _tail(store: EnvelopeStore, routes: RouteStore, count: int) -> int:
    """`count` envelopes sent, leased and acked, and the routes moved on: the entries since."""
    before = store.db.scalar("SELECT count(*) FROM agentpost.trail")
    lead = store.create_workspace("coordinator", workspace_id=f"since-lead-{uuid.uuid4().hex[:6]}")
    inbox = store.create_workspace("worker", parent=lead.id).id
    for start in range(0, count, BATCH):
        store.send_many([{"from": lead.id, "to": inbox, "type": "directive",
                          "content": growth_fill.CONTENT}
                         for _ in range(min(BATCH, count - start))])
    while leases := store.lease(inbox, max=100, ttl=60.0):
        store.ack_many([lease.token for lease in leases])
    for hop in routes.receive("prep", max=ROUTES):
        routes.complete("prep", hop.lease, hop.envelope, [{"part": 0}, {"part": 1}])
    return int(store.db.scalar("SELECT count(*) FROM agentpost.trail")) - int(before)


def _timed(store: EnvelopeStore, since: Checkpoint, *, expect_ok: bool = True) -> float:
    started = time.perf_counter()
    result = store.verify_trail(since=since)
    seconds = time.perf_counter() - started
    if result.ok is not expect_ok or result.rows_unaccounted:
        raise RuntimeError(f"unexpected verification: {result.failure or result}")
    return seconds


def _digest_seconds(store: EnvelopeStore) -> float:
    with store.db.cursor() as cur:
        started = time.perf_counter()
        cur.execute(QUERIES["row_digests"], _pads(store))
        cur.fetchall()
        return time.perf_counter() - started


def _checkpoint_seconds(store: EnvelopeStore) -> float:
    started = time.perf_counter()
    store.checkpoint()
    return time.perf_counter() - started


def _delete_one(store: EnvelopeStore) -> None:
    with store.db.cursor() as cur:
        cur.execute("SELECT id FROM agentpost.envelopes ORDER BY seq LIMIT 1")
        (eid,) = cur.fetchone()
        cur.execute("BEGIN")
        cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute("DELETE FROM agentpost.envelopes WHERE id = %s", (eid,))
        cur.execute("COMMIT")


def _pads(store: EnvelopeStore) -> dict[str, Any]:
    import psycopg2

    from agentpost.protocol.row_digest import row_key

    ipad, opad = key_pads(row_key(store.settings.trail_key.encode()))
    return {"ipad": psycopg2.Binary(ipad), "opad": psycopg2.Binary(opad)}


def _reads_a_partition_whole(cur: Any, plan: list[str]) -> bool:
    """Whether `plan` scans a partition of the trail that holds entries sequentially (an
    empty month, scanned in no time, is not reading the trail whole)."""
    scanned = set(re.findall(r"Seq Scan on (trail\w*)", "\n".join(plan)))
    for table in scanned:
        cur.execute("SELECT EXISTS (SELECT 1 FROM agentpost." + table + ")")
        if cur.fetchone()[0]:
            return True
    return False


def _plans(store: EnvelopeStore, checkpoint: Checkpoint) -> None:
    """EXPLAIN ANALYZE of each new query, with the parameters a run gives it."""
    system = next((h.seq for h in checkpoint.heads if h.chain == "system"), 0)
    params = {"row_digests": _pads(store), "route_entries": {"routes": ["r-1", "r-2"]},
              "registry_before": {"seq": system, "rules": ["r"], "types": ["directive"]},
              "envelopes_gone": {}, "routes_gone": {}, "rights_gone": {},
              "saga_steps_gone": {}, "system_entries": {"events": ["role_defined"]}}
    with store.db.cursor() as cur:
        for name, values in params.items():
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + QUERIES[name], values)
            plan = [row[0] for row in cur.fetchall()]
            whole = _reads_a_partition_whole(cur, plan)
            print(f"\n-- {name}{' (READS THE TRAIL WHOLE)' if whole else ''}")
            print("\n".join(plan))
