"""`agentpost recover` and `redeliver`: finish deliveries a crash cut off, retry those whose
backoff is due. Both print what they did as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store, print_json


def cmd_recover(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        print_json(store.recover() if args.command == "recover" else store.redeliver())
    return 0


def register(sub: Any) -> None:
    sub.add_parser("recover", help="complete deliveries cut off by a crash").set_defaults(
        func=cmd_recover)
    sub.add_parser("redeliver", help="retry deliveries whose backoff is due").set_defaults(
        func=cmd_recover)
