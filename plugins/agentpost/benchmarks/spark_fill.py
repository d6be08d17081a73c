"""A synthetic trail for `agentpost bench spark`, generated in Python and loaded with COPY.

The history is what the store's own steps would have written (compare sql/0003, 0005, 0017
and 0055): agents `spark-agent-<k>` send envelopes to one another over a day; of every 100,
85 are delivered, leased and acknowledged (five entries: `envelope_created` in the sender's
chain, then `envelope_delivered`, the `acknowledged` signal, `envelope_leased` and
`envelope_consumed` in the recipient's), 10 are delivered and still wait in the inbox (three
entries) and 5 are rejected (`envelope_rejected` and the `rejected` signal, in the sender's
chain). Every entry carries the signed envelope row state its step leaves, the envelope rows
and the agents' workspace rows are loaded too (every row the trail names exists), and each
chain is hashed and signed as `_trail_write` does, so both the store's `verify_trail()` and
the Spark audit accept the whole trail.

Per entry the work is string formatting, one SHA-256 for the chain and two for the HMAC (its
pads pre-hashed once); rows stream into COPY while they are made, so Postgres and Python
work side by side.
"""

from __future__ import annotations

import functools
import hashlib
import random
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import IO

import psycopg2

from agentpost.protocol.trail import GENESIS, key_pads

AGENTS = 200
DAY_US = 86_400_000_000
CONTENT = "Summarise the incident reports of the last quarter."
CONTENT_SHA = hashlib.sha256(CONTENT.encode("utf-8")).hexdigest()
#: sha256 of the defaults' jsonb_build_array(attachments, rights, tags, headers, meta, hops)
EXTRAS_SHA = hashlib.sha256(b"[[], [], [], {}, {}, 0]").hexdigest()
#: average trail entries per envelope of the mix above (0.85 * 5 + 0.10 * 3 + 0.05 * 2)
ENTRIES_PER_ENVELOPE = 4.65

TRAIL_COPY = ("COPY agentpost.trail (chain, chain_seq, event, envelope_id, at, record, "
              "prev_hash, hash, mac) FROM STDIN")
ENVELOPE_COPY = ("COPY agentpost.envelopes (id, seq, sender, recipient, originator, type, "
                 "format, content, priority, origin, status, reason, created_at, delivered_at, "
                 "consumed_at, attempts, lease_holder, leases, redeliveries, first_leased_at) "
                 "FROM STDIN")


@functools.lru_cache(maxsize=4096)
def _second(seconds: int, sep: str) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).strftime(
        f"%Y-%m-%d{sep}%H:%M:%S")


def _stamp(us: int) -> str:
    """A timestamptz in COPY's text form, from microseconds since the epoch (formatting a
    datetime per entry was most of the generator's time: whole seconds are cached)."""
    seconds, micros = divmod(us, 1_000_000)
    return f"{_second(seconds, ' ')}.{micros:06d}+00"


def _iso(us: int) -> str:
    """A time as an ISO 8601 string in a signed body."""
    seconds, micros = divmod(us, 1_000_000)
    return f"{_second(seconds, 'T')}.{micros:06d}+00:00"


def _opt(us: int | None) -> str:
    return "null" if us is None else str(us)


@dataclass
class Chains:
    """Every chain's head, and the signing of entries appended to them."""

    key: bytes
    heads: dict[str, tuple[int, bytes, int]] = field(default_factory=dict)
    entries: int = 0

    def __post_init__(self) -> None:
        ipad, opad = key_pads(self.key)
        self._inner = hashlib.sha256(ipad)
        self._outer = hashlib.sha256(opad)

    def append(self, chain: str, event: str, envelope_id: str, at_us: int, body: str) -> str:
        """The COPY line of the next entry of `chain` (its time at least `at_us`, later than
        the chain's last)."""
        seq, prev, last_at = self.heads.get(chain, (0, GENESIS, 0))
        seq += 1
        at_us = max(at_us, last_at + 1)
        record = (f'{{"seq": {seq}, "body": {body}, "at_us": {at_us}, "chain": "{chain}", '
                  f'"event": "{event}", "envelope_id": "{envelope_id}"}}')
        digest = hashlib.sha256(prev + record.encode("utf-8")).digest()
        inner = self._inner.copy()
        inner.update(digest)
        outer = self._outer.copy()
        outer.update(inner.digest())
        self.heads[chain] = (seq, digest, at_us)
        self.entries += 1
        return (f"{chain}\t{seq}\t{event}\t{envelope_id}\t{_stamp(at_us)}\t{record}\t"
                f"\\\\x{prev.hex()}\t\\\\x{digest.hex()}\t\\\\x{outer.hexdigest()}\n")


