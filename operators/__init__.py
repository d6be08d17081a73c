"""Airflow operators and sensors for agentpost, installed as ``agentpost.operators``.

Names are imported on first use, so importing the package (the plugin manager, the packaging
test) does not load Airflow's task SDK until an operator is actually asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentpost.operators.commands import CommandOperator
    from agentpost.operators.sensors import (
        InboxSensor,
        NeedResolvedSensor,
        ReplySensor,
        VerdictSensor,
    )

__all__ = ["CommandOperator", "InboxSensor", "NeedResolvedSensor", "ReplySensor",
           "VerdictSensor"]

_SENSORS = "agentpost.operators.sensors"
_WHERE = {"CommandOperator": "agentpost.operators.commands",
          "InboxSensor": _SENSORS, "NeedResolvedSensor": _SENSORS, "ReplySensor": _SENSORS,
          "VerdictSensor": _SENSORS}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
