"""Tamper-evidence of the trail: verify_trail() and `agentpost verify` against a real database
that is tampered with directly, as its owner would (psycopg2, bypassing the store).

Each tampering test checks that verification fails and names the first bad entry: its id, its
chain and its sequence number.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from agentpost.pg.server import libpq_dsn
from agentpost.protocol.models import TrailEvent
from agentpost.store import EnvelopeStore

# -- helpers ----------------------------------------------------------------------------------


def execute(conn: Any, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def row(conn: Any, entry_id: int) -> dict[str, Any]:
    with conn.cursor() as cur:
        cur.execute("SELECT id, chain, chain_seq, event, envelope_id, at, record, prev_hash,"
                    " hash, mac FROM agentpost.trail WHERE id = %s", (entry_id,))
        names = [d.name for d in cur.description]
        values = cur.fetchone()
    assert values is not None
    return dict(zip(names, values, strict=True))


def chain(store: EnvelopeStore, name: str) -> list[TrailEvent]:
    return sorted(store.trail(workspace_id=name), key=lambda e: e.seq)


def populate(store: EnvelopeStore, dsn: str) -> dict[str, str]:
    """A busy store: registry changes, every kind of send outcome, queueing, blocking,
    consumption, rights granted, transferred, consumed and revoked, a timed-out delivery and
    its redelivery, a sealed target. Returns a few envelope ids."""
    store.define_role("reviewer", inherits="worker")
    store.register_type("report", ["reviewer"], ["coordinator"], ["verdict"])
    store.register_type("peer_note", ["worker"], ["worker"])
    store.create_workspace("coordinator", workspace_id="coord", originator="alice")
    for w in ("w1", "w2"):
        store.create_workspace("worker", parent="coord", workspace_id=w)
    store.create_workspace("reviewer", parent="coord", workspace_id="rev")
    store.create_workspace("worker", parent="coord", workspace_id="w3")

    first = store.send("coord", "w1", "directive", "start").envelope_id
    store.send("w1", "coord", "query", "which part?")
    store.send("coord", "w1", "feedback", "part two", priority="urgent", in_reply_to=first)
    store.send("coord", "w1", "nonsense", "rejected: invalid_type")
    store.send("w1", "w2", "peer_note", "rejected: no_send_right")
    store.send_many([{"from": "coord", "to": "w2", "type": "directive", "content": f"job {i}"}
                     for i in range(3)])
    store.inject("bob", "w2", "feedback", "a human says hi")
    store.send("rev", "coord", "report", {"verdict": "ok"}, format="json")
    gate = store.send("coord", "w1", "feedback", "stop", priority="blocking").envelope_id
    store.send("coord", "w1", "directive", "after the gate")
    store.consume("w1", gate)
    store.send("coord", "w1", "directive", "meet w2", rights=[{"type": "send", "target": "w2"}])
    store.send("w1", "w2", "peer_note", "hello")
    store.grant_right("coord", "w2", "w1", "send_once")
    store.send("w2", "w1", "peer_note", "once")
    store.transition("w3", "suspended")
    store.send("coord", "w3", "directive", "queued, then undeliverable")
    store.transition("w3", "closed")
    store.transition("w2", "active")
    (right,) = [r for r in store.rights("coord") if r.target == "rev"]
    store.revoke_right(right.id, "coord", "review done")

    # a delivery that times out, then goes through
    conn = psycopg2.connect(libpq_dsn(dsn))
    conn.autocommit = True
    try:
        execute(conn, "SELECT pg_advisory_lock(agentpost._chain_key('w2'))")
        late = store.send("coord", "w2", "directive", "late").envelope_id
        assert store.get(late).status == "validated"
    finally:
        conn.close()
    deadline = time.monotonic() + 10
    while store.get(late).status == "validated":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        store.redeliver()

    last = store.send("coord", "w1", "directive", "the last word").envelope_id
    return {"first": first, "last": last}


def verify_cli(dsn: str, key: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agentpost")
    command = str(exe) if exe.exists() else shutil.which("agentpost")
    assert command, "the agentpost console script is not installed"
    env = {**os.environ, "AGENTPOST_TRAIL_KEY": key}
    env.pop("AGENTPOST_DSN", None)
    return subprocess.run([command, "--dsn", dsn, "verify"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def assert_names(store: EnvelopeStore, entry: dict[str, Any] | TrailEvent) -> None:
    """verify_trail() fails, and names exactly this entry."""
    if isinstance(entry, TrailEvent):
        expected = (entry.id, entry.chain, entry.seq)
    else:
        expected = (entry["id"], entry["chain"], entry["chain_seq"])
    result = store.verify_trail()
    assert not result.ok
    assert (result.failure_id, result.failure_chain, result.failure_seq) == expected, result
    assert result.failures >= 1
    assert result.failure


def middle(store: EnvelopeStore, name: str = "w1") -> tuple[TrailEvent, TrailEvent, TrailEvent]:
    """An entry in the middle of a chain, with its neighbours."""
    entries = chain(store, name)
    assert len(entries) >= 9
    k = len(entries) // 2
    return entries[k - 1], entries[k], entries[k + 1]


@pytest.fixture
def busy(store: EnvelopeStore, dsn: str) -> dict[str, str]:
    return populate(store, dsn)


# -- an untouched trail -----------------------------------------------------------------------


def test_untouched_busy_trail_verifies(store: EnvelopeStore, busy: dict[str, str],
                                       pg: Any, dsn: str) -> None:
    (count, chains) = execute(pg, "SELECT count(*), count(DISTINCT chain) FROM agentpost.trail")[0]
    events = {e for (e,) in execute(pg, "SELECT DISTINCT event FROM agentpost.trail")}
    assert {"envelope_created", "envelope_delivered", "envelope_rejected",
            "envelope_undeliverable", "envelope_consumed", "envelope_delivery_failed",
            "port_right_created", "port_right_transferred", "port_right_consumed",
            "port_right_revoked", "signal_emitted", "workspace_transition",
            "type_registered", "role_defined"} <= events
    result = store.verify_trail()
    assert result.ok, result
    assert (result.entries, result.chains, result.failures) == (count, chains, 0)
    assert result.failure_id is None and result.failure is None

    cli = verify_cli(dsn, store.settings.trail_key)
    assert cli.returncode == 0, cli.stderr
    assert f"{count} entries in {chains} chains" in cli.stdout


# -- tampering --------------------------------------------------------------------------------


def test_changed_record_text_is_found(store: EnvelopeStore, busy: dict[str, str], pg: Any) -> None:
    _, victim, _ = middle(store)
    execute(pg, "UPDATE agentpost.trail SET record = replace(record, '\"seq\"', ' \"seq\"')"
                " WHERE id = %s", (victim.id,))
    assert_names(store, victim)


def test_changed_body_value_is_found(store: EnvelopeStore, busy: dict[str, str],
                                     pg: Any) -> None:
    (victim,) = store.trail(envelope_id=busy["first"], event="envelope_created")
    execute(pg, "UPDATE agentpost.trail SET record = replace(record, '\"to\": \"w1\"',"
                " '\"to\": \"w2\"') WHERE id = %s", (victim.id,))
    assert "w2" in row(pg, victim.id)["record"]
    assert_names(store, victim)


def test_changed_prev_hash_is_found(store: EnvelopeStore, busy: dict[str, str], pg: Any) -> None:
    _, victim, _ = middle(store)
    execute(pg, "UPDATE agentpost.trail SET prev_hash = sha256(prev_hash) WHERE id = %s",
            (victim.id,))
    assert_names(store, victim)


def test_relinked_entry_is_found(store: EnvelopeStore, busy: dict[str, str], pg: Any) -> None:
    """prev_hash changed and the entry's own hash recomputed to match: the signature gives it
    away (the tamperer does not have the key)."""
    _, victim, _ = middle(store)
    execute(pg, "UPDATE agentpost.trail SET prev_hash = sha256(prev_hash),"
                " hash = sha256(sha256(prev_hash) || convert_to(record, 'UTF8'))"
                " WHERE id = %s", (victim.id,))
    assert_names(store, victim)


def test_deleted_middle_entry_is_found(store: EnvelopeStore, busy: dict[str, str],
                                       pg: Any) -> None:
    _, victim, following = middle(store)
    execute(pg, "DELETE FROM agentpost.trail WHERE id = %s", (victim.id,))
    assert_names(store, following)  # the first entry left that no longer links


@pytest.mark.parametrize("columns", [
    ("record",),
    ("record", "prev_hash", "hash", "mac", "event", "envelope_id", "at"),
])
def test_swapped_entries_are_found(store: EnvelopeStore, busy: dict[str, str], pg: Any,
                                   columns: tuple[str, ...]) -> None:
    """Two neighbouring entries of a chain swap their signed content (just the records, or
    everything but the position): the first of them is named."""
    _, a, b = middle(store)
    ra, rb = row(pg, a.id), row(pg, b.id)
    assert ra["record"] != rb["record"]
    assignments = ", ".join(f"{c} = %s" for c in columns)
    execute(pg, f"UPDATE agentpost.trail SET {assignments} WHERE id = %s",
            (*[rb[c] for c in columns], a.id))
    execute(pg, f"UPDATE agentpost.trail SET {assignments} WHERE id = %s",
            (*[ra[c] for c in columns], b.id))
    assert_names(store, a)


@pytest.mark.parametrize(("column", "value"), [
    ("event", "envelope_consumed"),
    ("envelope_id", "00000000-0000-0000-0000-000000000000"),
    ("at", "2001-01-01T00:00:00+00"),
])
def test_changed_column_outside_the_record_is_found(store: EnvelopeStore, busy: dict[str, str],
                                                    pg: Any, column: str, value: str) -> None:
    """A column the store reads back (trail() returns it) changed without touching the signed
    record."""
    (victim,) = store.trail(envelope_id=busy["first"], event="envelope_delivered")
    execute(pg, f"UPDATE agentpost.trail SET {column} = %s WHERE id = %s", (value, victim.id))
    assert_names(store, victim)


def forged(prev: dict[str, Any], event: str, body: dict[str, Any], key: bytes) -> dict[str, Any]:
    """An entry that links correctly after `prev`, signed with `key`."""
    seq = prev["chain_seq"] + 1
    record = json.dumps({"seq": seq, "body": body, "at_us": int(time.time() * 1e6),
                         "chain": prev["chain"], "event": event, "envelope_id": None})
    digest = hashlib.sha256(bytes(prev["hash"]) + record.encode()).digest()
    return {"chain": prev["chain"], "chain_seq": seq, "event": event, "record": record,
            "prev_hash": bytes(prev["hash"]), "hash": digest,
            "mac": hmac.new(key, digest, hashlib.sha256).digest()}


def insert(pg: Any, entry: dict[str, Any]) -> int:
    return execute(pg, """
        INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at, record, prev_hash,
                                     hash, mac)
        VALUES (%(chain)s, %(chain_seq)s, %(event)s, NULL, clock_timestamp(), %(record)s,
                %(prev_hash)s, %(hash)s, %(mac)s)
        RETURNING id""", entry)[0][0]


def test_appended_entry_signed_with_wrong_key_is_found(store: EnvelopeStore,
                                                       busy: dict[str, str], pg: Any) -> None:
    last = chain(store, "coord")[-1]
    entry = forged(row(pg, last.id), "port_right_created",
                   {"right_id": "right-forged", "right_type": "send", "holder": "w3",
                    "target": "coord", "created_by": "coord"}, b"not the trail key")
    new_id = insert(pg, entry)
    assert_names(store, {"id": new_id, "chain": "coord", "chain_seq": entry["chain_seq"]})


def test_rewritten_chain_signed_with_wrong_key_is_found(store: EnvelopeStore,
                                                        busy: dict[str, str], pg: Any) -> None:
    """A middle entry replaced and every later entry of its chain re-hashed and re-signed so
    the chain links perfectly, but with a key that is not the trail key."""
    key = b"a guessed key"
    before, victim, _ = middle(store)
    later = [e for e in chain(store, "w1") if e.seq > victim.seq]
    prev = row(pg, before.id)
    replacement = forged(prev, "envelope_consumed",
                         {"envelope_id": busy["first"], "workspace_id": "w1"}, key)
    execute(pg, "UPDATE agentpost.trail SET event = %s, envelope_id = NULL, record = %s,"
                " prev_hash = %s, hash = %s, mac = %s WHERE id = %s",
            (replacement["event"], replacement["record"], replacement["prev_hash"],
             replacement["hash"], replacement["mac"], victim.id))
    prev_hash = replacement["hash"]
    for e in later:
        r = row(pg, e.id)
        digest = hashlib.sha256(prev_hash + r["record"].encode()).digest()
        execute(pg, "UPDATE agentpost.trail SET prev_hash = %s, hash = %s, mac = %s"
                    " WHERE id = %s",
                (prev_hash, digest, hmac.new(key, digest, hashlib.sha256).digest(), e.id))
        prev_hash = digest
    assert_names(store, victim)


def test_removed_chain_end_that_recorded_a_delivery_is_found(
        store: EnvelopeStore, busy: dict[str, str], pg: Any) -> None:
    """The last entries of the receiver's chain (the delivery of the last envelope and its
    acknowledgment) are cut off: what is left is a valid prefix, but the envelope row says it
    was delivered. No entry is left to name: the failure names the receiver's chain, whose
    end was removed, and the envelope."""
    eid = busy["last"]
    (delivered,) = store.trail(envelope_id=eid, event="envelope_delivered")
    assert delivered.chain == "w1"
    tail = [e for e in chain(store, "w1") if e.seq >= delivered.seq]
    assert [e.event for e in tail] == ["envelope_delivered", "signal_emitted"]
    execute(pg, "DELETE FROM agentpost.trail WHERE chain = 'w1' AND chain_seq >= %s",
            (delivered.seq,))

    result = store.verify_trail()
    assert not result.ok
    assert result.failure_id is None  # nothing left to point at
    assert eid in (result.failure or "")
    assert result.failure_chain == "w1", result


# -- the command line and the key -------------------------------------------------------------


def test_cli_verify_names_the_tampered_entry(store: EnvelopeStore, busy: dict[str, str],
                                             pg: Any, dsn: str) -> None:
    _, victim, _ = middle(store)
    assert verify_cli(dsn, store.settings.trail_key).returncode == 0
    execute(pg, "UPDATE agentpost.trail SET record = replace(record, '\"seq\"', ' \"seq\"')"
                " WHERE id = %s", (victim.id,))
    cli = verify_cli(dsn, store.settings.trail_key)
    assert cli.returncode == 1
    assert f"entry #{victim.id} (chain {victim.chain}, seq {victim.seq})" in cli.stderr
    assert "FAILED" in cli.stderr
    assert cli.stdout == ""


def test_wrong_key_fails_on_the_first_entry(store: EnvelopeStore, busy: dict[str, str],
                                            pg: Any, dsn: str) -> None:
    first_id, first_chain, first_seq = execute(
        pg, "SELECT id, chain, chain_seq FROM agentpost.trail ORDER BY id LIMIT 1")[0]
    assert first_seq == 1
    with EnvelopeStore(dsn, trail_key="some-other-key", ack_timeout=0.2) as other:
        result = other.verify_trail()
    assert not result.ok
    assert (result.failure_id, result.failure_chain, result.failure_seq) == (
        first_id, first_chain, 1)
    assert "signature" in (result.failure or "")
    # every chain fails at its first entry
    assert result.failures == result.chains

    cli = verify_cli(dsn, "some-other-key")
    assert cli.returncode == 1
    assert f"entry #{first_id} (chain {first_chain}, seq 1)" in cli.stderr
    # and the right key still verifies the same, untouched trail
    assert verify_cli(dsn, store.settings.trail_key).returncode == 0
    assert store.verify_trail().ok
