"""Composition checks over agent manifests (spec §13.5): pure functions of the declared
inputs and outputs, never of the mark space's contents (P53, P54).

Readings chosen where the spec leaves room:

- Both validators return a list of problems, one sentence each; an empty list means valid.
  Each holds the package's words, which callers match on ("No connection", "no manifest",
  "lacks write permission").
- An output `(scope, mark_type)` feeds an input pattern when the pattern's scope is the
  output's scope or an ancestor of it (hierarchical, as for watch patterns) and the pattern's
  mark type is the same or unset. Topic and resource filters are ignored: outputs do not
  declare them, so they can only narrow a connection that exists, not create one.
- A pipeline needs a manifest on every agent; a pipeline of zero or one agent has no
  connections to check and is valid.
- Manifests are not checked against permissions when an Agent is built (the probe and guard
  build agents freely); `validate_manifest_permissions` is the check (P54).
"""

from __future__ import annotations

from itertools import pairwise

from agentpost.marks.core import (
    Agent,
    AgentManifest,
    ManifestOutput,
    Mark,
    WatchPattern,
    scope_covers,
)
from agentpost.marks.core import MarkType as MarkType
from agentpost.marks.core import scope_contains as scope_contains


def pattern_matches(pattern: WatchPattern, mark: Mark) -> bool:
    """`pattern.matches(mark)`: a pure field comparison (P55)."""
    return pattern.matches(mark)


def output_feeds(output: ManifestOutput, pattern: WatchPattern) -> bool:
    """Whether marks declared by `output` can match `pattern` (see the module docstring)."""
    scope, mark_type = output
    if not scope_covers(pattern.scope, scope):
        return False
    return pattern.mark_type is None or pattern.mark_type == mark_type


def manifest_feeds(producer: AgentManifest, consumer: AgentManifest) -> bool:
    """Whether at least one output of `producer` matches at least one input of `consumer`."""
    return any(
        output_feeds(output, pattern) for output in producer.outputs for pattern in consumer.inputs
    )


def validate_pipeline(agents: list[Agent]) -> list[str]:
    """Problems with the pipeline `agents[0] -> agents[1] -> ...`: an agent without a
    manifest, or a consecutive pair where no output of the first feeds an input of the
    second. Depends on the manifests only (P53)."""
    problems = [f"agent {a.name!r} has no manifest" for a in agents if a.manifest is None]
    if problems:
        return problems
    for producer, consumer in pairwise(agents):
        if not manifest_feeds(producer.manifest, consumer.manifest):
            problems.append(f"No connection: no output of {producer.name!r} feeds an input "
                            f"of {consumer.name!r}")
    return problems


def validate_manifest_permissions(agent: Agent) -> list[str]:
    """Outputs the agent's manifest declares but its write permissions do not cover
    (hierarchically), one problem each (P54). No manifest, no problems."""
    if agent.manifest is None:
        return []
    return [
        f"agent {agent.name!r} declares {mark_type.value} output to {scope!r} but lacks "
        "write permission for it"
        for scope, mark_type in agent.manifest.outputs
        if not agent.can_write(scope, mark_type)
    ]
