"""Soak: several consumer processes on one inbox, random lease expiries, SIGKILLed consumers
(issue 3, Reliability; Courier §6.3, §16 "Property: at-least-once").

Consumers (spawned processes, a store each) lease with short TTLs (0.3-1 s) and then ack,
nack (sometimes with a delay), abandon the lease to expire, ack too late (must be refused) or
ack near the expiry; the test SIGKILLs one every couple of seconds and starts a new one. Each
consumer logs what it saw to a table of the test database (lease: envelope, attempt, holder,
ttl, expiry; settle: what it tried, when, and how it ended), before and after each call, so a
kill leaves at worst an unfinished row.

Afterwards every envelope must be acked exactly once or dead-lettered after 3 redeliveries,
none lost; and no envelope was held by two live leases at once, checked twice: on the trail
(each `envelope_leased` against the end of the previous lease: its `lease_nacked` entry or
its expiry) and on the consumers' log (and the log must agree with the trail).

Bounded: 480 envelopes sent in batches during a 16 s stress phase, then a final drain; about
30 s in all.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentpost.protocol.errors import AgentpostError, LeaseLost
from agentpost.protocol.leases import DEAD_LETTER_REASON
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import connect, query, rows
from test_leases import BOSS, assert_trail_ok, fill, topology

BATCHES, BATCH = 32, 15  # sent during the stress phase, one batch every STRESS/BATCHES s
CONSUMERS = 3
STRESS_SECONDS = 16.0
KILL_EVERY = (1.5, 3.0)  # seconds between SIGKILLs
TTLS = (0.3, 0.5, 1.0)
LATE = 0.05  # an ack this long after the expiry must be refused
POISON = "poison"  # content of envelopes every consumer gives back: they must die
#: what a consumer does with a lease, and how often
ACTIONS = {"ack": 50, "nack": 15, "nack-delay": 5, "abandon": 12, "late-ack": 6, "slow-ack": 12}

LOG_TABLE = """
CREATE TABLE public.soak_log (
    id              bigserial PRIMARY KEY,
    consumer        text NOT NULL,
    envelope_id     text NOT NULL,
    attempt         int NOT NULL,
    ttl_ms          int NOT NULL,
    called_at       timestamptz NOT NULL,  -- before the lease() call
    returned_at     timestamptz NOT NULL,  -- after it returned
    expires_at      timestamptz NOT NULL,
    action          text,                  -- what the consumer set out to do
    settle_called   timestamptz,           -- before ack/nack
    settle_returned timestamptz,           -- after it returned (NULL: killed meanwhile)
    outcome         text                   -- acked, nacked, lease-lost, error:...
)"""


def now() -> datetime:
    return datetime.now(UTC)


# -- the consumer process ----------------------------------------------------------------------


def _consumer(dsn: str, trail_key: str, name: str, seed: int, stop: Any) -> None:
    """Lease from w1 until `stop` is set (or killed), logging every step."""
    rng = random.Random(seed)
    log = connect(dsn, "agentpost-soak-log")
    store = EnvelopeStore(dsn, trail_key=trail_key)
    actions, weights = list(ACTIONS), list(ACTIONS.values())
    while not stop.is_set():
        ttl = rng.choice(TTLS)
        called = now()
        try:
            leases = store.lease("w1", max=rng.randint(1, 3), ttl=ttl, holder=name)
        except AgentpostError:
            time.sleep(0.05)
            continue
        returned = now()
        if not leases:
            time.sleep(0.02)
            continue
        row_ids = [rows(log, """
            INSERT INTO public.soak_log (consumer, envelope_id, attempt, ttl_ms, called_at,
                                         returned_at, expires_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (name, lease.envelope_id, lease.attempt, round(ttl * 1000), called, returned,
             lease.expires_at))[0][0] for lease in leases]
        for lease, row_id in zip(leases, row_ids, strict=True):
            if (lease.envelope.content or "").startswith(POISON):
                action = rng.choice(["nack", "abandon", "late-ack"])
            else:
                action = rng.choices(actions, weights)[0]
            _settle(store, log, rng, lease, row_id, action)