def _row(status: str, reason: str | None, delivered: int | None, consumed: int | None,
         leases: int, fixed: str | None = None) -> str:
    why = "null" if reason is None else f'"{reason}"'
    moving = (f'"leases": {leases}, "reason": {why}, '
              f'"status": "{status}", "redeliveries": 0, "consumed_at_us": {_opt(consumed)}, '
              f'"delivered_at_us": {_opt(delivered)}')
    return f'{{"fixed": {fixed}, {moving}}}' if fixed else f"{{{moving}}}"


def _fixed(seq: int, sender: str, recipient: str, type_: str, created: int) -> str:
    """The fixed half of a row as its creation entry signs it (every envelope here carries
    CONTENT and the default extras)."""
    return (f'{{"seq": {seq}, "type": "{type_}", "format": "markdown", "origin": "agent", '
            f'"sender": "{sender}", "priority": "normal", "recipient": "{recipient}", '
            f'"originator": "system", "in_reply_to": null, "created_at_us": {created}, '
            f'"extras_sha256": "{EXTRAS_SHA}", "content_sha256": '
            f'"{CONTENT_SHA}"}}')


@dataclass(frozen=True)
class Plan:
    """What to generate: `envelopes` over one day from `start_us`, reproducibly; part `group`
    of `groups` (the agents k with k % groups == group, which send only to one another, so
    each part's chains are its own and the parts load in parallel)."""

    envelopes: int
    start_us: int
    seed: int = 17
    agents: int = AGENTS
    group: int = 0
    groups: int = 1

    def part(self, group: int, groups: int) -> Plan:
        return Plan(self.envelopes // groups + (group < self.envelopes % groups),
                    self.start_us, self.seed + group, self.agents, group, groups)


