"""The values a mark holds (spec §2, P30): deep-frozen JSON (`FrozenDict`, `FrozenList`),
text both backends can store, bounded labels (`MAX_LABEL`) and scope names with their
hierarchy. `agentpost.marks.core` re-exports every name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
)

# --------------------------------------------------------------------------- frozen JSON


class FrozenDict(dict):
    """A dict that refuses changes: dict fields of frozen marks stay frozen (P30), while
    still comparing equal to (and serializing like) a plain dict."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("marks are immutable; build a new mark instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list):
    """A list that refuses changes (the array counterpart of `FrozenDict`)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("marks are immutable; build a new mark instead")

    __setitem__ = __delitem__ = append = extend = insert = remove = pop = _refuse
    clear = sort = reverse = __iadd__ = __imul__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def check_text(value: str) -> str:
    """Refuse text Postgres cannot store (NUL bytes, lone surrogates), so both backends
    accept exactly the same marks."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def freeze_json(value: Any, _depth: int = 0) -> Any:
    """A deep-frozen copy of a JSON value; raises ValueError for anything JSON cannot hold
    (non-string keys, NaN/inf, sets, objects)."""
    if _depth > 64:
        raise ValueError("JSON value nested too deeply")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON numbers must be finite")
        return value
    if isinstance(value, str):
        return check_text(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("JSON object keys must be strings")
            out[check_text(key)] = freeze_json(item, _depth + 1)
        return FrozenDict(out)
    if isinstance(value, list | tuple):
        return FrozenList(freeze_json(item, _depth + 1) for item in value)
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _freeze_object(value: dict[str, Any]) -> FrozenDict:
    return freeze_json(value)


#: the longest scope name, resource, verb or topic (characters)
MAX_LABEL = 200

Text = Annotated[str, AfterValidator(check_text)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_LABEL), AfterValidator(check_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_freeze_object)]
#: any JSON value, deep-frozen: the content of a mark (the package's `MarkPayload` is `Any`;
#: ours must be JSON, which the Postgres backend stores)
JsonValue = Annotated[Any, AfterValidator(freeze_json)]
#: the type of a mark's payload fields (Action.result, Observation.content, Need.context), the
#: `markspace` package's name for it
MarkPayload = Any
Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Positive = Annotated[float, Field(gt=0.0)]


_SCOPE_SEGMENT = re.compile(r"[^/\s]+")


@lru_cache(maxsize=4096)
def check_scope_name(name: str) -> str:
    """A scope name is one or more non-empty `/`-separated segments without whitespace
    (`"calendar"`, `"research/topic/X"`); anything else would make hierarchy matching
    ambiguous."""
    check_text(name)
    if len(name) > MAX_LABEL:
        raise ValueError(f"a scope name has at most {MAX_LABEL} characters")
    if not name or not all(_SCOPE_SEGMENT.fullmatch(seg) for seg in name.split("/")):
        raise ValueError(f"invalid scope name {name!r}")
    return name


ScopeName = Annotated[str, AfterValidator(check_scope_name)]


def scope_ancestors(name: str) -> list[str]:
    """`"a/b/c"` -> `["a/b/c", "a/b", "a"]`: nearest first, for hierarchical lookups."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def scope_contains(parent: str, child: str) -> bool:
    """Whether `child` is `parent` or nested under it (P23 hierarchy)."""
    return child == parent or child.startswith(parent + "/")


#: our earlier name of `scope_contains`
scope_covers = scope_contains


_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
