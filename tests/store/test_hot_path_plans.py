"""The hot path's plans on a long-lived store (issue "Flat cost as the store grows").

A store is built with a million envelopes of history (consumed, dead-lettered, rejected:
80/10/10, spread over the leased inbox and others) and a backlog elsewhere: a million
delivered and unleased in one inbox (the issue's case), more in another, some leased by other
consumers, some queued for a suspended inbox; all written with INSERT ... SELECT
generate_series. Then the store's own calls (lease, ack, nack, heartbeat,
the leasable count, the expiry sweep, delivery on resume, redelivery) run on a session that
has auto_explain print the plan (FORMAT JSON) of every statement they execute, nested ones
included: the statements exactly as the store issues them, generic plans and real
parameters. This runs three times: with statistics taken while the store was small and its
inboxes full (stale), with no statistics at all, and after ANALYZE (fresh).

The property held each time: every read of the envelopes table on these paths goes through
the primary key or a hot partial index (envelopes_ready, envelopes_leased, envelopes_pending:
what waits or is in flight); no sequential scan, and no index that holds the history. The
lease claim is an ordered index scan of the inbox's part of envelopes_ready under its LIMIT;
ack reads and writes its envelopes by primary key only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.store import EnvelopeStore
from dbtools import Plans, connect, partition_roots, plan_nodes, rows, table_reads

HISTORY = 1_000_000
BACKLOG = 1_000_000  # waiting, unleased, in one other inbox
SMALL = 20_000  # waiting, unleased, in another
IN_FLIGHT = 2_000  # leased by other consumers, live
QUEUED = 2_000  # validated, for a suspended inbox
EARLY = 50  # sent through the store to each inbox before the history

#: the indexes that hold only what waits or is in flight, and the primary key
HOT = {"envelopes_ready", "envelopes_leased", "envelopes_pending"}
ALLOWED = HOT | {"envelopes_pkey"}

_HISTORY_SQL = """
INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format, content,
    priority, origin, status, reason, created_at, delivered_at, consumed_at, attempts, leases,
    redeliveries, first_leased_at)
SELECT 'h-' || g, nextval('agentpost.envelope_seq'), %(sender)s,
       (%(inboxes)s::text[])[1 + g %% cardinality(%(inboxes)s::text[])], 'system',
       'directive', 'text', 'done', CASE WHEN g %% 7 = 0 THEN 'urgent' ELSE 'normal' END,
       'agent', k.status, k.reason, t, CASE WHEN k.status <> 'rejected' THEN t END,
       CASE WHEN k.status = 'acknowledged' THEN t END, 1,
       CASE WHEN k.status = 'rejected' THEN 0 ELSE 1 END,
       CASE WHEN k.status = 'undeliverable' THEN 4 ELSE 0 END,
       CASE WHEN k.status <> 'rejected' THEN t END
  FROM generate_series(1, %(n)s) g
 CROSS JOIN LATERAL (SELECT now() - interval '1 day' + g * interval '1 millisecond' AS t) ts
 CROSS JOIN LATERAL (SELECT CASE WHEN g %% 10 < 8 THEN 'acknowledged'
                                 WHEN g %% 10 = 8 THEN 'undeliverable' ELSE 'rejected' END
                                AS status,
                            CASE g %% 10 WHEN 8 THEN 'redelivery_exhausted'
                                         WHEN 9 THEN 'permission_denied' END AS reason) k
"""

_BACKLOG_SQL = """
INSERT INTO agentpost.envelopes (id, seq, sender, recipient, originator, type, format, content,
    priority, origin, status, created_at, delivered_at, attempts, leases, lease_token,
    lease_holder, lease_until)
SELECT %(prefix)s || g, nextval('agentpost.envelope_seq'), %(sender)s, %(inbox)s, 'system',
       'directive', 'text', 'waiting', 'normal', 'agent', %(status)s, now(),
       CASE WHEN %(status)s = 'acknowledged' THEN now() END, 1,
       CASE WHEN %(leased)s THEN 1 ELSE 0 END,
       CASE WHEN %(leased)s THEN gen_random_uuid() END,
       CASE WHEN %(leased)s THEN 'someone-else' END,
       CASE WHEN %(leased)s THEN now() + interval '1 hour' END
  FROM generate_series(1, %(n)s) g
