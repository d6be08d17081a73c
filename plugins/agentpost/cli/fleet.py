"""The `agentpost fleet` commands: ``apply FILE [--dry-run]`` makes the store hold a fleet
file (docs/fleet.md), ``show FILE`` validates one and prints what it declares, without a
store. The fleet modules (YAML, the store) load only when a command runs."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store


def cmd_fleet(args: argparse.Namespace) -> int:
    from agentpost.fleet import apply, describe, load_fleet

    fleet = load_fleet(args.file)  # a bad file fails here, before any store is opened
    if args.action == "show":
        print(show(fleet))
        return 0
    with open_store(args) as store:
        result = apply(store, fleet, dry_run=args.dry_run)
    print(describe(result, applied=not args.dry_run))
    return 0


def show(fleet: Any) -> str:
    """What a fleet declares, one line per entry, with each agent's kind and id."""
    lines = [f"fleet {fleet.name!r} (mark space {fleet.space!r}) from {fleet.source}"]
    lines += [f"role      {r.name}" + (f" inherits {r.inherits}" if r.inherits else "")
              for r in fleet.roles]
    lines += [f"type      {t.name}: {', '.join(t.senders)} -> {', '.join(t.receivers)}"
              + (f" requires {', '.join(t.required_fields)}" if t.required_fields else "")
              for t in fleet.types]
    lines += [f"workspace {w.id}: role {w.role}" + (f", parent {w.parent}" if w.parent else "")
              for w in fleet.workspaces]
    lines += [f"scope     {s.name}: {s.conflict_policy.value}"
              + (", deferred" if s.deferred else "") for s in fleet.scopes]
    for spec in fleet.agents:
        when = (f"every {spec.interval:g} s" if spec.kind == "source" else "on demand"
                if spec.kind == "manual" else "on its inbox " + ", ".join(spec.inboxes))
        lines.append(f"agent     {spec.name} ({spec.kind}, {when}) id {fleet.agent(spec.name).id}"
                     + (f" runs {spec.callable}" if spec.callable else "")
                     + (f" runs an LLM ({spec.llm.llm_conn_id}"
                        + (f", {spec.llm.model_id}" if spec.llm.model_id else "") + ")"
                        if spec.llm else ""))
    return "\n".join(lines)


def register(sub: Any) -> None:
    fleet = sub.add_parser("fleet", help="apply or show a fleet file (roles, types, "
                                         "workspaces, agents)")
    actions = fleet.add_subparsers(dest="action", required=True)
    to_apply = actions.add_parser("apply", help="make the store hold the fleet (idempotent)")
    to_apply.add_argument("file")
    to_apply.add_argument("--dry-run", action="store_true",
                          help="print what would change, write nothing")
    actions.add_parser("show", help="validate the file and print what it declares"
                       ).add_argument("file")
    fleet.set_defaults(func=cmd_fleet)
