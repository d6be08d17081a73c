"""What the MCP tests share: the seat's setup, one successful call of every tool and the
refusals, each run through a real `mcp` SDK `ClientSession` (over stdio or HTTP)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentpost.store import EnvelopeStore
from ai_support import topology, written

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"send_envelope", "read_inbox", "reply", "ack", "read_marks", "write_mark", "claim",
         "submit_command"}
SPACE = "mcp"
SCOPE_ARG = "deploys:deploy:deployed"


def subprocess_env(dsn: str) -> dict[str, str]:
    """The environment of a server process: this checkout's code, this test's store."""
    return {"PYTHONPATH": str(ROOT / "plugins"), "AGENTPOST_DSN": dsn,
            "AGENTPOST_TRAIL_KEY": os.environ.get("AGENTPOST_TRAIL_KEY", ""),
            "PATH": os.environ.get("PATH", "")}


def seed(store: EnvelopeStore) -> str:
    """boss, w1, w2, and a directive from boss waiting in w1's inbox; its id."""
    topology(store)
    return store.send("boss", "w1", "directive", "deploy api").envelope_id


def children() -> set[int]:
    """Processes whose parent is this test process (a server left behind shows here)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.add(int(entry.name))
    return out


def result_json(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def error_text(result: Any) -> str:
    assert result.is_error, result
    text = result.content[0].text
    assert "Traceback" not in text and "psycopg" not in text.lower()
    return text


async def call_every_tool(session: Any, store: EnvelopeStore, waiting: str) -> dict[str, Any]:
    """Each tool once, successfully, as w1; checks what landed; the results by tool."""
    listed = await session.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == TOOLS
    assert "boss: query" in tools["send_envelope"].description
    schema = tools["send_envelope"].input_schema
    assert schema["additionalProperties"] is False and "to" in schema["required"]
    out: dict[str, Any] = {}
    out["send_envelope"] = result_json(await session.call_tool(
        "send_envelope", {"to": "boss", "type": "query", "content": {"ask": "status"}}))
    sent = store.get(out["send_envelope"]["envelope_id"])
    assert sent.sender == "w1" and sent.to == "boss"
    assert sent.meta["tool_call"]["tool"] == "send_envelope"
    assert sent.meta["tool_call"]["run"]["by"] == "mcp"
    inbox = result_json(await session.call_tool("read_inbox", {"limit": 5}))
    assert [e["envelope_id"] for e in inbox["envelopes"]] == [waiting]
    out["read_inbox"] = inbox
    out["reply"] = result_json(await session.call_tool(
        "reply", {"envelope_id": waiting, "content": "deployed"}))
    assert store.get(out["reply"]["envelope_id"]).in_reply_to == waiting
    out["ack"] = result_json(await session.call_tool("ack", {"envelope_id": waiting}))
    assert out["ack"]["acked"] is True
    consumed = store.trail(envelope_id=waiting, event="envelope_consumed")
    assert consumed and consumed[0].body["holder"].startswith("mcp:")
    out["write_mark"] = result_json(await session.call_tool(
        "write_mark", {"kind": "observation", "scope": "deploys", "topic": "api",
                       "content": "healthy"}))
    marks = result_json(await session.call_tool("read_marks", {"scope": "deploys"}))
    assert out["write_mark"]["mark_id"] in {m["mark_id"] for m in marks["marks"]}
    out["read_marks"] = marks
    out["claim"] = result_json(await session.call_tool(
        "claim", {"scope": "deploys", "resource": "api", "action": "deploy"}))
    assert out["claim"]["verdict"] == "ALLOW" and out["claim"]["allowed"] is True
    out["submit_command"] = result_json(await session.call_tool(
        "submit_command", {"key": "k-1", "action": "query", "executor": "boss",
                           "mutating": False}))
    assert out["submit_command"]["state"] == "authorized"
    assert set(out) == TOOLS
    return out


#: (tool, arguments, part of the reason): refused, nothing written
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("send_envelope", {"to": "w2", "type": "query", "content": "x"}, "may not send to 'w2'"),
    ("send_envelope", {"to": "boss", "type": "no-such-type", "content": "x"},
     "allowed types: query"),
    ("send_envelope", {"to": "boss\n", "type": "query", "content": "x"}, "invalid arguments: to"),
    ("send_envelope", {"to": "boss", "type": "query", "content": "x", "from": "boss"}, "from"),
    ("send_envelope", {"to": "boss", "type": "query", "content": "x" * 40_000}, "at most 32768"),
    ("read_inbox", {"limit": 10**12}, "limit"),
    ("ack", {"envelope_id": "not-mine"}, "not taken by this run"),
    ("reply", {"envelope_id": "nope", "content": "x"}, "not found"),
    ("claim", {"scope": "deploys", "resource": "api", "action": "delete"}, "not 'delete'"),
    ("read_marks", {"scope": "nowhere"}, "nowhere"),
    ("submit_command", {"key": "k\x00", "action": "query"}, "key"),
    ("no_such_tool", {}, "unknown tool"),
]


async def check_refusals(session: Any, dsn: str) -> None:
    before = written(dsn)
    for tool, args, expected in REFUSALS:
        text = error_text(await session.call_tool(tool, args))
        assert expected in text, (tool, args, text)
    assert written(dsn) == before
