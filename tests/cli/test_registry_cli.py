"""`agentpost role` and `agentpost type` from a shell, as subprocesses against a real store:
roles and envelope types set up without Python, idempotently, and the one-line errors and
exit codes of agentpost.cli (2 for bad input or a contradicting definition, 3 for the store).
"""

from __future__ import annotations

from dbtools import query
from test_cli import UNREACHABLE, agentpost, assert_one_line_error


def trail_events(dsn: str, event: str) -> int:
    return query(dsn, "SELECT count(*) FROM agentpost.trail WHERE event = %s", (event,))[0][0]


def test_define_a_role_and_list_it(dsn: str) -> None:
    first = agentpost(dsn, "role", "define", "reviewer", "--inherits", "worker")
    assert first.code == 0, first.err
    assert first.json() == {"name": "reviewer", "inherits": "worker", "created": True}
    again = agentpost(dsn, "role", "define", "reviewer", "--inherits", "worker")
    assert again.code == 0, again.err
    assert again.json()["created"] is False
    assert trail_events(dsn, "role_defined") == 1, "the repeat recorded a second definition"

    listed = agentpost(dsn, "role", "list", "--json")
    assert listed.code == 0, listed.err
    roles = {r["name"]: r for r in listed.json()}
    assert roles["reviewer"] == {"name": "reviewer", "inherits": "worker",
                                 "lineage": ["reviewer", "worker"], "builtin": False}
    assert roles["coordinator"]["builtin"] is True
    text = agentpost(dsn, "role", "list")
    assert "reviewer\tdefined\tlineage=reviewer>worker" in text.out.splitlines()


def test_a_contradicting_or_bad_role_is_refused(dsn: str) -> None:
    assert agentpost(dsn, "role", "define", "reviewer", "--inherits", "worker").code == 0
    line = assert_one_line_error(agentpost(dsn, "role", "define", "reviewer"), 2)
    assert "already exists" in line and "worker" in line
    line = assert_one_line_error(
        agentpost(dsn, "role", "define", "auditor", "--inherits", "nobody"), 2)
    assert "unknown role 'nobody'" in line
    assert_one_line_error(agentpost(dsn, "role", "define", "9lives"), 2)
    names = {r["name"] for r in agentpost(dsn, "role", "list", "--json").json()}
    assert "auditor" not in names and "9lives" not in names


def test_register_a_type_and_list_it(dsn: str) -> None:
    assert agentpost(dsn, "role", "define", "reviewer", "--inherits", "worker").code == 0
    run = agentpost(dsn, "type", "register", "review", "--senders", "coordinator, reviewer",
                    "--receivers", "reviewer", "--required-fields", "doc,deadline")
    assert run.code == 0, run.err
    assert run.json() == {"name": "review", "rows_added": 2}
    # again, fields in another order and one more sender row: only the new row is added
    run = agentpost(dsn, "type", "register", "review", "--senders", "coordinator,worker",
                    "--receivers", "reviewer", "--required-fields", "deadline,doc")
    assert run.code == 0, run.err
    assert run.json() == {"name": "review", "rows_added": 1}

    types = {t["name"]: t for t in agentpost(dsn, "type", "list", "--json").json()}
    assert types["review"] == {
        "name": "review", "required_fields": ["doc", "deadline"], "builtin": False,
        "permissions": [{"sender": "coordinator", "receiver": "reviewer"},
                        {"sender": "reviewer", "receiver": "reviewer"},
                        {"sender": "worker", "receiver": "reviewer"}]}
    assert types["directive"]["builtin"] is True
    text = agentpost(dsn, "type", "list").out.splitlines()
    assert ("review\tregistered\trequired=doc,deadline\t"
            "permits=coordinator>reviewer,reviewer>reviewer,worker>reviewer") in text

    # the registered type is usable at once: a coordinator sends a review to a reviewer
    agentpost(dsn, "workspace", "create", "coordinator", "--id", "lead")
    agentpost(dsn, "workspace", "create", "reviewer", "--parent", "lead", "--id", "r1")
    sent = agentpost(dsn, "send", "--from", "lead", "--to", "r1", "--type", "review",
                     "--format", "json",
                     '{"doc": "q3.md", "deadline": "friday"}')
    assert sent.code == 0 and sent.json()["status"] == "acknowledged", sent.out + sent.err


def test_bad_type_registrations_change_nothing(dsn: str) -> None:
    before = agentpost(dsn, "type", "list", "--json").json()
    cases = [
        (["--senders", "nobody", "--receivers", "worker"], "unknown role 'nobody'"),
        (["--senders", "coordinator,,worker", "--receivers", "worker"], "empty name"),
        (["--senders", "", "--receivers", "worker"], "at least one sender"),
    ]
    for extra, words in cases:
        line = assert_one_line_error(agentpost(dsn, "type", "register", "memo", *extra), 2)
        assert words in line, line
    assert agentpost(dsn, "type", "register", "memo", "--senders", "coordinator",
                     "--receivers", "worker", "--required-fields", "a").code == 0
    line = assert_one_line_error(
        agentpost(dsn, "type", "register", "memo", "--senders", "coordinator",
                  "--receivers", "worker", "--required-fields", "b"), 2)
    assert "already registered" in line
    after = [t for t in agentpost(dsn, "type", "list", "--json").json() if t["name"] != "memo"]
    assert after == before


def test_an_unreachable_store_exits_3() -> None:
    for args in (["role", "list"], ["type", "register", "x", "--senders", "a",
                                    "--receivers", "b"]):
        line = assert_one_line_error(agentpost(UNREACHABLE, *args), 3)
        assert "cannot reach" in line
