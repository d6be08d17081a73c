"""The durable mark space's rows: its statements (`QUERIES`, from marks/queries.sql), the
columns of a mark row and how a row becomes a mark, and the per-process state of names and
of a thread's transaction. Used by `agentpost.marks.space.postgres`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, ClassVar
from uuid import UUID

from agentpost.marks.core import (
    Agent,
    DecayConfig,
    Mark,
    MarkType,
    check_text,
    mark_from_record,
    trust_weight,
)
from agentpost.marks.space import (
    WriteHook,
    min_strength_arg,
)
from agentpost.pg.queries import load_queries

QUERIES = load_queries("agentpost.marks")


#: columns of every mark-returning query, in order (reads add the strength after them)
MARK_COLUMNS = (
    "id",
    "mark_type",
    "agent_id",
    "scope",
    "created_at",
    "initial_strength",
    "supersedes",
    "resource",
    "action",
    "topic",
    "confidence",
    "source",
    "invalidates",
    "severity",
    "priority",
    "blocking",
    "resolved_by",
    "failed",
    "body",
)
_N = len(MARK_COLUMNS)
#: columns of the deferred_verdict query, in order (DeferredVerdict fields)
_VERDICT_COLUMNS = (
    "scope",
    "resource",
    "agent_id",
    "intent_id",
    "allowed",
    "winner_id",
    "boundary",
    "decided_at",
    "expires_at",
    "consumed_by",
)
#: columns of the key_get query, in order (KeyRecord fields)
_KEY_COLUMNS = ("key", "kind", "agent_id", "scope", "resource", "intent_id", "mark_id",
                "failed", "started_at", "calls")
#: mark fields stored in columns of their own; every other field goes to the JSON body
_COLUMN_FIELDS = frozenset(MARK_COLUMNS) | {"projected"}
#: fields of the write rows that are mark fields (the rest are computed in _row)
_ROW_FIELDS = (
    "mark_type",
    "scope",
    "initial_strength",
    "supersedes",
    "resource",
    "action",
    "topic",
    "confidence",
    "source",
    "invalidates",
    "severity",
    "priority",
    "blocking",
    "resolved_by",
    "failed",
)

#: reads with min_strength >= this may skip, in the index, observations and warnings whose
#: decay-times-trust strength has fallen below it; stored fades_at uses half of it as margin
FADE_FLOOR = 1e-6
#: marks whose strength is a step (full, then 0 for good): a read with min_strength > 0 (which
#: never returns a mark at strength 0) can always skip them in the index once they are at 0
_STEP_TYPES = frozenset({MarkType.INTENT, MarkType.ACTION, MarkType.NEED})
_INF = math.inf


# --------------------------------------------------------------------------- helpers


def _life(mark: Mark, decay: DecayConfig) -> float:
    """Seconds after creation past which the mark can no longer be returned by a read that
    the index may prune (see FADE_FLOOR): its TTL for an intent, the time its decay-times-
    trust strength takes to fall to FADE_FLOOR / 2 for an observation or warning, forever
    for actions and unresolved needs, never for what is at 0 from the start."""
    kind = mark.mark_type
    if mark.initial_strength <= 0.0:
        return -_INF
    if kind is MarkType.INTENT:
        return decay.intent_ttl
    if kind is MarkType.ACTION:
        return _INF
    if kind is MarkType.NEED:
        return -_INF if getattr(mark, "resolved_by", None) is not None else _INF
    weight = mark.initial_strength * trust_weight(mark)
    margin = FADE_FLOOR / 2
    if weight <= margin:
        return 0.0
    half_life = (
        decay.observation_half_life if kind is MarkType.OBSERVATION else decay.warning_half_life
    )
    return half_life * math.log2(weight / margin)


def _json_float(value: float) -> float | str:
    """JSON has no infinities; Postgres reads these strings as float8 infinities."""
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _mark(row: Sequence[Any]) -> Mark:
    """A stored mark from the first len(MARK_COLUMNS) columns of a row, validated like any
    other (the dict fields come back deep-frozen)."""
    record = dict(zip(MARK_COLUMNS[:-1], row[: _N - 1], strict=True))
    record.update(row[_N - 1] or {})
    return mark_from_record(record)


def _text_arg(value: object) -> str | None:
    """A filter value as text, or None when no stored mark can match it (not a string, or
    text that a mark could not hold): reads then return nothing, as in memory."""
    if not isinstance(value, str):
        return None
    try:
        return check_text(value)
    except ValueError:
        return None


NameKey = tuple[str, str, str, str]  # (DSN, space, agent id, name)


class _Named:
    """The agent names this process has recorded (sql/0076), so a write sends an agent's
    name only until it is recorded, then runs the plain mark_write as before names existed.
    Per process, cleared when full; another process's rename of the same id is not seen
    (the table keeps the name recorded last)."""

    _lock = threading.Lock()
    _known: ClassVar[set[NameKey]] = set()
    LIMIT = 100_000

    @classmethod
    def known(cls, key: NameKey) -> bool:
        return key in cls._known

    @classmethod
    def add(cls, keys: Sequence[NameKey]) -> None:
        with cls._lock:
            if len(cls._known) + len(keys) > cls.LIMIT:
                cls._known.clear()
            cls._known.update(keys)


class _Transaction(threading.local):
    """The calling thread's open lock() transaction, if any (per space object)."""

    conn: Any = None
    failed: bool = False
    #: the BEGIN and advisory lock of a lock() whose block has sent nothing yet: they go in
    #: front of its first statement, in the same round trip (statement, parameters)
    prelude: tuple[str, dict[str, Any]] | None = None
    pending: list[tuple[list[WriteHook], list[tuple[UUID, Mark]]]] | None = None
    named: list[NameKey] | None = None  # names recorded in it, known once it commits
    #: the run recorded with this thread's marks (recording_run): the writing agent's id
    #: and the mark_runs columns
    run: tuple[UUID, dict[str, Any]] | None = None




# --------------------------------------------------------------------------- arguments


def _names(agents: Sequence[Agent]) -> dict[str, list[str]]:
    """The agent_ids / agent_names arguments of the statements that record names."""
    return {"agent_ids": [str(a.id) for a in agents], "agent_names": [a.name for a in agents]}


_threshold = min_strength_arg
