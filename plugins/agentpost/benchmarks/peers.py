"""`agentpost bench peers`: agentpost beside the Postgres queues a user would pick instead.

The systems (`agentpost.benchmarks.peers_systems`): agentpost, pgmq, pgqueuer and
Procrastinate, each through its own client in a scratch database of its own on the same
server, and a raw table (INSERT / DELETE ... RETURNING) as the reference for the WAL. A peer
that is not installed is said "not measured" and the run goes on; pg-boss and graphile-worker
(Node) are not measured and the report says why.

Workloads, each with the same 200-byte payload:
1. single send, one commit each (messages/s);
2. a batch of 500 in one call (messages/s);
3. consume in batches of 100 by 1 consumer, the queue pre-filled (untimed): each system's
   own batched read + acknowledgement (messages/s);
4. the same with 4 consumers on the one queue (processes), and 4 ÷ 1 per system;
5. send → consumer latency, paced single sends at 50/s from one process, a consumer in
   another woken by the system's LISTEN/NOTIFY (agentpost: its Subscriber);
6. WAL bytes per send and per consumed message, over the single-send cell and the
   1-consumer cell (`peers_wal`): the server's LSN diff, and the system's own records.

The send cells write to a queue nobody reads (SENDS), the consume and latency cells read
another (WORK), so a consume cell finds exactly its pre-fill. Consumers and producers are
spawned processes kept for the run (start-up never timed). A warm-up round (not counted),
then ROUNDS rounds; in each, every workload runs for every system in turn, the order of the
systems rotated by one each round, so drift on a shared machine falls on all alike. Every
cell prints its median and range over rounds; every ratio agentpost ÷ peer is computed per
round and printed as median and range. Before each consume and latency cell the system's
database is vacuumed and analyzed (untimed), as in `bench leases`: a queue left without
autovacuum would measure its dead rows.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import subprocess
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentpost.benchmarks.common import Report, median, percentile, scratch_database
from agentpost.benchmarks.leases import vacuum
from agentpost.benchmarks.peers_systems import (
    PEERS,
    SENDS,
    SYSTEMS,
    WORK,
    Agentpost,
    Pgmq,
    System,
)
from agentpost.benchmarks.peers_wal import Wal, WalMeter
from agentpost.pg.bootstrap import create_database, drop_database, find_server
from agentpost.pg.server import libpq_dsn

ROUNDS = 3
SINGLE = 1_000  # single sends per cell at scale 1
BATCH = 500
BATCHES = 10  # batches of BATCH per cell at scale 1
CONSUME = 2_000  # messages pre-filled for each consume cell at scale 1
CONSUME_BATCH = 100
CONSUMERS = 4
LATENCY = 150  # paced sends per system and round at scale 1
LATENCY_RATE = 50.0  # sends per second
PAYLOAD_BYTES = 200
WARMUP = 0.1  # the warm-up round's share of each count
START_DELAY = 0.1  # seconds between handing out a command and its common start time
COMMAND_TIMEOUT = 300.0
NODE_PEERS = "pg-boss, graphile-worker"
INSTALL_HINT = "pip install 'airflow-agentpost[bench]'"
FILLER = "Summarise the incident reports of the last quarter and list the open actions. "


def payload(seq: int) -> str:
    """PAYLOAD_BYTES of text: the sequence number and the wall clock (ns) at send time
    first, which the latency consumer reads back."""
    head = f"{seq} {time.time_ns()} "
    return (head + FILLER * 4)[:PAYLOAD_BYTES]


# --------------------------------------------------------------------------- worker side


def _worker_main(specs: dict[str, tuple[type[System], str, str]], commands: Any,
                 results: Any) -> None:
    """A benchmark process: opens a system on first use and keeps it for the run; each
    command's result (or its traceback, so the parent never hangs) goes back."""
    warnings.filterwarnings("ignore", message="AGENTPOST_TRAIL_KEY")
    opened: dict[str, System] = {}

    def system(name: str) -> System:
        if name not in opened:
            cls, dsn, tag = specs[name]
            opened[name] = cls(dsn, tag)
            opened[name].open()
        return opened[name]

    try:
        while True:
            name, *args = commands.get()
            if name == "stop":
                return
            try:
                results.put(("ok", HANDLERS[name](system(args[0]), results, *args[1:])))
            except Exception:
                results.put(("error", traceback.format_exc()))
    finally:
        for sys_ in opened.values():
            sys_.close()


