"""On-insert rules (Courier §8): matching, the built-in notify action with ${env.*}
references, cooldown against bulk inserts, bounded rule loops, management through the API
and the CLI, and bad rules refused without changing anything."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentpost.protocol.errors import Conflict, InvalidInput, NotFound
from agentpost.store import EnvelopeStore
from test_cli import agentpost, assert_one_line_error


def _world(store: EnvelopeStore) -> None:
    """architect (coordinator) with two workers Jen and Bo; Courier's example names."""
    store.register_type("sprint.log", ["worker", "coordinator"], ["worker", "coordinator"])
    store.register_type("notification", ["coordinator", "worker"], ["coordinator", "worker"])
    store.create_workspace("coordinator", workspace_id="architect")
    store.create_workspace("worker", parent="architect", workspace_id="Jen")
    store.create_workspace("worker", parent="architect", workspace_id="Bo")


def _rule(**over: Any) -> dict[str, Any]:
    """Courier §8.2's example rule."""
    rule = {"id": "trig.jen.log.notify.architect",
            "when": {"type": "sprint.log", "from": "agents/Jen/outbox"},
            "do": [{"action": "notify", "to": "agents/architect/inbox",
                    "payload": {"title": "Jen posted sprint log", "ref": "${env.id}"}}],
            "limits": {"cooldownMs": 0}}
    rule.update(over)
    return rule


def _notifications(store: EnvelopeStore, ws: str) -> list[dict[str, Any]]:
    return [json.loads(e.content or "null") | {"_from": e.from_, "_reply": e.in_reply_to}
            for e in store.inbox(ws) if e.type == "notification"]


def test_rule_example_notifies_with_env_reference(store: EnvelopeStore) -> None:
    """§8.2: a sprint.log from Jen notifies the architect; ${env.id} names Jen's envelope."""
    _world(store)
    store.add_rule(_rule())
    sent = store.send("Jen", "architect", "sprint.log", "day 1")
    notes = _notifications(store, "architect")
    assert notes == [{"title": "Jen posted sprint log", "ref": sent.envelope_id,
                      "_from": "rule:trig.jen.log.notify.architect",
                      "_reply": sent.envelope_id}]
    env = next(e for e in store.inbox("architect") if e.type == "notification")
    assert env.origin == "system" and env.originator == "system"
    assert store.verify_trail().ok


@pytest.mark.parametrize(("when", "envelope", "fires"), [
    ({"type": "sprint.log"}, {}, True),
    ({"type": "other"}, {}, False),
    ({"from": "Bo"}, {}, False),
    ({"to": "agents/architect/inbox"}, {}, True),
    ({"to": "Bo"}, {}, False),
    ({"tags": ["sprint"]}, {"tags": ["sprint", "x"]}, True),
    ({"tags": ["sprint", "y"]}, {"tags": ["sprint", "x"]}, False),
    ({"headers": {"team": "b"}}, {"headers": {"team": "b", "k": 1}}, True),
    ({"headers": {"team": "b"}}, {"headers": {"team": "c"}}, False),
    ({"headers": {"team": "b"}}, {}, False),
])
def test_rule_predicate_matches_to_from_type_tags_headers(
        store: EnvelopeStore, when: dict[str, Any], envelope: dict[str, Any],
        fires: bool) -> None:
    """§8.1: the predicate matches on to, from, type, tags and simple header keys."""
    _world(store)
    store.add_rule(_rule(when={"from": "Jen", **when}))
    store.send("Jen", "architect", "sprint.log", "log", **envelope)
    assert len(_notifications(store, "architect")) == (1 if fires else 0)


def test_rule_cooldown_prevents_storm_from_bulk_insert(store: EnvelopeStore) -> None:
    """§8.2: a cooldown fires a rule once for a bulk insert of many matching envelopes."""
    _world(store)
    store.add_rule(_rule(limits={"cooldownMs": 60_000}))
    results = store.send_many([{"from": "Jen", "to": "architect", "type": "sprint.log",
                                "content": f"log {i}"} for i in range(50)])
    store.send("Jen", "architect", "sprint.log", "later, still inside the cooldown")
    notes = _notifications(store, "architect")
    assert len(notes) == 1
    assert notes[0]["ref"] == results[0].envelope_id


