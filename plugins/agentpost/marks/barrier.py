"""The absorbing barrier (Markspace §9.8): a runtime overlay that can only narrow an agent's
write permissions. Agents are frozen; the barrier records revocations beside them.

The API is the markspace package's: `AgentBarrier(agent_id, principal_token)` with mark types
given as their string values (a `MarkType` works too, it is a string enum), `snapshot()`
returning a frozen `BarrierSnapshot`, `restore` / `restore_all` answering False (and changing
nothing) for a wrong principal token (P45).

Readings chosen where the spec leaves room:
- `is_allowed` is the exact (scope, type) entry; `is_allowed_checked` (what the guard uses)
  follows the scope hierarchy like authorization does (§7.5): narrowing ``a`` also revokes
  ``a/b``. ``narrow_all`` stores the wildcard scope ``"*"``.
- ``restore(scope, type, token)`` lifts exactly the entry it names (``"*"`` names the
  wildcard); ``restore_all(token)`` lifts every revocation and need requirement and resets the
  escalation counter (the scopes that were flagged stay listed, as history).
- The principal token is a UUID (the package's type) or a string (our older callers); both
  compare by their text, in constant time.
- "Require need" blocks intents and actions in the scope (the guard answers BLOCKED and files
  a Need for the principal); Need marks themselves stay writable unless narrowed explicitly.
"""

from __future__ import annotations

import hmac
import threading
import uuid
from dataclasses import dataclass, field
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import MarkspaceError, MarkType
from agentpost.marks.core import scope_contains as scope_contains
from agentpost.marks.core import scope_covers as _hierarchy_covers

WILDCARD = "*"

__all__ = [
    "WILDCARD",
    "AgentBarrier",
    "BarrierSnapshot",
    "BarrierState",
    "PrincipalTokenRejected",
    "scope_covers",
]


class PrincipalTokenRejected(MarkspaceError, PermissionError):
    """A principal-only operation was attempted with the wrong token (raised by
    `AgentBarrier.restore_need`; `restore` and `restore_all` answer False instead)."""


def scope_covers(pattern: str, scope: str) -> bool:
    """Whether a revocation on ``pattern`` reaches ``scope`` (wildcard, itself or a child)."""
    return pattern == WILDCARD or _hierarchy_covers(pattern, scope)


def _type_value(mark_type: str | MarkType) -> str:
    """A mark type as the string the barrier stores (raises ValueError for an unknown one)."""
    return MarkType(mark_type).value


def _revokes(revoked: frozenset[tuple[str, str]] | set[tuple[str, str]], scope: str,
             mark_type_value: str) -> bool:
    return any(kind == mark_type_value and scope_covers(pattern, scope)
               for pattern, kind in revoked)


@dataclass(frozen=True)
class BarrierSnapshot:
    """A frozen copy of a barrier for inspection (`Guard.get_barrier`): callers cannot change
    the guard's state through it."""

    agent_id: uuid.UUID
    flag_count: int
    flagged_scopes: frozenset[str]
    revoked: frozenset[tuple[str, str]]
    require_need_scopes: frozenset[str]

    def is_allowed_checked(self, scope: str, mark_type_value: str) -> bool:
        """As `AgentBarrier.is_allowed_checked`, on the snapshot."""
        return not _revokes(self.revoked, scope, _type_value(mark_type_value))


