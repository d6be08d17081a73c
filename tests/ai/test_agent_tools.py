"""The agent tools (agentpost.tools) against real Postgres: what each tool writes, with the
seat's identity and the run, and every refusal refused with its reason and nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.store import EnvelopeStore
from agentpost.tools import AgentTools, RunInfo, ToolRefused
from ai_support import SCOPES, agent, topology, written

RUN = RunInfo(by="airflow", ref="af:dag:agent:run-1",
              attrs={"dag_id": "dag", "task_id": "agent", "run_id": "run-1"})


@pytest.fixture
def seat(store: EnvelopeStore, dsn: str) -> Iterator[AgentTools]:
    """w1's seat, with the mark space and the agent `w1-agent`."""
    topology(store)
    with PostgresMarkSpace(dsn=dsn, scopes=SCOPES, space="tools") as space:
        yield AgentTools(store, workspace_id="w1", marks=space, agent=agent("w1-agent"),
                         run=RUN)


def refused(seat: AgentTools, dsn: str, name: str, args: dict[str, Any]) -> str:
    """The reason `name(args)` is refused; asserts nothing was written."""
    before = written(dsn)
    with pytest.raises(ToolRefused) as info:
        seat.call(name, args)
    assert written(dsn) == before, f"{name}({args}) wrote something"
    reason = info.value.reason
    assert "Traceback" not in reason and "psycopg" not in reason.lower()
    return reason


def test_send_envelope_records_the_seat_and_the_run(seat: AgentTools,
                                                    store: EnvelopeStore) -> None:
    sent = seat.call("send_envelope", {"to": "boss", "type": "query", "content": "ready?"},
                     call_id="call-1")
    assert sent["status"] == "acknowledged" and sent["to"] == "boss"
    envelope = store.get(sent["envelope_id"])
    assert envelope.sender == "w1" and envelope.content == "ready?"
    assert envelope.meta["tool_call"] == {"tool": "send_envelope", "call_id": "call-1",
                                          "run": RUN.model_dump(mode="json")}
    created = store.trail(envelope_id=sent["envelope_id"], event="envelope_created")
    assert [e.chain for e in created] == ["w1"]
    # the meta is covered by the trail: the entry hashes the envelope's extras
    assert created[0].body["row"]["fixed"]["extras_sha256"]
    assert store.verify_trail().ok


def test_json_content_is_sent_as_json(seat: AgentTools, store: EnvelopeStore) -> None:
    sent = seat.call("send_envelope", {"to": "boss", "type": "query",
                                       "content": {"ask": "status"}, "priority": "urgent"})
    envelope = store.get(sent["envelope_id"])
    assert envelope.payload.format == "json"
    assert json.loads(envelope.content) == {"ask": "status"}
    assert envelope.priority.value == "urgent"


@pytest.mark.parametrize(("args", "expected"), [
    ({"to": "w2", "type": "query", "content": "x"}, "may not send to 'w2'"),
    ({"to": "nobody", "type": "query", "content": "x"}, "unknown workspace"),
    ({"to": "boss", "type": "directive", "content": "x"}, "type 'directive' may not"),
    ({"to": "boss", "type": "no-such-type", "content": "x"}, "allowed types: query"),
    ({"to": "boss\n", "type": "query", "content": "x"}, "invalid arguments: to"),
    ({"to": "bo\x00ss", "type": "query", "content": "x"}, "invalid arguments: to"),
    ({"to": "boss", "type": "query", "content": "x" * 40_000}, "at most 32768"),
    ({"to": "boss", "type": "query", "content": "x", "priority": "now"}, "priority"),
    ({"to": "boss", "type": "query", "content": "x", "from": "boss"}, "from"),
    ({"to": "boss", "type": "query", "content": "x", "in_reply_to": "a\tb"}, "in_reply_to"),
])
def test_send_envelope_refusals_write_nothing(seat: AgentTools, dsn: str,
                                              args: dict[str, Any], expected: str) -> None:
    assert expected in refused(seat, dsn, "send_envelope", args)


