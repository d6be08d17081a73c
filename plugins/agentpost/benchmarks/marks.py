"""`agentpost bench marks`: the mark space at 10,000, 100,000 and 1,000,000 marks, both
backends, beside the PyPI package `markspace` (issue 15: ours is a drop-in for it).

For each backend and size, in one run:
- write rate, single (`write`) and batched (`write_many`, the fill itself);
- read latency p50/p95 for one (scope, topic) and one (scope, resource), random keys;
- `Guard.pre_action` p95 on fresh resources of a FIRST_WRITER scope;
- `resolve_deferred` over 1,000 contested resources with 5 intents each (HIGHEST_CONFIDENCE,
  deferred scope): the time for all 1,000 boundaries, one call each; and the same workload
  on 1,000 other resources in one `resolve_deferred_many` call (what `resolve_all_deferred`
  runs), which the goal judges.

Keys are spread so that one read returns a handful of marks (100,000 topics and 100,000
resources at full scale): the goals are about not scanning the space, not about returning a
large result. The in-memory backend is measured at 1,000,000 marks too unless `--scale`
makes that smaller; memory use is printed beside it.

The package's `MarkSpace` (when `markspace` is installed: the dev extra pins it) gets the same
workload at 10,000 and 100,000 marks: the same marks written one by one (it has no batch
write), reads of the same keys, `pre_action` on fresh resources. It scans a scope on every
read, so it gets fewer samples (`_package_samples`); the comparison is of medians. The
package is imported here only, lazily: agentpost never needs it at runtime.
"""

from __future__ import annotations

import gc
import random
import resource
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import agentpost.marks as ours
from agentpost.benchmarks.common import Report, median, percentile, scratch_database
from agentpost.marks import hours
from agentpost.marks.space import MarkSpace

BATCH = 10_000
SAMPLES = 500
CONTESTED = 1_000
INTENTS_PER_RESOURCE = 5
KEYS_PER_MARK = 10  # one topic or resource per ten marks

#: what to run when `markspace` is missing (it is a test-only dependency, in the dev extra)
PACKAGE_HINT = ("markspace is not installed, so the comparison with it is skipped: "
                "`uv pip install --constraints constraints.txt markspace==0.2.0b0` "
                "(or install agentpost's dev extra)")


def _scopes(ns: Any) -> list[Any]:
    """The bench's two scopes in namespace `ns` (agentpost.marks or the package)."""
    day = ns.DecayConfig(observation_half_life=hours(24), warning_half_life=hours(1),
                         intent_ttl=hours(24))
    return [
        ns.Scope(name="bench", allowed_intent_verbs=("book",), allowed_action_verbs=("booked",),
                 decay=day, conflict_policy=ns.ConflictPolicy.FIRST_WRITER),
        ns.Scope(name="bench-deferred", allowed_intent_verbs=("book",),
                 allowed_action_verbs=("booked",), decay=day,
                 conflict_policy=ns.ConflictPolicy.HIGHEST_CONFIDENCE, deferred=True),
    ]


SCOPES = _scopes(ours)
MAIN, DEFERRED = SCOPES


def _agent(name: str, ns: Any = ours) -> Any:
    return ns.Agent(name=name, scopes={"bench": ["intent", "action", "observation"],
                                       "bench-deferred": ["intent", "action"]})


@dataclass
class Numbers:
    """What one (backend, size) cell measured."""

    backend: str
    size: int
    contested: int
    batched_rate: float = 0.0
    single_rate: float = 0.0
    topic_ms: list[float] = field(default_factory=list)
    resource_ms: list[float] = field(default_factory=list)
    pre_action_ms: list[float] = field(default_factory=list)
    deferred_s: float = 0.0
    deferred_many_s: float = 0.0
    rss_mb: float = 0.0