def _settle(store: EnvelopeStore, log: Any, rng: random.Random, lease: Any, row_id: int,
            action: str) -> None:
    """Do `action` with one lease, logging the intent first and the outcome after."""
    if action == "abandon":
        rows(log, "UPDATE public.soak_log SET action = %s WHERE id = %s", (action, row_id))
        return
    if action == "late-ack":
        time.sleep(max(0.0, (lease.expires_at - now()).total_seconds()) + LATE)
    elif action == "slow-ack":
        time.sleep(max(0.0, rng.uniform(0, (lease.expires_at - now()).total_seconds() + 0.1)))
    called = now()
    rows(log, "UPDATE public.soak_log SET action = %s, settle_called = %s WHERE id = %s",
         (action, called, row_id))
    try:
        if action.startswith("nack"):
            store.nack(lease.token, delay=0.2 if action == "nack-delay" else 0)
            outcome = "nacked"
        else:
            store.ack(lease.token)
            outcome = "acked"
    except LeaseLost:
        outcome = "lease-lost"
    except AgentpostError as exc:
        outcome = f"error:{type(exc).__name__}"
    rows(log, "UPDATE public.soak_log SET settle_returned = %s, outcome = %s WHERE id = %s",
         (now(), outcome, row_id))


class Consumer:
    def __init__(self, ctx: Any, dsn: str, name: str, seed: int) -> None:
        self.name = name
        self.stop = ctx.Event()
        self.proc = ctx.Process(target=_consumer, daemon=True, args=(
            dsn, os.environ["AGENTPOST_TRAIL_KEY"], name, seed, self.stop))
        self.proc.start()

    def kill(self) -> None:
        assert self.proc.is_alive(), f"{self.name} died on its own ({self.proc.exitcode})"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    started: list[Consumer] = []
    yield started
    for consumer in started:
        if consumer.proc.is_alive():
            consumer.proc.kill()
        consumer.proc.join(5)


# -- the checks --------------------------------------------------------------------------------


@dataclass
class LeaseRecord:
    """One lease as the trail saw it: granted no later than `granted_by`, live until
    `ended` at the earliest (a nack's trail entry) or until `expires_at`."""

    attempt: int
    holder: str
    expires_at: datetime
    granted_by: datetime
    ended: datetime | None = None  # the lease_nacked entry's time
    fate: str = "open"


def _leases_on_the_trail(store: EnvelopeStore) -> dict[str, dict[int, LeaseRecord]]:
    out: dict[str, dict[int, LeaseRecord]] = defaultdict(dict)
    for e in store.trail(workspace_id="w1", event="envelope_leased", limit=100_000):
        attempt = e.body["attempt"]
        assert attempt not in out[e.envelope_id], f"attempt {attempt} of {e.envelope_id} twice"
        out[e.envelope_id][attempt] = LeaseRecord(
            attempt=attempt, holder=e.body["holder"],
            expires_at=datetime.fromisoformat(e.body["expires_at"]), granted_by=e.at)
    for event, fate in (("lease_nacked", "nacked"), ("lease_expired", "expired"),
                        ("envelope_consumed", "acked")):
        for e in store.trail(workspace_id="w1", event=event, limit=100_000):
            record = out[e.envelope_id][e.body["attempt"]]
            assert record.fate == "open", f"{e.envelope_id} attempt {record.attempt} ended twice"
            record.fate = fate
            if fate == "nacked":
                record.ended = e.at
    return out


