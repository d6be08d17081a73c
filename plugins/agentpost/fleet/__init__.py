"""A fleet declared in one YAML file, applied to the store: `load_fleet(path)` and
`apply(store, fleet)`. The format is documented in docs/fleet.md.

A fleet spans the store (roles, types, workspaces) and the mark space (scopes, agents'
subscriptions), so it sits above both: the model and its validation are pure
(`agentpost.fleet.model`, no I/O but reading the file); applying it writes to the store and
the fleet's mark space (`agentpost.fleet.changes`); the DAG factories that run its agents are
in `agentpost.factories`. This package gathers the names a user needs.
"""

from agentpost.fleet.changes import Change, FleetConflict, FleetPlan, apply, describe, plan
from agentpost.fleet.model import (
    AgentDef,
    Fleet,
    FleetError,
    fleet_from_dict,
    load_fleet,
    parse_fleet,
)

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
