"""The absorbing barrier (spec §9.8): a runtime overlay that can only narrow an agent's write
permissions. Agents are frozen; the barrier records revocations beside them.

Readings chosen where the spec leaves room:
- Revocations follow the scope hierarchy like authorization does (§7.5): narrowing ``a``
  also revokes ``a/b`` and ``a/b/c``. ``narrow_all`` stores the wildcard scope ``"*"``.
- ``restore(scope, mark_type, token)`` lifts exactly the entry it names (``"*"`` names the
  wildcard); ``restore_all(token)`` lifts everything and resets the escalation counter.
- A wrong principal token raises `PrincipalTokenRejected` and changes nothing (P45).
- "Require need" blocks intents and actions in the scope (the guard answers BLOCKED and files
  a Need for the principal); Need marks themselves stay writable unless narrowed explicitly.
"""

from __future__ import annotations

import hmac
import threading
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from agentpost.marks.core import MarkspaceError, MarkType
from agentpost.marks.core import scope_covers as _hierarchy_covers

WILDCARD = "*"


class PrincipalTokenRejected(MarkspaceError, PermissionError):
    """A restore was attempted with a token that is not the barrier's principal token."""


class BarrierState(BaseModel):
    """A snapshot of a barrier, for logs, telemetry and tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: UUID
    revoked: frozenset[tuple[str, MarkType]]
    need_scopes: frozenset[str]
    need_all: bool
    flag_count: int
    flagged_scopes: frozenset[str]


def scope_covers(pattern: str, scope: str) -> bool:
    """Whether a revocation on ``pattern`` reaches ``scope`` (wildcard, itself or a child)."""
    return pattern == WILDCARD or _hierarchy_covers(pattern, scope)


class AgentBarrier:
    """Monotonic permission restriction for one agent (P44, P45)."""

    def __init__(self, agent_id: UUID, principal_token: str) -> None:
        if not principal_token:
            raise ValueError("a barrier needs a non-empty principal token")
        self.agent_id = agent_id
        self._principal_token = principal_token
        self._revoked: set[tuple[str, MarkType]] = set()
        self._need_scopes: set[str] = set()
        self._need_all = False
        self._flag_count = 0
        self._flagged_scopes: set[str] = set()
        self._lock = threading.Lock()

    # narrowing: only ever adds
    def narrow(self, scope: str, mark_type: MarkType) -> None:
        with self._lock:
            self._revoked.add((scope, MarkType(mark_type)))

    def narrow_all(self, mark_type: MarkType) -> None:
        self.narrow(WILDCARD, mark_type)

    def require_need(self, scope: str) -> None:
        with self._lock:
            self._need_scopes.add(scope)

    def require_need_all(self) -> None:
        with self._lock:
            self._need_all = True

    def record_flag(self, scope: str) -> int:
        """Count one envelope flag on ``scope``; returns the new total (the escalation level)."""
        with self._lock:
            self._flag_count += 1
            self._flagged_scopes.add(scope)
            return self._flag_count

    # queries
    def is_allowed(self, scope: str, mark_type: MarkType) -> bool:
        """False when ``(scope, mark_type)``, an ancestor scope or the wildcard is revoked."""
        mark_type = MarkType(mark_type)
        with self._lock:
            return not any(
                revoked_type == mark_type and scope_covers(pattern, scope)
                for pattern, revoked_type in self._revoked
            )

    def need_required(self, scope: str) -> bool:
        """Whether intents and actions in ``scope`` must wait for the principal."""
        with self._lock:
            return self._need_all or any(
                scope_covers(pattern, scope) for pattern in self._need_scopes
            )

    @property
    def flag_count(self) -> int:
        with self._lock:
            return self._flag_count

    @property
    def is_clear(self) -> bool:
        with self._lock:
            return not (self._revoked or self._need_scopes or self._need_all)

    def state(self) -> BarrierState:
        with self._lock:
            return BarrierState(
                agent_id=self.agent_id,
                revoked=frozenset(self._revoked),
                need_scopes=frozenset(self._need_scopes),
                need_all=self._need_all,
                flag_count=self._flag_count,
                flagged_scopes=frozenset(self._flagged_scopes),
            )

    # restoring: principal only
    def restore(self, scope: str, mark_type: MarkType, token: str) -> None:
        self._authenticate(token)
        with self._lock:
            self._revoked.discard((scope, MarkType(mark_type)))

    def restore_need(self, scope: str, token: str) -> None:
        """Lift a need requirement on ``scope`` (``"*"`` lifts the global one)."""
        self._authenticate(token)
        with self._lock:
            if scope == WILDCARD:
                self._need_all = False
            self._need_scopes.discard(scope)

    def restore_all(self, token: str) -> None:
        self._authenticate(token)
        with self._lock:
            self._revoked.clear()
            self._need_scopes.clear()
            self._need_all = False
            self._flag_count = 0
            self._flagged_scopes.clear()

    def _authenticate(self, token: str) -> None:
        given = token.encode() if isinstance(token, str) else b""
        if not hmac.compare_digest(given, self._principal_token.encode()):
            raise PrincipalTokenRejected(
                f"restore refused for agent {self.agent_id}: not the principal's token"
            )