def test_the_description_names_recipients_and_types(seat: AgentTools) -> None:
    specs = {spec.name: spec for spec in seat.specs()}
    assert "boss: query" in specs["send_envelope"].description
    assert "deploys" in specs["claim"].description and "deploy" in specs["claim"].description
    assert set(specs) == {"send_envelope", "read_inbox", "reply", "ack", "read_marks",
                          "write_mark", "claim", "submit_command"}
    schema = specs["send_envelope"].args.model_json_schema()
    assert schema["properties"]["priority"]["enum"] == ["normal", "urgent", "blocking"]
    assert schema["additionalProperties"] is False


def test_read_inbox_leases_so_two_runs_never_take_the_same_envelope(
        seat: AgentTools, store: EnvelopeStore) -> None:
    ids = {store.send("boss", "w1", "directive", f"job {i}").envelope_id for i in range(3)}
    other = AgentTools(store, workspace_id="w1",
                       run=RunInfo(by="airflow", ref="af:dag:agent:run-2"))
    first = seat.call("read_inbox", {"limit": 2})["envelopes"]
    second = other.call("read_inbox", {"limit": 10})["envelopes"]
    assert len(first) == 2 and len(second) == 1
    taken_first = {e["envelope_id"] for e in first}
    taken_second = {e["envelope_id"] for e in second}
    assert taken_first | taken_second == ids and not taken_first & taken_second
    assert other.call("read_inbox", {"limit": 10})["envelopes"] == []
    # the lease names the run on the trail
    leased = store.trail(envelope_id=first[0]["envelope_id"], event="envelope_leased")
    assert leased[0].body["holder"] == "af:dag:agent:run-1"
    # a run acks only what it took
    foreign = next(iter(taken_second))
    assert "not taken by this run" in refused(seat, store.dsn, "ack", {"envelope_id": foreign})
    assert seat.call("ack", {"envelope_id": first[0]["envelope_id"]})["acked"]
    consumed = store.trail(envelope_id=first[0]["envelope_id"], event="envelope_consumed")
    assert consumed[0].body["holder"] == "af:dag:agent:run-1"
    # what the run did not ack goes back to the inbox when it ends
    assert seat.release() == 1
    again = other.call("read_inbox", {"limit": 10})["envelopes"]
    assert [e["envelope_id"] for e in again] == [first[1]["envelope_id"]]
    assert again[0]["attempt"] == 2


@pytest.mark.parametrize("limit", [0, -1, 51, 10**12, "ten", None])
def test_read_inbox_refuses_bad_limits(seat: AgentTools, dsn: str, limit: Any) -> None:
    assert "limit" in refused(seat, dsn, "read_inbox", {"limit": limit})


def test_reply_answers_the_sender_with_the_one_allowed_type(seat: AgentTools,
                                                            store: EnvelopeStore,
                                                            dsn: str) -> None:
    asked = store.send("boss", "w1", "directive", "do it").envelope_id
    reply = seat.call("reply", {"envelope_id": asked, "content": "done"})
    envelope = store.get(reply["envelope_id"])
    assert (envelope.to, envelope.type, envelope.in_reply_to) == ("boss", "query", asked)
    assert envelope.meta["tool_call"]["tool"] == "reply"
    # an envelope of another inbox, or none at all, is not found (and nothing is written)
    elsewhere = store.send("boss", "w2", "directive", "not yours").envelope_id
    assert "not found" in refused(seat, dsn, "reply", {"envelope_id": elsewhere,
                                                       "content": "x"})
    assert "not found" in refused(seat, dsn, "reply", {"envelope_id": "nope",
                                                       "content": "x"})
    assert "allowed types: query" in refused(seat, dsn, "reply", {
        "envelope_id": asked, "content": "x", "type": "feedback"})


