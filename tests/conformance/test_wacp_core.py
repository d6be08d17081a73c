"""WACP envelope spec, §11 conformance: one test (or a few) per Core and Full row.

Every test runs against a real, freshly migrated Postgres database (the ``store`` / ``dsn``
fixtures of conftest.py; the store's acknowledgment timeout is 0.2 s). Test names carry the
row they cover; each docstring quotes it.
"""

from __future__ import annotations

import inspect
import itertools
import json
import multiprocessing
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg2
import pytest
from pydantic import ValidationError

from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.protocol.models import Draft, RejectionReason
from agentpost.store import EnvelopeStore
from dbtools import query as _query

# §9, verbatim
SPEC_REJECTION_REASONS = {
    "permission_denied", "no_send_right", "invalid_type", "invalid_structure",
    "target_not_found", "target_terminal",
}
# §3, the envelope schema's fields (payload's sub-fields are checked separately)
SPEC_ENVELOPE_FIELDS = {
    "id", "from", "to", "originator", "type", "payload", "in_reply_to", "rights", "priority",
    "timestamp", "origin", "status",
}
SPEC_STATUSES = {"created", "validated", "delivered", "acknowledged", "rejected"}


# -- helpers --------------------------------------------------------------------------------


@contextmanager
def _conn(dsn: str) -> Iterator[Any]:
    """A plain autocommit psycopg2 connection of our own (not the store's pool)."""
    conn = psycopg2.connect(libpq_dsn(dsn))
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()




def _world(store: EnvelopeStore) -> None:
    """coord → w1, w2 (children); coord2 → w3 (child). Rights follow the parent edges only."""
    store.create_workspace("coordinator", workspace_id="coord")
    store.create_workspace("worker", parent="coord", workspace_id="w1")
    store.create_workspace("worker", parent="coord", workspace_id="w2")
    store.create_workspace("coordinator", workspace_id="coord2")
    store.create_workspace("worker", parent="coord2", workspace_id="w3")


def _draft(sender: str, to: Any, type: Any = "directive", content: Any = "hello",
           **extra: Any) -> dict[str, Any]:
    return {"from": sender, "to": to, "type": type, "content": content, **extra}


def _send1(store: EnvelopeStore, draft: dict[str, Any]):
    [result] = store.send_many([draft])
    return result


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _drain_pending(store: EnvelopeStore, dsn: str, deadline: float = 15.0) -> None:
    """Run redelivery until nothing is left validated (deliveries that lost the race for the
    receiver's lock under contention back off, §7.1)."""
    stop = time.monotonic() + deadline
    while _query(dsn, "SELECT count(*) FROM agentpost.envelopes WHERE status = 'validated'")[0][0]:
        assert time.monotonic() < stop, "validated envelopes were never delivered"
        time.sleep(0.1)
        store.redeliver()


# -- Three base envelope types ------------------------------------------------------------


def test_core_three_base_envelope_types(store: EnvelopeStore, dsn: str) -> None:
    """Three base envelope types | Core | Runtime MUST implement directive, feedback, and
    query as base types."""
    _world(store)
    builtin = {r[0] for r in _query(
        dsn, "SELECT name FROM agentpost.envelope_types WHERE builtin")}
    assert {"directive", "feedback", "query"} <= builtin

    directive = store.send("coord", "w1", "directive", "do the thing")
    feedback = store.send("coord", "w1", "feedback", "like this", in_reply_to=directive.envelope_id)
    query = store.send("w1", "coord", "query", "how exactly?")
    for result in (directive, feedback, query):
        assert result.status == "acknowledged", result
    assert [(e.type, e.sender) for e in store.inbox("w1")] == [
        ("directive", "coord"), ("feedback", "coord")]
    assert [(e.type, e.sender) for e in store.inbox("coord")] == [("query", "w1")]

    # two directions: coordinator → worker for directive/feedback, worker → coordinator for query
    for sender, to, etype in (("w1", "coord", "directive"), ("w1", "coord", "feedback"),
                              ("coord", "w1", "query")):
        result = store.send(sender, to, etype, "wrong direction")
        assert (result.status, result.reason) == ("rejected", "permission_denied"), etype
    # the type set is open, but only through the taxonomy
    assert store.send("coord", "w1", "command", "x").reason == "invalid_type"


# -- Envelope schema ------------------------------------------------------------------------


def test_core_envelope_schema_all_fields(store: EnvelopeStore) -> None:
    """Envelope schema | Core | Every envelope MUST carry all fields defined in §3.
    Runtime-assigned fields (id, timestamp, origin, status) MUST be set by the runtime, never
    by agents."""
    store.create_workspace("coordinator", workspace_id="coord", originator="alice")
    store.create_workspace("worker", parent="coord", workspace_id="w1")
    first = store.send("coord", "w1", "directive", "task one", format="markdown",
                       attachments=["checkpoint:1", "https://example.invalid/x"])
    second = store.send("coord", "w1", "feedback", '{"a": 1}', format="json",
                        in_reply_to=first.envelope_id, priority="urgent")
    human = store.inject("bob", "w1", "feedback", "from a person")
    for result in (first, second, human):
        assert result.status == "acknowledged"

    env = store.get(first.envelope_id)
    dumped = env.model_dump(by_alias=True)
    assert set(dumped) >= SPEC_ENVELOPE_FIELDS
    assert set(dumped["payload"]) >= {"format", "content", "attachments"}
    assert env.id == first.envelope_id
    assert (env.sender, env.to, env.type) == ("coord", "w1", "directive")
    assert env.originator == "alice"  # inherited from the sending workspace (§3, §4.8)
    assert env.payload.format == "markdown"
    assert env.payload.content == "task one"
    assert env.payload.attachments == ("checkpoint:1", "https://example.invalid/x")
    assert env.in_reply_to is None
    assert env.rights == ()
    assert env.priority == "normal"
    assert env.origin == "agent"
    assert env.status == "acknowledged"
    assert isinstance(env.timestamp, datetime) and env.timestamp.tzinfo is not None

    reply = store.get(second.envelope_id)
    assert (reply.in_reply_to, reply.priority, reply.payload.format) == (
        first.envelope_id, "urgent", "json")
    assert reply.timestamp > env.timestamp

    injected = store.get(human.envelope_id)
    assert (injected.origin, injected.originator, injected.sender) == ("human", "bob",
                                                                       "human:bob")
    assert len({first.envelope_id, second.envelope_id, human.envelope_id}) == 3


