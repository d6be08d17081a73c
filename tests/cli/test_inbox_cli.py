"""The inbox commands of the CLI: lease, ack, nack, expire, dead-letters, stats, latest.
Each error is one line on stderr with the documented exit code."""

from __future__ import annotations

import time

from agentpost.store import EnvelopeStore
from test_cli import agentpost, assert_one_line_error


def _world(store: EnvelopeStore) -> None:
    store.register_type("task", ["coordinator"], ["worker"])
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("worker", parent="boss", workspace_id="w1")
    for i in range(3):
        store.send("boss", "w1", "task", f"t{i}")


def test_cli_lease_ack_nack_stats(dsn: str, store: EnvelopeStore) -> None:
    _world(store)
    leased = agentpost(dsn, "lease", "w1", "--max", "2", "--holder", "cli").json()
    assert [x["envelope"]["payload"]["content"] for x in leased] == ["t0", "t1"]
    assert agentpost(dsn, "ack", leased[0]["token"]).out.strip() == "acknowledged 1"
    nacked = agentpost(dsn, "nack", leased[1]["token"], "--delay", "0")
    assert "redeliveries=1" in nacked.out
    assert_one_line_error(agentpost(dsn, "ack", leased[0]["token"]), 2)  # stale: 409 -> 2
    assert_one_line_error(agentpost(dsn, "ack", "not-a-token"), 2)
    [stats] = agentpost(dsn, "stats", "w1").json()
    assert (stats["depth"], stats["acks"], stats["nacks"]) == (2, 1, 1)
    assert_one_line_error(agentpost(dsn, "stats", "ghost"), 2)
    latest = agentpost(dsn, "latest").json()
    assert latest["agents/w1/inbox"]["payload"] == "t2"


def test_cli_expire_and_dead_letters(dsn: str, store: EnvelopeStore) -> None:
    _world(store)
    # every return goes to the tail, so lease all three each round: the fourth return of each
    # dead-letters it
    for _ in range(4):
        assert agentpost(dsn, "lease", "w1", "--max", "3", "--ttl", "0.05").code == 0
        time.sleep(0.1)
        agentpost(dsn, "expire")
    dead = agentpost(dsn, "dead-letters", "w1").json()
    assert [d["reason"] for d in dead] == ["redelivery_exhausted"] * 3
    assert_one_line_error(agentpost(dsn, "lease", "w1", "--ttl", "0"), 2)


def test_cli_maintain_expires_and_vacuums(dsn: str, store: EnvelopeStore) -> None:
    """`agentpost maintain` returns expired leases (counted as redeliveries) and analyzes."""
    _world(store)
    assert agentpost(dsn, "lease", "w1", "--max", "3", "--ttl", "0.05").code == 0
    time.sleep(0.1)
    done = agentpost(dsn, "maintain").json()
    assert done["leases"] == {"expired": 3, "inboxes": 1}
    assert "envelopes" in done["vacuumed"]
    assert store.stats("w1").redeliveries == 3
