"""What `PostgresMarkSpace` does beside writing and reading marks: needs (§8), subscriptions
(§13.3), agent names, deferred verdicts, call keys (keys.py), and the guard lock with its
transaction. A mixin of `PostgresMarkSpace` (`agentpost.marks.space.postgres`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from uuid import UUID

from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    DecayConfig,
    DeferredVerdict,
    InvalidArgument,
    Mark,
    Need,
    ScopeVisibility,
    UnknownMark,
    UnknownScope,
    WatchPattern,
    cluster_needs,
    project_mark,
    read_order_key,
)
from agentpost.marks.keys import KeyInUse, KeyRecord, check_key, check_same
from agentpost.marks.space import (
    AnyMark,
    NeedCluster,
    WriteHook,
    agent_id_of,
    fire_hooks,
    resolved_copy,
)
from agentpost.marks.space.postgres_rows import (
    _KEY_COLUMNS,
    _N,
    _VERDICT_COLUMNS,
    MARK_COLUMNS,
    QUERIES,
    NameKey,
    _mark,
    _Named,
    _names,
    _text_arg,
    _threshold,
)
from agentpost.protocol.errors import StoreError


class _Ledgers:
    """The needs, subscriptions, agent names, deferred verdicts, keys and guard lock
    section of `PostgresMarkSpace`."""

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
        return _board_rows(rows)

    def read_many_with_claims(
        self, scope: str, resources: Iterable[str], min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> dict[str, tuple[list[Mark], list[Action]]]:
        """`read_with_claims` of several resources of one scope in one statement (a
        boundary over many resources), by resource."""
        threshold = _threshold(min_strength)
        self.get_scope(scope)
        boards: dict[str, tuple[list[Mark], list[Action]]] = {
            r: ([], []) for r in dict.fromkeys(resources)}
        keys = [r for r in boards if _text_arg(r) is not None]
        if _text_arg(scope) is None or not keys:
            return boards
        now = self.now()
        rows = self._rows("read_many_with_claims", {
            "scope": scope, "resources": keys, "min_strength": threshold, "now": now,
            "prune": self._prune(now, None, True, threshold)})
        grouped: dict[str, list[tuple[Any, ...]]] = {r: [] for r in keys}
        for row in rows:
            grouped[row[MARK_COLUMNS.index("resource")]].append(row)
        boards.update((r, _board_rows(grouped[r])) for r in keys)
        return boards

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

    @contextmanager
    def recording_run(self, agent_id: UUID, *, workspace: str, tool: str,
                      call_id: str | None, run: Mapping[str, Any]) -> Iterator[None]:
        """Within the block, each mark `agent_id` writes in this thread has the run that
        wrote it (the agent tools' seat, tool call and run) recorded beside it in
        agentpost.mark_runs (sql/0079: a mark has no field for it), by the statement that
        writes the mark: no extra round trip, and no mark without its run."""
        previous = self._tx.run
        self._tx.run = (UUID(str(agent_id)), {"workspace": workspace, "tool": tool,
                                              "call_id": call_id,
                                              "run": json.dumps(dict(run))})
        try:
            yield
        finally:
            self._tx.run = previous

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
        rows = [_verdict_row(v) for v in checked]
        params = {"scope": scope, "resource": resource, "now": self.now(), "rows": json.dumps(rows)}
        boundary = self._rows("record_boundary", params)[0][0]
        if boundary is None:
            raise InvalidArgument(f"a verdict names no intent of its agent on {resource!r}")
        return int(boundary)

    def _record_boundaries(
        self, scope: str, verdicts: Mapping[str, list[DeferredVerdict]]
    ) -> dict[str, int]:
        """Several resources' boundaries in one statement (sql/0081), all or nothing; inside
        lock_many() they commit with the boundaries' decisions."""
        if _text_arg(scope) is None or any(_text_arg(r) is None for r in verdicts):
            raise InvalidArgument(f"no intent can be on a resource of {scope!r} given")
        if not verdicts:
            return {}
        rows = [{"resource": r, "verdicts": [_verdict_row(v) for v in checked]}
                for r, checked in verdicts.items()]
        result = self._rows("record_boundaries", {"scope": scope, "now": self.now(),
                                                  "rows": json.dumps(rows)})
        if not result:
            raise InvalidArgument("a verdict names no intent of its agent on its resource")
        return {r: int(b) for r, b in result}

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
    def lock(self, scope: str, resource: str, *, lazy: bool = False) -> Iterator[None]:
        """Serialize guard decisions on one (scope, resource) of this space, across threads
        and processes: a transaction holding an advisory lock on the key, in which this
        object's calls from this thread run until the block ends. Re-entrant (a nested
        lock() joins the open transaction). Raising inside the block rolls it back.

        ``lazy``: BEGIN and the lock go out with the block's first statement, in its round
        trip, and are held from then on; for blocks whose every step that must be
        serialized is a statement of this space (the guard's pre_action and boundary). A
        lazy block that sends nothing begins nothing."""
        if not isinstance(scope, str) or not isinstance(resource, str):
            raise InvalidArgument("lock() takes a scope and a resource, both strings")
        with self._transaction(self._lock_key(scope, resource), lazy=lazy):
            yield

    @contextmanager
    def lock_many(self, scope: str, resources: Iterable[str], *,
                  lazy: bool = False) -> Iterator[None]:
        """`lock()` of every resource of `scope` in one transaction and one statement
        (sql/0081's mark_lock_keys takes them in hash order, so batches sharing keys never
        deadlock): a boundary over many resources. The keys are lock()'s own; ``lazy`` as
        lock()'s."""
        keys = sorted(set(resources))
        if not isinstance(scope, str) or not all(isinstance(r, str) for r in keys):
            raise InvalidArgument("lock_many() takes a scope and resources, all strings")
        if not keys:
            yield
            return
        with self._transaction([self._lock_key(scope, r) for r in keys], lazy=lazy):
            yield

    def _lock_key(self, scope: str, resource: str) -> str:
        return "agentpost.marks:" + json.dumps([self.space, scope, resource])

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
    def _transaction(self, key: str | list[str], *, lazy: bool = False) -> Iterator[None]:
        """Hold the advisory lock `key` (or every lock of a list, lock_many) in a transaction
        pinned to this thread (or join the thread's open one); commit at the end of the
        block, roll back if it raises or if a statement inside failed. Hooks of the writes
        made inside fire after the commit."""
        name, params = ("lock", {"key": key}) if isinstance(key, str) else (
            "lock_many", {"keys": key})
        tx = self._tx
        if tx.conn is not None:
            self._rows(name, params)
            yield
            return
        pending: list[tuple[list[WriteHook], list[tuple[UUID, Mark]]]] = []
        named: list[NameKey] = []
        with self._pool.cursor() as cur:
            # A psycopg2 error raised in this block (BEGIN, ROLLBACK, COMMIT) reaches
            # Database.cursor, which translates it and drops a broken connection.
            tx.conn, tx.failed, tx.pending, tx.named = cur.connection, False, pending, named
            # lazy: BEGIN and the lock ride with the block's first statement (`_rows`), one
            # round trip fewer; a block that sends nothing has begun nothing
            tx.prelude = ("BEGIN; " + QUERIES[name], params)
            if not lazy:
                self._begin(cur)
            try:
                try:
                    yield
                except BaseException:
                    begun = tx.prelude is None
                    tx.conn = tx.pending = tx.named = tx.prelude = None
                    if begun:
                        cur.execute("ROLLBACK")
                    raise
                begun = tx.prelude is None
                tx.conn = tx.pending = tx.named = tx.prelude = None
                if tx.failed:
                    cur.execute("ROLLBACK")
                    raise StoreError(
                        "a statement inside lock() failed; its transaction was rolled back"
                    )
                if begun:
                    cur.execute("COMMIT")
            finally:
                tx.conn = tx.pending = tx.named = tx.prelude = None
        _Named.add(named)
        for hooks, writes in pending:
            fire_hooks(hooks, writes)


def _verdict_row(verdict: DeferredVerdict) -> dict[str, Any]:
    """A verdict as mark_record_boundary takes it (JSON)."""
    return {
        "agent_id": str(verdict.agent_id),
        "allowed": verdict.allowed,
        "intent_id": str(verdict.intent_id),
        "winner_id": None if verdict.winner_id is None else str(verdict.winner_id),
    }


def _board_rows(rows: Sequence[tuple[Any, ...]]) -> tuple[list[Mark], list[Action]]:
    """read_with_claims rows as (the read, strongest first; the claims, in write order)."""
    scored = [(_mark(row), row[_N]) for row in rows if not row[_N + 1]]
    scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
    held = [_mark(row) for row in rows if row[_N + 1]]
    return ([m for m, _ in scored],
            sorted((m for m in held if isinstance(m, Action)),
                   key=lambda m: (m.created_at, m.id)))