def _marks(start: int, count: int, keys: int, ns: Any = ours) -> Iterator[Any]:
    """Half observations (one topic per ten marks), a quarter intents, a quarter actions
    (one resource per ten marks), deterministic; mark classes of namespace `ns`."""
    for i in range(start, start + count):
        kind = i % 4
        # the i-th observation (and the i-th intent or action) takes key i mod keys
        key = ((i // 4) * 2 + kind % 2) % keys
        if kind < 2:
            yield ns.Observation(scope="bench", topic=f"t{key}", content={"n": i},
                                 confidence=0.9)
        elif kind == 2:
            yield ns.Intent(scope="bench", resource=f"r{key}", action="book", confidence=0.5)
        else:
            yield ns.Action(scope="bench", resource=f"r{key}", action="booked",
                            result={"n": i})


def _fill(space: Any, size: int) -> float:
    """Write `size` marks with write_many; returns marks/s."""
    writer = _agent("bench-writer")
    keys = max(1, size // KEYS_PER_MARK)
    started = time.perf_counter()
    for start in range(0, size, BATCH):
        space.write_many(writer, list(_marks(start, min(BATCH, size - start), keys)))
    return size / (time.perf_counter() - started)


def _single_rate(space: Any, count: int) -> float:
    writer = _agent("bench-single")
    marks = [ours.Observation(scope="bench", topic=f"single-{i}", content={"n": i})
             for i in range(count)]
    started = time.perf_counter()
    for mark in marks:
        space.write(writer, mark)
    return count / (time.perf_counter() - started)


def _timed_ms(calls: list[Callable[[], Any]]) -> list[float]:
    out = []
    for call in calls:
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _sample_keys(size: int) -> tuple[list[str], list[str]]:
    """The topics and resources read at `size` (the same for every implementation)."""
    rng = random.Random(size)
    keys = max(1, size // KEYS_PER_MARK)
    topics = [f"t{rng.randrange(keys)}" for _ in range(SAMPLES)]
    resources = [f"r{rng.randrange(keys)}" for _ in range(SAMPLES)]
    return topics, resources


def _reads(space: Any, size: int, samples: int = SAMPLES) -> tuple[list[float], list[float]]:
    topics, resources = (keys[:samples] for keys in _sample_keys(size))
    by_topic = _timed_ms([lambda t=t: space.read("bench", topic=t) for t in topics])
    by_resource = _timed_ms([lambda r=r: space.read("bench", resource=r) for r in resources])
    return by_topic, by_resource


def _pre_actions(space: Any, ns: Any = ours, samples: int = SAMPLES) -> list[float]:
    """pre_action by four agents, two per fresh resource (every other call contends)."""
    guard = ns.Guard(space)
    agents = [_agent(f"bench-guard-{i}", ns) for i in range(4)]
    run = uuid.uuid4().hex[:8]
    return _timed_ms([
        lambda i=i: guard.pre_action(agents[i % 4], "bench", f"fresh-{run}-{i // 2}", "book",
                                     0.5 + (i % 4) / 10)
        for i in range(samples)])


def _contested(space: Any, contested: int) -> list[str]:
    """`contested` fresh resources of the deferred scope, 5 intents each from 5 agents."""
    agents = [_agent(f"bench-bidder-{i}") for i in range(INTENTS_PER_RESOURCE)]
    run = uuid.uuid4().hex[:8]
    names = [f"slot-{run}-{r}" for r in range(contested)]
    for i, agent in enumerate(agents):
        space.write_many(agent, [ours.Intent(scope="bench-deferred", resource=name,
                                             action="book", confidence=(i + 1) / 10)
                                 for name in names])
    return names


def _deferred(space: Any, contested: int) -> float:
    """`contested` contested resources resolved at one boundary each (`resolve_deferred`
    per resource: a transaction per resource on Postgres)."""
    names = _contested(space, contested)
    guard = ours.Guard(space)
    started = time.perf_counter()
    for name in names:
        guard.resolve_deferred("bench-deferred", name)
    return time.perf_counter() - started


def _deferred_many(space: Any, contested: int) -> float:
    """The same workload on other resources, resolved by one `resolve_deferred_many` call
    (what `resolve_all_deferred`, the scheduled boundary, runs per scope)."""
    names = _contested(space, contested)
    guard = ours.Guard(space)
    started = time.perf_counter()
    guard.resolve_deferred_many("bench-deferred", names)
    return time.perf_counter() - started


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(backend: str, space: Any, size: int, contested: int) -> Numbers:
    numbers = Numbers(backend=backend, size=size, contested=contested)
    numbers.batched_rate = _fill(space, size)
    numbers.single_rate = _single_rate(space, min(2_000, max(100, size // 100)))
    numbers.topic_ms, numbers.resource_ms = _reads(space, size)
    numbers.pre_action_ms = _pre_actions(space)
    numbers.deferred_s = _deferred(space, contested)
    numbers.deferred_many_s = _deferred_many(space, contested)
    numbers.rss_mb = _rss_mb()
    return numbers


@contextmanager
def _postgres(dsn: str | None) -> Iterator[Callable[[str], Any]]:
    from agentpost.marks.postgres import PostgresMarkSpace

    with scratch_database(dsn, "agentpost_bench_marks") as bench_dsn:
        spaces: list[Any] = []

        def make(name: str) -> Any:
            space = PostgresMarkSpace(dsn=bench_dsn, scopes=SCOPES, space=name)
            spaces.append(space)
            return space

        try:
            yield make
        finally:
            for space in spaces:
                close = getattr(space, "close", None)
                if close is not None:
                    close()


@dataclass
class PackageNumbers:
    """The package's MarkSpace on the same workload at one size."""

    size: int
    samples: int
    write_rate: float = 0.0
    topic_ms: list[float] = field(default_factory=list)
    resource_ms: list[float] = field(default_factory=list)
    pre_action_ms: list[float] = field(default_factory=list)


def _package() -> Any | None:
    """The `markspace` package, or None when it is not installed."""
    try:
        import markspace
    except ImportError:
        return None
    return markspace


def _package_samples(size: int) -> int:
    """The package reads the whole scope each time: about 2 s of reads per cell."""
    return max(10, min(SAMPLES, 2_000_000 // max(size, 1)))


def _measure_package(ms: Any, size: int) -> PackageNumbers:
    space = ms.MarkSpace(scopes=_scopes(ms))
    writer = _agent("bench-writer", ms)
    numbers = PackageNumbers(size=size, samples=_package_samples(size))
    started = time.perf_counter()
    for mark in _marks(0, size, max(1, size // KEYS_PER_MARK), ms):
        space.write(writer, mark)
    numbers.write_rate = size / (time.perf_counter() - started)
    numbers.topic_ms, numbers.resource_ms = _reads(space, size, numbers.samples)
    numbers.pre_action_ms = _pre_actions(space, ms, numbers.samples)
    return numbers


def _sizes(scale: float) -> tuple[list[int], list[int]]:
    """Our sizes (10,000 to 1,000,000 marks, scaled) and the package's (up to 100,000)."""
    def scaled(n: int) -> int:
        return max(1_000, round(n * scale))

    return (sorted({scaled(10_000), scaled(100_000), scaled(1_000_000)}),
            sorted({scaled(10_000), scaled(100_000)}))


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    sizes, package_sizes = _sizes(scale)
    contested = CONTESTED if scale >= 1 else max(20, round(CONTESTED * scale))
    results: list[Numbers] = []
    for size in sizes:
        space = MarkSpace(scopes=SCOPES)
        results.append(_measure("memory", space, size, contested))
        del space
        gc.collect()
    with _postgres(dsn) as make:
        for size in sizes:
            results.append(_measure("postgres", make(f"bench-{size}-{uuid.uuid4().hex[:6]}"),
                                    size, contested))
    ms = _package()
    package: list[PackageNumbers] = []
    if ms is not None:
        for size in package_sizes:
            package.append(_measure_package(ms, size))
            gc.collect()
    report = _report(results, scale)
    _compare(report, results, package, ms)
    report.print()
    return 0


def _p(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def _report(results: list[Numbers], scale: float) -> Report:
    report = Report(f"agentpost bench marks (scale {scale:g}; {SAMPLES} reads and pre_actions "
                    f"per cell; {CONTESTED:,} contested resources x {INTENTS_PER_RESOURCE} "
                    "intents)")
    for n in results:
        cell = f"{n.backend}, {n.size:,} marks"
        report.add(f"{cell}: write_many", f"{n.batched_rate:,.0f} marks/s")
        report.add(f"{cell}: write (single)", f"{n.single_rate:,.0f} marks/s")
        report.add(f"{cell}: read (scope, topic) p50/p95",
                   f"{_p(n.topic_ms, 0.5):.3f} / {_p(n.topic_ms, 0.95):.3f} ms")
        report.add(f"{cell}: read (scope, resource) p50/p95",
                   f"{_p(n.resource_ms, 0.5):.3f} / {_p(n.resource_ms, 0.95):.3f} ms")
        report.add(f"{cell}: pre_action p50/p95",
                   f"{median(n.pre_action_ms):.3f} / {_p(n.pre_action_ms, 0.95):.3f} ms")
        report.add(f"{cell}: resolve_deferred x {n.contested:,}", f"{n.deferred_s:.3f} s")
        report.add(f"{cell}: resolve_deferred_many over {n.contested:,}",
                   f"{n.deferred_many_s:.3f} s")
        if n.backend == "memory":
            report.add(f"{cell}: peak RSS of this process", f"{n.rss_mb:,.0f} MB")
    _goals(report, results, scale)
    return report


def _goals(report: Report, results: list[Numbers], scale: float) -> None:
    memory = [n for n in results if n.backend == "memory"]
    postgres = [n for n in results if n.backend == "postgres"]
    if memory:
        # the 100,000-mark cell (scaled), as before the 10,000-mark cells were added
        hundred_k = max(1_000, round(100_000 * scale))
        small = next((n for n in memory if n.size == hundred_k), memory[0])
        worst = max(_p(small.topic_ms, 0.95), _p(small.resource_ms, 0.95))
        report.goal(f"in memory, read p95 at {small.size:,} marks well under 1 ms "
                    f"(< 0.5 ms; measured {worst:.3f} ms)", worst < 0.5)
    if postgres:
        big = postgres[-1]
        worst = max(_p(big.topic_ms, 0.95), _p(big.resource_ms, 0.95))
        report.goal(f"Postgres read p95 < 3 ms at {big.size:,} marks (measured {worst:.3f} ms)",
                    worst < 3.0)
        pre = _p(big.pre_action_ms, 0.95)
        report.goal(f"Postgres pre_action p95 < 5 ms at {big.size:,} marks "
                    f"(measured {pre:.3f} ms)", pre < 5.0)
    for n in results:
        if n.contested == CONTESTED:
            report.goal(f"{n.backend} at {n.size:,}: a boundary over {CONTESTED:,} resources "
                        f"(resolve_deferred_many) < 1 s (measured {n.deferred_many_s:.3f} s)",
                        n.deferred_many_s < 1.0)


def _ratio(theirs: float, mine: float) -> str:
    return f"{theirs / mine:,.1f}x" if mine > 0 else "inf"


def _compare(report: Report, results: list[Numbers], package: list[PackageNumbers],
             ms: Any | None) -> None:
    """Ours (memory, Postgres) beside the package at each of its sizes, and the goals."""
    if ms is None:
        report.add("markspace comparison", PACKAGE_HINT)
        return
    cells = {(n.backend, n.size): n for n in results}
    for theirs in package:
        memory, postgres = cells[("memory", theirs.size)], cells[("postgres", theirs.size)]
        cell = f"vs markspace {getattr(ms, '__version__', '?')}, {theirs.size:,} marks"
        for what, mine_m, mine_p, their in (
                ("read (scope, topic) p50", memory.topic_ms, postgres.topic_ms, theirs.topic_ms),
                ("read (scope, resource) p50", memory.resource_ms, postgres.resource_ms,
                 theirs.resource_ms),
                ("pre_action p50", memory.pre_action_ms, postgres.pre_action_ms,
                 theirs.pre_action_ms)):
            m, p, t = median(mine_m), median(mine_p), median(their)
            report.add(f"{cell}: {what}",
                       f"memory {m:.4f} ms, Postgres {p:.3f} ms, markspace {t:.3f} ms "
                       f"({theirs.samples} samples): markspace / memory {_ratio(t, m)}, "
                       f"markspace / Postgres {_ratio(t, p)}")
        report.add(f"{cell}: write (single)",
                   f"memory {memory.single_rate:,.0f}/s, Postgres {postgres.single_rate:,.0f}/s,"
                   f" markspace {theirs.write_rate:,.0f}/s")
    if package:
        _package_goals(report, cells, package[-1])


def _package_goals(report: Report, cells: dict[tuple[str, int], Numbers],
                   theirs: PackageNumbers) -> None:
    """At the package's largest size (100,000 marks unscaled): our memory reads at least
    100x faster, our Postgres reads faster than its in-memory ones (medians)."""
    memory, postgres = cells[("memory", theirs.size)], cells[("postgres", theirs.size)]
    their = min(median(theirs.topic_ms), median(theirs.resource_ms))
    mine = max(median(memory.topic_ms), median(memory.resource_ms))
    report.goal(f"in memory, reads at {theirs.size:,} marks >= 100x the package's (slowest "
                f"of topic/resource: {_ratio(their, mine)})", their >= 100 * mine)
    pg = max(median(postgres.topic_ms), median(postgres.resource_ms))
    report.goal(f"Postgres reads at {theirs.size:,} marks faster than the package's in-memory "
                f"reads ({pg:.3f} ms vs {their:.3f} ms)", pg < their)
