"""An operator that makes sure roles, envelope types and workspaces exist: the first task of
a DAG that must not depend on someone having set the store up by hand. Idempotent, so every
run (and every retry) may run it: what exists is left alone, what is missing is created.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentpost.operators.common import StoreOperator
from agentpost.protocol.errors import Conflict, InvalidInput

if TYPE_CHECKING:
    from airflow.sdk import Context

    from agentpost.store import EnvelopeStore

#: a workspace to ensure: (id, role) or (id, role, parent)
WorkspaceSpec = tuple[str, str] | tuple[str, str, str | None]


class TopologyOperator(StoreOperator):
    """Ensures `roles` (name -> parent role or None), `types` (name -> (sender roles,
    receiver roles)) and `workspaces` ((id, role[, parent]), parents first) exist; returns
    the workspace ids it created.

    A workspace that exists with another role is a clear failure (`Conflict`), not a silent
    mismatch.
    """

    ui_color = "#eeeeee"

    def __init__(self, *, roles: Mapping[str, str | None] | None = None,
                 types: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
                 workspaces: Sequence[WorkspaceSpec] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.roles = dict(roles or {})
        self.types = {name: (list(s), list(r)) for name, (s, r) in (types or {}).items()}
        for spec in workspaces:
            if not isinstance(spec, tuple | list) or len(spec) not in (2, 3):
                raise InvalidInput(f"a workspace is (id, role) or (id, role, parent), "
                                   f"not {spec!r}")
        self.workspaces = [tuple(spec) for spec in workspaces]

    def execute(self, context: Context) -> list[str]:
        with self.store() as store:
            for role, parent in self.roles.items():
                store.define_role(role, inherits=parent)
            for name, (senders, receivers) in self.types.items():
                store.register_type(name, senders, receivers)
            return self._workspaces(store)

    def _workspaces(self, store: EnvelopeStore) -> list[str]:
        existing = {w.id: w.role for w in store.workspaces()}
        created = []
        for wid, role, *rest in self.workspaces:
            if wid in existing:
                if existing[wid] != role:
                    raise Conflict(f"workspace {wid!r} exists with role {existing[wid]!r}, "
                                   f"not {role!r}")
                continue
            store.create_workspace(role, parent=rest[0] if rest else None, workspace_id=wid)
            created.append(wid)
        self.log.info("created workspaces %s", created)
        return created


__all__ = ["TopologyOperator"]
