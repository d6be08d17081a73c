"""Verification since a verified checkpoint, and in parallel (WACP §3 Integrity: the trail's
integrity proof is verified, at a cost that follows what was added, not the store's size).

`verify_trail(since=cp)` starts each chain at the head `cp` anchors: that entry is re-read and
must be the anchored one, the next must link to it, chains created since are checked whole,
rows named by new entries are compared with what the trail signed. A run that passes hands
back the checkpoint of what it verified, the next run's `since`. The database is tampered
with directly, as its owner could (psycopg2, bypassing the store).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentpost.protocol.errors import InvalidAnchor
from agentpost.store import EnvelopeStore
from dbtools import rows
from test_cli import agentpost, assert_one_line_error
from test_trail_anchor import build


def entry_count(conn: Any) -> int:
    return rows(conn, "SELECT count(*) FROM agentpost.trail")[0][0]


def last_entry(conn: Any, chain: str) -> tuple[int, int]:
    """(id, seq) of a chain's head."""
    return rows(conn, "SELECT id, chain_seq FROM agentpost.trail WHERE chain = %s"
                      " ORDER BY chain_seq DESC LIMIT 1", (chain,))[0]


def edit_record(conn: Any, entry_id: int) -> None:
    """Change what an entry says, leaving its stored hash alone."""
    rows(conn, "UPDATE agentpost.trail SET record = replace(record, '\"body\"', '\"body\" ')"
               " WHERE id = %s", (entry_id,))


def more_traffic(store: EnvelopeStore) -> None:
    store.send("coord", "w1", "directive", "again")
    store.send("w1", "coord", "query", "and then?")
    store.transition("w3", "active")


@pytest.fixture
def world(store: EnvelopeStore) -> EnvelopeStore:
    build(store)
    return store


def test_wacp_3_integrity_since_reads_only_what_was_added(world: EnvelopeStore,
                                                          pg: Any) -> None:
    """A full run hands back its verified heads; the run since them checks exactly the
    entries added after (the heads re-read are not counted), and hands back the next."""
    full = world.verify_trail()
    assert full.ok and full.entries == entry_count(pg) and full.checkpoint is not None
    before = entry_count(pg)
    more_traffic(world)
    added = entry_count(pg) - before
    since = world.verify_trail(since=full.checkpoint)
    assert since.ok, since.failure
    assert since.entries == added > 0
    assert since.chains == full.chains
    assert since.since_taken_at is not None
    assert since.checkpoint["chains"] == world.checkpoint().to_dict()["chains"]
    nothing_new = world.verify_trail(since=since.checkpoint)
    assert nothing_new.ok and nothing_new.entries == 0


def test_wacp_3_integrity_an_entry_edited_after_the_checkpoint_is_caught(
        world: EnvelopeStore, pg: Any) -> None:
    cp = world.verify_trail().checkpoint
    more_traffic(world)
    entry_id, seq = last_entry(pg, "w1")
    edit_record(pg, entry_id)
    result = world.verify_trail(since=cp)
    assert not result.ok and result.checkpoint is None
    assert (result.failure_id, result.failure_chain, result.failure_seq) == (entry_id, "w1", seq)
    assert "hash does not match" in result.failure


def test_wacp_3_integrity_a_chain_cut_or_removed_after_the_checkpoint_is_caught(
        world: EnvelopeStore, pg: Any) -> None:
    """Cut back past its anchored head: shorter; removed whole: gone. Both are named in
    anchor_mismatches, and the other chains still verify."""
    cp = world.verify_trail().checkpoint
    more_traffic(world)
    _, w1_head = last_entry(pg, "w1")
    anchored_w1 = cp["chains"]["w1"]["seq"]
    rows(pg, "DELETE FROM agentpost.trail WHERE chain = 'w1' AND chain_seq >= %s",
         (anchored_w1,))
    rows(pg, "DELETE FROM agentpost.trail WHERE chain = 'w2'")
    result = world.verify_trail(since=cp)
    assert not result.ok
    problems = {m.chain: m.problem for m in result.anchor_mismatches}
    assert set(problems) == {"w1", "w2"}
    assert "shorter" in problems["w1"] and "gone" in problems["w2"]
    assert w1_head > anchored_w1


def test_wacp_3_integrity_an_edited_head_entry_is_caught(world: EnvelopeStore,
                                                          pg: Any) -> None:
    """The anchored head itself is re-read: its content edited (hash left alone) fails its
    hash check; its hash rewritten to match fails against the checkpoint (diverges)."""
    cp = world.verify_trail().checkpoint
    head_id, head_seq = last_entry(pg, "coord")
    edit_record(pg, head_id)
    result = world.verify_trail(since=cp)
    assert not result.ok
    assert (result.failure_id, result.failure_chain) == (head_id, "coord")
    assert result.failure.startswith("checkpointed head: hash does not match")
    rows(pg, "UPDATE agentpost.trail SET hash = sha256(prev_hash || convert_to(record, 'UTF8'))"
             " WHERE id = %s", (head_id,))
    result = world.verify_trail(since=cp)
    assert not result.ok and result.failure_chain == "coord"
    assert [m.chain for m in result.anchor_mismatches] == ["coord"]
    assert "diverges" in result.failure and result.anchor_mismatches[0].anchored_seq == head_seq


