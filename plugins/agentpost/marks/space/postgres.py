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
  none after a rollback. A nested lock() joins the open transaction. A `lazy` lock() sends
  BEGIN and the lock with the block's first statement, in its round trip (`_begin`): the
  guard's pre_action and boundaries, whose serialized steps are all statements. `lock_many`
  takes the locks of many resources in one statement, in hash order (a deferred boundary
  over many resources, sql/0081).
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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar
from uuid import UUID

import psycopg2

from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    DecayConfig,
    Intent,
    InvalidArgument,
    Mark,
    MarkType,
    Scope,
    ScopeVisibility,
    check_text,
    read_order_key,
)
from agentpost.marks.space import (
    GC_EPSILON,
    AnyMark,
    SpaceBase,
    authorize,
    fire_hooks,
    fit_tokens,
    grace_arg,
    mark_type_arg,
)
from agentpost.marks.space.postgres_ledgers import _board_rows, _Ledgers
from agentpost.marks.space.postgres_rows import (
    _COLUMN_FIELDS,
    _INF,
    _N,
    _ROW_FIELDS,
    _STEP_TYPES,
    FADE_FLOOR,
    MARK_COLUMNS,
    QUERIES,
    NameKey,
    _json_float,
    _life,
    _mark,
    _Named,
    _names,
    _text_arg,
    _threshold,
    _Transaction,
)
from agentpost.pg.db import Database, translate
from agentpost.pg.server import libpq_dsn
from agentpost.protocol.errors import ConfigurationError

__all__ = ["MARK_COLUMNS", "PostgresMarkSpace"]

log = logging.getLogger("agentpost.marks.postgres")  # its name before the split


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


# --------------------------------------------------------------------------- the space


class PostgresMarkSpace(_Ledgers, SpaceBase):
    """The mark space in Postgres: durable, shared by processes, many spaces per database."""

    #: its public path, as before the split (reprs and the markspace suite name it)
    __module__ = "agentpost.marks.postgres"

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
                self._begin(cur)
                yield cur
        except psycopg2.Error as exc:
            self._tx.failed = True  # the transaction is aborted: lock() will roll it back
            raise translate(exc) from None

    def _begin(self, cur: Any, query: str = "") -> str:
        """`query` with this thread's pending BEGIN and lock in front (sent once); with no
        query, they are sent now, on their own (a caller using the cursor directly)."""
        prelude, self._tx.prelude = self._tx.prelude, None
        if prelude is None:
            return query
        if not query:
            cur.execute(*prelude)
            return query
        # bound here, so the query's own parameters cannot collide with the lock's
        return cur.mogrify(*prelude).decode().replace("%", "%%") + ";\n" + query

    def _rows(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        conn = self._tx.conn
        if conn is None:
            with self._pool.cursor() as cur:
                cur.execute(QUERIES[name], {"space": self.space, **params})
                return cur.fetchall() if cur.description is not None else []
        try:
            with conn.cursor() as cur:
                cur.execute(self._begin(cur, QUERIES[name]), {"space": self.space, **params})
                return cur.fetchall() if cur.description is not None else []
        except psycopg2.Error as exc:
            self._tx.failed = True  # the transaction is aborted: lock() will roll it back
            raise translate(exc) from None

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
        params = self._write_params(items)
        suffix = ""
        if self._tx.run is not None:
            runner, columns = self._tx.run
            run_n = [n for n, item in enumerate(items, start=1) if item[1] == runner]
            if run_n:
                params.update(columns, run_n=run_n)
                suffix = "_run"
        key = self._name_key(writer)
        if key is None:
            result = self._rows("write" + suffix, params)
        else:
            result = self._rows("write_named" + suffix, {**params, **_names([writer])})
            if all(row[3] for row in result):
                self._remember(key)
        return self._stored(items, result)

    def _write_params(
        self, items: Sequence[tuple[Mark, UUID, DecayConfig, ScopeVisibility]]
    ) -> dict[str, Any]:
        now = self.now()
        if not math.isfinite(now):
            raise InvalidArgument(f"the space's clock returned {now!r}")
        rows = [self._row(m, agent_id, decay, vis) for m, agent_id, decay, vis in items]
        return {"rows": json.dumps(rows), "now": now}

    def _name_key(self, writer: Agent | None) -> NameKey | None:
        """The writer's name key when its name must be recorded with the write, else None
        (no writer, no name, or recorded already)."""
        key = (self.dsn, self.space, str(writer.id), writer.name) if writer else None
        return None if key is None or not key[3] or _Named.known(key) else key

    def _stored(
        self, items: Sequence[tuple[Mark, UUID, DecayConfig, ScopeVisibility]],
        result: Sequence[Sequence[Any]],
    ) -> list[Mark]:
        """The marks as stored (the write's (n, id, created_at) rows), with their hooks
        fired now or queued for the open transaction's commit."""
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

    def write_and_read_with_claims(
        self, agent: Agent, mark: Mark, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[UUID, tuple[list[Mark], list[Action]]]:
        """`write`, then `read_with_claims` of the mark's (scope, resource), in one
        statement (sql/0081's mark_write_read): the guard's intent and its second look at
        the resource. A space with a quota, a recorded run or a mark the read cannot name
        takes the two calls."""
        resource = getattr(mark, "resource", None)
        if (self.max_marks_per_agent is not None or self._tx.run is not None
                or not isinstance(agent, Agent) or _text_arg(mark.scope) is None
                or _text_arg(resource) is None):
            return super().write_and_read_with_claims(agent, mark, min_strength)
        threshold = _threshold(min_strength)
        [checked] = self._checked([mark])
        scope = self.get_scope(checked.scope)
        authorize(agent, checked, scope)
        items = [(checked, agent.id, scope.decay, scope.visibility)]
        params = self._write_params(items)
        key = self._name_key(agent)
        names = _names([agent]) if key else {"agent_ids": None, "agent_names": None}
        rows = self._rows("write_read_with_claims", {
            **params, **names, "scope": checked.scope, "resource": resource,
            "min_strength": threshold,
            "prune": self._prune(params["now"], None, True, threshold)})
        wrote = rows[0][_N + 2]
        if key is not None and all(named for *_, named in wrote):
            self._remember(key)
        [stored] = self._stored(items, wrote)
        return stored.id, _board_rows([row for row in rows if row[0] is not None])

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
        limit: int | None = None,
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
        if limit is None:
            scored = [(_mark(row), row[_N]) for row in rows]
            scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
            return fit_tokens(self._visible([m for m, _ in scored], definition, scope,
                                            reader), max_tokens)
        # the read order from the rows' own columns (as read_order_key orders marks), then
        # marks built only until `limit` are shown: most of a read's time is building them
        rows.sort(key=_row_order)
        shown: list[AnyMark] = []
        for row in rows:
            if len(shown) >= limit:
                break
            shown.extend(self._visible([_mark(row)], definition, scope, reader))
        return fit_tokens(shown[:limit], max_tokens)

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


PostgresMarkSpace.__init__.__signature__ = inspect.signature(  # type: ignore[attr-defined]
    PostgresMarkSpace._init)


_ID, _CREATED = MARK_COLUMNS.index("id"), MARK_COLUMNS.index("created_at")


def _row_order(row: Sequence[Any]) -> tuple[float, float, int]:
    """`read_order_key` of the mark a row holds, from the row: strength descending, then
    created_at, then the id as its 128-bit integer."""
    return (-row[_N], row[_CREATED] or 0.0, UUID(str(row[_ID])).int)
