"""Row digests: what a checkpoint records of the rows under the trail, so a verification
since it can tell that a row went missing whenever the trail named it (WACP §3 Integrity),
without reading the entries before the checkpoint.

Per kind of row the trail names (`protocol.named_rows.KINDS`), a digest is the table's row
count and the sum, modulo 2**64, of a keyed hash of each row's key: the first 8 bytes,
big-endian, of HMAC-SHA256 under the *row key*, itself HMAC-SHA256(trail key, LABEL). A sum
can be kept up to date one row at a time: the digest a table should have now is the
checkpoint's, plus the rows the trail says were created since, minus those it says were
removed. A count alone would let a row be deleted and an unrelated one inserted in its place
(or its id changed); without the key nobody can choose a row whose hash makes up for another's,
and the hash of a row is never shown, only sums.

The database computes the table's side from the row key's pads (as it signs entries from the
trail key's), in the `row_digests` query of store/queries.sql; this module computes the same
hashes in Python for the rows the entries since a checkpoint create or remove.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agentpost.protocol.named_rows import KINDS, RowKey

#: what the row key is derived with (never the trail key itself, which signs entries)
LABEL = b"agentpost.trail-checkpoint.rows"
MODULUS = 1 << 64


def row_key(trail_key: bytes) -> bytes:
    """The key the row hashes are computed under."""
    return hmac.new(trail_key, LABEL, hashlib.sha256).digest()


def key_bytes(key: RowKey) -> bytes:
    """A row's key as hashed: its id in UTF-8, or a saga step's saga id, NUL, step name (no
    text in Postgres holds a NUL, so the two parts cannot run into each other)."""
    if isinstance(key, tuple):
        return key[0].encode("utf-8") + b"\x00" + key[1].encode("utf-8")
    return key.encode("utf-8")


def row_hash(rows_key: bytes, key: RowKey) -> int:
    """A row's keyed hash, as the database computes it (an unsigned 64-bit number)."""
    digest = hmac.new(rows_key, key_bytes(key), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class RowDigest:
    """The rows of one kind: how many, and the sum of their hashes modulo 2**64."""

    count: int = 0
    sum: int = 0

    def plus(self, hashes: Iterable[int]) -> RowDigest:
        values = list(hashes)
        return RowDigest(self.count + len(values), (self.sum + sum(values)) % MODULUS)

    def minus(self, hashes: Iterable[int]) -> RowDigest:
        values = list(hashes)
        return RowDigest(self.count - len(values), (self.sum - sum(values)) % MODULUS)

    def __add__(self, other: RowDigest) -> RowDigest:
        """The digest of two disjoint sets of rows together."""
        return RowDigest(self.count + other.count, (self.sum + other.sum) % MODULUS)

    def __sub__(self, other: RowDigest) -> RowDigest:
        """The digest of these rows without `other`, a subset of them."""
        return RowDigest(self.count - other.count, (self.sum - other.sum) % MODULUS)

    def to_json(self) -> dict[str, int | str]:
        return {"count": self.count, "sum": f"{self.sum:016x}"}

    @classmethod
    def from_json(cls, body: object) -> RowDigest | None:
        """The digest `to_json` wrote into `body`, else None (out of shape)."""
        try:
            count, total = body["count"], body["sum"]  # type: ignore[index]
            if (isinstance(count, int) and count >= 0 and isinstance(total, str)
                    and len(total) == 16):
                return cls(count, int(total, 16))
        except (ValueError, KeyError, TypeError):
            pass
        return None


#: a digest per kind (every kind of `named_rows.KINDS`)
RowDigests = Mapping[str, RowDigest]


def pruned(record: str) -> tuple[str, RowDigest] | None:
    """(kind, digest) of the rows a `rows_pruned` entry says left (`store.envelope_archive`),
    else None (a record out of shape: the store writes none, and the entry checks report an
    edited one by its hash)."""
    try:
        body = json.loads(record).get("body")
        kind, digest = body["kind"], RowDigest.from_json(body)
        if kind in KINDS and digest is not None:
            return kind, digest
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    return None
