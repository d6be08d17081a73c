"""The `agentpost` argument parser: the global ``--dsn`` and every command group's
subcommands, each added by its module's `register`. `GROUPS` keeps the order `--help` lists
the commands in."""

from __future__ import annotations

import argparse
from types import ModuleType

from agentpost.cli import (
    bench,
    commands,
    demo,
    envelopes,
    fleet,
    gateway,
    leases,
    marks,
    mcp,
    migrate,
    recovery,
    registry,
    routes,
    rules,
    spark,
    trail,
)

GROUPS: tuple[ModuleType, ...] = (migrate, demo, envelopes, trail, recovery, spark, bench,
                                  leases, rules, gateway, commands, routes, registry, fleet,
                                  marks, mcp)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentpost",
                                     description="Agent coordination over a Postgres store.")
    parser.add_argument("--dsn", help="Postgres DSN of the store (default: AGENTPOST_DSN, "
                                      "else discovery)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser
