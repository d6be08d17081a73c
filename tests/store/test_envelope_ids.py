"""Envelope ids in time order (issue 25; sql/0084), on a real database.

The store names a new envelope with a version 7 UUID, whose first 48 bits are the
millisecond it was made, so the indexes keyed by envelope id grow at their right-hand edge
instead of at a random page. Pinned here: every way of sending names its envelope so (one
send, a batch, the checked send, a send that waits in a queue, a rejection, a person's
injection), ids made later never sort before ids made earlier, and an id the caller chose is
kept as given.
"""

from __future__ import annotations

import time
import uuid

from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from store.test_leases import BOSS, topology


def _ms(envelope_id: str) -> int:
    return int.from_bytes(uuid.UUID(envelope_id).bytes[:6], "big")


def test_every_send_names_its_envelope_with_a_version_7_uuid(store: EnvelopeStore) -> None:
    topology(store, ("w1", "w2"))
    before = int(time.time() * 1000)
    ids = [store.send(BOSS, "w1", "directive", "one").envelope_id,
           *(r.envelope_id for r in store.send_many(
               [{"from": BOSS, "to": "w1", "type": "directive", "content": f"b{i}"}
                for i in range(3)])),
           store.send_checked(BOSS, "w1", "directive", "checked").envelope_id,
           store.send(BOSS, "w1", "no-such-type", "rejected").envelope_id,
           store.inject("alice", "w1", "directive", "from a person").envelope_id]
    store.transition("w2", "suspended")
    queued = store.send(BOSS, "w2", "directive", "waits")
    assert queued.status is Status.VALIDATED
    ids.append(queued.envelope_id)
    after = int(time.time() * 1000)
    assert all(uuid.UUID(i).version == 7 for i in ids), ids
    stamps = [_ms(i) for i in ids]
    assert stamps == sorted(stamps)
    assert before - 1 <= stamps[0] and stamps[-1] <= after + 1


def test_ids_made_later_sort_after_and_a_chosen_id_is_kept(store: EnvelopeStore) -> None:
    topology(store)
    first = store.send(BOSS, "w1", "directive", "first").envelope_id
    time.sleep(0.005)
    later = store.send(BOSS, "w1", "directive", "later").envelope_id
    assert first < later
    chosen = "order-17"
    (result,) = store.send_many([{"envelope_id": chosen, "from": BOSS, "to": "w1",
                                  "type": "directive", "content": "mine"}])
    assert result.envelope_id == chosen and result.status is Status.ACKNOWLEDGED
