"""The trail protects envelope rows, not only its own entries (WACP §3, Integrity: the
envelope's integrity proof is verified; WACP §11 "Trail recording").

Every entry of an event that changes an envelope's row signs the row's state (status, reason,
delivery and consumption times, redeliveries, leases), and the entry that creates it also
signs the fields that never change (in clear, or as SHA-256 digests of the payload and the
routing fields). `verify_trail()` compares every row with those entries and names the
envelope and the field. These tests edit rows directly, as a database owner could, and cut
lease, nack and expiry entries off the end of a chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentpost.pg.migrations import load, migrate
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import connect, rows
from test_leases import SHORT_TTL, fill, send, topology, wait_past


@pytest.fixture
def inbox(store: EnvelopeStore) -> EnvelopeStore:
    topology(store, ["w1", "w2"])
    return store


def _acked(store: EnvelopeStore) -> str:
    [eid] = fill(store, "w1", 1)
    [lease] = store.lease("w1")
    store.ack(lease.token)
    return eid


def _nacked(store: EnvelopeStore) -> str:
    [eid] = fill(store, "w1", 1)
    [lease] = store.lease("w1")
    store.nack(lease.token)
    return eid


def _waiting(store: EnvelopeStore) -> str:
    return send(store, "w1", "plain")


def _queued(store: EnvelopeStore) -> str:
    """An envelope queued (validated) behind a blocking one."""
    send(store, "w1", "gate", priority="blocking")
    eid = _waiting(store)
    assert store.get(eid).status is Status.VALIDATED
    return eid


def _reply(store: EnvelopeStore) -> str:
    first = _waiting(store)
    return store.send("boss", "w1", "directive", "again", in_reply_to=first).envelope_id


# (what to make, the edit, the field verification must name)
EDITS = [
    pytest.param(_waiting, "content = 'something else'", "content_sha256", id="content"),
    pytest.param(_acked, "consumed_at = NULL", "consumed_at_us", id="consumed-at-cleared"),
    pytest.param(_waiting, "priority = 'blocking'", "priority", id="priority-raised"),
    pytest.param(_waiting, "originator = 'mallory'", "originator", id="originator"),
    pytest.param(_nacked, "redeliveries = 0", "redeliveries", id="redeliveries-reset"),
    pytest.param(_nacked, "leases = 0", "leases", id="leases-reset"),
    pytest.param(_acked, "status = 'validated'", "status", id="status"),
    pytest.param(_queued, "recipient = 'w2'", "recipient", id="recipient"),
    pytest.param(_waiting, "type = 'feedback'", "type", id="type"),
    pytest.param(_reply, "in_reply_to = NULL", "in_reply_to", id="in-reply-to"),
    pytest.param(_waiting, "tags = ARRAY['urgent-ops']", "extras_sha256", id="tags"),
    pytest.param(_waiting, "headers = '{\"x\": 1}'", "extras_sha256", id="headers"),
    pytest.param(_waiting, "attachments = '[\"file:///etc/passwd\"]'", "extras_sha256",
                 id="attachments"),
    pytest.param(_acked, "delivered_at = delivered_at - interval '1 hour'", "delivered_at_us",
                 id="delivered-at"),
]


@pytest.mark.parametrize(("make", "edit", "field"), EDITS)
def test_wacp_integrity_an_edited_envelope_row_fails_verification(
        inbox: EnvelopeStore, pg: Any, make: Any, edit: str, field: str) -> None:
    """WACP §3 (Integrity): an envelope row edited in the table, bypassing the store, fails
    verify_trail(), which names the envelope and the field that differs from the last entry
    that signed it."""
    eid = make(inbox)
    assert inbox.verify_trail().ok
    rows(pg, f"UPDATE agentpost.envelopes SET {edit} WHERE id = %s", (eid,))
    result = inbox.verify_trail()
    assert not result.ok, f"editing {edit!r} passed verification"
    assert eid in result.failure and field in result.failure, result.failure


def test_wacp_integrity_rows_of_a_busy_store_verify(inbox: EnvelopeStore) -> None:
    """Every path that changes a row signs what it leaves: sends (fast path and batches),
    rejections, deliveries, leases, nacks, expiries, dead letters, acks and consume() leave a
    store that verifies."""
    fill(inbox, "w1", 3)
    send(inbox, "w2", "fast path")
    inbox.send("w1", "boss", "directive", "not allowed")  # rejected: permission_denied
    [first, second, *_] = inbox.lease("w1", max=10, ttl=SHORT_TTL)
    inbox.ack(first.token)
    inbox.nack(second.token)
    wait_past([second])
    inbox.expire_leases()
    for _ in range(4):
        leases = inbox.lease("w2")
        if not leases:
            break
        inbox.nack(leases[0].token)
    for envelope in inbox.inbox("w1"):
        inbox.consume("w1", envelope.id)
    result = inbox.verify_trail()
    assert result.ok, result


def _cut_tail(pg: Any, chain: str, event: str) -> None:
    """Delete the last entry of `chain`, which must be an `event` entry."""
    [(last_id, last_event)] = rows(
        pg, "SELECT id, event FROM agentpost.trail WHERE chain = %s"
            " ORDER BY chain_seq DESC LIMIT 1", (chain,))
    assert last_event == event
    rows(pg, "DELETE FROM agentpost.trail WHERE id = %s", (last_id,))


def _leased(store: EnvelopeStore) -> str:
    [eid] = fill(store, "w1", 1)
    store.lease("w1", ttl=60)
    return eid


def _nacked_twice(store: EnvelopeStore) -> str:
    eid = _nacked(store)
    [lease] = store.lease("w1")
    store.nack(lease.token)
    return eid


def _expired(store: EnvelopeStore) -> str:
    [eid] = fill(store, "w1", 1)
    [lease] = store.lease("w1", ttl=SHORT_TTL)
    wait_past([lease])
    store.expire_leases()
    assert store.get(eid).redeliveries == 1
    return eid


@pytest.mark.parametrize(("make", "event", "field"), [
    pytest.param(_leased, "envelope_leased", "leases", id="lease"),
    pytest.param(_nacked_twice, "lease_nacked", "redeliveries", id="nack"),
    pytest.param(_expired, "lease_expired", "redeliveries", id="expiry"),
])
def test_wacp_integrity_a_cut_tail_of_lease_entries_is_found(
        inbox: EnvelopeStore, pg: Any, make: Any, event: str, field: str) -> None:
    """WACP §3 (Integrity): cutting a lease, nack or expiry entry off the end of the inbox's
    chain leaves the chain itself well linked, but the envelope's row no longer matches the
    last entry that signed it: verification fails and names the envelope and the field."""
    eid = make(inbox)
    assert inbox.verify_trail().ok
    _cut_tail(pg, "w1", event)
    result = inbox.verify_trail()
    assert not result.ok, f"cutting the {event} tail passed verification"
    assert eid in result.failure and field in result.failure, result.failure


def test_wacp_integrity_dead_letter_rows_are_signed(inbox: EnvelopeStore, pg: Any) -> None:
    """A dead-lettered envelope cannot be quietly put back in the inbox: setting its status
    back to acknowledged is named."""
    [eid] = fill(inbox, "w1", 1)
    for _ in range(4):
        [lease] = inbox.lease("w1")
        inbox.nack(lease.token)
    assert inbox.get(eid).status is Status.UNDELIVERABLE
    assert inbox.verify_trail().ok
    rows(pg, "UPDATE agentpost.envelopes SET status = 'acknowledged', reason = NULL,"
             " redeliveries = 0 WHERE id = %s", (eid,))
    result = inbox.verify_trail()
    assert not result.ok and eid in result.failure, result


def test_wacp_integrity_a_store_upgraded_mid_life_verifies(empty_dsn: str,
                                                            tmp_path: Path) -> None:
    """A store migrated before rows were signed (entries without `row`) keeps verifying after
    the upgrade: its old envelopes are compared from their first signed entry on, and an edit
    after that is still named."""
    older = tmp_path / "sql"
    older.mkdir()
    for migration in load():
        if migration.version < 17:
            (older / migration.name).write_text(migration.sql)
    migrate(empty_dsn, source=older)
    with EnvelopeStore(empty_dsn) as store:
        topology(store)
        old_acked, old_leased = fill(store, "w1", 2)
        [lease] = store.lease("w1")
        assert lease.envelope_id == old_acked
        store.ack(lease.token)
        [held] = store.lease("w1", ttl=60)
    migrate(empty_dsn)
    with EnvelopeStore(empty_dsn) as store:
        store.nack(held.token)  # the first entry of old_leased that signs its row
        fill(store, "w1", 1)
        assert store.verify_trail().ok
        rows_conn = connect(empty_dsn)
        try:
            rows(rows_conn, "UPDATE agentpost.envelopes SET redeliveries = 0 WHERE id = %s",
                 (old_leased,))
        finally:
            rows_conn.close()
        result = store.verify_trail()
        assert not result.ok and old_leased in result.failure, result
        assert "redeliveries" in result.failure
