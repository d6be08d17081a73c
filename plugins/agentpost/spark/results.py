"""Writing a job's results back to Postgres, by the analytics tables' contract: a window's
rows replace that window's rows, and the run is recorded, all in one transaction, so a re-run
never duplicates rows and a reader never sees half a window (sql/0061_trail_analytics.sql)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg2
from psycopg2 import sql
from psycopg2.extras import execute_values
from pydantic import BaseModel, ConfigDict, model_validator

from agentpost.pg.db import translate


class Window(BaseModel):
    """A half-open time window [start, end), both with a time zone."""

    model_config = ConfigDict(frozen=True)

    start: datetime
    end: datetime

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("a window's start and end need a time zone")
        if self.end <= self.start:
            raise ValueError("a window's end must be after its start")
        return self


class TableRows(BaseModel):
    """One result table's new rows for a window (columns after window_start, window_end)."""

    model_config = ConfigDict(frozen=True)

    table: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def replace_window(dsn: str, job: str, window: Window, tables: Iterable[TableRows],
                   source_rows: int) -> None:
    """Replace `window`'s rows of every table in `tables` and upsert the run, atomically."""
    try:
        conn = psycopg2.connect(dsn, application_name=f"agentpost-spark-{job}")
    except psycopg2.Error as exc:
        raise translate(exc) from None
    try:
        with conn, conn.cursor() as cur:
            for t in tables:
                _replace(cur, window, t)
            cur.execute(
                "INSERT INTO agentpost.analytics_runs (job, window_start, window_end, "
                "source_rows) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (job, window_start, window_end) DO UPDATE "
                "SET computed_at = clock_timestamp(), source_rows = excluded.source_rows",
                (job, window.start, window.end, source_rows))
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()


def _replace(cur: Any, window: Window, t: TableRows) -> None:
    table = sql.Identifier("agentpost", t.table)
    cur.execute(sql.SQL("DELETE FROM {} WHERE window_start = %s AND window_end = %s")
                .format(table), (window.start, window.end))
    if not t.rows:
        return
    columns = sql.SQL(", ").join(map(sql.Identifier, ("window_start", "window_end",
                                                       *t.columns)))
    query = sql.SQL("INSERT INTO {} ({}) VALUES %s").format(table, columns)
    execute_values(cur, query.as_string(cur),
                   [(window.start, window.end, *row) for row in t.rows], page_size=1000)


def rows_of(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> tuple[tuple, ...]:
    """Collected Spark rows (or dicts) as tuples in `columns` order."""
    return tuple(tuple(r[c] for c in columns) for r in records)
