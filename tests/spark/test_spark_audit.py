"""The Spark audit (`agentpost.spark.audit`) on a real store and a real local Spark: a
realistic trail, written by the store itself, audits clean; entries and rows tampered with on
purpose (some re-signed with the trail key, so only the check that looks for their kind of
damage can see them) are named by the check that should name them, and by no other.

One seeded database per module; each test works on its own copy of it (a database created
from it as a template), so a tamper never leaks into another test. An audit run costs Spark
seconds, so the localized tampers share one copy and one run (`tampered`): each is made in
chains and rows of its own, and each test asserts its finding, and that its ids appear in no
other check, from that one report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from agentpost.protocol.anchor import Checkpoint
from agentpost.protocol.trail import GENESIS, entry_hash, entry_mac
from agentpost.spark.audit import CHECKS, AuditReport, main, run_audit
from agentpost.spark.settings import SparkSettings
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.routes import RouteStore
from dbtools import create_database, drop_database, fresh_database, inbox_held, unique_db_name

#: Spark jobs over a seeded store: minutes for the module
pytestmark = pytest.mark.slow

KEY = os.environ["AGENTPOST_TRAIL_KEY"]
REPO = Path(__file__).resolve().parents[2]
JAR = "/usr/share/java/postgresql.jar"
ACTORS = ["prep", "post"]


@dataclass
class Seed:
    """The seeded database's name and the ids the tests tamper with."""

    name: str
    ids: dict[str, str] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    entries: int = 0


def _pair(store: EnvelopeStore, name: str) -> tuple[str, str]:
    a = store.create_workspace("agent", workspace_id=f"{name}-a").id
    b = store.create_workspace("agent", workspace_id=f"{name}-b").id
    store.grant_right(b, a, b)
    store.grant_right(a, b, a)
    return a, b


def _send(store: EnvelopeStore, a: str, b: str, text: str) -> str:
    result = store.send(a, b, "note", text)
    assert result.status == "acknowledged", result
    return result.envelope_id


