"""The durable mark space, `PostgresMarkSpace` (agentpost.marks.space.postgres), from the
path it has always had: every name postgres.py defined is importable from here."""

# ruff: noqa: F401

from __future__ import annotations

from agentpost.marks.space.postgres import (
    PostgresMarkSpace,
    _Pools,
    log,
)
from agentpost.marks.space.postgres_rows import (
    _COLUMN_FIELDS,
    _INF,
    _KEY_COLUMNS,
    _N,
    _ROW_FIELDS,
    _STEP_TYPES,
    _VERDICT_COLUMNS,
    FADE_FLOOR,
    MARK_COLUMNS,
    QUERIES,
    NameKey,
    _json_float,
    _life,
    _mark,
    _Named,
    _names,
    _text_arg,
    _threshold,
    _Transaction,
)

__all__ = ["MARK_COLUMNS", "PostgresMarkSpace"]
