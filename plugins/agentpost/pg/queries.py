"""Named SQL queries, kept in a package's .sql files (``-- name: <name>`` starts each one)."""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """The named queries of a .sql file of ``package`` (the store's and the mark space's
    queries.sql, one file per page of the web app)."""
    text = files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
