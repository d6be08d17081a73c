"""The systems `agentpost bench peers` drives: agentpost, its Postgres peers and a raw table.

Each is a small class with the same methods, so the runner never knows which it drives:

- `install()`: once, in the parent, on the system's own scratch database (its schema, queue);
- `open()` / `close()`: in a benchmark process, the connections it keeps for the whole run;
- `send_one(payload, to)`: one message, committed; `send_batch(payloads, to)`: many in one
  call; `to` is SENDS (the queue the send cells fill and nobody reads) or WORK (the queue
  the consume and latency cells read), so the consume cells find exactly what was put in;
- `consume(batch)`: one batched read and acknowledgement of up to `batch` messages of WORK,
  the way the system's own workers finish work; returns the payloads ([] when empty);
- `listen()` / `receive(timeout)` / `unlisten()`: live delivery, for the latency workload
  (only systems with `listens`): wait on the system's LISTEN/NOTIFY channel, then consume.

Each peer is driven through its own Python client, as a user would call it; only the raw
table (the WAL reference) is plain SQL. The peers' imports happen inside the methods, so a
peer that is not installed costs nothing but a "not measured" line.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, ClassVar, TypeVar

import psycopg2

from agentpost.pg.server import libpq_dsn
from agentpost.store.listen import Listener

T = TypeVar("T")

SENDS = "sends"  # each a queue (pgmq, Procrastinate), entrypoint (pgqueuer), inbox, table
WORK = "work"
VISIBILITY = 30  # seconds a read message stays invisible (pgmq) / a lease lives (agentpost)


class System(ABC):
    """The common shape. `module` is the importable name that says whether it is installed,
    `pip` the distribution to install (and whose version is printed)."""

    name: ClassVar[str]
    module: ClassVar[str | None] = None
    pip: ClassVar[str | None] = None
    listens: ClassVar[bool] = True
    channel: ClassVar[str] = ""  # the NOTIFY channel a consumer LISTENs on (peers)
    live_batch: ClassVar[int] = 100  # what a live consumer takes at once

    def __init__(self, dsn: str, tag: str) -> None:
        self.dsn = libpq_dsn(dsn)
        self.tag = tag
        self._listener: Listener | None = None

    @classmethod
    def installed(cls) -> bool:
        return cls.module is None or importlib.util.find_spec(cls.module) is not None

    @classmethod
    def version(cls) -> str:
        try:
            return importlib.metadata.version(cls.pip) if cls.pip else ""
        except importlib.metadata.PackageNotFoundError:
            return "(not installed)"

    @abstractmethod
    def install(self) -> None:
        ...

    @abstractmethod
    def open(self) -> None:
        ...

    @abstractmethod
    def close(self) -> None:
        ...

    @abstractmethod
    def send_one(self, payload: str, to: str) -> None:
        ...

    @abstractmethod
    def send_batch(self, payloads: list[str], to: str) -> None:
        ...

    @abstractmethod
    def consume(self, batch: int) -> list[str]:
        ...

    def listen(self) -> None:
        """Start LISTENing before the first check, so no notification falls in between."""
        listener = _ChannelListener(self.dsn, self.channel)
        listener.connect()
        self._listener = listener

    def receive(self, timeout: float) -> list[str]:
        """What a worker of the peer does when idle: check, else sleep until a NOTIFY (or
        the timeout), then check again. The check is the same batched consume, of at most
        `live_batch` (a message is timed when its batch returns)."""
        if got := self.consume(self.live_batch):
            return got
        assert self._listener is not None
        self._listener.wait(timeout)
        return self.consume(self.live_batch)

    def unlisten(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


class _ChannelListener(Listener):
    """agentpost's Listener on another system's channel (any payload wakes it)."""

    def __init__(self, dsn: str, channel: str) -> None:
        super().__init__(dsn, None)
        self.channel = '"' + channel.replace('"', '""') + '"'


class _Async(System):
    """A peer whose client is asyncio-only: one event loop of its own, kept open."""

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)

    def _close_loop(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


# --------------------------------------------------------------------------- agentpost


class Agentpost(System):
    """EnvelopeStore: send / send_many from a coordinator to one worker inbox; lease +
    ack_many; live delivery through a Subscriber (its Listener, agentpost's own channel)."""

    name = "agentpost"

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self.lead = f"peers-lead-{tag}"
        self.inboxes = {to: f"peers-{to}-{tag}" for to in (SENDS, WORK)}
        self.inbox = self.inboxes[WORK]
        self.store: Any = None
        self._sub: Any = None

    def install(self) -> None:
        from agentpost.store import EnvelopeStore

        with EnvelopeStore(self.dsn) as store:
            store.create_workspace("coordinator", workspace_id=self.lead)
            for inbox in self.inboxes.values():
                store.create_workspace("worker", parent=self.lead, workspace_id=inbox)

    def open(self) -> None:
        from agentpost.store import EnvelopeStore

        self.store = EnvelopeStore(self.dsn)

    def close(self) -> None:
        self.unlisten()
        if self.store is not None:
            self.store.close()
            self.store = None

    def send_one(self, payload: str, to: str) -> None:
        result = self.store.send(self.lead, self.inboxes[to], "directive", payload)
        if result.status != "acknowledged":
            raise RuntimeError(f"agentpost send not delivered: {result}")

    def send_batch(self, payloads: list[str], to: str) -> None:
        results = self.store.send_many([{"from": self.lead, "to": self.inboxes[to],
                                         "type": "directive", "content": p}
                                        for p in payloads])
        if any(r.status != "acknowledged" for r in results):
            raise RuntimeError(f"agentpost send_many not delivered: {results[0]}")

    def consume(self, batch: int) -> list[str]:
        leases = self.store.lease(self.inbox, max=batch, ttl=VISIBILITY,
                                  holder=f"peers-{os.getpid()}")
        if leases:
            self.store.ack_many([lease.token for lease in leases])
        return [str(lease.envelope.content) for lease in leases]

    def listen(self) -> None:
        from agentpost.store.consumer import Subscriber

        self._sub = Subscriber(self.store, self.inbox, ttl=VISIBILITY)
        self._sub.listener.connect()
        self._sub.grant(100)

    def receive(self, timeout: float) -> list[str]:
        leases = self._sub.take(timeout=timeout)
        if leases:
            self.store.ack_many([lease.token for lease in leases])
            self._sub.grant(len(leases))
        return [str(lease.envelope.content) for lease in leases]

    def unlisten(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None


# --------------------------------------------------------------------------- the reference


class RawTable(System):
    """The WAL reference: a plain table (bigserial id, text payload), one INSERT + COMMIT
    per send; its consume is a DELETE ... RETURNING of a batch (SKIP LOCKED)."""

    name = "raw INSERT"
    listens = False

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self.conn: Any = None

    def install(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn, conn.cursor() as cur:
                for to in (SENDS, WORK):
                    cur.execute(f"CREATE TABLE IF NOT EXISTS peers_{to} "
                                "(id bigserial PRIMARY KEY, payload text NOT NULL)")
        finally:
            conn.close()

    def open(self) -> None:
        self.conn = psycopg2.connect(self.dsn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send_one(self, payload: str, to: str) -> None:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"INSERT INTO peers_{to} (payload) VALUES (%s)", (payload,))

    def send_batch(self, payloads: list[str], to: str) -> None:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"INSERT INTO peers_{to} (payload) SELECT unnest(%s::text[])",
                        (payloads,))

    def consume(self, batch: int) -> list[str]:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"DELETE FROM peers_{WORK} WHERE id IN (SELECT id FROM peers_{WORK} "
                        "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING payload",
                        (batch,))
            return [row[0] for row in cur.fetchall()]


# --------------------------------------------------------------------------- pgmq


class Pgmq(System):
    """pgmq through its Python client (`PGMQueue`, one pooled connection), its schema from
    the SQL the client ships (no extension). send / send_batch; read(qty) + delete_batch.
    Its NOTIFY on insert is off by default: on (throttle 0) only for the latency workload."""

    name = "pgmq"
    module = "pgmq"
    pip = "pgmq"
    channel = f"pgmq.q_{WORK}.INSERT"

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self.queue: Any = None

    def install(self) -> None:
        from pgmq.install import install_pgmq_from_sql

        install_pgmq_from_sql(dsn=self.dsn)
        self.open()
        try:
            for to in (SENDS, WORK):
                self.queue.create_queue(to)
        finally:
            self.close()

    def open(self) -> None:
        from pgmq import PGMQueue

        self.queue = PGMQueue(conn_string=self.dsn, pool_size=1, init_extension=False)

    def close(self) -> None:
        self.unlisten()
        if self.queue is not None:
            self.queue.close()
            self.queue = None

    def send_one(self, payload: str, to: str) -> None:
        self.queue.send(to, {"p": payload})

    def send_batch(self, payloads: list[str], to: str) -> None:
        self.queue.send_batch(to, [{"p": p} for p in payloads])

    def consume(self, batch: int) -> list[str]:
        messages = self.queue.read_batch(WORK, vt=VISIBILITY, batch_size=batch)
        if messages:
            self.queue.delete_batch(WORK, [m.msg_id for m in messages])
        return [m.message["p"] for m in messages]

    def notify(self, on: bool) -> None:
        """Its insert trigger (every insert also updates a throttle row): latency only."""
        if on:
            self.queue.enable_notify(WORK, throttle_interval_ms=0)
        else:
            self.queue.disable_notify(WORK)


# --------------------------------------------------------------------------- pgqueuer


class Pgqueuer(_Async):
    """pgqueuer through its `Queries` over one asyncpg connection (its durable schema, its
    default): enqueue, one job or a list; dequeue(batch) + log_jobs as successful, what its
    QueueManager does around a job. Its trigger NOTIFYs `ch_pgqueuer` on every change."""

    name = "pgqueuer"
    module = "pgqueuer"
    pip = "pgqueuer"
    channel = "ch_pgqueuer"

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self.conn: Any = None
        self.queries: Any = None
        self.manager_id = uuid.uuid4()

    def install(self) -> None:
        self.open()
        try:
            self._run(self.queries.install())
        finally:
            self.close()

    def open(self) -> None:
        import asyncpg
        from pgqueuer.queries import Queries

        self.conn = self._run(asyncpg.connect(self.dsn))
        self.queries = Queries.from_asyncpg_connection(self.conn)

    def close(self) -> None:
        self.unlisten()
        if self.conn is not None:
            self._run(self.conn.close())
            self.conn = None
        self._close_loop()

    def send_one(self, payload: str, to: str) -> None:
        self._run(self.queries.enqueue(to, payload.encode()))

    def send_batch(self, payloads: list[str], to: str) -> None:
        self._run(self.queries.enqueue([to] * len(payloads),
                                       [p.encode() for p in payloads], [0] * len(payloads)))

    def consume(self, batch: int) -> list[str]:
        return self._run(self._consume(batch))

    async def _consume(self, batch: int) -> list[str]:
        from pgqueuer.queries import EntrypointExecutionParameter

        jobs = await self.queries.dequeue(
            batch_size=batch, entrypoints={WORK: EntrypointExecutionParameter(0)},
            queue_manager_id=self.manager_id, global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=VISIBILITY))
        if jobs:
            await self.queries.log_jobs([(job, "successful", None) for job in jobs])
        return [bytes(job.payload or b"").decode() for job in jobs]


