"""`agentpost bench spark`: its synthetic trail is one the store itself accepts, and a small
run prints every number and both goals (the full run's numbers are in the issue's note, not
asserted: speed goals live in benchmarks, not tests)."""

from __future__ import annotations

import os
import re

import pytest

from agentpost.benchmarks import run_benchmark
from agentpost.benchmarks.spark_fill import ENTRIES_PER_ENVELOPE, Plan, fill
from agentpost.store import EnvelopeStore
from dbtools import query

KEY = os.environ["AGENTPOST_TRAIL_KEY"].encode("utf-8")


def test_the_synthetic_trail_passes_the_stores_own_verification(dsn: str) -> None:
    """What the bench audits is a trail the store would have written: hashes, signatures,
    links, and every envelope row against its signed entries (WACP §3 Integrity)."""
    entries = fill(dsn, KEY, Plan(envelopes=3_000, start_us=1_793_000_000_000_000), parts=2)
    assert abs(entries / 3_000 - ENTRIES_PER_ENVELOPE) < 0.2
    counts = dict(query(dsn, "SELECT status, count(*) FROM agentpost.envelopes GROUP BY 1"))
    assert set(counts) == {"acknowledged", "rejected"} and sum(counts.values()) == 3_000
    with EnvelopeStore(dsn) as store:
        result = store.verify_trail()
    assert result.ok and result.entries == entries, result.failure
    # the two parts' chains are disjoint: a sender only ever writes to its own part
    assert query(dsn, "SELECT count(*) FROM agentpost.envelopes "
                      "WHERE mod(split_part(sender, '-', 3)::int, 2) "
                      "<> mod(split_part(recipient, '-', 3)::int, 2)")[0][0] == 0


@pytest.mark.slow
def test_bench_spark_small_prints_its_numbers_and_goals(spark, dsn: str,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """In this process, on the tests' Spark session (the bench leaves a session it did not
    start running): a JVM start fewer than through the CLI."""
    assert run_benchmark("spark", dsn=dsn, scale=0.002) == 0
    out = capsys.readouterr().out
    text = out[out.index("agentpost bench spark:"):]
    for row in ("trail filled (COPY)", "read: COPY TO STDOUT", "read: Spark JDBC",
                "audit (Spark)", "analytics (Spark)", "main aggregates (one SQL query)"):
        assert re.search(rf"^  {re.escape(row)} +\S", text, re.MULTILINE), (row, text)
    assert "every check passed" in text
    assert re.search(r"^  \[(met|MISSED)\] audit of 2\d,\d{3} events under 10 min", text,
                     re.MULTILINE), text
    assert re.search(r"^  \[(met|MISSED)\] JDBC read within 2x of COPY TO STDOUT \([\d.]+x\)",
                     text, re.MULTILINE), text
