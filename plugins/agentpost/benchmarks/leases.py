"""`agentpost bench leases`: consuming an inbox, against Procrastinate's own job cycle.

Measured in one run, on one database:
- lease + ack_many throughput with 1 and 4 consumer processes, in batches of 1 and 100, all
  consumers sharing one inbox pre-filled with send_many (not timed); 4 consumers on 4 inboxes
  is printed beside it to show what sharing one inbox costs;
- send-to-consumer latency: paced single sends at about 1,000 envelopes/s, received by a
  consumer waiting on LISTEN/NOTIFY (`Subscriber`), timed with the wall clock every process
  shares (`time.time_ns()`, carried in the content);
- Procrastinate's fetch_job / finish_job cycle (what its worker does around a task) with 1 and
  4 processes over the same number of jobs, in a schema of its own on the same database.

Consumers are separate processes, started once (spawn) and kept for the whole run, so process
start-up is never timed. Throughput cells are interleaved over rounds; medians are printed.
Before each measurement the database is vacuumed and analyzed (untimed), standing in for
autovacuum, which test servers often turn off: a queue left without it measures its dead rows.
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import os
import queue
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
from psycopg2 import sql

from agentpost.benchmarks.common import Report, median, percentile, scratch_database
from agentpost.pg.server import libpq_dsn
from agentpost.store import EnvelopeStore

ROUNDS = 3
COUNT = 3_000  # envelopes (and Procrastinate jobs) per throughput cell at scale 1
LATENCY_COUNT = 3_000  # paced sends at scale 1, spread over the rounds
LATENCY_RATE = 1_000.0  # sends per second, all producers together
WARMUP_COUNT = 200  # envelopes per cell in the untimed warm-up pass
PROCESSES = 4  # consumer processes kept for the run
PRODUCERS = 2  # latency producers (one single-send loop may not reach the rate alone)
FILL_BATCH = 500
LEASE_TTL = 30.0  # Courier's default
COMMAND_TIMEOUT = 300.0  # a worker silent this long is taken for dead
START_DELAY = 0.2  # seconds between handing out a command and its common start time
CONTENT = "Summarise the incident reports of the last quarter."
INSTALL_HINT = "pip install 'airflow-agentpost[bench]'"


@dataclass(frozen=True)
class Cell:
    """One throughput measurement: `consumers` processes leasing `batch` at a time from
    `inboxes` inboxes (consumer i works on inbox i mod inboxes)."""

    label: str
    consumers: int
    batch: int
    inboxes: int = 1


CELLS = (
    Cell("1 consumer, batch 1", 1, 1),
    Cell("1 consumer, batch 100", 1, 100),
    Cell("4 consumers, batch 1", 4, 1),
    Cell("4 consumers, batch 100", 4, 100),
    Cell("4 consumers, batch 100, 4 inboxes", 4, 100, inboxes=4),
)
GOAL_CELL = CELLS[3]
LIKE_CELL = CELLS[2]  # one envelope per cycle, as Procrastinate's fetch_job
PROCRASTINATE_CELLS = (1, 4)


# --------------------------------------------------------------------------- worker side


def _worker_main(dsn: str, index: int, commands: Any, results: Any) -> None:
    """A benchmark process: one EnvelopeStore for its whole life, commands in, results out.
    An exception is sent back as text, so the parent reports it instead of hanging."""
    # the parent has already warned about a missing trail key; once is enough
    warnings.filterwarnings("ignore", message="AGENTPOST_TRAIL_KEY")
    store = EnvelopeStore(dsn)
    handlers: dict[str, Callable[..., Any]] = {
        "consume": _consume, "produce": _produce, "listen": _listen,
        "procrastinate": _procrastinate_cycle}
    try:
        while True:
            name, *args = commands.get()
            if name == "stop":
                return
            try:
                results.put((index, "ok", handlers[name](store, results, index, *args)))
            except Exception:
                results.put((index, "error", traceback.format_exc()))
    finally:
        store.close()


def _sleep_until(wall: float) -> None:
    left = wall - time.time()
    if left > 0:
        time.sleep(left)


def _consume(store: EnvelopeStore, _results: Any, _index: int, ws: str, batch: int,
             start_at: float) -> tuple[int, float]:
    """Lease and ack until the inbox has nothing leasable; (acked, wall-clock end)."""
    holder = f"bench-{os.getpid()}"
    _sleep_until(start_at)
    acked = 0
    while leases := store.lease(ws, max=batch, ttl=LEASE_TTL, holder=holder):
        acked += store.ack_many([lease.token for lease in leases])
    return acked, time.time()


def _produce(store: EnvelopeStore, _results: Any, _index: int, sender: str, ws: str,
             seqs: Sequence[int], rate: float, start_at: float) -> tuple[float, list[int]]:
    """Send envelope `seq` at start_at + seq / rate (right away when behind); the content is
    "<seq> <time_ns at send start>". Returns the wall-clock end and each send's duration
    in ns (to tell the send path from the wake-up path in the latency)."""
    took = []
    for seq in seqs:
        _sleep_until(start_at + seq / rate)
        start = time.time_ns()
        result = store.send(sender, ws, "directive", f"{seq} {start}")
        took.append(time.time_ns() - start)
        if result.status == "rejected":
            raise RuntimeError(f"latency send rejected: {result.reason}")
    return time.time(), took


def _listen(store: EnvelopeStore, results: Any, index: int, ws: str, count: int,
            patience: float) -> list[tuple[int, int]]:
    """Receive `count` envelopes through a Subscriber (LISTEN/NOTIFY), acking each batch;
    reports "ready" once listening. Returns (seq, latency in ns) pairs."""
    from agentpost.store.consumer import Subscriber
    from agentpost.store.listen import Listener

    received: list[tuple[int, int]] = []
    with Listener(store.dsn, [ws]) as listener, \
            Subscriber(store, ws, ttl=LEASE_TTL, listener=listener) as sub:
        sub.grant(1_000)
        results.put((index, "ready", None))
        deadline = time.monotonic() + patience
        while len(received) < count and time.monotonic() < deadline:
            leases = sub.take(timeout=1.0)
            now = time.time_ns()
            for lease in leases:
                seq, sent = str(lease.envelope.content).split()
                received.append((int(seq), now - int(sent)))
            if leases:
                store.ack_many([lease.token for lease in leases])
                sub.grant(len(leases))
    return received


def _procrastinate_cycle(_store: EnvelopeStore, _results: Any, _index: int, conninfo: str,
                         start_at: float) -> tuple[int, float]:
    return asyncio.run(_procrastinate_drain(conninfo, start_at))


async def _procrastinate_drain(conninfo: str, start_at: float) -> tuple[int, float]:
    """Procrastinate's worker cycle without the task: fetch_job, then finish_job as
    succeeded (its workers keep finished jobs by default), until no job is left."""
    from procrastinate import PsycopgConnector
    from procrastinate.jobs import Status
    from procrastinate.manager import JobManager

    connector = PsycopgConnector(conninfo=conninfo, min_size=1, max_size=1)
    await connector.open_async()
    try:
        manager = JobManager(connector)
        worker_id = await manager.register_worker()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        done = 0
        while (job := await manager.fetch_job(queues=None, worker_id=worker_id)) is not None:
            await manager.finish_job(job, status=Status.SUCCEEDED, delete_job=False)
            done += 1
        end = time.time()
        await manager.unregister_worker(worker_id)
        return done, end
    finally:
        await connector.close_async()


# --------------------------------------------------------------------------- parent side


class Workers:
    """The benchmark's processes: spawned once, each with its own EnvelopeStore."""

    def __init__(self, dsn: str, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(count)]
        self.procs = [ctx.Process(target=_worker_main, args=(dsn, i, q, self.results),
                                  name=f"agentpost-bench-{i}", daemon=True)
                      for i, q in enumerate(self.commands)]
        for proc in self.procs:
            proc.start()

    def send(self, index: int, *command: Any) -> None:
        self.commands[index].put(command)

    def collect(self, count: int, kind: str = "ok") -> dict[int, Any]:
        """`count` replies of `kind`, by worker; a worker's error is raised here."""
        out: dict[int, Any] = {}
        while len(out) < count:
            try:
                index, got, value = self.results.get(timeout=COMMAND_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"benchmark worker silent for {COMMAND_TIMEOUT:.0f} s; "
                                   "alive: " + str([p.is_alive() for p in self.procs])) from None
            if got == "error":
                raise RuntimeError(f"benchmark worker {index} failed:\n{value}")
            if got != kind:
                raise RuntimeError(f"benchmark worker {index}: expected {kind}, got {got}")
            out[index] = value
        return out

    def close(self) -> None:
        for index in range(len(self.procs)):
            self.send(index, "stop")
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timed(workers: Workers, commands: list[tuple[Any, ...]],
           start_at: float) -> tuple[int, float]:
    """Hand command i to worker i; each replies (done, wall-clock end). Returns the total
    done and the seconds from the common start to the last end."""
    for index, command in enumerate(commands):
        workers.send(index, *command)
    replies = workers.collect(len(commands)).values()
    return sum(done for done, _ in replies), max(end for _, end in replies) - start_at


