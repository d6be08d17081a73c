"""Checkpoints of the trail's chain heads, kept outside the database (WACP §3 "Integrity").

Every chain verifies on its own, so cutting the newest entries off a chain, together with the
rows that depended on them, leaves a trail that `verify_trail()` passes. A checkpoint taken
before names every chain's head, signed with the trail key: `verify_trail(anchor=...)` finds
the chain that is gone, shorter, or was cut back and grown again. A checkpoint that is
malformed or not signed with the trail key is refused with InvalidAnchor, never a pass.
The database is tampered with directly, as its owner could (psycopg2, bypassing the store).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpost.protocol.anchor import ChainHead, Checkpoint
from agentpost.protocol.errors import InvalidAnchor, InvalidInput
from agentpost.store import EnvelopeStore
from dbtools import rows
from test_cli import agentpost, assert_one_line_error


def build(store: EnvelopeStore) -> None:
    """A coordinator and three workers; envelopes each way; w3's chain ends with a
    workspace_transition (active -> suspended) that no row depends on but its state."""
    store.create_workspace("coordinator", workspace_id="coord")
    for w in ("w1", "w2", "w3"):
        store.create_workspace("worker", parent="coord", workspace_id=w)
    store.send("coord", "w1", "directive", "start")
    store.send("w1", "coord", "query", "which part?")
    store.send("coord", "w2", "directive", "you too")
    store.transition("w3", "active")
    store.transition("w3", "suspended")


@pytest.fixture
def world(store: EnvelopeStore) -> EnvelopeStore:
    build(store)
    return store


def head(conn: Any, chain: str) -> tuple[int, str]:
    """(seq, event) of a chain's last entry."""
    return rows(conn, "SELECT chain_seq, event FROM agentpost.trail WHERE chain = %s"
                      " ORDER BY chain_seq DESC LIMIT 1", (chain,))[0]


def cut_last_transition(conn: Any, ws: str) -> None:
    """Roll a workspace's last transition back as its owner could: the entry goes, and the
    workspace's state goes back to what the entry says it was."""
    (body,), = rows(conn, "DELETE FROM agentpost.trail WHERE id = (SELECT id FROM"
                          " agentpost.trail WHERE chain = %s ORDER BY chain_seq DESC LIMIT 1)"
                          " RETURNING record::jsonb -> 'body'", (ws,))
    rows(conn, "UPDATE agentpost.workspaces SET state = %s WHERE id = %s",
         (body["from_state"], ws))


def cut_last_role(conn: Any, role: str) -> None:
    """Roll the last registry change (a role defined) back: its `system` entry and its row."""
    rows(conn, "DELETE FROM agentpost.trail WHERE id = (SELECT id FROM agentpost.trail"
               " WHERE chain = 'system' ORDER BY chain_seq DESC LIMIT 1)")
    rows(conn, "DELETE FROM agentpost.roles WHERE name = %s", (role,))


def assert_only_mismatch(store: EnvelopeStore, anchor: Any, chain: str, anchored: int,
                         seq: int, words: str) -> None:
    """Plain verification passes; against the anchor it fails, naming just this chain."""
    assert store.verify_trail().ok, "the tampering should be invisible from inside"
    result = store.verify_trail(anchor=anchor)
    assert not result.ok
    assert result.failure_chain == chain, result
    assert words in (result.failure or ""), result.failure
    assert result.failures == 1
    (m,) = result.anchor_mismatches
    assert (m.chain, m.anchored_seq, m.seq) == (chain, anchored, seq)
    assert m.problem == result.failure


# -- what an anchor finds -----------------------------------------------------------------------


def test_wacp_3_cut_chain_tail_passes_alone_but_not_against_the_anchor(
        world: EnvelopeStore, pg: Any) -> None:
    """WACP §3 Integrity: the last entry of w3's chain (a workspace_transition) and the state
    it set are rolled back. The rest of the chain is a valid prefix, so verify_trail() passes;
    the checkpoint taken before still has the removed head."""
    before, event = head(pg, "w3")
    assert event == "workspace_transition"
    anchor = world.checkpoint()
    cut_last_transition(pg, "w3")
    assert world.workspace("w3").state == "active"
    assert_only_mismatch(world, anchor, "w3", before, before - 1, "shorter")