@pytest.mark.parametrize(("field", "value"), [
    ("id", "caller-chosen-id"),
    ("status", "acknowledged"),
    ("timestamp", "2001-01-01T00:00:00+00:00"),
    ("origin", "human"),
    ("originator", "mallory"),
])
def test_core_envelope_schema_runtime_assigned_fields(store: EnvelopeStore, dsn: str,
                                                      field: str, value: str) -> None:
    """Envelope schema | Core | Every envelope MUST carry all fields defined in §3.
    Runtime-assigned fields (id, timestamp, origin, status) MUST be set by the runtime, never
    by agents."""
    _world(store)
    [result] = store.send_many([_draft("coord", "w1", **{field: value})])
    assert (result.status, result.reason) == ("rejected", "invalid_structure")
    assert result.envelope_id != value
    with pytest.raises(NotFound):
        store.get("caller-chosen-id")
    stored = store.get(result.envelope_id)
    assert stored.id == result.envelope_id != "caller-chosen-id"
    assert stored.status == "rejected"
    assert stored.origin == "agent"
    assert stored.originator == "system"
    assert stored.timestamp.year != 2001
    assert store.inbox("w1") == []
    assert [t.event for t in store.trail(envelope_id=result.envelope_id)] == [
        "envelope_rejected", "signal_emitted"]
    # the typed draft has no place for them at all
    with pytest.raises(ValidationError):
        Draft.model_validate(_draft("coord", "w1", **{field: value}))
    # nor has send()
    with pytest.raises(TypeError):
        store.send("coord", "w1", "directive", "x", **{field: value})
    # and the row count proves nothing slipped through as a second envelope
    assert _query(dsn, "SELECT count(*) FROM agentpost.envelopes")[0][0] == 1


def test_core_envelope_schema_timestamp_monotonic_within_sender(store: EnvelopeStore) -> None:
    """Envelope schema | Core | Every envelope MUST carry all fields defined in §3. (§3:
    timestamp — assigned by the runtime at creation, not by the agent. Monotonic within the
    sending workspace.)"""
    _world(store)
    store.send("coord", "w1", "directive", "a")
    store.send("coord", "w2", "directive", "b")
    store.send("w1", "coord", "query", "c")  # a delivery into coord's own chain
    batch = []
    for i in range(400):
        to = ("w1", "w2", "nowhere")[i % 3]
        batch.append(_draft("coord", to, "directive" if i % 7 else "query", f"m{i}"))
    store.send_many(batch)
    store.send("coord", "w1", "directive", "after the batch")
    store.inject("ann", "w1", "feedback", "human in between")
    store.send_many([_draft("coord", "w2", content="x"), _draft("w1", "coord", "query")])
    store.send("coord", "w1", "directive", "last")

    mine = sorted((e for e in _envelopes_of(store, "coord")), key=lambda e: e.seq)
    assert len(mine) == 405
    stamps = [e.timestamp for e in mine]
    assert all(a < b for a, b in itertools.pairwise(stamps)), (
        "timestamps of one sender must increase with creation order")


def _envelopes_of(store: EnvelopeStore, sender: str) -> list:
    ids = [t.envelope_id for t in store.trail(workspace_id=sender)
           if t.event in ("envelope_created", "envelope_rejected") and t.body["from"] == sender]
    return [store.get(i) for i in ids]


# -- Addressed delivery ---------------------------------------------------------------------


def test_core_addressed_delivery(store: EnvelopeStore, dsn: str) -> None:
    """Addressed delivery | Core | Every envelope MUST name a from and to workspace. No
    broadcast or multicast."""
    store.create_workspace("coordinator", workspace_id="coord")
    workers = [store.create_workspace("worker", parent="coord", workspace_id=f"w{i}").id
               for i in range(3)]
    # the same directive to three workers is three envelopes, each on its own
    results = store.send_many([_draft("coord", w, content="same directive") for w in workers])
    assert all(r.status == "acknowledged" for r in results)
    assert len({r.envelope_id for r in results}) == 3
    for worker, result in zip(workers, results, strict=True):
        [env] = store.inbox(worker)
        assert (env.id, env.sender, env.to) == (result.envelope_id, "coord", worker)
        created = store.trail(envelope_id=result.envelope_id, event="envelope_created")
        delivered = store.trail(envelope_id=result.envelope_id, event="envelope_delivered")
        assert [(t.chain, t.body["from"], t.body["to"]) for t in created] == [
            ("coord", "coord", worker)]
        assert [(t.chain, t.body["to"]) for t in delivered] == [(worker, worker)]

    # no destination, several destinations, a pattern: never delivered to anyone
    bad_targets = [None, "", workers, ",".join(workers), "*", {"to": workers[0]}]
    for target in bad_targets:
        draft = _draft("coord", target)
        if target is None:
            del draft["to"]
        result = _send1(store, draft)
        assert result.status == "rejected", target
        assert result.reason in ("invalid_structure", "target_not_found"), target
    for worker in workers:
        assert len(store.inbox(worker)) == 1
    # no anonymous envelopes: without a sender there is no envelope at all
    for anonymous in ({"to": "w0", "type": "directive", "content": "x"},
                      _draft(None, "w0"), _draft("", "w0")):
        before = _query(dsn, "SELECT count(*) FROM agentpost.envelopes")[0][0]
        with pytest.raises((InvalidInput, NotFound)):
            store.send_many([anonymous])
        assert _query(dsn, "SELECT count(*) FROM agentpost.envelopes")[0][0] == before


def test_core_addressed_delivery_from_names_the_actual_sender(store: EnvelopeStore) -> None:
    """Addressed delivery | Core | Every envelope MUST name a from and to workspace. No
    broadcast or multicast. (And Automatic acknowledgment | Core | Runtime MUST emit an
    acknowledged signal to the sender upon delivery.) The human highway's sender name
    `human:<user>` must not be able to name a workspace that did not send the envelope."""
    _world(store)
    try:
        store.create_workspace("coordinator", workspace_id="human:bob")
    except (InvalidInput, Conflict):
        # the highway's names are reserved: no workspace can be confused with a person
        with pytest.raises(NotFound):
            store.workspace("human:bob")
        return
    store.create_workspace("worker", parent="human:bob", workspace_id="w-bob")
    by_workspace = store.send("human:bob", "w-bob", "directive", "from the workspace")
    by_person = store.inject("bob", "w-bob", "feedback", "from the person")
    assert by_workspace.status == by_person.status == "acknowledged"
    # the person's envelope must not name the workspace `human:bob` as its sender ...
    assert store.get(by_person.envelope_id).sender != store.get(by_workspace.envelope_id).sender
    # ... nor acknowledge the person's envelope to that workspace
    acks = [s.ref for s in store.signals("human:bob") if s.signal == "acknowledged"]
    assert acks == [by_workspace.envelope_id]


