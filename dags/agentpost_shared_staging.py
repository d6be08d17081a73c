"""Example: a shared resource claimed through the guard (dags/shared_staging.yaml).

Two LLM release agents, ``release-a`` and ``release-b``, each want the one staging
environment. Each DAG's task is common-ai's ``AgentOperator`` with the agentpost tools of the
agent's seat: its workspace and its Markspace agent in the fleet's mark space ``releases``
(the same id as a code agent of that name would have). Before deploying, the model calls
``claim`` (the guard's ``pre_action``) on resource ``staging`` in scope ``environments``:
the scope is first-writer-wins, so the agent that claims first is ALLOWed and records what
it deploys as an observation; the other gets CONFLICT naming the holder, and defers. A
CONFLICT is an answer, not an error: the task succeeds and the model says it deferred.

The agents run on demand (no ``schedule`` in the fleet file): trigger them from the UI.
Needs the ``ai`` extra (``pip install 'airflow-agentpost[ai]'``) and an Airflow connection
``pydanticai_default`` to a model; the DAGs parse without either. Apply the fleet first:
``agentpost fleet apply dags/shared_staging.yaml``. tests/ai/test_ai_examples.py runs both
agents under ``dag.test()`` with a scripted model.
"""

from __future__ import annotations

from pathlib import Path

from agentpost.factories.fleet import agent_dags

FLEET = Path(__file__).with_name("shared_staging.yaml")

globals().update(agent_dags(FLEET, tags=["agentpost", "agent", "llm-example"]))
