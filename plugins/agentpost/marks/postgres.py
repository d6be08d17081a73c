"""The durable mark space, `PostgresMarkSpace` (agentpost.marks.space.postgres), from the
path it has always had, with the public names postgres.py had beside it."""

from __future__ import annotations

from agentpost.marks.space.postgres import PostgresMarkSpace
from agentpost.marks.space.postgres_rows import FADE_FLOOR, MARK_COLUMNS, QUERIES, NameKey

__all__ = ["FADE_FLOOR", "MARK_COLUMNS", "QUERIES", "NameKey", "PostgresMarkSpace"]
