"""TVRS-style SMCL scenarios: one driver for the data files in tests/commands/scenarios/.

The file format is described at the top of tests/commands/scenarios/lifecycle.yaml. Every scenario
lists the evidence it expects; the coverage test reads those lists (which the scenario test
proves were written) and checks that the scenarios together take every allowed transition,
reach every state, protect every terminal state, emit every evidence type, hit every refusal
code and name the RFC's four test families.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from agentpost.marks import Action, Agent, MarkType, PostgresMarkSpace, Scope
from agentpost.protocol.commands import (
    ALLOWED,
    EVENTS,
    REQUIRED_CONTEXT,
    TERMINAL,
    CommandState,
    EvidenceType,
    Refusal,
)
from agentpost.protocol.errors import Conflict, Forbidden, InvalidInput, InvalidTransition
from agentpost.smcl import CommandLedger
from agentpost.store import EnvelopeStore
from smcl_support import race

S = CommandState
FAMILIES = {"invalid_transition_rejection", "ordering_invariants", "duplicate_handling",
            "evidence_emission"}
ERRORS: dict[str, type[Exception]] = {"invalid_input": InvalidInput, "forbidden": Forbidden,
                                      "conflict": Conflict}
APPROVER = Agent(name="scenario-approver", scopes={"commands": (MarkType.ACTION,)})
LEASE_TTL = 1.0
SCENARIOS: list[dict[str, Any]] = [
    scenario
    for path in sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))
    for scenario in yaml.safe_load(path.read_text(encoding="utf-8"))
]


class Crash(BaseException):
    """An executor dying mid-execution (not an Exception: the ledger must not record it)."""


class Run:
    """One scenario's named commands on a ledger."""

    def __init__(self, ledger: CommandLedger, store: EnvelopeStore, space: PostgresMarkSpace,
                 dsn: str) -> None:
        self.ledger, self.store, self.space, self.dsn = ledger, store, space, dsn
        self.ids: dict[str, str] = {}
        self.requests: dict[str, dict[str, Any]] = {}

    def request(self, name: str, step: dict[str, Any]) -> dict[str, Any]:
        request = {"workspace": step.get("as", "plan"), "idempotency_key": f"key-{name}",
                   "action": step.get("action", "book"), "mutating": step["mutating"],
                   "auto_confirm": step.get("auto_confirm"),
                   "executor": step.get("executor", "w1"), "args": step.get("args")}
        recover = step.get("recover")
        if recover:
            target = self.ledger.view(self.ids[recover["target"]])
            request.update(kind=recover["kind"], target_command_id=target.command_id,
                           workspace=target.workspace, action=target.action,
                           executor=target.executor, args=step.get("args", target.args))
        return request

    def submit(self, step: dict[str, Any]) -> None:
        name = step["submit"]
        self.requests[name] = self.request(name, step)
        self.ids[name] = self.ledger.submit(**self.requests[name]).command_id

    def run(self, step: dict[str, Any]) -> None:
        name = step["run"]
        self.requests[name] = self.request(name, step)
        view = self.ledger.run(fn=self.work(step), **self.requests[name])
        self.ids[name] = view.command_id

    def work(self, spec: dict[str, Any]) -> Any:
        def fn() -> Any:
            for inner in spec.get("during", ()):
                self.step(inner)
            if spec.get("crash"):
                raise Crash()
            if "raise" in spec:
                raise RuntimeError(spec["raise"])
            return spec.get("result")

        return fn

    def duplicate(self, step: dict[str, Any]) -> None:
        name = step["cmd"]
        view = self.ledger.submit(**self.requests[name])
        assert view.duplicate and view.command_id == self.ids[name]
        assert view.in_progress == step.get("in_progress", False), view

    def execute(self, step: dict[str, Any]) -> None:
        try:
            self.ledger.execute(self.ids[step["cmd"]], self.work(step["execute"]))
        except Crash:
            pass  # the executor "died": the command stays started until swept

    def confirm(self, step: dict[str, Any]) -> None:
        cid = self.ids[step["cmd"]]
        spec = step["confirm"]
        if spec["via"] == "need":
            action = self.space.write(APPROVER, Action(
                scope="commands", action="decide", result={"decision": spec["decision"]}))
            self.space.resolve(UUID(self.ledger.view(cid).need_id), action)
            self.ledger.confirm_from_need(cid)
        else:
            self.ledger.confirmation_envelope(spec.get("user", "alice"), cid, spec["decision"])

    def race(self, step: dict[str, Any]) -> None:
        name = step["race"]
        self.requests[name] = self.request(name, step)
        reports = race(self.dsn, self.requests[name], step["processes"], pause=1.0)
        assert len({r[1] for r in reports}) == 1 and sum(r[2] for r in reports) == 1
        self.ids[name] = reports[0][1]

    def act(self, step: dict[str, Any]) -> None:
        """The step's action proper (errors and refusals are checked by ``step``)."""
        cid = self.ids.get(step.get("cmd", ""))
        if "submit" in step:
            self.submit(step)
        elif "run" in step:
            self.run(step)
        elif "race" in step:
            self.race(step)
        elif "duplicate" in step:
            self.duplicate(step)
        elif "execute" in step:
            self.execute(step)
        elif "confirm" in step:
            self.confirm(step)
        elif "authorize" in step:
            self.ledger.authorize(cid)
        elif "request_confirmation" in step:
            self.ledger.request_confirmation(cid)
        elif "workspace" in step:
            self.store.transition(step["workspace"], step["to"])
        elif "permit" in step:
            self.store.register_type(**step["permit"])
        elif "sleep" in step:
            time.sleep(step["sleep"])
        elif "sweep" in step:
            swept = self.ledger.sweep_stuck()
            assert sorted(swept) == sorted(self.ids[n] for n in step["sweep"])
        elif "to" in step:
            self.ledger.transition(cid, step["to"], context=step.get("context"))
        # else: a step that only states what it expects

    def step(self, step: dict[str, Any]) -> None:
        name = step.get("cmd") or step.get("submit") or step.get("run") or step.get("race")
        before = self.ledger.view(self.ids[name]) if name in self.ids else None
        if "refused" in step:
            with pytest.raises(InvalidTransition, match=step["refused"]):
                self.act(step)
            # the refused transition did not happen (execute may have passed gates before it:
            # such a step states the state it expects)
            if "state" not in step:
                assert self.ledger.view(self.ids[name]).state is before.state
        elif "error" in step:
            with pytest.raises(ERRORS[step["error"]]):
                self.act(step)
            assert before is None or self.ledger.view(self.ids[name]) == before
        else:
            self.act(step)
        if "state" in step:
            view = self.ledger.view(self.ids[name])
            assert view.state.value == step["state"], (step, view)
            for field, value in step.get("view", {}).items():
                assert getattr(view, field) == value, (field, view)


