"""Fleet files (docs/fleet.md): the model refuses bad files whole, in one line; applying one
is idempotent and refuses what the store cannot change in place, writing nothing; the CLI;
verdict notifications (sql/0040); the maintenance DAG's checkpoint files and verification.

Against the real store (a fresh database per test, tests/conftest.py).
"""

from __future__ import annotations

import copy
import importlib.util
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpost.cli import main
from agentpost.factories.boundary import run_boundary
from agentpost.factories.maintenance import (
    TrailCheckFailed,
    checkpoints,
    save_checkpoint,
    verify_against_latest,
)
from agentpost.fleet import (
    FleetConflict,
    FleetError,
    apply,
    fleet_from_dict,
    load_fleet,
    parse_fleet,
    plan,
)
from agentpost.fleet.model import MAX_DEPTH
from agentpost.marks import Action, Guard, Verdict
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.protocol.errors import AgentpostError, InvalidInput
from agentpost.store import EnvelopeStore
from dbtools import all_rows, connect, rows

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "fleet.yaml"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def trail_size(store: EnvelopeStore) -> int:
    return len(store.trail(limit=10_000))


# -- the model --------------------------------------------------------------------------------


def test_the_example_fleet_declares_agents_with_stable_ids() -> None:
    """Markspace §13.2/§14.1: each manifest becomes an Agent whose id is the same in every
    process (the boundary and the agents must agree on it), with its outputs, permissions and
    interval; kinds follow the schedule."""
    fleet, again = load_fleet(EXAMPLE), load_fleet(EXAMPLE)
    assert [a.kind for a in fleet.agents] == ["source"] * 4 + ["reactive"]
    driver = fleet.agent("driver-a")
    assert driver.id == again.agent("driver-a").id != fleet.agent("driver-b").id
    assert driver.manifest.schedule_interval == 300.0
    assert driver.can_write("parking", "intent") and not driver.can_write("weather", "intent")
    assert [o.mark_type.value for o in driver.manifest.outputs] == ["intent", "action"]
    assert fleet.agent_def("dispatcher").inboxes == ("dispatch",)
    assert [s.name for s in fleet.deferred_scopes()] == ["parking"]


def _edit(path: str, value: Any) -> dict[str, Any]:
    """The example with one entry replaced (path like 'agents.0.workspace'); None deletes."""
    data = copy.deepcopy(example())
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = data
    for part in parents:
        node = node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return data


