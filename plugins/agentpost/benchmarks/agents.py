"""`agentpost bench agents`: what the agent tools cost over the store call they make.

For each tool (send_envelope, read_inbox + ack, read_marks, write_mark, claim) one run
measures, on one database, the latency of one call made four ways in process and two over
MCP (below), interleaved call by call (each call is made every way in turn, in a shuffled
order) so that machine noise hits every path alike:

- direct: the store or mark-space call the tool makes (`EnvelopeStore.send_checked` with
  the same `meta`, `lease` + `ack`, `space.read` with the tool's limit, `Guard.write_mark`,
  `Guard.pre_action`);
- tools: `AgentTools.call(name, raw_args)` (argument models, the seat's checks, the call);
- toolset: `AgentpostToolset.execute_tool` awaited in an event loop: the worker-thread hop
  (`run_blocking`) the toolset adds around `AgentTools.call` (no model, no agent loop);
- agent: a pydantic-ai `Agent` whose `FunctionModel` issues the call, then answers: the
  whole agent loop around one tool call (two model turns, message history, argument
  validation by the toolset's validator), as an `AgentOperator` would run it.

read_marks reads a scope of its own (`READ_SCOPE`, under the bench scope) holding
`READ_MARKS` observations of another agent, written before the timing: the scope that
write_mark and claim write in grows through the run, and a read of it would time the size of
the scope at that moment rather than the path.

It prints p50/p95 per tool and path, the overhead of each path over the direct call at p95
(milliseconds) and as a p50 ratio, and judges issue 24's goal for the toolset: under 1 ms
at p95 over the direct call, for every tool call. The goal is judged on the toolset path;
the agent loop's own cost is printed beside it (it is pydantic-ai's, not agentpost's).

MCP: two more paths, ``mcp-stdio`` and ``mcp-http`` (`agentpost.benchmarks.agents_mcp`),
the same calls through the `mcp` SDK's client, to ``agentpost mcp serve`` in a subprocess and
to the plugin's app at ``/agentpost/mcp`` under uvicorn on loopback. They run by default;
without the ``ai`` extra (no `mcp` SDK) the bench says that MCP was not measured. The HTTP
goal, p95 under 10 ms for send_envelope and read_inbox, is judged on ``mcp-http``: for
read_inbox on the read_inbox call alone, timed inside the read_inbox+ack pair; the pair's
p95 is printed beside it.

The pair is two tool calls, so each is also timed alone inside it (`read_inbox`, `ack`;
on the direct path the lease and the ack) and printed as rows of its own; the toolset goal
is judged per tool call, on those two rows and the other tools, the pair printed for
scale.

`run(transports=...)` takes the paths beyond the in-process ones by name: each a
`Transport`, a context manager factory that, given the seat (`Seat`), yields a caller
``(tool name, raw args) -> result`` and, on leaving, stops whatever it started.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from agentpost.benchmarks.common import Report, percentile, scratch_database
from agentpost.marks import Agent, MarkType, Observation, Scope
from agentpost.marks.guard import Guard
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.store import EnvelopeStore
from agentpost.tools import AgentTools, RunInfo

ROUNDS = 5
TOOLSET_GOAL_MS = 1.0
MCP_HTTP_GOAL_MS = 10.0
SCOPE = Scope(name="bench", allowed_intent_verbs=("deploy",), allowed_action_verbs=("deployed",))
#: the scope read_marks reads (governed by SCOPE), and how many marks it holds
READ_SCOPE = f"{SCOPE.name}/read"
READ_MARKS = 100
#: the marks a read_marks call returns (the tool's default limit), asked of the space alike
READ_LIMIT = 20
KINDS = (MarkType.INTENT, MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
         MarkType.NEED)
TOOLS = ("send_envelope", "read_inbox+ack", "read_marks", "write_mark", "claim")
#: the read_inbox call alone (the lease, directly) and the ack alone, each timed inside
#: read_inbox+ack
READ_ALONE = "read_inbox"
ACK_ALONE = "ack"
#: the rows the toolset goal is judged on: one tool call each (the pair is two)
JUDGED = ("send_envelope", READ_ALONE, ACK_ALONE, "read_marks", "write_mark", "claim")
PATHS = ("direct", "tools", "toolset", "agent")

#: a caller of the tools over some transport: (tool name, raw arguments) -> the result JSON
Caller = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Seat:
    """The seat the bench measures, as a transport needs it."""

    dsn: str  #: the bench's database
    store: EnvelopeStore  #: the bench's store (open for the whole run)
    workspace: str  #: the workspace the tools act as
    lead: str  #: the workspace it sends to (its parent)
    space: str  #: the mark space's name (in the same database)
    scope: Scope  #: the mark space's one scope
    agent: Agent  #: the mark-space agent (its id derived from its name, the workspace id)


#: a transport: given the seat, a context manager yielding a caller; leaving it stops what
#: the transport started (a server, a process, a session)
Transport = Callable[[Seat], AbstractContextManager[Caller]]


def agent_named(name: str) -> Agent:
    """The mark-space agent `name` as `AgentpostToolset` and the MCP server derive it (uuid5
    of the name), so that every path of the bench acts as one agent."""
    return Agent(id=uuid.uuid5(uuid.NAMESPACE_URL, f"agentpost-agent:{name}"), name=name,
                 scopes={SCOPE.name: KINDS})


def mcp_transports() -> tuple[dict[str, Transport], str | None]:
    """The MCP transports, or none and why (the `mcp` SDK comes with the ``ai`` extra)."""
    try:
        from agentpost.benchmarks.agents_mcp import TRANSPORTS
    except ImportError as exc:
        return {}, f"not measured: {str(exc).splitlines()[0] or type(exc).__name__}"
    return dict(TRANSPORTS), None


@dataclass
class Timings:
    """Per tool and path: one latency (ms) per call."""

    ms: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, tool: str, path: str, value: float) -> None:
        self.ms.setdefault((tool, path), []).append(value)


def run(*, dsn: str | None = None, scale: float = 1.0,
        transports: Mapping[str, Transport] | None = None) -> int:
    """Measure and print. `transports`: the paths beyond the in-process ones; None (the
    default): the MCP transports, when the `mcp` SDK is installed."""
    skipped: str | None = None
    if transports is None:
        transports, skipped = mcp_transports()
    elif not transports:
        skipped = "not measured (no MCP transport given)"
    calls = max(5, int(200 * scale))
    space_name = f"bench-agents-{uuid.uuid4().hex[:6]}"
    with (scratch_database(dsn, "agentpost_bench_agents") as bench_dsn,
          EnvelopeStore(bench_dsn) as store,
          PostgresMarkSpace(dsn=bench_dsn, scopes=[SCOPE], space=space_name) as space):
        with ExitStack() as started:  # every transport stopped here, also on error
            bench = _Bench(store, space, space_name)
            started.callback(bench.close)
            seat = Seat(dsn=bench_dsn, store=store, workspace=bench.me, lead=bench.lead,
                        space=space_name, scope=SCOPE, agent=bench.agent)
            for name, make in transports.items():
                bench.callers[name] = started.enter_context(make(seat))
                bench.transports.append(name)
            timings = bench.measure(calls)
        verified = store.verify_trail()
    _report(timings, calls, bench.transports, verified, skipped).print()
    return 0 if verified.ok else 1


class _Bench:
    def __init__(self, store: EnvelopeStore, space: PostgresMarkSpace, space_name: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.store, self.space, self.space_name = store, space, space_name
        self.lead = store.create_workspace("coordinator", workspace_id=f"bench-lead-{tag}").id
        self.me = store.create_workspace("worker", parent=self.lead,
                                         workspace_id=f"bench-agent-{tag}").id
        self.agent = agent_named(self.me)
        self.run_info = RunInfo(by="python", ref=f"bench:{tag}")
        self.seat = AgentTools(store, workspace_id=self.me, marks=space, agent=self.agent,
                               run=self.run_info)
        self.guard = Guard(space)
        self.resources = count()
        self.transports: list[str] = []
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.shuffle = random.Random(24).shuffle  # the same orders every run
        writer = Agent(id=uuid.uuid4(), name=f"bench-writer-{tag}",
                       scopes={READ_SCOPE: (MarkType.OBSERVATION,)})
        space.write_many(writer, [Observation(scope=READ_SCOPE, topic=f"t{i}",
                                              content={"i": i}, confidence=0.5)
                                  for i in range(READ_MARKS)])
        self.callers: dict[str, Caller] = {
            "tools": self.seat.call, "toolset": self._toolset_caller(),
            "agent": self._agent_caller()}

    def close(self) -> None:
        for loop in self.loops:
            loop.close()

    # ---- the paths ---------------------------------------------------------------------

    def _toolset_caller(self) -> Caller:
        from agentpost.ai import AgentpostToolset

        toolset = AgentpostToolset(self.me)
        toolset._seat = self.seat  # the seat opened above, not through a connection
        loop = asyncio.new_event_loop()
        self.loops.append(loop)

        @dataclass
        class _Ctx:
            tool_call_id: str

        ids = count()

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            ctx = _Ctx(tool_call_id=f"bench-{next(ids)}")
            return loop.run_until_complete(
                toolset.execute_tool(name, args, ctx=ctx, tool=None))  # type: ignore[arg-type]
        return call

    def _agent_caller(self) -> Caller:
        from pydantic_ai import Agent as ModelAgent
        from pydantic_ai.messages import (
            ModelMessage,
            ModelRequest,
            ModelResponse,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
        )
        from pydantic_ai.models.function import AgentInfo, FunctionModel

        from agentpost.ai import AgentpostToolset

        toolset = AgentpostToolset(self.me, space=self.space_name, scopes=[SCOPE],
                                   agent=self.agent)
        toolset._seat = self.seat
        toolset._close = lambda: None  # type: ignore[method-assign]  # the seat outlives runs
        wanted: dict[str, Any] = {}

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            if not any(isinstance(m, ModelResponse) for m in messages):
                return ModelResponse(parts=[ToolCallPart(wanted["name"], wanted["args"],
                                                         tool_call_id="b1")])
            returned = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
                        if isinstance(p, ToolReturnPart)]
            wanted["result"] = returned[-1].content if returned else None
            return ModelResponse(parts=[TextPart("done")])

        agent = ModelAgent(FunctionModel(model), toolsets=[toolset])

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            wanted.update(name=name, args=args, result=None)
            agent.run_sync("go")
            if not isinstance(wanted["result"], dict):
                raise RuntimeError(f"the agent's {name} call returned {wanted['result']!r}")
            return wanted["result"]
        return call

    # ---- one call of each tool, each way -----------------------------------------------

    def _meta(self, tool: str) -> dict[str, Any]:
        return {"tool_call": {"tool": tool, "call_id": None,
                              "run": self.run_info.model_dump(mode="json")}}

    def _direct(self, tool: str) -> Callable[[], Any]:
        store, me, lead, agent = self.store, self.me, self.lead, self.agent
        if tool == "send_envelope":
            return lambda: store.send_checked(me, lead, "query", "status?",
                                              meta=self._meta("send_envelope"))
        if tool == "read_inbox+ack":
            def lease_ack() -> tuple[float, float]:
                start = time.perf_counter()
                (lease,) = store.lease(me, max=1, ttl=300.0, holder=self.run_info.ref)
                read = time.perf_counter()
                store.ack(lease.token)
                return read - start, time.perf_counter() - read
            return lease_ack
        if tool == "read_marks":
            return lambda: self.space.read(READ_SCOPE, reader=agent, limit=READ_LIMIT)
        if tool == "write_mark":
            return lambda: self.guard.write_mark(agent, Observation(
                scope=SCOPE.name, topic="api", content={"healthy": True}, confidence=0.5))
        resource = f"r{next(self.resources)}"
        return lambda: self.guard.pre_action(agent, SCOPE.name, resource, "deploy", 0.5)

    def _through(self, caller: Caller, tool: str) -> Callable[[], Any]:
        if tool == "send_envelope":
            args = {"to": self.lead, "type": "query", "content": "status?"}
            return lambda: caller("send_envelope", args)
        if tool == "read_inbox+ack":
            def read_ack() -> tuple[float, float]:
                start = time.perf_counter()
                (taken,) = caller("read_inbox", {"limit": 1})["envelopes"]
                read = time.perf_counter()
                caller("ack", {"envelope_id": taken["envelope_id"]})
                return read - start, time.perf_counter() - read
            return read_ack
        if tool == "read_marks":
            return lambda: caller("read_marks", {"scope": READ_SCOPE})
        if tool == "write_mark":
            return lambda: caller("write_mark", {"kind": "observation", "scope": SCOPE.name,
                                                 "topic": "api",
                                                 "content": {"healthy": True}})
        resource = f"r{next(self.resources)}"
        return lambda: caller("claim", {"scope": SCOPE.name, "resource": resource,
                                        "action": "deploy"})

    def _timed(self, timings: Timings, tool: str, paths: list[str], calls: int) -> None:
        """`calls` calls of `tool`, each made on every path in turn, the paths in a shuffled
        order each time: none always follows another (and finds, say, the agent loop's
        garbage left to collect), as it would in a fixed or rotating order."""
        for _ in range(calls):
            order = list(paths)
            self.shuffle(order)
            for path in order:
                if tool == "read_inbox+ack":  # one envelope waiting, sent untimed
                    self.store.send(self.lead, self.me, "directive", "do it")
                fn = (self._direct(tool) if path == "direct"
                      else self._through(self.callers[path], tool))
                start = time.perf_counter()
                parts = fn()
                timings.add(tool, path, (time.perf_counter() - start) * 1000)
                if tool == "read_inbox+ack":  # each call of the pair alone too
                    timings.add(READ_ALONE, path, parts[0] * 1000)
                    timings.add(ACK_ALONE, path, parts[1] * 1000)

    def measure(self, calls: int) -> Timings:
        paths = [*PATHS, *self.transports]
        warm = Timings()
        for tool in TOOLS:  # warm connections, plans, imports and caches on every path
            self._timed(warm, tool, paths, 3)
        timings = Timings()
        per_round = max(1, calls // ROUNDS)
        for _ in range(ROUNDS):
            for tool in TOOLS:
                self._timed(timings, tool, paths, per_round)
        return timings


def _report(timings: Timings, calls: int, transports: list[str], verified: Any,
            skipped: str | None) -> Report:
    per_round = max(1, calls // ROUNDS)
    report = Report(f"agentpost bench agents ({ROUNDS} rounds of {per_round} calls per tool, "
                    f"each made every way in a shuffled order; latency of one call, ms)")
    paths = [*PATHS, *transports]
    worst: dict[str, float] = {}
    rows = [t for tool in TOOLS
            for t in ((tool, READ_ALONE, ACK_ALONE) if tool == "read_inbox+ack" else (tool,))]
    for tool in rows:
        direct = timings.ms[(tool, "direct")]
        d50, d95 = percentile(direct, 0.50), percentile(direct, 0.95)
        for path in paths:
            values = timings.ms[(tool, path)]
            p50, p95 = percentile(values, 0.50), percentile(values, 0.95)
            line = f"p50 {p50:7.2f} ms  p95 {p95:7.2f} ms"
            if path != "direct":
                over = p95 - d95
                if tool in JUDGED:
                    worst[path] = max(worst.get(path, over), over)
                line += f"  over direct: p95 {over:+.2f} ms, p50 x{p50 / d50:.2f}"
            report.add(f"{tool:<15} {path}", line)
    report.add("read_marks reads", f"{READ_SCOPE}: {READ_MARKS} marks of another agent, "
                                   "written before the timing")
    if skipped is not None:
        report.add("MCP", skipped)
    report.add("trail after the run", f"{verified.entries:,} entries, "
                                      f"{'verified' if verified.ok else 'FAILED'}")
    report.goal(f"toolset overhead under {TOOLSET_GOAL_MS:g} ms at p95 over the direct call, "
                f"every tool call (read_inbox and ack each alone; worst "
                f"{worst['toolset']:+.2f} ms)",
                worst["toolset"] < TOOLSET_GOAL_MS)
    http = next((t for t in transports if "http" in t.lower()), None)
    if http is None:
        report.add("goal not judged", f"MCP over HTTP p95 under {MCP_HTTP_GOAL_MS:g} ms for "
                                      "send_envelope and read_inbox (MCP over HTTP not "
                                      "measured)")
    else:
        send, read, pair = (percentile(timings.ms[(tool, http)], 0.95)
                            for tool in ("send_envelope", READ_ALONE, "read_inbox+ack"))
        report.goal(f"MCP over HTTP ({http}) p95 under {MCP_HTTP_GOAL_MS:g} ms for "
                    f"send_envelope and read_inbox: send_envelope {send:.2f} ms, read_inbox "
                    f"{read:.2f} ms (the read_inbox call alone, timed inside read_inbox+ack; "
                    f"the pair with its ack: {pair:.2f} ms)",
                    max(send, read) < MCP_HTTP_GOAL_MS)
    return report
