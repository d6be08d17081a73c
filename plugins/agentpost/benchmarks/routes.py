"""Routed hops (Asya routes) against raw envelope sends, in one run on one database.

**A hop** is one actor of a route handling one envelope: its lease, its handler's result
routed on (the next actor, a fan-out, an end actor) and the lease acked, with the status
rows and trail entries that go with it. A route of the measured shape (3 actors, the first
fanning out to `fanout` items) makes ``1 + 2 * fanout`` hops (21 for a fan-out of 10). The
time of a routed run also covers what is not a hop: starting the routes (the gateway's
sends) and the end actor taking every envelope out of ``happy-end``, so a hop carries its
share of them.

**The ratio** is time per hop / time per send = (send rate) / (hop rate), where the send
rate is `measure_send`'s: single envelopes by ``store.send``, one call each, one process, on
the same database in the same run. The issue's goal is a ratio of at most 1.5.

Hops are handled as a route runtime streams them: each actor leases up to `batch` hops
(``RouteStore.receive``, which reports them ``received`` in the lease's transaction), then
completes them and leases the next ones in one transaction
(``RouteStore.complete_and_receive``); happy-end likewise (``finish_and_receive``). One
process; the handlers do no work.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from agentpost.benchmarks.common import Report, median, scratch_database
from agentpost.benchmarks.leases import vacuum
from agentpost.protocol.routes import HAPPY_END
from agentpost.store import EnvelopeStore
from agentpost.store.routes import Hop, RouteStore

ROUNDS = 3
ROUTES = 100  # routes per measurement at scale 1 (2,100 hops with a fan-out of 10)
SENDS = 1_000  # single sends per measurement at scale 1
BATCH = 100
CONTENT = "Summarise the incident reports of the last quarter."


def measure_send(store: EnvelopeStore, n: int) -> dict[str, Any]:
    """`n` single ``store.send`` calls from one workspace to another, one at a time:
    ``{"sends", "elapsed", "sends_per_s"}``."""
    tag = uuid.uuid4().hex[:8]
    lead = store.create_workspace("coordinator", workspace_id=f"bench-send-{tag}").id
    worker = store.create_workspace("worker", parent=lead,
                                    workspace_id=f"bench-recv-{tag}").id
    start = time.perf_counter()
    for _ in range(n):
        store.send(lead, worker, "directive", CONTENT)
    elapsed = time.perf_counter() - start
    return {"sends": n, "elapsed": elapsed, "sends_per_s": n / elapsed}


def _handler(actor_index: int, fanout: int, hop: Hop) -> Any:
    """The benchmark's actors: the first fans out, the others enrich the payload."""
    if actor_index == 0:
        return [{"chunk": i} for i in range(fanout)]
    return {f"step_{actor_index}": True}


def measure_routes(store: EnvelopeStore, *, routes: int, fanout: int = 10,
                   batch: int = BATCH) -> dict[str, Any]:
    """Run `routes` routes through 3 fresh actors, the first fanning out to `fanout`, each
    actor handling up to `batch` hops per call, until every envelope reached happy-end.
    Returns ``{"routes", "hops", "envelopes", "elapsed", "hops_per_s", "envelopes_per_s"}``
    (envelopes: every routed envelope sent, the gateway's starts included)."""
    rs = RouteStore(store)
    tag = uuid.uuid4().hex[:8]
    actors = [f"b{tag}-{name}" for name in ("prep", "infer", "post")]
    rs.setup(actors)
    expected = routes * max(1, fanout)
    ids = [f"r{tag}-{i}" for i in range(routes)]
    start = time.perf_counter()
    for k in range(0, routes, batch):
        rs.start_many([{"id": i, "route": {"actors": actors}, "payload": {"text": CONTENT}}
                       for i in ids[k:k + batch]])
    hops = 0
    for index, actor in enumerate(actors):
        leased = rs.receive(actor, max=batch)
        while leased:
            hops += len(leased)
            _, leased = rs.complete_and_receive(
                actor, [(h, _handler(index, fanout, h)) for h in leased], max=batch)
    finished = 0
    done = rs.receive(HAPPY_END, max=batch)
    while done:
        finished += sum(h.envelope.id.startswith(f"r{tag}-") for h in done)
        done = rs.finish_and_receive(HAPPY_END, done, max=batch)
    elapsed = time.perf_counter() - start
    if finished != expected:
        raise RuntimeError(f"routes: {finished} of {expected} envelopes reached happy-end")
    envelopes = routes + hops
    return {"routes": routes, "hops": hops, "envelopes": envelopes, "elapsed": elapsed,
            "hops_per_s": hops / elapsed, "envelopes_per_s": envelopes / elapsed}


def compare(store: EnvelopeStore, *, routes: int, sends: int, rounds: int = ROUNDS,
            fanout: int = 10, batch: int = BATCH) -> dict[str, Any]:
    """Interleaved rounds of `measure_send` and `measure_routes` (a warm-up round first,
    not counted; VACUUM ANALYZE before each measurement, untimed): medians and the ratio
    time per hop / time per send."""
    sends_per_s: list[float] = []
    hops_per_s: list[float] = []
    envelopes_per_s: list[float] = []
    for round_ in range(rounds + 1):
        vacuum(store.dsn)
        sent = measure_send(store, sends if round_ else min(sends, 100))
        vacuum(store.dsn)
        routed = measure_routes(store, routes=routes if round_ else min(routes, 10),
                                fanout=fanout, batch=batch)
        if round_:
            sends_per_s.append(sent["sends_per_s"])
            hops_per_s.append(routed["hops_per_s"])
            envelopes_per_s.append(routed["envelopes_per_s"])
    send_rate, hop_rate = median(sends_per_s), median(hops_per_s)
    return {"rounds": rounds, "routes": routes, "fanout": fanout, "batch": batch,
            "sends_per_s": send_rate, "hops_per_s": hop_rate,
            "envelopes_per_s": median(envelopes_per_s),
            "hop_send_ratio": send_rate / hop_rate,
            "each_round": list(zip(sends_per_s, hops_per_s, strict=True))}


def run(*, dsn: str | None = None, scale: float = 1.0) -> int:
    """``agentpost bench routes`` (if registered): the comparison, printed."""
    routes, sends = max(10, int(ROUTES * scale)), max(100, int(SENDS * scale))
    with scratch_database(dsn, "agentpost_bench_routes") as bench_dsn, \
            EnvelopeStore(bench_dsn) as store:
        result = {batch: compare(store, routes=routes, sends=sends, batch=batch)
                  for batch in (BATCH, 10, 1)}
        verified = store.verify_trail()
    report = Report(f"agentpost bench routes ({ROUNDS} interleaved rounds, medians; "
                    f"{routes} routes of 3 actors, fan-out of 10 at the first)")
    for batch, res in result.items():
        report.add(f"raw send (store.send, one at a time), run with batch {batch}",
                   f"{res['sends_per_s']:,.0f} envelopes/s")
        report.add(f"routed hops, batch {batch}",
                   f"{res['hops_per_s']:,.0f} hops/s ({res['envelopes_per_s']:,.0f} "
                   f"envelopes/s)")
        report.add(f"time per hop / time per send, batch {batch}",
                   f"{res['hop_send_ratio']:.2f}")
    report.add("trail after the run", f"{verified.entries:,} entries, "
                                      f"{'verified' if verified.ok else 'FAILED'}")
    report.goal("a routed hop costs no more than 1.5 envelope sends (batch "
                f"{BATCH})", result[BATCH]["hop_send_ratio"] <= 1.5)
    report.print()
    return 0 if verified.ok else 1
