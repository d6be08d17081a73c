"""The partitions of the trail, the signals, the envelopes and the routes (sql/0086 to 0090):
which months a cut lets go, and the prune that drops them.

A month's partition can go once every row in it is older than the cut: a `trail_pYYYYMM` (or
`signals_pYYYYMM`, `envelopes_pYYYYMM`, `routes_pYYYYMM`) whose month ends by the cut, and
`trail_legacy` (or the others': the rows written before partitioning) once its newest row is
older. Dropping the trail's keeps, in `trail_kept`, every entry of it that a
verification or a row check will still read (`KEEP`), so the chains go on from their heads and
the rows still open keep their history. A signal needs nothing kept: its `signal_emitted`
entry says the same, and is archived. The envelopes' and routes' rows that stay are kept by
`month_rows`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

__all__ = ["Dropped", "Partition", "drop", "droppable", "ensure_partitions", "keep", "oids"]

#: the partitioned history tables, each with `<table>_pYYYYMM` months and `<table>_legacy`,
#: and the column that says how old a row is
TABLES = {"trail": "at", "signals": "at", "envelopes": "created_at", "routes": "updated_at",
          "commands": "updated_at", "sagas": "updated_at", "saga_steps": "updated_at"}
#: the tables whose rows no statement of the store updates or deletes (but the prune's own)
APPEND_ONLY = frozenset({"trail", "signals"})
#: how long a prune waits for the trail's lock before it gives up (agents keep writing)
LOCK_TIMEOUT_MS = 10_000


class Partition(BaseModel):
    """One partition the cut lets go: its name, entries and id range."""

    model_config = ConfigDict(frozen=True)

    name: str
    entries: int
    min_id: int | None
    max_id: int | None


def ensure_partitions(cur: Any, months_ahead: int = 2) -> list[str]:
    """Make the monthly partitions through `months_ahead` months ahead; those it made."""
    cur.execute("SELECT agentpost.trail_ensure_partitions(%s)", (months_ahead,))
    return [r[0] for r in cur.fetchall()]


def droppable(cur: Any, cut: date, table: str = "trail") -> list[Partition]:
    """The partitions of `table` every row of which is older than `cut` (midnight UTC),
    legacy first, then the months, with their sizes; empty months included (they go too)."""
    if table not in TABLES:
        raise ValueError(f"not a partitioned history table: {table!r}")
    cur.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = %s::regclass ORDER BY c.relname", (f"agentpost.{table}",))
    names = [r[0] for r in cur.fetchall()]
    midnight = datetime(cut.year, cut.month, cut.day, tzinfo=UTC)
    out = []
    for name in names:
        if _month(name) is not None and _month_end(name) <= cut:
            out.append(_sized(cur, name))
        elif name == f"{table}_legacy":
            part = _sized(cur, name)
            newest = _newest(cur, table)
            if part.entries and newest is not None and newest < midnight:
                out.append(part)
    return sorted(out, key=lambda p: (not p.name.endswith("_legacy"), p.name))


def _newest(cur: Any, table: str) -> Any:
    """How old the newest row of `table`'s legacy partition is. A saga's steps go with their
    saga (they share its partition, and moving a step apart from it is refused), so their
    legacy partition is as old as the sagas'."""
    source, column = ("sagas", "updated_at") if table == "saga_steps" else (table, TABLES[table])
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"agentpost.{source}_legacy",))
    if not cur.fetchone()[0]:
        return None
    cur.execute(f"SELECT max({column}) FROM agentpost.{source}_legacy")
    return cur.fetchone()[0]


def _month(name: str) -> str | None:
    """The YYYYMM of a monthly partition's name, else None."""
    for table in TABLES:
        digits = name.removeprefix(f"{table}_p")
        if digits != name and len(digits) == 6 and digits.isdigit():
            return digits
    return None