# -- Send right validation ------------------------------------------------------------------


def test_core_send_right_validation(store: EnvelopeStore) -> None:
    """Send right validation | Core | Runtime MUST verify the sender holds a valid send right
    before delivery. Envelopes without valid rights MUST be rejected."""
    _world(store)
    # coord2 is a coordinator (the matrix allows coordinator → worker directives) but holds
    # no right to w1, which belongs to coord
    result = store.send("coord2", "w1", "directive", "not yours")
    assert (result.status, result.reason) == ("rejected", "no_send_right")
    assert store.inbox("w1") == []

    right = store.grant_right("coord", "coord2", "w1", "send")
    ok = store.send("coord2", "w1", "directive", "now allowed")
    assert ok.status == "acknowledged"
    store.revoke_right(right, "coord", reason="test")
    again = store.send("coord2", "w1", "directive", "revoked")
    assert (again.status, again.reason) == ("rejected", "no_send_right")

    # a send-once right is good for exactly one envelope
    once = store.grant_right("coord", "coord2", "w1", "send_once")
    first, second = store.send_many([_draft("coord2", "w1", content="one"),
                                     _draft("coord2", "w1", content="two")])
    assert first.status == "acknowledged"
    assert (second.status, second.reason) == ("rejected", "no_send_right")
    [spent] = [r for r in store.rights("coord2", include_ended=True) if r.id == once]
    assert (spent.state, spent.via_envelope) == ("consumed", first.envelope_id)
    assert [e.content for e in store.inbox("w1")] == ["now allowed", "one"]

    # transferring a right the sender does not hold is sending without a valid right
    bad = store.send("coord", "w1", "directive", "take this", rights=[("send", "w3")])
    assert (bad.status, bad.reason) == ("rejected", "no_send_right")
    assert all(r.target != "w3" for r in store.rights("w1"))


# -- Permission validation ------------------------------------------------------------------


def test_core_permission_validation(store: EnvelopeStore) -> None:
    """Permission validation | Core | Runtime MUST check the permission matrix before
    delivery. Unauthorized envelopes MUST be rejected."""
    _world(store)
    # w1 holds a send right to coord (for queries): the matrix alone refuses these
    assert [r.target for r in store.rights("w1")] == ["coord"]
    for sender, to, etype in (("w1", "coord", "directive"), ("coord", "w1", "query"),
                              ("w1", "coord", "feedback")):
        result = store.send(sender, to, etype, "x")
        assert (result.status, result.reason) == ("rejected", "permission_denied")
    # rights granted outside the matrix do not override it
    store.grant_right("coord", "w1", "w2", "send")
    result = store.send("w1", "w2", "query", "peer talk")
    assert (result.status, result.reason) == ("rejected", "permission_denied")
    assert store.inbox("w2") == [] and store.inbox("coord") == []

    # a taxonomy-registered type adds exactly its row; a derived role inherits its parent's
    store.define_role("reviewer", inherits="worker")
    store.register_type("report", senders=["reviewer"], receivers=["coordinator"])
    store.create_workspace("reviewer", parent="coord", workspace_id="rev")
    assert store.send("rev", "coord", "report", "looks good").status == "acknowledged"
    assert store.send("rev", "coord", "query", "inherited row").status == "acknowledged"
    assert store.send("coord", "rev", "directive", "review this").status == "acknowledged"
    denied = store.send("w1", "coord", "report", "not a reviewer")
    assert (denied.status, denied.reason) == ("rejected", "permission_denied")
    assert [e.type for e in store.inbox("coord")] == ["report", "query"]


# -- Structure validation -------------------------------------------------------------------


def test_core_structure_validation(store: EnvelopeStore) -> None:
    """Structure validation | Core | Runtime MUST verify required fields, registered type,
    and non-terminal target before delivery."""
    _world(store)
    store.register_type("plan", senders=["coordinator"], receivers=["worker"],
                        required_fields=["goal"])
    no_content = _draft("coord", "w1")
    del no_content["content"]
    no_type = _draft("coord", "w1")
    del no_type["type"]
    cases = [
        (no_content, "invalid_structure"),
        (no_type, "invalid_structure"),
        (_draft("coord", "w1", content=None), "invalid_structure"),
        (_draft("coord", "w1", content=42), "invalid_structure"),
        (_draft("coord", "w1", priority="whenever"), "invalid_structure"),
        (_draft("coord", "w1", format=""), "invalid_structure"),
        (_draft("coord", "w1", content="{not json", format="json"), "invalid_structure"),
        (_draft("coord", "w1", rights=[{"type": "receive", "target": "w1"}]),
         "invalid_structure"),
        (_draft("coord", "w1", surprise="field"), "invalid_structure"),
        (_draft("coord", "w1", "plan", '{"other": 1}', format="json"), "invalid_structure"),
        (_draft("coord", "w1", "plan", "goal: prose, not json"), "invalid_structure"),
        (_draft("coord", "w1", "no-such-type"), "invalid_type"),
        (_draft("coord", "ghost"), "target_not_found"),
    ]
    for draft, reason in cases:
        result = _send1(store, draft)
        assert (result.status, result.reason) == ("rejected", reason), draft
    assert store.inbox("w1") == []
    # the well-formed versions pass
    assert _send1(store, _draft("coord", "w1", "plan", {"goal": "g"}, format="json")
                  ).status == "acknowledged"

    # sealed targets: integrating, closed, failed
    for state in ("integrating", "closed", "failed"):
        ws = store.create_workspace("worker", parent="coord", workspace_id=f"w-{state}").id
        if state == "integrating":
            store.transition(ws, "active")
        store.transition(ws, state)
        result = store.send("coord", ws, "directive", "too late")
        assert (result.status, result.reason) == ("rejected", "target_terminal"), state
        assert store.inbox(ws) == [] and store.queued(ws) == []
    # and the deliverable / queueing states are not sealed
    for state in ("active", "blocked", "suspended", "migrating"):
        ws = store.create_workspace("worker", parent="coord", workspace_id=f"w-{state}").id
        if state == "blocked":
            store.transition(ws, "active")
        store.transition(ws, state)
        assert store.send("coord", ws, "directive", "fine").status != "rejected", state


# -- Validation order: structure, then permission, then send right ---------------------------


