"""Trail checkpoints: a signed manifest of every chain's head, kept outside the database.

Each chain verifies on its own, so a chain whose newest entries were cut off (with the rows
that needed them) is still a valid chain, only a shorter one: nothing inside the database
shows it. WACP §3 ("Integrity") asks for an integrity proof that is verified; this is the
part of it the database cannot hold itself. A checkpoint records every chain's head (its
sequence number and hash) at one moment, signed with the trail key, and the caller keeps it
elsewhere (a file, object storage, an Airflow XCom). Verifying against it finds every chain
it names that is gone, shorter, or diverges (its entry at the anchored number is another
one: the chain was rolled back and written again). Chains and entries added since are fine.

The format, version 2, is one JSON object and stays stable (a Spark audit reads it too):

    {"format": "agentpost.trail-checkpoint", "version": 2,
     "taken_at": "2025-01-31T12:00:00.123456Z",
     "chains": {"<chain>": {"seq": 17, "hash": "<64 lowercase hex digits>"}, ...},
     "rows": {"<kind>": {"count": 120, "sum": "<16 lowercase hex digits>"}, ...},
     "mac": "<64 lowercase hex digits>"}

`rows` holds a digest of each kind of row the trail names (`protocol.row_digest`: every kind
of `protocol.named_rows.KINDS`, no other), taken in the heads' snapshot: with it, a
verification since the checkpoint finds a row deleted whenever the trail named it. Version 1
is the same without `rows` and is still read (a verification since it checks the rows the new
entries name only, and says so).

``mac = HMAC-SHA256(trail key, canonical)``, where `canonical` is the object without "mac"
written with sorted keys, no whitespace and everything outside ASCII escaped, i.e.
``json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")``, so it covers
`rows` too. (A trail entry's MAC signs a 32-byte hash; a canonical manifest is always longer,
so neither can stand in for the other.) Anything else, an unknown field, another format or
version, a bad value, is refused with InvalidAnchor.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from agentpost.protocol.errors import InvalidAnchor
from agentpost.protocol.models import ChainMismatch
from agentpost.protocol.named_rows import KINDS
from agentpost.protocol.row_digest import RowDigest, RowDigests

FORMAT = "agentpost.trail-checkpoint"
#: the version written; version 1 (no `rows`) is still read
VERSION = 2
_FIELDS = {1: ("format", "version", "taken_at", "chains", "mac"),
           2: ("format", "version", "taken_at", "chains", "rows", "mac")}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_MAX_CHAIN = 1000
_MAX_SEQ = 1 << 62


@dataclass(frozen=True)
class ChainHead:
    """A chain's last entry: its sequence number and hash."""

    chain: str
    seq: int
    hash: bytes


