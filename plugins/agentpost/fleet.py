"""A fleet declared in one YAML file, applied to the store: `load_fleet(path)` and
`apply(store, fleet)`. The format is documented in docs/fleet.md.

The model and its validation are pure (`agentpost.protocol.fleet`); applying it is the
store's (`agentpost.store.fleet`); the DAG factories that run its agents are in
`agentpost.factories`. This module gathers the names a user needs.
"""

from agentpost.protocol.fleet import (
    AgentDef,
    Fleet,
    FleetError,
    fleet_from_dict,
    load_fleet,
    parse_fleet,
)
from agentpost.store.fleet import Change, FleetConflict, FleetPlan, apply, describe, plan

__all__ = [
    "AgentDef",
    "Change",
    "Fleet",
    "FleetConflict",
    "FleetError",
    "FleetPlan",
    "apply",
    "describe",
    "fleet_from_dict",
    "load_fleet",
    "parse_fleet",
    "plan",
]