def _order_world(store: EnvelopeStore) -> None:
    _world(store)
    store.create_workspace("worker", parent="coord", workspace_id="w-closed")
    store.transition("w-closed", "closed")


@pytest.mark.parametrize(("draft", "winner", "alone"), [
    # structure (field) + permission: worker → coordinator directive with no content
    (_draft("w1", "coord", content=None), "invalid_structure",
     [(_draft("w1", "coord"), "permission_denied"),
      (_draft("w1", "coord", "query", content=None), "invalid_structure")]),
    # structure (type) + permission: worker → worker (no row for any type), unregistered type
    (_draft("w1", "w2", "gossip"), "invalid_type",
     [(_draft("w1", "w2", "query"), "permission_denied"),
      (_draft("coord", "w1", "gossip"), "invalid_type")]),
    # structure (sealed target) + send right: coord2 holds no right to w-closed
    (_draft("coord2", "w-closed"), "target_terminal",
     [(_draft("coord2", "w1"), "no_send_right"),
      (_draft("coord", "w-closed"), "target_terminal")]),
    # structure (field) + send right
    (_draft("coord2", "w1", priority="asap"), "invalid_structure",
     [(_draft("coord2", "w1"), "no_send_right"),
      (_draft("coord", "w1", priority="asap"), "invalid_structure")]),
    # permission + send right: coord2 → w1 query (wrong direction, and no right)
    (_draft("coord2", "w1", "query"), "permission_denied",
     [(_draft("coord2", "w1"), "no_send_right"),
      (_draft("coord", "w1", "query"), "permission_denied")]),
    # all three: w3 → w1 (no right, worker → worker) with a malformed payload
    (_draft("w3", "w1", content="{", format="json"), "invalid_structure",
     [(_draft("w3", "w1"), "permission_denied"),
      (_draft("w3", "w1", "query"), "permission_denied")]),
], ids=["structure>permission", "type>permission", "terminal>send_right",
        "structure>send_right", "permission>send_right", "structure>permission>send_right"])
def test_core_validation_order(store: EnvelopeStore, draft: dict, winner: str,
                               alone: list) -> None:
    """Send right validation / Permission validation / Structure validation | Core | (§12:
    structure first, then permissions, then send rights. All must pass; the first failure
    determines the rejection reason.)"""
    _order_world(store)
    # each failure on its own gives its own reason, so the combined draft really fails twice
    for single, reason in alone:
        assert _send1(store, single).reason == reason, single
    result = _send1(store, draft)
    assert (result.status, result.reason) == ("rejected", winner)
    [entry] = store.trail(envelope_id=result.envelope_id, event="envelope_rejected")
    assert entry.body["reason"] == winner


def test_core_validation_order_permission_before_send_once_right(store: EnvelopeStore) -> None:
    """Permission validation | Core | Runtime MUST check the permission matrix before
    delivery. Unauthorized envelopes MUST be rejected. (A permission failure is decided before
    the send right is looked at: it must not spend a send-once right.)"""
    _world(store)
    once = store.grant_right("coord", "coord2", "w1", "send_once")
    denied = store.send("coord2", "w1", "query", "wrong type for this direction")
    assert denied.reason == "permission_denied"
    assert [(r.id, r.state) for r in store.rights("coord2") if r.target == "w1"] == [
        (once, "live")]
    malformed = store.send("coord2", "w1", "directive", "x", priority="soon")
    assert malformed.reason == "invalid_structure"
    assert [(r.id, r.state) for r in store.rights("coord2") if r.target == "w1"] == [
        (once, "live")]
    assert store.send("coord2", "w1", "directive", "spend it").status == "acknowledged"
    assert [r for r in store.rights("coord2") if r.target == "w1"] == []


# -- Rejections: recorded, notified, ids never reused ----------------------------------------


def _one_of_each_rejection(store: EnvelopeStore) -> dict[str, Any]:
    _world(store)
    store.create_workspace("worker", parent="coord", workspace_id="w-failed")
    store.transition("w-failed", "failed")
    drafts = {
        "permission_denied": _draft("w1", "coord", "directive"),
        "no_send_right": _draft("coord2", "w1"),
        "invalid_type": _draft("coord", "w1", "unheard-of"),
        "invalid_structure": _draft("coord", "w1", content=None),
        "target_not_found": _draft("coord", "nobody"),
        "target_terminal": _draft("coord", "w-failed"),
    }
    return {reason: _send1(store, d) for reason, d in drafts.items()}


def test_core_rejection_reasons_closed_set(store: EnvelopeStore, dsn: str) -> None:
    """Rejection reasons | Core | Rejected envelopes MUST carry a reason from the closed set
    defined in §9."""
    assert {r.value for r in RejectionReason} == SPEC_REJECTION_REASONS
    results = _one_of_each_rejection(store)
    for expected, result in results.items():
        assert (result.status, result.reason) == ("rejected", expected)
        assert store.get(result.envelope_id).reason == expected
    # every reason on record, in every place it is recorded, is from the set
    stored = {r[0] for r in _query(
        dsn, "SELECT DISTINCT reason FROM agentpost.envelopes WHERE status = 'rejected'")}
    in_trail = {json.loads(r[0])["body"]["reason"] for r in _query(
        dsn, "SELECT record FROM agentpost.trail WHERE event = 'envelope_rejected'")}
    signalled = {r[0] for r in _query(
        dsn, "SELECT DISTINCT reason FROM agentpost.signals WHERE signal = 'rejected'")}
    assert stored == in_trail == signalled == SPEC_REJECTION_REASONS