def test_rule_without_cooldown_fires_per_envelope(store: EnvelopeStore) -> None:
    _world(store)
    store.add_rule(_rule())
    store.send_many([{"from": "Jen", "to": "architect", "type": "sprint.log",
                      "content": f"log {i}"} for i in range(5)])
    assert len(_notifications(store, "architect")) == 5


def test_rule_loop_between_two_inboxes_is_bounded(store: EnvelopeStore) -> None:
    """§16 trigger notification loop (Jen→Architect, Architect→Jen): a notify caused by a
    notify is bounded by max_hops, so the loop stops."""
    _world(store)
    store.add_rule({"id": "a", "when": {"to": "architect"}, "max_hops": 3,
                    "do": [{"to": "Jen", "payload": {"n": "${env.id}"}}]})
    store.add_rule({"id": "b", "when": {"to": "Jen"}, "max_hops": 3,
                    "do": [{"to": "architect", "payload": {"n": "${env.id}"}}]})
    store.send("Jen", "architect", "sprint.log", "start")
    fired = store.trail(event="envelope_created")
    rule_sent = [e for e in fired if e.body["from"].startswith("rule:")]
    # hops 1 (a), 2 (b), 3 (a); an envelope at hop 3 fires nothing
    assert [e.body["from"] for e in rule_sent] == ["rule:a", "rule:b", "rule:a"]
    assert store.verify_trail().ok


def test_rule_references_headers_meta_and_fields(store: EnvelopeStore) -> None:
    _world(store)
    store.add_rule(_rule(do=[{"to": "architect", "payload": {
        "who": "${env.from}", "to": "${env.to}", "type": "${env.type}",
        "team": "${env.headers.team}", "corr": "${env.meta.corr}",
        "text": "quote \" and ${env.headers.evil}"}}]))
    store.send("Jen", "architect", "sprint.log", "x",
               headers={"team": "b", "evil": '"}, "x": {'}, meta={"corr": "c-42"})
    [note] = _notifications(store, "architect")
    assert note["who"] == "Jen" and note["to"] == "architect" and note["type"] == "sprint.log"
    assert note["team"] == "b" and note["corr"] == "c-42"
    assert note["text"] == 'quote " and "}, "x": {'


def test_rule_notify_to_sealed_target_is_recorded_undeliverable(store: EnvelopeStore) -> None:
    _world(store)
    store.add_rule(_rule(do=[{"to": "Bo", "payload": {}}]))
    store.transition("Bo", "closed")
    store.send("Jen", "architect", "sprint.log", "x")
    rejected = store.trail(event="envelope_rejected")
    assert [e.body["reason"] for e in rejected] == ["target_terminal"]


