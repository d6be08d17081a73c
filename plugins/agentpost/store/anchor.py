"""Trail checkpoints on Postgres: taking one, and checking the trail against one.

The manifest itself (format, signature, comparison) is `agentpost.protocol.anchor`; here are
the two reads it needs, each inside the caller's or its own single snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from agentpost.pg.db import Database
from agentpost.protocol.anchor import ChainHead, Checkpoint, mismatches
from agentpost.protocol.chains import SYSTEM_CHAIN
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.models import ChainMismatch
from agentpost.protocol.row_digest import RowDigest
from agentpost.protocol.trail import ChainCheck
from agentpost.store import history_archive
from agentpost.store.queries import QUERIES
from agentpost.store.row_digests import table_digests


def take_checkpoint(db: Database, key: bytes) -> Checkpoint:
    """Every chain's head and every kind's row digest in one snapshot, signed with the
    trail key. It is returned only after its transaction committed durably, which flushes
    every commit it saw to disk (see the `checkpoint_start` query)."""
    with db.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            cur.execute(QUERIES["checkpoint_start"])
            taken_at = cur.fetchone()[0]
            cur.execute(QUERIES["chain_heads"])
            heads = [ChainHead(chain, seq, bytes(digest)) for chain, seq, digest in cur]
            rows = table_digests(cur, key)
        finally:
            cur.execute("COMMIT")
    return Checkpoint.sign(key, taken_at, heads, rows)


def check_anchor(cur: Any, check: ChainCheck, checkpoint: Checkpoint) -> dict[str, Any]:
    """Compare the chains `checkpoint` anchors with the trail, in the caller's snapshot (the
    one whose entries `check` verified): every chain that is gone, shorter or diverging is a
    failure of `check` too. Returns the TrailVerification fields that report it."""
    problems = anchor_mismatches(cur, check, checkpoint)
    return {"anchor_taken_at": checkpoint.taken, "anchored_chains": len(checkpoint.heads),
            "anchor_mismatches": tuple(problems)}


def anchor_mismatches(cur: Any, check: ChainCheck,
                      checkpoint: Checkpoint) -> list[ChainMismatch]:
    """Every chain `checkpoint` anchors that is gone, shorter or diverges, in the caller's
    snapshot (two index probes per chain), each also a failure of `check`."""
    cur.execute(QUERIES["anchored_entries"],
                {"chains": [h.chain for h in checkpoint.heads],
                 "seqs": [h.seq for h in checkpoint.heads]})
    found = {chain: (None if digest is None else bytes(digest), head)
             for chain, digest, head in cur.fetchall()}
    gone = [h for h in checkpoint.heads if found.get(h.chain, (None, 0))[1] == 0]
    problems = mismatches(checkpoint, found, _pruned(cur, check, checkpoint, gone))
    for m in problems:
        check.gap(m.chain, m.problem)
    return problems


def _pruned(cur: Any, check: ChainCheck, checkpoint: Checkpoint,
            gone: list[ChainHead]) -> dict[str, tuple[int, bytes]]:
    """Of the `gone` chains, those a prune since `checkpoint` dropped whole, each with its
    last (seq, hash): listed in trail_pruned_chains by a prune whose `chains_pruned` entry,
    after the checkpoint's head of the system chain (and checked with it by this run),
    vouches for the whole list (its count and keyed sum). A list that differs from its
    entry is a failure, and vouches for nothing."""
    if not gone:
        return {}
    listed = history_archive.pruned_chains(cur, [h.chain for h in gone])
    if not listed:
        return {}
    system = next((h.seq for h in checkpoint.heads if h.chain == SYSTEM_CHAIN), 0)
    cur.execute("SELECT record FROM agentpost.trail WHERE chain = %s AND chain_seq > %s"
                " AND event = %s ORDER BY chain_seq",
                (SYSTEM_CHAIN, system, history_archive.CHAINS_PRUNED))
    vouched = set()
    for (record,) in cur.fetchall():
        body = json.loads(record).get("body", {})
        prune = body.get("prune")
        signed = RowDigest.from_json(body)
        if not isinstance(prune, int) or signed is None:
            check.gap(SYSTEM_CHAIN, f"a {history_archive.CHAINS_PRUNED} entry names no prune "
                                    "and digest")
        elif history_archive.chains_digest(cur, check.key, prune) != signed:
            check.gap(SYSTEM_CHAIN, f"the chains prune {prune} lists are not those its signed "
                                    f"{history_archive.CHAINS_PRUNED} entry counts (the list "
                                    "was edited)")
        else:
            vouched.add(prune)
    return {c: (seq, digest) for c, (seq, digest, prune) in listed.items() if prune in vouched}


def write_checkpoint(checkpoint: Checkpoint, path: str) -> None:
    """Write a checkpoint to `path` whole or not at all (a temporary file beside it, flushed,
    then renamed): a half-written anchor would be refused as malformed when it is needed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(checkpoint.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