def test_core_rejection_recorded_notified_and_id_consumed(store: EnvelopeStore,
                                                         dsn: str) -> None:
    """Rejection reasons | Core | Rejected envelopes MUST carry a reason from the closed set
    defined in §9. (§4 rule 2, §9: a rejected envelope transitions to rejected, an
    envelope_rejected trail entry is recorded with the reason, the sender is notified; the
    id is consumed and never reused.)"""
    results = _one_of_each_rejection(store)
    for reason, result in results.items():
        env = store.get(result.envelope_id)
        assert (env.status, env.reason) == ("rejected", reason)
        assert env.delivered_at is None
        sender = env.sender
        [entry] = store.trail(envelope_id=env.id, event="envelope_rejected")
        assert entry.chain == sender
        assert entry.body["reason"] == reason and entry.body["envelope_id"] == env.id
        assert store.trail(envelope_id=env.id, event="envelope_created") == []
        assert store.trail(envelope_id=env.id, event="envelope_delivered") == []
        notes = [s for s in store.signals(sender) if s.ref == env.id]
        assert [(s.signal, s.reason) for s in notes] == [("rejected", reason)]
        # the receiver never sees it
        assert all(e.id != env.id for w in ("coord", "w1", "w2", "w3")
                   for e in store.inbox(w))

    # a corrected envelope is a new envelope with a new id; the old one stays rejected
    fixed = store.send("coord", "w1", "directive", "corrected")
    assert fixed.status == "acknowledged"
    old_ids = {r.envelope_id for r in results.values()}
    assert fixed.envelope_id not in old_ids
    assert len(old_ids) == len(results)
    for result in results.values():
        assert store.get(result.envelope_id).status == "rejected"
    # ids are unique across every envelope ever created, rejected ones included
    [(total, distinct)] = _query(dsn, "SELECT count(*), count(DISTINCT id) "
                                      "FROM agentpost.envelopes")
    assert total == distinct == len(results) + 1
    # and a rejected envelope is never delivered later, by any path
    store.redeliver()
    store.recover()
    for result in results.values():
        assert store.deliver(result.envelope_id) == "rejected"
        assert store.get(result.envelope_id).status == "rejected"


# -- Automatic acknowledgment ---------------------------------------------------------------


def test_core_automatic_acknowledgment(store: EnvelopeStore) -> None:
    """Automatic acknowledgment | Core | Runtime MUST emit an acknowledged signal to the
    sender upon delivery. The signal's ref field MUST carry the envelope ID."""
    _world(store)
    sent = [store.send("coord", "w1", "directive", f"d{i}").envelope_id for i in range(3)]
    sent += [r.envelope_id for r in store.send_many(
        [_draft("coord", "w2", content="batch"), _draft("coord", "w1", "feedback")])]
    query = store.send("w1", "coord", "query", "q").envelope_id
    rejected = store.send("coord", "w1", "query", "wrong").envelope_id

    acks = [s for s in store.signals("coord") if s.signal == "acknowledged"]
    assert sorted(s.ref for s in acks) == sorted(sent)  # exactly one each, nothing else
    for ack in acks:
        env = store.get(ack.ref)
        assert env.status == "acknowledged"
        assert ack.emitted_by == env.to
        assert ack.at == env.delivered_at  # one atomic step with delivery
    [w1_ack] = [s for s in store.signals("w1") if s.signal == "acknowledged"]
    assert w1_ack.ref == query
    assert all(s.ref != rejected for s in acks)

    # a duplicate delivery is suppressed and not acknowledged again (§6: exactly one)
    assert store.deliver(sent[0]) == "duplicate"
    assert [s.ref for s in store.signals("coord") if s.signal == "acknowledged"].count(
        sent[0]) == 1

    # queued: no acknowledgment until the envelope is in the inbox, then exactly one
    store.transition("w2", "suspended")
    queued = store.send("coord", "w2", "feedback", "later")
    assert queued.status == "validated"
    assert all(s.ref != queued.envelope_id for s in store.signals("coord"))
    store.transition("w2", "active")
    assert [s.signal for s in store.signals("coord") if s.ref == queued.envelope_id] == [
        "acknowledged"]
    # and the acknowledgment needs no action by the receiver: nothing was read or consumed
    assert all(e.consumed_at is None for e in store.inbox("w2"))


# -- Channel ordering -----------------------------------------------------------------------


def _assert_channel_order(store: EnvelopeStore, sender: str, receiver: str,
                          streams: dict[str, list[int]], expected_total: int) -> None:
    """Delivery order on (sender, receiver) is creation order (seq, and timestamps agree), in
    the receiver's inbox and in its trail; and each stream's own envelopes keep their send
    order."""
    inbox = [e for e in store.inbox(receiver) if e.sender == sender]
    assert len(inbox) == expected_total
    by_creation = sorted(inbox, key=lambda e: e.seq)
    assert [e.id for e in inbox] == [e.id for e in by_creation]
    stamps = [e.timestamp for e in by_creation]
    assert all(a < b for a, b in itertools.pairwise(stamps)), (
        "creation timestamps must follow creation order within a channel")
    assert [e.id for e in sorted(inbox, key=lambda e: e.timestamp)] == [
        e.id for e in by_creation]
    delivered = [t for t in store.trail(workspace_id=receiver, event="envelope_delivered")
                 if t.body["from"] == sender]
    assert [t.envelope_id for t in delivered] == [e.id for e in by_creation]
    delivered_at = [e.delivered_at for e in by_creation]
    assert all(a <= b for a, b in itertools.pairwise(delivered_at))
    # each stream's envelopes, in the order the stream sent them
    for stream, order in streams.items():
        mine = [e for e in by_creation if e.content.split(":")[0] == stream]
        assert [int(e.content.split(":")[1]) for e in mine] == order == sorted(order), stream


def test_core_channel_ordering_threads(store: EnvelopeStore, dsn: str) -> None:
    """Channel ordering | Core | Envelopes within a channel (from, to) MUST be delivered in
    creation order."""
    _world(store)
    threads_n, per_thread = 8, 40
    counter = [0]
    counter_lock = threading.Lock()
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []
    statuses: list[str] = []

    def run(k: int) -> None:
        try:
            # a longer acknowledgment timeout than the fixture's: a loaded machine must not
            # exhaust redelivery here; ordering under backoff is what _drain_pending checks
            with EnvelopeStore(dsn, ack_timeout=1.0, pool_size=1) as own:
                barrier.wait()
                for i in range(per_thread):
                    with counter_lock:
                        counter[0] += 1
                        taken = counter[0]
                    result = own.send("coord", "w1", "directive", f"t{k}:{i}:{taken}")
                    statuses.append(result.status)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors, errors
    assert len(statuses) == threads_n * per_thread
    assert "rejected" not in statuses
    _drain_pending(store, dsn)

    _assert_channel_order(store, "coord", "w1",
                          {f"t{k}": list(range(per_thread)) for k in range(threads_n)},
                          threads_n * per_thread)
    acks = [s.ref for s in store.signals("coord") if s.signal == "acknowledged"]
    assert len(acks) == len(set(acks)) == threads_n * per_thread
    assert store.verify_trail().ok


# the processes of the next test: (stream, [(sender, receiver, type), ...] cycled)
_PROCESS_PLANS = [
    ("p0", [("coord", "w1", "directive")]),
    ("p1", [("coord", "w1", "feedback")]),
    ("p2", [("w1", "coord", "query")]),  # crosses coord → w1
    ("p3", [("coord", "w2", "directive"), ("w2", "coord", "query")]),  # both ways
]
_PER_PROCESS = 50


