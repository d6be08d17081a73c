"""The agent tools: one workspace's seat at the store and the mark space, as plain Python.

`AgentTools` is bound to one identity, fixed by whoever runs it (a DAG, an MCP token), never
by the model: the workspace it acts as, the mark-space `Agent` it writes as, and the run
(`RunInfo`) recorded with each call. Each tool is one method taking its argument model and
returning its result model; `call(name, args)` validates raw arguments first (what an
adapter hands over from a model).

Every refusal is one exception, `ToolRefused(reason)`, raised before anything is written:
arguments the models refuse, a recipient or type the permission matrix does not allow, an
envelope not taken by this run, a scope or verb the space does not know, the store's typed
errors (not found, forbidden, conflict, invalid input). Infrastructure failures
(`StoreUnavailable`, `StoreError`, a misconfiguration) are not refusals and propagate.

How the run lands on the trail (docs/agents.md): an envelope carries it in its Courier
`meta` (``{"tool_call": {"tool", "call_id", "run"}}``), which the trail's
`envelope_created` entry covers through the row digest; a lease and its ack name the run
as the lease `holder` on `envelope_leased` / `envelope_consumed`; a command carries it as
its `context`, recorded in its evidence. Marks record the agent id (and, in a
`PostgresMarkSpace`, the agent's name); they have no field for the run.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from agentpost.marks import (
    Agent,
    MarkspaceError,
    Need,
    Observation,
    UnknownScope,
    Warning,
)
from agentpost.marks.guard import Guard, GuardVerdict
from agentpost.protocol.errors import (
    AgentpostError,
    ConfigurationError,
    LeaseLost,
    StoreError,
)
from agentpost.protocol.models import SendResult
from agentpost.smcl import CommandLedger
from agentpost.store import EnvelopeStore
from agentpost.tools.models import (
    AckArgs,
    Acked,
    ClaimArgs,
    ClaimResult,
    CommandSubmitted,
    EnvelopeSent,
    Inbox,
    InboxEnvelope,
    MarkRead,
    Marks,
    MarkWritten,
    ReadInboxArgs,
    ReadMarksArgs,
    ReplyArgs,
    RunInfo,
    SendEnvelopeArgs,
    SubmitCommandArgs,
    WriteMarkArgs,
)

#: the states in which a workspace takes no envelopes: a send to one is rejected
_SEALED = frozenset({"integrating", "closed", "failed"})
#: the scope of the blocking needs that confirm mutating commands (CommandLedger's default)
_NEED_SCOPE = "commands"


class ToolRefused(Exception):
    """A tool call refused, with the reason meant for the model; nothing was written."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ToolSpec:
    """One tool as adapters see it: its name, what the model is told, its argument model
    (whose JSON schema is the tool's parameters) and whether it needs a mark space."""

    name: str
    description: str
    args: type[BaseModel]
    marks: bool = False