@dataclass(frozen=True)
class Checkpoint:
    """A signed manifest of chain heads and, from version 2, of row digests in `KINDS`
    order (the module docstring gives its format)."""

    taken_at: str
    heads: tuple[ChainHead, ...]
    mac: bytes
    rows: tuple[tuple[str, RowDigest], ...] | None = None

    @classmethod
    def sign(cls, key: bytes, taken_at: datetime, heads: Iterable[ChainHead],
             rows: RowDigests | None = None) -> Checkpoint:
        """The checkpoint of `heads` (and `rows`, a digest of every kind: version 2; without
        them, version 1) at `taken_at`, signed with the trail key."""
        stamp = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        ordered = None if rows is None else tuple((kind, rows[kind]) for kind in KINDS)
        unsigned = cls(stamp, tuple(sorted(heads, key=lambda h: h.chain)), b"", ordered)
        return cls(unsigned.taken_at, unsigned.heads, unsigned._mac(key), ordered)

    @classmethod
    def from_json(cls, data: str | bytes | Mapping[str, Any]) -> Checkpoint:
        """A checkpoint from its JSON text or dict, its structure checked (not its
        signature: see `load`). Raises InvalidAnchor."""
        obj = _object(data)
        version = obj.get("version")
        if type(version) is not int or version not in _FIELDS:
            _refuse(f"only versions {', '.join(map(str, _FIELDS))} are understood")
        fields = _FIELDS[version]
        missing = [f for f in fields if f not in obj]
        if missing:
            _refuse(f"it has no {missing[0]!r}")
        unknown = sorted(str(k)[:60] for k in obj if k not in fields)
        if unknown:
            _refuse(f"unknown field {unknown[0]!r} (in version {version})")
        if obj["format"] != FORMAT:
            _refuse(f"its format is not {FORMAT!r}")
        chains = obj["chains"]
        if not isinstance(chains, Mapping):
            _refuse("chains is not an object")
        heads = sorted((_head(chain, value) for chain, value in chains.items()),
                       key=lambda h: h.chain)
        rows = None if version == 1 else _rows(obj["rows"])
        return cls(_taken_at(obj["taken_at"]), tuple(heads), _hex(obj["mac"], "mac"), rows)

    @property
    def taken(self) -> datetime:
        return datetime.fromisoformat(self.taken_at)

    @property
    def row_digests(self) -> dict[str, RowDigest] | None:
        """Every kind's row digest (None: a version 1 checkpoint, which has none)."""
        return None if self.rows is None else dict(self.rows)

    def body(self) -> dict[str, Any]:
        """Everything the signature covers."""
        body: dict[str, Any] = {
            "format": FORMAT, "version": 1 if self.rows is None else VERSION,
            "taken_at": self.taken_at,
            "chains": {h.chain: {"seq": h.seq, "hash": h.hash.hex()} for h in self.heads}}
        if self.rows is not None:
            body["rows"] = {kind: digest.to_json() for kind, digest in self.rows}
        return body

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON values (what an XCom holds)."""
        return {**self.body(), "mac": self.mac.hex()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True) + "\n"

    def verify(self, key: bytes) -> Checkpoint:
        """This checkpoint, if its signature verifies with `key`; InvalidAnchor otherwise."""
        if not hmac.compare_digest(self._mac(key), self.mac):
            _refuse("its signature does not verify with the trail key (it was edited, forged "
                    "or signed with another key)")
        return self

    def _mac(self, key: bytes) -> bytes:
        canonical = json.dumps(self.body(), sort_keys=True, separators=(",", ":"))
        return hmac.new(key, canonical.encode("ascii"), hashlib.sha256).digest()


AnchorLike = Checkpoint | str | bytes | Mapping[str, Any]


def load(anchor: AnchorLike, key: bytes) -> Checkpoint:
    """A checkpoint given as itself, its JSON text or its dict, checked whole: structure and
    signature. A Checkpoint object goes through the same checks (it may have been built by
    hand). Raises InvalidAnchor."""
    data = anchor.to_dict() if isinstance(anchor, Checkpoint) else anchor
    return Checkpoint.from_json(data).verify(key)


def mismatches(checkpoint: Checkpoint, found: Mapping[str, tuple[bytes | None, int]],
               pruned: Mapping[str, tuple[int, bytes]] | None = None) -> list[ChainMismatch]:
    """Every anchored chain that no longer holds its anchored head. `found` maps a chain to
    the hash of its entry at the anchored sequence number (None: no such entry) and its head
    now (0: no entries); a chain missing from it has neither. `pruned` maps a chain a
    vouched-for prune dropped whole to its last (seq, hash): such a chain is gone by right
    if it ended at or past its anchored head (at it, with the anchored hash)."""
    out = []
    when = f"the checkpoint of {checkpoint.taken_at}"
    for h in checkpoint.heads:
        digest, head = found.get(h.chain, (None, 0))
        if head == 0 and _pruned_past(h, (pruned or {}).get(h.chain)):
            continue
        if head == 0:
            problem = f"chain {h.chain} is gone: {when} has it at seq {h.seq}"
        elif head < h.seq:
            problem = (f"chain {h.chain} is shorter than {when}: it ends at seq {head}, the "
                       f"checkpoint has seq {h.seq} (entries were removed)")
        elif digest is None:
            problem = f"chain {h.chain} has no entry at seq {h.seq}, which {when} anchors"
        elif not hmac.compare_digest(digest, h.hash):
            problem = (f"chain {h.chain} diverges from {when}: its entry at seq {h.seq} is not "
                       f"the one anchored (the chain was cut back and written again)")
        else:
            continue
        out.append(ChainMismatch(chain=h.chain, anchored_seq=h.seq, seq=head, problem=problem))
    return out


def _pruned_past(head: ChainHead, last: tuple[int, bytes] | None) -> bool:
    if last is None:
        return False
    seq, digest = last
    return seq > head.seq or (seq == head.seq and hmac.compare_digest(digest, head.hash))


def _refuse(why: str) -> NoReturn:
    raise InvalidAnchor(f"not a usable trail checkpoint: {why}")


def _object(data: object) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            _refuse("it is not UTF-8 text")
    if not isinstance(data, str):
        _refuse("give a Checkpoint, its JSON text or its dict")
    try:
        obj = json.loads(data, object_pairs_hook=_unique, parse_constant=_no_constant)
    except InvalidAnchor:
        raise
    except (ValueError, RecursionError):
        _refuse("it is not JSON")
    if not isinstance(obj, dict):
        _refuse("it is not a JSON object")
    return obj


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            _refuse(f"the key {name[:60]!r} appears twice")
        obj[name] = value
    return obj


def _no_constant(name: str) -> NoReturn:
    _refuse(f"{name} is not a JSON number")


def _taken_at(value: object) -> str:
    if isinstance(value, str) and len(value) <= 40:
        try:
            if datetime.fromisoformat(value).tzinfo is not None:
                return value
        except ValueError:
            pass
    _refuse("taken_at is not an ISO 8601 time with a time zone")


def _hex(value: object, what: str) -> bytes:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        _refuse(f"{what} is not 64 lowercase hex digits")
    return bytes.fromhex(value)


def _rows(value: object) -> tuple[tuple[str, RowDigest], ...]:
    if not isinstance(value, Mapping):
        _refuse("rows is not an object")
    unknown = sorted(str(k)[:60] for k in value if k not in KINDS)
    if unknown:
        _refuse(f"rows has an unknown kind {unknown[0]!r}")
    missing = [kind for kind in KINDS if kind not in value]
    if missing:
        _refuse(f"rows has no {missing[0]!r}")
    return tuple((kind, _digest(kind, value[kind])) for kind in KINDS)


def _digest(kind: str, value: object) -> RowDigest:
    if not isinstance(value, Mapping) or set(value) != {"count", "sum"}:
        _refuse(f"the rows of {kind!r} are not {{\"count\": ..., \"sum\": ...}}")
    count, total = value["count"], value["sum"]
    if type(count) is not int or not 0 <= count < _MAX_SEQ:
        _refuse(f"the row count of {kind!r} is not a whole number")
    if not isinstance(total, str) or not _HEX16.fullmatch(total):
        _refuse(f"the row sum of {kind!r} is not 16 lowercase hex digits")
    return RowDigest(count, int(total, 16))


def _head(chain: object, value: object) -> ChainHead:
    if not isinstance(chain, str) or not 0 < len(chain) <= _MAX_CHAIN or "\x00" in chain:
        _refuse(f"the chain name {str(chain)[:60]!r} is not a chain name")
    try:
        chain.encode("utf-8")
    except UnicodeEncodeError:
        _refuse(f"the chain name {chain[:60]!r} is not valid Unicode")
    if not isinstance(value, Mapping) or set(value) != {"hash", "seq"}:
        _refuse(f"chain {chain[:60]!r} is not {{\"seq\": ..., \"hash\": ...}}")
    seq = value["seq"]
    if type(seq) is not int or not 0 < seq < _MAX_SEQ:
        _refuse(f"chain {chain[:60]!r} has a seq that is not a positive whole number")
    return ChainHead(chain, seq, _hex(value["hash"], f"the hash of chain {chain[:60]!r}"))
