"""Bad input against the envelope store, on a real database.

A hypothesis test drives random drafts (missing and extra fields, wrong types, unknown types,
roles and workspaces, oversized payloads, NUL bytes, lone surrogates, odd Unicode, SQL-looking
strings, bad priorities and rights) through ``send()`` and ``send_many()`` and checks, after
every call, the contract of the call (a SendResult per draft with a §9 reason, or a typed error
for an unusable sender) and the invariants of the stored rows, trail and signals.

The other tests pin down single behaviours: unknown, closed and unusable senders, odd Unicode
that must round-trip byte for byte, ids and names outside their alphabets, each malformed
envelope the fuzz made send() raise for, and garbage given to every other public method (a
typed error with a short one-line message, and nothing written).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import dbtools
from agentpost.protocol.errors import (
    AgentpostError,
    Conflict,
    Forbidden,
    InvalidInput,
    InvalidTransition,
    NotFound,
    StoreError,
)
from agentpost.protocol.models import Draft, SendResult, Status
from agentpost.store import EnvelopeStore
from dbtools import rows

MAX_CONTENT = 4096
REASONS = frozenset({"permission_denied", "no_send_right", "invalid_type", "invalid_structure",
                     "target_not_found", "target_terminal"})
ROW_STATUSES = frozenset({"rejected", "validated", "acknowledged"})
SQLISH = "'; DROP TABLE agentpost.envelopes; --"
ODD_TEXT = [
    "\u202eevil\u202c txt",            # right-to-left override
    "\u200f\u05e9\u05dc\u05d5\u05dd\u200e",  # RTL mark, Hebrew, LTR mark
    "👩‍👩‍👧‍👦 family",     # ZWJ emoji sequence
    "e\u0301 vs \u00e9",               # combining acute vs precomposed: must not be normalized
    "a\u0308\u0323\u0336",             # stacked combining marks
    "\ufeffBOM first",
    "line\u2028sep\u2029para",
    "\U0010ffff\uffff\ufffe",          # noncharacters are still valid text
    "𝕳𝖊𝖑𝖑𝖔 Ω≈ç√∫",
    "tab\there\r\nCRLF",
    "\\x00 is not a NUL",
    "%s %(x)s {0} $1 $$",
    "'\"\\`",
    SQLISH,
    "Robert'); DELETE FROM agentpost.trail;--",
]
SURROGATES = ["\ud800", "a\udfffb", "\udc80", "x\ud83d"]

# The fuzz topology: (workspace id, role, state). Every worker-ish workspace is a child of lead.
TOPOLOGY = [
    ("lead", "coordinator", "idle"),
    ("w1", "worker", "idle"),
    ("w2", "worker", "idle"),
    ("rev", "reviewer", "idle"),
    ("obs", "observer", "idle"),
    ("sus", "worker", "suspended"),
    ("integ", "worker", "integrating"),
    ("dead", "worker", "closed"),
]
LINEAGE = {"coordinator": {"coordinator"}, "worker": {"worker"},
           "reviewer": {"reviewer", "worker"}, "observer": {"observer"}}
ROLE_OF = {ws: role for ws, role, _ in TOPOLOGY}
STATE_OF = {ws: state for ws, _, state in TOPOLOGY}
# type -> (sender role, receiver role) rows, as registered below
MATRIX = {"directive": {("coordinator", "worker")}, "feedback": {("coordinator", "worker")},
          "query": {("worker", "coordinator")}, "report": {("reviewer", "coordinator")}}
REQUIRED = {"report": {"score"}}
SENDERS = ["lead", "w1", "w2", "rev", "obs", "sus", "integ"]


# -- database helpers ------------------------------------------------------------------------


def connect(dsn: str) -> Any:
    return dbtools.connect(dsn, "agentpost-test-reader")


def snapshot(conn: Any) -> dict[str, int]:
    """Row counts of everything a protocol step can write."""
    counts = rows(conn, """
        SELECT (SELECT count(*) FROM agentpost.envelopes),
               (SELECT count(*) FROM agentpost.trail),
               (SELECT count(*) FROM agentpost.signals),
               (SELECT count(*) FROM agentpost.port_rights),
               (SELECT count(*) FROM agentpost.workspaces),
               (SELECT count(*) FROM agentpost.roles),
               (SELECT count(*) FROM agentpost.envelope_types),
               (SELECT count(*) FROM agentpost.permissions)""")[0]
    names = ["envelopes", "trail", "signals", "port_rights", "workspaces", "roles", "types",
             "permissions"]
    return dict(zip(names, counts, strict=True))


def check_store_invariants(conn: Any) -> None:
    """What must hold of the stored rows whatever was sent."""
    statuses = dict(rows(conn, "SELECT status, count(*) FROM agentpost.envelopes GROUP BY 1"))
    assert set(statuses) <= ROW_STATUSES, statuses

    bad = rows(conn, """
        SELECT id, reason, content IS NOT NULL, attachments, rights
          FROM agentpost.envelopes
         WHERE status = 'rejected'
           AND (content IS NOT NULL OR attachments <> '[]' OR rights <> '[]'
                OR reason IS NULL OR NOT reason = ANY (%s))""", (sorted(REASONS),))
    assert bad == [], f"rejected rows with content or a reason outside §9: {bad}"
    bad = rows(conn, """
        SELECT id, status, reason FROM agentpost.envelopes
         WHERE status <> 'rejected' AND reason IS NOT NULL""")
    assert bad == [], f"accepted rows carrying a rejection reason: {bad}"

    n_rejected_rows = statuses.get("rejected", 0)
    (n_rejected_entries,), = rows(
        conn, "SELECT count(*) FROM agentpost.trail WHERE event = 'envelope_rejected'")
    assert n_rejected_entries == n_rejected_rows
    bad = rows(conn, """
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.status = 'rejected'
           AND (SELECT count(*) FROM agentpost.trail t
                 WHERE t.envelope_id = e.id AND t.event = 'envelope_rejected'
                   AND t.chain = e.sender) <> 1""")
    assert bad == [], f"rejected rows without exactly one envelope_rejected entry: {bad}"
    bad = rows(conn, """
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.status = 'rejected'
           AND NOT EXISTS (SELECT 1 FROM agentpost.signals s
                            WHERE s.signal = 'rejected' AND s.ref = e.id
                              AND s.workspace_id = e.sender AND s.reason = e.reason)""")
    assert bad == [], f"rejected rows whose sender got no rejected signal: {bad}"
    bad = rows(conn, """
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.status = 'rejected'
           AND EXISTS (SELECT 1 FROM agentpost.trail t
                        WHERE t.envelope_id = e.id
                          AND t.event IN ('envelope_created', 'envelope_delivered'))""")
    assert bad == [], f"rejected rows that were also created or delivered: {bad}"

    bad = rows(conn, """
        SELECT envelope_id, count(*) FROM agentpost.trail
         WHERE event = 'envelope_delivered' GROUP BY 1 HAVING count(*) > 1""")
    assert bad == [], f"envelopes delivered more than once: {bad}"
    bad = rows(conn, """
        SELECT ref, count(*) FROM agentpost.signals
         WHERE signal = 'acknowledged' GROUP BY 1 HAVING count(*) > 1""")
    assert bad == [], f"envelopes acknowledged more than once: {bad}"
    bad = rows(conn, """
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.status = 'acknowledged'
           AND ((SELECT count(*) FROM agentpost.trail t
                  WHERE t.envelope_id = e.id AND t.event = 'envelope_delivered') <> 1
                OR (SELECT count(*) FROM agentpost.signals s
                     WHERE s.signal = 'acknowledged' AND s.ref = e.id) <> 1)""")
    assert bad == [], f"acknowledged rows without one delivery entry and one ack: {bad}"
    bad = rows(conn, """
        SELECT e.id FROM agentpost.envelopes e
         WHERE e.status IN ('validated', 'acknowledged')
           AND NOT EXISTS (SELECT 1 FROM agentpost.trail t
                            WHERE t.envelope_id = e.id AND t.event = 'envelope_created')""")
    assert bad == [], f"accepted rows without an envelope_created entry: {bad}"


def short(value: object, width: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def assert_clean_error(exc: BaseException) -> None:
    """A typed agentpost error meant for a person: not a wrapped database failure, one short
    line without control characters."""
    kind = f"{type(exc).__module__}.{type(exc).__name__}"
    message = str(exc)
    if not isinstance(exc, AgentpostError):
        pytest.fail(f"untyped error {kind}: {short(message)}")
    if isinstance(exc, StoreError):
        pytest.fail(f"bad input surfaced as a store failure ({kind}): {short(message)}")
    if not message.strip():
        pytest.fail(f"{kind} with an empty message")
    if any(ord(c) < 0x20 or c == "\x7f" for c in message):
        pytest.fail(f"control characters in the message of {kind}: {short(message)}")
    if len(message) > 400:
        pytest.fail(f"a {len(message)}-character message ({kind}): {short(message)}")


def build_topology(store: EnvelopeStore) -> None:
    store.define_role("reviewer", inherits="worker")
    store.register_type("report", ["reviewer"], ["coordinator"], ["score"])
    for ws, role, _ in TOPOLOGY:
        store.create_workspace(role, parent=None if ws == "lead" else "lead",
                               workspace_id=ws)
    store.transition("sus", "suspended")
    store.transition("integ", "active")
    store.transition("integ", "integrating")
    store.transition("dead", "closed")


# -- the fuzz ----------------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()

clean_text = st.one_of(
    st.sampled_from(ODD_TEXT),
    st.text(max_size=40).filter(lambda s: "\x00" not in s),
)
with_nul = st.builds(lambda a, b: f"{a}\x00{b}", st.text(max_size=5), st.text(max_size=5))
with_surrogate = st.sampled_from(SURROGATES)
wrong_types = st.sampled_from([
    0, 5, -1, 3.5, float("nan"), True, b"lead", bytearray(b"w1"), ["w1"], ("w1",),
    {"id": "w1"}, {"w1"}, object(),
])


def bad_string(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(with_nul, with_surrogate, wrong_types,
                     st.integers(limit + 1, limit + 300).map(lambda n: "x" * n))


def senders() -> st.SearchStrategy[tuple[Any, str]]:
    """(sender, kind): kind is ok, unknown, closed or garbage. One in ten is unusable, so
    that most batches (where one unusable sender fails the lot) get through."""
    unusable = st.one_of(
        st.sampled_from(["nobody", "", "LEAD", "lead ", SQLISH, *ODD_TEXT[:4]])
        .map(lambda s: (s, "unknown")),
        st.just(("dead", "closed")),
        st.one_of(st.none(), bad_string(200)).map(lambda s: (s, "garbage")),
    )
    usable = st.sampled_from(SENDERS).map(lambda s: (s, "ok"))
    return st.sampled_from([False] * 9 + [True]).flatmap(
        lambda spoil: unusable if spoil else usable)


@dataclass
class Case:
    """One generated draft and what the store must make of it."""

    sender: Any
    sender_kind: str
    fields: dict[Any, Any]
    verdicts: dict[str, bool | None]
    use_model: bool = False

    def __repr__(self) -> str:
        fields = ", ".join(f"{k!r}: {short(v, 60)}" for k, v in self.fields.items())
        return f"Case({self.sender_kind} sender, {{{fields}}}, structure={self.structure})"

    @property
    def structure(self) -> bool | None:
        """True: well formed; False: malformed; None: either is acceptable."""
        values = list(self.verdicts.values())
        if False in values:
            return False
        if None in values:
            return None
        return True

    def draft(self) -> Any:
        fields = {k: v for k, v in self.fields.items() if v is not MISSING}
        if self.use_model and self.structure is True and self.sender_kind == "ok":
            try:
                return Draft.model_validate(fields)
            except ValueError:
                pass
        return fields


def content_verdict(content: Any, fmt: Any) -> bool | None:
    """The oracle for a payload: a string of valid text, at most MAX_CONTENT bytes of UTF-8,
    without NUL; with format json it must parse (a dict or list is serialized first)."""
    if fmt is MISSING:
        fmt = "markdown"
    if not isinstance(fmt, str):
        return None  # the format is malformed already; the draft fails either way
    if fmt == "json" and isinstance(content, dict | list):
        try:
            content = json.dumps(content)
        except (TypeError, ValueError):
            return False
    if not isinstance(content, str) or "\x00" in content:
        return False
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if size > MAX_CONTENT:
        return False
    if fmt == "json":
        try:
            parsed = json.loads(content)
        except RecursionError:
            return None  # valid JSON nested too deep for Python: either answer will do
        except ValueError:
            return False
        if isinstance(parsed, dict) and any(
                "\x00" in k or any(0xD800 <= ord(c) <= 0xDFFF for c in k) for k in parsed):
            return None  # keys that text columns cannot hold: store or reject, never raise
    return True


ids = [ws for ws, _, _ in TOPOLOGY]
#: (sender, to, type) that the matrix and the send rights allow
CHANNELS = [("lead", "w1", "directive"), ("lead", "w2", "feedback"), ("lead", "rev", "directive"),
            ("lead", "sus", "directive"), ("w1", "lead", "query"), ("w2", "lead", "query"),
            ("rev", "lead", "query"), ("rev", "lead", "report"), ("integ", "lead", "query"),
            ("sus", "lead", "query")]

# Each field has a pool of well-formed values and a pool of malformed ones (None, MISSING,
# wrong types, NUL bytes, lone surrogates, over-long strings, ...). A draft takes most fields
# from the good pools and corrupts a few, so that both rejections and deliveries are common.
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "to": st.one_of(st.sampled_from(ids),
                    st.sampled_from(["", "nobody", SQLISH, "W1", *ODD_TEXT[:3]])),
    "type": st.one_of(st.sampled_from(["directive", "feedback", "query", "report"]),
                      st.sampled_from(["", "unknown_type", "Directive", SQLISH, ODD_TEXT[0]])),
    "format": st.sampled_from(["markdown", "json", "yaml", "patch", "binary", "x-custom",
                               MISSING]),
    "priority": st.sampled_from(["normal", "normal", "urgent", "blocking", MISSING]),
    "attachments": st.one_of(
        st.lists(st.sampled_from(["ckpt-1", "https://example.org/a?b=c", *ODD_TEXT]),
                 max_size=3),
        st.sampled_from([MISSING, ("ckpt-7", "ckpt-8")])),
    "in_reply_to": st.one_of(st.sampled_from([None, MISSING, SQLISH, "", *ODD_TEXT[:3]]),
                             st.uuids().map(str)),
    "rights": st.one_of(st.sampled_from([MISSING, []]), st.lists(st.one_of(
        st.builds(lambda k, t: {"type": k, "target": t},
                  st.sampled_from(["send", "send_once"]), st.sampled_from([*ids, "nobody"])),
        st.builds(lambda k, t: (k, t),
                  st.sampled_from(["send", "send_once"]), st.sampled_from([*ids, "nobody"]))),
        min_size=1, max_size=3)),
    "extra": st.just({}),
}
BAD: dict[str, st.SearchStrategy[Any]] = {
    "to": st.one_of(st.sampled_from([None, MISSING]), bad_string(200)),
    "type": st.one_of(st.sampled_from([None, MISSING]), bad_string(100)),
    "format": st.one_of(st.sampled_from([None, ""]), bad_string(32)),
    "priority": st.sampled_from([
        None, "", "NORMAL", "high", "urgent\x00", 1, 0, True, b"normal", 2.5,
        ["normal"], {"p": "normal"}, {"normal"}]),
    "attachments": st.sampled_from([
        None, "ckpt-1", b"ckpt", 5, [1], [None], ["a\x00"], ["\ud800"], ["x" * 2049],
        ["a"] * 101, [["nested"]], {"ckpt-1": "x"}]),
    "in_reply_to": bad_string(200),
    "rights": st.sampled_from([
        None, "send", 5, {"type": "send", "target": "w1"}, [None], [5],
        [{"type": "receive", "target": "w1"}], [{"type": "send"}],
        [{"type": "send", "target": 5}], [{"type": "send", "target": "w1", "extra": 1}],
        [("send",)], [["send", "w1", "x"]], [{"type": "send", "target": "w\x00"}],
        [{"type": "send", "target": "lead"}] * 33,
        [{"type": ["send"], "target": "w1"}], [{"type": {"k": 1}, "target": "w1"}]]),
    "extra": st.sampled_from([
        {"id": "env-1"}, {"status": "acknowledged"}, {"origin": "human"},
        {"originator": "mallory"}, {"timestamp": "2020-01-01T00:00:00Z"}, {"zzz": 1},
        {1: "x"}, {None: 1}, {"\x00": 1}, {"\ud800": 1}, {SQLISH: 1}]),
}
GOOD_TEXT = st.one_of(
    clean_text,
    st.sampled_from(["x" * MAX_CONTENT, "€" * (MAX_CONTENT // 3), "é" * (MAX_CONTENT // 2)]),
)
GOOD_JSON = st.one_of(
    st.sampled_from(['{"score": 1}', '{"score": 2, "note": "ok"}', '[1, 2]', "3",
                     '{"a": "\\u0000"}', '"\\u202e"']),
    st.sampled_from([{"score": 1}, {"score": "x", "n": [1, 2]}, [1, "two"], {},
                     {"k": float("nan")}]),
    st.dictionaries(st.text(max_size=8).filter(lambda s: "\x00" not in s),
                    st.one_of(st.integers(), clean_text), max_size=3),
)
BAD_CONTENT = st.one_of(
    st.sampled_from([
        "x" * (MAX_CONTENT + 1), "é" * (MAX_CONTENT // 2 + 1), "😀" * (MAX_CONTENT // 4 + 1),
        "x" * (3 * MAX_CONTENT), None, MISSING, "{", "not json",
        # JSON that text columns or Python's parser cannot hold as it is
        '{"a\\u0000": 1}', '{"\\ud800": 1}', "[" * 1500 + "]" * 1500,
        # mappings json.dumps refuses
        {"\ud800": 1}, {"a\x00": 1}, {"k": b"bytes"}, {(1, 2): 3},
    ]),
    with_nul, with_surrogate, wrong_types,
)
FIELDS = list(GOOD)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    sender, kind = draw(senders())
    corrupt = draw(st.sampled_from([0, 0, 0, 0, 1, 1, 1, 2, 3]))
    broken = set(draw(st.permutations([*FIELDS, "content"]))[:corrupt])
    values = {name: draw(BAD[name] if name in broken else GOOD[name]) for name in FIELDS}
    if kind == "ok" and draw(st.booleans()):
        # an allowed channel, so that deliveries are common
        sender, to, etype = draw(st.sampled_from(CHANNELS))
        if "to" not in broken:
            values["to"] = to
        if "type" not in broken:
            values["type"] = etype
    if values["type"] == "report" and "format" not in broken and draw(st.booleans()):
        values["format"] = "json"
    if "content" in broken:
        content = draw(BAD_CONTENT)
    elif values["format"] == "json":
        content = draw(GOOD_JSON)
    else:
        content = draw(GOOD_TEXT)
    sender_key = draw(st.sampled_from(["from", "from", "sender"]))
    fields: dict[Any, Any] = {sender_key: sender, "content": content}
    fields.update({k: v for k, v in values.items() if k != "extra"})
    fields.update(values["extra"])
    verdicts: dict[str, bool | None] = {
        name: name not in broken for name in FIELDS if name != "attachments"}
    # a mapping of strings passes for a list of attachments (its keys): either is fine
    verdicts["attachments"] = (None if isinstance(values["attachments"], dict)
                               else "attachments" not in broken)
    verdicts["content"] = content_verdict(content, values["format"])
    return Case(sender=sender, sender_kind=kind, fields=fields, verdicts=verdicts,
                use_model=draw(st.booleans()))


def live_rights(conn: Any) -> set[tuple[str, str, str]]:
    return set(rows(conn, "SELECT holder, target, kind FROM agentpost.port_rights "
                          "WHERE state = 'live'"))


def db_reasons(case: Case, rights: set[tuple[str, str, str]]) -> set[str]:
    """Every §9 reason that applies to a draft whose sender, `to` and `type` are strings."""
    to, etype, sender = case.fields["to"], case.fields["type"], case.sender
    if not (isinstance(to, str) and isinstance(etype, str)) or case.verdicts["to"] is False \
            or case.verdicts["type"] is False:
        return set()
    reasons = set()
    if etype not in MATRIX:
        reasons.add("invalid_type")
    if to not in ROLE_OF:
        reasons.add("target_not_found")
        return reasons | {"no_send_right"}
    if STATE_OF[to] in ("integrating", "closed", "failed"):
        reasons.add("target_terminal")
    if etype in REQUIRED:
        keys: set[str] = set()
        content = case.fields["content"]
        if case.fields["format"] == "json":
            if isinstance(content, dict):
                keys = set(content)
            elif isinstance(content, str):
                try:
                    parsed = json.loads(content)
                except (ValueError, RecursionError):
                    parsed = None
                keys = set(parsed) if isinstance(parsed, dict) else set()
        if not REQUIRED[etype] <= keys:
            reasons.add("invalid_structure")
    rows_ = MATRIX.get(etype, set())
    if not any((s, r) in rows_ for s in LINEAGE[ROLE_OF[sender]]
               for r in LINEAGE[ROLE_OF[to]]):
        reasons.add("permission_denied")
    if not ((sender, to, "send") in rights or (sender, to, "send_once") in rights):
        reasons.add("no_send_right")
    transferred = case.fields["rights"]
    if case.verdicts["rights"] and transferred is not MISSING:
        for item in transferred:
            kind, target = (item["type"], item["target"]) if isinstance(item, dict) else item
            if (sender, target, kind) not in rights:
                reasons.add("no_send_right")
    return reasons


def expected_text(case: Case) -> str | None:
    content = case.fields["content"]
    if case.fields["format"] == "json" and isinstance(content, dict | list):
        return json.dumps(content)
    return content if isinstance(content, str) else None


def check_result(store: EnvelopeStore, conn: Any, case: Case, result: SendResult,
                 rights: set[tuple[str, str, str]]) -> None:
    assert isinstance(result, SendResult)
    assert result.status in (Status.ACKNOWLEDGED, Status.VALIDATED, Status.REJECTED)
    assert result.reason is None or result.reason in REASONS, result
    assert (result.status is Status.REJECTED) == (result.reason is not None), result
    (status, reason), = rows(conn, "SELECT status, reason FROM agentpost.envelopes "
                                   "WHERE id = %s", (result.envelope_id,))
    assert (status, reason) == (result.status.value, result.reason)

    structure = case.structure
    possible = db_reasons(case, rights)
    if structure is False:
        allowed = possible | {"invalid_structure"}
        assert result.status is Status.REJECTED and result.reason in allowed, (result, allowed)
        return
    if structure is None:
        possible = possible | {"invalid_structure"}
    if result.status is Status.REJECTED:
        assert result.reason in possible, (result, possible)
        return
    assert structure is None or not possible, (result, possible)
    if case.fields["to"] == "sus":
        assert result.status is Status.VALIDATED, "a suspended target must queue the envelope"
    if structure is True:
        env = store.get(result.envelope_id)
        assert env.content == expected_text(case)
        assert env.sender == case.sender and env.to == case.fields["to"]
        attachments = case.fields["attachments"]
        assert list(env.payload.attachments) == ([] if attachments is MISSING
                                                 else list(attachments))


def sender_error(batch: list[Case]) -> type[AgentpostError] | None:
    kinds = [c.sender_kind for c in batch]
    if "garbage" in kinds:
        return InvalidInput
    if "unknown" in kinds:
        return NotFound
    if "closed" in kinds:
        return Conflict
    return None


def test_random_drafts_keep_the_store_consistent(dsn: str) -> None:
    """send() and send_many() never raise for a bad envelope from a usable sender (it comes
    back rejected with a §9 reason), raise a typed error and write nothing for an unusable
    sender, and leave the rows, trail and signals consistent."""
    seen_ids: set[str] = set()
    with EnvelopeStore(dsn, max_content_bytes=MAX_CONTENT, ack_timeout=0.2) as store:
        build_topology(store)
        conn = connect(dsn)
        try:
            # No shrink phase: shrinking through a database is slow, and the tests further down
            # pin each failure found here to a minimal reproduction.
            @settings(max_examples=300, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=[HealthCheck.too_slow,
                                             HealthCheck.data_too_large])
            @given(use_many=st.booleans(), batch=st.lists(cases(), min_size=1, max_size=6))
            def run(use_many: bool, batch: list[Case]) -> None:
                if not use_many:
                    batch = batch[:1]
                rights = live_rights(conn)
                before = snapshot(conn)
                want_error = sender_error(batch)
                try:
                    if use_many:
                        results = store.send_many([c.draft() for c in batch])
                    else:
                        case = batch[0]
                        case.verdicts["extra"] = True  # send() takes no extra fields
                        optional = {k: v for k, v in case.fields.items()
                                    if k in ("format", "attachments", "in_reply_to",
                                             "priority", "rights") and v is not MISSING}
                        results = [store.send(
                            case.sender,
                            *(None if case.fields[k] is MISSING else case.fields[k]
                              for k in ("to", "type", "content")),
                            **optional)]
                except Exception as exc:
                    if not isinstance(exc, AgentpostError):
                        pytest.fail(f"{'send_many' if use_many else 'send'}() raised "
                                    f"{type(exc).__module__}.{type(exc).__name__}: "
                                    f"{short(str(exc))} for {short(batch, 2000)}")
                    assert want_error is not None, f"raised for usable senders: {exc!r}"
                    assert isinstance(exc, want_error), repr(exc)
                    assert_clean_error(exc)
                    assert snapshot(conn) == before, "a call that raised wrote something"
                    check_store_invariants(conn)
                    return
                assert want_error is None, f"expected {want_error.__name__}, got {results}"
                assert len(results) == len(batch)
                new_ids = {r.envelope_id for r in results}
                assert len(new_ids) == len(batch) and not new_ids & seen_ids, "id reused"
                seen_ids.update(new_ids)
                after = snapshot(conn)
                assert after["envelopes"] == before["envelopes"] + len(batch)
                for case, result in zip(batch, results, strict=True):
                    check_result(store, conn, case, result, rights)
                # read and consume the inboxes, so that blocking envelopes do not hold them
                # shut for the rest of the run (consuming one delivers what queued behind it)
                for ws in ("lead", "w1", "w2", "rev"):
                    for env in store.inbox(ws):
                        assert env.status is Status.ACKNOWLEDGED and env.to == ws
                        store.consume(ws, env.id)
                check_store_invariants(conn)

            run()
            check_store_invariants(conn)
            verification = store.verify_trail()
            assert verification.ok, verification
            assert len(seen_ids) > 50, "the fuzz hardly sent anything"
        finally:
            conn.close()


# -- one shared store for the single-behaviour tests --------------------------------------------
# (every test below either writes nothing, which it asserts, or writes under its own names)


@dataclass
class Shared:
    store: EnvelopeStore
    conn: Any
    context: dict[str, str]


@pytest.fixture(scope="module")
def shared(module_dsn: str) -> Iterator[Shared]:
    with EnvelopeStore(module_dsn, max_content_bytes=MAX_CONTENT, ack_timeout=0.2) as store:
        build_topology(store)
        sent = store.send("lead", "w1", "directive", "to be consumed")
        store.consume("w1", sent.envelope_id)
        pending = store.send("lead", "w1", "directive", "waiting in the inbox")
        rejected = store.send("w1", "lead", "directive", "workers do not direct")
        assert rejected.reason == "permission_denied"
        right = store.grant_right("lead", "w1", "w2")
        revoked = store.grant_right("lead", "w2", "w1")
        store.revoke_right(revoked, "lead", "test")
        context = {"env": pending.envelope_id, "consumed": sent.envelope_id,
                   "rejected": rejected.envelope_id, "right": right, "revoked": revoked}
        conn = connect(module_dsn)
        try:
            yield Shared(store, conn, context)
            check_store_invariants(conn)
            verification = store.verify_trail()
            assert verification.ok, verification
        finally:
            conn.close()


# -- senders that cannot send ------------------------------------------------------------------


@pytest.mark.parametrize("sender", ["nobody", "", SQLISH, "LEAD", "\u202elead", "x" * 200])
def test_unknown_sender_raises_not_found_and_writes_nothing(shared: Shared, sender: str) -> None:
    store, conn = shared.store, shared.conn
    before = snapshot(conn)
    with pytest.raises(NotFound) as info:
        store.send(sender, "w1", "directive", "hello")
    assert_clean_error(info.value)
    assert "sender" in str(info.value)
    assert snapshot(conn) == before

    # one unknown sender spoils the whole batch, also the drafts of good senders before it
    with pytest.raises(NotFound):
        store.send_many([
            {"from": "lead", "to": "w1", "type": "directive", "content": "fine"},
            {"from": "w1", "to": "lead", "type": "query", "content": "fine too"},
            {"from": sender, "to": "w1", "type": "directive", "content": "hello"},
        ])
    assert snapshot(conn) == before
    check_store_invariants(conn)


@pytest.mark.parametrize("final_state", ["closed", "failed"])
def test_sender_in_terminal_state_raises_conflict_and_writes_nothing(
        shared: Shared, final_state: str) -> None:
    store, conn = shared.store, shared.conn
    gone = f"gone-{final_state}"
    store.create_workspace("worker", parent="lead", workspace_id=gone)
    store.transition(gone, final_state)
    before = snapshot(conn)
    with pytest.raises(Conflict) as info:
        store.send(gone, "lead", "query", "still there?")
    assert_clean_error(info.value)
    assert gone in str(info.value)
    with pytest.raises(Conflict):
        store.send_many([{"from": "lead", "to": "w1", "type": "directive", "content": "a"},
                         {"from": gone, "to": "lead", "type": "query", "content": "b"}])
    assert snapshot(conn) == before
    assert store.signals(gone) == []
    check_store_invariants(conn)


@pytest.mark.parametrize("sender", [None, 5, b"lead", ["lead"], {"id": "lead"}, "le\x00ad",
                                    "le\ud800ad", "x" * 201])
def test_unusable_sender_value_raises_invalid_input_and_writes_nothing(
        shared: Shared, sender: Any) -> None:
    store, conn = shared.store, shared.conn
    before = snapshot(conn)
    with pytest.raises(InvalidInput) as info:
        store.send(sender, "w1", "directive", "hello")
    assert_clean_error(info.value)
    with pytest.raises(InvalidInput):
        store.send_many([{"from": "lead", "to": "w1", "type": "directive", "content": "a"},
                         {"from": sender, "to": "w1", "type": "directive", "content": "b"}])
    assert snapshot(conn) == before


# -- odd but valid text ------------------------------------------------------------------------


ROUND_TRIP = [
    *ODD_TEXT,
    "e\u0301",            # NFD: must not come back as NFC
    "\u00e9",             # NFC: must not come back as NFD
    "\u1e9b\u0323",       # a compatibility character with a combining mark
    "ﬁ ligature, ① circled, Ｆｕｌｌ ｗｉｄｔｈ",
    "\u0001\u001f\u007f\u0085 controls, but no NUL",
    "   leading and trailing whitespace \t\n",
    "",
    "x" * MAX_CONTENT,                 # exactly at the limit
    "€" * (MAX_CONTENT // 3),          # 4095 bytes of 3-byte characters
    "😀" * (MAX_CONTENT // 4),         # exactly 4096 bytes of 4-byte characters
]


@pytest.mark.parametrize("text", ROUND_TRIP, ids=lambda t: repr(t)[:30])
def test_odd_valid_unicode_is_stored_and_read_back_byte_identical(
        shared: Shared, text: str) -> None:
    store, conn = shared.store, shared.conn
    result = store.send("lead", "w2", "directive", text, attachments=[text[:2048]],
                        in_reply_to=text[:200] or None)
    assert result.status is Status.ACKNOWLEDGED, result
    env = store.get(result.envelope_id)
    assert env.content.encode("utf-8") == text.encode("utf-8")
    assert env.payload.attachments == (text[:2048],)
    assert env.in_reply_to == (text[:200] or None)
    inboxed = [e for e in store.inbox("w2") if e.id == result.envelope_id]
    assert [e.content.encode("utf-8") for e in inboxed] == [text.encode("utf-8")]
    store.consume("w2", result.envelope_id)
    (raw,), = rows(conn, "SELECT convert_to(content, 'UTF8') FROM agentpost.envelopes "
                         "WHERE id = %s", (result.envelope_id,))
    assert bytes(raw) == text.encode("utf-8")


@pytest.mark.parametrize("name", ["w\u0301", "\u202eabc", "👩‍👩‍👧", "'; --", "a b", "human:alice",
                                  "a:b", "-lead", ".x", "tab\there", "a\nb", SQLISH])
def test_workspace_ids_outside_the_id_alphabet_are_refused(shared: Shared, name: str) -> None:
    store, conn = shared.store, shared.conn
    before = snapshot(conn)
    with pytest.raises(InvalidInput) as info:
        store.create_workspace("worker", parent="lead", workspace_id=name)
    assert_clean_error(info.value)
    assert snapshot(conn) == before
    # and such a name is simply an unknown target
    assert store.send("lead", name, "directive", "x").reason == "target_not_found"


@pytest.mark.parametrize("name", ["system", "human:alice", "command:c-1", "saga:s-1",
                                  "rule:r-1"])
def test_workspace_ids_that_name_other_trail_chains_are_reserved(shared: Shared,
                                                                 name: str) -> None:
    """A workspace's id names its trail chain (WACP §10), so it may not be a chain the store
    writes for something else: `system` (registry changes), `human:<user>` (the human
    highway), `command:<id>`, `saga:<id>`, `rule:<id>`. The store refuses it with a typed error
    and so does the database function itself; neither writes anything."""
    store, conn = shared.store, shared.conn
    before = snapshot(conn)
    with pytest.raises(InvalidInput, match="reserved") as info:
        store.create_workspace("worker", parent="lead", workspace_id=name)
    assert_clean_error(info.value)
    with pytest.raises(psycopg2.Error, match="reserved") as raw:
        rows(conn, "SELECT agentpost.create_workspace(%s, 'worker', 'lead', 'system', false,"
                   " NULL)", (name,))
    assert raw.value.pgcode == "AP400"
    assert snapshot(conn) == before


@pytest.mark.parametrize("name", ["r\u0301le", "a b", "1role", "human:x", "-r", "r;--"])
def test_role_names_outside_the_name_alphabet_are_refused(shared: Shared, name: str) -> None:
    before = snapshot(shared.conn)
    with pytest.raises(InvalidInput) as info:
        shared.store.define_role(name, inherits="worker")
    assert_clean_error(info.value)
    assert snapshot(shared.conn) == before


def test_sql_looking_input_is_only_ever_text(shared: Shared) -> None:
    """Nothing in the input is ever executed: SQL in every free-text field is stored as is."""
    store, conn = shared.store, shared.conn
    texts = (SQLISH, "x'); DROP SCHEMA agentpost CASCADE; --", "$$; DROP TABLE x; $$",
             "1; SELECT pg_sleep(10)")
    for text in texts:
        ws = store.create_workspace("worker", parent="lead", originator="system")
        res = store.send("lead", ws.id, "directive", text, attachments=[text], in_reply_to=text,
                         format=text[:32])
        assert res.status is Status.ACKNOWLEDGED
        env = store.get(res.envelope_id)
        assert (env.content, env.payload.attachments, env.in_reply_to) == (text, (text,), text)
        assert store.send("lead", "w1", text, text).reason == "invalid_type"
        assert store.send("lead", text, "directive", text).reason == "target_not_found"
        assert store.trail(workspace_id=text) == []
    assert rows(conn, "SELECT to_regclass('agentpost.envelopes') IS NOT NULL")[0][0]
    check_store_invariants(conn)


# -- send() must answer a bad envelope with a rejection ---------------------------------------

# Each of these is a malformed (or merely unusual) envelope from a good sender. The send()
# docstring: "Never raises for a bad envelope: it comes back rejected with its §9 reason."
BAD_ENVELOPES: list[tuple[str, dict[str, Any], bool]] = [
    # (label, send() keyword arguments besides the sender, may it be accepted?)
    ("priority-list", {"priority": ["normal"]}, False),
    ("priority-dict", {"priority": {"p": "urgent"}}, False),
    ("priority-set", {"priority": {"normal"}}, False),
    ("right-type-list", {"rights": [{"type": ["send"], "target": "lead"}]}, False),
    ("right-type-dict", {"rights": [{"type": {"k": 1}, "target": "lead"}]}, False),
    ("right-pair-unhashable", {"rights": [[["send"], "lead"]]}, False),
    ("json-bytes-value", {"format": "json", "content": {"k": b"bytes"}}, False),
    ("json-tuple-key", {"format": "json", "content": {(1, 2): 3}}, False),
    ("json-set-value", {"format": "json", "content": {"k": {1, 2}}}, False),
    ("json-nul-key", {"format": "json", "content": '{"a\\u0000": 1}'}, True),
    ("json-surrogate-key", {"format": "json", "content": '{"\\ud800": 1}'}, True),
    ("json-surrogate-key-dict", {"format": "json", "content": {"\ud800": 1}}, True),
    ("json-deeply-nested", {"format": "json", "content": "[" * 1500 + "]" * 1500}, True),
]


@pytest.mark.parametrize(("label", "kwargs", "may_accept"), BAD_ENVELOPES,
                         ids=[b[0] for b in BAD_ENVELOPES])
def test_send_answers_a_bad_envelope_with_a_rejection_not_an_exception(
        shared: Shared, label: str, kwargs: dict[str, Any], may_accept: bool) -> None:
    store, conn = shared.store, shared.conn
    args = {"to": "w2", "type": "directive", "content": "hello", **kwargs}
    before = snapshot(conn)
    try:
        result = store.send("lead", args.pop("to"), args.pop("type"), args.pop("content"),
                            **args)
    except Exception as exc:
        pytest.fail(f"{label}: send() raised {type(exc).__module__}.{type(exc).__name__}: "
                    f"{short(str(exc))}")
    if result.status is Status.REJECTED:
        assert result.reason == "invalid_structure", result
    else:
        assert may_accept, f"a malformed envelope was accepted: {result}"
    assert snapshot(conn)["envelopes"] == before["envelopes"] + 1
    check_store_invariants(conn)


@pytest.mark.parametrize("drafts", [None, 5, 3.5, True])
def test_send_many_rejects_a_non_iterable_batch_with_a_typed_error(
        shared: Shared, drafts: Any) -> None:
    before = snapshot(shared.conn)
    with pytest.raises(AgentpostError) as info:
        shared.store.send_many(drafts)
    assert_clean_error(info.value)
    assert snapshot(shared.conn) == before


@pytest.mark.parametrize("draft", [None, 5, "lead->w1", b"x", ["lead", "w1"], {}])
def test_send_many_rejects_a_draft_that_is_not_a_mapping(shared: Shared, draft: Any) -> None:
    before = snapshot(shared.conn)
    good_draft = {"from": "lead", "to": "w1", "type": "directive", "content": "ok"}
    with pytest.raises(InvalidInput) as info:
        shared.store.send_many([good_draft, draft])
    assert_clean_error(info.value)
    assert snapshot(shared.conn) == before


def test_send_many_of_nothing_writes_nothing(shared: Shared) -> None:
    before = snapshot(shared.conn)
    assert shared.store.send_many([]) == []
    assert shared.store.send_many(iter(())) == []
    assert snapshot(shared.conn) == before


@pytest.mark.parametrize("field, value", [
    ("from", b"lead"), ("to", b"w1"), ("type", b"directive"), ("content", b"x"),
    ("format", b"markdown"), ("attachments", [b"a.txt"]), ("in_reply_to", b"e-1"),
    ("rights", [{"type": "send", "target": b"w1"}]),
])
def test_a_typed_draft_takes_text_not_bytes(field: str, value: Any) -> None:
    """The Draft model's text fields are strict: bytes are refused, not decoded (the mapping
    form records such a draft as invalid_structure, it never decodes either)."""
    fields = {"from": "lead", "to": "w1", "type": "directive", "content": "x"}
    assert Draft.model_validate(fields).sender == "lead"
    with pytest.raises(ValidationError, match="valid string"):
        Draft.model_validate({**fields, field: value})


# -- garbage to every other public method -------------------------------------------------------

LONG = "x" * 10_000
NUL = "lead\x00"
SURROGATE = "le\ud800ad"
GARBAGE_STRINGS = [None, 5, 3.5, b"lead", ["lead"], {"id": "lead"}, NUL, LONG, SURROGATE]
GARBAGE_OPTIONAL = [5, 3.5, b"lead", ["lead"], {"id": "lead"}, NUL, LONG, SURROGATE]

Call = Callable[[EnvelopeStore, dict[str, str]], Any]


def _garbage_cases() -> list[tuple[str, Call, type[AgentpostError]]]:
    cases: list[tuple[str, Call, type[AgentpostError]]] = []

    def add(label: str, call: Call, error: type[AgentpostError] = InvalidInput) -> None:
        cases.append((label, call, error))

    for i, g in enumerate(GARBAGE_STRINGS):
        add(f"create_workspace-role-{i}", lambda s, c, g=g: s.create_workspace(g))
        add(f"create_workspace-originator-{i}",
            lambda s, c, g=g: s.create_workspace("worker", originator=g))
        add(f"transition-workspace-{i}", lambda s, c, g=g: s.transition(g, "active"))
        add(f"transition-state-{i}", lambda s, c, g=g: s.transition("w1", g))
        add(f"consume-workspace-{i}", lambda s, c, g=g: s.consume(g, c["env"]))
        add(f"consume-envelope-{i}", lambda s, c, g=g: s.consume("w1", g))
        add(f"get-{i}", lambda s, c, g=g: s.get(g))
        add(f"inbox-{i}", lambda s, c, g=g: s.inbox(g))
        add(f"define_role-name-{i}", lambda s, c, g=g: s.define_role(g))
        add(f"register_type-name-{i}",
            lambda s, c, g=g: s.register_type(g, ["coordinator"], ["worker"]))
        add(f"register_type-sender-{i}",
            lambda s, c, g=g: s.register_type("t", [g], ["worker"]))
        add(f"register_type-receiver-{i}",
            lambda s, c, g=g: s.register_type("t", ["coordinator"], ["worker", g]))
        add(f"register_type-field-{i}",
            lambda s, c, g=g: s.register_type("t", ["coordinator"], ["worker"], [g]))
        add(f"grant_right-by-{i}", lambda s, c, g=g: s.grant_right(g, "w1", "w2"))
        add(f"grant_right-holder-{i}", lambda s, c, g=g: s.grant_right("lead", g, "w2"))
        add(f"grant_right-target-{i}", lambda s, c, g=g: s.grant_right("lead", "w1", g))
        add(f"grant_right-kind-{i}", lambda s, c, g=g: s.grant_right("lead", "w1", "w2", g))
        add(f"revoke_right-id-{i}", lambda s, c, g=g: s.revoke_right(g, "lead"))
        add(f"revoke_right-by-{i}", lambda s, c, g=g: s.revoke_right(c["right"], g))
        add(f"revoke_right-reason-{i}",
            lambda s, c, g=g: s.revoke_right(c["right"], "lead", g))
        add(f"deliver-{i}", lambda s, c, g=g: s.deliver(g))
    for i, g in enumerate(GARBAGE_OPTIONAL):
        add(f"create_workspace-parent-{i}",
            lambda s, c, g=g: s.create_workspace("worker", parent=g))
        add(f"create_workspace-id-{i}",
            lambda s, c, g=g: s.create_workspace("worker", workspace_id=g))
        add(f"create_workspace-caused_by-{i}",
            lambda s, c, g=g: s.create_workspace("worker", caused_by=g))
        add(f"define_role-inherits-{i}", lambda s, c, g=g: s.define_role("r2", inherits=g))
        add(f"trail-workspace-{i}", lambda s, c, g=g: s.trail(workspace_id=g))
        add(f"trail-envelope-{i}", lambda s, c, g=g: s.trail(envelope_id=g))
        add(f"trail-event-{i}", lambda s, c, g=g: s.trail(event=g))
    for i, g in enumerate([None, "five", NUL, SURROGATE, {}]):
        add(f"trail-after-{i}", lambda s, c, g=g: s.trail(after=g))
    for i, g in enumerate(["five", NUL, SURROGATE, True, -1]):
        add(f"trail-limit-{i}", lambda s, c, g=g: s.trail(limit=g))
    for i, g in enumerate(["5", -1, 2.5, True, [], NUL]):
        add(f"inbox-limit-{i}", lambda s, c, g=g: s.inbox("w1", limit=g))
    for i, g in enumerate(["yes", 1, None, "true"]):
        add(f"create_workspace-delegation-{i}",
            lambda s, c, g=g: s.create_workspace("worker", delegation=g))
    for i, g in enumerate([None, "coordinator", 5, b"coordinator", []]):
        add(f"register_type-senders-{i}", lambda s, c, g=g: s.register_type("t", g, ["worker"]))
    for i, g in enumerate(["score", 5, b"score"]):
        add(f"register_type-fields-{i}",
            lambda s, c, g=g: s.register_type("t", ["coordinator"], ["worker"], g))
    for i, g in enumerate(["", "   ", "a b", "human:x", "-x"]):
        add(f"create_workspace-bad-id-{i}",
            lambda s, c, g=g: s.create_workspace("worker", workspace_id=g))
        add(f"define_role-bad-name-{i}", lambda s, c, g=g: s.define_role(g))

    # well-formed ids of things that do not exist
    unknown = "no-such-thing"
    add("create_workspace-unknown-role", lambda s, c: s.create_workspace(unknown), NotFound)
    add("create_workspace-unknown-parent",
        lambda s, c: s.create_workspace("worker", parent=unknown), NotFound)
    add("create_workspace-unknown-cause",
        lambda s, c: s.create_workspace("worker", caused_by=unknown), NotFound)
    add("create_workspace-rejected-cause",
        lambda s, c: s.create_workspace("worker", caused_by=c["rejected"]), NotFound)
    add("transition-unknown", lambda s, c: s.transition(unknown, "active"), NotFound)
    add("consume-unknown-workspace", lambda s, c: s.consume(unknown, c["env"]), NotFound)
    add("consume-unknown-envelope", lambda s, c: s.consume("w1", unknown), NotFound)
    add("consume-someone-elses", lambda s, c: s.consume("w2", c["env"]), NotFound)
    add("get-unknown", lambda s, c: s.get(unknown), NotFound)
    add("get-sql", lambda s, c: s.get(SQLISH), NotFound)
    add("inbox-unknown", lambda s, c: s.inbox(unknown), NotFound)
    add("inbox-sql", lambda s, c: s.inbox(SQLISH), NotFound)
    add("define_role-unknown-parent", lambda s, c: s.define_role("r2", inherits=unknown),
        NotFound)
    add("register_type-unknown-sender",
        lambda s, c: s.register_type("t", [unknown], ["worker"]), NotFound)
    add("register_type-unknown-receiver",
        lambda s, c: s.register_type("t", ["coordinator"], [unknown]), NotFound)
    add("grant_right-unknown-by", lambda s, c: s.grant_right(unknown, "w1", "w2"), NotFound)
    add("grant_right-unknown-holder", lambda s, c: s.grant_right("lead", unknown, "w2"),
        NotFound)
    add("grant_right-unknown-target", lambda s, c: s.grant_right("lead", "w1", unknown),
        NotFound)
    add("revoke_right-unknown", lambda s, c: s.revoke_right("right-" + unknown, "lead"),
        NotFound)
    add("revoke_right-unknown-by", lambda s, c: s.revoke_right(c["right"], unknown), NotFound)
    add("deliver-unknown", lambda s, c: s.deliver(unknown), NotFound)
    add("deliver-sql", lambda s, c: s.deliver(SQLISH), NotFound)

    # well-formed requests the current state refuses
    add("create_workspace-duplicate",
        lambda s, c: s.create_workspace("worker", workspace_id="w1"), Conflict)
    add("create_workspace-under-closed",
        lambda s, c: s.create_workspace("worker", parent="dead"), Conflict)
    add("transition-not-allowed", lambda s, c: s.transition("w1", "integrating"),
        InvalidTransition)
    add("transition-out-of-closed", lambda s, c: s.transition("dead", "active"),
        InvalidTransition)
    add("consume-twice", lambda s, c: s.consume("w1", c["consumed"]), Conflict)
    add("consume-rejected", lambda s, c: s.consume("lead", c["rejected"]), Conflict)
    add("define_role-redefined", lambda s, c: s.define_role("worker", inherits="observer"),
        Conflict)
    add("register_type-changed-fields",
        lambda s, c: s.register_type("report", ["reviewer"], ["coordinator"], ["other"]),
        Conflict)
    add("grant_right-by-worker", lambda s, c: s.grant_right("w1", "w2", "lead"), Forbidden)
    add("revoke_right-by-worker", lambda s, c: s.revoke_right(c["right"], "w1"), Forbidden)
    add("revoke_right-twice", lambda s, c: s.revoke_right(c["revoked"], "lead"), Conflict)
    return cases


GARBAGE_CASES = _garbage_cases()


@pytest.mark.parametrize(("label", "call", "error"), GARBAGE_CASES,
                         ids=[c[0] for c in GARBAGE_CASES])
def test_public_methods_answer_garbage_with_a_typed_error(
        shared: Shared, label: str, call: Call, error: type[AgentpostError]) -> None:
    before = snapshot(shared.conn)
    try:
        outcome = call(shared.store, shared.context)
    except Exception as exc:
        assert_clean_error(exc)
        assert isinstance(exc, error), f"expected {error.__name__}, got {short(exc)}"
    else:
        pytest.fail(f"{label}: no error, returned {short(outcome)}")
    assert snapshot(shared.conn) == before, "a refused call wrote something"


def test_trail_filters_with_unknown_ids_find_nothing(shared: Shared) -> None:
    store = shared.store
    assert store.trail(workspace_id="no-such-workspace") == []
    assert store.trail(envelope_id=str(uuid.uuid4())) == []
    assert store.trail(event="no_such_event") == []
    assert store.trail(workspace_id=SQLISH + "-nope") == []
    assert len(store.trail(limit=5)) == 5