"""


def assert_hot(plans: list[dict[str, Any]], what: str, roots: dict[str, str], conn: Any
               ) -> list[tuple[str, str, str, str]]:
    """Every read of envelopes (each of its monthly partitions, sql/0088) goes through the
    primary key or a hot partial index; but a partition that holds no row (a month ahead,
    the kept rows of a store never pruned) may be scanned whole: that reads nothing."""
    reads = table_reads(plans, "envelopes", roots)
    assert reads, f"{what}: no read of envelopes was explained"
    bad = [r for r in reads if r[2] not in ALLOWED and not _empty_partition(r, conn)]
    assert not bad, f"{what} reads envelopes outside the hot indexes: {bad}"
    return reads


def _empty_partition(read: tuple[str, str, str, str], conn: Any) -> bool:
    if read[1] != "Seq Scan" or read[3] in ("", "envelopes"):
        return False
    return rows(conn, f"SELECT NOT EXISTS (SELECT 1 FROM agentpost.{read[3]})")[0][0]


def _statement(plans: list[dict[str, Any]], pattern: str) -> dict[str, Any]:
    matching = [p for p in plans if re.search(pattern, p["Query Text"], re.S)]
    assert matching, f"no statement matching {pattern!r} was executed"
    return matching[0]


@pytest.fixture(scope="module")
def big(module_dsn: str) -> Iterator[dict[str, Any]]:
    """A store whose statistics were taken while it was small and its inboxes full, then
    grown by a million envelopes of history and a backlog elsewhere (no ANALYZE since)."""
    with EnvelopeStore(module_dsn) as store:
        lead = store.create_workspace("coordinator", workspace_id="lead").id
        names = ("hot", "small", "busy", "flight", "late", "parked")
        ws = {n: store.create_workspace("worker", parent=lead, workspace_id=n).id
              for n in names}
        # a small store with full inboxes, analysed: stale statistics once it has grown
        for n in names:
            store.send_many([{"from": lead, "to": ws[n], "type": "directive",
                              "content": "early"}] * EARLY)
        conn = connect(module_dsn)
        try:
            rows(conn, "ANALYZE agentpost.envelopes")
            rows(conn, _HISTORY_SQL, {"sender": lead, "n": HISTORY,
                                      "inboxes": [ws["hot"], ws["small"], ws["busy"]]})
            for prefix, inbox, status, leased, n in (
                    ("b-", ws["busy"], "acknowledged", False, BACKLOG),
                    ("s-", ws["small"], "acknowledged", False, SMALL),
                    ("f-", ws["flight"], "acknowledged", True, IN_FLIGHT),
                    ("q-", ws["parked"], "validated", False, QUEUED)):
                rows(conn, _BACKLOG_SQL, {"prefix": prefix, "inbox": inbox, "status": status,
                                          "leased": leased, "n": n, "sender": lead})
            store.transition(ws["parked"], "suspended")
            yield {"dsn": module_dsn, "lead": lead, "ws": ws, "conn": conn}
        finally:
            conn.close()


def _drain_inbox(store: EnvelopeStore, ws: str) -> None:
    while leases := store.lease(ws, max=500):
        store.ack_many([lease.token for lease in leases])


def _exercise(big: dict[str, Any], label: str) -> None:
    """Run every hot-path call on the big store and hold the property on its plans; check
    lease and ack hand out the right envelopes in the right order."""
    lead, ws = big["lead"], big["ws"]
    with EnvelopeStore(big["dsn"], pool_size=1) as store:
        _drain_inbox(store, ws["hot"])  # the 50 early ones
        normal = [r.envelope_id for r in store.send_many(
            [{"from": lead, "to": ws["hot"], "type": "directive", "content": f"n{i}"}
             for i in range(150)])]
        urgent = [r.envelope_id for r in store.send_many(
            [{"from": lead, "to": ws["hot"], "type": "directive", "content": f"u{i}",
              "priority": "urgent"} for i in range(20)])]
        store.transition(ws["late"], "suspended")
        store.send_many([{"from": lead, "to": ws["late"], "type": "directive",
                          "content": f"l{i}"} for i in range(30)])
        plans = Plans(store.db.cursor)
        roots = partition_roots(big["conn"])

        count, p = plans.of(lambda: store.leasable(ws["hot"]))
        assert count == 170
        reads = assert_hot(p, f"{label}: leasable", roots, big["conn"])
        assert {r[2] for r in reads} == {"envelopes_ready"}
        assert all("recipient" in r[3] for r in reads), reads

        leases, p = plans.of(lambda: store.lease(ws["hot"], max=100, holder="c1"))
        assert [lease.envelope.id for lease in leases] == urgent + normal[:80]
        assert_hot(p, f"{label}: lease", roots, big["conn"])
        claim = _statement(p, r"LIMIT p_max\s+FOR UPDATE SKIP LOCKED")
        # one ordered scan of each month's part of envelopes_ready, merged in order, under
        # the LIMIT (no sort: Merge Append keeps the index's order)
        scans = [n for n in plan_nodes(claim["Plan"]) if n.get("Index Name")]
        assert {(n["Node Type"], roots.get(n["Index Name"], n["Index Name"]))
                for n in scans} == {("Index Scan", "envelopes_ready")}, scans
        assert all("recipient" in n["Index Cond"] for n in scans), scans
        assert any(n["Node Type"] == "Limit" for n in plan_nodes(claim["Plan"]))
        assert not any(n["Node Type"] == "Sort" for n in plan_nodes(claim["Plan"]))

        acked, p = plans.of(lambda: store.ack_many([lease.token for lease in leases]))
        assert acked == 100
        reads = assert_hot(p, f"{label}: ack", roots, big["conn"])
        assert {r[2] for r in reads} == {"envelopes_pkey"}, reads

        leases, p = plans.of(lambda: store.lease(ws["hot"], max=100, holder="c2"))
        assert [lease.envelope.id for lease in leases] == normal[80:]
        assert_hot(p, f"{label}: second lease", roots, big["conn"])
        _, p = plans.of(lambda: store.heartbeat(leases[0].token, ttl=60))
        reads = assert_hot(p, f"{label}: heartbeat", roots, big["conn"])
        assert {r[2] for r in reads} == {"envelopes_pkey"}
        nacked, p = plans.of(lambda: store.nack(leases[0].token))
        assert nacked.redeliveries == 1
        assert_hot(p, f"{label}: nack", roots, big["conn"])
        _, p = plans.of(lambda: store.ack_many([lease.token for lease in leases[1:]]))
        assert_hot(p, f"{label}: second ack", roots, big["conn"])
        last = store.lease(ws["hot"], max=10, ttl=0.001)
        assert [lease.envelope.id for lease in last] == [normal[80]]  # the nacked one
        time.sleep(0.05)

        result, p = plans.of(store.expire_leases)
        assert result["expired"] == 1
        assert_hot(p, f"{label}: expire_leases", roots, big["conn"])

        result, p = plans.of(lambda: store.transition(ws["late"], "active"))
        assert result["delivered"] == 30
        reads = assert_hot(p, f"{label}: delivery on resume", roots, big["conn"])
        assert "envelopes_pending" in {r[2] for r in reads}

        _, p = plans.of(store.redeliver)
        assert_hot(p, f"{label}: redeliver", roots, big["conn"])
        assert store.leasable(ws["small"]) == SMALL + EARLY
        _drain_inbox(store, ws["hot"])
        _drain_inbox(store, ws["late"])


@pytest.mark.slow
def test_hot_path_plans_stay_on_hot_indexes_as_history_grows(big: dict[str, Any]):
    """Issue "Flat cost as the store grows", property: with a million envelopes of history
    and a backlog in other inboxes, lease, ack, nack, heartbeat, the leasable count, the
    expiry sweep, delivery and redelivery read envelopes only through the primary key or a
    hot partial index (what waits or is in flight) under stale, missing and fresh
    statistics; the lease claim is an ordered index scan of the inbox's part of
    envelopes_ready under its LIMIT, and ack probes the primary key only. Lease and ack hand
    out the right envelopes in processing order on that store."""
    conn = big["conn"]
    _exercise(big, "stale statistics (analysed while small)")
    tree = "SELECT relid FROM pg_partition_tree('agentpost.envelopes')"  # and its months
    rows(conn, f"DELETE FROM pg_statistic WHERE starelid IN ({tree})")
    rows(conn, f"UPDATE pg_class SET reltuples = -1 WHERE oid IN ({tree})")
    _exercise(big, "no statistics")
    rows(conn, "ANALYZE agentpost.envelopes")
    _exercise(big, "fresh statistics")
    assert rows(conn, "SELECT count(*) FROM agentpost.envelopes")[0][0] > HISTORY
