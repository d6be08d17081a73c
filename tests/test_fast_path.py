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
