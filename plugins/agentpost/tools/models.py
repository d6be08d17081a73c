"""The argument and result models of the agent tools (docs/agents.md).

The argument models are what a model sends: their JSON schemas are the tools' parameter
schemas, and they refuse hostile input before anything reaches the store (ids with control
characters, oversized content, unknown priorities, out-of-range limits, extra fields). The
result models are what the model gets back, plain JSON.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

#: the largest content a tool call may carry (JSON-encoded bytes); AgentTools may lower it
MAX_TOOL_CONTENT_BYTES = 32_768
#: the most envelopes one read_inbox call leases, and marks one read_marks call returns
MAX_READ = 50

# A workspace id (letters, digits, '.', '_', '-'); envelope ids also hold ':' (caller-chosen
# ids) and a type name '.' (command.confirmation). No control characters, no spaces.
WorkspaceId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                                   description="a workspace id")]
EnvelopeId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
                                  description="an envelope id, as read_inbox returned it")]
TypeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                                description="an envelope type name")]
# Scope names nest with '/', resources and topics are labels: printable, bounded.
Label = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
ShortText = Annotated[str, Field(max_length=4000, pattern=r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$")]


def _bounded(value: Any) -> Any:
    """Content of at most MAX_TOOL_CONTENT_BYTES bytes of JSON, without NULs."""
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ValueError("content must be plain JSON (text, an object or a list)") from None
    size = len(encoded.encode("utf-8"))
    if size > MAX_TOOL_CONTENT_BYTES:
        raise ValueError(f"content is {size} bytes; at most {MAX_TOOL_CONTENT_BYTES} are allowed")
    if "\x00" in encoded or "\\u0000" in encoded:
        raise ValueError("content must not contain NUL characters")
    return value


Content = Annotated[str | dict[str, Any] | list[Any], AfterValidator(_bounded)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SendEnvelopeArgs(_Args):
    to: WorkspaceId = Field(description="the receiving workspace: one of the allowed recipients")
    type: TypeName = Field(description="the envelope type: one allowed for that recipient")
    content: Content = Field(description="the message: text (markdown), or a JSON object or "
                                         "list (sent with format json)")
    in_reply_to: EnvelopeId | None = Field(None, description="the envelope this answers")
    priority: Literal["normal", "urgent", "blocking"] = Field(
        "normal", description="normal; urgent jumps the queue; blocking holds the "
                              "recipient's inbox until it is consumed (use rarely)")


class ReadInboxArgs(_Args):
    limit: int = Field(10, ge=1, le=MAX_READ, description="how many envelopes to take at most")


class ReplyArgs(_Args):
    envelope_id: EnvelopeId = Field(description="the envelope answered (from read_inbox)")
    content: Content = Field(description="the answer: text, or a JSON object or list")
    type: TypeName | None = Field(None, description="the envelope type of the answer; may be "
                                  "left out when only one type is allowed back to the sender")


class AckArgs(_Args):
    envelope_id: EnvelopeId = Field(description="an envelope this run took with read_inbox")


class ReadMarksArgs(_Args):
    scope: Label = Field(description="the scope to read (its nested scopes included)")
    resource: Label | None = Field(None, description="only marks about this resource")
    topic: Label | None = Field(None, description="only observations and warnings on this topic")
    limit: int = Field(20, ge=1, le=MAX_READ, description="how many marks at most, strongest first")


class WriteMarkArgs(_Args):
    kind: Literal["observation", "warning", "need"] = Field(
        description="observation: something seen; warning: something others should distrust "
                    "or avoid; need: a question for a person or another agent")
    scope: Label = Field(description="the scope to write in")
    topic: Label | None = Field(None, description="observation and warning: the topic")
    content: Content | None = Field(None, description="observation: what was observed")
    confidence: float = Field(0.5, ge=0.0, le=1.0, description="observation: how sure")
    reason: ShortText | None = Field(None, description="warning: why")
    severity: Literal["info", "caution", "critical"] = Field("info",
                                                             description="warning: how serious")
    question: ShortText | None = Field(None, description="need: the question")
    blocking: bool = Field(False, description="need: whether work waits for the answer")
    priority: float = Field(0.5, ge=0.0, le=1.0, description="need: how urgent")


class ClaimArgs(_Args):
    scope: Label = Field(description="the scope of the resource")
    resource: Label = Field(description="the resource to act on")
    action: Label = Field(description="the intended verb: one the scope allows")
    confidence: float = Field(0.5, ge=0.0, le=1.0,
                              description="how strongly this agent wants to act")


class SubmitCommandArgs(_Args):
    key: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                              description="an idempotency key: the same key never submits "
                                          "twice")]
    action: TypeName = Field(description="the command's action: an envelope type this "
                                         "workspace may send to the executor")
    args: dict[str, Any] = Field(default_factory=dict,
                                 description="the action's arguments (a JSON object)")
    executor: WorkspaceId | None = Field(None, description="the workspace that runs it "
                                                           "(default: this one)")
    mutating: bool = Field(True, description="whether it changes anything outside (a "
                                             "person confirms mutating commands)")

    def model_post_init(self, _context: Any) -> None:
        _bounded(self.args)


# ---- results -------------------------------------------------------------------------------


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class EnvelopeSent(_Result):
    envelope_id: str
    to: str
    type: str
    status: str  # acknowledged (in the inbox) or validated (queued for delivery)


class InboxEnvelope(_Result):
    envelope_id: str
    sender: str
    type: str
    content: Any
    format: str
    priority: str
    in_reply_to: str | None
    sent_at: str
    attempt: int  # 1 the first time; more when an earlier run took it and did not ack


class Inbox(_Result):
    envelopes: list[InboxEnvelope]
    leased_until: str | None  # ack each envelope before then, or it goes back to the inbox


class Acked(_Result):
    envelope_id: str
    acked: bool = True


class MarkRead(_Result):
    mark_id: str
    kind: str
    scope: str
    agent_id: str | None
    strength: float | None = None
    fields: dict[str, Any]


class Marks(_Result):
    marks: list[MarkRead]


class MarkWritten(_Result):
    mark_id: str
    kind: str
    scope: str


class ClaimResult(_Result):
    verdict: str  # ALLOW, CONFLICT, BLOCKED or DENIED
    allowed: bool
    reason: str
    intent_id: str | None
    winning_agent: str | None = None


class CommandSubmitted(_Result):
    command_id: str
    state: str
    reason: str | None
    duplicate: bool


class RunInfo(BaseModel):
    """Who runs the tools and which run of theirs: recorded with every call (docs/agents.md).

    `by` names the runner (``airflow``, ``mcp``, ``python``); `ref` is one short label for
    the run (for Airflow ``af:<dag>:<task>:<run>[:<map>]``), the lease holder on the trail;
    `attrs` the details (dag_id, task_id, run_id, map_index, try_number, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
    ref: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
    attrs: dict[str, str | int | None] = Field(default_factory=dict)


__all__ = ["MAX_READ", "MAX_TOOL_CONTENT_BYTES", "AckArgs", "Acked", "ClaimArgs", "ClaimResult",
           "CommandSubmitted", "EnvelopeSent", "Inbox", "InboxEnvelope", "MarkRead",
           "MarkWritten", "Marks", "ReadInboxArgs", "ReadMarksArgs", "ReplyArgs", "RunInfo",
           "SendEnvelopeArgs", "SubmitCommandArgs", "WriteMarkArgs"]
