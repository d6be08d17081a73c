"""The `agentpost` console script, run as a subprocess against real databases.

Exit codes (agentpost.cli): 0 success, 1 a failed check or a rejected envelope, 2 bad usage or
input, 3 the store cannot be reached or is misconfigured. Every error is one line on stderr,
``agentpost: ...``, never a Python traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from agentpost.pg.server import libpq_dsn

SCRIPT = Path(sys.executable).parent / "agentpost"
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/x"
TIMEOUT = 120


@dataclass
class Run:
    args: list[str]
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


def run_cli(dsn: str, *args: str, stdin: str | None = None) -> Run:
    argv = [str(SCRIPT), "--dsn", dsn, *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    return Run(list(args), proc.returncode, proc.stdout, proc.stderr)


def assert_no_traceback(run: Run) -> None:
    assert "Traceback" not in run.err, f"agentpost {' '.join(run.args)} crashed:\n{run.err}"


def agentpost(dsn: str, *args: str, stdin: str | None = None) -> Run:
    run = run_cli(dsn, *args, stdin=stdin)
    assert_no_traceback(run)
    return run


def assert_one_line_error(run: Run, code: int) -> str:
    assert_no_traceback(run)
    assert run.code == code, f"exit {run.code}, not {code}: {run.err or run.out}"
    lines = run.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines}"
    assert lines[0].startswith("agentpost: ") and len(lines[0]) > len("agentpost: ")
    return lines[0]


def test_the_console_script_is_installed() -> None:
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK), SCRIPT


def test_migrate_applies_once_then_says_up_to_date(empty_dsn: str) -> None:
    first = agentpost(empty_dsn, "migrate")
    assert first.code == 0, first.err
    assert first.out.startswith("applied: ") and "0001_registry" in first.out
    second = agentpost(empty_dsn, "migrate")
    assert second.code == 0, second.err
    assert second.out.strip() == "already up to date"


def test_migrate_refuses_an_edited_migration_with_one_clean_line(dsn: str) -> None:
    """A migration file that changed after it was applied stops `migrate`: exit 3 (the store
    is misconfigured), one line on stderr, no traceback."""
    conn = psycopg2.connect(libpq_dsn(dsn))
    try:
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE agentpost.schema_migrations SET checksum = 'edited' "
                        "WHERE version = (SELECT min(version) FROM agentpost.schema_migrations)")
    finally:
        conn.close()
    line = assert_one_line_error(agentpost(dsn, "migrate"), 3)
    assert "changed" in line or "checksum" in line or "migration" in line, line


def test_a_session_from_the_command_line(dsn: str) -> None:
    run = agentpost(dsn, "workspace", "create", "coordinator", "--id", "lead")
    assert run.code == 0, run.err
    assert run.json()["id"] == "lead"
    run = agentpost(dsn, "workspace", "create", "worker", "--parent", "lead", "--id", "w1")
    assert run.code == 0, run.err
    assert run.json()["parent"] == "lead"
    sent = agentpost(dsn, "send", "--from", "lead", "--to", "w1", "--type", "directive", "hello")
    assert sent.code == 0, sent.err
    hello = sent.json()
    assert hello["status"] == "acknowledged" and hello["reason"] is None

    # a worker may not direct its coordinator: rejected, exit 1, the reason in the JSON
    refused = agentpost(dsn, "send", "--from", "w1", "--to", "lead", "--type", "directive",
                        "do as I say")
    assert refused.code == 1, refused.err
    assert refused.json()["status"] == "rejected"
    assert refused.json()["reason"] == "permission_denied"

    human = agentpost(dsn, "send", "--human", "alice", "--to", "w1", "--type", "feedback",
                      "from a person ✓")
    assert human.code == 0, human.err
    piped = agentpost(dsn, "send", "--from", "lead", "--to", "w1", "--type", "feedback",
                      "--priority", "urgent", "-", stdin="read from stdin\nsecond line")
    assert piped.code == 0 and piped.json()["status"] == "acknowledged", piped.err

    inbox = agentpost(dsn, "inbox", "w1", "--json")
    assert inbox.code == 0, inbox.err
    envelopes = inbox.json()
    assert isinstance(envelopes, list)
    by_id = {e["id"]: e for e in envelopes}
    assert set(by_id) == {hello["envelope_id"], human.json()["envelope_id"],
                          piped.json()["envelope_id"]}
    assert envelopes[0]["id"] == piped.json()["envelope_id"]  # urgent first
    from_human = by_id[human.json()["envelope_id"]]
    assert from_human["origin"] == "human" and from_human["originator"] == "alice"
    assert from_human["payload"]["content"] == "from a person ✓"
    assert by_id[hello["envelope_id"]]["origin"] == "agent"
    assert by_id[piped.json()["envelope_id"]]["payload"]["content"] == \
        "read from stdin\nsecond line"

    text = agentpost(dsn, "inbox", "w1")
    assert text.code == 0, text.err
    assert hello["envelope_id"] in text.out and "hello" in text.out
    assert "from a person ✓" in text.out

    trail = agentpost(dsn, "trail")
    assert trail.code == 0, trail.err
    for event in ("workspace_created", "envelope_created", "envelope_delivered",
                  "envelope_rejected"):
        assert event in trail.out, f"{event} missing from the trail output"
    assert "hello" not in trail.out, "the trail must not carry payloads"
    only = agentpost(dsn, "trail", "--envelope", hello["envelope_id"], "--json")
    assert only.code == 0
    assert [e["event"] for e in only.json()] == ["envelope_created", "envelope_delivered",
                                                "signal_emitted"]

    verify = agentpost(dsn, "verify")
    assert verify.code == 0, verify.err
    assert verify.out.startswith("trail verified: ")


UNKNOWN_WORKSPACE = {
    "send-from": ["send", "--from", "nobody", "--to", "w1", "--type", "directive", "hi"],
    "inbox": ["inbox", "nobody"],
    "create-parent": ["workspace", "create", "worker", "--parent", "nobody"],
    "create-role": ["workspace", "create", "no-such-role"],
    "transition": ["workspace", "transition", "nobody", "active"],
    "newline-id": ["inbox", "nobody\nsecond line"],
}
BAD_INPUT = {
    "unknown-state": ["workspace", "transition", "w1", "flying"],
    "bad-transition": ["workspace", "transition", "w1", "integrating"],
    "empty-id": ["workspace", "create", "worker", "--id", ""],
    "newline-id": ["workspace", "create", "worker", "--id", "a\nb"],
    "duplicate-id": ["workspace", "create", "worker", "--id", "lead"],
    "inbox-negative-limit": ["inbox", "w1", "--limit", "-1"],
    "trail-negative-limit": ["trail", "--limit", "-1"],
    "empty-human": ["send", "--human", "", "--to", "w1", "--type", "directive", "hi"],
    "reserved-id": ["workspace", "create", "worker", "--parent", "lead", "--id", "system"],
    "anchor-missing": ["verify", "--anchor", "/nonexistent/anchor.json"],
    "checkpoint-unwritable": ["checkpoint", "--out", "/nonexistent/dir/anchor.json"],
}
UNREACHABLE_COMMANDS = {
    "verify": ["verify"], "inbox": ["inbox", "w1"], "list": ["workspace", "list"],
    "send": ["send", "--from", "a", "--to", "b", "--type", "t", "x"], "recover": ["recover"],
    "migrate": ["migrate"], "demo": ["demo"], "checkpoint": ["checkpoint"],
}
BAD_USAGE = {
    "nothing": [],
    "unknown-command": ["frobnicate"],
    "no-sender": ["send", "--to", "w1", "--type", "directive", "hi"],
    "two-senders": ["send", "--from", "lead", "--human", "alice", "--to", "w1", "--type",
                    "directive", "x"],
    "bad-priority": ["send", "--from", "lead", "--to", "w1", "--type", "directive",
                     "--priority", "asap", "x"],
    "bad-limit": ["inbox", "w1", "--limit", "ten"],
    "no-action": ["workspace"],
    "bad-suite": ["bench", "nope"],
}


@pytest.fixture(scope="module")
def cli_dsn(module_dsn: str) -> str:
    """A store with lead and w1, for the error cases (which must not change it)."""
    for args in (("workspace", "create", "coordinator", "--id", "lead"),
                 ("workspace", "create", "worker", "--parent", "lead", "--id", "w1")):
        assert agentpost(module_dsn, *args).code == 0
    return module_dsn


@dataclass
class ErrorRuns:
    runs: dict[tuple[str, str], Run]
    rows_before: tuple[int, ...]
    rows_after: tuple[int, ...]

    def __getitem__(self, key: tuple[str, str]) -> Run:
        return self.runs[key]


@pytest.fixture(scope="module")
def error_runs(cli_dsn: str) -> ErrorRuns:
    """Every error case, run once and concurrently (each run is a fresh interpreter, which is
    most of its cost); the tests below look at one each."""
    jobs = {("unknown", k): (cli_dsn, v) for k, v in UNKNOWN_WORKSPACE.items()}
    jobs.update({("input", k): (cli_dsn, v) for k, v in BAD_INPUT.items()})
    jobs.update({("unreachable", k): (UNREACHABLE, v) for k, v in UNREACHABLE_COMMANDS.items()})
    jobs.update({("usage", k): (cli_dsn, v) for k, v in BAD_USAGE.items()})
    before = count_rows(cli_dsn)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {key: pool.submit(run_cli, dsn, *args) for key, (dsn, args) in jobs.items()}
        runs = {key: future.result() for key, future in futures.items()}
    return ErrorRuns(runs, before, count_rows(cli_dsn))


def count_rows(dsn: str) -> tuple[int, ...]:
    """Rows in every table a command could write to."""
    conn = psycopg2.connect(libpq_dsn(dsn))
    try:
        with conn.cursor() as cur:
            cur.execute("""SELECT (SELECT count(*) FROM agentpost.trail),
                                  (SELECT count(*) FROM agentpost.envelopes),
                                  (SELECT count(*) FROM agentpost.signals),
                                  (SELECT count(*) FROM agentpost.workspaces),
                                  (SELECT count(*) FROM agentpost.port_rights)""")
            return tuple(cur.fetchone())
    finally:
        conn.close()


@pytest.mark.parametrize("case", UNKNOWN_WORKSPACE)
def test_unknown_workspace_is_exit_2_with_one_clean_line(
        error_runs: ErrorRuns, case: str) -> None:
    run = error_runs[("unknown", case)]
    line = assert_one_line_error(run, 2)
    assert "unknown" in line
    assert run.out == ""


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_exit_2_with_one_clean_line(
        error_runs: ErrorRuns, case: str) -> None:
    line = assert_one_line_error(error_runs[("input", case)], 2)
    if case == "empty-human":
        assert "user" in line, f"the message should be about the user id: {line}"


def test_a_rejected_envelope_with_undecodable_bytes_is_exit_1(cli_dsn: str) -> None:
    # argv bytes that are not UTF-8 reach Python as lone surrogates
    proc = subprocess.run([os.fsencode(SCRIPT), b"--dsn", os.fsencode(cli_dsn), b"send",
                           b"--from", b"lead", b"--to", b"w1", b"--type", b"directive",
                           b"caf\xe9"], capture_output=True, timeout=TIMEOUT)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["status"] == "rejected" and result["reason"] == "invalid_structure"


@pytest.mark.parametrize("case", UNREACHABLE_COMMANDS)
def test_unreachable_store_is_exit_3_with_one_clean_line(
        error_runs: ErrorRuns, case: str) -> None:
    line = assert_one_line_error(error_runs[("unreachable", case)], 3)
    assert "127.0.0.1" in line or "reach" in line, line


@pytest.mark.parametrize("case", BAD_USAGE)
def test_bad_usage_is_exit_2_without_traceback(
        error_runs: ErrorRuns, case: str) -> None:
    run = error_runs[("usage", case)]
    assert_no_traceback(run)
    assert run.code == 2, (run.code, run.err)
    assert "usage:" in run.err and "error:" in run.err
    assert run.out == ""


def test_errors_change_nothing(error_runs: ErrorRuns) -> None:
    assert error_runs.rows_before == error_runs.rows_after, \
        "a command that failed wrote to the store"


def test_demo_runs_against_the_given_database(dsn: str) -> None:
    run = agentpost(dsn, "demo")
    assert run.code == 0, run.err
    assert "permission_denied" in run.out
    assert "== Verifying the trail" in run.out
    verified = json.loads(run.out.rstrip().splitlines()[-1])
    assert verified["ok"] is True and verified["entries"] > 0
    assert "envelope_delivered" in run.out
    # the demo wrote into this database, and what it wrote verifies
    check = agentpost(dsn, "verify")
    assert check.code == 0 and check.out.startswith("trail verified: ")