class BarrierState(BaseModel):
    """A snapshot of a barrier in our older shape (deprecated: use `BarrierSnapshot`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: UUID
    revoked: frozenset[tuple[str, MarkType]]
    need_scopes: frozenset[str]
    need_all: bool
    flag_count: int
    flagged_scopes: frozenset[str]


@dataclass
class AgentBarrier:
    """Monotonic permission restriction for one agent (P44, P45). Thread-safe."""

    agent_id: uuid.UUID
    _principal_token: uuid.UUID
    _revoked: set[tuple[str, str]] = field(default_factory=set)
    _require_need_scopes: set[str] = field(default_factory=set)
    _flag_count: int = 0
    flagged_scopes: set[str] = field(default_factory=set)
    _lock: threading.RLock = field(
        default_factory=threading.RLock, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self._principal_token, UUID | str) or not str(self._principal_token):
            raise ValueError("a barrier needs a principal token (a UUID or a non-empty string)")

    # narrowing: only ever adds
    def narrow(self, scope: str, mark_type_value: str) -> None:
        """Revoke (scope, type); only the principal can lift it (P44)."""
        with self._lock:
            self._revoked.add((scope, _type_value(mark_type_value)))

    def narrow_all(self, mark_type_value: str) -> None:
        """Revoke a mark type in every scope (the ``"*"`` entry)."""
        self.narrow(WILDCARD, mark_type_value)

    def require_need(self, scope: str) -> None:
        with self._lock:
            self._require_need_scopes.add(scope)

    def require_need_all(self) -> None:
        self.require_need(WILDCARD)

    def increment_flags(self) -> int:
        """Count one envelope flag; returns the new total (the escalation level)."""
        with self._lock:
            self._flag_count += 1
            return self._flag_count

    def record_flag(self, scope: str) -> int:
        """Count one flag on ``scope`` (`increment_flags` plus `flagged_scopes`)."""
        with self._lock:
            self.flagged_scopes.add(scope)
            return self.increment_flags()

    # queries
    def is_allowed(self, scope: str, mark_type_value: str) -> bool:
        """Whether exactly this (scope, type) entry is not revoked (no hierarchy, no
        wildcard: the package's reading; the guard uses `is_allowed_checked`)."""
        with self._lock:
            return (scope, _type_value(mark_type_value)) not in self._revoked

    def is_allowed_checked(self, scope: str, mark_type_value: str) -> bool:
        """False when (scope, type), an ancestor scope of it or the wildcard is revoked."""
        with self._lock:
            return not _revokes(self._revoked, scope, _type_value(mark_type_value))

    def needs_required(self, scope: str) -> bool:
        """Whether intents and actions in ``scope`` must wait for the principal."""
        with self._lock:
            return any(scope_covers(pattern, scope) for pattern in self._require_need_scopes)

    need_required = needs_required  # deprecated name

    @property
    def flag_count(self) -> int:
        with self._lock:
            return self._flag_count

    @property
    def is_clear(self) -> bool:
        with self._lock:
            return not (self._revoked or self._require_need_scopes)

    def snapshot(self) -> BarrierSnapshot:
        with self._lock:
            return BarrierSnapshot(
                agent_id=self.agent_id,
                flag_count=self._flag_count,
                flagged_scopes=frozenset(self.flagged_scopes),
                revoked=frozenset(self._revoked),
                require_need_scopes=frozenset(self._require_need_scopes),
            )

    def state(self) -> BarrierState:
        """Deprecated: use `snapshot`."""
        with self._lock:
            return BarrierState(
                agent_id=self.agent_id,
                revoked=frozenset((s, MarkType(t)) for s, t in self._revoked),
                need_scopes=frozenset(self._require_need_scopes - {WILDCARD}),
                need_all=WILDCARD in self._require_need_scopes,
                flag_count=self._flag_count,
                flagged_scopes=frozenset(self.flagged_scopes),
            )

    # restoring: principal only
    def restore(
        self, scope: str, mark_type_value: str, principal_token: uuid.UUID
    ) -> bool:
        """Lift one revocation; False (nothing changed) for a wrong token (P45)."""
        if not self._is_principal(principal_token):
            return False
        with self._lock:
            self._revoked.discard((scope, _type_value(mark_type_value)))
        return True

    def restore_need(self, scope: str, token: UUID | str) -> None:
        """Lift a need requirement on ``scope`` (``"*"`` lifts the global one)."""
        if not self._is_principal(token):
            raise PrincipalTokenRejected(
                f"restore refused for agent {self.agent_id}: not the principal's token"
            )
        with self._lock:
            self._require_need_scopes.discard(scope)

    def restore_all(self, principal_token: uuid.UUID) -> bool:
        """Lift every revocation and need requirement, reset the counter; False for a wrong
        token (P45)."""
        if not self._is_principal(principal_token):
            return False
        with self._lock:
            self._revoked.clear()
            self._require_need_scopes.clear()
            self._flag_count = 0
        return True

    def _is_principal(self, token: object) -> bool:
        if not isinstance(token, UUID | str):
            return False
        return hmac.compare_digest(str(token).encode(), str(self._principal_token).encode())
