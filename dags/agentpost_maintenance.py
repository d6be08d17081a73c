"""Example: the store's housekeeping every five minutes (agentpost.factories.maintenance):
sweeps, the trail verified against the last checkpoint, and a new signed checkpoint kept in
AGENTPOST_CHECKPOINT_DIR (default: ``agentpost-checkpoints`` under AIRFLOW_HOME), the newest
48 of them."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from agentpost.factories.maintenance import maintenance_dag

CHECKPOINTS = os.environ.get("AGENTPOST_CHECKPOINT_DIR") or str(
    Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "agentpost-checkpoints")

maintenance = maintenance_dag(checkpoint_dir=CHECKPOINTS, keep=48,
                              schedule=timedelta(minutes=5))
