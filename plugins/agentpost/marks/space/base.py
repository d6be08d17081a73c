"""`SpaceBase`: what both backends do alike (the clock, the scope registry, write hooks,
quotas, keyed writes, the checks before a need is resolved).
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from uuid import UUID, uuid4

from agentpost.config import mark_content_limit
from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    AnyMark,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    InvalidMark,
    Mark,
    MarkType,
    Need,
    QuotaExceededError,
    Scope,
    UnauthorizedWrite,
    UnknownMark,
    UnknownScope,
    check_content_size,
    resolve_conflict,
    revalidate,
    scope_ancestors,
    visible_to,
)
from agentpost.marks.keys import KeyRecord, check_key, check_same
from agentpost.marks.space.protocol import (
    ClockSpec,
    WriteHook,
    make_clock,
    quota_arg,
)


class SpaceBase(ABC):
    """What both backends do alike: the clock, the scope registry (configuration, not
    stored), write hooks (process-local), and the checks before a need is resolved."""

    def __init__(
        self,
        scopes: Iterable[Scope] | None = None,
        clock: ClockSpec = None,
        max_marks_per_agent: int | None = None,
        max_content_bytes: int | None = None,
    ) -> None:
        #: the largest content of one mark this space stores (bytes of JSON)
        self.max_content_bytes = mark_content_limit(max_content_bytes)
        #: the most live marks one agent may hold (None: no limit); see `write`
        self.max_marks_per_agent = quota_arg(max_marks_per_agent)
        self._lock = threading.RLock()
        self._clock = make_clock(clock)
        self._scopes: dict[str, Scope] = {}
        self._hooks: dict[UUID, WriteHook] = {}
        for scope in scopes or ():
            self.register_scope(scope)

    @abstractmethod
    def get(self, mark_id: UUID) -> Mark | None:
        """The stored mark with this id, full, or None."""

    @abstractmethod
    def write_many(self, agent: Agent, marks: Sequence[Mark]) -> list[UUID]:
        """Store marks all or nothing (each backend's storage)."""

    @abstractmethod
    def _is_superseded(self, mark: Mark) -> bool:
        """Whether a stored mark supersedes this one."""

    # ----------------------------------------------------------------- clock and scopes

    def now(self) -> float:
        """The space's current time (unix seconds) from its clock."""
        return float(self._clock())

    def set_clock(self, t: float) -> None:
        """Fix time at `t` (or install another clock: None for wall time, a callable)."""
        clock = make_clock(t)
        with self._lock:
            self._clock = clock

    def register_scope(self, scope: Scope) -> None:
        """Define (or redefine) a scope in this process. Marks already written keep the
        decay they were written with."""
        if not isinstance(scope, Scope):
            raise InvalidArgument(f"expected a Scope, got {type(scope).__name__}")
        with self._lock:
            self._scopes[scope.name] = scope

    def get_scope(self, scope_name: str) -> Scope:
        """The definition governing `scope_name`: its own, else the nearest defined
        ancestor's. UnknownScope (a ValidationError) when there is none."""
        if not isinstance(scope_name, str) or not scope_name:
            raise UnknownScope(f"no scope named {scope_name!r}")
        scopes = self._scopes
        for candidate in scope_ancestors(scope_name):
            found = scopes.get(candidate)
            if found is not None:
                return found
        raise UnknownScope(f"no scope {scope_name!r} (nor any ancestor of it) is registered")

    def registered_scopes(self) -> list[Scope]:
        with self._lock:
            return list(self._scopes.values())

    def _visible(
        self, marks: list[Mark], definition: Scope, scope: str, reader: Agent | None
    ) -> list[Mark]:
        """§7.4 for a read of `scope` (governed by `definition`): each mark as the stricter
        of the read scope's rule (the package's) and its own governing definition's, so a
        CLASSIFIED child under an OPEN parent stays hidden and a PROTECTED one is projected
        for a reader not authorized for it (P22, P25; the spec over the package)."""
        shown = visible_to(marks, definition, scope, reader)
        if reader is None or reader.can_read_content(scope):
            return shown  # authorized for the read scope: for every scope under it too (P26)
        governing: dict[str, Scope] = {}
        seen: list[Mark] = []
        for mark in shown:
            if mark.scope == scope:  # the read scope's own marks: its rule already applied
                seen.append(mark)
                continue
            own = governing.get(mark.scope)
            if own is None:
                own = governing[mark.scope] = self.get_scope(mark.scope)
            seen.extend(visible_to([mark], own, mark.scope, reader))
        return seen

    # ----------------------------------------------------------------- writes and hooks

    def _checked(self, marks: Sequence[Mark]) -> list[Mark]:
        """The marks re-validated field by field and within `max_content_bytes`: the checks
        of a write that come before the scope's (InvalidMark, nothing stored)."""
        checked = [revalidate(m) for m in marks]
        for mark in checked:
            check_content_size(mark, self.max_content_bytes)
        return checked

    def write(self, agent: Agent, mark: AnyMark) -> uuid.UUID:
        """Store `mark` for `agent` with a fresh id and created_at = now (§8.1). Raises a
        typed error and stores nothing if the agent, the mark, the scope or the agent's
        quota say no."""
        return self.write_many(agent, [mark])[0]

    @abstractmethod
    def _quota_state(self, agent_id: UUID, targets: set[UUID]) -> tuple[int, set[UUID]]:
        """The agent's live marks (stored, not superseded) and which of `targets` are
        among them. Under the lock that serializes the agent's writes."""

    def _check_quota(self, agent: Agent, marks: Sequence[Mark]) -> None:
        """QuotaExceededError when writing `marks` one by one would find the agent
        already holding `max_marks_per_agent` live marks; a mark that supersedes one of the
        agent's live marks gives its place back after it is written."""
        limit = self.max_marks_per_agent
        if limit is None:
            return
        targets = {m.supersedes for m in marks if m.supersedes is not None}
        held, owned = self._quota_state(agent.id, targets)
        for mark in marks:
            if held >= limit:
                raise QuotaExceededError(
                    f"agent {agent.name!r} holds {held} live marks, its quota is {limit}; "
                    "marks come back when superseded or collected by gc()"
                )
            held += 1
            if mark.supersedes in owned:
                owned.discard(mark.supersedes)
                held -= 1

    def add_write_hook(self, hook: Callable[[uuid.UUID, AnyMark], None]) -> uuid.UUID:
        """Call `hook(agent_id, stored_mark)` after every successful write made through
        this object (§8.6). Hooks are process-local. Returns the handle that removes it."""
        if not callable(hook):
            raise InvalidArgument("a write hook must be callable")
        handle = uuid4()
        with self._lock:
            self._hooks[handle] = hook
        return handle

    def remove_write_hook(self, handle: uuid.UUID) -> bool:
        with self._lock:
            return self._hooks.pop(handle, None) is not None

    def read_with_claims(
        self, scope: str, resource: str, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[list[Mark], list[Action]]:
        """What the guard looks at on one resource: `read_exact(scope, resource=...)` for
        full marks of that one scope and `claims(scope, resource)`, together (one round trip
        on Postgres)."""
        return (self.read_exact(scope, resource=resource, min_strength=min_strength),
                self.claims(scope, resource))

    def write_and_read_with_claims(
        self, agent: Agent, mark: Mark, min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> tuple[UUID, tuple[list[Mark], list[Action]]]:
        """`write(agent, mark)`, then `read_with_claims` of the mark's (scope, resource): the
        guard's intent and its second look at the resource (§9.2 step 4), one round trip on
        Postgres. Returns the mark's id and what the read returned."""
        mark_id = self.write(agent, mark)
        return mark_id, self.read_with_claims(mark.scope, getattr(mark, "resource", None),
                                              min_strength)

    @abstractmethod
    def claims(self, scope: str, resource: str) -> list[Action]:
        """The actions holding (scope, resource), whatever warnings say (P39)."""

    def read(self, scope: str, resource: str | None = None, topic: str | None = None,
             mark_type: MarkType | None = None,
             min_strength: float = DEFAULT_MIN_STRENGTH,
             reader: Agent | None = None, max_tokens: int | None = None, *,
             limit: int | None = None) -> list[AnyMark]:
        """§8.2's read, hierarchical as the package's: `scope` and the scopes nested
        under it (see the backend's `_read`). `limit` (ours, not the package's): the first
        `limit` marks of the read order only, for a caller that takes no more (a backend
        then builds no more)."""
        return self._read(scope, resource, topic, mark_type, min_strength, reader,
                          max_tokens, nested=True, limit=limit_arg(limit))

    def read_exact(self, scope: str, resource: str | None = None, topic: str | None = None,
                   mark_type: MarkType | None = None,
                   min_strength: float = DEFAULT_MIN_STRENGTH,
                   reader: Agent | None = None,
                   max_tokens: int | None = None, *,
                   limit: int | None = None) -> list[AnyMark]:
        """`read` of `scope` alone, without its nested scopes: for callers that decide per
        scope (the guard's checks on one (scope, resource))."""
        return self._read(scope, resource, topic, mark_type, min_strength, reader,
                          max_tokens, nested=False, limit=limit_arg(limit))

    @abstractmethod
    def _read(self, scope: str, resource: str | None, topic: str | None,
              mark_type: MarkType | None, min_strength: float, reader: Agent | None,
              max_tokens: int | None, *, nested: bool,
              limit: int | None = None) -> list[AnyMark]:
        """`read` (nested) and `read_exact` (not)."""

    def get_mark(self, mark_id: uuid.UUID) -> AnyMark | None:
        """The stored mark with this id, or None (the package's name for `get`)."""
        return self.get(mark_id)

    @abstractmethod
    def get_intents(self, scope: str, resource: str) -> list[Intent]:
        """The intents on `resource` in `scope` and its child scopes that are neither
        superseded nor past their TTL (warnings do not count here), in write order."""

    def check_conflict(self, scope: str, resource: str) -> uuid.UUID | None:
        """The intent that wins `resource` under the scope's conflict policy (§5), among
        `get_intents(scope, resource)`; None when there is none or the policy yields."""
        policy = self.get_scope(scope).conflict_policy
        intents = self.get_intents(scope, resource)
        if len(intents) <= 1:
            return intents[0].id if intents else None
        return resolve_conflict(intents, policy)

    @abstractmethod
    def gc(self, grace_period: float = 0.0) -> int:
        """Delete the marks that can never be read again, `grace_period` seconds after
        they got there; returns how many. Frees quota. See `gc_rule`."""

    # ----------------------------------------------------------------- many boundaries at once

    @abstractmethod
    def lock(self, scope: str, resource: str, *,
             lazy: bool = False) -> AbstractContextManager[None]:
        """Serialize guard decisions on one (scope, resource) (each backend's lock)."""

    @contextmanager
    def lock_many(self, scope: str, resources: Iterable[str], *,
                  lazy: bool = False) -> Iterator[None]:
        """`lock` of every resource of `scope` for the block, taken in one order (sorted),
        so two callers sharing keys never wait for each other in a cycle: what a boundary
        over many resources holds while it reads and records them (one statement on
        Postgres)."""
        keys = sorted(set(resources))
        if not all(isinstance(r, str) for r in keys):
            raise InvalidArgument("lock_many() takes a scope and resources, all strings")
        with ExitStack() as stack:
            for resource in keys:
                stack.enter_context(self.lock(scope, resource, lazy=lazy))
            yield

    def read_many_with_claims(
        self, scope: str, resources: Iterable[str], min_strength: float = DEFAULT_MIN_STRENGTH
    ) -> dict[str, tuple[list[Mark], list[Action]]]:
        """`read_with_claims` of each resource (one round trip on Postgres), by resource."""
        return {r: self.read_with_claims(scope, r, min_strength)
                for r in dict.fromkeys(resources)}

    def record_verdicts_many(
        self, scope: str, verdicts: Mapping[str, Sequence[DeferredVerdict]]
    ) -> dict[str, int]:
        """`record_verdicts` of several resources of `scope`, in the mapping's order (each
        its own boundary, numbered in that order), all or nothing: resource -> boundary."""
        checked = {r: self._check_verdicts(scope, r, v) for r, v in verdicts.items()}
        return self._record_boundaries(scope, checked)

    @abstractmethod
    def _record_boundaries(
        self, scope: str, verdicts: Mapping[str, list[DeferredVerdict]]
    ) -> dict[str, int]:
        """Store checked verdicts of several resources, all or nothing (each backend)."""

    # ----------------------------------------------------------------- deferred verdicts

    @abstractmethod
    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int:
        """Keep a resolution boundary's verdicts on (scope, resource), replacing the previous
        boundary's there (§6.2.1 phase 3); returns the boundary's number, larger than any
        before it. Each verdict names an intent of this space on (scope, resource)."""

    @abstractmethod
    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None:
        """The agent's verdict at the latest boundary on (scope, resource), or None (no
        boundary gave it one, or its intent's TTL has passed)."""

    @abstractmethod
    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool:
        """Record that ``action_id`` used the agent's ALLOW on (scope, resource); False when
        it had none left to use."""

    # ----------------------------------------------------------------- keys (keys.py)

    @abstractmethod
    def key_record(self, key: str) -> KeyRecord | None:
        """What `key` did in this space (a write, a call), or None."""

    @abstractmethod
    def key_lock(self, key: str) -> AbstractContextManager[None]:
        """Serialize the writers of one key, like `lock` (a transaction on Postgres)."""

    @abstractmethod
    def record_key(self, record: KeyRecord) -> KeyRecord:
        """Record a write (in the open `lock`/`key_lock` transaction, with the mark) or the
        start of a call (committed at once, on its own, even inside a lock: it must survive
        the call). A call may start again after a failed one (``calls`` counts). KeyInUse
        when the key names something else or a call under way; returns the stored record."""

    @abstractmethod
    def settle_key(self, key: str, mark_id: UUID, failed: bool = False) -> None:
        """Record the action mark of a started call (in the open transaction)."""

    @abstractmethod
    def release_key(self, key: str) -> bool:
        """A person's release of a call that recorded no outcome, after checking what it did:
        the next call under the key runs. False when there was no such call."""

    def write_once(self, agent: Agent, mark: Mark, key: str,
                   write: Callable[[Agent, Mark], UUID] | None = None) -> tuple[UUID, bool]:
        """Write `mark` at most once per `key`: the first call writes it (through `write`,
        e.g. a guard's `write_mark`; default `self.write`) and records the key in the same
        transaction; a later call returns that mark's id. Returns (id, written now)."""
        key = check_key(key)
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        with self.key_lock(key):
            earlier = self.key_record(key)
            if earlier is not None:
                check_same(earlier, "write", agent.id, mark.scope, None)
                assert earlier.mark_id is not None
                return earlier.mark_id, False
            mark_id = (write or self.write)(agent, mark)
            self.record_key(KeyRecord(key=key, kind="write", agent_id=agent.id,
                                      scope=mark.scope, mark_id=mark_id,
                                      started_at=self.now()))
            return mark_id, True

    def _check_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> list[DeferredVerdict]:
        """What a boundary may store: verdicts on this (scope, resource) of a known scope,
        one per agent, at most one ALLOW (P17). InvalidArgument otherwise."""
        self.get_scope(scope)
        checked = list(verdicts)
        if not all(isinstance(v, DeferredVerdict) for v in checked):
            raise InvalidArgument("a boundary's verdicts are DeferredVerdict objects")
        if any((v.scope, v.resource) != (scope, resource) for v in checked):
            raise InvalidArgument(f"a verdict of this boundary is not on {(scope, resource)!r}")
        if len({v.agent_id for v in checked}) != len(checked):
            raise InvalidArgument("a boundary gives each agent one verdict")
        if sum(v.allowed for v in checked) > 1:
            raise InvalidArgument("a boundary allows at most one agent (P17)")
        return checked

    def _check_resolvable(self, need: Mark, action_id: UUID, agent: Agent | None) -> Action:
        """§8.3's preconditions, in the package's order: a need, not yet resolved nor
        superseded; a resolving mark stored in this space; an `agent` (if given) allowed to
        write actions in the need's scope (UnauthorizedWrite); the resolving mark a
        successful action. Returns that action."""
        if not isinstance(need, Need):
            raise InvalidMark(f"mark {need.id} is a {need.mark_type.value}, not a need")
        if need.resolved_by is not None or self._is_superseded(need):
            raise InvalidMark(f"need {need.id} is already resolved or superseded")
        if agent is not None and not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent or None, got {type(agent).__name__}")
        action = self.get(action_id) if isinstance(action_id, UUID) else None
        if action is None:
            raise UnknownMark(f"no resolving action {action_id!r} in this space")
        if agent is not None and not agent.can_write(need.scope, MarkType.ACTION):
            raise UnauthorizedWrite(
                f"agent {agent.name!r} may not resolve needs in {need.scope!r}"
            )
        if not isinstance(action, Action):
            raise InvalidMark(f"mark {action_id} is a {action.mark_type.value}, not an action")
        if action.failed:
            raise InvalidMark(f"action {action_id} failed and cannot resolve a need")
        return action


def limit_arg(limit: object) -> int | None:
    """A read's `limit`: None (all) or a whole number, 0 or more."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgument(f"limit is None or a whole number, 0 or more, not {limit!r}")
    return limit
