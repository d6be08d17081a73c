"""`agentpost route setup|start|status|family|sweep` (agentpost.routes_cli), run through
agentpost.cli.main with the commands registered the way cli.py registers inbox_cli: output
is JSON, an error is one line on stderr with the CLI's exit code."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest

from agentpost import cli
from agentpost.cli.routes import register
from agentpost.store import EnvelopeStore
from agentpost.store.routes import RouteStore

ENVELOPE = {"id": "abc", "route": {"actors": ["prep", "infer"]}, "payload": {"t": "hi"}}


@pytest.fixture
def agentpost(dsn: str, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `agentpost --dsn <dsn> ...` in-process: (exit code, stdout, stderr)."""
    build = cli.build_parser

    def with_routes() -> argparse.ArgumentParser:
        parser = build()
        if "route" not in parser._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
            register(parser._subparsers._group_actions[0])  # type: ignore[union-attr]
        return parser

    monkeypatch.setattr(cli, "build_parser", with_routes)

    def run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = cli.main(["--dsn", dsn, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _one_line_error(result: tuple[int, str, str], code: int) -> str:
    got, _out, err = result
    assert got == code, result
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentpost: "), err
    return lines[0]


def test_route_setup_start_status_family(agentpost: Any, store: EnvelopeStore) -> None:
    code, out, _ = agentpost("route", "setup", "prep", "infer")
    assert code == 0 and {"prep", "infer", "happy-end"} <= set(json.loads(out)["created"])
    code, out, _ = agentpost("route", "start", "-", stdin=json.dumps(ENVELOPE))
    assert code == 0
    [view] = json.loads(out)
    assert (view["id"], view["status"], view["progress"]) == ("abc", "pending", 0)
    rs = RouteStore(store)
    ((lease, env),) = rs.receive("prep")
    rs.complete("prep", lease, env, [{"k": 0}, {"k": 1}])
    code, out, _ = agentpost("route", "status", "abc-1", "abc")
    assert [(v["id"], v["status"]) for v in json.loads(out)] == [
        ("abc-1", "running"), ("abc", "running")]
    code, out, _ = agentpost("route", "family", "abc-1")
    fam = json.loads(out)
    assert (fam["root_id"], fam["status"], len(fam["members"])) == ("abc", "running", 2)
    assert fam["progress"] == pytest.approx(0.5)


def test_route_sweep(agentpost: Any, store: EnvelopeStore) -> None:
    """`route sweep` moves an envelope whose hop was dead-lettered to error-end."""
    rs = RouteStore(store)
    rs.setup(["prep"])
    rs.start({"id": "slow", "route": {"actors": ["prep"]}, "payload": {}})
    for _ in range(4):
        ((lease, _env),) = rs.receive("prep")
        store.nack(lease.token)
    code, out, _ = agentpost("route", "sweep")
    assert code == 0 and json.loads(out) == {"moved_to_error_end": ["slow"]}
    code, out, _ = agentpost("route", "status", "slow")
    [view] = json.loads(out)
    assert (view["status"], view["error"]["error"]) == ("failed", "timeout")


def test_route_errors_are_one_line(agentpost: Any, store: EnvelopeStore, tmp_path: Any) -> None:
    """Bad input and unknown ids: exit 2, one line on stderr, nothing started."""
    RouteStore(store).setup(["prep"])
    assert "no routed envelope 'nope'" in _one_line_error(
        agentpost("route", "status", "nope"), 2)
    _one_line_error(agentpost("route", "family", "nope"), 2)
    _one_line_error(agentpost("route", "start", "-", stdin="{not json"), 2)
    _one_line_error(agentpost("route", "start", str(tmp_path / "missing.json")), 2)
    bad = dict(ENVELOPE, route={"actors": ["prep", "ghost"]})
    assert "ghost" in _one_line_error(agentpost("route", "start", "-",
                                                stdin=json.dumps(bad)), 2)
    assert store.db.scalar("SELECT count(*) FROM agentpost.routes") == 0
    assert store.verify_trail().ok
