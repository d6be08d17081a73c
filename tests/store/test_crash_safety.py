"""Crash safety of the send path (WACP §4 rules 4-5, §6, §7.2), on a real database.

A sending process is killed with SIGKILL at random points, and its Postgres backend is
sometimes terminated with pg_terminate_backend, so that sends are cut off anywhere: before the
durable commit of phase 1, between the phases, in the middle of a delivery. After
``recover()`` every envelope that entered the trail must be delivered exactly once (or recorded
undeliverable), in channel order, and the trail must verify.

Two deterministic tests pin the most interesting window: the sender dies after phase 1
committed while phase 2 waits for the receiver's chain.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import AgentpostError
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import connect
from dbtools import rows as _rows

#: the three channels the sender uses: (from, to, type)
CHANNELS = [("coordinator", "w1", "directive"), ("coordinator", "w2", "directive"),
            ("w1", "coordinator", "query")]
ROUNDS = 24
MIN_ROUNDS = 20
TIME_BUDGET = 70.0  # seconds after which no more rounds start once MIN_ROUNDS are done
KILL_DELAY = (0.005, 0.150)  # seconds of sending before SIGKILL
APP = "agentpost"  # the application_name of every store connection


# -- the sending process (spawned; it records nothing locally) ---------------------------------


def _sender(dsn: str, trail_key: str, seed: int, ready: Any, go: Any, ack_timeout: float,
            plan: str) -> None:
    """Send until killed. `plan` is "random" (send() and send_many() of 1-20 drafts over
    CHANNELS) or "w1-batch" (one send_many of 10 directives to w1, then wait). Sending starts
    when `go` is set, so that the next sender can start (import, connect) while one runs."""
    rng = random.Random(seed)
    store = EnvelopeStore(dsn, trail_key=trail_key, ack_timeout=ack_timeout)
    for attempt in range(50):  # connect before saying ready (a termination may hit this too)
        try:
            store.workspace("coordinator")
            break
        except AgentpostError:
            if attempt == 49:
                raise
            time.sleep(0.01)
    ready.set()
    if not go.wait(120):
        return
    if plan == "w1-batch":
        store.send_many([{"from": "coordinator", "to": "w1", "type": "directive",
                          "content": f"batch {i}"} for i in range(10)])
        time.sleep(60)
        return
    n = 0
    while True:
        try:
            if rng.random() < 0.4:
                sender, to, etype = rng.choice(CHANNELS)
                store.send(sender, to, etype, f"single {seed}-{n}",
                           priority=rng.choice(["normal", "normal", "urgent"]))
                n += 1
            else:
                drafts = []
                for _ in range(rng.randint(1, 20)):
                    sender, to, etype = rng.choice(CHANNELS)
                    drafts.append({"from": sender, "to": to, "type": etype,
                                   "content": f"batch {seed}-{n}",
                                   "priority": rng.choice(["normal", "normal", "urgent"])})
                    n += 1
                store.send_many(drafts)
        except AgentpostError:
            # the backend was terminated under us: the pool reconnects on the next call
            continue


# -- helpers -------------------------------------------------------------------------------------


def _connect(dsn: str) -> Any:
    return connect(dsn, "agentpost-crash-test")


def _terminate_store_backends(conn: Any) -> int:
    """pg_terminate_backend on every store connection to this database (the sender's and any
    backend still finishing the statement of a killed sender)."""
    return len(_rows(conn, """
        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = %s
           AND pid <> pg_backend_pid()""", (APP,)))


def _wait_for_no_store_backends(conn: Any, timeout: float = 30.0) -> None:
    """Wait until the backends of killed senders are gone (a backend carries on with its
    statement after its client died, and could commit after recover() otherwise)."""
    deadline = time.monotonic() + timeout
    terminated = False
    while True:
        (n,), = _rows(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND application_name = %s", (APP,))
        if n == 0:
            return
        if time.monotonic() > deadline:
            if terminated:
                pytest.fail(f"{n} backends of killed senders are still running")
            _terminate_store_backends(conn)
            terminated, deadline = True, time.monotonic() + timeout
        time.sleep(0.05)


def _setup(dsn: str) -> None:
    with EnvelopeStore(dsn) as store:
        store.create_workspace("coordinator", workspace_id="coordinator")
        store.create_workspace("worker", parent="coordinator", workspace_id="w1")
        store.create_workspace("worker", parent="coordinator", workspace_id="w2")


class Sender:
    """A spawned sending process: started at once, sending from go()."""

    def __init__(self, ctx: Any, dsn: str, seed: int, ack_timeout: float, plan: str) -> None:
        self.ready = ctx.Event()
        self._go = ctx.Event()
        self.proc = ctx.Process(target=_sender, daemon=True, args=(
            dsn, os.environ["AGENTPOST_TRAIL_KEY"], seed, self.ready, self._go, ack_timeout,
            plan))
        self.proc.start()

    def go(self) -> None:
        deadline = time.monotonic() + 60
        while not self.ready.wait(0.1):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                pytest.fail(f"the sender did not start (exit code {self.proc.exitcode})")
        self._go.set()

    def kill(self, then: Any = None) -> None:
        """SIGKILL the sender (it must still be running), call `then()` straight away, and
        reap the process."""
        proc = self.proc
        assert proc.is_alive(), f"the sender died on its own (exit code {proc.exitcode})"
        os.kill(proc.pid, signal.SIGKILL)
        if then is not None:
            then()
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL, proc.exitcode


@pytest.fixture
def reaper() -> Iterator[list[Sender]]:
    """Senders started by a test, killed if still alive at its end."""
    senders: list[Sender] = []
    yield senders
    for sender in senders:
        if sender.proc.is_alive():
            sender.proc.kill()
        sender.proc.join(5)


def assert_delivered_exactly_once_in_order(conn: Any, store: EnvelopeStore) -> int:
    """The post-recovery invariants; returns the number of envelopes that entered the trail."""
    statuses = dict(_rows(conn, "SELECT status, count(*) FROM agentpost.envelopes GROUP BY 1"))
    assert statuses.get("validated", 0) == 0, \
        f"validated envelopes left after recover() although every target is deliverable: " \
        f"{statuses}"
    assert set(statuses) <= {"acknowledged", "undeliverable"}, statuses

    # every envelope in the trail: delivered once and acknowledged once, or undeliverable
    bad = _rows(conn, """
        WITH created AS (
            SELECT envelope_id FROM agentpost.trail WHERE event = 'envelope_created'),
        counts AS (
            SELECT c.envelope_id,
                   (SELECT count(*) FROM agentpost.trail t WHERE t.envelope_id = c.envelope_id
                       AND t.event = 'envelope_delivered') AS delivered,
                   (SELECT count(*) FROM agentpost.trail t WHERE t.envelope_id = c.envelope_id
                       AND t.event = 'envelope_undeliverable') AS undeliverable,
                   (SELECT count(*) FROM agentpost.signals s WHERE s.ref = c.envelope_id
                       AND s.signal = 'acknowledged') AS acks,
                   (SELECT count(*) FROM agentpost.trail t WHERE t.envelope_id = c.envelope_id
                       AND t.event = 'envelope_created') AS creations
              FROM created c)
        SELECT * FROM counts
         WHERE creations <> 1
            OR NOT ((delivered = 1 AND acks = 1 AND undeliverable = 0)
                    OR (undeliverable = 1 AND delivered = 0 AND acks = 0))
         LIMIT 20""")
    assert bad == [], f"(envelope, delivered, undeliverable, acks, created) off: {bad}"

    # nothing reached an inbox, or even a row, without entering the trail first
    bad = _rows(conn, """
        SELECT e.id, e.status FROM agentpost.envelopes e
         WHERE NOT EXISTS (SELECT 1 FROM agentpost.trail t
                            WHERE t.envelope_id = e.id AND t.event = 'envelope_created')
         LIMIT 20""")
    assert bad == [], f"envelope rows without an envelope_created entry: {bad}"
    bad = _rows(conn, """
        SELECT t.envelope_id FROM agentpost.trail t
         WHERE t.event = 'envelope_delivered'
           AND NOT EXISTS (SELECT 1 FROM agentpost.trail c WHERE c.envelope_id = t.envelope_id
                             AND c.event = 'envelope_created')
         LIMIT 20""")
    assert bad == [], f"deliveries of envelopes that never entered the trail: {bad}"
    bad = _rows(conn, """
        SELECT e.id FROM agentpost.envelopes e JOIN agentpost.signals s
            ON s.ref = e.id AND s.signal = 'acknowledged'
         WHERE s.workspace_id <> e.sender OR e.status <> 'acknowledged' LIMIT 20""")
    assert bad == [], f"acknowledgments to the wrong workspace or of undelivered rows: {bad}"
    created = {r[0] for r in _rows(conn, "SELECT envelope_id FROM agentpost.trail "
                                         "WHERE event = 'envelope_created'")}
    for ws in (w.id for w in store.workspaces()):
        inbox = store.inbox(ws)
        assert {e.id for e in inbox} <= created, f"{ws}'s inbox holds unrecorded envelopes"
        (n,), = _rows(conn, "SELECT count(*) FROM agentpost.envelopes WHERE recipient = %s "
                            "AND status = 'acknowledged'", (ws,))
        assert len(inbox) == n == len({e.id for e in inbox})

    # channel order: per (sender, recipient), deliveries in the receiver's chain follow
    # creation order, and creations in the sender's chain follow it too
    for event, chain in (("envelope_delivered", "recipient"), ("envelope_created", "sender")):
        order = _rows(conn, f"""
            SELECT e.sender, e.recipient, e.seq, e.created_at
              FROM agentpost.trail t JOIN agentpost.envelopes e ON e.id = t.envelope_id
             WHERE t.event = %s AND t.chain = e.{chain}
             ORDER BY e.sender, e.recipient, t.chain_seq""", (event,))
        last: dict[tuple[str, str], tuple[int, Any]] = {}
        for sender, recipient, seq, created_at in order:
            prev = last.get((sender, recipient))
            assert prev is None or (prev[0] < seq and prev[1] < created_at), \
                f"{event} out of channel order on {sender}->{recipient}: " \
                f"seq {prev} then {(seq, created_at)}"
            last[(sender, recipient)] = (seq, created_at)

    verification = store.verify_trail()
    assert verification.ok, verification
    return len(created)


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_killing_senders_at_random_points_loses_and_duplicates_nothing(
        dsn: str, reaper: list[Sender]) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    _setup(dsn)
    admin = _connect(dsn)
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    rounds = terminations = 0

    def spawn() -> Sender:
        sender = Sender(ctx, dsn, rng.randrange(2**32), 2.0, "random")
        reaper.append(sender)
        return sender

    upcoming = spawn()
    try:
        while rounds < ROUNDS and (rounds < MIN_ROUNDS
                                   or time.monotonic() - started < TIME_BUDGET):
            current, upcoming = upcoming, spawn()  # the next one starts up meanwhile
            current.go()
            delay = rng.uniform(*KILL_DELAY)
            last = rounds + 1 >= MIN_ROUNDS and time.monotonic() - started >= TIME_BUDGET
            how = "kill-then-terminate" if last or rounds + 1 == ROUNDS else rng.choice(
                ["kill", "kill", "terminate-then-kill", "kill-then-terminate"])
            if how == "terminate-then-kill":
                # cut the sender's connection one to three times while it sends
                points = sorted(rng.uniform(0, delay) for _ in range(rng.randint(1, 3)))
                elapsed = 0.0
                for point in points:
                    time.sleep(point - elapsed)
                    elapsed = point
                    terminations += _terminate_store_backends(admin)
                time.sleep(delay - elapsed)
            else:
                time.sleep(delay)
            if how == "kill-then-terminate":
                # the backend goes on with the dead sender's statement: cut it off mid-way
                current.kill(then=lambda: _terminate_store_backends(admin))
                terminations += 1
            else:
                current.kill()
            rounds += 1
        upcoming.proc.kill()  # never told to go: it sent nothing
        upcoming.proc.join(10)
        _wait_for_no_store_backends(admin)
        with EnvelopeStore(dsn, ack_timeout=2.0) as store:
            store.recover()
            entered = assert_delivered_exactly_once_in_order(admin, store)
    finally:
        admin.close()
    assert rounds >= MIN_ROUNDS
    assert entered > 0, f"seed {seed}: the senders never got an envelope into the trail"


def _hold_chain(conn: Any, chain: str) -> None:
    """Take the receiver chain's advisory lock in an open transaction of `conn` (which is not
    in autocommit mode), the way a long delivery to that workspace would."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended('agentpost.trail:' || %s, 0))",
                    (chain,))