def test_wacp_3_cut_registry_change_passes_alone_but_not_against_the_anchor(
        world: EnvelopeStore, pg: Any) -> None:
    """WACP §3 Integrity: a role defined last (the end of the `system` chain) is removed with
    its row, as if never defined."""
    world.register_type("note", ["worker"], ["worker"])
    world.define_role("auditor", inherits="observer")
    before, event = head(pg, "system")
    assert event == "role_defined"
    anchor = world.checkpoint()
    cut_last_role(pg, "auditor")
    assert_only_mismatch(world, anchor, "system", before, before - 1, "shorter")


def test_wacp_3_chain_cut_back_and_grown_again_diverges_from_the_anchor(
        world: EnvelopeStore, pg: Any) -> None:
    """WACP §3 Integrity: without the key nobody can re-sign a chain, but a chain rolled back
    and then grown again through the store is legitimately signed: it is as long as the
    anchor (and longer), yet its entry at the anchored number is another one."""
    anchored, _ = head(pg, "w3")
    anchor = world.checkpoint()
    cut_last_transition(pg, "w3")
    world.transition("w3", "suspended")  # the same move again: another time, another entry
    assert head(pg, "w3")[0] == anchored
    assert_only_mismatch(world, anchor, "w3", anchored, anchored, "diverges")
    world.transition("w3", "active")
    assert_only_mismatch(world, anchor, "w3", anchored, anchored + 1, "diverges")


def test_wacp_3_chain_removed_whole_is_gone_against_the_anchor(
        world: EnvelopeStore, pg: Any) -> None:
    """WACP §3 Integrity: an anchor naming a chain the database no longer has is a failure
    (a workspace with no relations, removed with its whole chain)."""
    world.create_workspace("coordinator", workspace_id="lonely")
    (length, _) = head(pg, "lonely")
    anchor = world.checkpoint()
    rows(pg, "DELETE FROM agentpost.trail WHERE chain = 'lonely'")
    rows(pg, "DELETE FROM agentpost.workspaces WHERE id = 'lonely'")
    assert_only_mismatch(world, anchor, "lonely", length, 0, "gone")


def test_wacp_3_new_chains_and_new_entries_after_the_anchor_are_fine(
        world: EnvelopeStore, pg: Any) -> None:
    """Entries appended after the checkpoint and chains created since do not fail it; the
    anchor is taken as the Checkpoint, its JSON text (a file) or its dict (an XCom)."""
    anchor = world.checkpoint()
    world.create_workspace("worker", parent="coord", workspace_id="w4")
    world.send("coord", "w4", "directive", "welcome")
    world.send("coord", "w1", "feedback", "more")
    world.inject("bob", "w2", "feedback", "a human says hi")
    for given in (anchor, anchor.to_json(), anchor.to_json().encode(), anchor.to_dict(),
                  json.loads(json.dumps(anchor.to_dict()))):
        result = world.verify_trail(anchor=given)
        assert result.ok, result
        assert result.anchored_chains == len(anchor.heads) == 4  # coord, w1, w2, w3
        assert result.chains > result.anchored_chains
        assert result.anchor_taken_at == anchor.taken
        assert result.anchor_mismatches == ()


def test_wacp_3_checkpoint_is_every_chain_head_signed(world: EnvelopeStore, pg: Any) -> None:
    """The checkpoint names each chain's last entry (what a full scan finds), and survives the
    trip through JSON unchanged."""
    world.inject("bob", "w1", "feedback", "from a person")  # a human:bob chain too
    anchor = world.checkpoint()
    expected = rows(pg, "SELECT DISTINCT ON (chain) chain, chain_seq, hash FROM agentpost.trail"
                        " ORDER BY chain, chain_seq DESC")
    assert {(h.chain, h.seq, h.hash) for h in anchor.heads} == {
        (c, s, bytes(h)) for c, s, h in expected}
    assert "human:bob" in {h.chain for h in anchor.heads}
    (now,), = rows(pg, "SELECT now()")
    assert abs((now - anchor.taken).total_seconds()) < 60
    assert Checkpoint.from_json(anchor.to_json()) == anchor
    assert anchor.verify(world.settings.trail_key.encode()) is anchor


