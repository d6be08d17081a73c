"""Example: the research desk, three LLM agents of one fleet file (dags/research_desk.yaml).

The coordinator (workspace ``desk``) and two researchers (``researcher-a``,
``researcher-b``) are reactive: an envelope in an agent's inbox starts its DAG, whose one
task is common-ai's ``AgentOperator`` with the agentpost tools of that workspace
(``agentpost.ai.AgentpostToolset``, built by ``agentpost.factories.fleet``). The flow, all
through envelopes on the store's tamper-evident trail:

1. the newsroom sends the desk a ``research.request``;
2. the coordinator asks each researcher a question (``research.ask``) and acks the request;
3. each researcher answers with a reply (``research.answer``) and acks the question;
4. the coordinator, woken by the answers, sends the newsroom one ``research.report``.

Needs the ``ai`` extra (``pip install 'airflow-agentpost[ai]'``) and an Airflow connection
``pydanticai_default`` to a model (type ``pydanticai``, e.g. the model ``openai:gpt-5`` and
its API key); the DAGs parse without either being reachable. Apply the fleet first:
``agentpost fleet apply dags/research_desk.yaml``, then send the request:
``agentpost send --from newsroom --to desk --type research.request "What limits battery
life in the cold?"``.
tests/ai/test_ai_examples.py runs this flow under ``dag.test()`` with a scripted model.
"""

from __future__ import annotations

from pathlib import Path

from agentpost.factories.fleet import agent_dags

FLEET = Path(__file__).with_name("research_desk.yaml")

globals().update(agent_dags(FLEET, tags=["agentpost", "agent", "llm-example"]))