def _assert_every_envelope_acked_once_or_dead(store: EnvelopeStore, sent: list[str],
                                              trail: dict[str, dict[int, LeaseRecord]]) -> int:
    dead = 0
    failed = {s.ref for s in store.signals(BOSS) if s.signal == "failed"}
    undeliverable = Counter(e.envelope_id for e in store.trail(
        workspace_id=BOSS, event="envelope_undeliverable", limit=100_000))
    for eid in sent:
        env = store.get(eid)
        leases = trail[eid]
        assert sorted(leases) == list(range(1, len(leases) + 1)), f"{eid}: attempts {leases}"
        fates = [leases[k].fate for k in sorted(leases)]
        assert env.status is Status.UNDELIVERABLE or not (env.content or "").startswith(POISON), \
            f"{eid} was given back by every consumer, yet it is {env.status}: {fates}"
        if env.status is Status.UNDELIVERABLE:
            dead += 1
            assert env.reason == DEAD_LETTER_REASON, env
            assert len(leases) == 4 and "acked" not in fates, (eid, fates)
            assert "open" not in fates and env.redeliveries >= 3, (eid, fates)
            assert eid in failed and undeliverable[eid] == 1
        else:
            assert env.status is Status.ACKNOWLEDGED and env.consumed_at is not None, \
                f"lost: {eid} is neither acked nor dead-lettered ({env.status}, {fates})"
            assert fates.count("acked") == 1 and fates[-1] == "acked", (eid, fates)
            assert "open" not in fates[:-1] and len(leases) <= 4, (eid, fates)
            assert eid not in failed and undeliverable[eid] == 0
    return dead


def _assert_no_overlap_on_the_trail(trail: dict[str, dict[int, LeaseRecord]],
                                    grants: dict[tuple[str, int], datetime]) -> None:
    """Lease k+1 of an envelope was granted only after lease k ended: after its nack was
    recorded, or after its expiry. The grant time is exact for leases the consumers logged
    (expiry - ttl), else bounded by its trail entry."""
    for eid, leases in trail.items():
        for k in sorted(leases)[1:]:
            before, after = leases[k - 1], leases[k]
            granted = grants.get((eid, k), after.granted_by)
            ended = before.ended if before.fate == "nacked" else before.expires_at
            assert before.fate in ("nacked", "expired"), (eid, k - 1, before.fate)
            assert ended is not None and granted >= ended, \
                f"{eid}: lease {k} granted at {granted} while lease {k - 1} ({before.fate}) " \
                f"was live until {ended}"


def _assert_log_agrees(log: list[tuple[Any, ...]],
                       trail: dict[str, dict[int, LeaseRecord]]) -> None:
    """The consumers' view: each logged lease is on the trail as logged; a late ack was
    always refused; at most one successful ack per envelope; and no lease was handed out
    while the consumer holding the previous one still held it live."""
    acks: Counter[str] = Counter()
    by_lease = {(r[1], r[2]): r for r in log}
    for (consumer, eid, attempt, ttl_ms, _called, returned, expires, action, settle_called,
         settle_returned, outcome) in log:
        record = trail[eid].get(attempt)
        assert record is not None, f"{consumer} logged lease {attempt} of {eid}: not on trail"
        assert (record.holder, record.expires_at) == (consumer, expires), (record, consumer)
        assert expires - timedelta(milliseconds=ttl_ms) <= returned
        if outcome == "acked":
            acks[eid] += 1
            assert settle_called < expires, f"{eid}: acked after its lease expired"
        if action == "late-ack" and settle_returned is not None:
            assert outcome == "lease-lost", f"{eid}: an ack {LATE}s after expiry got {outcome}"
        assert outcome is None or not outcome.startswith("error"), (eid, outcome)
        previous = by_lease.get((eid, attempt - 1))
        if previous is None:
            continue
        # the previous holder's lease was live until its expiry, or at least until it
        # started a nack that went through (or whose outcome it never learnt)
        p_expires, p_action, p_called, p_outcome = previous[6], previous[7], previous[8], \
            previous[10]
        live_until = p_expires
        if p_called is not None and p_outcome in ("nacked", None) and p_action.startswith("n"):
            live_until = min(p_expires, p_called)
        granted = expires - timedelta(milliseconds=ttl_ms)
        assert granted >= live_until, \
            f"{eid}: {consumer} got lease {attempt} at {granted}, lease {attempt - 1} " \
            f"({previous[0]}, {p_action} -> {p_outcome}) was live until {live_until}"
    assert max(acks.values(), default=0) <= 1, [e for e, n in acks.items() if n > 1]


# -- the test ------------------------------------------------------------------------------------


