"""The routes benchmark's functions (agentpost.benchmarks.routes) at a tiny scale: they
count what the docstring defines (a hop is one actor handling one envelope; a route of 3
actors fanning out to n at the first makes 1 + 2n hops) and leave a verifiable trail. No
timing is asserted: speed goals live in the benchmark, not in tests."""

from __future__ import annotations

from agentpost.benchmarks.routes import compare, measure_routes, measure_send
from agentpost.store import EnvelopeStore


def test_measure_routes_counts_hops_and_envelopes(store: EnvelopeStore) -> None:
    result = measure_routes(store, routes=3, fanout=4, batch=2)
    assert (result["routes"], result["hops"], result["envelopes"]) == (3, 27, 30)
    assert result["hops_per_s"] > 0 and result["elapsed"] > 0
    assert store.db.scalar("SELECT count(*) FROM agentpost.routes"
                           " WHERE status <> 'succeeded'") == 0
    assert store.verify_trail().ok


def test_compare_reports_the_ratio_of_time_per_hop_to_time_per_send(
        store: EnvelopeStore) -> None:
    sent = measure_send(store, 5)
    assert sent["sends"] == 5 and sent["sends_per_s"] > 0
    result = compare(store, routes=2, sends=5, rounds=1, fanout=2)
    assert result["hop_send_ratio"] == result["sends_per_s"] / result["hops_per_s"]
    assert len(result["each_round"]) == 1
    assert store.verify_trail().ok