def _seed(store: EnvelopeStore, ids: dict[str, str]) -> None:
    """Everything the store writes to the trail, through its own API."""
    store.define_role("agent")
    store.register_type("note", ["agent"], ["agent"])
    store.register_type("book", ["agent"], ["agent"])
    a, b = _pair(store, "main")
    for i in range(4):
        _send(store, a, b, f"hello {i}")
    _send(store, b, a, "reply")
    # leases: one acked (consumed), one nacked until it is dead-lettered, one nacked once
    leases = store.lease(b, max=3)
    store.ack(leases[0].token)
    store.nack(leases[1].token)
    dead = leases[2].envelope_id
    store.nack(leases[2].token)
    for _ in range(3):
        (lease,) = [x for x in store.lease(b, max=4) if x.envelope_id == dead]
        store.nack(lease.token)
    assert store.get(dead).status == "undeliverable"
    # a person requeues the dead letter: delivered once, dead-lettered once, back in the inbox
    store.requeue(b, dead, "alice")
    assert store.get(dead).status == "acknowledged"
    # queued, then sealed: undeliverable without a delivery; queued still: pending
    q, sealed = _pair(store, "queue")
    store.transition(sealed, "suspended")
    assert store.send(q, sealed, "note", "never").status == "validated"
    store.transition(sealed, "closed")
    held = store.create_workspace("agent", workspace_id="queue-held").id
    store.grant_right(held, q, held)
    store.transition(held, "suspended")
    assert store.send(q, held, "note", "later").status == "validated"
    # a rejection
    assert store.send(a, b, "no-such-type", "x").status == "rejected"
    # commands: executed, failed and compensated, one left at canonicalized
    with CommandLedger(store) as ledger:
        ok = ledger.run(a, "book-1", lambda: {"room": 1}, action="book", mutating=True,
                        auto_confirm="low-risk")
        bad = ledger.run(a, "book-2", _fails, action="book", mutating=True,
                         auto_confirm="low-risk")
        comp = ledger.compensate(bad.command_id, "undo-2", lambda: {"undone": True},
                                 auto_confirm="saga")
        idle = ledger.submit(a, "book-3", action="book", mutating=True)
        gone = ledger.run(a, "book-4", lambda: {"room": 4}, action="book", mutating=True,
                          auto_confirm="low-risk")
    assert (ok.state, bad.state, comp.state) == ("executed", "failed", "executed")
    ids.update(executed=ok.command_id, compensation=comp.command_id, idle=idle.command_id,
               gone_command=gone.command_id)
    # a route through two actors
    routes = RouteStore(store)
    routes.setup(ACTORS)
    routes.start({"id": "r-1", "route": {"actors": ACTORS, "current": 0},
                  "payload": {"text": "hi"}})
    ((lease, env),) = routes.receive("prep")
    routes.complete("prep", lease, env, {"prepped": True})
    # one pair of workspaces per tamper, so each tamper has chains and rows of its own
    for name in ("dup", "sig", "row", "hash", "del", "gone", "json"):
        x, y = _pair(store, name)
        ids[f"{name}-1"] = _send(store, x, y, f"{name} one")
        ids[f"{name}-2"] = _send(store, x, y, f"{name} two")
    # the channel to reorder: both created before either is delivered (queued while the
    # recipient is suspended), so each envelope's entries stay in id order when its
    # delivery entry is moved (an envelope's changes are in trail-id order, sql/0017)
    x, y = _pair(store, "order")
    store.transition(y, "suspended")
    for i, text in enumerate(("order one", "order two"), 1):
        result = store.send(x, y, "note", text)
        assert result.status == "validated", result
        ids[f"order-{i}"] = result.envelope_id
    store.transition(y, "active")
    (lease,) = store.lease("dup-b", max=1)
    store.ack(lease.token)
    # a lease and its ack beside another consumer of the inbox: on a consumer lane
    # (sql/0083), which lifecycle_entries counts as the inbox's and rows_exist names no row
    x, y = _pair(store, "lane")
    _send(store, x, y, "lane one")
    with inbox_held(store.dsn, y):
        (lease,) = store.lease(y, max=1)
        store.ack(lease.token)
    (acked,) = store.trail(envelope_id=lease.envelope_id, event="envelope_consumed")
    assert acked.chain.startswith("lane:"), acked
    ids["gone_right"] = store.grant_right("gone-b", "gone-a", "gone-b", kind="send_once")
    ids["gone_workspace"] = store.create_workspace("agent", workspace_id="gone-ws").id
    ids["tail"] = store.create_workspace("agent", workspace_id="tail").id
    store.transition("tail", "active")


def _fails() -> None:
    raise RuntimeError("no rooms")


@pytest.fixture(scope="module")
def seeded(pg_server: Any, template_db: str) -> Iterator[Seed]:
    seed = Seed(unique_db_name("audit"))
    dsn = create_database(pg_server.dsn, seed.name, template=template_db)
    try:
        with EnvelopeStore(dsn, ack_timeout=0.2) as store:
            _seed(store, seed.ids)
            verified = store.verify_trail()
            assert verified.ok, verified
            seed.entries = verified.entries
            seed.checkpoint = store.checkpoint()
        yield seed
    finally:
        drop_database(pg_server.dsn, seed.name)


def _copy(pg_server: Any, seed: Seed) -> Iterator[str]:
    yield from fresh_database(pg_server, "audit_copy", template=seed.name)


@pytest.fixture
def copy_dsn(pg_server: Any, seeded: Seed) -> Iterator[str]:
    yield from _copy(pg_server, seeded)


@pytest.fixture(scope="module")
def clean(pg_server: Any, seeded: Seed) -> Iterator[str]:
    yield from _copy(pg_server, seeded)


def _settings(dsn: str, key: str = KEY) -> SparkSettings:
    return SparkSettings(dsn=dsn, trail_key=key, jdbc_jar=JAR)


def _audit(spark: Any, dsn: str, key: str = KEY, **kw: Any) -> AuditReport:
    return run_audit(spark, _settings(dsn, key), **kw)


def _failing(report: AuditReport) -> dict[str, list[str]]:
    return {name: c.first for name, c in report.checks.items() if c.failed}


# -- tampering as an owner of the database could ---------------------------------------------

