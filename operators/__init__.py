"""Airflow operators and sensors for agentpost, installed as ``agentpost.operators``.

Names are imported on first use, so importing the package (the plugin manager, the packaging
test) does not load Airflow's task SDK until an operator is actually asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentpost.operators.commands import CommandOperator
    from agentpost.operators.envelopes import (
        DirectiveOperator,
        FeedbackOperator,
        QueryOperator,
        SendEnvelopeOperator,
    )
    from agentpost.operators.leases import (
        AckOperator,
        LeaseOperator,
        NackOperator,
        agentpost_task,
    )
    from agentpost.operators.marks import GuardedActionOperator, WriteMarkOperator
    from agentpost.operators.sagas import DagSaga, SagaStepOperator
    from agentpost.operators.sensors import (
        InboxSensor,
        NeedResolvedSensor,
        ReplySensor,
        VerdictSensor,
    )
    from agentpost.operators.setup import TopologyOperator
    from agentpost.operators.spark import TrailJobOperator

_SENSORS = "agentpost.operators.sensors"
_WHERE = {
    "CommandOperator": "agentpost.operators.commands",
    "InboxSensor": _SENSORS,
    "NeedResolvedSensor": _SENSORS,
    "ReplySensor": _SENSORS,
    "VerdictSensor": _SENSORS,
    "SendEnvelopeOperator": "agentpost.operators.envelopes",
    "DirectiveOperator": "agentpost.operators.envelopes",
    "QueryOperator": "agentpost.operators.envelopes",
    "FeedbackOperator": "agentpost.operators.envelopes",
    "LeaseOperator": "agentpost.operators.leases",
    "AckOperator": "agentpost.operators.leases",
    "NackOperator": "agentpost.operators.leases",
    "agentpost_task": "agentpost.operators.leases",
    "WriteMarkOperator": "agentpost.operators.marks",
    "GuardedActionOperator": "agentpost.operators.marks",
    "DagSaga": "agentpost.operators.sagas",
    "SagaStepOperator": "agentpost.operators.sagas",
    "TopologyOperator": "agentpost.operators.setup",
    "TrailJobOperator": "agentpost.operators.spark",
}

__all__ = ["AckOperator", "CommandOperator", "DagSaga", "DirectiveOperator", "FeedbackOperator",
           "GuardedActionOperator", "InboxSensor", "LeaseOperator", "NackOperator",
           "NeedResolvedSensor", "QueryOperator", "ReplySensor", "SagaStepOperator",
           "SendEnvelopeOperator", "TopologyOperator", "TrailJobOperator", "VerdictSensor",
           "WriteMarkOperator", "agentpost_task"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