def generate(plan: Plan, chains: Chains, rows: IO[str]) -> Iterator[str]:
    """Trail COPY lines in chain order; each envelope's row is written to `rows`."""
    rng = random.Random(plan.seed)
    step = DAY_US // max(1, plan.envelopes)
    own = max(1, plan.agents // plan.groups)
    for i in range(1, plan.envelopes + 1):
        sender = f"spark-agent-{plan.group + plan.groups * rng.randrange(own)}"
        recipient = f"spark-agent-{plan.group + plan.groups * rng.randrange(own)}"
        n = i * plan.groups + plan.group  # the envelope's seq, unique across the parts
        env_id = f"spark-{n:010d}"
        created = plan.start_us + i * step
        kind = rng.randrange(100)
        if kind < 5:
            yield from _rejected(chains, rows, n, env_id, sender, recipient, created)
            continue
        latency = int(rng.lognormvariate(9.0, 1.2))  # µs: about 8 ms median, a long tail
        yield from _delivered(chains, rows, n, env_id, sender, recipient, created,
                              created + latency, consumed=kind >= 15)


def _rejected(chains: Chains, rows: IO[str], n: int, env_id: str, sender: str,
              recipient: str, created: int) -> Iterator[str]:
    fixed = _fixed(n, sender, recipient, "nosuchtype", created)
    row = _row("rejected", "invalid_type", None, None, 0, fixed)
    yield chains.append(sender, "envelope_rejected", env_id, created,
                        f'{{"to": "{recipient}", "row": {row}, "from": "{sender}", '
                        f'"type": "nosuchtype", "reason": "invalid_type", '
                        f'"timestamp": "{_iso(created)}", "envelope_id": "{env_id}"}}')
    yield chains.append(sender, "signal_emitted", env_id, created,
                        f'{{"to": "{sender}", "ref": "{env_id}", "reason": "invalid_type", '
                        f'"signal": "rejected"}}')
    stamp = _stamp(created)
    rows.write(f"{env_id}\t{n}\t{sender}\t{recipient}\tsystem\tnosuchtype\tmarkdown\t{CONTENT}\t"
               f"normal\tagent\trejected\tinvalid_type\t{stamp}\t\\N\t\\N\t0\t\\N\t0\t0\t\\N\n")


def _delivered(chains: Chains, rows: IO[str], n: int, env_id: str, sender: str,
               recipient: str, created: int, delivered: int, *,
               consumed: bool) -> Iterator[str]:
    fixed = _fixed(n, sender, recipient, "directive", created)
    born = _row("validated", None, None, None, 0, fixed)
    yield chains.append(sender, "envelope_created", env_id, created,
                        f'{{"to": "{recipient}", "row": {born}, '
                        f'"from": "{sender}", "type": "directive", "origin": "agent", '
                        f'"priority": "normal", "timestamp": "{_iso(created)}", '
                        f'"originator": "system", "envelope_id": "{env_id}", '
                        f'"in_reply_to": null}}')
    arrived = _row("acknowledged", None, delivered, None, 0)
    yield chains.append(recipient, "envelope_delivered", env_id, delivered,
                        f'{{"to": "{recipient}", "row": {arrived}, '
                        f'"from": "{sender}", "attempt": 1, "envelope_id": "{env_id}", '
                        f'"delivered_at": "{_iso(delivered)}"}}')
    yield chains.append(recipient, "signal_emitted", env_id, delivered,
                        f'{{"to": "{sender}", "ref": "{env_id}", "signal": "acknowledged"}}')
    leased = done = None
    if consumed:
        leased, done = delivered + 1_000, delivered + 5_000
        holder = f'"holder": "spark-consumer", "attempt": 1, "envelope_id": "{env_id}", ' \
                 f'"workspace_id": "{recipient}"'
        yield chains.append(recipient, "envelope_leased", env_id, leased,
                            f'{{"row": {_row("acknowledged", None, delivered, None, 1)}, '
                            f'{holder}, "expires_at": "{_iso(leased + 30_000_000)}"}}')
        yield chains.append(recipient, "envelope_consumed", env_id, done,
                            f'{{"row": {_row("acknowledged", None, delivered, done, 1)}, '
                            f'"via": "ack", {holder}}}')
    rows.write(f"{env_id}\t{n}\t{sender}\t{recipient}\tsystem\tdirective\tmarkdown\t{CONTENT}\t"
               f"normal\tagent\tacknowledged\t\\N\t{_stamp(created)}\t{_stamp(delivered)}\t"
               f"{_stamp(done) if done else chr(92) + 'N'}\t1\t"
               f"{'spark-consumer' if consumed else chr(92) + 'N'}\t{1 if consumed else 0}\t0\t"
               f"{_stamp(leased) if leased else chr(92) + 'N'}\n")


class LineReader:
    """A file-like view of an iterator of lines, for `copy_expert`."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines
        self._buffer = ""

    def read(self, size: int = -1) -> str:
        size = 1 << 20 if size is None or size < 0 else size
        parts, length = [self._buffer], len(self._buffer)
        for line in self._lines:
            parts.append(line)
            length += len(line)
            if length >= size:
                break
        text = "".join(parts)
        self._buffer = text[size:]
        return text[:size]

    readline = read


def fill_part(dsn: str, key: bytes, plan: Plan) -> int:
    """Load one part's trail and envelope rows with COPY, in one transaction; returns its
    number of trail entries."""
    chains = Chains(key)
    conn = psycopg2.connect(dsn, application_name="agentpost-bench-spark-fill")
    try:
        with tempfile.TemporaryFile("w+", encoding="utf-8") as rows, conn.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = off")
            cur.copy_expert(TRAIL_COPY, LineReader(generate(plan, chains, rows)))
            rows.seek(0)
            cur.copy_expert(ENVELOPE_COPY, rows)
        conn.commit()
    finally:
        conn.close()
    return chains.entries


#: the agents' workspace rows, whose chains the trail names (their creation entries are not
#: part of the synthetic history: each chain starts with the agent's first envelope)
WORKSPACES = ("INSERT INTO agentpost.workspaces (id, role, lineage, originator) "
              "SELECT 'spark-agent-' || k, 'worker', '{worker}', 'system' "
              "FROM generate_series(0, %s - 1) k")


def fill(dsn: str, key: bytes, plan: Plan, *, parts: int = 2) -> int:
    """Load `plan`'s workspaces, then its history in `parts` processes side by side, then
    analyze; returns the number of trail entries."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(WORKSPACES, (plan.agents,))
    finally:
        conn.close()
    with ProcessPoolExecutor(max_workers=parts) as pool:
        entries = sum(pool.map(fill_part, [dsn] * parts, [key] * parts,
                               [plan.part(g, parts) for g in range(parts)]))
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT setval('agentpost.envelope_seq', max(seq)) "
                        "FROM agentpost.envelopes")
            # fresh statistics: without them the planner walks a bulk-loaded table badly
            cur.execute("ANALYZE agentpost.trail")
            cur.execute("ANALYZE agentpost.envelopes")
    finally:
        conn.close()
    return entries