def test_wacp_3_checkpoint_of_an_empty_trail_anchors_nothing(store: EnvelopeStore) -> None:
    anchor = store.checkpoint()
    assert anchor.heads == ()
    result = store.verify_trail(anchor=anchor.to_json())
    assert result.ok and result.anchored_chains == 0


# -- anchors that anchor nothing ---------------------------------------------------------------


@pytest.fixture(scope="module")
def signed(module_dsn: str) -> Iterator[tuple[EnvelopeStore, dict[str, Any]]]:
    """A store with a few chains, and a checkpoint of it as a dict."""
    with EnvelopeStore(module_dsn, ack_timeout=0.2) as store:
        build(store)
        yield store, store.checkpoint().to_dict()


def _edited(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], str]:
    def edit(manifest: dict[str, Any]) -> str:
        copy = json.loads(json.dumps(manifest))
        change(copy)
        return json.dumps(copy)
    return edit


def _resigned(manifest: dict[str, Any]) -> str:
    """Edited, then signed again with a key that is not the trail key."""
    heads = [ChainHead(c, v["seq"] - (c == "w3"), bytes.fromhex(v["hash"]))
             for c, v in manifest["chains"].items()]
    return Checkpoint.sign(b"a guessed key", Checkpoint.from_json(manifest).taken, heads
                           ).to_json()


EDITS: dict[str, Callable[[dict[str, Any]], str | bytes]] = {
    # signed content changed: the signature gives it away
    "seq lowered (would hide a cut)": _edited(lambda m: m["chains"]["w3"].update(
        seq=m["chains"]["w3"]["seq"] - 1)),
    "hash replaced": _edited(lambda m: m["chains"]["w1"].update(hash="ab" * 32)),
    "chain dropped": _edited(lambda m: m["chains"].pop("w3")),
    "chain added": _edited(lambda m: m["chains"].update(w9={"seq": 1, "hash": "00" * 32})),
    "taken_at moved": _edited(lambda m: m.update(taken_at="2001-01-01T00:00:00.000000Z")),
    "row count lowered (would hide a deletion)": _edited(
        lambda m: m["rows"]["envelope"].update(count=m["rows"]["envelope"]["count"] - 1)),
    "row sum replaced": _edited(lambda m: m["rows"]["envelope"].update(sum="0" * 16)),
    "made version 1 without its row digests": _edited(
        lambda m: (m.update(version=1), m.pop("rows"))),
    "signed with another key": _resigned,
    "signature replaced": _edited(lambda m: m.update(mac="00" * 32)),
    # malformed
    "no signature": _edited(lambda m: m.pop("mac")),
    "unknown field": _edited(lambda m: m.update(note="trust me")),
    "other version": _edited(lambda m: m.update(version=3)),
    "version 1 with row digests": _edited(lambda m: m.update(version=1)),
    "rows of a kind dropped": _edited(lambda m: m["rows"].pop("route")),
    "rows of an unknown kind": _edited(lambda m: m["rows"].update(
        mark={"count": 0, "sum": "0" * 16})),
    "rows a list": _edited(lambda m: m.update(rows=[])),
    "row count negative": _edited(lambda m: m["rows"]["role"].update(count=-1)),
    "row count as text": _edited(lambda m: m["rows"]["role"].update(count="1")),
    "row sum upper case": _edited(lambda m: m["rows"]["role"].update(sum="ABCDEF0123456789")),
    "row sum short": _edited(lambda m: m["rows"]["role"].update(sum="abc")),
    "row digest with an extra field": _edited(lambda m: m["rows"]["role"].update(note=1)),
    "version true": _edited(lambda m: m.update(version=True)),
    "other format": _edited(lambda m: m.update(format="something-else")),
    "seq as text": _edited(lambda m: m["chains"]["w1"].update(seq="3")),
    "seq zero": _edited(lambda m: m["chains"]["w1"].update(seq=0)),
    "seq fraction": _edited(lambda m: m["chains"]["w1"].update(seq=2.5)),
    "hash upper case": _edited(lambda m: m["chains"]["w1"].update(
        hash=m["chains"]["w1"]["hash"].upper())),
    "hash short": _edited(lambda m: m["chains"]["w1"].update(hash="abcd")),
    "chains a list": _edited(lambda m: m.update(chains=[])),
    "NUL in a chain name": _edited(lambda m: m["chains"].update(
        {"w\x00": m["chains"]["w1"]})),
    "taken_at not a time": _edited(lambda m: m.update(taken_at="yesterday")),
    "taken_at without zone": _edited(lambda m: m.update(taken_at="2030-01-01T00:00:00")),
    "duplicate chain": lambda m: json.dumps(m).replace(
        '"chains": {', '"chains": {"w1": {"seq": 1, "hash": "' + "00" * 32 + '"}, ', 1),
    "NaN": lambda m: json.dumps(m).replace('"version": 2', '"version": NaN'),
    "not JSON": lambda m: json.dumps(m)[:-1],
    "a JSON list": lambda m: json.dumps([m]),
    "empty": lambda m: "",
    "not UTF-8": lambda m: b"\xff" + json.dumps(m).encode(),
}


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_wacp_3_edited_or_forged_anchor_is_refused(
        signed: tuple[EnvelopeStore, dict[str, Any]], edit: str) -> None:
    """WACP §3 Integrity: a checkpoint whose content was edited, or that is not signed with
    the trail key, or is malformed, anchors nothing: verify_trail refuses it with a typed,
    one-line InvalidAnchor (an InvalidInput), never reporting a pass."""
    store, manifest = signed
    assert store.verify_trail(anchor=manifest).ok  # the untouched one verifies
    bad = EDITS[edit](manifest)
    with pytest.raises(InvalidAnchor) as info:
        store.verify_trail(anchor=bad)
    assert isinstance(info.value, InvalidInput)
    message = str(info.value)
    assert message.startswith("not a usable trail checkpoint: ")
    assert "\n" not in message and "Traceback" not in message and len(message) < 300


