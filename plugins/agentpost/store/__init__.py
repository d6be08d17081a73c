"""The store layer: Postgres through SQLAlchemy's pool and psycopg2."""

from agentpost.store.commands import CommandLedger
from agentpost.store.envelopes import EnvelopeStore
from agentpost.store.routes import RouteStore
from agentpost.store.sagas import SagaRunner

__all__ = ["CommandLedger", "EnvelopeStore", "RouteStore", "SagaRunner"]
