"""What `make demo` and `make demo-headless` run, whichever Airflow runs it.

One choreography over a `Runner` (real Airflow over REST, or `dag.test()` in a child
process), so both demos show the same scenarios in the same order:

1. the reactive DAGs start watching their inboxes (the fleet's reactive agents, the
   event-driven examples), since an inbox watcher reports only what arrives after it starts;
2. every example DAG (id ``agentpost_*``, tagged ``example``), each run once; a DAG also
   tagged ``expect-failure`` must fail *and* have compensated (the booking saga);
3. each event-driven example: the demo sends the envelope of `EVENT_DRIVEN` to its inbox and
   waits for the run the arrival starts;
4. the fleet of ``dags/fleet.yaml``: its source agents in rounds, its resolution boundary
   between rounds, until every agent contending in a deferred scope holds a resource;
5. the fleet's reactive agents, until their inboxes are read;
6. the maintenance DAG last, verifying and checkpointing the whole trail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentpost.fleet import Fleet
from agentpost.store import EnvelopeStore

EXAMPLE_PREFIX = "agentpost_"
EXAMPLE_TAG = "example"
#: a run of a DAG with this tag is expected to fail, after compensating (a saga)
EXPECT_FAILURE_TAG = "expect-failure"
MAINTENANCE = "agentpost_maintenance"
FLEET_FILE = "fleet.yaml"
#: source-agent rounds before the demo gives up on the deferred scope settling
MAX_ROUNDS = 6


@dataclass(frozen=True)
class Arrival:
    """The envelope that wakes an event-driven example: sent from `sender` to `inbox`."""

    inbox: str
    sender: str
    type: str
    content: dict[str, Any]

    @property
    def watcher(self) -> str:
        """The reactive factory's default watcher name for the inbox's asset
        (`agentpost.factories.reactive.inbox_asset`), not imported: it imports Airflow."""
        return f"asset:agentpost-inbox-{self.inbox}"


#: event-driven example DAG -> what the demo sends to start it
EVENT_DRIVEN = {
    "agentpost_event_driven_example": Arrival(
        "triage", "dispatch", "triage.request", {"incident": "a van blocks spot-2"}),
}


def is_example(dag_id: str, tags: Sequence[str] | set[str]) -> bool:
    """Whether the demo runs this DAG as an example (once, by a trigger)."""
    return dag_id.startswith(EXAMPLE_PREFIX) and EXAMPLE_TAG in tags


@dataclass
class Outcome:
    """How one DAG run ended; `ended` (task -> end time) orders the compensations."""

    dag_id: str
    state: str
    tasks: dict[str, str]
    ended: dict[str, str] = field(default_factory=dict)
    expect_failure: bool = False

    @property
    def compensated(self) -> list[str]:
        """The steps undone (``undo_<step>`` succeeded), in the order they were undone."""
        undone = [t for t, s in self.tasks.items() if t.startswith("undo_") and s == "success"]
        undone.sort(key=lambda t: self.ended.get(t, ""))
        return [t.removeprefix("undo_") for t in undone]

    @property
    def ok(self) -> bool:
        if not self.expect_failure:
            return self.state == "success"
        undo_failed = any(t.startswith("undo_") and s == "failed" for t, s in self.tasks.items())
        return self.state == "failed" and bool(self.compensated) and not undo_failed

    def line(self) -> str:
        tasks = ", ".join(f"{t}={s}" for t, s in sorted(self.tasks.items()))
        if self.expect_failure and self.ok:
            verdict = f"failed as designed: compensated {', '.join(self.compensated)}"
        elif self.expect_failure:
            verdict = f"{self.state}, NOT AS DESIGNED (it should fail and compensate)"
        else:
            verdict = self.state
        return f"  {self.dag_id}: {verdict} ({tasks})"


@dataclass(frozen=True)
class Check:
    """Something the demo checks in the store after the runs."""

    what: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'} {self.what}: {self.detail}"


class Runner(Protocol):
    """Runs DAGs on some Airflow; every method returns once the runs it started ended."""

    def watch(self, dag_ids: Sequence[str], watchers: Sequence[str]) -> None:
        """Let these asset-scheduled DAGs run; return once their inbox watchers run."""

    def run(self, dag_ids: Sequence[str]) -> list[Outcome]:
        """Start one run of each now; their outcomes."""

    def on_arrival(self, dag_id: str, arrival: Arrival, send: Callable[[], None]
                   ) -> list[Outcome]:
        """`send()` the arrival and wait for the run of `dag_id` it starts."""

    def drain(self, dag_id: str, inbox: str) -> list[Outcome]:
        """The runs of a reactive agent until its inbox is read."""


@dataclass
class Demo:
    """The choreography: `play()` runs every scenario on `runner` against the store."""

    runner: Runner
    store: EnvelopeStore
    fleet: Fleet
    dags: dict[str, set[str]]
    say: Callable[[str], None] = print
    outcomes: list[Outcome] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def play(self) -> None:
        self._require()
        reactive = self._agents("reactive")
        event_driven = [d for d in EVENT_DRIVEN if d in self.dags]
        self.runner.watch([*reactive, *event_driven],
                          [*self._watchers(), *(EVENT_DRIVEN[d].watcher for d in event_driven)])
        self._section("examples", self._examples())
        for dag_id in event_driven:
            self._event_driven(dag_id, EVENT_DRIVEN[dag_id])
        self._fleet_rounds()
        for name, dag_id in zip(self._reactive_names(), reactive, strict=True):
            self._record(self.runner.drain(dag_id, self.fleet.agent_def(name).inboxes[0]))
        self._section("maintenance", [MAINTENANCE] if MAINTENANCE in self.dags else [])

    # -- the scenarios ------------------------------------------------------------------------

    def _examples(self) -> list[str]:
        return sorted(d for d, tags in self.dags.items()
                      if is_example(d, tags) and d not in EVENT_DRIVEN)

    def _section(self, title: str, dag_ids: list[str]) -> None:
        if dag_ids:
            self.say(f"\n== {title.capitalize()}: {', '.join(dag_ids)}")
            self._record(self.runner.run(dag_ids))

    def _event_driven(self, dag_id: str, arrival: Arrival) -> None:
        self.say(f"\n== Event-driven: {dag_id} (an envelope to inbox {arrival.inbox})")
        sent: list[str] = []

        def send() -> None:
            result = self.store.send(arrival.sender, arrival.inbox, arrival.type,
                                     arrival.content, format="json")
            self.say(f"  sent {arrival.type} {result.envelope_id} "
                     f"{arrival.sender} -> {arrival.inbox}: {result.status}")
            sent.append(result.envelope_id)

        self._record(self.runner.on_arrival(dag_id, arrival, send))
        consumed = bool(sent) and self.store.get(sent[0]).consumed_at is not None
        self.checks.append(Check(f"{dag_id} handled its arrival", consumed,
                                 f"envelope {sent[0] if sent else '(not sent)'} "
                                 + ("consumed" if consumed else "NOT consumed")))

    def _fleet_rounds(self) -> None:
        """Source agents, then the boundary, until every contender holds a resource."""
        sources, boundary = self._agents("source"), f"boundary_{self.fleet.name}"
        if not sources:
            return
        self.say(f"\n== Fleet {self.fleet.name!r}: source agents {', '.join(sources)}; "
                 f"boundary {boundary}")
        held: dict[str, str | None] = {}
        for number in range(1, MAX_ROUNDS + 1):
            self.say(f"  round {number}")
            self._record(self.runner.run(sources))
            held = self._held()
            if all(held.values()) or not self.fleet.deferred_scopes():
                break
            self._record(self.runner.run([boundary]))
        if not held:
            return
        spots = [s for s in held.values() if s]
        self.checks.append(Check(
            "every contender holds its own resource after the boundaries",
            bool(held) and len(spots) == len(held) == len(set(spots)),
            ", ".join(f"{a} on {s}" for a, s in sorted(held.items())) or "no contender"))

    # -- the fleet ----------------------------------------------------------------------------

    def _agents(self, kind: str) -> list[str]:
        return [f"agent_{self.fleet.name}_{a.name}" for a in self.fleet.agents if a.kind == kind]

    def _reactive_names(self) -> list[str]:
        return [a.name for a in self.fleet.agents if a.kind == "reactive"]

    def _watchers(self) -> list[str]:
        return [f"asset:agentpost-inbox-{inbox}" for name in self._reactive_names()
                for inbox in self.fleet.agent_def(name).inboxes]

    def _held(self) -> dict[str, str | None]:
        """Each agent contending in a deferred scope -> the resource it holds, or None."""
        from agentpost.marks.postgres import PostgresMarkSpace

        space = PostgresMarkSpace(dsn=self.store.dsn, scopes=self.fleet.scopes,
                                  space=self.fleet.space)
        try:
            return {name: _holding(space, self.fleet, scope, name, resources)
                    for scope, name, resources in _contenders(self.fleet)}
        finally:
            space.close()

    def _require(self) -> None:
        """A DAG the fleet file or the demo needs (its agents, its boundary, maintenance) and
        Airflow does not have is a failed outcome: a file that failed to import, say."""
        boundary = [f"boundary_{self.fleet.name}"] if self.fleet.deferred_scopes() else []
        needed = [*self._agents("source"), *self._agents("reactive"), *boundary, MAINTENANCE]
        for dag_id in needed:
            if dag_id not in self.dags:
                self.outcomes.append(Outcome(dag_id, "missing (not in the DAGs folder)", {}))

    def _record(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            outcome.expect_failure = EXPECT_FAILURE_TAG in self.dags.get(outcome.dag_id, set())
            self.say(outcome.line())
        self.outcomes += outcomes


def _contenders(fleet: Fleet) -> list[tuple[str, str, list[str]]]:
    """(deferred scope, agent, the resources of its config) for each agent that writes
    intents in a deferred scope: the example's drivers and their spots."""
    from agentpost.fleet.model import MarkOutput

    deferred = {s.name for s in fleet.deferred_scopes()}
    return [(o.scope, a.name, list(a.config.get("spots", []))) for a in fleet.agents
            for o in a.outputs if isinstance(o, MarkOutput) and o.scope in deferred
            and o.mark_type.value == "intent"]


def _holding(space: Any, fleet: Fleet, scope: str, name: str,
             resources: list[str]) -> str | None:
    me = fleet.agent(name).id
    return next((r for r in resources if any(a.agent_id == me for a in space.claims(scope, r))),
                None)


def load_demo_fleet(dags_folder: Path) -> Fleet:
    from agentpost.fleet import load_fleet

    return load_fleet(dags_folder / FLEET_FILE)