def test_marks_write_read_and_claim_as_the_agent(seat: AgentTools, dsn: str) -> None:
    observed = seat.call("write_mark", {"kind": "observation", "scope": "deploys",
                                        "topic": "api", "content": {"healthy": True}})
    seat.call("write_mark", {"kind": "need", "scope": "deploys", "question": "go live?"})
    marks = seat.call("read_marks", {"scope": "deploys"})["marks"]
    assert {m["kind"] for m in marks} == {"observation", "need"}
    mine = str(agent("w1-agent").id)
    assert all(m["agent_id"] == mine for m in marks)
    assert observed["mark_id"] in {m["mark_id"] for m in marks}
    claim = seat.call("claim", {"scope": "deploys", "resource": "api", "action": "deploy",
                                "confidence": 0.9})
    assert claim["verdict"] == "ALLOW" and claim["allowed"] and claim["intent_id"]
    # another agent on the same resource is answered, with the verdict and a reason
    other = AgentTools(seat.store, workspace_id="w2", marks=seat.marks, agent=agent("w2-agent"))
    lost = other.call("claim", {"scope": "deploys", "resource": "api", "action": "deploy",
                                "confidence": 0.1})
    assert lost["verdict"] in {"CONFLICT", "BLOCKED"} and not lost["allowed"]
    assert lost["reason"]


@pytest.mark.parametrize(("name", "args", "expected"), [
    ("claim", {"scope": "deploys", "resource": "api", "action": "delete"}, "not 'delete'"),
    ("claim", {"scope": "nowhere", "resource": "api", "action": "deploy"}, "nowhere"),
    ("claim", {"scope": "deploys", "resource": "api", "action": "deploy", "confidence": 7},
     "confidence"),
    ("write_mark", {"kind": "observation", "scope": "nowhere", "topic": "t", "content": "x"},
     "nowhere"),
    ("write_mark", {"kind": "observation", "scope": "deploys", "topic": "t"}, "content"),
    ("write_mark", {"kind": "intent", "scope": "deploys"}, "kind"),
    ("write_mark", {"kind": "warning", "scope": "deploys", "topic": "t\x07",
                    "reason": "r"}, "topic"),
    ("read_marks", {"scope": "nowhere"}, "nowhere"),
    ("no_such_tool", {}, "unknown tool"),
])
def test_mark_refusals_write_nothing(seat: AgentTools, dsn: str, name: str,
                                     args: dict[str, Any], expected: str) -> None:
    assert expected in refused(seat, dsn, name, args)


def test_submit_command_records_the_run_in_its_evidence(store: EnvelopeStore,
                                                        dsn: str) -> None:
    topology(store)
    boss = AgentTools(store, workspace_id="boss", run=RUN)
    view = boss.call("submit_command", {"key": "deploy-1", "action": "directive",
                                        "executor": "w1", "mutating": False,
                                        "args": {"version": "1.2"}}, call_id="c9")
    assert view["state"] == "authorized" and not view["duplicate"]
    from agentpost.store import CommandLedger

    with CommandLedger(store) as ledger:
        evidence = ledger.evidence(view["command_id"])
    assert evidence[0].body["context"]["tool_call"] == {
        "tool": "submit_command", "call_id": "c9", "run": RUN.model_dump(mode="json")}
    again = boss.call("submit_command", {"key": "deploy-1", "action": "directive",
                                         "executor": "w1", "mutating": False})
    assert again["duplicate"] and again["command_id"] == view["command_id"]
    mutating = boss.call("submit_command", {"key": "deploy-2", "action": "directive",
                                            "executor": "w1"})
    assert mutating["state"] == "confirmation_required"
    # refusals: an action the matrix does not allow, an unknown executor, hostile keys
    assert "not permitted" in refused(boss, dsn, "submit_command", {
        "key": "k", "action": "query", "executor": "w1"})
    assert "unknown workspace" in refused(boss, dsn, "submit_command", {
        "key": "k", "action": "directive", "executor": "ghost"})
    assert "key" in refused(boss, dsn, "submit_command", {"key": "a\nb", "action": "directive"})