def _sleep_until(wall: float) -> None:
    if (left := wall - time.time()) > 0:
        time.sleep(left)


def _send_one(sys_: System, _results: Any, to: str, count: int,
              start_at: float) -> tuple[int, float]:
    _sleep_until(start_at)
    for seq in range(count):
        sys_.send_one(payload(seq), to)
    return count, time.time()


def _send_batch(sys_: System, _results: Any, to: str, count: int,
                start_at: float) -> tuple[int, float]:
    _sleep_until(start_at)
    for start in range(0, count, BATCH):
        sys_.send_batch([payload(start + i) for i in range(min(BATCH, count - start))], to)
    return count, time.time()


def _consume(sys_: System, _results: Any, batch: int, start_at: float) -> tuple[int, float]:
    """Consume until the queue has nothing left; (messages, wall-clock end)."""
    _sleep_until(start_at)
    done = 0
    while got := sys_.consume(batch):
        done += len(got)
    return done, time.time()


def _produce(sys_: System, _results: Any, count: int, rate: float,
             start_at: float) -> tuple[int, float]:
    for seq in range(count):
        _sleep_until(start_at + seq / rate)
        sys_.send_one(payload(seq), WORK)
    return count, time.time()


def _listen(sys_: System, results: Any, count: int, patience: float) -> list[float]:
    """Receive `count` messages through the system's live delivery; reports "ready" once
    listening. Returns each message's send → consumer latency in ms."""
    sys_.listen()
    try:
        results.put(("ready", None))
        got: list[float] = []
        deadline = time.monotonic() + patience
        while len(got) < count and time.monotonic() < deadline:
            received = sys_.receive(timeout=1.0)
            now = time.time_ns()
            got += [(now - int(p.split(" ", 2)[1])) / 1e6 for p in received]
        return got
    finally:
        sys_.unlisten()


HANDLERS: dict[str, Callable[..., Any]] = {
    "send_one": _send_one, "send_batch": _send_batch, "consume": _consume,
    "produce": _produce, "listen": _listen}


# --------------------------------------------------------------------------- parent side


class Workers:
    """CONSUMERS spawned processes, each with a command queue; one result queue each, so a
    reply is always matched to its process."""

    def __init__(self, specs: dict[str, tuple[type[System], str, str]], count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(count)]
        self.results = [ctx.Queue() for _ in range(count)]
        self.procs = [ctx.Process(target=_worker_main, args=(specs, c, r),
                                  name=f"agentpost-bench-peers-{i}", daemon=True)
                      for i, (c, r) in enumerate(zip(self.commands, self.results, strict=True))]
        for proc in self.procs:
            proc.start()

    def send(self, index: int, *command: Any) -> None:
        self.commands[index].put(command)

    def reply(self, index: int, kind: str = "ok") -> Any:
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            try:
                got, value = self.results[index].get(timeout=1.0)
                break
            except queue.Empty:
                if not self.procs[index].is_alive():
                    raise RuntimeError(f"bench worker {index} died (exit code "
                                       f"{self.procs[index].exitcode})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench worker {index} silent for "
                                       f"{COMMAND_TIMEOUT:.0f} s") from None
        if got == "error":
            raise RuntimeError(f"bench worker {index} failed:\n{value}")
        if got != kind:
            raise RuntimeError(f"bench worker {index}: expected {kind}, got {got}")
        return value

    def close(self) -> None:
        for index, proc in enumerate(self.procs):
            if proc.is_alive():
                self.send(index, "stop")
        for proc in self.procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for q in (*self.commands, *self.results):
            q.close()
            q.join_thread()


@dataclass
class Counts:
    single: int
    batched: int
    consume: int
    latency: int

    @classmethod
    def at(cls, scale: float) -> Counts:
        return cls(single=max(20, int(SINGLE * scale)),
                   batched=max(1, int(BATCHES * scale)) * BATCH,
                   consume=max(100, int(CONSUME * scale)),
                   latency=max(10, int(LATENCY * scale)))

    def warmup(self) -> Counts:
        return Counts(max(10, int(self.single * WARMUP)), BATCH,
                      max(100, int(self.consume * WARMUP)), max(5, int(self.latency * WARMUP)))


