"""On-insert rules (Courier §8): a predicate over an accepted envelope and `notify` actions.

A rule is stored in Postgres and evaluated there, in the transaction that accepts the
envelope; this module only checks a rule's shape and normalizes it, so that a bad rule is
refused before it reaches the store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import workspace_of
from agentpost.protocol.models import Priority
from agentpost.protocol.validation import MAX_ATTACHMENT, MAX_HEADERS, MAX_TAG, MAX_TAGS

#: the references a notify payload may use, ``${env.<name>}``; headers.<k> and meta.<k> too
TEMPLATE_FIELDS = frozenset({"id", "from", "to", "type", "priority", "originator", "ts"})
_PLACEHOLDER = re.compile(r"\$\{env\.([A-Za-z0-9_.-]+)\}")
_RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_PARTY = re.compile(r"^agents/([^/]+)/(?:inbox|outbox)$")
#: how many notify-caused-by-notify generations a chain of rules may produce
DEFAULT_MAX_HOPS = 3
#: the largest notify payload a rule may hold, as compact JSON (rules are configuration: a
#: payload is a small template, and each firing sends a copy of it)
MAX_RULE_PAYLOAD_BYTES = 65_536
#: the longest workspace or type name a rule may name (the registry's own limit is shorter)
_MAX_NAME = 200


def _bounded(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        raise ValueError(f"{what} is longer than {limit} characters")
    return value


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

    to: StrictStr | None = None
    from_: StrictStr | None = Field(default=None, alias="from")
    type: StrictStr | None = None
    tags: tuple[StrictStr, ...] = ()
    #: (each value keeps its JSON type: "1" matches the string "1" only)
    headers: dict[StrictStr, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("to", "from_", "type")
    @classmethod
    def _workspace(cls, value: str | None, info: Any) -> str | None:
        if value is not None:
            _bounded(value, _MAX_NAME, info.field_name)
        return value if info.field_name == "type" else _party(value)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """The bounds of an envelope's tags: a rule can only match what an envelope carries."""
        if len(value) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} tags")
        for tag in value:
            _bounded(tag, MAX_TAG, "a tag")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers")
        for key, item in value.items():
            _bounded(key, MAX_TAG, "a header name")
            if isinstance(item, str):
                _bounded(item, MAX_ATTACHMENT, f"header {key[:40]}")
        return value


class NotifyAction(_Frozen):
    """Send a new envelope to `to`, with `payload` (JSON) in which ``${env.id}`` and the
    like refer to the inserted envelope."""

    action: Literal["notify"] = "notify"
    to: StrictStr
    type: StrictStr = "notification"
    payload: dict[str, Any] | list[Any] | str = Field(default_factory=dict)
    priority: Priority = Priority.NORMAL

    @field_validator("to", "type")
    @classmethod
    def _workspace(cls, value: str, info: Any) -> str:
        _bounded(value, _MAX_NAME, info.field_name)
        return value if info.field_name == "type" else workspace_of(value)

    @field_validator("payload")
    @classmethod
    def _references(cls, value: Any) -> Any:
        import json

        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if len(encoded.encode("utf-8", "surrogatepass")) > MAX_RULE_PAYLOAD_BYTES:
            raise ValueError(f"a notify payload is at most {MAX_RULE_PAYLOAD_BYTES} bytes of JSON")
        for name in _PLACEHOLDER.findall(encoded):
            head, _, rest = name.partition(".")
            if not (name in TEMPLATE_FIELDS or (head in ("headers", "meta") and rest)):
                raise ValueError(f"unknown reference ${{env.{name}}}")
        return value


class RuleLimits(_Frozen):
    cooldown_ms: StrictInt = Field(default=0, alias="cooldownMs", ge=0, le=86_400_000)


class Rule(_Frozen):
    """A rule as Courier §8.2 writes it. Types are strict: a count is an integer and a flag
    a boolean (``"100"``, ``1.0``, ``"yes"`` are refused, not coerced)."""

    id: StrictStr
    when: RuleWhen = Field(default_factory=RuleWhen)
    do: tuple[NotifyAction, ...] = Field(min_length=1, max_length=8)
    limits: RuleLimits = Field(default_factory=RuleLimits)
    enabled: StrictBool = True
    #: envelopes this many rule generations deep never fire rules (no endless loops)
    max_hops: StrictInt = Field(default=DEFAULT_MAX_HOPS, ge=1, le=10)

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
