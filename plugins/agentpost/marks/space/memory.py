"""`MarkSpace`, the mark space in memory: thread-safe, for one process and for fast tests.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from uuid import UUID

from agentpost.marks.core import (
    DEFAULT_MIN_STRENGTH,
    Action,
    Agent,
    AnyMark,
    DecayConfig,
    DeferredVerdict,
    Intent,
    InvalidArgument,
    Mark,
    MarkType,
    Need,
    NeedCluster,
    Scope,
    ScopeVisibility,
    UnknownMark,
    Warning,
    WatchPattern,
    cluster_needs,
    compute_strength,
    mark_topic,
    new_mark_id,
    project_mark,
    read_order_key,
    scope_covers,
    trust_weight,
)
from agentpost.marks.keys import KeyInUse, KeyRecord, check_key, check_same
from agentpost.marks.space.base import SpaceBase
from agentpost.marks.space.buckets import (
    _Bucket,
    _bucket_keys,
    _life,
    _Subscription,
)
from agentpost.marks.space.protocol import (
    BucketKey,
    agent_id_of,
    authorize,
    collectable,
    fire_hooks,
    fit_tokens,
    grace_arg,
    mark_type_arg,
    min_strength_arg,
    resolved_copy,
)

# --------------------------------------------------------------------------- the space


class MarkSpace(SpaceBase):
    """The mark space in memory: thread-safe, for one process and for fast tests."""

    #: its public path, as before the split (reprs, pickles and the markspace suite name it)
    __module__ = "agentpost.marks.space"

    def __init__(
        self,
        scopes: list[Scope] | None = None,
        clock: float | None = None,
        max_marks_per_agent: int | None = None,
        *,
        max_content_bytes: int | None = None,
    ) -> None:
        """`scopes` to register; `clock` a fixed time, None for wall time (or a callable
        returning the time); `max_marks_per_agent` the quota (None: none);
        `max_content_bytes` the largest content of one mark (default: config)."""
        self._marks: dict[UUID, Mark] = {}
        self._live: dict[UUID, int] = {}  # agent id -> stored, unsuperseded marks (quota)
        self._decay: dict[UUID, DecayConfig] = {}
        self._buckets: dict[BucketKey, _Bucket] = {}
        self._scope_names: dict[str, None] = {}  # scopes that hold marks, in first-write order
        self._superseded_by: dict[UUID, UUID] = {}
        self._warnings_on: dict[UUID, list[Warning]] = {}
        self._last_created = -math.inf
        self._subscriptions: dict[UUID, _Subscription] = {}
        self._key_locks: dict[tuple[str, str], threading.RLock] = {}
        self._verdicts: dict[tuple[str, str], dict[UUID, DeferredVerdict]] = {}
        self._keys: dict[str, KeyRecord] = {}
        self._boundaries = 0
        self._swept = 1
        super().__init__(scopes, clock, max_marks_per_agent, max_content_bytes)

    def write_many(self, agent: Agent, marks: Sequence[Mark]) -> list[UUID]:
        """Write several marks as one step: all are checked first, and if any is refused
        none is stored. Hooks fire after, once per mark, in write order."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        checked = self._checked(marks)
        with self._lock:
            scopes = [self.get_scope(m.scope) for m in checked]
            for mark, scope in zip(checked, scopes, strict=True):
                authorize(agent, mark, scope)
            self._check_quota(agent, checked)
            stored = [
                self._commit(m, agent.id, s.decay) for m, s in zip(checked, scopes, strict=True)
            ]
            hooks = list(self._hooks.values())
        for mark in stored:
            fire_hooks(hooks, [(agent.id, mark)])
        return [m.id for m in stored]

    def _commit(self, mark: Mark, agent_id: UUID | None, decay: DecayConfig) -> Mark:
        """Stamp, store and index a checked mark; queue it for subscribers. Under the lock."""
        clock = self.now()
        if not math.isfinite(clock):
            raise InvalidArgument(f"the space's clock returned {clock!r}")
        created = max(clock, self._last_created)
        self._last_created = created
        stored = mark.model_copy(
            update={"id": new_mark_id(), "agent_id": agent_id, "created_at": created}
        )
        mark_id: UUID = stored.id
        self._marks[mark_id] = stored
        self._decay[mark_id] = decay
        self._scope_names.setdefault(stored.scope, None)
        self._live[agent_id] = self._live.get(agent_id, 0) + 1
        if stored.supersedes is not None and stored.supersedes not in self._superseded_by:
            self._superseded_by[stored.supersedes] = mark_id
            target = self._marks.get(stored.supersedes)
            if target is not None:
                self._live[target.agent_id] -= 1
            self._retire(stored.supersedes)
        if isinstance(stored, Warning) and stored.invalidates is not None:
            self._warnings_on.setdefault(stored.invalidates, []).append(stored)
        self._index(stored, decay)  # resolved copies too: read(min_strength=0) returns them
        self._enqueue(stored)
        return stored

    def _index(self, mark: Mark, decay: DecayConfig) -> None:
        life = _life(mark, decay)
        for key in _bucket_keys(mark):
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(mark.mark_type)
            bucket.add(mark, life)

    def _retire(self, mark_id: UUID) -> None:
        """A superseded mark is at strength 0 for good: let its buckets shed it."""
        target = self._marks.get(mark_id)
        if target is None:
            return
        for key in _bucket_keys(target):
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket.compact(self._superseded_by)

    # ----------------------------------------------------------------- read

    def get(self, mark_id: UUID) -> Mark | None:
        """The stored mark with this id, in full (no visibility rules), or None."""
        if isinstance(mark_id, str):
            try:
                mark_id = UUID(mark_id)
            except ValueError:
                return None
        with self._lock:
            return self._marks.get(mark_id)

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
        at now) is >= `min_strength`, never superseded ones (so a threshold <= 0 returns
        marks at strength 0 too, as the package), strongest first (ties: created_at, id),
        cut to `max_tokens` (see `fit_tokens`). `reader` None is infrastructure and sees full
        marks; an Agent sees each mark as the stricter of the read scope's visibility and the
        mark's own scope's (`_visible`, §7.4). No side effects (P28). Each mark decays with
        its own stored DecayConfig (the package: the read scope's)."""
        kind = mark_type_arg(mark_type)
        threshold = min_strength_arg(min_strength)
        if reader is not None and not isinstance(reader, Agent):
            raise InvalidArgument(f"reader must be an Agent or None, not {type(reader).__name__}")
        with self._lock:
            definition = self.get_scope(scope)
            if self._hidden(definition, scope, reader):
                return []
            now = self.now()
            names = self._covered(scope) if nested else (scope,)
            scored = [
                (mark, strength)
                for name in names
                for mark in self._candidates(name, resource, topic, kind, now, threshold)
                if (strength := self._strength(mark, now)) >= threshold
                and (strength > 0.0 or mark.id not in self._superseded_by)
            ]
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        shown = self._visible([m for m, _ in scored], definition, scope, reader)
        return fit_tokens(shown if limit is None else shown[:limit], max_tokens)

    def _covered(self, scope: str) -> list[str]:
        """The scopes holding marks that a hierarchical read of `scope` reads: `scope` and
        the ones nested under it (a pass over the scope names, as the package does)."""
        return [name for name in self._scope_names if scope_covers(scope, name)]

    @staticmethod
    def _hidden(definition: Scope, scope: str, reader: Agent | None) -> bool:
        return (
            reader is not None
            and definition.visibility is ScopeVisibility.CLASSIFIED
            and not reader.can_read(scope)
        )

    def _candidates(
        self,
        scope: str,
        resource: str | None,
        topic: str | None,
        kind: MarkType | None,
        now: float,
        threshold: float,
    ) -> Iterator[Mark]:
        """Marks of one scope that may match, from the narrowest bucket(s); exact filters
        applied here. A threshold <= 0 takes whole buckets: marks at strength 0 count."""
        if resource is not None:
            kinds, key = (MarkType.INTENT, MarkType.ACTION), resource
        elif topic is not None:
            kinds, key = (MarkType.OBSERVATION, MarkType.WARNING), topic
        else:
            kinds, key = tuple(MarkType), None
        for each in kinds:
            if kind is not None and each is not kind:
                continue
            bucket = self._buckets.get((scope, each, key))
            if bucket is None:
                continue
            for mark in bucket.marks if threshold <= 0.0 else bucket.live(now, threshold):
                if resource is not None and topic is not None and mark_topic(mark) != topic:
                    continue
                yield mark

    def _strength(self, mark: Mark, now: float) -> float:
        """Effective strength with supersession and warnings (§4.2, §9.5, §10)."""
        mark_id = mark.id
        if mark_id in self._superseded_by:
            return 0.0
        decay = self._decay.get(mark_id) if mark_id is not None else None
        if decay is None:
            decay = self.get_scope(mark.scope).decay
        strength = compute_strength(mark, now, decay) * trust_weight(mark)
        if strength <= 0.0:
            return 0.0
        warnings = self._warnings_on.get(mark_id) if mark_id is not None else None
        if warnings:
            penalty = sum(
                compute_strength(w, now, self._decay[w.id]) * trust_weight(w)
                for w in warnings
                if w.id not in self._superseded_by
            )
            strength = max(0.0, strength - penalty)
        return strength

    def _is_superseded(self, mark: Mark) -> bool:
        return mark.id in self._superseded_by

    def claims(self, scope: str, resource: str) -> list[Action]:
        """The actions holding (scope, resource): neither failed nor superseded, whatever
        warnings say (P39: a warning contests a fact, it does not undo it, §9.5), in write
        order."""
        with self._lock:
            self.get_scope(scope)
            now = self.now()
            held = [
                m for m in self._candidates(scope, resource, None, MarkType.ACTION, now, 0.0)
                if isinstance(m, Action) and not m.failed and m.id not in self._superseded_by
            ]
        return sorted(held, key=lambda m: (m.created_at, m.id))

    def strength_of(self, mark: Mark) -> float:
        """The mark's effective strength now, as `read` computes it (a mark not in this
        space gets decay and trust only, with its scope's DecayConfig)."""
        with self._lock:
            stored = self._marks.get(mark.id) if mark.id is not None else None
            return self._strength(stored or mark, self.now())

    def active_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Marks at strength > 0 now, in one scope (exact) or all, full (infrastructure
        view: telemetry gauges, aggregators), in read order."""
        kind = mark_type_arg(mark_type)
        with self._lock:
            now = self.now()
            names = list(self._scope_names) if scope is None else [scope]
            scored = []
            for name in names:
                for each in MarkType:
                    if kind is not None and each is not kind:
                        continue
                    bucket = self._buckets.get((name, each, None))
                    if bucket is None:
                        continue
                    for mark in bucket.live(now, 0.0):
                        strength = self._strength(mark, now)
                        if strength > 0.0:
                            scored.append((mark, strength))
        scored.sort(key=lambda pair: read_order_key(pair[0], pair[1]))
        return [m for m, _ in scored]

    def all_marks(
        self, scope: str | None = None, mark_type: MarkType | str | None = None
    ) -> list[Mark]:
        """Every stored mark, whatever its strength, in write order (history, tests)."""
        kind = mark_type_arg(mark_type)
        with self._lock:
            return [
                m
                for m in self._marks.values()
                if (scope is None or m.scope == scope) and (kind is None or m.mark_type is kind)
            ]

    def close(self) -> None:
        """Nothing to release in memory; here so both backends can be closed alike."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._marks)

    # ----------------------------------------------------------------- needs

    def resolve(
        self,
        need_mark_id: uuid.UUID,
        resolving_action_id: uuid.UUID,
        agent: Agent | None = None,
    ) -> uuid.UUID:
        """Resolve a need (§8.3) with a stored, successful action: write a copy with
        `resolved_by` that supersedes it, so the need is at strength 0 on the next read
        (P29, P30). `agent`, if given, must be allowed to write actions in the need's scope. Returns
        the copy's id. The copy is the need's agent's mark (it takes the need's place in
        that agent's quota)."""
        with self._lock:
            need = self._marks.get(need_mark_id) if isinstance(need_mark_id, UUID) else None
            if need is None:
                raise UnknownMark(f"no mark {need_mark_id} in this space")
            action = self._check_resolvable(need, resolving_action_id, agent)
            assert isinstance(need, Need)
            copy = resolved_copy(need, action)
            stored = self._commit(copy, need.agent_id, self._decay[need.id])
            hooks = list(self._hooks.values())
        fire_hooks(hooks, [(stored.agent_id, stored)])
        return stored.id

    def get_intents(self, scope: str, resource: str) -> list[Intent]:
        """The intents on `resource` in `scope` and its child scopes that are neither
        superseded nor past their TTL (warnings do not count here), in write order."""
        with self._lock:
            self.get_scope(scope)
            now = self.now()
            found = [
                mark
                for name in self._scope_names
                if scope_covers(scope, name)
                and (bucket := self._buckets.get((name, MarkType.INTENT, resource))) is not None
                for mark in bucket.live(now, 0.0)
                if isinstance(mark, Intent) and mark.id not in self._superseded_by
                and compute_strength(mark, now, self._decay[mark.id]) > 0.0
            ]
        return sorted(found, key=lambda m: (m.created_at, m.id))

    def _quota_state(self, agent_id: UUID, targets: set[UUID]) -> tuple[int, set[UUID]]:
        owned = {
            t for t in targets
            if (m := self._marks.get(t)) is not None and m.agent_id == agent_id
            and t not in self._superseded_by
        }
        return self._live.get(agent_id, 0), owned

    def gc(self, grace_period: float = 0.0) -> int:
        """Delete superseded marks and the marks `collectable` says are garbage; rebuild
        the indexes from what is left. Returns how many marks went."""
        grace = grace_arg(grace_period)
        with self._lock:
            now = self.now()
            doomed = {
                mark_id for mark_id, mark in self._marks.items()
                if mark_id in self._superseded_by
                or collectable(mark, self._decay[mark_id], now, grace)
            }
            if doomed:
                self._drop(doomed)
        return len(doomed)

    def _drop(self, doomed: set[UUID]) -> None:
        """Forget `doomed` marks and rebuild every index over the rest. Under the lock."""
        for mark_id in doomed:
            del self._marks[mark_id]
            del self._decay[mark_id]
        self._superseded_by = {
            old: new for old, new in self._superseded_by.items() if old in self._marks
        }
        self._buckets = {}
        self._warnings_on = {}
        self._live = {}
        for mark in self._marks.values():
            if mark.id not in self._superseded_by:
                self._live[mark.agent_id] = self._live.get(mark.agent_id, 0) + 1
            if isinstance(mark, Warning) and mark.invalidates is not None:
                self._warnings_on.setdefault(mark.invalidates, []).append(mark)
            if mark.id not in self._superseded_by:
                self._index(mark, self._decay[mark.id])

    def aggregate_needs(self) -> list[NeedCluster]:
        """The open needs (unresolved, unsuperseded, strength > 0 after warnings) of
        every scope, one cluster per scope (`core.cluster_needs`, §8.4)."""
        with self._lock:
            now = self.now()
            needs = [
                mark
                for name in self._scope_names
                if (bucket := self._buckets.get((name, MarkType.NEED, None))) is not None
                for mark in bucket.marks
                if isinstance(mark, Need) and self._strength(mark, now) > 0.0
            ]
        return cluster_needs(needs)

    # ----------------------------------------------------------------- subscriptions

    def subscribe(self, agent: Agent, patterns: list[WatchPattern]) -> None:
        """Queue marks written from now on that match any pattern (§13.3). Replaces an
        earlier subscription and its queue (P48, P49)."""
        if not isinstance(agent, Agent):
            raise InvalidArgument(f"expected an Agent, got {type(agent).__name__}")
        patterns = tuple(patterns)
        if not patterns or not all(isinstance(p, WatchPattern) for p in patterns):
            raise InvalidArgument("subscribe needs a non-empty list of WatchPattern")
        with self._lock:
            self._subscriptions[agent.id] = _Subscription(agent, patterns)

    def unsubscribe(self, agent: Agent) -> None:
        """Drop the agent's subscription and whatever is queued for it."""
        with self._lock:
            self._subscriptions.pop(agent_id_of(agent), None)

    def get_watched_marks(self, agent: Agent, clear: bool = True) -> list[AnyMark]:
        """Marks queued for the agent since its last poll, in write order (P50–P52); with
        `clear` they are handed out once only (P51). Marks gc() deleted meanwhile are
        left out, as on Postgres."""
        with self._lock:
            sub = self._subscriptions.get(agent_id_of(agent))
            if sub is None:
                return []
            marks = [m for m in sub.queue if m.id in self._marks]
            if clear:
                sub.queue.clear()
        return marks

    def _enqueue(self, mark: Mark) -> None:
        """Queue a just-written mark for every other subscriber it matches, or whose
        patterns match the mark it supersedes (so a watcher learns its mark was replaced,
        as in the package). Under the lock."""
        if not self._subscriptions:
            return
        definition = self.get_scope(mark.scope)
        replaced = self._marks.get(mark.supersedes) if mark.supersedes is not None else None
        for sub in self._subscriptions.values():
            if sub.agent.id == mark.agent_id:
                continue
            if not any(p.matches(mark) or (replaced is not None and p.matches(replaced))
                       for p in sub.patterns):
                continue
            delivered = self._as_seen_by(mark, definition, sub.agent)
            if delivered is not None:
                sub.queue.append(delivered)

    @staticmethod
    def _as_seen_by(mark: Mark, definition: Scope, agent: Agent) -> Mark | None:
        if definition.visibility is ScopeVisibility.OPEN or agent.can_read(mark.scope):
            return mark
        if definition.visibility is ScopeVisibility.PROTECTED:
            return project_mark(mark)
        return None

    # ----------------------------------------------------------------- deferred verdicts

    def record_verdicts(
        self, scope: str, resource: str, verdicts: Sequence[DeferredVerdict]
    ) -> int:
        """Keep a boundary's verdicts (replacing the previous boundary's on the key), shared
        by every Guard over this object; each lasts as long as its intent."""
        return self.record_verdicts_many(scope, {resource: verdicts})[resource]

    def _record_boundaries(
        self, scope: str, verdicts: Mapping[str, list[DeferredVerdict]]
    ) -> dict[str, int]:
        """Every resource's verdicts checked against its intents before any is stored (all
        or nothing), then each resource its own boundary, in order."""
        with self._lock:
            now = self.now()
            held = {r: self._expiring(scope, r, checked) for r, checked in verdicts.items()}
            numbers = {}
            for resource, stored in held.items():
                self._boundaries += 1
                self._verdicts[(scope, resource)] = {
                    agent_id: verdict.model_copy(
                        update={"boundary": self._boundaries, "decided_at": now,
                                "expires_at": at}
                    )
                    for agent_id, (verdict, at) in stored.items()
                }
                numbers[resource] = self._boundaries
                self._sweep_verdicts(now)
            return numbers

    def _expiring(
        self, scope: str, resource: str, checked: list[DeferredVerdict]
    ) -> dict[UUID, tuple[DeferredVerdict, float]]:
        """Each verdict with its intent's end (agent id -> (verdict, expires_at));
        InvalidArgument when one names no intent of its agent on (scope, resource)."""
        stored = {}
        for verdict in checked:
            intent = self._marks.get(verdict.intent_id)
            where = (scope, resource, verdict.agent_id)
            if not isinstance(intent, Intent) or (
                intent.scope, intent.resource, intent.agent_id
            ) != where:
                raise InvalidArgument(f"no intent {verdict.intent_id} of the agent there")
            stored[verdict.agent_id] = (verdict, intent.created_at
                                        + self._decay[intent.id].intent_ttl)
        return stored

    def _sweep_verdicts(self, now: float) -> None:
        """Drop keys whose verdicts have all expired, each time the number of keys has
        doubled since the last sweep (amortized O(1) per boundary). Under the lock."""
        if len(self._verdicts) < 2 * self._swept:
            return
        self._verdicts = {
            key: held
            for key, held in self._verdicts.items()
            if any(v.expires_at is not None and v.expires_at >= now for v in held.values())
        }
        self._swept = max(1, len(self._verdicts))

    def deferred_verdict(
        self, scope: str, resource: str, agent_id: UUID
    ) -> DeferredVerdict | None:
        """The agent's verdict at the latest boundary on (scope, resource), while its
        intent's TTL lasts."""
        with self._lock:
            verdict = self._verdicts.get((scope, resource), {}).get(agent_id)
            if verdict is None or verdict.expires_at is None or verdict.expires_at < self.now():
                return None
            return verdict

    def consume_grant(self, scope: str, resource: str, agent_id: UUID, action_id: UUID) -> bool:
        """Mark the agent's unconsumed ALLOW on (scope, resource) as used by the action."""
        with self._lock:
            verdict = self.deferred_verdict(scope, resource, agent_id)
            if verdict is None or not verdict.allowed or verdict.consumed_by is not None:
                return False
            self._verdicts[(scope, resource)][agent_id] = verdict.model_copy(
                update={"consumed_by": action_id}
            )
            return True

    # ----------------------------------------------------------------- keys

    def key_record(self, key: str) -> KeyRecord | None:
        with self._lock:
            return self._keys.get(check_key(key))

    def key_lock(self, key: str) -> AbstractContextManager[None]:
        return self.lock("\x00key", check_key(key))  # no scope name holds a NUL

    def record_key(self, record: KeyRecord) -> KeyRecord:
        with self._lock:
            earlier = self._keys.get(record.key)
            if earlier is not None:
                check_same(earlier, record.kind, record.agent_id, record.scope,
                           record.resource)
                if record.kind != "execute" or not earlier.failed:
                    raise KeyInUse(f"key {record.key!r} is in use")
                record = record.model_copy(update={"calls": earlier.calls + 1})
            self._keys[record.key] = record
            return record

    def settle_key(self, key: str, mark_id: UUID, failed: bool = False) -> None:
        with self._lock:
            earlier = self._keys.get(key)
            if earlier is None or earlier.kind != "execute" or earlier.settled:
                raise KeyInUse(f"key {key!r} names no call under way")
            self._keys[key] = earlier.model_copy(update={"mark_id": mark_id, "failed": failed})

    def release_key(self, key: str) -> bool:
        with self._lock:
            earlier = self._keys.get(check_key(key))
            if earlier is None or earlier.kind != "execute" or earlier.settled:
                return False
            del self._keys[key]
            return True

    # ----------------------------------------------------------------- guard lock

    @contextmanager
    def lock(self, scope: str, resource: str, *, lazy: bool = False) -> Iterator[None]:
        """Serialize guard decisions on one (scope, resource); re-entrant per thread.
        ``lazy`` is for Postgres (the lock taken with the block's first statement): here
        the lock is always taken at once."""
        key = (scope, resource)
        with self._lock:
            key_lock = self._key_locks.get(key)
            if key_lock is None:
                key_lock = self._key_locks[key] = threading.RLock()
        with key_lock:
            yield
