"""Smoke test of `agentpost bench growth --large` at a tiny scale (sizes 0, 1,000 and 10,000, the
older half of the 10,000 then archived and pruned): it runs
end to end through the CLI on scratch databases of its own, prints every measurement at every
size beside the empty store's with a ratio, judges every goal, verifies the filled history with
the store's own checker, and drops its databases. No timing is asserted (shared machines)."""

from __future__ import annotations

import inspect
import os
import re

import psycopg2
import pytest

from agentpost.benchmarks.growth import MISSING, RATES
from agentpost.cli import main
from agentpost.pg.server import dsn_for_database, libpq_dsn
from agentpost.store import EnvelopeStore

SIZES = ("1,000", "10,000")
GOALS = (
    r"at 1,000 envelopes every rate within 1\.5x of the empty store's \(lowest ratio [\d.]+\)",
    r"verify_trail\(since=\) over the last 500 entries independent of total size",
    r"empty store: single send >= 0\.5 x raw single-row INSERT\+COMMIT \(ratio [\d.]+\)",
    r"empty store: send_many >= 20,000 envelopes/s",
    r"empty store: lease\+ack >= 10,000/s with 4 consumers, batches of 100",
    r"empty store: send→consumer p95 < 5 ms",
    r"empty store: a boundary over 20 resources < 1 s on Postgres",
    r"with 1,000 envelopes waiting in one inbox, another inbox's rates within 1\.5x of the "
    r"empty store's, analysed or not \(lowest ratio [\d.]+\)",
    # --large: the older half archived and pruned (issue 26)
    r"after archiving and pruning half of 10,000 envelopes every rate within 1\.5x of the "
    r"empty store's \(lowest ratio [\d.]+\)",
    r"after the prune the trail's size follows what is left of it \([\d.]+x the bytes for "
    r"[\d.]+x the entries\)",
    r"after the prune the envelopes' size follows what is left of it \([\d.]+x the bytes for "
    r"[\d.]+x the rows\)",
    r"the prune holds the trail's and the envelopes' locks under 1 s at once, whatever it drops "
    r"and keeps \(trail [\d.]+ s for [1-9][\d,]* entries dropped; envelopes [\d.]+ s for "
    r"[1-9][\d,]* rows kept\)",
)


def _scratch_databases(dsn: str) -> list[str]:
    """This process's scratch databases (named by its pid: another run of the bench on the
    same server, a developer's or another test worker's, has its own)."""
    conn = psycopg2.connect(dsn_for_database(libpq_dsn(dsn), "postgres"))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                        (f"agentpost_bench_growth_{os.getpid()}_%",))
            return [name for (name,) in cur.fetchall()]
    finally:
        conn.close()


def _since_measured() -> bool:
    return "since" in inspect.signature(EnvelopeStore.verify_trail).parameters


@pytest.mark.slow
def test_bench_growth_prints_every_size_ratio_and_goal(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue "Flat cost as the store grows": each rate, the latency and the verification at
    each size beside the empty store's with the ratio; the goals judged met or MISSED; the
    whole filled trail verifies; the scratch databases are gone afterwards."""
    before = set(_scratch_databases(dsn))
    code = main(["--dsn", dsn, "bench", "growth", "--large", "--scale", "0.001"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert re.search(r"empty store: raw INSERT\+COMMIT \(psycopg2\)\s+[\d,]+/s", out), out
    for label in RATES:
        assert re.search(rf"empty store: {re.escape(label)}\s+[\d,]+/s", out), label
    assert re.search(r"empty store: send→consumer p50 / p95\s+[\d.]+ ms / [\d.]+ ms", out)
    assert re.search(r"empty store: resolve_deferred_many over 20 \(Postgres\)\s+[\d.]+ s", out)
    for state in ("not analysed", "after VACUUM ANALYZE"):
        for label in ("send \\(single\\)", "lease\\+ack, 1 consumer, batch 100"):
            assert re.search(rf"backlog, {state}: {label}\s+[\d,]+/s\s+empty\s+[\d,]+/s\s+"
                             r"ratio [\d.]+", out), (state, label, out)
    assert re.search(r"empty store: verify_trail\(\) whole trail\s+[\d.]+ s for [\d,]+ "
                     r"entries, verified", out)
    ratio = r"\s+ratio \d+\.\d\d"
    for size in SIZES:
        for label in RATES:
            assert re.search(rf"{size} envelopes: {re.escape(label)}\s+[\d,]+/s\s+empty\s+"
                             rf"[\d,]+/s{ratio}", out), (size, label)
        for label in ("send→consumer p50", "send→consumer p95"):
            assert re.search(rf"{size} envelopes: {label}\s+[\d.]+ ms\s+empty\s+[\d.]+ ms"
                             rf"{ratio}", out), (size, label)
        since = f"{size} envelopes: verify_trail(since=) last entries"
        if _since_measured():
            assert re.search(rf"{re.escape(since)}\s+[\d.]+ s\s+empty\s+[\d.]+ s{ratio}", out)
        else:
            assert f"{since}  {MISSING}" in out or re.search(
                rf"{re.escape(since)}\s+{re.escape(MISSING)}", out), out
    # the generated history is a store the store's own checker accepts
    assert re.search(r"1,000 envelopes: verify_trail\(\) whole trail\s+[\d.]+ s for [\d,]+ "
                     r"entries, verified", out), out
    assert re.search(r"history filled\s+10,000 envelopes in 10 inbox pairs", out), out
    # the older half archived and pruned, then measured again (issue 26); verified since the
    # checkpoint of the large size's verification, as the maintenance DAG does
    assert re.search(r"archive and prune half: archive \(verify since the last checkpoint "
                     r"\+ Parquet\)\s+[\d.]+ s for [1-9][\d,]* entries", out), out
    # each step's end on stderr as the run goes
    assert re.search(r"filled 10,000 envelopes \([\d.]+ min\)", captured.err), captured.err
    assert "archived and pruned the older half" in captured.err
    assert re.search(r"archive and prune half: prune \(check \+ keep \+ drop\)\s+[\d.]+ s: "
                     r"[1-9][\d,]* entries dropped, [1-9][\d,]* kept; [\d,]+ signals and "
                     r"[1-9][\d,]* envelope rows dropped", out), out
    assert re.search(r"archive and prune half: envelopes rows\s+([\d,]+) before, ([\d,]+) "
                     r"after", out), out
    assert re.search(r"archive and prune half: the envelopes' lock held\s+[\d.]+ s at most at "
                     r"once, [\d.]+ s in all \(to move [1-9][\d,]* rows kept", out), out
    assert re.search(r"archive and prune half: the trail's lock held\s+[\d.]+ s \(to detach",
                     out), out
    assert re.search(r"archive and prune half: trail size\s+[\d,]+ MiB before, [\d,]+ MiB "
                     r"after", out), out
    for label in RATES:
        assert re.search(rf"10,000, half pruned: {re.escape(label)}\s+[\d,]+/s\s+empty\s+"
                         rf"[\d,]+/s{ratio}", out), label
    assert re.search(rf"10,000, half pruned: verify_trail\(since=\) last entries\s+[\d.]+ s"
                     rf"\s+empty\s+[\d.]+ s{ratio}", out), out
    for goal in GOALS:
        assert re.search(rf"\[(met|MISSED)\] {goal}", out), goal
    assert set(_scratch_databases(dsn)) == before