def _sql(dsn: str, query: str, params: Any = ()) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _entries(dsn: str, chain: str) -> list[dict[str, Any]]:
    rows = _sql(dsn, "SELECT id, chain_seq, event, envelope_id, record FROM agentpost.trail"
                     " WHERE chain = %s ORDER BY chain_seq", (chain,))
    return [{"id": r[0], "seq": r[1], "event": r[2], "envelope_id": r[3],
             "record": json.loads(r[4])} for r in rows]


def _rewrite(dsn: str, chain: str, records: dict[int, dict[str, Any]]) -> None:
    """Give the entries of `chain` at the sequence numbers of `records` those records (their
    columns to match) and sign the whole chain again with the trail key, as someone holding
    the key could: every hash, link and signature is valid afterwards."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            for seq, record in records.items():
                record = {**record, "seq": seq, "chain": chain}
                cur.execute("UPDATE agentpost.trail SET record = %s, event = %s,"
                            " envelope_id = %s,"
                            " at = to_timestamp(0) + %s * interval '1 microsecond'"
                            " WHERE chain = %s AND chain_seq = %s",
                            (json.dumps(record), record["event"], record["envelope_id"],
                             record["at_us"], chain, seq))
            _sign(cur, chain)
    finally:
        conn.close()


def _sign(cur: Any, chain: str) -> None:
    cur.execute("SELECT id, record FROM agentpost.trail WHERE chain = %s ORDER BY chain_seq",
                (chain,))
    prev = GENESIS
    for entry_id, record in cur.fetchall():
        digest = entry_hash(prev, record)
        cur.execute("UPDATE agentpost.trail SET prev_hash = %s, hash = %s, mac = %s"
                    " WHERE id = %s", (prev, digest, entry_mac(KEY.encode(), digest), entry_id))
        prev = digest


def _wrap_in_array(dsn: str, chain: str, entry_id: int) -> None:
    """The record of `entry_id` made `[record]`, and `chain` signed again."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE agentpost.trail SET record = '[' || record || ']' WHERE id = %s",
                        (entry_id,))
            _sign(cur, chain)
    finally:
        conn.close()


def _append(dsn: str, chain: str, record: dict[str, Any]) -> int:
    """A copy of `record` appended to `chain`, signed with the trail key; its entry id."""
    head = _entries(dsn, chain)[-1]
    seq = head["seq"] + 1
    (row,) = _sql(dsn, "INSERT INTO agentpost.trail (chain, chain_seq, event, envelope_id, at,"
                       " record, prev_hash, hash, mac) SELECT chain, %s, event, envelope_id,"
                       " at + interval '1 ms', record, hash, hash, mac FROM agentpost.trail"
                       " WHERE chain = %s AND chain_seq = %s RETURNING id",
                  (seq, chain, head["seq"]))
    at_us = _sql(dsn, "SELECT agentpost._us(at) FROM agentpost.trail WHERE id = %s",
                 (row[0],))[0][0]
    _rewrite(dsn, chain, {seq: {**record, "at_us": at_us}})
    return row[0]


def _find(dsn: str, chain: str, event: str, envelope_id: str | None = None) -> dict[str, Any]:
    return next(e for e in _entries(dsn, chain)
                if e["event"] == event and (envelope_id is None
                                            or e["envelope_id"] == envelope_id))


@dataclass
class Tampered:
    report: AuditReport
    expected: dict[str, dict[str, set[str]]]


