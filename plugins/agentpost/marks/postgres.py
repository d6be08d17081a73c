"""`PostgresMarkSpace`: the mark space on Postgres, durable and shared by many processes.

Same methods and behaviour as the in-memory `space.MarkSpace` (`MarkSpaceProtocol`, plus
`write_many`, `all_marks`, `registered_scopes`, `close`, `len()`); what differs is where the
marks live. Only here: the agent names the pages read (`record_names`, `agent_names`).
Tables and SQL functions are in `sql/0007_marks.sql` (and later migrations), the statements
in `marks/queries.sql`.

Why it is built this way:

- **Many spaces, one database.** Every row carries its space's name, so a space is only a
  name: constructing one runs no DDL, reads nothing and opens no connection, and spaces never
  see each other's marks. Objects on the same DSN share one connection pool per process
  (sized by the first of them), closed with the last.
- **Marks are immutable rows** (the table is only ever inserted into). Strength is never
  stored: every read computes it in SQL from the row and the space's clock
  (`agentpost.marks_at`: decay, trust, supersession, warnings), and reads write nothing
  (P28). The Python side passes `now`, so an injected clock drives SQL as well. What a mark
  needs from its scope to decay (half-life, TTL) is copied onto the row at write time, so
  every process computes the same strength for it (and re-registering a scope affects later
  marks only, as in memory). Content fields are stored as `json`, not `jsonb`, so a mark
  comes back exactly as written (jsonb would turn 1e+16 into an integer).
- **Scopes are configuration, not data.** Each process passes them to the constructor or
  `register_scope`; they are never stored. A process must register a scope (or an ancestor)
  to write or read it, as in memory.
- **Writes are one statement** (`agentpost.mark_write`). Checks run first in Python with the
  shared core functions, so both backends accept and refuse exactly the same marks and a
  refused write sends nothing; then one statement stores the batch, stamps created_at and
  queues it for subscribers. created_at is max(clock, latest created_at of the space) (P32),
  without a per-space lock: no write gets a time earlier than a mark already committed in
  its space. Ids are made in SQL from the write sequence (`agentpost.mark_id`), so marks that
  tie on created_at still order by write order under P32's (created_at, id). Until this
  process has recorded the writer's name (`agentpost.mark_agents`, sql/0076), the same
  call records it (a primary-key probe; a row written only when the name is new or
  changed); after that, writes run the plain statement, as before names were recorded.
- **Reads are one statement** through plpgsql functions (`mark_read_at`, `mark_strength`), so
  their plans are made once per session. Reads skip faded marks in the index (`fades_at`:
  expired intents, resolved needs, observations and warnings decayed below FADE_FLOOR when
  min_strength allows it) instead of computing their strength. A read with min_strength <= 0
  returns marks at strength 0 too (never superseded ones), as the package does, and so
  prunes nothing (`mark_read_at`, sql/0068).
- **The guard's lock is per (space, scope, resource)**: `lock()` opens a transaction on a
  pooled connection pinned to the calling thread and takes a transaction-scoped advisory lock
  on the key (never a global lock). Every call this object gets from that thread inside the
  block runs in that transaction (sees its own writes, commits with it). If the block raises,
  or a statement inside it failed, the transaction rolls back: the writes made inside it are
  undone (in memory they stay). Hooks of writes made inside the block fire after the commit,
  none after a rollback. A nested lock() joins the open transaction.
- **Subscriptions and queues are tables.** A write queues its marks in the same statement;
  a poll deletes what it returns, so a mark is handed out once (P51), in write order (P52),
  also to pollers in several processes. Write hooks are process-local: they fire in the
  process that wrote, for writes made through the object they were added to.
- **Deferred verdicts are rows** (`agentpost.mark_verdicts`, `sql/0014_deferred_grants.sql`):
  a resolution boundary replaces the verdicts of its (scope, resource) in one statement,
  inside the guard's lock() transaction, so a boundary run by one process is what every
  other process's Guard answers from (docs/marks.md has the contract).
- **The quota is counted in the database** (`max_marks_per_agent`): a write of a space with
  a quota takes a transaction-scoped advisory lock on (space, agent), counts the agent's
  live marks (index `marks_agent`, sql/0065_mark_quota.sql) and inserts in that transaction,
  so two processes writing for one agent never both see room for one more. Spaces without a
  quota write as before, one statement, no lock.
- **gc() is the one statement that deletes marks**: superseded ones and those that can never
  be read again (`space.collectable`, the same rule in SQL with each row's stored decay).
- Database errors never leak: they come out as agentpost's typed errors
  (`agentpost.pg.db.translate`): no schema is a ConfigurationError, no server
  StoreUnavailable, anything else StoreError.

Do not carry a PostgresMarkSpace across `fork()`: create it in the process that uses it.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import threading
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar
from uuid import UUID

import psycopg2

from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    Mark,
    MarkType,
    Need,
    Scope,
    ScopeVisibility,
    UnknownMark,
    UnknownScope,
    WatchPattern,
    check_text,
    cluster_needs,
    mark_from_record,
    project_mark,
    read_order_key,
    trust_weight,
)
from agentpost.marks.keys import KeyInUse, KeyRecord, check_key, check_same
from agentpost.marks.space import (
    GC_EPSILON,
    AnyMark,
    NeedCluster,
    SpaceBase,
    WriteHook,
    agent_id_of,
    authorize,
    fire_hooks,
    fit_tokens,
    grace_arg,
    mark_type_arg,
    min_strength_arg,
    resolved_copy,
)
from agentpost.pg.db import Database, translate
from agentpost.pg.queries import load_queries
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import ConfigurationError, StoreError

__all__ = ["MARK_COLUMNS", "PostgresMarkSpace"]

log = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------- pools


class _Pools:
    """One connection pool per (DSN, process), shared by the spaces on that DSN and closed
    with the last of them. Keyed by pid so a forked child never touches its parent's
    sockets (it gets pools of its own; the inherited ones are left alone, not closed)."""

    _lock = threading.Lock()
    _pools: ClassVar[dict[tuple[str, int], list[Any]]] = {}

    @classmethod
    def acquire(cls, dsn: str, pool_size: int) -> Database:
        key = (dsn, os.getpid())
        with cls._lock:
            entry = cls._pools.get(key)
            if entry is None:
                entry = cls._pools[key] = [Database(dsn, None, pool_size=pool_size), 0]
            entry[1] += 1
            return entry[0]

    @classmethod
    def release(cls, dsn: str, db: Database) -> None:
        key = (dsn, os.getpid())
        with cls._lock:
            entry = cls._pools.get(key)
            if entry is None or entry[0] is not db:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del cls._pools[key]
        db.dispose()


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
    pending: list[tuple[list[WriteHook], list[tuple[UUID, Mark]]]] | None = None
    named: list[NameKey] | None = None  # names recorded in it, known once it commits


# --------------------------------------------------------------------------- the space


class PostgresMarkSpace(SpaceBase):
    """The mark space in Postgres: durable, shared by processes, many spaces per database."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """`_init`'s parameters (its signature is shown as this one's). A str first argument
        is the DSN of the old signature `(dsn, scopes, clock, space)`: still accepted, with a
        DeprecationWarning, so existing callers keep working."""
        if args and isinstance(args[0], str):
            warnings.warn("PostgresMarkSpace(dsn, ...) is deprecated: pass dsn=",
                          DeprecationWarning, stacklevel=2)
            old = dict(zip(("dsn", "scopes", "clock", "space"), args, strict=False))
            if len(args) > len(old) or old.keys() & kwargs.keys():
                raise InvalidArgument(
                    "the old PostgresMarkSpace(dsn, scopes, clock, space) call got too many "
                    f"arguments or one twice: {sorted(old.keys() & kwargs.keys())}"
                )
            args, kwargs = (), {**kwargs, **old}
        self._init(*args, **kwargs)

    def _init(
        self,
        scopes: list[Scope] | None = None,
        clock: float | None = None,
        max_marks_per_agent: int | None = None,
        *,
        dsn: str | None = None,
        space: str = "default",
        pool_size: int = 4,
        max_content_bytes: int | None = None,
    ) -> None:
        dsn = dsn or os.environ.get("AGENTPOST_DSN")
        if not dsn:
            raise ConfigurationError("no mark space database: pass a DSN or set AGENTPOST_DSN")
        if not isinstance(space, str) or not space or len(space) > 200:
            raise InvalidArgument("a space name is a non-empty string of at most 200 characters")
        try:
            check_text(space)
        except ValueError as exc:
            raise InvalidArgument(f"bad space name: {exc}") from None
        self.space = space
        self.dsn = libpq_dsn(dsn)
        self._tx = _Transaction()
        super().__init__(scopes, clock, max_marks_per_agent, max_content_bytes)
        self._db: Database | None = _Pools.acquire(self.dsn, pool_size)

    # ----------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Give back the connection pool (closed with the last space using it)."""
        db, self._db = self._db, None
        if db is not None:
            _Pools.release(self.dsn, db)

    def __enter__(self) -> PostgresMarkSpace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresMarkSpace(space={self.space!r})"

    # ----------------------------------------------------------------- SQL

    @property
    def _pool(self) -> Database:
        if self._db is None:
            raise ConfigurationError("this PostgresMarkSpace is closed")
        return self._db

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        """A cursor: on this thread's lock() transaction if one is open, else on a pooled
        connection in autocommit. Database errors come out translated either way."""
        conn = self._tx.conn
        if conn is None:
            with self._pool.cursor() as cur:
                yield cur
            return
        try:
            with conn.cursor() as cur:
                yield cur
        except psycopg2.Error as exc:
            self._tx.failed = True  # the transaction is aborted: lock() will roll it back
            raise translate(exc) from None

    def _rows(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self._cursor() as cur:
            cur.execute(QUERIES[name], {"space": self.space, **params})
            return cur.fetchall() if cur.description is not None else []

    def write_many(self, agent: Agent, marks: Sequence[Mark]) -> list[UUID]:
        """Write several marks in one statement, all or nothing: every mark is checked
        before anything is sent. Hooks fire after, once per mark, in write order."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        checked = self._checked(marks)
        scopes = [self.get_scope(m.scope) for m in checked]
        for mark, scope in zip(checked, scopes, strict=True):
            authorize(agent, mark, scope)
        items = [(m, agent.id, s.decay, s.visibility) for m, s in zip(checked, scopes, strict=True)]
        if self.max_marks_per_agent is None:
            return [m.id for m in self._store(items, agent)]
        # count and write under one advisory lock on (space, agent), across processes
        with self._transaction("agentpost.marks-quota:" + json.dumps([self.space, str(agent.id)])):
            self._check_quota(agent, checked)
            return [m.id for m in self._store(items, agent)]

    def _quota_state(self, agent_id: UUID, targets: set[UUID]) -> tuple[int, set[UUID]]:
        rows = self._rows("quota_state", {"agent_id": str(agent_id),
                                          "targets": [str(t) for t in targets]})
        held, owned = rows[0]
        return int(held), {UUID(str(t)) for t in owned}

    def _store(
        self, items: Sequence[tuple[Mark, UUID, DecayConfig, ScopeVisibility]],
        writer: Agent | None = None,
    ) -> list[Mark]:
        """Insert checked marks (mark, agent id, governing decay, scope visibility) and
        return them as stored, recording the `writer`'s name in the same call; hooks fire
        now, or at the commit of an open lock()."""
        if not items:
            return []
        now = self.now()
        if not math.isfinite(now):
            raise InvalidArgument(f"the space's clock returned {now!r}")
        rows = [self._row(m, agent_id, decay, vis) for m, agent_id, decay, vis in items]
        params = {"rows": json.dumps(rows), "now": now}
        key = (self.dsn, self.space, str(writer.id), writer.name) if writer else None
        if key is None or not key[3] or _Named.known(key):
            result = self._rows("write", params)
        else:
            result = self._rows("write_named", {**params, **_names([writer])})
            if all(row[3] for row in result):
                self._remember(key)
        stamped = {int(row[0]): (UUID(str(row[1])), row[2]) for row in result}
        stored = [
            mark.model_copy(
                update={"id": stamped[n][0], "agent_id": agent_id, "created_at": stamped[n][1]}
            )
            for n, (mark, agent_id, _, _) in enumerate(items, start=1)
        ]
        with self._lock:
            hooks = list(self._hooks.values())
        if hooks:
            writes = [(m.agent_id, m) for m in stored]
            if self._tx.pending is not None:
                self._tx.pending.append((hooks, writes))
            else:
                fire_hooks(hooks, writes)
        return stored

    def _remember(self, key: NameKey) -> None:
        """The name is recorded: at once, or when this thread's open transaction commits."""
        if self._tx.named is None:
            _Named.add([key])
        else:
            self._tx.named.append(key)

    @staticmethod
    def _row(
        mark: Mark, agent_id: UUID, decay: DecayConfig, visibility: ScopeVisibility
    ) -> dict[str, Any]:
        """The JSON row the write statement stores: typed columns, the decay parameters the
        strength functions need, the fade bound, and the content fields as the body."""
        data = mark.model_dump(mode="json")
        row: dict[str, Any] = {name: data.get(name) for name in _ROW_FIELDS}
        kind = mark.mark_type
        row.update(
            agent_id=str(agent_id),
            half_life=(
                decay.observation_half_life
                if kind is MarkType.OBSERVATION
                else decay.warning_half_life
                if kind is MarkType.WARNING
                else None
            ),
            ttl=decay.intent_ttl if kind is MarkType.INTENT else None,
            life=_json_float(_life(mark, decay)),
            visibility=visibility.value,
            body={k: v for k, v in data.items() if k not in _COLUMN_FIELDS},
        )
        return row

    # ----------------------------------------------------------------- read

    def get(self, mark_id: UUID) -> Mark | None:
        """The stored mark with this id, in full (no visibility rules), or None."""
        if isinstance(mark_id, str):
            try:
                mark_id = UUID(mark_id)
            except ValueError:
                return None
        if not isinstance(mark_id, UUID):
            return None
        rows = self._rows("get", {"id": str(mark_id)})
        return _mark(rows[0]) if rows else None

    def _read(
        self,
        scope: str,
        resource: str | None = None,
        topic: str | None = None,
        mark_type: MarkType | None = None,
        min_strength: float = DEFAULT_MIN_STRENGTH,
        reader: Agent | None = None,
        max_tokens: int | None = None,
        *,
        nested: bool = True,
    ) -> list[AnyMark]:
        """Marks of `scope` and its nested scopes (only `scope` with `nested=False`)
        matching the filters whose effective strength (decay, trust, supersession, warnings;
        at now, computed in SQL) is >= `min_strength`, never superseded ones (so a threshold
        <= 0 returns marks at strength 0 too, as the package), strongest first (ties:
        created_at, id), cut to `max_tokens` (`space.fit_tokens`). `reader` None is
        infrastructure and sees full marks; an Agent sees each mark as the stricter of the
        read scope's visibility and the mark's own scope's (`_visible`, in Python over the
        rows, §7.4). Each mark decays with its own stored DecayConfig (the package: the read
        scope's). One statement (sql/0068's mark_read_at: the exact scope, then a C-collation
        range over its nested scopes, both index scans), and it writes nothing (P28)."""
        fit_tokens([], max_tokens)  # a bad budget is refused before the query
        kind = mark_type_arg(mark_type)
        if reader is not None and not isinstance(reader, Agent):
            raise InvalidArgument(f"reader must be an Agent or None, not {type(reader).__name__}")
        threshold = _threshold(min_strength)
        definition = self.get_scope(scope)
        if _text_arg(scope) is None:  # an unstorable name under a defined ancestor
            return []
        if (
            reader is not None
            and definition.visibility is ScopeVisibility.CLASSIFIED
            and not reader.can_read(scope)
        ):
            return []
        params = {"resource": None, "topic": None}
        for name, value in (("resource", resource), ("topic", topic)):
            if value is not None:
                params[name] = _text_arg(value)
                if params[name] is None:
                    return []
        now = self.now()
        rows = self._rows(
            "read",
            {
                **params,
                "scope": scope,
                "nested": nested,
                "mark_type": None if kind is None else kind.value,
                "min_strength": threshold,
                "now": now,
                "prune": self._prune(now, kind, resource is not None, threshold),
            },
        )
        scored = [(_mark(row), row[_N]) for row in rows]
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        return fit_tokens(self._visible([m for m, _ in scored], definition, scope, reader),
                          max_tokens)

    def get_intents(self, scope: str, resource: str) -> list[Intent]:
        """The intents on `resource` in `scope` and its child scopes that are neither
        superseded nor past their TTL (warnings do not count here), in write order."""
        self.get_scope(scope)
        if _text_arg(scope) is None or _text_arg(resource) is None:
            return []
        rows = self._rows("intents", {"scope": scope, "resource": resource, "now": self.now()})
        return [m for m in map(_mark, rows) if isinstance(m, Intent)]

    def gc(self, grace_period: float = 0.0) -> int:
        """Delete, in one statement, superseded marks and the marks `space.collectable`
        says are garbage (the same rule in SQL, with each mark's stored decay). Returns how
        many rows went. Safe beside writers in other processes: a mark is only deleted once
        no read can return it again."""
        grace = grace_arg(grace_period)
        rows = self._rows("gc", {"now": self.now(), "grace": grace, "epsilon": GC_EPSILON})
        return len(rows)

    @staticmethod
    def _prune(now: float, kind: MarkType | None, by_resource: bool, threshold: float) -> float:
        """The fades_at bound a read may give the index: now when no mark that fades before
        now can qualify (step-strength marks, which are all a resource can hold, or a
        threshold at or above FADE_FLOOR), else -Infinity (no pruning). A threshold <= 0
        asks for marks at strength 0 too: no pruning."""
        if threshold <= 0.0:
            return -_INF
        if by_resource or kind in _STEP_TYPES or threshold >= FADE_FLOOR:
            return now
        return -_INF

    def strength_of(self, mark: Mark) -> float:
        """The mark's effective strength now, as `read` computes it, in SQL. A mark not in
        this space gets decay and trust with its scope's current DecayConfig, then the
        supersession and warnings recorded against its id."""
        if not isinstance(mark, Mark):
            raise InvalidArgument(f"expected a Mark, got {type(mark).__name__}")
        now = self.now()
        if mark.id is not None:
            stored = self._rows("strength_of_stored", {"id": str(mark.id), "now": now})[0][0]
            if stored is not None:
                return float(stored)
        decay = self.get_scope(mark.scope).decay
        kind = mark.mark_type
        rows = self._rows(
            "strength_of_unstored",
            {
                "id": None if mark.id is None else str(mark.id),
                "mark_type": kind.value,
                "initial_strength": mark.initial_strength,
                "created_at": now if mark.created_at is None else mark.created_at,
                "now": now,
                "half_life": (
                    decay.observation_half_life
                    if kind is MarkType.OBSERVATION
                    else decay.warning_half_life
                    if kind is MarkType.WARNING
                    else None
                ),
                "ttl": decay.intent_ttl if kind is MarkType.INTENT else None,
                "resolved": getattr(mark, "resolved_by", None) is not None,
                "source": getattr(mark, "source", None),
            },
        )
        return float(rows[0][0])

    def active_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Marks at strength > 0 now, in one scope (exact) or all, full (infrastructure
        view: telemetry gauges, aggregators), in read order."""
        kind = mark_type_arg(mark_type)
        if scope is not None and _text_arg(scope) is None:
            return []
        now = self.now()
        rows = self._rows(
            "active_marks",
            {
                "scope": scope,
                "mark_type": None if kind is None else kind.value,
                "now": now,
                "prune": now if kind in _STEP_TYPES else -_INF,
            },
        )
        scored = [(_mark(row), row[_N]) for row in rows]
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        return [m for m, _ in scored]

    def all_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Every stored mark of the space, whatever its strength, in write order."""
        kind = mark_type_arg(mark_type)
        if scope is not None and _text_arg(scope) is None:
            return []
        rows = self._rows(
            "all_marks", {"scope": scope, "mark_type": None if kind is None else kind.value}
        )
        return [_mark(row) for row in rows]

    @property
    def _marks(self) -> Mapping[UUID, Mark]:
        """Every stored mark by id, in write order: a read-only snapshot standing in for the
        in-memory space's (and the package's) private ``_marks`` dict, which code written
        against the package reads. Loads the whole space: for tests and small spaces."""
        return {mark.id: mark for mark in self.all_marks()}

    def __len__(self) -> int:
        return int(self._rows("count", {})[0][0])

    def count_marks(self) -> dict[tuple[str, str], int]:
        """(scope, mark type) -> number of stored marks, any strength: the guard's
        `markspace.space.total_marks` gauge. Counts the whole space (an index-only scan)."""
        return {(scope, kind): int(n) for scope, kind, n in self._rows("count_marks", {})}

    # ----------------------------------------------------------------- needs

    def resolve(
        self,
        need_mark_id: uuid.UUID,
        resolving_action_id: uuid.UUID,
        agent: Agent | None = None,
    ) -> uuid.UUID:
        """Resolve a need (§8.3) with a stored, successful action: write a copy with
        `resolved_by` that supersedes it, so the need is at strength 0 on the next read
        (P29, P30). `agent`, if given, must be allowed to write actions in the need's scope.
        Returns the copy's id. Serialized per need across processes, so a need is resolved
        once."""
        if not isinstance(need_mark_id, UUID):
            raise UnknownMark(f"no mark {need_mark_id!r} in this space")
        with self._transaction(f"agentpost.marks.resolve:{self.space}:{need_mark_id}"):
            need = self.get(need_mark_id)
            if need is None:
                raise UnknownMark(f"no mark {need_mark_id} in this space")
            action = self._check_resolvable(need, resolving_action_id, agent)
            assert isinstance(need, Need)
            copy = resolved_copy(need, action)
            try:
                visibility = self.get_scope(need.scope).visibility
            except UnknownScope:
                # the scope is another process's business: queue it for authorized readers only
                visibility = ScopeVisibility.CLASSIFIED
            stored = self._store([(copy, need.agent_id, DecayConfig(), visibility)])
        return stored[0].id

    def _is_superseded(self, mark: Mark) -> bool:
        return bool(self._rows("superseded", {"id": str(mark.id)})[0][0])

    def read_with_claims(
        self, scope: str, resource: str, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[list[Mark], list[Action]]:
        """`read(scope, resource=...)` (full marks) and `claims(scope, resource)` in one
        statement: the guard's view of a resource, one round trip."""
        threshold = _threshold(min_strength)
        self.get_scope(scope)
        if _text_arg(scope) is None or _text_arg(resource) is None:
            return [], []
        now = self.now()
        rows = self._rows("read_with_claims", {
            "scope": scope, "resource": resource, "min_strength": threshold, "now": now,
            "prune": self._prune(now, None, True, threshold)})
        scored = [(_mark(row), row[_N]) for row in rows if not row[_N + 1]]
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        held = [_mark(row) for row in rows if row[_N + 1]]
        return ([m for m, _ in scored],
                sorted((m for m in held if isinstance(m, Action)),
                       key=lambda m: (m.created_at, m.id)))

    def claims(self, scope: str, resource: str) -> list[Action]:
        """The actions holding (scope, resource): neither failed nor superseded, whatever
        warnings say (P39, §9.5), in write order."""
        self.get_scope(scope)
        if _text_arg(scope) is None or _text_arg(resource) is None:
            return []
        rows = self._rows("claims", {"scope": scope, "resource": resource})
        return [m for m in map(_mark, rows) if isinstance(m, Action)]

    def aggregate_needs(self) -> list[NeedCluster]:
        """The open needs (unresolved, unsuperseded, strength > 0 after warnings) of
        every scope, one cluster per scope (`core.cluster_needs`, §8.4)."""
        needs = [_mark(row) for row in self._rows("unresolved_needs", {"now": self.now()})]
        return cluster_needs([n for n in needs if isinstance(n, Need)])

    # ----------------------------------------------------------------- subscriptions

    def subscribe(self, agent: Agent, patterns: list[WatchPattern]) -> None:
        """Queue marks written from now on (by any process) that match any pattern
        (§13.3). Replaces an earlier subscription and drops its queue (P48, P49)."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        patterns = tuple(patterns)
        if not patterns or not all(isinstance(p, WatchPattern) for p in patterns):
            raise InvalidArgument("subscribe needs a non-empty list of WatchPattern")
        self._rows(
            "subscribe",
            {
                "agent_id": str(agent.id),
                "patterns": json.dumps([p.model_dump(mode="json") for p in patterns]),
                "read_scopes": list(agent.read_scopes),
            },
        )

    def unsubscribe(self, agent: Agent) -> None:
        """Drop the agent's subscription and whatever is queued for it."""
        self._rows("unsubscribe", {"agent_id": str(agent_id_of(agent))})

    def get_watched_marks(self, agent: Agent, clear: bool = True) -> list[AnyMark]:
        """Marks queued for the agent since its last poll, in write order (P50–P52); with
        `clear` they are taken from the queue, so each is handed out once (P51), also
        across processes polling for the same agent."""
        rows = self._rows(
            "take_watched" if clear else "peek_watched", {"agent_id": str(agent_id_of(agent))}
        )
        marks = []
        for row in rows:
            mark = _mark(row)
            marks.append(project_mark(mark) if row[_N] else mark)
        return marks

    # ----------------------------------------------------------------- agent names

    def record_names(self, agents: Iterable[Agent]) -> int:
        """Record each agent's name in this space (`agentpost.mark_agents`, sql/0076), as
        its first write does, so pages name it before it writes (a fleet apply). An agent
        recorded under that name already writes nothing. Returns how many names were new
        or changed."""
        agents = list(agents)
        if not all(isinstance(a, Agent) for a in agents):
            raise InvalidArgument("record_names takes Agents")
        return int(self._rows("name_agents", _names(agents))[0][0]) if agents else 0

    def agent_names(self, ids: Iterable[UUID] | None = None) -> dict[UUID, str]:
        """The names recorded in this space (the newest per agent): of `ids`, or all."""
        wanted = None if ids is None else [str(agent_id_of(i)) for i in ids]
        return {UUID(str(i)): n for i, n in self._rows("agent_names", {"ids": wanted})}

    # ----------------------------------------------------------------- deferred verdicts

    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int:
        """Keep a boundary's verdicts in the database (sql/0014_deferred_grants.sql),
        replacing the previous boundary's on the key, for every process to see. One
        statement; inside the guard's lock() it commits with the boundary's decisions."""
        checked = self._check_verdicts(scope, resource, verdicts)
        if _text_arg(scope) is None or _text_arg(resource) is None:
            raise InvalidArgument(f"no intent can be on {(scope, resource)!r}")
        rows = [
            {
                "agent_id": str(v.agent_id),
                "allowed": v.allowed,
                "intent_id": str(v.intent_id),
                "winner_id": None if v.winner_id is None else str(v.winner_id),
            }
            for v in checked
        ]
        params = {"scope": scope, "resource": resource, "now": self.now(), "rows": json.dumps(rows)}
        boundary = self._rows("record_boundary", params)[0][0]
        if boundary is None:
            raise InvalidArgument(f"a verdict names no intent of its agent on {resource!r}")
        return int(boundary)

    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None:
        """The agent's verdict at the latest boundary on (scope, resource), while its
        intent's TTL lasts."""
        if _text_arg(scope) is None or _text_arg(resource) is None:
            return None
        rows = self._rows(
            "deferred_verdict",
            {"scope": scope, "resource": resource, "agent_id": str(agent_id_of(agent_id)),
             "now": self.now()},
        )
        if not rows:
            return None
        return DeferredVerdict(**dict(zip(_VERDICT_COLUMNS, rows[0], strict=True)))

    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool:
        """Mark the agent's unconsumed ALLOW on (scope, resource) as used by the action."""
        if _text_arg(scope) is None or _text_arg(resource) is None:
            return False
        rows = self._rows(
            "consume_grant",
            {"scope": scope, "resource": resource, "agent_id": str(agent_id_of(agent_id)),
             "action_id": str(action_id), "now": self.now()},
        )
        return bool(rows)

    # ----------------------------------------------------------------- keys (keys.py)

    def key_record(self, key: str) -> KeyRecord | None:
        """What `key` did in this space (sql/0043_mark_keys.sql), or None."""
        rows = self._rows("key_get", {"key": check_key(key)})
        return KeyRecord(**dict(zip(_KEY_COLUMNS, rows[0], strict=True))) if rows else None

    def key_lock(self, key: str) -> AbstractContextManager[None]:
        """A transaction holding an advisory lock on the key (joins an open lock())."""
        return self._transaction("agentpost.marks-key:" + json.dumps([self.space,
                                                                      check_key(key)]))

    def record_key(self, record: KeyRecord) -> KeyRecord:
        """A write's record joins the open transaction; a call's start is committed at once
        on a connection of its own, so that no rollback of the guard's lock transaction (a
        crash in the tool) can take it back."""
        params = {"key": record.key, "kind": record.kind, "agent_id": str(record.agent_id),
                  "scope": record.scope, "resource": record.resource,
                  "intent_id": str(record.intent_id) if record.intent_id else None,
                  "mark_id": str(record.mark_id) if record.mark_id else None,
                  "started_at": record.started_at}
        if record.kind == "execute":
            with self._pool.cursor() as cur:  # autocommit, outside any lock() transaction
                cur.execute(QUERIES["key_put"], {"space": self.space, **params})
                rows = cur.fetchall()
        else:
            rows = self._rows("key_put", params)
        if not rows:
            earlier = self.key_record(record.key)
            if earlier is not None:
                check_same(earlier, record.kind, record.agent_id, record.scope,
                           record.resource)
            raise KeyInUse(f"key {record.key!r} is in use")
        return record.model_copy(update={"calls": int(rows[0][0])})

    def settle_key(self, key: str, mark_id: UUID, failed: bool = False) -> None:
        """The action of a started call, in the open transaction (with the action mark)."""
        rows = self._rows("key_settle", {"key": check_key(key), "mark_id": str(mark_id),
                                         "failed": bool(failed)})
        if not rows:
            raise KeyInUse(f"key {key!r} names no call under way")

    def release_key(self, key: str) -> bool:
        """Delete the record of a call that recorded no outcome (a person checked it)."""
        return bool(self._rows("key_release", {"key": check_key(key)}))

    # ----------------------------------------------------------------- guard lock

    @contextmanager
    def lock(self, scope: str, resource: str) -> Iterator[None]:
        """Serialize guard decisions on one (scope, resource) of this space, across threads
        and processes: a transaction holding an advisory lock on the key, in which this
        object's calls from this thread run until the block ends. Re-entrant (a nested
        lock() joins the open transaction). Raising inside the block rolls it back."""
        if not isinstance(scope, str) or not isinstance(resource, str):
            raise InvalidArgument("lock() takes a scope and a resource, both strings")
        with self._transaction("agentpost.marks:" + json.dumps([self.space, scope, resource])):
            yield

    @contextmanager
    def joined(self, conn: Any) -> Iterator[None]:
        """Run this object's calls from this thread, inside the block, in a transaction the
        caller holds open on `conn` (a psycopg2 connection to the same database, such as the
        one `Database.transaction()` yields): they commit or roll back with the caller's
        other statements (a fleet apply's subscriptions with its registry changes). Write
        hooks of marks written inside do not fire: the caller owns the commit."""
        tx = self._tx
        if tx.conn is not None:
            raise InvalidArgument("this thread already has a transaction open on this space")
        # hooks held and never fired, names recorded never remembered: the caller commits
        tx.conn, tx.failed, tx.pending, tx.named = conn, False, [], []
        try:
            yield
        finally:
            tx.conn = tx.pending = tx.named = None

    @contextmanager
    def _transaction(self, key: str) -> Iterator[None]:
        """Hold the advisory lock `key` in a transaction pinned to this thread (or join the
        thread's open one); commit at the end of the block, roll back if it raises or if a
        statement inside failed. Hooks of the writes made inside fire after the commit."""
        tx = self._tx
        if tx.conn is not None:
            self._rows("lock", {"key": key})
            yield
            return
        pending: list[tuple[list[WriteHook], list[tuple[UUID, Mark]]]] = []
        named: list[NameKey] = []
        with self._pool.cursor() as cur:
            # A psycopg2 error raised in this block (BEGIN, ROLLBACK, COMMIT) reaches
            # Database.cursor, which translates it and drops a broken connection.
            tx.conn, tx.failed, tx.pending, tx.named = cur.connection, False, pending, named
            try:
                try:
                    cur.execute("BEGIN; " + QUERIES["lock"], {"key": key})  # one round trip
                    yield
                except BaseException:
                    tx.conn = tx.pending = tx.named = None
                    cur.execute("ROLLBACK")
                    raise
                tx.conn = tx.pending = tx.named = None
                if tx.failed:
                    cur.execute("ROLLBACK")
                    raise StoreError(
                        "a statement inside lock() failed; its transaction was rolled back"
                    )
                cur.execute("COMMIT")
            finally:
                tx.conn = tx.pending = tx.named = None
        _Named.add(named)
        for hooks, writes in pending:
            fire_hooks(hooks, writes)


PostgresMarkSpace.__init__.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    PostgresMarkSpace._init)


# --------------------------------------------------------------------------- arguments


def _names(agents: Sequence[Agent]) -> dict[str, list[str]]:
    """The agent_ids / agent_names arguments of the statements that record names."""
    return {"agent_ids": [str(a.id) for a in agents], "agent_names": [a.name for a in agents]}


_threshold = min_strength_arg