def vacuum(dsn: str) -> str:
    """VACUUM ANALYZE the benchmark database (untimed, before every measurement), as
    autovacuum would keep a queue's tables: without it dead row versions pile up, and plans
    cached by long-lived sessions while the tables were small are never replaced (ANALYZE
    invalidates them). Returns the server's own autovacuum setting, for the report."""
    conn = psycopg2.connect(libpq_dsn(dsn))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
            cur.execute("SELECT current_setting('autovacuum')")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


@dataclass
class Latency:
    """Send-to-consumer latencies and send-call durations (ms), send rates achieved."""

    total: list[float]
    send: list[float]
    rates: list[float]

    def extend(self, other: Latency) -> None:
        self.total += other.total
        self.send += other.send
        self.rates += other.rates


@dataclass
class Agentpost:
    """The agentpost side: a lead, one set of inboxes per cell, and the latency producers'
    senders (each its own workspace, so producers do not queue on one sender's chain)."""

    store: EnvelopeStore
    lead: str
    inboxes: dict[str, list[str]]
    senders: list[str]

    @classmethod
    def setup(cls, store: EnvelopeStore) -> Agentpost:
        tag = uuid.uuid4().hex[:6]
        lead = store.create_workspace("coordinator", workspace_id=f"bench-lead-{tag}").id
        inboxes: dict[str, list[str]] = {}
        for n, cell in enumerate((*CELLS, Cell("latency", 1, 1))):
            inboxes[cell.label] = [
                store.create_workspace("worker", parent=lead,
                                       workspace_id=f"bench-c{n}-{i}-{tag}").id
                for i in range(cell.inboxes)]
        senders = [store.create_workspace("coordinator", workspace_id=f"bench-p{p}-{tag}").id
                   for p in range(PRODUCERS)]
        for sender in senders:
            store.grant_right(lead, sender, inboxes["latency"][0])
        return cls(store, lead, inboxes, senders)

    def fill(self, ws: str, count: int) -> None:
        for start in range(0, count, FILL_BATCH):
            drafts = [{"from": self.lead, "to": ws, "type": "directive", "content": CONTENT}
                      for _ in range(min(FILL_BATCH, count - start))]
            results = self.store.send_many(drafts)
            if any(r.status != "acknowledged" for r in results):
                raise RuntimeError(f"pre-fill of {ws} not delivered: {results[0]}")

    def run_cell(self, workers: Workers, cell: Cell, count: int, *,
                 analyse: bool = True) -> float:
        """Pre-fill (untimed), then consume; envelopes acked per second of wall time.
        `analyse=False`: no VACUUM ANALYZE first (a store autovacuum has not reached yet)."""
        boxes = self.inboxes[cell.label]
        for i, ws in enumerate(boxes):
            self.fill(ws, count // len(boxes) + (1 if i < count % len(boxes) else 0))
        if analyse:
            vacuum(self.store.dsn)
        start_at = time.time() + START_DELAY
        acked, seconds = _timed(workers, [("consume", boxes[i % len(boxes)], cell.batch,
                                            start_at) for i in range(cell.consumers)], start_at)
        if acked != count:
            raise RuntimeError(f"{cell.label}: {acked} of {count} envelopes acked")
        return count / seconds

    def latency(self, workers: Workers, count: int) -> Latency:
        """Paced sends by PRODUCERS processes, one Subscriber receiving."""
        ws = self.inboxes["latency"][0]
        vacuum(self.store.dsn)
        workers.send(0, "listen", ws, count, 30 + 5 * count / LATENCY_RATE)
        workers.collect(1, "ready")
        start_at = time.time() + START_DELAY
        for p in range(PRODUCERS):
            workers.send(1 + p, "produce", self.senders[p], ws,
                         list(range(p, count, PRODUCERS)), LATENCY_RATE, start_at)
        replies = workers.collect(1 + PRODUCERS)
        received: list[tuple[int, int]] = replies.pop(0)
        if len(received) != count:
            raise RuntimeError(f"latency: {len(received)} of {count} envelopes received")
        sent_for = max(end for end, _ in replies.values()) - start_at
        return Latency([ns / 1e6 for _, ns in received],
                       [ns / 1e6 for _, took in replies.values() for ns in took],
                       [count / sent_for])


# --------------------------------------------------------------------------- Procrastinate


def procrastinate_installed() -> bool:
    return importlib.util.find_spec("procrastinate") is not None


class Procrastinate:
    """Procrastinate in a schema of its own on the benchmark database (its search_path)."""

    def __init__(self, dsn: str) -> None:
        from psycopg.conninfo import make_conninfo

        self.dsn = libpq_dsn(dsn)
        self.schema = f"procrastinate_bench_{os.getpid()}"
        self.conninfo = make_conninfo(self.dsn, options=f"-c search_path={self.schema}")

    def _admin(self, statement: sql.Composable) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def install(self) -> None:
        """Create the schema and apply Procrastinate's own schema to it (its API)."""
        from procrastinate.schema import SchemaManager

        schema = sql.Identifier(self.schema)
        self._admin(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
        self._admin(sql.SQL("CREATE SCHEMA {}").format(schema))
        asyncio.run(self._with_connector(lambda c: SchemaManager(c).apply_schema_async()))

    def drop(self) -> None:
        self._admin(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(self.schema)))

    async def _with_connector(self, work: Callable[[Any], Any]) -> None:
        from procrastinate import PsycopgConnector

        connector = PsycopgConnector(conninfo=self.conninfo, min_size=1, max_size=1)
        await connector.open_async()
        try:
            await work(connector)
        finally:
            await connector.close_async()

    def defer(self, count: int) -> None:
        """Queue `count` jobs with Procrastinate's batch defer (untimed)."""
        from procrastinate.jobs import Job
        from procrastinate.manager import JobManager

        async def work(connector: Any) -> None:
            manager = JobManager(connector)
            for start in range(0, count, FILL_BATCH):
                await manager.batch_defer_jobs_async([
                    Job(queue="bench", lock=None, queueing_lock=None, task_name="bench_noop",
                        task_kwargs={"n": start + i})
                    for i in range(min(FILL_BATCH, count - start))])

        asyncio.run(self._with_connector(work))

    def run_cell(self, workers: Workers, processes: int, count: int) -> float:
        self.defer(count)
        vacuum(self.dsn)
        start_at = time.time() + START_DELAY + 0.3  # each process opens its pool first
        done, seconds = _timed(workers, [("procrastinate", self.conninfo, start_at)]
                               * processes, start_at)
        if done != count:
            raise RuntimeError(f"procrastinate: {done} of {count} jobs finished")
        return count / seconds


# --------------------------------------------------------------------------- the run


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    count = max(100, int(COUNT * scale))
    latency_count = max(30, int(LATENCY_COUNT * scale / ROUNDS))
    with scratch_database(dsn, "agentpost_bench_leases") as bench_dsn:
        return _measure(bench_dsn, count, latency_count)


@dataclass
class Results:
    rates: dict[str, list[float]]
    latency: Latency

    def add_rate(self, label: str, rate: float) -> None:
        self.rates.setdefault(label, []).append(rate)


def _measure(dsn: str, count: int, latency_count: int) -> int:
    rival = Procrastinate(dsn) if procrastinate_installed() else None
    with EnvelopeStore(dsn) as store, Workers(dsn, PROCESSES) as workers:
        side = Agentpost.setup(store)
        if rival is not None:
            rival.install()
        try:
            results = _rounds(workers, side, rival, count, latency_count)
        finally:
            if rival is not None:
                rival.drop()
        verified = store.verify_trail()
        durable = store.settings.durable_acks
    _report(count, results, verified, durable, vacuum(dsn))
    return 0 if verified.ok else 1


def _rounds(workers: Workers, side: Agentpost, rival: Procrastinate | None, count: int,
            latency_count: int) -> Results:
    """A warm-up pass (not counted), then ROUNDS rounds of every measurement in turn: the
    throughput cells, Procrastinate's, and a share of the latency sends."""
    results = Results({}, Latency([], [], []))
    for round_ in range(ROUNDS + 1):
        keep = round_ > 0
        n = count if keep else min(WARMUP_COUNT, count)
        for cell in CELLS:
            rate = side.run_cell(workers, cell, n)
            if keep:
                results.add_rate(cell.label, rate)
        for processes in PROCRASTINATE_CELLS if rival is not None else ():
            rate = rival.run_cell(workers, processes, n)  # type: ignore[union-attr]
            if keep:
                results.add_rate(_rival_label(processes), rate)
        latency = side.latency(workers, latency_count if keep else
                               min(WARMUP_COUNT, latency_count))
        if keep:
            results.latency.extend(latency)
    return results


def _rival_label(processes: int) -> str:
    return f"procrastinate, {processes} process{'es' if processes > 1 else ''}"


def _report(count: int, results: Results, verified: Any, durable: bool,
            autovacuum: str) -> None:
    best = {label: median(values) for label, values in results.rates.items()}
    lat = results.latency
    p50, p95 = percentile(lat.total, 0.50), percentile(lat.total, 0.95)
    report = Report(f"agentpost bench leases ({ROUNDS} interleaved rounds, medians; "
                    f"{count:,} envelopes per cell, one inbox shared unless said; acks "
                    f"{'durable' if durable else 'with synchronous_commit off'})")
    for cell in CELLS:
        report.add(f"lease+ack, {cell.label}", f"{best[cell.label]:,.0f} envelopes/s")
    report.add("send-to-consumer latency p50 / p95",
               f"{p50:.2f} ms / {p95:.2f} ms ({len(lat.total):,} envelopes sent at "
               f"{median(lat.rates):,.0f}/s of {LATENCY_RATE:,.0f}/s asked, by {PRODUCERS} "
               "producers; LISTEN/NOTIFY)")
    report.add("  of which the send call p50 / p95",
               f"{percentile(lat.send, 0.50):.2f} ms / {percentile(lat.send, 0.95):.2f} ms")
    rival = best.get(_rival_label(GOAL_CELL.consumers))
    if rival is not None:
        for processes in PROCRASTINATE_CELLS:
            label = _rival_label(processes)
            report.add(f"{label}, fetch+finish", f"{best[label]:,.0f} jobs/s")
        for cell in (GOAL_CELL, LIKE_CELL):
            report.add(f"ratio ({cell.label}) / procrastinate, {GOAL_CELL.consumers} processes",
                       f"{best[cell.label] / rival:.2f}")
    else:
        report.add("procrastinate", f"skipped: not installed ({INSTALL_HINT})")
    report.add("trail after the run", f"{verified.entries:,} entries, "
                                      f"{'verified' if verified.ok else 'FAILED'}")
    report.add("maintenance", f"VACUUM ANALYZE before each measurement, untimed "
                              f"(this server's autovacuum: {autovacuum})")
    report.goal(">= 10,000 envelopes/s leased and acked, 4 consumers, batches of 100",
                best[GOAL_CELL.label] >= 10_000)
    report.goal("p95 send-to-consumer latency < 5 ms", p95 < 5.0)
    if rival is not None:
        report.goal(">= 3 x Procrastinate's fetch+finish rate (4 consumers, batches of 100, "
                    "vs 4 processes)", best[GOAL_CELL.label] >= 3 * rival)
    report.print()
