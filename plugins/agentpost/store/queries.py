"""Named SQL queries, kept in queries.sql (``-- name: <name>`` starts each one)."""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = files("agentpost.store").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES = _load()