def test_an_unknown_seat_is_refused(store: EnvelopeStore, dsn: str) -> None:
    topology(store)
    ghost = AgentTools(store, workspace_id="ghost")
    assert "NotFound" in refused(ghost, dsn, "send_envelope",
                                 {"to": "boss", "type": "query", "content": "x"})


def test_send_options_agree_with_the_routes_and_with_the_store(store: EnvelopeStore) -> None:
    """`EnvelopeStore.send_options`, the one query a send is checked with, answers for one
    recipient what the seat's full `routes()` answers, on a topology with every case the
    store's send check knows (a derived role and a type with required fields, delegation
    edges both ways and to a root, integrating, suspended and closed recipients, a send_once
    right, a revoked right); and each type it allows is one `send` accepts, each other one a
    send rejects."""
    from agentpost.protocol.errors import NotFound

    store.define_role("reviewer", inherits="worker")
    store.register_type("report", ["reviewer"], ["coordinator"], ["score"])
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("coordinator", workspace_id="root", delegation=True)
    for ws in ("w1", "w2", "int", "sus", "dead"):
        store.create_workspace("worker", parent="boss", workspace_id=ws)
    store.create_workspace("reviewer", parent="boss", workspace_id="rev")
    store.create_workspace("worker", parent="boss", workspace_id="lead", delegation=True)
    for ws in ("w3", "w4"):
        store.create_workspace("worker", parent="lead", workspace_id=ws)
    store.transition("int", "active")
    store.transition("int", "integrating")
    store.transition("sus", "suspended")
    store.transition("dead", "closed")
    store.grant_right("w2", "w1", "w2", "send_once")  # no matrix row: still nothing to send
    store.grant_right("boss", "w3", "boss", "send_once")  # one query, then none
    (right,) = [r for r in store.rights("w3") if r.target == "lead"]
    store.revoke_right(right.id, "boss")
    workspaces = ("boss", "root", "w1", "w2", "int", "sus", "dead", "rev", "lead", "w3", "w4")
    types = [t.name for t in store.envelope_types()]

    for sender in workspaces:
        routes = AgentTools(store, workspace_id=sender).routes()
        for to in (*workspaces, "nobody"):
            assert store.send_options(sender, to).types == tuple(routes.get(to, ())), (
                sender, to)
    assert store.send_options("w3", "boss").types == ("query",)
    assert store.send_options("w3", "lead").types == ()  # its right revoked
    assert store.send_options("w4", "lead").types == ("query",)  # the delegation edge up
    assert store.send_options("lead", "w3").types == ("directive", "feedback")
    assert store.send_options("rev", "boss").types == ("query", "report")
    assert store.send_options("rev", "boss", "report").required_fields == ("score",)
    assert store.send_options("rev", "boss", "query").required_fields == ()
    assert store.send_options("rev", "boss", "no-such-type").required_fields is None
    with pytest.raises(NotFound, match="unknown workspace 'ghost'"):
        store.send_options("ghost", "boss")

    for sender in workspaces:
        if sender == "dead":  # a closed sender: the store refuses it before any check
            continue
        for to in (*workspaces, "nobody"):
            for type_ in (*types, "no-such-type"):
                allowed = type_ in store.send_options(sender, to, type_).types
                content = {"score": 1} if type_ == "report" else "x"
                result = store.send(sender, to, type_, content,
                                    format="json" if isinstance(content, dict) else "markdown")
                assert result.accepted == allowed, (sender, to, type_, result.reason)
    assert store.send_options("w3", "boss").types == ()  # the send_once right was spent


def test_a_store_that_is_away_is_not_a_refusal(dsn: str) -> None:
    from agentpost.protocol.errors import StoreUnavailable

    with EnvelopeStore("postgresql://postgres@127.0.0.1:1/nowhere") as away:
        tools = AgentTools(away, workspace_id="w1")
        with pytest.raises(StoreUnavailable):
            tools.call("read_inbox", {"limit": 1})
