"""Example: the agents of dags/fleet.yaml as Airflow DAGs, one per agent
(agentpost.factories.fleet).

The drivers and the weather poller are source agents: each runs every interval of its
manifest, one activation at a time (Markspace §14, P56). Their code is named in the fleet
file (``agentpost_agents.parking:park``, in this folder). The dispatcher is reactive: each
envelope arriving in its inbox starts one run (an asset watcher on
``agentpost.triggers.InboxEventTrigger``).

Apply the fleet to the store first: ``agentpost fleet apply dags/fleet.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from agentpost.factories.fleet import agent_dags

FLEET = Path(__file__).with_name("fleet.yaml")

globals().update(agent_dags(FLEET))
