"""send() takes a four-statement server path for the common case and falls back to the general
one (which send_many always uses); both must decide every draft the same way."""

from __future__ import annotations

import psycopg2
import pytest

from agentpost.store import EnvelopeStore


def _trail_shape(dsn: str, envelope_id: str) -> list[tuple[str, str]]:
    """The (chain, event) sequence recorded for one envelope, ids and times left out."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT chain, event FROM agentpost.trail WHERE envelope_id = %s "
                        "ORDER BY id", (envelope_id,))
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


@pytest.fixture
def fleet(store: EnvelopeStore) -> EnvelopeStore:
    store.register_type("report", ["worker"], ["coordinator"], required_fields=["verdict"])
    store.create_workspace("coordinator", workspace_id="lead")
    store.create_workspace("coordinator", workspace_id="other-lead")
    store.create_workspace("worker", parent="lead", workspace_id="w1")
    store.create_workspace("worker", parent="lead", workspace_id="w2", delegation=True)
    store.create_workspace("worker", parent="w2", workspace_id="w2-child")
    store.create_workspace("worker", parent="lead", workspace_id="w-closed")
    store.transition("w-closed", "closed")
    store.create_workspace("worker", parent="lead", workspace_id="w-paused")
    store.transition("w-paused", "suspended")
    store.create_workspace("worker", parent="other-lead", workspace_id="foreign")
    store.grant_right("lead", "w1", "w2", "send_once")  # no matrix row: still permission_denied
    return store


CASES = [
    # (sender, to, type, content, format, expected status, expected reason)
    ("lead", "w1", "directive", "go", "markdown", "acknowledged", None),
    ("w1", "lead", "query", "why?", "markdown", "acknowledged", None),
    ("w2", "w2-child", "directive", "delegated", "markdown", "acknowledged", None),
    ("w1", "lead", "report", '{"verdict": "ok"}', "json", "acknowledged", None),
    ("lead", "w-paused", "feedback", "queued", "markdown", "validated", None),
    ("w1", "lead", "report", '{"score": 3}', "json", "rejected", "invalid_structure"),
    ("w1", "lead", "report", "verdict: ok", "markdown", "rejected", "invalid_structure"),
    ("lead", "w1", "memo", "unknown type", "markdown", "rejected", "invalid_type"),
    ("lead", "nobody", "directive", "no such target", "markdown", "rejected",
     "target_not_found"),
    ("lead", "w-closed", "directive", "sealed", "markdown", "rejected", "target_terminal"),
    ("w1", "lead", "directive", "workers do not direct", "markdown", "rejected",
     "permission_denied"),
    ("w1", "w2", "directive", "not even with a right", "markdown", "rejected",
     "permission_denied"),
    ("lead", "foreign", "directive", "not my worker", "markdown", "rejected", "no_send_right"),
    ("lead", "w2-child", "directive", "grandchild", "markdown", "rejected", "no_send_right"),
]


@pytest.mark.parametrize(("sender", "to", "etype", "content", "fmt", "status", "reason"), CASES)
def test_send_and_send_many_decide_alike(fleet: EnvelopeStore, dsn: str, sender: str, to: str,
                                         etype: str, content: str, fmt: str, status: str,
                                         reason: str | None) -> None:
    """Structure validation, permission validation, send right validation (WACP §11, Core):
    the single-draft path and the batch path give the same status, reason and trail record."""
    single = fleet.send(sender, to, etype, content, format=fmt)
    batch = fleet.send_many([{"from": sender, "to": to, "type": etype, "content": content,
                              "format": fmt}])[0]
    assert (single.status, single.reason) == (status, reason)
    assert (batch.status, batch.reason) == (status, reason)
    assert _trail_shape(dsn, single.envelope_id) == _trail_shape(dsn, batch.envelope_id)
    assert single.envelope_id != batch.envelope_id
    assert fleet.get(single.envelope_id).originator == fleet.get(batch.envelope_id).originator


def test_send_once_right_takes_the_general_path(fleet: EnvelopeStore, dsn: str) -> None:
    """A send that must spend a send-once right is not the fast path's case; the general path
    spends it (port_right_consumed) and the next send has no right left."""
    fleet.create_workspace("coordinator", workspace_id="third-lead")
    fleet.grant_right("foreign", "third-lead", "foreign", "send_once")
    first = fleet.send("third-lead", "foreign", "directive", "once")
    second = fleet.send("third-lead", "foreign", "directive", "twice")
    assert first.status == "acknowledged"
    assert (second.status, second.reason) == ("rejected", "no_send_right")
    assert ("third-lead", "port_right_consumed") in _trail_shape(dsn, first.envelope_id)


def _xmins(dsn: str, envelope_id: str) -> dict[str, set[str]]:
    """The transactions (xmin) that wrote the envelope's row, its trail entries and its
    signals, by table."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            found: dict[str, set[str]] = {}
            for table, column in (("envelopes", "id"), ("trail", "envelope_id"),
                                  ("signals", "ref")):
                cur.execute(f"SELECT xmin::text FROM agentpost.{table} "
                            f"WHERE {column} = %s", (envelope_id,))
                found[table] = {r[0] for r in cur.fetchall()}
            return found
    finally:
        conn.close()


