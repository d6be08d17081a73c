"""Reading an archived envelope back (the envelope page, docs/ui.md): after a prune, its
entries, and its row when the prune dropped that too, from the Parquet archive the last prune
recorded, when this process can reach it."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.models import Envelope
from agentpost.protocol.trail import StoredEntry
from agentpost.store import trail_export
from agentpost.store.envelopes import ROW, envelope_from_row

if TYPE_CHECKING:
    from agentpost.store.envelopes import EnvelopeStore

__all__ = ["ArchivedEntries", "ArchivedRow", "archived_entries", "archived_predecessors",
           "archived_row", "last_prune"]


class ArchivedEntries(BaseModel):
    """An envelope's entries that a prune took out of Postgres, as the archive holds them."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    cut: date
    directory: str
    reachable: bool
    entries: list[tuple[StoredEntry, StoredEntry | None]] = []


class ArchivedRow(BaseModel):
    """An envelope's row that a prune dropped, as the archive's newest copy holds it (None:
    not there, or the archive out of reach)."""

    model_config = ConfigDict(frozen=True)

    cut: date
    directory: str
    reachable: bool
    envelope: Envelope | None = None
    #: what the row held of its leases (the Envelope does not carry them)
    leases: int | None = None
    first_leased_at: datetime | None = None


def archived_row(store: EnvelopeStore, envelope_id: str) -> ArchivedRow | None:
    """The row of an envelope no longer in Postgres, from the copies the last prune's archive
    holds (`store.envelope_archive`), newest cut first; None for a trail never pruned."""
    pruned = last_prune(store)
    if pruned is None:
        return None
    cut, directory = pruned
    try:
        exported = (trail_export.load(directory)
                    if Path(directory, trail_export.MANIFEST).is_file() else None)
    except (OSError, InvalidInput):
        exported = None
    if exported is None:
        return ArchivedRow(cut=cut, directory=directory, reachable=False)
    import pyarrow.dataset as ds

    for taken in sorted((c for c in exported.cuts if c.envelopes), key=lambda c: c.cut,
                        reverse=True):
        try:
            found = ds.dataset(str(Path(directory) / str(taken.envelopes)),
                               format="parquet").to_table(
                filter=ds.field("id") == envelope_id, columns=["row"])
        except (OSError, ValueError):  # a copy gone or unreadable: out of reach
            return ArchivedRow(cut=cut, directory=directory, reachable=False)
        if found.num_rows:
            stored = json.loads(found.column("row")[0].as_py())
            return ArchivedRow(cut=cut, directory=directory, reachable=True,
                               envelope=envelope_from_row([stored.get(c) for c in ROW]),
                               leases=stored.get("leases"),
                               first_leased_at=stored.get("first_leased_at"))
    return ArchivedRow(cut=cut, directory=directory, reachable=True)


def last_prune(store: EnvelopeStore) -> tuple[date, str] | None:
    """(cut, archive directory) of the last prune, or None for a trail never pruned."""
    return store.db.fetchone("SELECT cut, archive FROM agentpost.trail_prunes"
                             " ORDER BY id DESC LIMIT 1")


def archived_entries(store: EnvelopeStore, envelope_id: str,
                     limit: int = 500) -> ArchivedEntries | None:
    """The archived entries of an envelope, when the trail was pruned (None if never), read
    from the last prune's archive when this process reaches it, each with its chain
    predecessor (None for a chain's first entry, or one not found)."""
    pruned = last_prune(store)
    if pruned is None:
        return None
    cut, directory = pruned
    data = _dataset(directory)
    if data is None:
        return ArchivedEntries(cut=cut, directory=directory, reachable=False)
    import pyarrow.dataset as ds

    mine = _stored(data.to_table(filter=ds.field("envelope_id") == envelope_id))[:limit]
    before = _at(data, {(e.chain, e.seq - 1) for e in mine if e.seq > 1})
    return ArchivedEntries(cut=cut, directory=directory, reachable=True,
                           entries=[(e, before.get((e.chain, e.seq - 1))) for e in mine])


def archived_predecessors(store: EnvelopeStore, wanted: set[tuple[str, int]]
                          ) -> dict[tuple[str, int], StoredEntry]:
    """The archived entries at the (chain, seq) positions `wanted`, those found (none when
    the trail was never pruned or its archive is out of reach)."""
    if not wanted:  # every predecessor was found in Postgres: nothing to ask
        return {}
    pruned = last_prune(store)
    data = None if pruned is None else _dataset(pruned[1])
    return {} if data is None else _at(data, wanted)


def _dataset(directory: str) -> Any | None:
    """The archive's listed batches as one Arrow dataset, or None if out of reach."""
    try:
        if not Path(directory, trail_export.MANIFEST).is_file():
            return None
        exported = trail_export.load(directory)
    except (OSError, InvalidInput):
        return None
    if not exported.batches:
        return None
    import pyarrow.dataset as ds

    try:
        return ds.dataset([ds.dataset(str(Path(directory) / b.dir), format="parquet",
                                      partitioning="hive") for b in exported.batches])
    except (OSError, ValueError):  # a listed batch gone or unreadable: out of reach
        return None


def _at(data: Any, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], StoredEntry]:
    if not wanted:
        return {}
    import pyarrow.dataset as ds

    chains = sorted({c for c, _ in wanted})
    seqs = sorted({s for _, s in wanted})
    found = data.to_table(filter=ds.field("chain").isin(chains)
                          & ds.field("chain_seq").isin(seqs))
    return {(e.chain, e.seq): e for e in _stored(found) if (e.chain, e.seq) in wanted}


def _stored(table: Any) -> list[StoredEntry]:
    cols = [table.column(c).to_pylist() for c in ("id", "chain", "chain_seq", "event",
                                                  "envelope_id", "at_us", "record",
                                                  "prev_hash", "hash", "mac")]
    out = [StoredEntry(id=i, chain=c, seq=s, event=ev, envelope_id=env, at_us=at, record=r,
                       prev_hash=p, hash=h, mac=m)
           for i, c, s, ev, env, at, r, p, h, m in zip(*cols, strict=True)]
    return sorted(out, key=lambda e: e.id)
