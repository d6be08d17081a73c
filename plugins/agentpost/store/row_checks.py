"""The rows under the trail, checked against it (WACP §3 Integrity): each row the entries
name must exist (a row deleted outright), and the envelope, command and route rows must be
as their last entries signed them (a row edited in the table, or a chain's end cut off).

A verification notes, as it reads the entries, the rows they name (`Touched`); the rows are
then checked in its snapshot: all of them on a full run, or on a run since a checkpoint those
the new entries name, and every row of a kind whose digest changed (store/row_digests.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agentpost.protocol import named_rows as nr
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.models import MissingRow
from agentpost.protocol.named_rows import (
    KINDS,
    ROWS_PRUNED,
    RowKey,
    body_rows,
    born_rows,
    chain_row,
    label,
    registry_change,
)
from agentpost.protocol.row_digest import RowDigest, pruned
from agentpost.protocol.trail import ChainCheck, StoredEntry
from agentpost.store.queries import QUERIES

#: ids per kind per row-check query
ID_BATCH = 5_000
#: the query parameter of each kind named in a body or a chain (saga steps take two)
_PARAMS = {nr.COMMAND: "commands", nr.SAGA: "sagas", nr.RULE: "rules",
           nr.WORKSPACE: "workspaces", nr.ROUTE: "routes", nr.PORT_RIGHT: "rights",
           nr.ROLE: "roles", nr.TYPE: "types"}


@dataclass
class Touched:
    """The rows that the entries checked name (`protocol.named_rows`): envelopes by id, the
    chains the entries are in (which name commands, sagas, rules, workspaces), and the rows
    their bodies name; each with the chain of an entry naming it (the smallest name). With
    `births`, also the rows they create (`born`) and the system chain's rule and type
    events, by seq (`registry`): what a run since a checkpoint adds to its row digests (a
    full run needs neither, and would hold a key per envelope for nothing)."""

    envelopes: dict[str, str] = field(default_factory=dict)
    chains: set[str] = field(default_factory=set)
    named: dict[tuple[str, RowKey], str] = field(default_factory=dict)
    born: set[tuple[str, RowKey]] = field(default_factory=set)
    registry: list[tuple[int, str, str, str]] = field(default_factory=list)
    #: the rows the prunes since dropped, per `rows_pruned` entry (sql/0088)
    pruned: list[tuple[str, RowDigest]] = field(default_factory=list)
    births: bool = False

    def note(self, e: StoredEntry) -> None:
        if e.envelope_id is not None:
            self.envelopes.setdefault(e.envelope_id, e.chain)
        self.chains.add(e.chain)
        for row in body_rows(e.chain, e.event, e.record):
            self.named.setdefault(row, e.chain)
        if not self.births:
            return
        self.born.update(born_rows(e.chain, e.seq, e.event, e.envelope_id, e.record))
        if e.chain == SYSTEM_CHAIN:
            change = registry_change(e.event, e.record)
            if change is not None:
                self.registry.append((e.seq, e.event, *change))
            left = pruned(e.record) if e.event == ROWS_PRUNED else None
            if left is not None:
                self.pruned.append(left)

    def update(self, other: Touched) -> None:
        _merge(self.envelopes, other.envelopes)
        self.chains |= other.chains
        _merge(self.named, other.named)
        self.born |= other.born
        self.registry.extend(other.registry)
        self.pruned.extend(other.pruned)

    def rows(self) -> dict[tuple[str, RowKey], str]:
        """Every (kind, key) named, but envelopes, with its chain."""
        out = dict(self.named)
        for chain in self.chains:
            row = chain_row(chain)
            if row is not None:
                out.setdefault(row, chain)
        return out

    def ids(self, kind: str) -> list[str]:
        """The ids of `kind` named (envelope, command, route), sorted."""
        if kind == nr.ENVELOPE:
            return sorted(self.envelopes)
        return sorted(k for (c, k), _chain in self.rows().items() if c == kind)


def _merge(into: dict[Any, str], other: dict[Any, str]) -> None:
    for key, chain in other.items():
        mine = into.get(key)
        if mine is None or chain < mine:
            into[key] = chain


# -- rows that must exist -----------------------------------------------------------------

def check_missing(cur: Any, check: ChainCheck, touched: Touched
                  ) -> tuple[list[MissingRow], list[tuple[str, RowKey]]]:
    """Every row `touched` names that is gone, as a failure of `check` (in the chain of an
    entry naming it) and in the lists returned (as reported, and as (kind, key)), in the
    order of `KINDS` then id."""
    rows = touched.rows()
    wanted = {kind: [] for kind in KINDS}
    wanted[nr.ENVELOPE] = sorted(touched.envelopes)
    for kind, key in sorted(rows, key=lambda r: (r[0], _text(r[1]))):
        wanted[kind].append(key)
    found: list[tuple[str, RowKey]] = []
    for params in _batches(wanted):
        cur.execute(QUERIES["missing_rows"], params)
        found.extend((kind, key if step is None else (key, step))
                     for kind, key, step in cur.fetchall())
    found.sort(key=lambda r: (KINDS.index(r[0]), _text(r[1])))
    missing = []
    for kind, key in found:
        chain = touched.envelopes[key] if kind == nr.ENVELOPE else rows[(kind, key)]
        name = label(kind, key)
        check.gap(chain, f"{name} is named by the trail (chain {chain}) but its row is "
                         f"missing (deleted outside the store)")
        missing.append(MissingRow(kind=kind, id=_text(key), chain=chain))
    return missing, found


def _batches(wanted: dict[str, list[Any]]) -> Iterator[dict[str, list[str]]]:
    size = max((len(v) for v in wanted.values()), default=0)
    for i in range(0, size, ID_BATCH):
        part = {kind: keys[i:i + ID_BATCH] for kind, keys in wanted.items()}
        params = {name: part[kind] for kind, name in _PARAMS.items()}
        params["envelopes"] = part[nr.ENVELOPE]
        params["step_sagas"] = [saga for saga, _ in part[nr.SAGA_STEP]]
        params["step_names"] = [step for _, step in part[nr.SAGA_STEP]]
        yield params


def _text(key: RowKey) -> str:
    return "/".join(key) if isinstance(key, tuple) else key


# -- rows as the trail signed them -----------------------------------------------------------

def check_rows(cur: Any, check: ChainCheck, touched: Touched | None) -> None:
    """Compare the rows signed under the trail with their entries (sql/0017): every row
    (`touched` None), or only those `touched` names, in batches."""
    if touched is None:
        _row_gaps(cur, check, None, None, None)
        return
    envelopes, commands, routes = (touched.ids(nr.ENVELOPE), touched.ids(nr.COMMAND),
                                   touched.ids(nr.ROUTE))
    for i in range(0, max(len(envelopes), len(commands), len(routes)), ID_BATCH):
        _row_gaps(cur, check, envelopes[i:i + ID_BATCH], commands[i:i + ID_BATCH],
                  routes[i:i + ID_BATCH])


def _row_gaps(cur: Any, check: ChainCheck, envelopes: list[str] | None,
              commands: list[str] | None, routes: list[str] | None) -> None:
    if envelopes is None or envelopes:
        cur.execute(QUERIES["lifecycle_gaps"], {"envelopes": envelopes})
        for chain, envelope_id, status, event in cur.fetchall():
            check.gap(chain, f"envelope {envelope_id} is {status} but the trail has no "
                             f"{event} entry for it (entries were removed)")
        cur.execute(QUERIES["envelope_gaps"], {"envelopes": envelopes})
        for chain, envelope_id, name, in_row, signed, entry in cur.fetchall():
            check.gap(chain, f"envelope {envelope_id}: {name} is {_shown(in_row)} in its row "
                             f"but {_shown(signed)} in {entry} (the row was edited or "
                             f"entries were removed)")
    if commands is None or commands or routes:
        cur.execute(QUERIES["record_gaps"], {"commands": commands, "routes": routes})
        for chain, row_id, state, entry in cur.fetchall():
            check.gap(chain, f"{row_id} is {state} but its last trail entry is not the "
                             f"{entry} (the row was edited or entries were removed)")


def _shown(value: Any) -> str:
    """A signed field's value for a failure message: JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