# --------------------------------------------------------------------------- Procrastinate


class Procrastinate(_Async):
    """Procrastinate through its JobManager over a one-connection PsycopgConnector, its schema
    applied by its SchemaManager: defer_job / batch_defer_jobs; fetch_job + finish_job
    (succeeded, kept, its worker's default), one job per fetch: Procrastinate has no batched
    fetch, so a "batch" is that many cycles. Its trigger NOTIFYs on every deferred job."""

    name = "procrastinate"
    module = "procrastinate"
    pip = "procrastinate"
    channel = f"procrastinate_queue_v1#{WORK}"
    live_batch = 1  # its worker runs each job as fetched, not after a hundred fetches

    def __init__(self, dsn: str, tag: str) -> None:
        super().__init__(dsn, tag)
        self.connector: Any = None
        self.manager: Any = None
        self.worker_id: int | None = None

    def install(self) -> None:
        from procrastinate.schema import SchemaManager

        self.open()
        try:
            self._run(SchemaManager(self.connector).apply_schema_async())
        finally:
            self.close()

    def open(self) -> None:
        from procrastinate import PsycopgConnector
        from procrastinate.manager import JobManager

        self.connector = PsycopgConnector(conninfo=self.dsn, min_size=1, max_size=1)
        self._run(self.connector.open_async())
        self.manager = JobManager(self.connector)

    def close(self) -> None:
        self.unlisten()
        if self.connector is not None:
            if self.worker_id is not None:
                self._run(self.manager.unregister_worker(self.worker_id))
                self.worker_id = None
            self._run(self.connector.close_async())
            self.connector = None
        self._close_loop()

    def _job(self, payload: str, to: str) -> Any:
        from procrastinate.jobs import Job

        return Job(queue=to, lock=None, queueing_lock=None, task_name="bench",
                   task_kwargs={"p": payload})

    def send_one(self, payload: str, to: str) -> None:
        self._run(self.manager.defer_job_async(self._job(payload, to)))

    def send_batch(self, payloads: list[str], to: str) -> None:
        self._run(self.manager.batch_defer_jobs_async([self._job(p, to) for p in payloads]))

    def consume(self, batch: int) -> list[str]:
        return self._run(self._consume(batch))

    async def _consume(self, batch: int) -> list[str]:
        from procrastinate.jobs import Status

        if self.worker_id is None:
            self.worker_id = await self.manager.register_worker()
        out: list[str] = []
        while len(out) < batch and (job := await self.manager.fetch_job(
                queues=[WORK], worker_id=self.worker_id)) is not None:
            await self.manager.finish_job(job, status=Status.SUCCEEDED, delete_job=False)
            out.append(str(job.task_kwargs["p"]))
        return out


PEERS: tuple[type[System], ...] = (Pgmq, Pgqueuer, Procrastinate)
SYSTEMS: tuple[type[System], ...] = (Agentpost, *PEERS, RawTable)