@pytest.mark.parametrize("batch", [False, True], ids=["send", "send_many"])
def test_a_send_to_an_open_receiver_is_one_durable_commit(fleet: EnvelopeStore, dsn: str,
                                                          batch: bool) -> None:
    """Flat cost (one durable commit per send): the envelope row, its three trail entries
    (created, delivered, signal) and its signal are all written by one transaction, and the
    row is written once, already delivered (no later UPDATE gives it a newer xmin)."""
    if batch:
        [result] = fleet.send_many([{"from": "lead", "to": "w1", "type": "directive",
                                     "content": "go"}])
    else:
        result = fleet.send("lead", "w1", "directive", "go")
    assert result.status == "acknowledged"
    written = _xmins(dsn, result.envelope_id)
    assert _trail_shape(dsn, result.envelope_id) == [
        ("lead", "envelope_created"), ("w1", "envelope_delivered"),
        ("w1", "signal_emitted")]
    assert all(len(x) == 1 for x in written.values()), written
    assert len(set.union(*written.values())) == 1, written
    assert fleet.verify_trail().ok


def test_a_send_to_a_receiver_with_a_queue_keeps_the_two_phase_path(
        fleet: EnvelopeStore, dsn: str) -> None:
    """A receiver that cannot take the envelope now (suspended: its envelopes queue) gets
    it validated in one transaction and delivered later, in order, by another; the trail
    is the same shape once delivered and verifies."""
    queued = fleet.send("lead", "w-paused", "feedback", "queued")
    assert queued.status == "validated"
    assert len(set.union(*_xmins(dsn, queued.envelope_id).values())) == 1
    fleet.transition("w-paused", "active")
    assert fleet.get(queued.envelope_id).status == "acknowledged"
    assert [e for _, e in _trail_shape(dsn, queued.envelope_id)] == [
        "envelope_created", "envelope_delivered", "signal_emitted"]
    assert len(set.union(*_xmins(dsn, queued.envelope_id).values())) == 2
    assert fleet.verify_trail().ok


def _counts(dsn: str) -> tuple[int, int, int]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (SELECT count(*) FROM agentpost.envelopes),"
                        " (SELECT count(*) FROM agentpost.trail),"
                        " (SELECT count(*) FROM agentpost.signals)")
            return tuple(cur.fetchone())
    finally:
        conn.close()


@pytest.mark.parametrize(("sender", "to", "etype", "content", "fmt", "status", "reason"), CASES)
def test_send_checked_sends_what_send_accepts_and_writes_nothing_else(
        fleet: EnvelopeStore, dsn: str, sender: str, to: str, etype: str, content: str,
        fmt: str, status: str, reason: str | None) -> None:
    """send_checked (the agent tools' one-round-trip send) sends a draft the store accepts
    exactly as send does, meta included; every draft send would reject comes back None with
    not one row written (no envelope, no trail entry, no signal)."""
    meta = {"tool_call": {"tool": "send_envelope", "call_id": "c1"}}
    before = _counts(dsn)
    checked = fleet.send_checked(sender, to, etype, content, format=fmt, meta=meta)
    if reason is not None:
        assert checked is None
        assert _counts(dsn) == before
        return
    assert checked is not None and (checked.status, checked.reason) == (status, None)
    plain = fleet.send(sender, to, etype, content, format=fmt, meta=meta)
    assert _trail_shape(dsn, checked.envelope_id) == _trail_shape(dsn, plain.envelope_id)
    assert fleet.get(checked.envelope_id).meta == meta
    assert fleet.verify_trail().ok


def test_send_checked_leaves_send_once_and_rules_to_the_long_way(fleet: EnvelopeStore,
                                                                 dsn: str) -> None:
    """A send that would spend a send-once right, and any send while a rule is enabled, is
    not send_checked's case: None, nothing written, and the right still unspent."""
    fleet.register_type("ping", ["worker"], ["worker"])
    fleet.grant_right("w2", "w1", "w2", "send_once")
    before = _counts(dsn)
    assert fleet.send_checked("w1", "w2", "ping", "once") is None
    assert _counts(dsn) == before
    assert fleet.send("w1", "w2", "ping", "once").status == "acknowledged"
    fleet.register_type("notification", ["worker"], ["coordinator"])
    fleet.add_rule({"id": "note.lead", "when": {"type": "report"},
                    "do": [{"action": "notify", "to": "agents/lead/inbox",
                            "payload": {"ref": "${env.id}"}}]})
    before = _counts(dsn)
    assert fleet.send_checked("lead", "w1", "directive", "go") is None
    assert _counts(dsn) == before