@pytest.mark.parametrize("bad", [
    {"when": {}, "do": []},
    {"id": "x", "do": []},
    {"id": "x", "do": [{"action": "route", "to": "architect"}]},
    {"id": "x", "do": [{"to": "architect", "payload": {"a": "${env.secret}"}}]},
    {"id": "has space", "do": [{"to": "architect"}]},
    {"id": "x", "do": [{"to": "architect"}], "limits": {"cooldownMs": -1}},
    {"id": "x", "do": [{"to": "architect"}], "surprise": 1},
    {"id": "x", "do": [{"to": "a/b/c"}]},
    "not a rule",
    # bounds (issue 10: no unbounded tags or payloads through the Python API)
    {"id": "x", "when": {"tags": [f"t{i}" for i in range(33)]}, "do": [{"to": "architect"}]},
    {"id": "x", "when": {"tags": ["t" * 101]}, "do": [{"to": "architect"}]},
    {"id": "x", "when": {"headers": {f"h{i}": 1 for i in range(65)}}, "do": [{"to": "architect"}]},
    {"id": "x", "when": {"headers": {"h": "v" * 5000}}, "do": [{"to": "architect"}]},
    {"id": "x", "when": {"type": "t" * 201}, "do": [{"to": "architect"}]},
    {"id": "x", "do": [{"to": "architect", "payload": {"blob": "x" * 70_000}}]},
    {"id": "x", "do": [{"to": "a" * 201}]},
    # strict types: a count is an integer, a flag a boolean, a name a string (not coerced)
    {"id": "x", "do": [{"to": "architect"}], "limits": {"cooldownMs": "100"}},
    {"id": "x", "do": [{"to": "architect"}], "limits": {"cooldownMs": True}},
    {"id": "x", "do": [{"to": "architect"}], "max_hops": "3"},
    {"id": "x", "do": [{"to": "architect"}], "max_hops": 3.0},
    {"id": "x", "do": [{"to": "architect"}], "enabled": "yes"},
    {"id": "x", "do": [{"to": "architect"}], "enabled": 0},
    {"id": b"x", "do": [{"to": "architect"}]},
    {"id": "x", "when": {"to": b"architect"}, "do": [{"to": "architect"}]},
])
def test_rule_malformed_is_refused_and_stores_nothing(store: EnvelopeStore, bad: Any) -> None:
    _world(store)
    with pytest.raises(InvalidInput):
        store.add_rule(bad)
    assert store.rules() == []


def test_rule_unknown_type_or_target_refused(store: EnvelopeStore) -> None:
    _world(store)
    with pytest.raises(NotFound, match="unknown envelope type"):
        store.add_rule(_rule(do=[{"to": "architect", "type": "nope"}]))
    with pytest.raises(NotFound, match="unknown workspace"):
        store.add_rule(_rule(do=[{"to": "ghost"}]))
    assert store.rules() == []


def test_rule_management_replace_disable_remove(store: EnvelopeStore) -> None:
    _world(store)
    store.add_rule(_rule())
    with pytest.raises(Conflict):
        store.add_rule(_rule())
    store.add_rule(_rule(when={"type": "other"}), replace=True)
    assert store.rule("trig.jen.log.notify.architect").when.type == "other"
    store.enable_rule("trig.jen.log.notify.architect", False)
    assert not store.rule("trig.jen.log.notify.architect").enabled
    store.add_rule(_rule(id="second"))
    store.enable_rule("second", False)
    store.send("Jen", "architect", "sprint.log", "x")
    assert _notifications(store, "architect") == []
    store.remove_rule("second")
    assert [r.id for r in store.rules()] == ["trig.jen.log.notify.architect"]
    with pytest.raises(NotFound):
        store.remove_rule("second")
    events = [e.event for e in store.trail(workspace_id="system") if e.event.startswith("rule_")]
    assert events == ["rule_defined", "rule_defined", "rule_disabled", "rule_defined",
                      "rule_disabled", "rule_removed"]


def test_rule_cli_add_list_disable_remove(dsn: str, store: EnvelopeStore,
                                          tmp_path: Any) -> None:
    _world(store)
    path = tmp_path / "rule.json"
    path.write_text(json.dumps(_rule()), encoding="utf-8")
    assert agentpost(dsn, "rule", "add", str(path)).code == 0
    listed = agentpost(dsn, "rule", "list").json()
    assert [r["id"] for r in listed] == ["trig.jen.log.notify.architect"]
    assert "disabled" in agentpost(dsn, "rule", "disable", listed[0]["id"]).out
    assert agentpost(dsn, "rule", "remove", listed[0]["id"]).code == 0
    assert_one_line_error(agentpost(dsn, "rule", "add", "-", stdin="{not json"), 2)
    assert_one_line_error(agentpost(dsn, "rule", "remove", "nope"), 2)
    assert agentpost(dsn, "rule", "list").json() == []