def test_sender_killed_between_the_phases_is_completed_by_recover(
        dsn: str, reaper: list[Sender]) -> None:
    """Phase 1 committed (ten envelopes validated and in the trail), phase 2 waits for w1's
    chain; then the sender is killed and its backend terminated. recover() delivers all ten,
    once each, in creation order."""
    _setup(dsn)
    admin = _connect(dsn)
    holder = psycopg2.connect(libpq_dsn(dsn), application_name="agentpost-crash-holder")
    try:
        _hold_chain(holder, "w1")
        sender = Sender(multiprocessing.get_context("spawn"), dsn, 0, 30.0, "w1-batch")
        reaper.append(sender)
        sender.go()
        deadline = time.monotonic() + 20
        while _rows(admin, "SELECT count(*) FROM agentpost.envelopes "
                           "WHERE status = 'validated'")[0][0] < 10:
            assert time.monotonic() < deadline, "phase 1 never committed"
            time.sleep(0.02)
        sender.kill()
        assert _terminate_store_backends(admin) >= 1, "the sender's backend was gone already"
        _wait_for_no_store_backends(admin)
        holder.rollback()  # w1's chain is free again
        with EnvelopeStore(dsn, ack_timeout=2.0) as store:
            assert [e.status for e in store.queued("w1")] == [Status.VALIDATED] * 10
            result = store.recover()
            assert result["delivered"] == 10, result
            assert [e.content for e in store.inbox("w1")] == [f"batch {i}" for i in range(10)]
            assert assert_delivered_exactly_once_in_order(admin, store) == 10
    finally:
        holder.close()
        admin.close()


