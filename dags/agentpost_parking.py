"""Example: the resolution boundary of the parking scope of dags/fleet.yaml, as an Airflow DAG.

The drivers (dags/agentpost_fleet_agents.py) write intents on spots; the scope is deferred
(Markspace §6.2), so they wait. Every minute this DAG resolves every spot with pending
intents: the most confident driver wins each, the others are told who won, and the winners
park at their next activation. Trigger it by hand to resolve at once (params: ``scopes``,
``resource``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from agentpost.factories.boundary import boundary_dag

boundary = boundary_dag(Path(__file__).with_name("fleet.yaml"), schedule=timedelta(minutes=1))
