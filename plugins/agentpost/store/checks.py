"""Checks on values that reach SQL as parameters: names, ids and counts."""

from __future__ import annotations

from collections.abc import Iterable

from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.validation import MAX_ID, clean_text
from agentpost.protocol.validation import _Malformed as Malformed

_NAME_LIMIT = 64


def name(value: object, what: str) -> str:
    """A registry name (role, type, workspace id): a short clean string."""
    try:
        text = clean_text(value, limit=_NAME_LIMIT, what=what)
    except Malformed as exc:
        raise InvalidInput(str(exc)) from None
    if not text.strip():
        raise InvalidInput(f"{what} must not be empty")
    return text


def ref(value: object, what: str) -> str:
    """An id given back to us (envelope id, workspace id): checked before it reaches SQL."""
    try:
        return clean_text(value, limit=MAX_ID, what=what)
    except Malformed as exc:
        raise InvalidInput(str(exc)) from None


def text(value: object, what: str, limit: int = 500) -> str:
    try:
        return clean_text(value, limit=limit, what=what)
    except Malformed as exc:
        raise InvalidInput(str(exc)) from None


def count(value: object, what: str, *, optional: bool = False) -> None:
    """A non-negative whole number (not a bool) for limits and offsets."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise InvalidInput(f"{what} must be a non-negative whole number")


def strings(values: Iterable[str], what: str) -> list[str]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidInput(f"{what} must be a list of names")
    return list(values)