def _process_sender(dsn: str, trail_key: str, stream: str, plan: list, per_process: int,
                    counter: Any, lock: Any, start: Any) -> None:
    """Runs in a spawned process: its own store, sends per_process envelopes."""
    with EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=1.0, pool_size=1) as own:
        own.workspace("coord")  # connect before the start line
        start.wait(30)
        for i in range(per_process):
            sender, receiver, etype = plan[i % len(plan)]
            with lock:
                counter.value += 1
                taken = counter.value
            result = own.send(sender, receiver, etype, f"{stream}:{i}:{taken}")
            if result.status == "rejected":
                raise SystemExit(f"{stream}:{i} rejected: {result.reason}")


def test_core_channel_ordering_processes(store: EnvelopeStore, dsn: str) -> None:
    """Channel ordering | Core | Envelopes within a channel (from, to) MUST be delivered in
    creation order."""
    _world(store)
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("i", 0)
    lock = ctx.Lock()
    start = ctx.Event()
    procs = [ctx.Process(target=_process_sender,
                         args=(dsn, store.settings.trail_key, stream, plan, _PER_PROCESS,
                               counter, lock, start))
             for stream, plan in _PROCESS_PLANS]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert counter.value == len(procs) * _PER_PROCESS
    _drain_pending(store, dsn)

    # per channel: which stream sent which of its envelopes on it
    streams: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(dict)
    for stream, plan in _PROCESS_PLANS:
        for i in range(_PER_PROCESS):
            sender, receiver, _ = plan[i % len(plan)]
            streams[(sender, receiver)].setdefault(stream, []).append(i)
    assert set(streams) == {("coord", "w1"), ("w1", "coord"), ("coord", "w2"),
                            ("w2", "coord")}
    for (sender, receiver), per_stream in streams.items():
        total = sum(len(v) for v in per_stream.values())
        _assert_channel_order(store, sender, receiver, per_stream, total)
    assert store.verify_trail().ok


# -- Durability -----------------------------------------------------------------------------


def test_core_durability_trail_before_delivery(store: EnvelopeStore, dsn: str) -> None:
    """Durability | Core | Validated envelopes MUST be written to the trail before
    delivery."""
    _world(store)
    outcome: dict[str, Any] = {}

    def send() -> None:
        began = time.monotonic()
        outcome["result"] = store.send("coord", "w1", "directive", "durable")
        outcome["returned"] = time.monotonic()
        outcome["elapsed"] = outcome["returned"] - began

    with _conn(dsn) as holder, _conn(dsn) as observer:
        # hold the receiver's chain: phase 2 (delivery) cannot take it
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(agentpost._chain_key(%s))", ("w1",))
        sender = threading.Thread(target=send)
        sender.start()
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                   " AND application_name = 'agentpost' AND wait_event_type = 'Lock'"
                   " AND wait_event = 'advisory'")
        with observer.cursor() as cur:
            # phase 2 is under way: the send's session waits for the receiver's chain ...
            while True:
                cur.execute(waiting)
                if cur.fetchone()[0]:
                    break
                assert sender.is_alive(), "the delivery never waited for the receiver's chain"
                time.sleep(0.002)
            # ... and phase 1 is already committed and visible to everyone
            cur.execute("SELECT envelope_id, chain FROM agentpost.trail "
                        "WHERE event = 'envelope_created'")
            seen_while_sending = cur.fetchall()
            cur.execute("SELECT count(*) FROM agentpost.trail "
                        "WHERE event = 'envelope_delivered'")
            delivered_meanwhile = cur.fetchone()[0]
            cur.execute(waiting)
            still_waiting = cur.fetchone()[0] == 1
        sender.join(10)
        assert still_waiting, "the delivery stopped waiting while we looked (test too slow)"
        assert seen_while_sending, "envelope_created was not committed before delivery"
        assert delivered_meanwhile == 0
        result = outcome["result"]
        assert (result.status, result.reason) == ("validated", None)
        assert outcome["elapsed"] >= 0.19  # it waited out the acknowledgment timeout
        [(envelope_id, chain)] = seen_while_sending
        assert (envelope_id, chain) == (result.envelope_id, "coord")

        with observer.cursor() as cur:
            cur.execute("SELECT event FROM agentpost.trail WHERE envelope_id = %s ORDER BY id",
                        (envelope_id,))
            events = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT status, attempts FROM agentpost.envelopes WHERE id = %s",
                        (envelope_id,))
            assert cur.fetchone() == ("validated", 1)
        assert "envelope_created" in events
        assert "envelope_delivered" not in events
        assert store.inbox("w1") == []

        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(agentpost._chain_key(%s))", ("w1",))
            assert cur.fetchone() == (True,)
        returned = outcome["returned"]
        # the first retry waits 1 × 0.2 s (checked only when we are surely inside that wait)
        if time.monotonic() - returned < 0.1:
            store.redeliver()
            assert store.get(envelope_id).status == "validated"
        time.sleep(max(0.0, 0.3 - (time.monotonic() - returned)))
        store.redeliver()

    env = store.get(envelope_id)
    assert env.status == "acknowledged"
    assert [e.id for e in store.inbox("w1")] == [envelope_id]
    created = store.trail(envelope_id=envelope_id, event="envelope_created")
    delivered = store.trail(envelope_id=envelope_id, event="envelope_delivered")
    assert len(created) == len(delivered) == 1
    assert created[0].id < delivered[0].id and created[0].at < delivered[0].at
    assert [s.signal for s in store.signals("coord") if s.ref == envelope_id] == [
        "acknowledged"]


def test_core_durability_created_entry_survives_lost_delivery(store: EnvelopeStore,
                                                              dsn: str) -> None:
    """Durability | Core | Validated envelopes MUST be written to the trail before delivery.
    (§4 rule 5: if delivery never happens, the envelope persists and recovery completes it.)
    The crash between the phases is simulated by flipping the held target's state back in
    the database behind the runtime's back, so that nothing delivers it but recovery."""
    _world(store)
    store.transition("w1", "suspended")  # validated, then held: a delivery that did not happen
    ids = [store.send("coord", "w1", "directive", f"d{i}").envelope_id for i in range(3)]
    rows = _query(dsn, "SELECT envelope_id FROM agentpost.trail "
                       "WHERE event = 'envelope_created' ORDER BY id")
    assert [r[0] for r in rows] == ids
    assert _query(dsn, "SELECT count(*) FROM agentpost.trail "
                       "WHERE event = 'envelope_delivered'") == [(0,)]
    # the workspace comes back; recovery finds the gap and completes it, in order
    _query(dsn, "UPDATE agentpost.workspaces SET state = 'active' WHERE id = 'w1' RETURNING 1")
    assert store.recover()["delivered"] == 3
    assert [e.id for e in store.inbox("w1")] == ids


