"""A fleet declared in one YAML file, applied to the store: `load_fleet(path)` and
`apply(store, fleet)`. The format is documented in docs/fleet.md.

A fleet spans the store (roles, types, workspaces) and the mark space (scopes, agents'
subscriptions), so it sits above both: the model (`agentpost.fleet.model`), reading a
file (`agentpost.fleet.files`) and the cross-references (`agentpost.fleet.checks`) are pure;
applying it writes to the store and
the fleet's mark space (`agentpost.fleet.changes`); the DAG factories that run its agents are
in `agentpost.factories`. This package gathers the names a user needs.
"""

from agentpost.fleet.changes import Change, FleetConflict, FleetPlan, apply, describe, plan
from agentpost.fleet.files import fleet_from_dict, load_fleet, parse_fleet
from agentpost.fleet.model import AgentDef, Fleet, FleetError

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