def _tamper_all(dsn: str, ids: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """Every localized tamper, each in its own chains; what each should make each check name."""
    expected: dict[str, dict[str, set[str]]] = {}
    # reorder a channel: order-b's two deliveries swapped, the chain signed again
    first = _find(dsn, "order-b", "envelope_delivered", ids["order-1"])
    second = _find(dsn, "order-b", "envelope_delivered", ids["order-2"])
    _rewrite(dsn, "order-b", {first["seq"]: second["record"], second["seq"]: first["record"]})
    expected["reorder"] = {"channel_order": {ids["order-1"], ids["order-2"]}}
    # consumed twice: dup-b's envelope_consumed appended again, signed
    consumed = _find(dsn, "dup-b", "envelope_consumed")
    _append(dsn, "dup-b", consumed["record"])
    expected["consumed twice"] = {"acked_once": {consumed["envelope_id"]}}
    # acknowledged twice: sig-b's acknowledgment of sig-2 appended again, signed
    ack = next(e for e in _entries(dsn, "sig-b") if e["event"] == "signal_emitted"
               and e["envelope_id"] == ids["sig-2"])
    _append(dsn, "sig-b", ack["record"])
    expected["acknowledged twice"] = {"acked_once": {ids["sig-2"]}}
    # an illegal transition, signed: canonicalized→authz_pending made canonicalized→started
    chain = f"command:{ids['executed']}"
    step = _entries(dsn, chain)[1]
    record = step["record"]
    record["body"]["lifecycle"]["transition"] = "canonicalized→started"
    _rewrite(dsn, chain, {step["seq"]: record})
    expected["illegal transition"] = {"command_transitions": {ids["executed"]}}
    # a compensation aimed at a command that never executed, signed
    chain = f"command:{ids['compensation']}"
    changed = {}
    for e in _entries(dsn, chain):
        if e["record"]["body"].get("target_command_id"):
            e["record"]["body"]["target_command_id"] = ids["idle"]
            changed[e["seq"]] = e["record"]
    _rewrite(dsn, chain, changed)
    expected["compensation"] = {"compensation_target": {ids["compensation"]}}
    # an envelope row edited in the table
    _sql(dsn, "UPDATE agentpost.envelopes SET priority = 'urgent' WHERE id = %s",
         (ids["row-1"],))
    expected["row edit"] = {"envelope_rows": {ids["row-1"]}}
    # a payload digest edited in a creation entry's record, not signed again
    created = _find(dsn, "hash-a", "envelope_created", ids["hash-1"])
    _sql(dsn, "UPDATE agentpost.trail SET record = regexp_replace(record,"
              " '\"content_sha256\": \"[0-9a-f]{64}\"', '\"content_sha256\": \"' ||"
              " repeat('0', 64) || '\"') WHERE id = %s", (created["id"],))
    expected["payload digest"] = {"entry_hash": {str(created["id"])},
                                  "envelope_rows": {ids["hash-1"]}}
    # a record made a JSON array around the object it was, its chain signed again: every
    # hash, link and signature holds, but the record is no entry (its fields are not read)
    wrapped = _find(dsn, "json-a", "envelope_created", ids["json-2"])
    _wrap_in_array(dsn, "json-a", wrapped["id"])
    expected["array record"] = {"entry_columns": {str(wrapped["id"])}}
    # an entry deleted: del-1's delivery, in the middle of del-b's chain
    gone = _find(dsn, "del-b", "envelope_delivered", ids["del-1"])
    after = next(e for e in _entries(dsn, "del-b") if e["seq"] == gone["seq"] + 1)
    _sql(dsn, "DELETE FROM agentpost.trail WHERE id = %s", (gone["id"],))
    expected["deleted entry"] = {"chain_sequence": {str(after["id"])},
                                 "chain_links": {str(after["id"])},
                                 "delivered_once": {ids["del-1"]},
                                 "lifecycle_entries": {ids["del-1"]},
                                 "envelope_rows": {ids["del-1"]}}
    # rows deleted outright, triggers (foreign keys among them) off, as a superuser could:
    # an envelope waiting in gone-b's inbox, a command, the route, a workspace, a port right
    gone = {"envelopes": ids["gone-1"], "commands": ids["gone_command"], "routes": "r-1",
            "workspaces": ids["gone_workspace"], "port_rights": ids["gone_right"]}
    for table, row_id in gone.items():
        _sql(dsn, "SET session_replication_role = replica;"
                  f" DELETE FROM agentpost.{table} WHERE id = %s", (row_id,))
    expected["deleted rows"] = {"rows_exist": {
        f"envelope {ids['gone-1']}", f"command {ids['gone_command']}", "route r-1",
        f"workspace {ids['gone_workspace']}", f"port right {ids['gone_right']}"}}
    return expected


@pytest.fixture(scope="module")
def tampered(pg_server: Any, seeded: Seed, spark: Any) -> Iterator[Tampered]:
    for dsn in _copy(pg_server, seeded):
        expected = _tamper_all(dsn, seeded.ids)
        yield Tampered(_audit(spark, dsn), expected)


# -- a clean trail -----------------------------------------------------------------------------

def test_wacp_3_integrity_a_trail_the_store_wrote_audits_clean(
        spark: Any, seeded: Seed, clean: str) -> None:
    """WACP §3 Integrity, §4 rule 4, §7; SMCL "Allowed Transitions", "Compensation Model":
    a trail written by the store passes every check, each check saw data, and the audit
    counts the same entries as verify_trail()."""
    report = _audit(spark, clean, checkpoints=[seeded.checkpoint])
    assert report.ok, report.summary()
    assert list(report.checks) == list(CHECKS)
    assert report.entries == seeded.entries
    for name, check in report.checks.items():
        assert check.failed == 0 and check.first == [], name
        assert check.checked > 0, name
    assert report.checks["entry_hash"].checked == seeded.entries
    assert report.checks["delivered_once"].pending == 1  # queue-held's envelope
    assert report.checks["compensation_target"].checked == 1
    assert report.taken_at >= report.started_at


def test_wacp_3_integrity_a_wrong_key_fails_every_signature(
        spark: Any, seeded: Seed, clean: str) -> None:
    """WACP §3 Integrity: signatures are checked with the key (HMAC through its pads in
    Spark SQL): another key fails every entry's signature, first ids in id order, and
    nothing else."""
    report = _audit(spark, clean, key="not-the-trail-key", first=3)
    assert _failing(report).keys() == {"entry_signature"}
    lowest = _sql(clean, "SELECT id FROM agentpost.trail ORDER BY id LIMIT 3")
    assert report.checks["entry_signature"].failed == seeded.entries
    assert report.checks["entry_signature"].first == [str(r[0]) for r in lowest]


# -- tampered trails -----------------------------------------------------------------------------

def _assert_named(tampered: Tampered, case: str) -> None:
    """`case`'s ids are named by exactly the checks expected, first among that check's ids
    in the order of the report, and by no other check."""
    report = tampered.report
    mine = tampered.expected[case]
    ids = set().union(*mine.values())
    for name, check in report.checks.items():
        named = set(check.first) & ids
        assert named == mine.get(name, set()), (case, name, check.first)
    # and the report holds nothing that no tamper explains
    wanted: dict[str, set[str]] = {}
    for findings in tampered.expected.values():
        for name, found in findings.items():
            wanted.setdefault(name, set()).update(found)
    assert {n: set(c.first) for n, c in report.checks.items() if c.failed} == wanted
    assert not report.ok


def test_wacp_3_integrity_an_edited_payload_digest_fails_entry_hash(tampered: Tampered) -> None:
    """WACP §3 Integrity: a record edited in place (its payload digest) no longer hashes to
    its stored hash: entry_hash names the entry, and the row check the envelope."""
    _assert_named(tampered, "payload digest")


def test_wacp_3_integrity_a_record_that_is_no_object_fails_entry_columns(
        tampered: Tampered) -> None:
    """WACP §3 Integrity: a record wrapped in a JSON array, hashed and signed again by someone
    holding the key: its hash and signature hold, and entry_columns names the entry (its
    fields, read as an object's, no longer match the columns)."""
    _assert_named(tampered, "array record")


def test_wacp_3_integrity_a_deleted_entry_breaks_the_chain_and_the_rows(
        tampered: Tampered) -> None:
    """WACP §3 Integrity: an entry deleted from the middle of a chain: chain_sequence and
    chain_links name the entry after the gap; the envelope whose delivery it was is named by
    delivered_once, lifecycle_entries and envelope_rows."""
    _assert_named(tampered, "deleted entry")


def test_wacp_3_integrity_rows_deleted_outright_fail_rows_exist(tampered: Tampered) -> None:
    """WACP §3 Integrity: rows the trail names, deleted in the table (an envelope waiting in
    an inbox, a command, a route, a workspace, a port right): rows_exist names each by kind
    and id, and no other check sees them."""
    _assert_named(tampered, "deleted rows")
    assert tampered.report.checks["rows_exist"].failed == 5


def test_wacp_4_rule_4_a_reordered_channel_fails_only_channel_order(tampered: Tampered) -> None:
    """WACP §4 rule 4 / §5 "Channel ordering": the recipient's chain rewritten and signed
    again with its two deliveries swapped: every entry is valid, only channel_order sees it."""
    _assert_named(tampered, "reorder")
    assert tampered.report.checks["channel_order"].failed == 2


def test_an_envelope_consumed_twice_fails_acked_once(tampered: Tampered) -> None:
    """Courier §6.3 / WACP §7 (exactly-once processing): a second envelope_consumed entry,
    signed, is named by acked_once only."""
    _assert_named(tampered, "consumed twice")


def test_wacp_7_an_envelope_acknowledged_twice_fails_acked_once(tampered: Tampered) -> None:
    """WACP §7: one acknowledged signal per delivery; a second one, signed, is named by
    acked_once only."""
    _assert_named(tampered, "acknowledged twice")


def test_smcl_allowed_transitions_an_illegal_transition_fails(tampered: Tampered) -> None:
    """SMCL "Allowed Transitions": a state change that is not in the RFC's list (and breaks
    the chain of states), signed, is named by command_transitions only."""
    _assert_named(tampered, "illegal transition")


def test_smcl_compensation_model_a_compensation_of_a_command_never_executed_fails(
        tampered: Tampered) -> None:
    """SMCL "Compensation Model": a compensate command whose target never reached executed
    or failed, signed, is named by compensation_target only."""
    _assert_named(tampered, "compensation")


def test_wacp_3_integrity_an_edited_envelope_row_fails_envelope_rows(tampered: Tampered) -> None:
    """WACP §3 Integrity (rows under the trail): a row edited in the table (priority raised)
    differs from what its creation entry signed: envelope_rows names it."""
    _assert_named(tampered, "row edit")


def test_wacp_3_integrity_a_chain_cut_back_fails_the_checkpoint(
        spark: Any, seeded: Seed, copy_dsn: str) -> None:
    """WACP §3 Integrity (checkpoints): the last entry of a chain that no row needs, cut
    off: nothing inside the database shows it, the signed checkpoint does, with the message
    of protocol/anchor.py."""
    _sql(copy_dsn, "DELETE FROM agentpost.trail WHERE chain = 'tail' AND chain_seq ="
                   " (SELECT max(chain_seq) FROM agentpost.trail WHERE chain = 'tail')")
    report = _audit(spark, copy_dsn, checkpoints=[seeded.checkpoint.to_json()])
    assert _failing(report) == {"checkpoint_anchors": ["tail"]}
    (problem,) = report.checks["checkpoint_anchors"].problems
    assert problem.startswith("chain tail is shorter than the checkpoint of")
    assert report.checks["checkpoint_anchors"].checked == len(seeded.checkpoint.heads)


# -- the job's entry point: exit codes, the report --------------------------------------------

def _reports(dsn: str) -> list[tuple]:
    return _sql(dsn, "SELECT ok, entries, failed, report FROM agentpost.audit_reports"
                     " ORDER BY id")


def _forged(seed: Seed, path: Path) -> Path:
    data = seed.checkpoint.to_dict()
    chain = next(iter(data["chains"]))
    data["chains"][chain]["seq"] += 1
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("case", ["no dsn", "missing checkpoint", "forged checkpoint",
                                  "empty checkpoint dir", "report directory missing"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
        case: str, seeded: Seed, clean: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: a clear one-line error on stderr, exit 2, no traceback, no report file and
    no audit_reports row (nothing is read or written before the input is checked)."""
    report = tmp_path / "report.json"
    monkeypatch.delenv("AGENTPOST_DSN", raising=False)
    args = {"no dsn": [],
            "missing checkpoint": ["--checkpoint", str(tmp_path / "nope.json")],
            "forged checkpoint": ["--checkpoint", str(_forged(seeded, tmp_path / "f.json"))],
            "empty checkpoint dir": ["--checkpoint-dir", str(tmp_path)],
            "report directory missing": ["--report", str(tmp_path / "no" / "r.json")]}[case]
    if case != "no dsn":
        args = ["--dsn", clean, *args]
    if case != "report directory missing":
        args += ["--report", str(report)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentpost audit: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    expected = {"no dsn": "AGENTPOST_DSN", "missing checkpoint": "nope.json",
                "forged checkpoint": "signature does not verify",
                "empty checkpoint dir": "no checkpoint-*.json",
                "report directory missing": "does not exist"}[case]
    assert expected in err
    assert not report.exists()
    assert _reports(clean) == []