def test_core_durability_no_silent_drop_when_target_seals_during_validation(
        store: EnvelopeStore, dsn: str) -> None:
    """Durability | Core | Validated envelopes MUST be written to the trail before delivery.
    (§4 rule 5: envelopes are never silently dropped; every envelope that passes validation
    eventually reaches the receiver's inbox or is recorded as undeliverable. §6: the target
    reaching a terminal state after validation but before delivery is recorded
    envelope_undeliverable and the sender is notified.)

    The race, made deterministic: phase 1 of a send has validated (the target was active) but
    not committed yet — held here on the send-once right it is about to spend — when the
    target is closed. Closing sweeps the target's queued envelopes before phase 1 commits."""
    _world(store)
    once = store.grant_right("coord", "coord2", "w1", "send_once")
    outcome: dict[str, Any] = {}

    def send() -> None:
        outcome["result"] = store.send("coord2", "w1", "directive", "racing the seal")

    def close() -> None:
        outcome["closed"] = store.transition("w1", "closed")

    with _conn(dsn) as holder, _conn(dsn) as observer:
        holder.autocommit = False
        with holder.cursor() as cur:
            cur.execute("SELECT 1 FROM agentpost.port_rights WHERE id = %s FOR UPDATE", (once,))
        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 5
        with observer.cursor() as cur:
            while True:  # until the send waits on the right, i.e. it validated w1 as active
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock' "
                            "AND application_name = 'agentpost'")
                if cur.fetchone()[0]:
                    break
                assert time.monotonic() < deadline, "the send never reached the right"
                time.sleep(0.005)
        closer = threading.Thread(target=close)
        closer.start()
        closer.join(1.0)
        holder.rollback()
        sender.join(10)
        closer.join(10)
    assert outcome["closed"]["to_state"] == "closed"
    result = outcome["result"]
    assert result.status != "acknowledged"
    assert store.workspace("w1").state == "closed"

    # the ordinary retry path runs (no crash happened, so no recovery)
    time.sleep(0.25)
    store.redeliver()
    env = store.get(result.envelope_id)
    events = [t.event for t in store.trail(envelope_id=env.id)]
    notes = [(s.signal, s.reason) for s in store.signals("coord2") if s.ref == env.id]
    if env.status == "rejected":  # sealing and validation were serialized: also fine
        assert env.reason == "target_terminal" and "envelope_rejected" in events
        return
    assert env.status == "undeliverable", (
        f"validated envelope to a closed workspace left {env.status}; trail {events}")
    assert events[:1] == ["envelope_created"] and "envelope_undeliverable" in events
    assert ("failed", "target_closed") in notes


# -- Lifecycle states -----------------------------------------------------------------------


def test_core_lifecycle_states(store: EnvelopeStore) -> None:
    """Lifecycle states | Core | Every envelope MUST progress through the lifecycle defined
    in §5. Status transitions MUST be managed exclusively by the runtime."""
    _world(store)
    # created → validated (queued: the target is suspended) → delivered/acknowledged
    store.transition("w1", "suspended")
    queued = store.send("coord", "w1", "directive", "wait for me")
    assert queued.status == "validated"
    env = store.get(queued.envelope_id)
    assert (env.status, env.delivered_at) == ("validated", None)
    assert [e.id for e in store.queued("w1")] == [env.id]
    assert store.inbox("w1") == []
    store.transition("w1", "active")
    env = store.get(queued.envelope_id)
    assert env.status == "acknowledged" and env.delivered_at is not None
    assert env.delivered_at >= env.timestamp
    assert store.queued("w1") == []

    # the direct path ends in the same terminal state
    direct = store.send("coord", "w1", "feedback", "now")
    assert direct.status == "acknowledged"
    # the branch: created → rejected
    rejected = store.send("coord", "w1", "query", "wrong direction")
    assert store.get(rejected.envelope_id).status == "rejected"

    # terminal states stay terminal whatever the runtime is asked to do
    for eid, status in ((queued.envelope_id, "acknowledged"), (direct.envelope_id,
                        "acknowledged"), (rejected.envelope_id, "rejected")):
        store.redeliver()
        store.recover()
        store.deliver(eid)
        assert store.get(eid).status == status
    # consuming (the agent acting on it) does not change the envelope's lifecycle status
    assert store.consume("w1", direct.envelope_id).status == "acknowledged"

    # agents never set status: a draft that tries is malformed, and nothing on the public
    # API takes a status for an envelope
    tried = _send1(store, _draft("coord", "w1", status="acknowledged"))
    assert (tried.status, tried.reason) == ("rejected", "invalid_structure")
    for name in ("send", "send_many", "inject", "consume", "deliver"):
        assert "status" not in inspect.signature(getattr(EnvelopeStore, name)).parameters

    # every status ever reported is one of §5's (bar `undeliverable`, the §6 outcome)
    statuses = {store.get(i).status.value for i in
                (queued.envelope_id, direct.envelope_id, rejected.envelope_id)}
    assert statuses <= SPEC_STATUSES


def test_core_lifecycle_states_sealed_before_delivery(store: EnvelopeStore) -> None:
    """Lifecycle states | Core | Every envelope MUST progress through the lifecycle defined
    in §5. Status transitions MUST be managed exclusively by the runtime. (§6: validated but
    the target sealed before delivery → recorded undeliverable, sender notified.)"""
    _world(store)
    store.transition("w2", "suspended")
    result = store.send("coord", "w2", "directive", "too late")
    assert result.status == "validated"
    store.transition("w2", "closed")
    env = store.get(result.envelope_id)
    assert env.status == "undeliverable" and env.delivered_at is None
    assert [t.event for t in store.trail(envelope_id=env.id)
            if t.event.startswith("envelope_")] == ["envelope_created", "envelope_undeliverable"]
    assert [(s.signal, s.reason) for s in store.signals("coord") if s.ref == env.id] == [
        ("failed", "target_closed")]
    assert store.deliver(env.id) == "undeliverable"  # never retried


# -- Trail recording ------------------------------------------------------------------------