def test_recover_completes_a_delivery_whose_attempt_was_cut_off(dsn: str) -> None:
    """A delivery attempt that timed out (w1's chain was held) leaves the envelope validated,
    backing off before the next attempt. If the runtime then dies, recovery (WACP §7.2: every
    validated-but-undelivered envelope to a deliverable target is redelivered) must deliver it,
    also while that backoff has not run out yet."""
    _setup(dsn)
    admin = _connect(dsn)
    holder = psycopg2.connect(libpq_dsn(dsn), application_name="agentpost-crash-holder")
    try:
        with EnvelopeStore(dsn, ack_timeout=2.0) as store:
            _hold_chain(holder, "w1")
            result = store.send("coordinator", "w1", "directive", "cut off")
            assert result.status is Status.VALIDATED  # the attempt timed out
            holder.rollback()
            assert store.get(result.envelope_id).attempts == 1
        # the process that sent is gone; a new one recovers straight away
        with EnvelopeStore(dsn, ack_timeout=2.0) as store:
            recovered = store.recover()
            env = store.get(result.envelope_id)
            assert env.status is Status.ACKNOWLEDGED, \
                f"recover() left the envelope {env.status.value}: {recovered}"
            assert assert_delivered_exactly_once_in_order(admin, store) == 1
    finally:
        holder.close()
        admin.close()