@pytest.fixture
def run(store: EnvelopeStore, dsn: str) -> Iterator[Run]:
    store.define_role("planner", inherits="coordinator")
    store.register_type("book", ["coordinator"], ["worker"])
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("planner", parent="boss", workspace_id="plan")
    store.create_workspace("worker", parent="boss", workspace_id="w1")
    space = PostgresMarkSpace(dsn=dsn, scopes=[Scope(name="commands")], space="scenarios")
    try:
        with CommandLedger(store, marks=space, lease_ttl=LEASE_TTL) as ledger:
            yield Run(ledger, store, space, dsn)
    finally:
        space.close()


def _line(body: dict[str, Any]) -> str:
    life = body["lifecycle"]
    line = f"{life['evidence_type']} {life['transition'] or ''}".strip()
    return f"{line} !{body['refusal']}" if "refusal" in body else line


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_scenario(scenario: dict[str, Any], run: Run, store: EnvelopeStore) -> None:
    """RFC 'Conformance': implementations MUST pass the TVRS vectors (each scenario lists the
    evidence it must emit, in order, per command)."""
    for step in scenario["steps"]:
        run.step(step)
    for name, expected in scenario["evidence"].items():
        bodies = [e.body for e in run.ledger.evidence(run.ids[name])]
        assert [_line(b) for b in bodies] == expected, name
        for body in bodies:
            _check_fields(body)
    assert store.verify_trail().ok


def _check_fields(body: dict[str, Any]) -> None:
    """RFC 'Evidence Emission': the lifecycle block in every artifact, and on a state change
    the fields its decision needs (REQUIRED_CONTEXT) and the RFC event."""
    assert set(body["lifecycle"]) == {"command_id", "transition", "timestamp", "evidence_type"}
    if body["lifecycle"]["evidence_type"] == "state_change":
        a, b = body["lifecycle"]["transition"].split("→")
        assert body["event"] == EVENTS[S(b)]
        assert all(body.get(k) for k in REQUIRED_CONTEXT.get((S(a), S(b)), ())), body


def _lines() -> list[str]:
    return [line for s in SCENARIOS for lines in s["evidence"].values() for line in lines]


def _pairs(kind: str) -> set[tuple[S, S]]:
    out = set()
    for line in _lines():
        parts = line.split(" ")
        if parts[0] == kind and len(parts) > 1:
            a, b = parts[1].split("→")
            out.add((S(a), S(b)))
    return out


def _nested(steps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for step in steps:
        yield step
        yield from _nested(step.get("during", []) + step.get("execute", {}).get("during", []))


def test_scenarios_cover_the_machine() -> None:
    """RFC 'Conformance': the vectors exercise every state, transition, terminal condition and
    evidence emission requirement, in the four families the RFC lists."""
    taken = _pairs("state_change")
    assert taken == ALLOWED
    assert {b for _, b in taken} | {S.RECEIVED} == set(S)
    protected = {a for a, _ in _pairs("invalid_transition_attempt") | _pairs(
        "duplicate_delivery")}
    assert protected >= TERMINAL  # every terminal state refuses re-entry and replays
    assert {line.split(" ")[0] for line in _lines()} == {e.value for e in EvidenceType}
    refusals = {line.rsplit("!", 1)[1] for line in _lines() if "!" in line}
    # not_authorized is a second line of defence: only `authorized` may go to `started`, and
    # a command is authorized exactly when it is there, so the machine never reaches it
    assert refusals == {r.value for r in Refusal} - {Refusal.NOT_AUTHORIZED.value}
    assert {s["family"] for s in SCENARIOS} == FAMILIES
    assert all(s["evidence"] for s in SCENARIOS)
    steps = [step for s in SCENARIOS for step in _nested(s["steps"])]
    assert any("race" in step for step in steps) and any("sweep" in step for step in steps)
    assert any(step.get("in_progress") for step in steps)
    assert {s["recover"]["kind"] for s in steps if "recover" in s} == {
        "retry", "cancel", "reprocess", "compensate"}
