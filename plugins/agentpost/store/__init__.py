"""The store layer: Postgres through SQLAlchemy's pool and psycopg2."""

from agentpost.store.envelopes import EnvelopeStore

__all__ = ["EnvelopeStore"]
