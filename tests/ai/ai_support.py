"""What the tests of tests/ai share: a small topology and counts of everything written."""

from __future__ import annotations

from typing import Any

from agentpost.marks import Agent, MarkType, Scope
from agentpost.store import EnvelopeStore
from dbtools import connect, rows

SCOPES = [Scope(name="deploys", allowed_intent_verbs=("deploy",),
                allowed_action_verbs=("deployed",))]
KINDS = (MarkType.INTENT, MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
         MarkType.NEED)


def topology(store: EnvelopeStore) -> None:
    """boss (coordinator) with workers w1 and w2; a custom type `report` w1 may not send."""
    store.create_workspace("coordinator", workspace_id="boss")
    store.create_workspace("worker", parent="boss", workspace_id="w1")
    store.create_workspace("worker", parent="boss", workspace_id="w2")


def agent(name: str) -> Agent:
    import uuid

    return Agent(id=uuid.uuid5(uuid.NAMESPACE_URL, name), name=name,
                 scopes={"deploys": KINDS})


def written(dsn: str) -> dict[str, Any]:
    """Row counts of every table that a tool call could write."""
    conn = connect(dsn)
    try:
        tables = [r[0] for r in rows(conn, "SELECT table_schema || '.' || table_name FROM "
                                     "information_schema.tables WHERE table_schema NOT IN "
                                     "('pg_catalog', 'information_schema') AND table_type "
                                     "= 'BASE TABLE'")]
        return {t: rows(conn, f"SELECT count(*) FROM {t}")[0][0] for t in sorted(tables)}
    finally:
        conn.close()
