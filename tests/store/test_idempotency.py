"""Idempotent enqueue (Courier §6.4, made durable): an envelope id already seen is a no-op
that returns the original outcome, also across processes racing on one id; the same id on
another channel is a conflict; the Courier-shaped enqueue validates like §4.1 says."""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any

import pytest

from agentpost.protocol.errors import Conflict, InvalidInput
from agentpost.protocol.leases import to_courier
from agentpost.store import EnvelopeStore
from dbtools import query


def _world(store: EnvelopeStore) -> None:
    store.register_type("task", ["coordinator"], ["worker"])
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("worker", parent="boss", workspace_id="w1")
    store.create_workspace("worker", parent="boss", workspace_id="w2")


def _courier(**over: Any) -> dict[str, Any]:
    env = {"id": "e-91a", "ts": "2025-10-18T19:55:00Z", "from": "boss",
           "to": "agents/w1/inbox", "type": "task", "schema": "xeno/sprint-assign@v1",
           "version": 1, "corr": "c-42", "refs": ["T1102"], "tags": ["sprint"],
           "headers": {"priority": "urgent", "team": "b"},
           "payload": {"wave": "B", "title": "Plan xenoctl CLI"}}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_idempotent_resend_returns_original_and_sends_nothing(store: EnvelopeStore,
                                                              dsn: str) -> None:
    """§6.4: the envelope id is the idempotency key; the cache is durable (it is the table)."""
    _world(store)
    first = store.send("boss", "w1", "task", "one", envelope_id="job-1")
    again = store.send("boss", "w1", "task", "a different body", envelope_id="job-1")
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.envelope_id == first.envelope_id == "job-1"
    assert again.status == first.status == "acknowledged"
    assert [e.content for e in store.inbox("w1")] == ["one"]
    assert query(dsn, "SELECT count(*) FROM agentpost.trail WHERE envelope_id = 'job-1'"
                      " AND event = 'envelope_created'") == [(1,)]
    # a new store object (another process would be the same) still knows the id
    with EnvelopeStore(dsn) as other:
        assert other.send("boss", "w1", "task", "x", envelope_id="job-1").duplicate


def test_idempotent_duplicate_in_one_batch(store: EnvelopeStore) -> None:
    _world(store)
    results = store.send_many([
        {"from": "boss", "to": "w1", "type": "task", "content": "a", "envelope_id": "k"},
        {"from": "boss", "to": "w1", "type": "task", "content": "b"},
        {"from": "boss", "to": "w1", "type": "task", "content": "c", "envelope_id": "k"},
    ])
    assert [r.duplicate for r in results] == [False, False, True]
    assert results[2].envelope_id == "k"
    assert [e.content for e in store.inbox("w1")] == ["a", "b"]


def test_idempotent_id_of_another_channel_is_a_conflict(store: EnvelopeStore) -> None:
    _world(store)
    store.send("boss", "w1", "task", "a", envelope_id="k")
    with pytest.raises(Conflict, match="another channel"):
        store.send_many([
            {"from": "boss", "to": "w2", "type": "task", "content": "new", "envelope_id": "n"},
            {"from": "boss", "to": "w2", "type": "task", "content": "b", "envelope_id": "k"}])
    assert store.inbox("w2") == []  # all or nothing: "n" was not sent either


def test_idempotent_rejected_original_is_replayed(store: EnvelopeStore) -> None:
    _world(store)
    first = store.send("w1", "w2", "task", "workers may not send tasks", envelope_id="r")
    assert first.status == "rejected"
    again = store.send("w1", "w2", "task", "still not", envelope_id="r")
    assert again.duplicate and again.status == "rejected"
    assert again.reason == first.reason


def _race(dsn: str, key: str, barrier: Any, out: Any) -> None:
    with EnvelopeStore(dsn) as store:
        barrier.wait()
        res = store.send("boss", "w1", "task", f"from {os.getpid()}", envelope_id=key)
        out.put((res.envelope_id, res.duplicate, res.status.value))


def test_idempotent_racing_processes_send_once(store: EnvelopeStore, dsn: str) -> None:
    """Processes racing one id: exactly one sends, the others get the original."""
    _world(store)
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        key = f"race-{round_}"
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(dsn, key, barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert sorted(r[1] for r in results) == [False, True, True, True]
        assert {r[2] for r in results} == {"acknowledged"}
        assert query(dsn, "SELECT count(*) FROM agentpost.envelopes WHERE id = %s",
                     (key,)) == [(1,)]
    assert store.verify_trail().ok


def test_enqueue_courier_envelope_round_trip(store: EnvelopeStore) -> None:
    """§4.1 shape in, §4.1 shape out (to_courier), priority from headers."""
    _world(store)
    res = store.enqueue("agents/w1/inbox", _courier())
    assert res.envelope_id == "e-91a" and res.status == "acknowledged"
    env = store.get("e-91a")
    assert env.priority == "urgent" and env.tags == ("sprint",)
    out = to_courier(env)
    assert out["payload"] == {"wave": "B", "title": "Plan xenoctl CLI"}
    assert out["to"] == "agents/w1/inbox" and out["from"] == "boss"
    assert out["headers"] == {"priority": "urgent", "team": "b"}
    assert (out["schema"], out["version"], out["corr"], out["refs"]) == (
        "xeno/sprint-assign@v1", 1, "c-42", ["T1102"])
    assert store.enqueue("w1", _courier(payload={"other": 1})).duplicate


@pytest.mark.parametrize("bad", [
    {"id": None}, {"ts": None}, {"type": None}, {"payload": None}, {"from": None},
    {"to": "agents/w2/inbox"}, {"extra": 1}, {"headers": "x"}, {"from": 5},
    {"payload": float("nan")},
])
def test_enqueue_validation_errors_change_nothing(store: EnvelopeStore, dsn: str,
                                                  bad: dict[str, Any]) -> None:
    """§4.1 validation (v1): id, ts, to, type and payload are required; errors are 400s."""
    _world(store)
    before = query(dsn, "SELECT count(*) FROM agentpost.trail")
    with pytest.raises(InvalidInput):
        store.enqueue("agents/w1/inbox", _courier(**bad))
    assert query(dsn, "SELECT count(*) FROM agentpost.trail") == before


def test_enqueue_bad_client_id_is_a_rejection_without_the_id(store: EnvelopeStore) -> None:
    _world(store)
    res = store.enqueue("w1", _courier(id="has space"))
    assert res.status == "rejected" and res.reason == "invalid_structure"
    assert res.envelope_id != "has space"


def _phase_one_only(store: EnvelopeStore, key: str) -> None:
    """What a sender that died between the two phases of a send leaves: the envelope accepted
    and on the trail (phase 1 committed), not delivered."""
    row = store._draft({"from": "boss", "to": "w1", "type": "task", "content": "first",
                        "envelope_id": key}, 0)
    with store.db.cursor() as cur:
        cur.execute("SELECT count(*) FROM agentpost._accept(%s::jsonb, 'agent', NULL)",
                    (json.dumps([row.row]),))
    assert store.get(key).status.value == "validated"


def test_idempotent_retry_completes_an_unfinished_delivery(store: EnvelopeStore) -> None:
    """Courier §6.4 (a retry with the same id is the same envelope) with WACP §6
    (durability): the retry of a send whose sender died after phase 1 delivers the original,
    at once, and reports it delivered; nothing is sent twice and the trail verifies."""
    _world(store)
    _phase_one_only(store, "half-sent")
    again = store.send("boss", "w1", "task", "second", envelope_id="half-sent")
    assert again.duplicate and again.status.value == "acknowledged", again
    assert [e.content for e in store.inbox("w1")] == ["first"]
    assert store.verify_trail().ok
