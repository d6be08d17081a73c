"""What the registry holds ("WACP: Envelope" §2, envelope types and the permission matrix of
PROTOCOL §5.3 and §5.5): roles with their lineage, and envelope types with the
sender -> receiver rows that permit them. Read-only views for listings (`agentpost role list`,
`agentpost type list`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Role(_Frozen):
    name: str
    inherits: str | None
    #: the role followed by the roles it inherits from
    lineage: tuple[str, ...]
    #: defined by the migrations (coordinator, worker, ...), not by a user
    builtin: bool


class Permission(_Frozen):
    sender: str
    receiver: str


class EnvelopeType(_Frozen):
    name: str
    #: top-level fields a JSON payload of this type must carry
    required_fields: tuple[str, ...]
    builtin: bool
    #: the explicit rows of the permission matrix (roles inheriting these hold them too)
    permissions: tuple[Permission, ...]