def _month_end(name: str) -> date:
    digits = _month(name) or ""
    year, month = int(digits[:4]), int(digits[4:])
    return date(year + month // 12, month % 12 + 1, 1)


def _sized(cur: Any, name: str) -> Partition:
    if not name.startswith(("trail_", "signals_")):  # ids are text (or none): no range
        cur.execute(f"SELECT count(*), NULL, NULL FROM agentpost.{_ident(name)}")
    else:
        cur.execute(f"SELECT count(*), min(id), max(id) FROM agentpost.{_ident(name)}")
    entries, lo, hi = cur.fetchone()
    return Partition(name=name, entries=entries, min_id=lo, max_id=hi)


def _ident(name: str) -> str:
    if _month(name) is None and name not in {f"{t}_legacy" for t in TABLES}:
        raise ValueError(f"not a partition of a history table: {name!r}")
    return name


# The entries of the partitions dropped that stay (moved to trail_kept), and why:
# - each chain's last entry in them: the next entry of the chain links to it, and a
#   verification since the cut's checkpoint re-reads it as the chain's head; but for the
#   chains that leave whole (`history_archive.choose` planned them in trail_pruned_chains);
# - the system chain whole: the registry's rows are checked against all of its entries;
# - every entry of an envelope still open (not consumed, rejected or undeliverable), or named
#   by an entry that stays (a head above included): the row checks read its creation and
#   lifecycle entries, and its row stays too (`envelope_prune`);
# - the route_progress entries of routes not ended: a route named since the checkpoint is
#   told from a new one by an earlier entry naming it.
# Each is its own statement into a temporary table of ids, joined, never `x IN (subquery)`
# under an OR: Postgres cannot hash such a subquery once it outgrows work_mem and then
# rescans it for every row (measured: minutes for one month of 1.25 million envelopes). The
# part_day bounds let the planner skip the months kept; the tableoid picks the dropped.
_OLD = ("t.part_day >= '1900-01-01' AND t.part_day < %(cut)s"
        " AND t.tableoid = ANY (%(oids)s::oid[])")
KEEP = (
    "CREATE TEMP TABLE agentpost_keep (id bigint) ON COMMIT DROP",
    "CREATE TEMP TABLE agentpost_open (id text) ON COMMIT DROP",
    f"INSERT INTO agentpost_keep SELECT t.id FROM agentpost.trail t"
    f" WHERE t.chain = 'system' AND {_OLD}",
    f"INSERT INTO agentpost_keep SELECT t.id FROM agentpost.trail t"
    f" JOIN (SELECT t.chain, max(t.chain_seq) AS seq FROM agentpost.trail t WHERE {_OLD}"
    f"        GROUP BY t.chain) h ON h.chain = t.chain AND h.seq = t.chain_seq WHERE {_OLD}"
    f" AND NOT EXISTS (SELECT 1 FROM agentpost.trail_pruned_chains p WHERE p.chain = t.chain)",
    "INSERT INTO agentpost_open SELECT e.id FROM agentpost.envelopes e"
    " WHERE e.status IN ('validated', 'acknowledged') AND e.consumed_at IS NULL"
    " UNION SELECT x.envelope_id FROM agentpost.trail x"
    " WHERE x.envelope_id IS NOT NULL AND x.tableoid <> ALL (%(oids)s::oid[])"
    f" UNION SELECT t.envelope_id FROM agentpost.trail t JOIN agentpost_keep k ON k.id = t.id"
    f" WHERE t.envelope_id IS NOT NULL AND {_OLD}",
    "ANALYZE agentpost_open",
    f"INSERT INTO agentpost_keep SELECT t.id FROM agentpost.trail t"
    f" JOIN agentpost_open o ON o.id = t.envelope_id WHERE {_OLD}",
    f"INSERT INTO agentpost_keep SELECT t.id FROM agentpost.trail t"
    f" JOIN agentpost.routes r ON r.id = (t.record::jsonb -> 'body' ->> 'id')"
    f" WHERE t.event = 'route_progress' AND r.end_actor IS NULL AND {_OLD}",
)
MOVE = (f"UPDATE agentpost.trail t SET part_day = '-infinity'"
        f" FROM (SELECT DISTINCT id FROM agentpost_keep) k WHERE t.id = k.id AND {_OLD}")


def oids(cur: Any, partitions: list[Partition]) -> list[int]:
    """The table oids of `partitions` (what the statements compare `tableoid` with)."""
    cur.execute("SELECT coalesce(array_agg(('agentpost.' || n)::regclass::oid), '{}')"
                " FROM unnest(%s::text[]) n", ([_ident(p.name) for p in partitions],))
    return cur.fetchone()[0]


def keep(cur: Any, partitions: list[Partition], cut: date) -> int:
    """Move what `KEEP` keeps out of `partitions` into trail_kept; how many entries. An
    UPDATE like any other: the agents' appends go on beside it (they write this month)."""
    params = {"oids": oids(cur, partitions), "cut": cut}
    cur.execute("SET LOCAL work_mem = '256MB'")
    for statement in KEEP:
        cur.execute(statement, params)
    cur.execute(MOVE, params)
    return cur.rowcount


class Dropped(NamedTuple):
    """What `drop` did: the rows dropped, and how long it held the table's ACCESS EXCLUSIVE
    lock (every statement on the table waits that long)."""

    rows: int
    locked_s: float


def drop(cur: Any, partitions: list[Partition], rows: int | None = None,
         under_lock: Callable[[Any], None] | None = None) -> Dropped:
    """Detach and drop `partitions`, all of one table, in the caller's transaction. It takes
    the table's ACCESS EXCLUSIVE lock before any other lock on the table itself (the months'
    SHARE locks below are on the months alone), waiting at most LOCK_TIMEOUT_MS: taken as an
    upgrade of a weaker lock on the table, it would deadlock with an append that read a head
    before it and inserts after. (One table per transaction: holding one table's lock while
    waiting for another's deadlocks with a step that writes both.)

    The rows of an append-only table's months (`APPEND_ONLY`: no statement of the store
    changes them once written, and `keep` moved out what stays) are counted before that
    lock, under SHARE locks on the months alone, which no agent's step conflicts with (an
    append only reads other months) and which hold the count until the drop: under the
    table's lock, every append waited for the count (0.1 s for a warm month of 2.5 million
    entries; a cold one is read whole). The envelopes' months, whose rows agents update (an
    update by id locks every month, so a SHARE lock on one would hold every agent's write),
    are counted by the caller, beside the agents, and given as `rows`
    (`month_rows.prune`: under the lock, a count held every agent's step for as long
    as a month takes to read). `under_lock` runs once the lock is had, before the drop."""
    names = [_ident(p.name) for p in partitions]
    parents = {n.rsplit("_", 1)[0] for n in names}
    if len(parents) > 1:
        raise ValueError(f"partitions of more than one table: {sorted(parents)}")
    parent = parents.pop() if parents else "trail"
    if (rows is None) != (parent in APPEND_ONLY):
        raise ValueError(f"the rows of {parent}'s months are counted "
                         + ("here" if parent in APPEND_ONLY else "by the caller"))
    cur.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
    if rows is None:
        rows = _count(cur, names)
    cur.execute(f"LOCK TABLE agentpost.{parent} IN ACCESS EXCLUSIVE MODE")
    locked = time.perf_counter()
    if under_lock is not None:
        under_lock(cur)
    for name in names:
        cur.execute(f"ALTER TABLE agentpost.{parent} DETACH PARTITION agentpost.{name}")
        cur.execute(f"DROP TABLE agentpost.{name}")
    return Dropped(rows, time.perf_counter() - locked)


def _count(cur: Any, names: list[str]) -> int:
    """The rows of the partitions `names`, each locked SHARE first (held until the drop)."""
    rows = 0
    for name in names:
        cur.execute(f"LOCK TABLE agentpost.{name} IN SHARE MODE")
        cur.execute(f"SELECT count(*) FROM agentpost.{name}")
        rows += cur.fetchone()[0]
    return rows
