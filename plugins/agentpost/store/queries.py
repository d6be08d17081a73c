"""The store's named queries (store/queries.sql), loaded once."""

from __future__ import annotations

from agentpost.pg.queries import load_queries

QUERIES = load_queries("agentpost.store")
