"""Named SQL queries, kept in a package's queries.sql (``-- name: <name>`` starts each one)."""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(package: str = "agentpost.store") -> dict[str, str]:
    """The named queries of ``package``'s queries.sql (the store's, and the mark space's)."""
    text = files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES = load_queries()
