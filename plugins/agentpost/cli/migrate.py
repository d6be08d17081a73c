"""`agentpost migrate`: apply the store's pending migrations."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store


def cmd_migrate(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        applied = store.migrate()
    print("applied: " + ", ".join(applied) if applied else "already up to date")
    return 0


def register(sub: Any) -> None:
    sub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_migrate)