def test_wacp_3_anchor_of_another_trail_key_is_refused(dsn: str, world: EnvelopeStore) -> None:
    """A checkpoint signed by a store with another key does not anchor this one's trail."""
    with EnvelopeStore(dsn, trail_key="some-other-key") as other:
        foreign = other.checkpoint()
    with pytest.raises(InvalidAnchor, match="signature"):
        world.verify_trail(anchor=foreign)
    with pytest.raises(InvalidAnchor):
        world.verify_trail(anchor=42)  # type: ignore[arg-type]


# -- the command line ---------------------------------------------------------------------------


def test_wacp_3_cli_checkpoint_then_verify_against_it(world: EnvelopeStore, pg: Any, dsn: str,
                                                     tmp_path: Path) -> None:
    """`agentpost checkpoint --out FILE`, then `agentpost verify --anchor FILE`: 0 while the
    trail reaches it, 1 naming the chain once its end is cut (plain verify still 0), 2 with
    one line for an edited or missing file."""
    path = tmp_path / "anchor.json"
    taken = agentpost(dsn, "checkpoint", "--out", str(path))
    assert taken.code == 0, taken.err
    assert f"written to {path}" in taken.out
    assert Checkpoint.from_json(path.read_text()).heads == world.checkpoint().heads

    printed = agentpost(dsn, "checkpoint")
    assert printed.code == 0, printed.err
    assert json.loads(printed.out)["format"] == "agentpost.trail-checkpoint"

    ok = agentpost(dsn, "verify", "--anchor", str(path))
    assert ok.code == 0, ok.err
    assert "every chain reaches the checkpoint" in ok.out

    anchored, _ = head(pg, "w3")
    cut_last_transition(pg, "w3")
    assert agentpost(dsn, "verify").code == 0
    failed = agentpost(dsn, "verify", "--anchor", str(path))
    assert failed.code == 1
    assert "FAILED" in failed.err and "chain w3 is shorter" in failed.err
    assert f"the checkpoint has seq {anchored}" in failed.err
    assert failed.out == ""

    edited = json.loads(path.read_text())
    edited["chains"]["w3"]["seq"] -= 1
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(edited))
    line = assert_one_line_error(agentpost(dsn, "verify", "--anchor", str(forged)), 2)
    assert "signature" in line
    line = assert_one_line_error(agentpost(dsn, "verify", "--anchor",
                                           str(tmp_path / "missing.json")), 2)
    assert "cannot read" in line
