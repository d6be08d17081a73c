"""The WACP envelope schema (§3) and the records around it, as frozen pydantic models.

Runtime-assigned fields (id, timestamp, origin, status) exist only on `Envelope`, which the
store builds from its own rows; callers describe what to send with a `Draft`, which has no
such fields and refuses extra ones.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class Priority(StrEnum):
    NORMAL = "normal"
    URGENT = "urgent"
    BLOCKING = "blocking"


class Origin(StrEnum):
    AGENT = "agent"
    HUMAN = "human"
    #: sent by an on-insert rule (its sender is ``rule:<rule id>``)
    SYSTEM = "system"


class Status(StrEnum):
    """Envelope lifecycle (§5). `undeliverable` is the outcome of §6/§7 (sealed target or
    exhausted redelivery) kept on the row; `created` exists only before validation."""

    CREATED = "created"
    VALIDATED = "validated"
    DELIVERED = "delivered"
    ACKNOWLEDGED = "acknowledged"
    REJECTED = "rejected"
    UNDELIVERABLE = "undeliverable"


class RejectionReason(StrEnum):
    """The closed set of §9."""

    PERMISSION_DENIED = "permission_denied"
    NO_SEND_RIGHT = "no_send_right"
    INVALID_TYPE = "invalid_type"
    INVALID_STRUCTURE = "invalid_structure"
    TARGET_NOT_FOUND = "target_not_found"
    TARGET_TERMINAL = "target_terminal"


class WorkspaceState(StrEnum):
    IDLE = "idle"
    ACTIVE = "active"
    BLOCKED = "blocked"
    MIGRATING = "migrating"
    SUSPENDED = "suspended"
    INTEGRATING = "integrating"
    CLOSED = "closed"
    FAILED = "failed"


class RightType(StrEnum):
    SEND = "send"
    SEND_ONCE = "send_once"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class Right(_Frozen):
    """A port right carried in an envelope's `rights` field."""

    type: RightType
    target: StrictStr


class Payload(_Frozen):
    format: str
    content: str | None
    attachments: tuple[str, ...] = ()


class Draft(_Frozen):
    """What a caller asks to send. The runtime assigns everything else. Text fields take
    strings only (bytes are refused, not decoded), like the mapping form of a draft."""

    sender: StrictStr = Field(alias="from")
    to: StrictStr
    type: StrictStr
    content: StrictStr
    format: StrictStr = "markdown"
    attachments: tuple[StrictStr, ...] = ()
    in_reply_to: StrictStr | None = None
    priority: Priority = Priority.NORMAL
    rights: tuple[Right, ...] = ()


class Envelope(_Frozen):
    """An envelope as the store holds it: the §3 fields plus delivery bookkeeping."""

    id: str
    from_: str = Field(alias="from")
    to: str
    originator: str
    type: str
    payload: Payload
    in_reply_to: str | None = None
    rights: tuple[Right, ...] = ()
    priority: Priority
    timestamp: datetime
    origin: Origin
    status: Status
    # beyond §3: where the envelope stands in delivery
    seq: int
    reason: str | None = None
    delivered_at: datetime | None = None
    consumed_at: datetime | None = None
    attempts: int = 0
    # beyond §3: Courier's routing fields, and how often a lease on it was returned
    tags: tuple[str, ...] = ()
    headers: dict[str, Any] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)
    redeliveries: int = 0

    @property
    def sender(self) -> str:
        return self.from_

    @property
    def content(self) -> str | None:
        return self.payload.content


class SendResult(_Frozen):
    """The outcome of one send: `acknowledged` (in the inbox), `validated` (accepted and
    queued: the target is migrating or suspended, its inbox is held by a blocking envelope,
    or the delivery attempt is being retried) or `rejected` with a §9 reason."""

    envelope_id: str
    status: Status
    reason: str | None = None
    detail: str | None = None
    #: the envelope id was seen before: nothing was sent, this is the original's outcome
    duplicate: bool = False

    @property
    def accepted(self) -> bool:
        return self.status is not Status.REJECTED


class Workspace(_Frozen):
    id: str
    role: str
    #: the role followed by the roles it inherits from
    lineage: tuple[str, ...]
    parent: str | None
    originator: str
    delegation: bool
    state: WorkspaceState
    created_at: datetime
    updated_at: datetime


class Signal(_Frozen):
    """A runtime signal to a workspace: acknowledged, failed, or rejected (notification)."""

    id: int
    workspace_id: str
    signal: str
    ref: str | None
    reason: str | None
    emitted_by: str | None
    at: datetime


class PortRight(_Frozen):
    id: str
    holder: str
    target: str
    kind: RightType
    state: str
    created_by: str
    via_envelope: str | None = None


class TrailEvent(_Frozen):
    id: int
    chain: str
    seq: int
    event: str
    envelope_id: str | None
    at: datetime
    body: dict[str, Any]


class ChainMismatch(_Frozen):
    """A chain that no longer matches its head in a checkpoint (WACP §3 Integrity): it is
    gone (`seq` 0), shorter than the anchored head, or its entry at `anchored_seq` is not the
    anchored one (rolled back and written again)."""

    chain: str
    anchored_seq: int
    seq: int  # the chain's head now (0: no entries left)
    problem: str


class MissingRow(_Frozen):
    """A row the trail names that is gone (WACP §3 Integrity): deleted outright, bypassing
    the store. `kind` is one of `protocol.named_rows.KINDS`; `chain` is a chain whose entries
    name it."""

    kind: str
    id: str
    chain: str


class TrailVerification(_Frozen):
    """The result of checking every chain: the first failing entry (lowest trail id) is named
    by id, chain and sequence number, with what failed. Verified against an anchor (a
    checkpoint), it also says when that was taken, how many chains it names, and each of them
    that is shorter than it or diverges from it (each also counted in `failures`). Verified
    `since` a checkpoint, `entries` counts those after its heads (the heads re-read are not
    counted) and a chain that no longer reaches its head is in `anchor_mismatches` too."""

    ok: bool
    entries: int
    chains: int
    failures: int = 0
    failure_id: int | None = None
    failure_chain: str | None = None
    failure_seq: int | None = None
    failure: str | None = None
    anchor_taken_at: datetime | None = None
    anchored_chains: int = 0
    anchor_mismatches: tuple[ChainMismatch, ...] = ()
    #: verified since a checkpoint: when that was taken (entries before its heads unread)
    since_taken_at: datetime | None = None
    #: the signed checkpoint of the heads this run verified (None if it failed): keep it
    #: outside the database and give it as `since` to the next run
    checkpoint: dict[str, Any] | None = None
    #: rows the trail names that are missing (the first MAX_NAMED_ROWS; each is a failure)
    missing_rows: tuple[MissingRow, ...] = ()
    #: verified since a checkpoint, which rows were looked for: "all" (every row the trail
    #: names, through the checkpoint's row digests) or "named since" (a version 1 checkpoint,
    #: which has none: only the rows the entries since it name)
    since_rows: Literal["all", "named since"] | None = None
    #: verified since a checkpoint, the kinds whose table holds rows that neither the
    #: checkpoint nor the entries since account for, beyond the missing ones (rows added
    #: outside the store, or by a migration since): reported, not failures
    rows_unaccounted: tuple[str, ...] = ()
