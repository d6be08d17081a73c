"""`agentpost bench envelopes`: the send path against raw single-row inserts.

Measured in one run, on one database, rounds interleaved:
- raw: single-row INSERT + COMMIT through psycopg2 into a table as wide as `envelopes`;
- send: EnvelopeStore.send (validated, trail written, delivered, acknowledged), with latency;
- send_many: batches of 500.
"""

from __future__ import annotations

import time
import uuid

import psycopg2

from agentpost.benchmarks.common import Report, median, percentile, rate, scratch_database
from agentpost.store import EnvelopeStore

_RAW_TABLE = """
CREATE TABLE IF NOT EXISTS public.agentpost_bench_raw (
    id text PRIMARY KEY, seq bigint, sender text, recipient text, originator text, type text,
    format text, content text, attachments jsonb, in_reply_to text, rights jsonb,
    priority text, origin text, status text, reason text, created_at timestamptz)
"""
_RAW_INSERT = """
INSERT INTO public.agentpost_bench_raw VALUES
    (%s, %s, 'bench-lead', 'bench-worker', 'system', 'directive', 'markdown', %s, '[]', NULL,
     '[]', 'normal', 'agent', 'acknowledged', NULL, now())
"""
ROUNDS = 5
BATCH = 500
CONTENT = "Summarise the incident reports of the last quarter."


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    singles = max(20, int(400 * scale))
    batches = max(2, int(8 * scale))
    with scratch_database(dsn, "agentpost_bench") as bench_dsn:
        return _measure(bench_dsn, singles, batches)


def _measure(dsn: str, singles: int, batches: int) -> int:
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    cur.execute(_RAW_TABLE)
    conn.commit()
    seq = iter(range(1, 1 << 62))

    def raw_round() -> None:
        for _ in range(singles):
            cur.execute(_RAW_INSERT, (str(uuid.uuid4()), next(seq), CONTENT))
            conn.commit()

    with EnvelopeStore(dsn) as store:
        tag = uuid.uuid4().hex[:6]
        lead = store.create_workspace("coordinator", workspace_id=f"bench-lead-{tag}").id
        worker = store.create_workspace("worker", parent=lead,
                                        workspace_id=f"bench-worker-{tag}").id
        latencies: list[float] = []

        def send_round() -> None:
            for _ in range(singles):
                start = time.perf_counter()
                store.send(lead, worker, "directive", CONTENT)
                latencies.append(time.perf_counter() - start)

        drafts = [{"from": lead, "to": worker, "type": "directive", "content": CONTENT}] * BATCH

        def many_round() -> None:
            for _ in range(batches):
                store.send_many(drafts)

        raw_round()  # warm up both paths (connections, plans, caches)
        send_round()
        latencies.clear()
        raw_rates, send_rates, many_rates = [], [], []
        for _ in range(ROUNDS):
            raw_rates.append(rate(singles, raw_round))
            send_rates.append(rate(singles, send_round))
            many_rates.append(rate(batches * BATCH, many_round))
        verified = store.verify_trail()
    conn.close()

    raw, send, many = median(raw_rates), median(send_rates), median(many_rates)
    p50, p95 = percentile(latencies, 0.50) * 1000, percentile(latencies, 0.95) * 1000
    report = Report(f"agentpost bench envelopes ({ROUNDS} interleaved rounds, medians; "
                    f"{singles} singles and {batches}×{BATCH} batched per round)")
    report.add("raw INSERT+COMMIT (psycopg2)", f"{raw:,.0f} rows/s")
    report.add("send (single)", f"{send:,.0f} envelopes/s")
    report.add("send_many (batches of 500)", f"{many:,.0f} envelopes/s")
    report.add("send latency p50 / p95", f"{p50:.2f} ms / {p95:.2f} ms")
    report.add("ratio send / raw", f"{send / raw:.2f}")
    report.add("ratio send_many / raw", f"{many / raw:.2f}")
    report.add("trail after the run", f"{verified.entries:,} entries, "
                                      f"{'verified' if verified.ok else 'FAILED'}")
    report.goal("single send >= 0.5 x raw single-row rate", send >= 0.5 * raw)
    report.goal("send_many >= 20,000 envelopes/s", many >= 20_000)
    report.goal("p95 single-send latency < 2 ms", p95 < 2.0)
    report.print()
    return 0 if verified.ok else 1
