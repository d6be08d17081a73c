"""Example: a refund that needs a person's approval (dags/refund_desk.yaml).

The LLM agent ``refunds`` (workspace ``support``) is reactive on its inbox. For each
``refund.request`` it calls ``submit_command``: an SMCL command ``refund`` for the
``payments`` workspace, keyed ``refund/<order>`` (a second submission of the same order is
the same command, not a second refund). A refund is mutating, so the command stops in
``confirmation_required``: it waits for a person, who confirms or declines it on the
agentpost page (or ``agentpost command confirm --user NAME ID``); nothing is paid until
then. The agent replies to the customer that the refund awaits approval and acks the
request.

How far this goes: the person's decision is made in agentpost, after the agent's run has
ended; the agent's task does not wait for it. Pausing the agent itself until a person
approves the call (common-ai's per-tool approval, the task in ``awaiting_input``, the answer
on Airflow's Required Actions page) is another step of issue 24 and not built yet.

Needs the ``ai`` extra (``pip install 'airflow-agentpost[ai]'``) and an Airflow connection
``pydanticai_default`` to a model; the DAG parses without either. Apply the fleet first:
``agentpost fleet apply dags/refund_desk.yaml``, then send a request:
``agentpost send --from customers --to support --type refund.request --format json
'{"order": "A-1001", "amount": 42}'``. tests/ai/test_ai_examples.py runs it under
``dag.test()`` with a scripted model and plays the person.
"""

from __future__ import annotations

from pathlib import Path

from agentpost.factories.fleet import agent_dags

FLEET = Path(__file__).with_name("refund_desk.yaml")

globals().update(agent_dags(FLEET, tags=["agentpost", "agent", "llm-example"]))
