"""Trail integrity: how entries are hashed and signed, and the check that finds tampering.

Each chain (one per workspace) is a sequence 1..n. Entry k stores the canonical JSON record
that was hashed and the hash of entry k-1:

    hash_k = SHA-256(hash_{k-1} || utf8(record_k))      hash_0 = 32 zero bytes
    mac_k  = HMAC-SHA256(key, hash_k)

The database computes both (it only ever sees the key's RFC 2104 pads); this module checks them
independently, with the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

GENESIS = bytes(32)
_BLOCK = 64


def key_pads(key: bytes) -> tuple[bytes, bytes]:
    """The HMAC-SHA256 inner and outer pads of `key` (RFC 2104), as the database uses them."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\x00")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def entry_hash(prev: bytes, record: str) -> bytes:
    return hashlib.sha256(prev + record.encode("utf-8")).digest()


def entry_mac(key: bytes, digest: bytes) -> bytes:
    return hmac.new(key, digest, hashlib.sha256).digest()


@dataclass(frozen=True)
class StoredEntry:
    """A trail row as stored, every column that the check covers."""

    id: int
    chain: str
    seq: int
    event: str
    envelope_id: str | None
    at_us: int
    record: str
    prev_hash: bytes
    hash: bytes
    mac: bytes


@dataclass
class ChainCheck:
    """Feeds the entries of every chain, each chain in sequence order, and keeps failures."""

    key: bytes
    entries: int = 0
    #: checkpointed heads re-read to start their chains (`resume`), not counted in `entries`
    resumed: int = 0
    failures: list[tuple[int, str, int, str]] = field(default_factory=list)
    _last: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    _failed_chains: set[str] = field(default_factory=set)

    def feed(self, e: StoredEntry) -> None:
        self.entries += 1
        if e.chain in self._failed_chains:
            return  # everything after a break in the same chain is suspect anyway
        problem = self._problem(e)
        seq, digest = self._last.get(e.chain, (0, GENESIS))
        self._last[e.chain] = (e.seq, e.hash)
        if problem is None and e.seq != seq + 1:
            problem = f"sequence jumps from {seq} to {e.seq} (an entry is missing)"
        if problem is None and e.prev_hash != digest:
            problem = "does not link to the previous entry of its chain"
        if problem is not None:
            self._fail(e.id, e.chain, e.seq, problem)

    def resume(self, e: StoredEntry, anchored: bytes) -> None:
        """Start `e.chain` at `e`, the head a verified checkpoint anchors with hash `anchored`
        (WACP §3 Integrity, verification since a checkpoint): `e` itself must be intact
        (hash, signature, columns) and be that head; the chain's next entry must link to it.
        What came before `e` is taken as verified by the run that signed the checkpoint."""
        self.resumed += 1
        if e.chain in self._failed_chains:
            return
        problem = self._problem(e)
        self._last[e.chain] = (e.seq, e.hash)
        if problem is None and not hmac.compare_digest(e.hash, anchored):
            problem = "is not the head the checkpoint anchors (it was rewritten)"
        if problem is not None:
            self._fail(e.id, e.chain, e.seq, f"checkpointed head: {problem}")

    def merge(self, other: ChainCheck) -> None:
        """Add what `other` found on disjoint chains (a parallel worker's part)."""
        self.entries += other.entries
        self.resumed += other.resumed
        self.failures.extend(other.failures)
        self._last.update(other._last)
        self._failed_chains |= other._failed_chains

    def heads(self) -> dict[str, tuple[int, bytes]]:
        """Each chain's last entry checked: (seq, hash)."""
        return dict(self._last)

    def _problem(self, e: StoredEntry) -> str | None:
        if entry_hash(e.prev_hash, e.record) != e.hash:
            return "hash does not match the entry's content"
        if not hmac.compare_digest(entry_mac(self.key, e.hash), e.mac):
            return "signature does not match (wrong key or forged entry)"
        try:
            rec = json.loads(e.record)
        except ValueError:
            return "record is not valid JSON"
        expected = {"chain": e.chain, "seq": e.seq, "event": e.event,
                    "envelope_id": e.envelope_id, "at_us": e.at_us}
        for name, value in expected.items():
            if rec.get(name) != value:
                return f"column {name} differs from the signed record"
        return None

    def _fail(self, entry_id: int, chain: str, seq: int, problem: str) -> None:
        self._failed_chains.add(chain)
        self.failures.append((entry_id, chain, seq, problem))

    def gap(self, chain: str, problem: str) -> None:
        """Record a failure found outside the chains themselves: a record whose trail entries
        are missing (the only trace a removed tail of a chain leaves)."""
        self._fail(-1, chain, -1, problem)

    @property
    def chains(self) -> int:
        return len(self._last)

    def first_failure(self) -> tuple[int, str, int, str] | None:
        if not self.failures:
            return None
        real = [f for f in self.failures if f[0] >= 0]
        return min(real) if real else self.failures[0]


def format_trail_event(e: Any) -> str:
    """A trail entry (`TrailEvent`) on one line: id, chain:seq, event, envelope, body. The
    CLI's `agentpost trail` and the terminal demo print it alike."""
    body = {k: v for k, v in e.body.items() if v is not None and k != "envelope_id"}
    ref = f" {e.envelope_id[:8]}" if e.envelope_id else ""
    where = f"{e.chain}:{e.seq}"
    return f"#{e.id:<5} {where:<16} {e.event:<24}{ref} {json.dumps(body, default=str)}"
