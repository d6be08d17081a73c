"""The rows under the trail, since a checkpoint (WACP §3 Integrity): every row the trail
names must exist, whenever it was named, without reading the entries before the checkpoint.

A checkpoint (version 2) holds a digest of each kind of row (`protocol.row_digest`: a count
and a sum of keyed hashes), taken in its heads' snapshot. A run since it computes the digest
each table should have now, from the checkpoint's and the rows the new entries create or
remove (`expected`), and the digest it has (`table_digests`, one query). Where the two agree,
no row of that kind is gone. Where they differ (a row deleted, or replaced by another, or
its id changed; or rows added outside the store), every row of that kind the trail names is
looked for (`named_anew`), as a full run would, but through indexes, not the entries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg2

from agentpost.protocol import named_rows as nr
from agentpost.protocol.anchor import Checkpoint
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.named_rows import KINDS, RowKey, body_rows, chain_row
from agentpost.protocol.row_digest import MODULUS, RowDigest, row_hash, row_key
from agentpost.protocol.trail import key_pads
from agentpost.store.queries import QUERIES
from agentpost.store.row_checks import Touched

#: what a verification since a checkpoint found of the rows named before it
ALL_ROWS = "all"
NEW_ROWS = "named since"
#: kinds whose rows only the system chain's bodies name (rules by their own chains too)
_REGISTRY_KINDS = frozenset({nr.RULE, nr.ROLE, nr.TYPE})


def table_digests(cur: Any, key: bytes) -> dict[str, RowDigest]:
    """Every kind's digest as its table stands, in the caller's snapshot."""
    ipad, opad = key_pads(row_key(key))
    cur.execute(QUERIES["row_digests"], {"ipad": psycopg2.Binary(ipad),
                                         "opad": psycopg2.Binary(opad)})
    found = {kind: RowDigest(count, int(total) % MODULUS)
             for kind, count, total in cur.fetchall()}
    return {kind: found.get(kind, RowDigest()) for kind in KINDS}


def expected(cur: Any, since: Checkpoint, base: dict[str, RowDigest], touched: Touched,
             key: bytes) -> dict[str, RowDigest]:
    """The digests the tables should have now: `base` (`since`'s), plus the rows the
    entries read since it created, minus the rules they removed and the rows the prunes
    since dropped (their `rows_pruned` entries)."""
    added: dict[str, set[RowKey]] = {kind: set() for kind in KINDS}
    removed: dict[str, set[RowKey]] = {kind: set() for kind in KINDS}
    for kind, row in touched.born:
        added[kind].add(row)
    added[nr.ROUTE] |= _new_routes(cur, since, touched.ids(nr.ROUTE))
    born, gone = _registry(cur, since, touched.registry)
    for kind, row in born:
        added[kind].add(row)
    for kind, row in gone:
        removed[kind].add(row)
    secret = row_key(key)
    want = {kind: base[kind].plus(row_hash(secret, r) for r in added[kind])
                            .minus(row_hash(secret, r) for r in removed[kind])
            for kind in KINDS}
    for kind, left in touched.pruned:  # the rows a prune since dropped, as it counted them
        want[kind] -= left
    return want


def _new_routes(cur: Any, since: Checkpoint, routes: list[str]) -> set[str]:
    """The routes among `routes` that no `route_progress` entry before `since` names."""
    if not routes:
        return set()
    anchored = {h.chain: h.seq for h in since.heads}
    cur.execute(QUERIES["route_entries"], {"routes": routes})
    old = {route for route, chain, seq in cur.fetchall() if seq <= anchored.get(chain, 0)}
    return set(routes) - old


def _registry(cur: Any, since: Checkpoint, changes: list[tuple[int, str, str, str]]
              ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The rules and types the registry changes since `since` created, and the rules they
    removed: each rule's state at the checkpoint (and a type's existence) is read from the
    system chain before it, then the changes are played in order."""
    if not changes:
        return set(), set()
    wanted = {kind: sorted({row for _, _, k, row in changes if k == kind})
              for kind in (nr.RULE, nr.TYPE)}
    seq = next((h.seq for h in since.heads if h.chain == SYSTEM_CHAIN), 0)
    cur.execute(QUERIES["registry_before"], {"seq": seq, "rules": wanted[nr.RULE],
                                             "types": wanted[nr.TYPE]})
    live: dict[tuple[str, str], bool] = {}
    for _seq, event, row in cur.fetchall():
        kind = nr.TYPE if event in ("type_registered", "builtin") else nr.RULE
        live[(kind, row)] = event != nr.RULE_REMOVED
    before = dict(live)
    for _seq, event, kind, row in sorted(changes):
        live[(kind, row)] = event != nr.RULE_REMOVED
    born = {r for r, now in live.items() if now and not before.get(r, False)}
    gone = {r for r, now in live.items() if not now and before.get(r, False)}
    return born, gone


def named_anew(cur: Any, kinds: Iterable[str], chains: Iterable[str]) -> Touched:
    """For each kind of `kinds`, the rows of it the whole trail names, as a Touched to look
    for: for envelopes, routes, port rights and saga steps, only those already found gone
    (an anti-join on an index); the chains (every one in the snapshot) for commands, sagas,
    rules and workspaces; the system chain's registry entries for rules, roles and types."""
    wanted = set(kinds)
    out = Touched()
    if nr.ENVELOPE in wanted:
        cur.execute(QUERIES["envelopes_gone"])
        out.envelopes.update(cur.fetchall())
    for kind, query in ((nr.ROUTE, "routes_gone"), (nr.PORT_RIGHT, "rights_gone")):
        if kind in wanted:
            cur.execute(QUERIES[query])
            out.named.update({(kind, row): chain for row, chain in cur.fetchall()})
    if nr.SAGA_STEP in wanted:
        cur.execute(QUERIES["saga_steps_gone"])
        out.named.update({(nr.SAGA_STEP, (saga, step)): f"saga:{saga}"
                          for saga, step in cur.fetchall()})
    out.chains.update(c for c in chains if _chain_kind(c) in wanted)
    events = [event for event, fields in nr.BODY_FIELDS.items()
              if any(kind in wanted & _REGISTRY_KINDS for kind, _ in fields)]
    if events:
        cur.execute(QUERIES["system_entries"], {"events": events})
        for chain, event, record in cur.fetchall():
            for row in body_rows(chain, event, record):
                out.named.setdefault(row, chain)
    return out


def _chain_kind(chain: str) -> str | None:
    row = chain_row(chain)
    return None if row is None else row[0]


@dataclass
class RowsSince:
    """What a run since a checkpoint checked of the rows named before it: all of them
    (`ALL_ROWS`, through the checkpoint's digests) or, from a version 1 checkpoint, none
    (`NEW_ROWS`: only the rows the new entries name). `table` is what the tables hold now."""

    mode: str
    table: dict[str, RowDigest] | None = None
    expected: dict[str, RowDigest] | None = None
    differ: list[str] = field(default_factory=list)

    def unaccounted(self, gone: Iterable[tuple[str, RowKey]], key: bytes) -> list[str]:
        """The kinds whose table still differs from what the trail accounts for once the
        rows found `gone` are taken off: rows added (or changed into others) outside the
        store."""
        if self.table is None or self.expected is None:
            return []
        secret = row_key(key)
        hashes: dict[str, list[int]] = {kind: [] for kind in KINDS}
        for kind, row in gone:
            hashes[kind].append(row_hash(secret, row))
        return [kind for kind in self.differ
                if self.expected[kind].minus(hashes[kind]) != self.table[kind]]


def rows_since(cur: Any, key: bytes, since: Checkpoint, touched: Touched,
               chains: Iterable[str]) -> tuple[RowsSince, Touched]:
    """Compare the tables with `since`'s digests brought up to date by `touched` (the
    entries read since it). Returns what was done and the rows to look for: those `touched`
    names and, of each kind whose digest differs, every one the trail names."""
    base = since.row_digests
    if base is None:
        return RowsSince(NEW_ROWS), touched
    table = table_digests(cur, key)
    want = expected(cur, since, base, touched, key)
    differ = [kind for kind in KINDS if want[kind] != table[kind]]
    if not differ:
        return RowsSince(ALL_ROWS, table, want), touched
    look = Touched()
    look.update(touched)
    look.update(named_anew(cur, differ, chains))
    return RowsSince(ALL_ROWS, table, want, differ), look
