"""What the browser test's store holds besides its inboxes: the example fleet (dags/fleet.yaml)
with marks of its agents, commands and a compensated saga of its travel desk, consumed
envelopes, and three daily windows of trail analytics for ten inboxes. Every page of the
agentpost UI then has something to show, as after a demo run (docs/ui.md, "Browser test").
Written through the store's own APIs, except the analytics tables, which the Spark job
fills with plain SQL (their contract is in docs/ui.md) and which are filled the same way, and
one agent's recorded name, deleted so that its mark looks written before sql/0076."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2

from agentpost.fleet.changes import apply
from agentpost.fleet.files import load_fleet
from agentpost.marks import Agent, Guard, MarkType, Need, Observation
from agentpost.marks.guard import SYSTEM_AGENT_ID, SYSTEM_AGENT_NAME
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.sagas import SagaAborted, SagaRunner

FLEET = Path(__file__).resolve().parents[2] / "dags" / "fleet.yaml"
DRIVERS = ("driver-a", "driver-b", "driver-c")
INBOXES = [f"inbox-{k:02d}" for k in range(10)]
DAY = timedelta(days=1)


@dataclass
class Seeded:
    """Ids the browser test looks for."""

    space: str = ""
    agents: dict[str, str] = field(default_factory=dict)  # name: id
    poller: str = ""  # an agent whose name is not a workspace id (recorded, sql/0076)
    unnamed: str = ""  # an agent with a random id and no recorded name (an older mark)
    observation: str = ""
    superseded: str = ""
    executed: str = ""
    failed: str = ""
    saga_step: str = ""
    consumed: list[str] = field(default_factory=list)
    consumed_inbox: str = "driver-a"
    windows: list[datetime] = field(default_factory=list)


def seed_all(store: EnvelopeStore) -> Seeded:
    out = Seeded()
    fleet = load_fleet(FLEET)
    apply(store, fleet)
    _marks(store, fleet, out)
    _commands(store, out)
    _consumed(store, out)
    _analytics(store.dsn, out)
    return out


def _marks(store: EnvelopeStore, fleet: Any, out: Seeded) -> None:
    """Three drivers want spot-1 (a deferred scope): a boundary decides; a weather poller
    observes, then corrects itself (a superseded observation); the guard's own agent asks a
    person something; a script with a random id observes too, its name not recorded (as
    before sql/0076)."""
    out.space = fleet.space
    drivers = {name: fleet.agent(name) for name in DRIVERS}
    out.agents = {name: str(a.id) for name, a in drivers.items()}
    poller = fleet.agent("weather-poller")
    out.poller = str(poller.id)
    with PostgresMarkSpace(dsn=store.dsn, scopes=fleet.scopes, space=fleet.space) as space:
        guard = Guard(space)
        for name, confidence in zip(DRIVERS, (0.5, 0.9, 0.7), strict=True):
            guard.pre_action(drivers[name], "parking", "spot-1", "park", confidence)
        guard.resolve_deferred("parking", "spot-1")
        guard.pre_action(drivers["driver-a"], "parking", "spot-2", "park", 0.6)
        first = space.write(poller, Observation(scope="weather", topic="forecast",
                                                content={"rain": 0.5}))
        out.superseded = str(first)  # its strength is 0 all along
        out.observation = str(space.write(poller, Observation(
            scope="weather", topic="forecast", content={"rain": 0.3}, supersedes=first)))
        guard_agent = Agent(id=SYSTEM_AGENT_ID, name=SYSTEM_AGENT_NAME,
                            scopes={"parking": (MarkType.NEED,)})
        space.write(guard_agent, Need(scope="parking", question="Is spot-3 open?",
                                      priority=0.6, context={"resource": "spot-3"}))
        script = Agent(name="old-script", scopes={"weather": (MarkType.OBSERVATION,)})
        space.write(script, Observation(scope="weather", topic="forecast", content={"rain": 0.9}))
    out.unnamed = str(script.id)
    with psycopg2.connect(store.dsn) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM agentpost.mark_agents WHERE agent_id = %s", (out.unnamed,))
    conn.close()


def _commands(store: EnvelopeStore, out: Seeded) -> None:
    """The travel desk: a booking executed, a charge failed, and a saga whose payment step
    failed after two steps executed (compensated, in reverse order)."""

    def declined() -> None:
        raise RuntimeError("card declined")

    with CommandLedger(store) as ledger:
        out.executed = ledger.run("travel-desk", "seed/book-1", lambda: {"room": 7},
                                  action="trip.book", mutating=True,
                                  auto_confirm="seed-policy").command_id
        out.failed = ledger.run("travel-desk", "seed/pay-1", declined, action="trip.pay",
                                mutating=True, auto_confirm="seed-policy").command_id
        runner = SagaRunner(ledger, {"cancel": lambda args: {"canceled": args["item"]}},
                            sleep=lambda _s: None)
        saga = runner.begin("travel-desk", "seed-trip")
        for item in ("flight", "hotel"):
            saga.step(item, lambda item=item: {"booked": item}, action="trip.book",
                      compensation=("cancel", {"item": item}), auto_confirm="seed-policy")
        try:
            saga.step("payment", declined, action="trip.pay", auto_confirm="seed-policy")
        except SagaAborted:
            pass
        out.saga_step = saga.view().step("flight").command_id


def _consumed(store: EnvelopeStore, out: Seeded) -> None:
    """Four directives to driver-a, three of them leased and acked."""
    ws = out.consumed_inbox
    for k in range(4):
        store.send("dispatch", ws, "directive", f"park somewhere {k}")
    for lease in store.lease(ws, 3, 60, holder="driver-a"):
        store.ack(lease.token)
        out.consumed.append(lease.envelope.id)


def _analytics(dsn: str, out: Seeded) -> None:
    """Three daily windows before today, as the analytics job writes them: ten inboxes'
    latency, and the activity of a fleet agent (by id) and a workspace."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    out.windows = [today - k * DAY for k in (3, 2, 1)]
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for w, start in enumerate(out.windows):
            end = start + DAY
            for k, inbox in enumerate(INBOXES):
                p50 = 5.0 + k + w
                cur.execute("INSERT INTO agentpost.analytics_inbox_latency VALUES"
                            " (%s, %s, %s, %s, %s, %s, %s)",
                            (start, end, inbox, 100 - 7 * k, p50, 3 * p50, 4 * p50))
            cur.execute("INSERT INTO agentpost.analytics_agent_activity (window_start,"
                        " window_end, agent, sent, received, marks) VALUES"
                        " (%s, %s, %s, 0, 0, 4), (%s, %s, 'dispatch', 12, 30, 0)",
                        (start, end, out.agents["driver-b"], start, end))
            cur.execute("INSERT INTO agentpost.analytics_runs (job, window_start, window_end,"
                        " source_rows) VALUES ('analytics', %s, %s, 1000)", (start, end))
    conn.close()