def _drain(store: EnvelopeStore, deadline: float) -> None:
    """Ack whatever is left once the killed consumers' leases (and nack delays) ran out."""
    while True:
        store.expire_leases()
        for lease in store.lease("w1", max=100, ttl=30.0, holder="drain"):
            if (lease.envelope.content or "").startswith(POISON):
                store.nack(lease.token)
            else:
                store.ack(lease.token)
        (left,), = query(store.dsn, """
            SELECT count(*) FROM agentpost.envelopes
             WHERE recipient = 'w1' AND status = 'acknowledged' AND consumed_at IS NULL""")
        if left == 0:
            return
        assert time.monotonic() < deadline, f"the inbox never drained: {left} left"
        time.sleep(0.1)


def _send_batch(store: EnvelopeStore, n: int) -> list[str]:
    """BATCH envelopes to w1, the last one poisoned."""
    return (fill(store, "w1", BATCH - 1, prefix=f"soak-{n}-")
            + fill(store, "w1", 1, prefix=f"{POISON}-{n}-"))


@pytest.mark.slow
def test_soak_with_expiries_and_killed_consumers(dsn: str, consumers: list[Consumer]) -> None:
    """Issue 3, Reliability: with several consumer processes, random lease expiries and
    SIGKILLed consumers, every envelope is acked exactly once or dead-lettered after 3
    redeliveries; none is lost; no envelope is held by two live leases at once."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    with EnvelopeStore(dsn) as store:
        topology(store)
        query(dsn, LOG_TABLE)
        sent = _send_batch(store, 0)
        ctx = multiprocessing.get_context("spawn")
        serial = iter(range(1000))

        def start() -> None:
            consumers.append(Consumer(ctx, dsn, f"c{next(serial)}", rng.randrange(2**32)))

        for _ in range(CONSUMERS):
            start()
        began = time.monotonic()
        kills = 0
        next_kill = began + rng.uniform(*KILL_EVERY)
        while time.monotonic() - began < STRESS_SECONDS:
            time.sleep(0.1)
            due = min(BATCHES, 1 + int((time.monotonic() - began) / STRESS_SECONDS * BATCHES))
            while len(sent) < due * BATCH:
                sent += _send_batch(store, len(sent) // BATCH)
            if time.monotonic() >= next_kill:
                rng.choice([c for c in consumers if c.proc.is_alive()]).kill()
                kills += 1
                start()
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        for consumer in consumers:
            consumer.stop.set()
        for consumer in consumers:
            consumer.proc.join(15)
            assert consumer.proc.exitcode in (0, -signal.SIGKILL), \
                f"{consumer.name} failed (exit code {consumer.proc.exitcode}), seed {seed}"
        _drain(store, time.monotonic() + 20)

        trail = _leases_on_the_trail(store)
        log = query(dsn, """
            SELECT consumer, envelope_id, attempt, ttl_ms, called_at, returned_at, expires_at,
                   action, settle_called, settle_returned, outcome
              FROM public.soak_log ORDER BY id""")
        grants = {(r[1], r[2]): r[6] - timedelta(milliseconds=r[3]) for r in log}
        dead = _assert_every_envelope_acked_once_or_dead(store, sent, trail)
        _assert_no_overlap_on_the_trail(trail, grants)
        _assert_log_agrees(log, trail)
        assert_trail_ok(store)
    outcomes = Counter(r[10] for r in log)
    returns = sum(len(x) - 1 for x in trail.values())
    (poisoned,), = query(dsn, "SELECT count(*) FROM agentpost.envelopes WHERE content LIKE %s "
                              "AND status = 'undeliverable'", (POISON + "%",))
    assert poisoned == BATCHES and dead >= poisoned, (poisoned, dead)
    assert kills >= 4, f"only {kills} consumers were killed"
    assert len(sent) == BATCHES * BATCH
    assert outcomes["lease-lost"] > 0 and outcomes["nacked"] > 0 and returns > 0, outcomes
    print(f"soak seed {seed}: {len(log)} leases logged, {outcomes}, {returns} returns, "
          f"{dead} dead letters, {kills} kills")