BAD = [
    ("name", "bad name!", "name: String should match pattern"),
    ("version", 2, "version: Input should be 1"),
    ("agents.0.workspace", "drvier-a", "agents[0] (driver-a): unknown workspace 'drvier-a'"),
    ("agents.0.schedule", "5 parsecs", "agents[0] (driver-a).schedule: '5 parsecs' is not a"),
    ("agents.0.schedule", 0, "agents[0] (driver-a).schedule: a duration must be > 0"),
    ("agents.0.inputs", [{"scope": "parking", "mark_typ": "action"}],
     "agents[0] (driver-a).inputs[0].mark_typ: unknown field"),
    ("agents.0.outputs", [{"envelope": "parking.report"}],
     "agents[0] (driver-a).outputs[0].to: missing (required)"),
    ("agents.0.outputs", [{"envelope": "parking.reprot", "to": "dispatch"}],
     "output envelope type 'parking.reprot' is not defined"),
    ("agents.3.outputs", [{"envelope": "parking.report", "to": "dispatch"}],
     "may not send 'parking.report' from 'weather-station' to 'dispatch'"),
    ("agents.0.outputs", [{"scope": "weather", "mark_type": "observation"}],
     "may not write it (Markspace P54)"),
    ("agents.0.scopes", {"parkin": ["intent"]}, "unknown scope 'parkin'"),
    ("agents.0.callable", "not a ref", "agents[0] (driver-a).callable: String should match"),
    ("agents.4.inputs", [{"inbox": "nowhere"}], "input inbox 'nowhere' is not a workspace"),
    ("agents.4", {"name": "dispatcher", "schedule": "reactive"},
     "agents[4] (dispatcher): a reactive agent needs an inbox"),
    ("roles.1.inherits", "wroker", "roles[1] (driver): inherits unknown role 'wroker'"),
    ("roles.0.inherits", "dispatcher", "roles[0] (dispatcher): its inheritance is a cycle"),
    ("types.0.senders", ["drivers"], "types[0] (parking.report): unknown role 'drivers'"),
    ("types.0.senders", [], "types[0] (parking.report).senders: Tuple should have at least"),
    ("workspaces.1.role", "pilot", "workspaces[1] (driver-a): unknown role 'pilot'"),
    ("workspaces.1.parent", "hq", "workspaces[1] (driver-a): unknown parent workspace 'hq'"),
    ("workspaces.0.parent", "driver-a", "workspaces[0] (dispatch): its parents form a cycle"),
    ("workspaces.2.id", "driver-a", "workspaces[2] (driver-a): 'driver-a' is defined twice"),
    ("scopes.0.conflict_policy", "loudest", "scopes[0] (parking).conflict_policy: Input"),
    ("scopes.0.colour", "red", "scopes[0] (parking).colour: unknown field"),
    # strict types: a quoted "yes" is not true, a number not a name, 1.0 not the version 1
    ("workspaces.1.delegation", "yes", "workspaces[1] (driver-a).delegation: Input should "
     "be a valid boolean"),
    ("workspaces.1.delegation", 1, "workspaces[1] (driver-a).delegation: Input should be a"),
    ("version", True, "version: Input should be 1, the integer, not bool"),
    ("version", 1.0, "version: Input should be 1, the integer, not float"),
    ("agents.1.expected_activity", {"observation": "6"}, "agents[1] (driver-b)."
     "expected_activity.observation: Input should be a valid number"),
    ("agents.0.read_scopes", [1], "agents[0] (driver-a).read_scopes[0]: Input should be a "
     "valid string"),
    ("workspaces.1.id", b"driver-a", "workspaces[1].id: Input should be a valid string"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD, ids=[b[0] + "=" + str(b[1])
                                                                 for b in BAD])
def test_a_bad_fleet_file_is_refused_in_one_line_naming_the_entry(
        path: str, value: Any, expected: str) -> None:
    """A bad fleet file: a one-line error naming the file, the entry and the problem."""
    with pytest.raises(FleetError) as caught:
        fleet_from_dict(_edit(path, value), "fleet.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("fleet.yaml: ")
    assert expected in message, message


def test_yaml_problems_are_one_line_with_their_line(tmp_path: Path) -> None:
    """A duplicated key would silently drop half an entry in plain PyYAML: refused, with its
    line; so are broken YAML, a document that is not a mapping, and a missing file."""
    cases = {
        "name: a\nspace: b\nname: c\n": "dup.yaml: line 3: not valid YAML: duplicate key 'name'",
        "name: [a\n": "dup.yaml: line 2: not valid YAML:",
        "- a\n- b\n": "dup.yaml: a fleet file is a mapping",
    }
    for text, expected in cases.items():
        (tmp_path / "dup.yaml").write_text(text)
        with pytest.raises(FleetError) as caught:
            load_fleet(tmp_path / "dup.yaml")
        assert str(caught.value).startswith(str(tmp_path / expected)), str(caught.value)
    with pytest.raises(FleetError, match=r"missing\.yaml: cannot read it: No such file"):
        load_fleet(tmp_path / "missing.yaml")


def _nested(levels: int, *, block: bool = False) -> str:
    """A fleet file nesting `levels` mappings and lists deep: the top mapping, `agents`, the
    agent and its `config` are four, lists under the config the rest (flow style, or block
    style mappings with `block`)."""
    head = "name: deep\nagents:\n  - name: a\n    config:\n"
    inner = levels - 4
    if not block:
        return head + "      x: " + "[" * inner + "1" + "]" * inner + "\n"
    lines = [" " * (6 + 2 * i) + "k:" for i in range(inner)]
    return head + "\n".join(lines) + "\n" + " " * (6 + 2 * inner) + "v: 1\n"


def test_nesting_is_limited_to_max_depth_levels() -> None:
    """A fleet as deep as MAX_DEPTH is a fleet; one level more is a one-line FleetError
    naming the line where it goes too deep, whether read from YAML or given as a document."""
    assert parse_fleet(_nested(MAX_DEPTH)).agents[0].config
    assert fleet_from_dict(yaml.safe_load(_nested(MAX_DEPTH))).agents[0].config
    with pytest.raises(FleetError) as caught:
        parse_fleet(_nested(MAX_DEPTH + 1), "deep.yaml")
    assert str(caught.value) == f"deep.yaml: line 5: nested deeper than {MAX_DEPTH} levels"
    with pytest.raises(FleetError) as caught:
        fleet_from_dict(yaml.safe_load(_nested(MAX_DEPTH + 1)), "deep.yaml")
    assert str(caught.value) == f"deep.yaml: nested deeper than {MAX_DEPTH} levels"


def test_a_document_sharing_nodes_is_walked_once_per_depth() -> None:
    """YAML aliases share nodes: a document of 40 levels each naming the one below twice is
    2**40 paths but 40 nodes, checked at once (and refused at 70 levels)."""
    shared: Any = [1]
    for _ in range(40):
        shared = [shared, shared]
    assert fleet_from_dict({"name": "wide", "agents": [{"name": "a", "config": {"x": shared}}]})
    for _ in range(30):
        shared = [shared, shared]
    with pytest.raises(FleetError, match="nested deeper than"):
        fleet_from_dict({"name": "wide", "agents": [{"name": "a", "config": {"x": shared}}]})


@pytest.mark.parametrize("block", [False, True], ids=["flow", "block"])
def test_the_cli_refuses_a_file_5000_levels_deep_in_one_line(tmp_path: Path,
                                                              block: bool) -> None:
    """`fleet show` (and `fleet apply`, before any store is opened) on a file nested 5,000
    levels deep: exit 2 and one line on stderr, not a RecursionError's 3,000-line
    traceback. Runs the real CLI in a process of its own."""
    deep = tmp_path / "deep.yaml"
    deep.write_text(_nested(5_000, block=block))
    for args in (["fleet", "show", str(deep)],
                 ["--dsn", "postgresql://nowhere.invalid/x", "fleet", "apply", str(deep)]):
        done = subprocess.run([sys.executable, "-m", "agentpost.cli", *args],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stdout == ""
        assert re.fullmatch(rf"agentpost: {re.escape(str(deep))}: line \d+: nested deeper "
                            rf"than {MAX_DEPTH} levels\n", done.stderr), done.stderr[-2000:]


def test_the_cli_stops_quietly_when_its_reader_goes_away(tmp_path: Path) -> None:
    """`agentpost fleet show fleet.yaml | head` : the reader closes the pipe before the CLI has
    written; the CLI stops with 141 (a Unix tool killed by SIGPIPE) and says nothing, where
    it ended in a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "agentpost.cli", "fleet", "show",
                             str(EXAMPLE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    proc.stdout.close()
    try:
        stderr = proc.stderr.read().decode()
    finally:
        proc.stderr.close()
        proc.wait(timeout=120)
    assert (proc.returncode, stderr) == (141, "")


# -- applying ---------------------------------------------------------------------------------


def test_apply_creates_the_fleet_and_a_second_apply_changes_nothing(
        store: EnvelopeStore, dsn: str) -> None:
    """Applying is idempotent: the first apply defines roles, types (the matrix), workspaces
    and subscriptions; the second plans nothing and writes nothing (not one trail entry), and
    marks queued for a subscriber stay queued."""
    fleet = load_fleet(EXAMPLE)
    first = apply(store, fleet)
    kinds = [(c.kind, c.name) for c in first.changes]
    assert kinds[:3] == [("role", "dispatcher"), ("role", "driver"), ("role", "sensor")]
    assert ("workspace", "driver-c") in kinds and ("subscription", "driver-a") in kinds
    assert kinds.index(("workspace", "dispatch")) < kinds.index(("workspace", "driver-a"))
    assert {w.id: w.role for w in store.workspaces()}["driver-b"] == "driver"
    # the matrix as declared: a driver reports to the dispatcher, with the required field
    assert store.send("driver-a", "dispatch", "parking.report", {"spot": "s1"},
                      format="json").status != "rejected"
    refused = store.send("driver-a", "dispatch", "parking.report", {"lot": 1}, format="json")
    assert refused.status == "rejected"
    assert store.send("dispatch", "driver-a", "weather.update", "x").status == "rejected"

    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    try:
        space.write(fleet.agent("driver-b"), Action(scope="parking", resource="spot-1",
                                                    action="parked"))
        entries = trail_size(store)
        again = apply(store, fleet)
        assert again.empty and again.changes == []
        assert trail_size(store) == entries
        assert [m.resource for m in space.get_watched_marks(fleet.agent("driver-a"))] == [
            "spot-1"], "a second apply must not drop the subscriber's queue"
    finally:
        space.close()


def test_apply_records_every_agent_s_name_in_the_mark_space(store: EnvelopeStore,
                                                           dsn: str) -> None:
    """An apply records each agent's name in the fleet's mark space (sql/0076), so the pages
    name it before its first mark, also `weather-poller`, whose workspace is
    `weather-station`; the next apply plans nothing. A store whose fleet was applied before
    the names were recorded (rows missing) gets just those names on the next apply."""
    fleet = load_fleet(EXAMPLE)
    first = apply(store, fleet)
    assert "name agent weather-poller: id " + str(fleet.agent("weather-poller").id) in [
        str(c) for c in first.changes]
    everyone = {fleet.agent(a.name).id: a.name for a in fleet.agents}
    with PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space) as space:
        assert space.agent_names() == everyone
        assert plan(store, fleet).empty
        conn = connect(dsn)
        try:
            rows(conn, "DELETE FROM agentpost.mark_agents WHERE space = %s AND agent_id = %s",
                 (fleet.space, str(fleet.agent("weather-poller").id)))
        finally:
            conn.close()
        entries = trail_size(store)
        again = apply(store, fleet)
        assert [(c.kind, c.name, c.action) for c in again.changes] == [
            ("agent", "weather-poller", "name")]
        assert space.agent_names() == everyone and trail_size(store) == entries


def test_a_change_the_store_cannot_make_is_refused_and_nothing_is_written(
        store: EnvelopeStore) -> None:
    """A changed definition the store cannot change in place (a workspace's role, a role's
    parent, a type's required fields) is a clear error found before any write: the new role
    and workspace of the same file are not created."""
    apply(store, load_fleet(EXAMPLE))
    entries = trail_size(store)
    for path, value, words in [
        ("workspaces.4.role", "driver", "workspaces[4] (weather-station): the store's "
         "workspace 'weather-station' has role 'sensor', the file says 'driver'; a "
         "workspace's role cannot change in place"),
        ("workspaces.1.originator", "alice", "has originator 'system', the file says 'alice'"),
        ("roles.1.inherits", "observer", "roles[1] (driver): the store's role 'driver' "
         "inherits 'worker', the file says 'observer'"),
        ("types.0.required_fields", ["spot", "plate"], "types[0] (parking.report): the "
         "store's type 'parking.report' requires fields ['spot']"),
        ("workspaces.1.delegation", True, "has delegation False, the file says True"),
    ]:
        data = _edit(path, value)
        data["agents"] = [a for a in data["agents"] if a["name"] != "weather-poller"]
        data["roles"].append({"name": "valet", "inherits": "worker"})
        data["workspaces"].append({"id": "valet-1", "role": "valet"})
        changed = fleet_from_dict(data, "fleet.yaml")
        with pytest.raises(FleetConflict) as caught:
            apply(store, changed)
        assert str(caught.value).startswith("fleet.yaml: "), str(caught.value)
        assert words in str(caught.value), str(caught.value)
        assert "valet-1" not in {w.id for w in store.workspaces()}
        assert trail_size(store) == entries


def test_dry_run_and_additions(store: EnvelopeStore) -> None:
    """--dry-run plans and writes nothing; adding a sender to a type later adds just its
    permission rows; dropping an agent's watch patterns removes its subscription."""
    fleet = load_fleet(EXAMPLE)
    planned = apply(store, fleet, dry_run=True)
    assert len(planned.changes) > 10 and store.workspaces() == []
    apply(store, fleet)
    data = example()
    data["types"][1]["senders"].append("driver")
    del data["agents"][0]["inputs"]
    grown = plan(store, fleet_from_dict(data, "fleet.yaml"))
    assert [str(c) for c in grown.changes] == [
        "add permission weather.update: driver -> dispatcher",
        "remove subscription driver-a"]
    apply(store, fleet_from_dict(data, "fleet.yaml"))
    assert store.send("driver-a", "dispatch", "weather.update", "rain").status != "rejected"
    assert plan(store, fleet_from_dict(data, "fleet.yaml")).empty


def _grown(parent: str = "weather-station") -> dict[str, Any]:
    """The example plus a new role, type, workspace (under `parent`) and a subscribing agent:
    one change of each kind, in the order apply makes them."""
    data = example()
    data["roles"].append({"name": "valet", "inherits": "worker"})
    data["types"].append({"name": "valet.call", "senders": ["dispatcher"],
                          "receivers": ["valet"]})
    data["workspaces"].append({"id": "valet-1", "role": "valet", "parent": parent})
    data["agents"].append({"name": "valet", "workspace": "valet-1",
                           "scopes": {"parking": ["action"]},
                           "inputs": [{"scope": "parking", "mark_type": "intent"}]})
    return data


def test_a_new_workspace_under_a_sealed_one_is_refused_by_the_plan(
        store: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """A parent the store holds closed takes no children: the plan says so (a FleetConflict
    naming the entry; exit 2 and one line from the real CLI), before the file's new role and
    type are written. It used to pass the plan, write them, and fail on the workspace."""
    apply(store, load_fleet(EXAMPLE))
    store.transition("weather-station", "closed")
    before = all_rows(dsn)
    with pytest.raises(FleetConflict) as caught:
        apply(store, fleet_from_dict(_grown(), "fleet.yaml"))
    index = len(example()["workspaces"])
    assert str(caught.value) == (
        f"fleet.yaml: workspaces[{index}] (valet-1): the store's workspace 'weather-station', "
        "its parent, is closed and cannot have new children")
    assert all_rows(dsn) == before
    grown = tmp_path / "grown.yaml"
    grown.write_text(yaml.safe_dump(_grown()))
    done = subprocess.run([sys.executable, "-m", "agentpost.cli", "--dsn", dsn, "fleet",
                           "apply", str(grown)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "cannot have new children" in done.stderr
    assert all_rows(dsn) == before


@pytest.mark.parametrize("table, check", [
    ("workspaces", "id <> 'valet-1'"),
    ("mark_subscriptions", "agent_id <> '{valet}'::uuid"),
    ("mark_agents", "agent_id <> '{valet}'::uuid"),
], ids=["workspace", "subscription", "name"])
def test_an_apply_failing_in_the_database_writes_nothing(
        store: EnvelopeStore, dsn: str, table: str, check: str) -> None:
    """docs/fleet.md: a fleet is applied whole or not at all. The database refuses one of
    the planned changes (a constraint the plan knows nothing of, standing in for anything
    that changed since the plan): every change before it is rolled back with it, the trail
    included, and the store's rows are exactly what they were; once the database takes it,
    the same apply goes through."""
    apply(store, load_fleet(EXAMPLE))
    fleet = fleet_from_dict(_grown(), "fleet.yaml")
    conn = connect(dsn)
    rows(conn, f"ALTER TABLE agentpost.{table} ADD CONSTRAINT refuse_valet"
               f" CHECK ({check.format(valet=fleet.agent('valet').id)}) NOT VALID")
    before = all_rows(dsn)
    planned = [str(c) for c in plan(store, fleet).changes]
    assert [c.split(":")[0] for c in planned] == [
        "create role valet", "create type valet.call", "create workspace valet-1",
        "create subscription valet", "name agent valet"]
    with pytest.raises(AgentpostError, match="refuse_valet"):
        apply(store, fleet)
    assert all_rows(dsn) == before
    assert store.verify_trail().ok
    rows(conn, f"ALTER TABLE agentpost.{table} DROP CONSTRAINT refuse_valet")
    conn.close()
    assert [str(c) for c in apply(store, fleet).changes] == planned
    assert plan(store, fleet).empty and store.verify_trail().ok


def test_cli_fleet_show_and_apply(dsn: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`agentpost fleet show FILE` validates without a store; `fleet apply FILE` applies,
    says so, and the second time says nothing changed; a bad file exits 2 with one line
    naming the file and entry, before any store is opened."""
    assert main(["fleet", "show", str(EXAMPLE)]) == 0
    shown = capsys.readouterr().out
    assert "agent     driver-a (source, every 300 s)" in shown
    assert "agent     dispatcher (reactive, on its inbox dispatch)" in shown

    assert main(["--dsn", dsn, "fleet", "apply", "--dry-run", str(EXAMPLE)]) == 0
    assert "would apply (dry run)" in capsys.readouterr().out
    assert main(["--dsn", dsn, "fleet", "apply", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "  create workspace driver-a: role driver, parent dispatch" in out
    assert main(["--dsn", dsn, "fleet", "apply", str(EXAMPLE)]) == 0
    assert "nothing to change: the store already holds this fleet" in capsys.readouterr().out

    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("parent: dispatch", "parent: hq", 1))
    assert main(["--dsn", "postgresql://nowhere.invalid/x", "fleet", "apply", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (f"agentpost: {bad}: workspaces[1] (driver-a): unknown parent workspace "
                   "'hq'\n")


# -- boundaries and their notifications ----------------------------------------------------------


def test_a_boundary_notifies_each_verdict(store: EnvelopeStore, dsn: str) -> None:
    """sql/0040: every verdict a boundary stores is announced on `agentpost_verdict` (the
    agent's id) at its commit, so a waiting agent's sensor wakes; the boundary's summary
    names the winner (the highest confidence, Markspace P15) and each agent's verdict."""
    fleet = load_fleet(EXAMPLE)
    apply(store, fleet)
    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    listener = connect(dsn)
    try:
        guard = Guard(space)
        for name, confidence in (("driver-a", 0.5), ("driver-b", 0.9)):
            decision = guard.pre_action(fleet.agent(name), "parking", "spot-7", "park",
                                        confidence)
            assert decision.verdict is Verdict.BLOCKED
        rows(listener, "LISTEN agentpost_verdict")
        summary = run_boundary(dsn, fleet)
        heard = _notifications(listener, 2)
    finally:
        listener.close()
        space.close()
    assert summary == [{"scope": "parking", "resource": "spot-7", "winner": "driver-b",
                        "verdicts": {"driver-a": "blocked", "driver-b": "allow"}}]
    ids = {str(fleet.agent(n).id): n for n in ("driver-a", "driver-b")}
    assert sorted(ids[p] for p in heard) == ["driver-a", "driver-b"]
    assert run_boundary(dsn, fleet, resource="spot-7") == summary  # one resource: same verdicts
    with pytest.raises(InvalidInput, match="'weather' is not a deferred scope of fleet"):
        run_boundary(dsn, fleet, scopes=["weather"])


def _parking_driver() -> Any:
    """dags/agentpost_agents/parking.py's `park`, loaded from its file."""
    path = ROOT / "dags" / "agentpost_agents" / "parking.py"
    spec = importlib.util.spec_from_file_location("parking_example_driver", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.park


def test_parked_drivers_leave_no_intent_for_the_boundaries(store: EnvelopeStore,
                                                           dsn: str) -> None:
    """The parking example (dags/fleet.yaml): activations and boundaries alternate until
    every driver parks, the most confident first. A driver that parked withdraws its intents
    on the other spots, so none is left for a boundary: a later one has nothing to decide,
    where it used to record "no winner" on every spot an action held, until the intents'
    two-hour TTL (Markspace P14 counts every active intent, P39 lets none win there)."""
    from agentpost.factories.fleet import AgentContext

    fleet = load_fleet(EXAMPLE)
    apply(store, fleet)
    park = _parking_driver()
    drivers = ("driver-a", "driver-b", "driver-c")
    space = PostgresMarkSpace(dsn=dsn, scopes=fleet.scopes, space=fleet.space)
    try:
        def activate(name: str) -> dict[str, Any]:
            agent = fleet.agent(name)
            return park(AgentContext(store=store, space=space, guard=Guard(space),
                                     workspace_id=fleet.agent_def(name).workspace,
                                     manifest=agent.manifest, agent=agent,
                                     spec=fleet.agent_def(name), fleet=fleet))

        rounds = []
        for _ in range(4):
            rounds.append([activate(name) for name in drivers])
            rounds.append(run_boundary(dsn, fleet))
        assert rounds[-2] == [{"parked": "spot-3"}, {"parked": "spot-1"}, {"parked": "spot-2"}]
        assert rounds[-1] == []  # nothing pending: no boundary decides about parked drivers
        assert space.active_marks(scope="parking", mark_type="intent") == []
        assert [activate(name) for name in drivers] == rounds[-2]  # parking again is a no-op
        assert {spot: [a.agent_id for a in space.claims("parking", spot)]
                for spot in ("spot-1", "spot-2", "spot-3")} == {
            "spot-1": [fleet.agent("driver-b").id], "spot-2": [fleet.agent("driver-c").id],
            "spot-3": [fleet.agent("driver-a").id]}
    finally:
        space.close()


def _notifications(conn: Any, count: int, within: float = 10.0) -> list[str]:
    heard: list[str] = []
    deadline = time.monotonic() + within
    while len(heard) < count and time.monotonic() < deadline:
        select.select([conn], [], [], 0.5)
        conn.poll()
        heard += [n.payload for n in conn.notifies]
        conn.notifies.clear()
    return heard


# -- maintenance: checkpoints kept outside the database ------------------------------------------


def test_checkpoints_rotate_and_verification_catches_a_cut_trail(
        store: EnvelopeStore, pg: Any, tmp_path: Path) -> None:
    """The maintenance DAG's checkpoint files: the newest `keep` are kept; verification is
    since the newest (nothing was added after it: no entry to read), so a trail cut since
    (the last registry entry and its role deleted, which verify_trail() alone cannot see)
    fails in one line."""
    directory = tmp_path / "checkpoints"
    first = verify_against_latest(store, directory)
    assert first["anchor"] is None and first["entries"] == trail_size(store)
    for k in range(4):
        store.define_role(f"role-{k}")
        path = save_checkpoint(store.checkpoint(), directory, keep=3)
        time.sleep(0.002)
    assert [p.name for p in checkpoints(directory)][-1] == path.name
    assert len(checkpoints(directory)) == 3
    summary = verify_against_latest(store, directory)
    assert summary.pop("checkpoint")["chains"] == store.checkpoint().to_dict()["chains"]
    assert summary == {"ok": True, "entries": 0, "chains": 1, "anchor": path.name}
    rows(pg, "DELETE FROM agentpost.trail WHERE id = (SELECT id FROM agentpost.trail"
             " WHERE chain = 'system' ORDER BY chain_seq DESC LIMIT 1)")
    rows(pg, "DELETE FROM agentpost.roles WHERE name = 'role-3'")
    assert store.verify_trail().ok
    with pytest.raises(TrailCheckFailed) as caught:
        verify_against_latest(store, directory)
    assert "\n" not in str(caught.value) and "chain system" in str(caught.value)
    assert path.name in str(caught.value)


def test_the_documented_example_is_the_shipped_one() -> None:
    """docs/fleet.md's complete example parses, and each of its entries is the shipped
    dags/fleet.yaml's (the doc elides some drivers, it does not differ)."""
    text = (ROOT / "docs" / "fleet.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)
    fleet_from_dict(documented, "docs/fleet.md")
    shipped = example()
    for key, value in documented.items():
        if isinstance(value, list):
            assert all(entry in shipped[key] for entry in value), key
        else:
            assert shipped[key] == value, key
