"""Caller-chosen keys: at most one mark write, or one guarded call, per key in a space.

A retried caller (an Airflow task try, a restarted agent) cannot tell from the marks alone
whether its earlier attempt already wrote its mark or ran its tool: an agent's own action
does not block it (the guard's claims exclude the agent itself), and on Postgres a call that
dies inside `Guard.execute` rolls its intent back with it. So the caller names the attempt
with a key that stays the same across retries, and the space keeps one `KeyRecord` per key:

- ``write``: the mark written under the key, recorded in the write's transaction
  (`SpaceBase.write_once`); a later write under the key returns that mark's id.
- ``execute``: a guarded call (`Guard.execute_once`). The record is committed *before* the
  tool runs, on its own (outside the guard's lock transaction, so a crash cannot take it
  back), and settled with the action mark in the action's transaction. A record without a
  mark is a call that started and recorded no outcome: it may or may not have acted, and
  nothing under the key runs again until a person looks (`UnsettledCall`, `release_key`).
  A call whose tool raised is settled as failed and may be run again under the key.

There is no expiry: how long ago an unsettled call started says nothing about whether its
effect happened.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from agentpost.marks.core import InvalidArgument, MarkspaceError, check_text

#: the longest key (Airflow's derived keys fit; longer ones are hashed by the caller)
MAX_KEY = 200

KeyKind = Literal["write", "execute"]


class KeyRecord(BaseModel):
    """What one key did in a space: the mark it wrote, or the guarded call it made.

    ``mark_id`` is the written mark (``write``) or the action mark recording the call's
    outcome (``execute``); None for a call that started and has no recorded outcome.
    ``failed``: the tool raised (its action is a failed action). ``calls`` counts the
    calls made under the key (a failed call may be followed by another)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1, max_length=MAX_KEY)
    kind: KeyKind
    agent_id: UUID
    scope: str
    resource: str | None = None
    intent_id: UUID | None = None
    mark_id: UUID | None = None
    failed: bool = False
    started_at: float
    calls: int = 1

    @property
    def settled(self) -> bool:
        """Whether the outcome is recorded (always, for a write)."""
        return self.mark_id is not None


class KeyInUse(MarkspaceError):
    """The key already names another write or call (another kind, agent, scope or
    resource), or a call under it is under way: nothing was written."""


class UnsettledCall(MarkspaceError):
    """A guarded call under this key started its tool and recorded no outcome (its process
    died, or the tool raised a BaseException such as SystemExit): it may or may not have
    acted, so the guard does not call it again. Nothing was written."""

    def __init__(self, record: KeyRecord) -> None:
        self.record = record
        started = datetime.fromtimestamp(record.started_at, UTC).isoformat(timespec="seconds")
        super().__init__(
            f"key {record.key!r}: a call of agent {record.agent_id} on {record.resource!r} "
            f"in scope {record.scope!r} started at {started} (call {record.calls}) and "
            "recorded no outcome; it may or may not have run, so it is not run again. "
            f"Check whether {record.resource!r} was changed, then either release the key "
            "(space.release_key(key): the next call runs it) or leave it")


def check_key(key: object) -> str:
    """A key as the spaces store it: a non-empty string of at most MAX_KEY characters."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidArgument("a key is a non-empty string")
    if len(key) > MAX_KEY:
        raise InvalidArgument(f"a key is at most {MAX_KEY} characters, not {len(key)}")
    try:
        return check_text(key)
    except ValueError as exc:
        raise InvalidArgument(f"bad key: {exc}") from None


def check_same(record: KeyRecord, kind: KeyKind, agent_id: UUID, scope: str,
               resource: str | None) -> None:
    """Refuse a key reused for something else (KeyInUse): one key, one write or call."""
    if (kind, agent_id, scope, resource) != (record.kind, record.agent_id, record.scope,
                                             record.resource):
        theirs = _what(record.kind, record.agent_id, record.scope, record.resource)
        mine = _what(kind, agent_id, scope, resource)
        raise KeyInUse(f"key {record.key!r} names {theirs}, not {mine}")


def _what(kind: KeyKind, agent_id: UUID, scope: str, resource: str | None) -> str:
    what = "a write" if kind == "write" else "a call"
    on = f" on {resource!r}" if resource is not None else ""
    return f"{what} of agent {agent_id} in scope {scope!r}{on}"


__all__ = ["MAX_KEY", "KeyInUse", "KeyRecord", "UnsettledCall", "check_key", "check_same"]
