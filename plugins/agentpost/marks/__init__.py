"""agentpost.marks: Markspace coordination ("Markspace Coordination Protocol: Specification").

The DSL of spec §12.1, the spaces, and the functions and classes the spec names are
re-exported here, so code written against the spec's examples runs with
`from agentpost.marks import ...`.

core, space, compose and schedule are imported eagerly. The guard, the defences, telemetry and
the Postgres backend load on first use (PEP 562 `__getattr__`): importing the package stays
cheap (no psycopg2 for in-memory users) and a module never waits on one it does not need.
"""

from importlib import import_module
from typing import Any

from agentpost.marks.compose import validate_manifest_permissions, validate_pipeline
from agentpost.marks.core import (
    CONTENT_FIELDS,
    REINFORCEMENT_CAP,
    REINFORCEMENT_FACTOR,
    TRUST_WEIGHTS,
    Action,
    Agent,
    AgentManifest,
    AnyMark,
    ConflictPolicy,
    DecayConfig,
    FrozenDict,
    FrozenList,
    Intent,
    InvalidArgument,
    InvalidMark,
    ManifestOutput,
    Mark,
    MarkPayload,
    MarkspaceError,
    MarkType,
    MarkValidationError,
    Need,
    NeedCluster,
    Observation,
    QuotaExceededError,
    Scope,
    ScopeError,
    ScopeRateLimit,
    ScopeVisibility,
    Severity,
    Source,
    TokenBudget,
    UnauthorizedWrite,
    UnknownMark,
    UnknownScope,
    ValidationError,
    Warning,
    WatchPattern,
    compute_strength,
    effective_strength,
    effective_strength_with_warnings,
    hours,
    minutes,
    project_mark,
    reinforce,
    resolve_conflict,
    scope_contains,
    trust_weight,
    winning_intent,
)
from agentpost.marks.schedule import Scheduler
from agentpost.marks.space import MarkSpace, MarkSpaceProtocol

#: name -> module (under agentpost.marks) it is loaded from on first use
_LAZY = {
    "Guard": "guard",
    "GuardDecision": "guard",
    "Verdict": "guard",
    "GuardVerdict": "guard",
    "ContentPolicy": "guard",
    "ContentPolicyError": "guard",
    "PolicyResult": "guard",
    "PolicyVerdict": "guard",
    "StatisticalEnvelope": "envelope",
    "WelfordDetector": "envelope",
    "EnvelopeVerdict": "envelope",
    "EnvelopeConfig": "envelope",
    "WelfordConfig": "envelope",
    "AnomalyDetector": "envelope",
    "AgentStats": "envelope",
    "AgentBarrier": "barrier",
    "BarrierSnapshot": "barrier",
    "DiagnosticProbe": "probe",
    "ProbeConfig": "probe",
    "ProbeResult": "probe",
    "ProbeVerdict": "probe",
    "BudgetTracker": "budget",
    "BudgetStatus": "budget",
    "RateLimiter": "rate_limit",
    "RateLimitTracker": "rate_limit",
    "NullSink": "telemetry",
    "StructuredLogSink": "telemetry",
    "InMemorySink": "telemetry",
    "FailingSink": "telemetry",
    "TelemetryEvent": "telemetry",
    "TelemetrySink": "telemetry",
    "PostgresMarkSpace": "postgres",
    "KeyRecord": "keys",
    "KeyInUse": "keys",
    "UnsettledCall": "keys",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CONTENT_FIELDS",
    "REINFORCEMENT_CAP",
    "REINFORCEMENT_FACTOR",
    "TRUST_WEIGHTS",
    "AnyMark",
    "MarkPayload",
    "QuotaExceededError",
    "ScopeError",
    "ValidationError",
    "scope_contains",
    "Action",
    "Agent",
    "AgentManifest",
    "ConflictPolicy",
    "DecayConfig",
    "FrozenDict",
    "FrozenList",
    "Intent",
    "InvalidArgument",
    "InvalidMark",
    "ManifestOutput",
    "Mark",
    "MarkType",
    "MarkValidationError",
    "MarkspaceError",
    "Need",
    "NeedCluster",
    "Observation",
    "Scope",
    "ScopeRateLimit",
    "ScopeVisibility",
    "Severity",
    "Source",
    "TokenBudget",
    "UnauthorizedWrite",
    "UnknownMark",
    "UnknownScope",
    "Warning",
    "WatchPattern",
    "compute_strength",
    "effective_strength",
    "effective_strength_with_warnings",
    "hours",
    "minutes",
    "project_mark",
    "reinforce",
    "resolve_conflict",
    "trust_weight",
    "winning_intent",
    "MarkSpace",
    "MarkSpaceProtocol",
    "Scheduler",
    "validate_manifest_permissions",
    "validate_pipeline",
    *_LAZY,
]