def test_wacp_3_integrity_a_checkpoint_of_another_key_is_refused_before_any_read(
        world: EnvelopeStore, pg: Any) -> None:
    """Refused with InvalidAnchor, and before any read: a store that cannot even reach its
    database refuses it the same way (nothing was verified, so nothing can pass)."""
    with EnvelopeStore(world.dsn, trail_key="another key") as other:
        foreign = other.checkpoint().to_json()
    with pytest.raises(InvalidAnchor, match="signature does not verify"):
        world.verify_trail(since=foreign)
    with EnvelopeStore("postgresql://postgres@127.0.0.1:1/none",
                       trail_key="agentpost-test-trail-key") as unreachable, \
            pytest.raises(InvalidAnchor):
        unreachable.verify_trail(since=foreign)


def test_wacp_3_integrity_new_chains_are_verified_whole(world: EnvelopeStore,
                                                        pg: Any) -> None:
    cp = world.verify_trail().checkpoint
    world.create_workspace("worker", parent="coord", workspace_id="w9")
    world.send("coord", "w9", "directive", "welcome")
    (first_id,), = rows(pg, "SELECT id FROM agentpost.trail WHERE chain = 'w9'"
                            " AND chain_seq = 1")
    result = world.verify_trail(since=cp)
    assert result.ok and "w9" in result.checkpoint["chains"]
    edit_record(pg, first_id)
    result = world.verify_trail(since=cp)
    assert (result.ok, result.failure_id, result.failure_chain) == (False, first_id, "w9")


def test_wacp_3_integrity_rows_named_by_new_entries_are_compared(world: EnvelopeStore,
                                                                 pg: Any) -> None:
    """An envelope sent since the checkpoint whose row is edited in the table (priority
    raised to blocking) fails the run since, as it fails the full run."""
    cp = world.verify_trail().checkpoint
    sent = world.send("coord", "w2", "directive", "later")
    rows(pg, "UPDATE agentpost.envelopes SET priority = 'blocking' WHERE id = %s",
         (sent.envelope_id,))
    full, since = world.verify_trail(), world.verify_trail(since=cp)
    assert not full.ok and not since.ok
    assert since.failure == full.failure
    assert f"envelope {sent.envelope_id}: priority" in since.failure


def test_wacp_3_integrity_entries_before_the_heads_are_not_read(world: EnvelopeStore,
                                                                pg: Any) -> None:
    """What `since` does not check, shown: an entry strictly before an anchored head
    removed (its chain's later entries intact) fails the full run only. The run that
    verified the checkpoint is what vouches for that prefix."""
    cp = world.verify_trail().checkpoint
    rows(pg, "DELETE FROM agentpost.trail WHERE chain = 'w3' AND chain_seq = 1")
    assert world.verify_trail(since=cp).ok
    assert not world.verify_trail().ok


def test_wacp_3_integrity_parallel_verification_matches_serial(store: EnvelopeStore,
                                                               pg: Any) -> None:
    """Many chains, one tampered: three workers in one exported snapshot report what one
    connection reports, whole and since a checkpoint."""
    store.create_workspace("coordinator", workspace_id="coord")
    for i in range(24):
        store.create_workspace("worker", parent="coord", workspace_id=f"p{i}")
    store.send_many([{"from": "coord", "to": f"p{i % 24}", "type": "directive",
                      "content": f"job {i}"} for i in range(240)])
    cp = store.verify_trail().checkpoint
    store.send_many([{"from": "coord", "to": f"p{i % 24}", "type": "directive",
                      "content": f"more {i}"} for i in range(96)])
    assert store.verify_trail(workers=3).checkpoint["chains"] == \
        store.verify_trail().checkpoint["chains"]
    entry_id, _ = last_entry(pg, "p7")
    edit_record(pg, entry_id)
    fields = ("ok", "entries", "chains", "failures", "failure_id", "failure_chain",
              "failure_seq", "failure")
    for since in (None, cp):
        serial = store.verify_trail(since=since)
        parallel = store.verify_trail(since=since, workers=3)
        assert [getattr(parallel, f) for f in fields] == [getattr(serial, f) for f in fields]
        assert (serial.ok, serial.failure_id) == (False, entry_id)


def test_wacp_3_integrity_cli_verify_since_chains_checkpoints(dsn: str, tmp_path: Path) -> None:
    """`verify --out` writes the verified heads; `verify --since` that file checks what came
    after, in parallel with --workers; bad input is one line, exit 2."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    with EnvelopeStore(dsn) as store:
        build(store)
        run = agentpost(dsn, "verify", "--out", str(first))
        assert run.code == 0 and first.is_file(), run.err
        more_traffic(store)
    run = agentpost(dsn, "verify", "--since", str(first), "--workers", "2",
                    "--out", str(second))
    assert run.code == 0, run.err
    assert "since the checkpoint of" in run.out and second.is_file()
    run = agentpost(dsn, "verify", "--since", str(second))
    assert run.code == 0 and run.out.startswith("trail verified: 0 entries"), run.out
    for bad in (["--workers", "two"], ["--workers", "0"], ["--since", str(tmp_path / "no")]):
        assert_one_line_error(agentpost(dsn, "verify", *bad), 2)
    forged = json.loads(first.read_text())
    forged["chains"]["coord"]["seq"] += 1
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    assert "signature" in assert_one_line_error(
        agentpost(dsn, "verify", "--since", str(tmp_path / "forged.json")), 2)