def test_core_trail_recording(store: EnvelopeStore) -> None:
    """Trail recording | Core | Every lifecycle transition MUST produce the corresponding
    trail entry defined in §10."""
    _world(store)
    result = store.send("coord", "w1", "directive", "traced", priority="urgent")
    env = store.get(result.envelope_id)
    entries = store.trail(envelope_id=env.id)
    assert [(t.chain, t.event) for t in entries] == [
        ("coord", "envelope_created"),  # sender's local trail, at validation
        ("w1", "envelope_delivered"),  # receiver's local trail, at inbox placement
        ("w1", "signal_emitted"),  # the acknowledged signal
    ]
    created, delivered, ack = entries
    assert created.id < delivered.id < ack.id
    assert created.at <= delivered.at <= ack.at
    assert {"envelope_id", "from", "to", "type", "priority", "in_reply_to", "originator",
            "timestamp"} <= set(created.body)
    assert (created.body["envelope_id"], created.body["from"], created.body["to"],
            created.body["type"], created.body["priority"], created.body["in_reply_to"],
            created.body["originator"]) == (env.id, "coord", "w1", "directive", "urgent", None,
                                            "system")
    assert _ts(created.body["timestamp"]) == env.timestamp
    assert {"envelope_id", "from", "to", "delivered_at"} <= set(delivered.body)
    assert (delivered.body["envelope_id"], delivered.body["from"], delivered.body["to"]) == (
        env.id, "coord", "w1")
    assert _ts(delivered.body["delivered_at"]) == env.delivered_at
    assert (ack.body["signal"], ack.body["ref"], ack.body["to"]) == ("acknowledged", env.id,
                                                                     "coord")

    # rejected: only envelope_rejected (plus the notification)
    bad = store.send("w1", "coord", "directive", "no")
    rejected = store.trail(envelope_id=bad.envelope_id)
    assert [(t.chain, t.event) for t in rejected] == [("w1", "envelope_rejected"),
                                                      ("w1", "signal_emitted")]
    assert {"envelope_id", "from", "to", "type", "reason", "timestamp"} <= set(
        rejected[0].body)
    assert (rejected[0].body["from"], rejected[0].body["to"], rejected[0].body["type"],
            rejected[0].body["reason"]) == ("w1", "coord", "directive", "permission_denied")

    # undeliverable: envelope_created, then envelope_undeliverable
    store.transition("w2", "suspended")
    late = store.send("coord", "w2", "directive", "x").envelope_id
    assert [t.event for t in store.trail(envelope_id=late)] == ["envelope_created"]
    store.transition("w2", "failed")
    events = [t for t in store.trail(envelope_id=late) if t.event.startswith("envelope_")]
    assert [t.event for t in events] == ["envelope_created", "envelope_undeliverable"]
    assert {"envelope_id", "from", "to", "reason", "timestamp"} <= set(events[1].body)
    assert (events[1].body["to"], events[1].body["reason"]) == ("w2", "target_failed")

    # a suppressed duplicate: only envelope_redelivered, nothing else new
    before = len(store.trail())
    assert store.deliver(env.id) == "duplicate"
    new = store.trail()[before:]
    assert [(t.chain, t.event, t.envelope_id) for t in new] == [
        ("w1", "envelope_redelivered", env.id)]
    assert {"envelope_id", "from", "to", "timestamp"} <= set(new[0].body)

    # a right carried by an envelope is transferred on delivery, on the receiver's trail
    carried = store.send("coord", "w1", "feedback", "talk to w2", rights=[("send", "w2")])
    transfer = store.trail(envelope_id=carried.envelope_id, event="port_right_transferred")
    assert [(t.chain, t.body["to_holder"], t.body["target"]) for t in transfer] == [
        ("w1", "w1", "w2")]
    assert store.verify_trail().ok


# -- No payload in trail --------------------------------------------------------------------


def test_full_no_payload_in_trail(store: EnvelopeStore, dsn: str) -> None:
    """No payload in trail | Full | Trail entries MUST reference envelopes by id without
    duplicating payload content."""
    _world(store)
    store.register_type("report", senders=["worker"], receivers=["coordinator"],
                        required_fields=["summary"])
    marker = f"PAYLOAD-{secrets.token_hex(12)}"
    ids = []
    ids.append(store.send("coord", "w1", "directive", f"do {marker}",
                          attachments=[f"uri://{marker}"]).envelope_id)
    ids.append(store.send("w1", "coord", "report", {"summary": marker}, format="json",
                          in_reply_to=ids[0]).envelope_id)
    ids.append(store.send("w1", "coord", "query", marker * 50).envelope_id)
    ids.append(store.inject("ann", "w2", "feedback", f"human {marker}").envelope_id)
    # rejections of every flavour carrying the marker
    ids.append(store.send("w1", "coord", "directive", marker).envelope_id)
    ids.append(store.send("coord2", "w1", "directive", marker).envelope_id)
    ids.append(store.send("coord", "w1", "report", {"summary": marker},
                          format="json").envelope_id)
    # undeliverable, duplicate delivery, consumption, a transferred right
    store.transition("w2", "suspended")
    ids.append(store.send("coord", "w2", "directive", marker).envelope_id)
    store.transition("w2", "closed")
    store.deliver(ids[0])
    store.consume("w1", ids[0])
    ids.append(store.send("coord", "w1", "feedback", marker,
                          rights=[("send", "w2")]).envelope_id)

    # the payload went into the envelopes ...
    assert _query(dsn, "SELECT count(*) FROM agentpost.envelopes WHERE content LIKE %s",
                  (f"%{marker}%",))[0][0] >= 5
    assert store.get(ids[0]).content == f"do {marker}"
    # ... and the trail references them by id
    rows = _query(dsn, "SELECT id, event, envelope_id, record FROM agentpost.trail ORDER BY id")
    referenced = {r[2] for r in rows}
    assert set(ids) <= referenced
    events = {r[1] for r in rows}
    assert {"envelope_created", "envelope_delivered", "envelope_rejected",
            "envelope_undeliverable", "envelope_redelivered", "envelope_consumed",
            "port_right_transferred", "signal_emitted"} <= events
    # but no trail record carries its content, in any form
    leaks = [(r[0], r[1]) for r in rows if marker in r[3]]
    assert leaks == []
    assert _query(dsn, "SELECT count(*) FROM agentpost.trail WHERE record LIKE %s "
                       "OR event LIKE %s OR coalesce(envelope_id, '') LIKE %s",
                  (f"%{marker}%",) * 3) == [(0,)]
    assert all("content" not in json.loads(r[3])["body"] for r in rows)
    assert all("payload" not in json.loads(r[3])["body"] for r in rows)