@dataclass
class Results:
    """Per system and cell, a value per round (latency: every sample, and each round's
    p95). A round may lack a value (the WAL of a cell recycled before it was read)."""

    cells: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)
    round: int = 0

    def add(self, system: str, cell: str, value: float) -> None:
        self.cells.setdefault((system, cell), {})[self.round] = value

    def get(self, system: str, cell: str) -> list[float]:
        return list(self.cells.get((system, cell), {}).values())

    def ratios(self, a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        """Round by round a ÷ b (the rounds are interleaved, so each pair shares its
        noise), over the rounds both have."""
        x, y = self.cells.get(a, {}), self.cells.get(b, {})
        return [x[r] / y[r] for r in sorted(x.keys() & y.keys()) if y[r]]


class Bench:
    """One run: the systems' databases, the workers, the WAL meter."""

    def __init__(self, systems: dict[str, System], workers: Workers, wal: WalMeter,
                 counts: Counts) -> None:
        self.systems = systems
        self.workers = workers
        self.wal = wal
        self.counts = counts

    def timed(self, name: str, command: tuple[Any, ...], workers: int = 1, *,
              own: bool = False) -> tuple[int, float, Wal]:
        """Hand `command` (the common start time appended) to `workers` workers;
        (messages, seconds from the common start to the last end, WAL written meanwhile;
        the system's own WAL records too if `own`)."""
        before = self.wal.mark()
        start_at = time.time() + START_DELAY
        for index in range(workers):
            self.workers.send(index, *command, start_at)
        replies = [self.workers.reply(i) for i in range(workers)]
        wal = self.wal.since(before, name if own else None)
        return sum(n for n, _ in replies), max(end for _, end in replies) - start_at, wal

    def fill(self, name: str, count: int) -> None:
        self.workers.send(0, "send_batch", name, WORK, count, 0.0)
        self.workers.reply(0)

    def cell(self, name: str, cell: str, counts: Counts, out: Results | None) -> None:
        if cell == "single":
            done, secs, wal = self.timed(name, ("send_one", name, SENDS, counts.single),
                                         own=True)
            if out:
                out.add(name, "single", done / secs)
                wal.record(out, name, "send", done)
        elif cell == "batch":
            done, secs, _ = self.timed(name, ("send_batch", name, SENDS, counts.batched))
            if out:
                out.add(name, "batch", done / secs)
        elif cell in ("consume 1", "consume 4"):
            consumers = 1 if cell == "consume 1" else CONSUMERS
            self.fill(name, counts.consume)
            vacuum(self.systems[name].dsn)
            done, secs, wal = self.timed(name, ("consume", name, CONSUME_BATCH), consumers,
                                         own=consumers == 1)
            if done != counts.consume:
                raise RuntimeError(f"{name} {cell}: {done} of {counts.consume} consumed")
            if out:
                out.add(name, cell, done / secs)
                if consumers == 1:
                    wal.record(out, name, "consume", done)
        elif cell == "latency":
            self.latency(name, counts.latency, out)

    def latency(self, name: str, count: int, out: Results | None) -> None:
        """Worker 0 listens, worker 1 sends at LATENCY_RATE."""
        sys_ = self.systems[name]
        with _pgmq_notify(sys_):
            vacuum(sys_.dsn)
            self.workers.send(0, "listen", name, count, 30 + 5 * count / LATENCY_RATE)
            self.workers.reply(0, "ready")
            self.workers.send(1, "produce", name, count, LATENCY_RATE,
                              time.time() + START_DELAY)
            self.workers.reply(1)
            got: list[float] = self.workers.reply(0)
        if len(got) != count:
            raise RuntimeError(f"{name} latency: {len(got)} of {count} messages received")
        if out:
            out.latency.setdefault(name, []).extend(got)
            out.add(name, "p95 round", percentile(got, 0.95))


@contextmanager
def _pgmq_notify(sys_: System) -> Iterator[None]:
    """pgmq's insert NOTIFY is off by default: on only while its latency is measured."""
    if not isinstance(sys_, Pgmq):
        yield
        return
    sys_.open()
    try:
        sys_.notify(True)
        yield
    finally:
        sys_.notify(False)
        sys_.close()


CELLS = ("single", "batch", "consume 1", "consume 4", "latency")


def _rounds(bench: Bench, names: list[str]) -> Results:
    out = Results()
    for round_ in range(ROUNDS + 1):
        counts = bench.counts if round_ else bench.counts.warmup()
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        out.round = round_
        for cell in CELLS:
            for name in order:
                if cell != "latency" or bench.systems[name].listens:
                    bench.cell(name, cell, counts, out if round_ else None)
    return out


# --------------------------------------------------------------------------- the run


def node_peers() -> str:
    """Why pg-boss and graphile-worker were not measured."""
    node = shutil.which("node")
    if node is None:
        return "skipped: no Node found (they need Node >= 22)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < 22:
        return f"skipped: Node {version} found, they need Node >= 22"
    return f"skipped: Node {version} found, but their adapters are not built yet"


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    counts = Counts.at(scale)
    measured = [cls for cls in SYSTEMS if cls.installed()]
    missing = [cls for cls in PEERS if not cls.installed()]
    admin_dsn = libpq_dsn(dsn) if dsn is not None else find_server().dsn
    tag = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        dsns: dict[str, str] = {}
        for cls in measured:
            if cls is Agentpost:
                dsns[cls.name] = stack.enter_context(
                    scratch_database(dsn, "agentpost_bench_peers"))
            else:
                dsns[cls.name] = stack.enter_context(_peer_database(admin_dsn, cls))
        systems = {cls.name: cls(dsns[cls.name], tag) for cls in measured}
        for sys_ in systems.values():
            sys_.install()
        specs = {name: (type(s), s.dsn, tag) for name, s in systems.items()}
        workers = Workers(specs, CONSUMERS)
        stack.callback(workers.close)
        wal = WalMeter(admin_dsn, dsns)
        stack.callback(wal.close)
        results = _rounds(Bench(systems, workers, wal, counts), list(systems))
        server_version, autovacuum = wal.setting("server_version"), wal.setting("autovacuum")
        inspect = wal.inspect
    _report(counts, results, measured, missing, server_version, autovacuum, inspect)
    return 0


@contextmanager
def _peer_database(admin_dsn: str, cls: type[System]) -> Iterator[str]:
    db = f"agentpost_bench_peers_{cls.__name__.lower()}_{os.getpid()}"
    peer_dsn = create_database(admin_dsn, db, fresh=True)
    try:
        yield peer_dsn
    finally:
        drop_database(admin_dsn, db)


# --------------------------------------------------------------------------- the report


def _span(values: list[float], fmt: str) -> str:
    """median (range lo – hi), each formatted with `fmt`."""
    if not values:
        return "not measured"
    rounds = "" if len(values) >= ROUNDS else f", {len(values)} of {ROUNDS} rounds"
    return (f"{format(median(values), fmt)}  (range {format(min(values), fmt)} – "
            f"{format(max(values), fmt)}{rounds})")


TITLES = {"single": ("1. single send, one commit each", "msgs/s"),
          "batch": (f"2. batch of {BATCH} in one call", "msgs/s"),
          "consume 1": (f"3. consume, batch {CONSUME_BATCH}, 1 consumer", "msgs/s"),
          "consume 4": (f"4. consume, batch {CONSUME_BATCH}, {CONSUMERS} consumers, one queue",
                        "msgs/s")}


def _report(counts: Counts, res: Results, measured: list[type[System]],
            missing: list[type[System]], server_version: str, autovacuum: str,
            inspect: bool) -> None:
    peers = [cls.name for cls in measured if cls in PEERS]
    listening = [cls.name for cls in measured if cls.listens]
    everyone = [cls.name for cls in measured]
    report = Report(
        f"agentpost bench peers ({ROUNDS} rounds interleaved, system order rotated each "
        f"round, after a warm-up; median (range) over rounds; {PAYLOAD_BYTES}-byte payloads; "
        f"{counts.single:,} single sends, {counts.batched:,} batched, {counts.consume:,} "
        f"pre-filled per consume cell, {counts.latency:,} paced sends per round)")
    for cell, (title, unit) in TITLES.items():
        for name in everyone:
            report.add(f"{title}: {name}", f"{_span(res.get(name, cell), ',.0f')} {unit}")
        for name in peers:
            report.add(f"{title}: agentpost ÷ {name}", _span(_ratio(res, cell, name), ".2f"))
    for name in everyone:
        report.add(f"4 ÷ 1 consumers: {name}",
                   _span(res.ratios((name, "consume 4"), (name, "consume 1")), ".2f"))
    title = f"5. send → consumer at {LATENCY_RATE:.0f}/s"
    for name in listening:
        lat = res.latency.get(name, [])
        report.add(f"{title}: {name}",
                   f"p50 {percentile(lat, 0.5):.2f} ms, p95 {percentile(lat, 0.95):.2f} ms; "
                   f"p95 by round {_span(res.get(name, 'p95 round'), '.2f')} ms")
    for name in peers:
        report.add(f"{title}: agentpost ÷ {name}, p95",
                   _span(_ratio(res, "p95 round", name), ".2f"))
    for cell, what in (("wal send", "per send"), ("wal consume", "per consumed message")):
        for suffix, source in ((" own", "own records"), ("", "server LSN diff")):
            if suffix and not inspect:
                continue
            for name in everyone:
                fpi = (f", of which full-page images {_span(res.get(name, cell + ' fpi'), ',.0f')}"
                       if suffix and res.get(name, cell + " fpi") else "")
                report.add(f"6. WAL {what}, {source}: {name}",
                           f"{_span(res.get(name, cell + suffix), ',.0f')} bytes{fpi}")
            for name in [*peers, RAW]:
                if name in everyone:
                    report.add(f"6. WAL {what}, {source}: agentpost ÷ {name}",
                               _span(_ratio(res, cell + suffix, name), ".2f"))
    if not inspect:
        report.add("6. WAL, own records", "not measured (pg_walinspect could not be "
                                          "created: it needs a superuser)")
    for cls in missing:
        report.add(cls.name, f"not measured ({INSTALL_HINT}, or pip install {cls.pip})")
    report.add(NODE_PEERS, node_peers())
    report.add("versions", ", ".join(
        [f"PostgreSQL {server_version}"] + [_version(cls) for cls in measured if cls.pip]))
    report.add("maintenance", "VACUUM ANALYZE of the system's database before each consume "
                              "and latency cell, untimed (this server's autovacuum: "
                              f"{autovacuum})")
    _goals(report, res, peers, listening, " own" if inspect else "")
    report.print()


RAW = "raw INSERT"


def _ratio(res: Results, cell: str, peer: str) -> list[float]:
    return res.ratios((Agentpost.name, cell), (peer, cell))


def _version(cls: type[System]) -> str:
    text = f"{cls.name} {cls.version()}"
    if cls is Pgmq and cls.installed():
        from pgmq.install import get_embedded_sql_version

        text += f" (its SQL {get_embedded_sql_version()})"
    return text


def _goals(report: Report, res: Results, peers: list[str], listening: list[str],
           wal: str) -> None:
    """Issue 25's goals, each on the ratio row printed above it (the median of the per-round
    ratios). A comparison that could not be measured counts as missed."""
    ap = Agentpost.name
    for cell, (title, _) in TITLES.items():
        rates = {n: median(res.get(n, cell)) for n in peers if res.get(n, cell)}
        if rates:
            fastest = max(rates, key=rates.__getitem__)
            ratio = median(_ratio(res, cell, fastest))
            text, met = f"{ratio:.2f}x {fastest}", ratio >= 1.0
        else:
            text, met = "no peer measured", False
        report.goal(f"{title}: agentpost >= 1.0x the fastest of pgmq, pgqueuer and "
                    f"Procrastinate ({text})", met)
    scaling = median(res.ratios((ap, "consume 4"), (ap, "consume 1")))
    report.goal(f"agentpost: {CONSUMERS} consumers >= 1.5x one consumer ({scaling:.2f}x)",
                scaling >= 1.5)
    p95 = {n: percentile(res.latency[n], 0.95) for n in listening if res.latency.get(n)}
    rivals = {n: v for n, v in p95.items() if n != ap}
    if rivals:
        best = min(rivals, key=rivals.__getitem__)
        report.goal(f"send → consumer p95 no worse than the best LISTEN/NOTIFY peer's "
                    f"({p95[ap]:.2f} ms vs {best} {rivals[best]:.2f} ms)",
                    p95[ap] <= rivals[best])
    else:
        report.goal("send → consumer p95 no worse than the best LISTEN/NOTIFY peer's "
                    "(no peer measured)", False)
    ratios = _ratio(res, "wal send" + wal, RAW)
    source = "own records" if wal else "server LSN diff"
    text = f"{median(ratios):.2f}x, {source}" if ratios else f"not measured, {source}"
    report.goal(f"WAL per send <= 2x a raw INSERT of the same payload ({text})",
                bool(ratios) and median(ratios) <= 2.0)
