"""Benchmarks: scripts that measure side by side in one run and print numbers and ratios.

Speed goals live here, never in timed tests: the machines are shared and noisy, so each
benchmark interleaves what it compares and reports medians over rounds.
"""

from __future__ import annotations

from collections.abc import Callable

SUITES: dict[str, str] = {"agents": "agentpost.benchmarks.agents",
                          "airflow": "agentpost.benchmarks.airflow",
                          "commands": "agentpost.benchmarks.commands",
                          "envelopes": "agentpost.benchmarks.envelopes",
                          "growth": "agentpost.benchmarks.growth",
                          "leases": "agentpost.benchmarks.leases",
                          "marks": "agentpost.benchmarks.marks",
                          "peers": "agentpost.benchmarks.peers",
                          "routes": "agentpost.benchmarks.routes",
                          "since": "agentpost.benchmarks.since",
                          "spark": "agentpost.benchmarks.spark",
                          "ui": "agentpost.benchmarks.ui"}


def run_benchmark(suite: str, *, dsn: str | None = None, scale: float = 1.0,
                  large: bool = False) -> int:
    """Run one suite; `large` (only `growth` takes it) adds its largest size."""
    import importlib

    module = importlib.import_module(SUITES[suite])
    run: Callable[..., int] = module.run
    return run(dsn=dsn, scale=scale, **({"large": True} if large else {}))
