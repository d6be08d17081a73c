"""Shared pieces of the benchmarks: a scratch database, timing, percentiles, a report."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from agentpost.pg.bootstrap import create_database, drop_database, find_server
from agentpost.pg.migrations import migrate


@contextmanager
def scratch_database(dsn: str | None, name: str) -> Iterator[str]:
    """A migrated database for one benchmark run: `dsn` as given, or a fresh one on the
    discovered server, dropped afterwards."""
    if dsn is not None:
        migrate(dsn)
        yield dsn
        return
    server = find_server()
    db = f"{name}_{os.getpid()}"
    bench_dsn = create_database(server.dsn, db, fresh=True)
    try:
        migrate(bench_dsn)
        yield bench_dsn
    finally:
        drop_database(server.dsn, db)


def rate(count: int, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Report:
    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    goals: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, name: str, value: str) -> None:
        self.rows.append((name, value))

    def goal(self, text: str, met: bool) -> None:
        self.goals.append((text, met))

    def print(self) -> None:
        print(f"\n{self.title}")
        width = max(len(n) for n, _ in self.rows)
        for name, value in self.rows:
            print(f"  {name:<{width}}  {value}")
        if self.goals:
            print("goals:")
            for text, met in self.goals:
                print(f"  [{'met' if met else 'MISSED'}] {text}")


def median(values: list[float]) -> float:
    return statistics.median(values)
