"""An event-driven agent: the Airflow DAG runs when an envelope arrives in the inbox of
workspace ``triage`` (no schedule, no sensor holding a slot), reads the envelope and
consumes it.

Set the workspace with AGENTPOST_EXAMPLE_WORKSPACE; the store is the ``agentpost_default``
connection (else AGENTPOST_DSN). The watcher runs in the triggerer. dags/fleet.yaml declares
the workspace (role ``triager``, a child of ``dispatch``, which may send it a
``triage.request``: what `make demo` sends). A manual run handles the arrivals of its conf,
``{"arrivals": [{"envelope_id": ...}]}``.

(This docstring names Airflow on purpose: the DAG processor's safe mode skips a file that
does not mention both "airflow" and "dag".)
"""

from __future__ import annotations

import os
from typing import Any

from agentpost.factories.reactive import reactive_agent_dag


def triage(arrival: dict[str, Any], store: Any) -> dict[str, Any]:
    """Handle one arrival: consume the envelope (once: a rerun finds it consumed) and say
    what it was."""
    envelope = store.get(arrival["envelope_id"])
    if envelope.consumed_at is None:
        store.consume(envelope.to, envelope.id)
    return {"type": envelope.type, "from": envelope.sender, "consumed": True}


dag = reactive_agent_dag("agentpost_event_driven_example",
                         os.environ.get("AGENTPOST_EXAMPLE_WORKSPACE", "triage"), triage,
                         tags=["agentpost", "example"])
