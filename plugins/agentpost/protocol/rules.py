"""On-insert rules (Courier §8): a predicate over an accepted envelope and `notify` actions.

A rule is stored in Postgres and evaluated there, in the transaction that accepts the
envelope; this module only checks a rule's shape and normalizes it, so that a bad rule is
refused before it reaches the store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import workspace_of
from agentpost.protocol.models import Priority

#: the references a notify payload may use, ``${env.<name>}``; headers.<k> and meta.<k> too
TEMPLATE_FIELDS = frozenset({"id", "from", "to", "type", "priority", "originator", "ts"})
_PLACEHOLDER = re.compile(r"\$\{env\.([A-Za-z0-9_.-]+)\}")
_RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_PARTY = re.compile(r"^agents/([^/]+)/(?:inbox|outbox)$")
#: how many notify-caused-by-notify generations a chain of rules may produce
DEFAULT_MAX_HOPS = 3


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


def _party(value: str | None) -> str | None:
    """``agents/<name>/inbox`` and ``agents/<name>/outbox`` name the workspace <name>."""
    if value is None:
        return None
    match = _PARTY.match(value)
    return match.group(1) if match else workspace_of(value)


class RuleWhen(_Frozen):
    """Every given condition must hold: exact `to`, `from` and `type`; the envelope carries
    all of `tags`; each of `headers` has exactly that value."""

    to: str | None = None
    from_: str | None = Field(default=None, alias="from")
    type: str | None = None
    tags: tuple[str, ...] = ()
    headers: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("to", "from_")
    @classmethod
    def _workspace(cls, value: str | None) -> str | None:
        return _party(value)


class NotifyAction(_Frozen):
    """Send a new envelope to `to`, with `payload` (JSON) in which ``${env.id}`` and the
    like refer to the inserted envelope."""

    action: Literal["notify"] = "notify"
    to: str
    type: str = "notification"
    payload: dict[str, Any] | list[Any] | str = Field(default_factory=dict)
    priority: Priority = Priority.NORMAL

    @field_validator("to")
    @classmethod
    def _workspace(cls, value: str) -> str:
        return workspace_of(value)

    @field_validator("payload")
    @classmethod
    def _references(cls, value: Any) -> Any:
        import json

        for name in _PLACEHOLDER.findall(json.dumps(value)):
            head, _, rest = name.partition(".")
            if not (name in TEMPLATE_FIELDS or (head in ("headers", "meta") and rest)):
                raise ValueError(f"unknown reference ${{env.{name}}}")
        return value


class RuleLimits(_Frozen):
    cooldown_ms: int = Field(default=0, alias="cooldownMs", ge=0, le=86_400_000)


class Rule(_Frozen):
    id: str
    when: RuleWhen = Field(default_factory=RuleWhen)
    do: tuple[NotifyAction, ...] = Field(min_length=1, max_length=8)
    limits: RuleLimits = Field(default_factory=RuleLimits)
    enabled: bool = True
    #: envelopes this many rule generations deep never fire rules (no endless loops)
    max_hops: int = Field(default=DEFAULT_MAX_HOPS, ge=1, le=10)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _RULE_ID.match(value):
            raise ValueError("a rule id uses letters, digits, '.', '_', ':' and '-'")
        return value


def parse_rule(value: Mapping[str, Any] | Rule) -> Rule:
    """A Rule from its JSON form (as in Courier §8.2); InvalidInput names the first problem."""
    if isinstance(value, Rule):
        return value
    if not isinstance(value, Mapping):
        raise InvalidInput("a rule is a JSON object with id, when and do")
    try:
        return Rule.model_validate(dict(value))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "rule"
        raise InvalidInput(f"bad rule: {where}: {first['msg']}") from None