#: the tools, in the order adapters list them; descriptions get per-seat facts appended
TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("send_envelope", "Send an envelope (a message) from this workspace to another "
             "workspace. Only the recipients and types listed below are allowed.",
             SendEnvelopeArgs),
    ToolSpec("read_inbox", "Take up to `limit` envelopes from this workspace's inbox, in "
             "processing order (blocking, urgent, normal). They are leased to this run: no "
             "other run gets them until the lease ends. Acknowledge each one with `ack` once "
             "handled; one not acknowledged goes back to the inbox.", ReadInboxArgs),
    ToolSpec("reply", "Answer an envelope of this workspace's inbox: sends `content` back to "
             "its sender, in reply to it. Does not acknowledge it: call `ack` too.", ReplyArgs),
    ToolSpec("ack", "Acknowledge an envelope this run took with `read_inbox`: it is handled "
             "and leaves the inbox for good.", AckArgs),
    ToolSpec("read_marks", "Read the active marks of a scope of the shared mark space "
             "(observations, warnings, needs, intents and actions of every agent), "
             "strongest first.", ReadMarksArgs, marks=True),
    ToolSpec("write_mark", "Write an observation, a warning or a need into a scope of the "
             "mark space, as this agent. An observation needs `topic` and `content`, a warning "
             "`topic` and `reason`, a need `question`.", WriteMarkArgs, marks=True),
    ToolSpec("claim", "Ask the guard whether this agent may act on a resource: writes the "
             "agent's intent and returns the verdict (ALLOW: go ahead; CONFLICT: another agent "
             "holds it; BLOCKED: wait for a decision; DENIED: not permitted) and its reason.",
             ClaimArgs, marks=True),
    ToolSpec("submit_command", "Submit a command (a side effect another workspace executes) "
             "under the command protocol: idempotent by `key`, authorized by the permission "
             "matrix, mutating commands confirmed by a person first. Returns its state.",
             SubmitCommandArgs),
)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _validation_reason(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
        problems.append(f"{where}: {error.get('msg', 'invalid')}")
    return "invalid arguments: " + "; ".join(problems)


def _decoded(envelope: Any) -> Any:
    """The content as the model should see it: a JSON payload parsed, text as it is."""
    content = envelope.content
    if envelope.payload.format == "json" and isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """The store's and the space's typed refusals as `ToolRefused`; infrastructure errors
    (the store away, a database failure, a misconfiguration) pass through."""
    try:
        yield
    except ToolRefused:
        raise
    except (StoreError, ConfigurationError):
        raise
    except ValidationError as exc:
        raise ToolRefused(_validation_reason(exc)) from None
    except AgentpostError as exc:  # InvalidInput, NotFound, Conflict, Forbidden, marks' own
        raise ToolRefused(f"{type(exc).__name__}: {_line(exc)}") from None


class AgentTools:
    """The tools of one seat: workspace `workspace_id` of `store`, and, with a mark space
    `marks`, the mark-space agent `agent`. `run` is recorded with every call (default: a
    fresh ``python`` run). Leases taken by `read_inbox` belong to this object: `ack` settles
    only those, `release()` returns the rest.

    Thread-safe for the lease book; one object per run of an agent."""

    def __init__(self, store: EnvelopeStore, *, workspace_id: str, marks: Any = None,
                 agent: Agent | None = None, run: RunInfo | None = None,
                 guard: Guard | None = None, lease_ttl: float = 300.0,
                 max_content_bytes: int | None = None) -> None:
        if marks is not None and agent is None:
            raise ValueError("a mark space needs the agent that writes in it (agent=...)")
        self.store = store
        self.workspace_id = workspace_id
        self.marks = marks
        self.agent = agent
        self.guard = guard if guard is not None or marks is None else Guard(marks)
        self.run = run or RunInfo(by="python", ref=f"tools:{workspace_id}:{uuid.uuid4().hex[:12]}")
        self.lease_ttl = lease_ttl
        self.max_content_bytes = max_content_bytes
        self._leases: dict[str, str] = {}  # envelope id -> lease token
        self._lock = threading.Lock()
        if marks is not None and hasattr(marks, "record_names"):
            marks.record_names([agent])  # the trail of marks names the agent

    # ---- the catalogue -----------------------------------------------------------------

    def specs(self) -> list[ToolSpec]:
        """The tools of this seat (the mark tools only with a mark space), their
        descriptions completed with this seat's facts: recipients and types, scopes and
        verbs."""
        with refusals():
            routes = self.routes()
        sends = "; ".join(f"{to}: {', '.join(types)}" for to, types in sorted(routes.items()))
        facts = {
            "send_envelope": (f" This workspace is {self.workspace_id!r}. Allowed recipients "
                              f"and their types: {sends}." if sends else
                              f" This workspace ({self.workspace_id!r}) may send to nobody "
                              "right now."),
            "reply": f" Types allowed back, per sender: {sends or 'none'}.",
            "submit_command": self._command_facts(),
        }
        scopes = self._scope_facts()
        out = []
        for spec in TOOLS:
            if spec.marks and self.marks is None:
                continue
            extra = facts.get(spec.name, scopes if spec.marks else "")
            out.append(ToolSpec(spec.name, spec.description + extra, spec.args, spec.marks))
        return out

    def routes(self) -> dict[str, list[str]]:
        """Recipient -> the envelope types this workspace may send it now, as the store's
        send decides: a live send right to a recipient that takes envelopes (not
        integrating, closed or failed), and a permission-matrix row from a role of ours to a
        role of theirs or a delegation edge (WACP §2: directive and feedback down to a
        delegating workspace's children, query up to it)."""
        me = self.store.workspace(self.workspace_id)
        types = self.store.envelope_types()
        out: dict[str, list[str]] = {}
        for right in self.store.rights(self.workspace_id):
            if right.target in out:
                continue
            try:
                them = self.store.workspace(right.target)
            except LookupError:
                continue
            if str(getattr(them.state, "value", them.state)) in _SEALED:
                continue
            allowed = set(self._matrix(types, me.lineage, them.lineage))
            if me.delegation and them.parent == me.id:
                allowed |= {"directive", "feedback"}
            if them.delegation and me.parent == them.id:
                allowed.add("query")
            if allowed:
                out[right.target] = sorted(allowed)
        return out

    def _required(self, type_: str, content: Any,
                  needed: tuple[str, ...] | None = None) -> None:
        """The store rejects (and records) a payload without its type's required fields:
        refuse it before, naming them. `needed`: the type's fields when already read."""
        if needed is None:
            needed = next((t.required_fields for t in self.store.envelope_types()
                           if t.name == type_), ())
        if not needed:
            return
        missing = sorted(set(needed) - set(content if isinstance(content, dict) else ()))
        if missing:
            raise ToolRefused(f"invalid content: type {type_!r} needs a JSON object with the "
                              f"fields {', '.join(needed)}; missing: {', '.join(missing)}")

    @staticmethod
    def _matrix(types: list[Any], senders: tuple[str, ...], receivers: tuple[str, ...]
                ) -> list[str]:
        return sorted(t.name for t in types if any(
            p.sender in senders and p.receiver in receivers for p in t.permissions))

    def _command_facts(self) -> str:
        try:
            me = self.store.workspace(self.workspace_id)
            own = self._matrix(self.store.envelope_types(), me.lineage, me.lineage)
        except AgentpostError:
            return ""
        actions = ", ".join(own) if own else "none"
        return (f" Actions this workspace may run itself (executor left out): {actions}; "
                "another executor: the types it may be sent (see send_envelope).")

    def _scope_facts(self) -> str:
        if self.marks is None or self.agent is None:
            return ""
        parts = []
        for name, kinds in sorted(self.agent.scopes.items()):
            try:
                scope = self.marks.get_scope(name)
            except MarkspaceError:
                continue
            verbs = ", ".join(scope.allowed_intent_verbs) or "none"
            writes = ", ".join(str(getattr(k, "value", k)) for k in kinds)
            parts.append(f"{name} (writes: {writes}; claim verbs: {verbs})")
        return " Scopes of this agent: " + ("; ".join(parts) if parts else "none") + "."

    # ---- dispatch ----------------------------------------------------------------------

    def call(self, name: str, args: Mapping[str, Any] | None = None, *,
             call_id: str | None = None) -> dict[str, Any]:
        """Run tool `name` on raw arguments; its result as JSON. ToolRefused for an unknown
        tool, bad arguments or a refusal."""
        spec = next((s for s in TOOLS if s.name == name), None)
        if spec is None or (spec.marks and self.marks is None):
            known = ", ".join(s.name for s in self.specs())
            raise ToolRefused(f"unknown tool {name!r}; the tools are: {known}")
        with refusals():
            model = spec.args.model_validate(dict(args or {}))
        method: Callable[..., BaseModel] = getattr(self, name)
        return method(model, call_id=call_id).model_dump(mode="json")

    def _meta(self, tool: str, call_id: str | None) -> dict[str, Any]:
        return {"tool_call": {"tool": tool, "call_id": call_id,
                              "run": self.run.model_dump(mode="json")}}

    def _check_size(self, content: Any) -> None:
        if self.max_content_bytes is None:
            return
        size = len(json.dumps(content, ensure_ascii=False).encode("utf-8"))
        if size > self.max_content_bytes:
            raise ToolRefused(f"content is {size} bytes; this seat allows at most "
                              f"{self.max_content_bytes}")

    # ---- envelopes ---------------------------------------------------------------------

    def _send(self, tool: str, to: str, type_: str, content: Any, *, in_reply_to: str | None,
              priority: str, call_id: str | None) -> EnvelopeSent:
        self._check_size(content)
        fmt = "markdown" if isinstance(content, str) else "json"
        meta = self._meta(tool, call_id)
        if self._seat_allows(to):
            # one round trip sends the common case; anything else comes back unsent
            result = self.store.send_checked(self.workspace_id, to, type_, content,
                                             format=fmt, in_reply_to=in_reply_to,
                                             priority=priority, meta=meta)
            if result is not None:
                return self._sent(result, to, type_)
        # the long way: refused here with what is allowed instead, or sent by `send`
        options = self.store.send_options(self.workspace_id, to, type_)
        if type_ in options.types and self._seat_allows(to):
            self._required(type_, content, options.required_fields or ())
        else:
            # refused: the seat's routes name what is allowed instead (a refusal may cost
            # the extra reads); decided again on them, as before this check existed
            routes = self.routes()
            if to not in routes:
                allowed = ", ".join(sorted(routes)) or "none"
                raise ToolRefused(f"permission denied: {self.workspace_id!r} may not send to "
                                  f"{to!r} (unknown workspace or no send right); allowed "
                                  f"recipients: {allowed}")
            if type_ not in routes[to]:
                raise ToolRefused(f"permission denied: type {type_!r} may not be sent to "
                                  f"{to!r}; allowed types: {', '.join(routes[to])}")
            self._required(type_, content)
        result = self.store.send(self.workspace_id, to, type_, content, format=fmt,
                                 in_reply_to=in_reply_to, priority=priority, meta=meta)
        return self._sent(result, to, type_)

    @staticmethod
    def _sent(result: SendResult, to: str, type_: str) -> EnvelopeSent:
        if not result.accepted:
            detail = f" ({result.detail})" if result.detail else ""
            raise ToolRefused(f"rejected: {result.reason}{detail}")
        return EnvelopeSent(envelope_id=result.envelope_id, to=to, type=type_,
                            status=str(getattr(result.status, "value", result.status)))

    def _seat_allows(self, to: str) -> bool:
        """Whether this seat itself lets it send to `to`, beyond the store's rights and
        matrix: every recipient here; a narrower seat (an MCP token's) overrides it, and
        `routes` with it."""
        return True

    def send_envelope(self, args: SendEnvelopeArgs, *, call_id: str | None = None
                      ) -> EnvelopeSent:
        with refusals():
            return self._send("send_envelope", args.to, args.type, args.content,
                              in_reply_to=args.in_reply_to, priority=args.priority,
                              call_id=call_id)

    def read_inbox(self, args: ReadInboxArgs, *, call_id: str | None = None) -> Inbox:
        with refusals():
            leases = self.store.lease(self.workspace_id, max=args.limit, ttl=self.lease_ttl,
                                      holder=self.run.ref)
        with self._lock:
            for lease in leases:
                self._leases[lease.envelope.id] = lease.token
        envelopes = [InboxEnvelope(
            envelope_id=lease.envelope.id, sender=lease.envelope.sender,
            type=lease.envelope.type, content=_decoded(lease.envelope),
            format=lease.envelope.payload.format,
            priority=str(getattr(lease.envelope.priority, "value", lease.envelope.priority)),
            in_reply_to=lease.envelope.in_reply_to,
            sent_at=lease.envelope.timestamp.isoformat(), attempt=lease.attempt)
            for lease in leases]
        until = min((lease.expires_at for lease in leases), default=None)
        return Inbox(envelopes=envelopes, leased_until=until.isoformat() if until else None)

    def reply(self, args: ReplyArgs, *, call_id: str | None = None) -> EnvelopeSent:
        with refusals():
            try:
                original = self.store.get(args.envelope_id)
            except LookupError:
                original = None
            if original is None or original.to != self.workspace_id:
                raise ToolRefused(f"not found: no envelope {args.envelope_id!r} in the inbox "
                                  f"of {self.workspace_id!r}")
            to = original.sender
            type_ = args.type
            if type_ is None:
                allowed = list(self.store.send_options(self.workspace_id, to).types)
                if len(allowed) != 1:
                    raise ToolRefused(
                        f"say which type: the types allowed back to {to!r} are "
                        f"{', '.join(allowed) or 'none'}")
                type_ = allowed[0]
            return self._send("reply", to, type_, args.content, in_reply_to=original.id,
                              priority="normal", call_id=call_id)

    def ack(self, args: AckArgs, *, call_id: str | None = None) -> Acked:
        with self._lock:
            token = self._leases.get(args.envelope_id)
        if token is None:
            raise ToolRefused(f"envelope {args.envelope_id!r} was not taken by this run: "
                              "only envelopes returned by read_inbox can be acknowledged")
        with refusals():
            try:
                self.store.ack(token)
            except LeaseLost:
                with self._lock:
                    self._leases.pop(args.envelope_id, None)
                raise ToolRefused(f"the lease on {args.envelope_id!r} ended before the ack: "
                                  "it went back to the inbox; read_inbox again") from None
        with self._lock:
            self._leases.pop(args.envelope_id, None)
        return Acked(envelope_id=args.envelope_id)

    def release(self) -> int:
        """Return the envelopes this run took and did not acknowledge to the inbox now
        (rather than when their leases end); how many."""
        with self._lock:
            held, self._leases = list(self._leases.values()), {}
        returned = 0
        for token in held:
            try:
                self.store.nack(token)
                returned += 1
            except LeaseLost:
                pass
        return returned

    def held(self) -> dict[str, str]:
        """The leases this run holds and has not settled: envelope id -> lease token."""
        with self._lock:
            return dict(self._leases)

    def adopt(self, leases: Mapping[str, str]) -> None:
        """Take over leases held by an earlier part of the same run (a run that paused for
        a person and resumed in another process): `ack` may settle them, `release` returns
        them."""
        with self._lock:
            self._leases.update(leases)

    # ---- marks -------------------------------------------------------------------------

    def _space(self) -> tuple[Any, Agent, Guard]:
        if self.marks is None or self.agent is None or self.guard is None:
            raise ToolRefused("this agent has no mark space")
        return self.marks, self.agent, self.guard

    def read_marks(self, args: ReadMarksArgs, *, call_id: str | None = None) -> Marks:
        space, agent, _ = self._space()
        with refusals():
            try:
                found = space.read(args.scope, resource=args.resource, topic=args.topic,
                                   reader=agent, limit=args.limit)
            except UnknownScope:
                raise ToolRefused(f"unknown scope {args.scope!r}{self._scope_facts()}") from None
        out = []
        for mark in found[: args.limit]:
            data = mark.model_dump(mode="json", exclude_none=True)
            out.append(MarkRead(
                mark_id=str(data.pop("id")), kind=str(data.pop("mark_type")),
                scope=str(data.pop("scope")), agent_id=data.pop("agent_id", None),
                fields=data))
        return Marks(marks=out)

    def write_mark(self, args: WriteMarkArgs, *, call_id: str | None = None) -> MarkWritten:
        _, agent, guard = self._space()
        if args.kind == "observation":
            if args.topic is None or args.content is None:
                raise ToolRefused("an observation needs topic and content")
            self._check_size(args.content)
            build: Callable[[], Any] = lambda: Observation(  # noqa: E731
                scope=args.scope, topic=args.topic, content=args.content,
                confidence=args.confidence)
        elif args.kind == "warning":
            if args.topic is None or not args.reason:
                raise ToolRefused("a warning needs topic and reason")
            build = lambda: Warning(scope=args.scope, topic=args.topic,  # noqa: E731
                                    reason=args.reason, severity=args.severity)
        else:
            if not args.question:
                raise ToolRefused("a need needs a question")
            build = lambda: Need(scope=args.scope, question=args.question,  # noqa: E731
                                 blocking=args.blocking, priority=args.priority)
        with refusals(), self._recording(agent, "write_mark", call_id):
            mark_id = guard.write_mark(agent, build())
        return MarkWritten(mark_id=str(mark_id), kind=args.kind, scope=args.scope)

    def _recording(self, agent: Agent, tool: str,
                   call_id: str | None) -> contextlib.AbstractContextManager[Any]:
        """Record the run with the marks this seat's agent writes in the block, where the
        space keeps runs (a `PostgresMarkSpace`: agentpost.mark_runs, written by the
        statement that writes the mark): a mark has no field of its own for it."""
        recording = getattr(self.marks, "recording_run", None)
        if recording is None:
            return contextlib.nullcontext()
        return recording(agent.id, workspace=self.workspace_id, tool=tool, call_id=call_id,
                         run=self.run.model_dump(mode="json"))

    def claim(self, args: ClaimArgs, *, call_id: str | None = None) -> ClaimResult:
        space, agent, guard = self._space()
        with refusals():
            scope = space.get_scope(args.scope)
            # the space's own rule: an empty list is unrestricted, "*" names every verb
            if scope.allowed_intent_verbs and not scope.allows_intent_verb(args.action):
                raise ToolRefused(f"scope {args.scope!r} allows the verbs "
                                  f"{', '.join(scope.allowed_intent_verbs)}, not "
                                  f"{args.action!r}")
            with self._recording(agent, "claim", call_id):
                decision = guard.pre_action(agent, args.scope, args.resource, args.action,
                                            args.confidence)
        winner = decision.winning_intent or decision.winning_action
        return ClaimResult(
            verdict=decision.verdict.name, allowed=decision.verdict is GuardVerdict.ALLOW,
            reason=decision.reason,
            intent_id=str(decision.intent_id) if decision.intent_id else None,
            winning_agent=str(winner.agent_id) if winner is not None and winner.agent_id
            else None)

    def guarded_call(self, fn: Callable[[], Any], *, scope: str, resource: str,
                     intent_action: str, result_action: str, confidence: float = 0.5) -> Any:
        """`fn()` only on the guard's ALLOW for (scope, resource), as this agent, with the
        action mark `result_action` written after it (`Guard.execute`: check, call and
        record under the resource's lock). Any other verdict is a ToolRefused naming it and
        its reason, `fn` not called. An exception of `fn` is recorded as a failed action and
        raised as it is."""
        _, agent, guard = self._space()
        with refusals():
            decision, result = guard.execute(agent, scope, resource, intent_action,
                                             result_action, fn, confidence)
        if decision.verdict is not GuardVerdict.ALLOW:
            raise ToolRefused(f"the guard answered {decision.verdict.name} for {resource!r} "
                              f"in {scope!r}: {decision.reason}")
        return result

    # ---- commands ----------------------------------------------------------------------

    def ledger(self) -> CommandLedger:
        """The SMCL ledger this seat's commands go through: its store, and its mark space
        for the blocking needs that ask a person (scope ``commands``). Close it after use."""
        return CommandLedger(self.store, marks=self.marks, need_scope=_NEED_SCOPE)

    def submit_command(self, args: SubmitCommandArgs, *, call_id: str | None = None
                       ) -> CommandSubmitted:
        self._check_size(args.args)
        executor = args.executor or self.workspace_id
        with refusals():
            me = self.store.workspace(self.workspace_id)
            try:
                them = self.store.workspace(executor)
            except LookupError:
                raise ToolRefused(f"unknown workspace {executor!r}") from None
            allowed = self._matrix(self.store.envelope_types(), me.lineage, them.lineage)
            if args.action not in allowed:
                raise ToolRefused(f"not permitted: {self.workspace_id!r} may not have "
                                  f"{executor!r} run {args.action!r}; allowed actions: "
                                  f"{', '.join(allowed) or 'none'}")
            if args.mutating and self.marks is not None:
                # the confirmation is a blocking need in the ledger's scope: without that
                # scope the ledger would fail after recording the command
                try:
                    self.marks.get_scope(_NEED_SCOPE)
                except UnknownScope:
                    raise ToolRefused(f"a mutating command needs the scope {_NEED_SCOPE!r} in "
                                      "this agent's mark space for its confirmation; it has "
                                      "none") from None
            with self.ledger() as ledger:
                view = ledger.submit(self.workspace_id, args.key, action=args.action,
                                     mutating=args.mutating, executor=executor,
                                     args=args.args,
                                     context=self._meta("submit_command", call_id))
                if not view.duplicate and view.state.value == "canonicalized":
                    if args.mutating:
                        view = ledger.request_confirmation(view.command_id)
                    else:
                        view = ledger.authorize(view.command_id)
        return CommandSubmitted(command_id=view.command_id, state=view.state.value,
                                reason=view.reason, duplicate=view.duplicate)


__all__ = ["TOOLS", "AgentTools", "ToolRefused", "ToolSpec", "refusals"]
