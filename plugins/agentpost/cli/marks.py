"""The `agentpost mark-key` command: look at and release the at-most-once keys of a durable
mark space (`GuardedActionOperator`, `WriteMarkOperator`, `Guard.execute_once`).

A guarded call whose try died after it started and before it recorded its action leaves its
key unsettled: every retry refuses to call again, because nobody knows whether the effect
happened. A person checks, then either marks the task done in Airflow or releases the key
here so the next try calls. Registered by agentpost.cli."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import print_json, store_dsn
from agentpost.protocol.errors import NotFound


def _space(args: argparse.Namespace) -> Any:
    """The durable mark space named by --space, in the command's store."""
    from agentpost.marks.postgres import PostgresMarkSpace

    return PostgresMarkSpace(dsn=store_dsn(args), space=args.space)


def cmd_mark_key(args: argparse.Namespace) -> int:
    space = _space(args)
    try:
        record = space.key_record(args.key)
        if record is None:
            raise NotFound(f"no key {args.key!r} in mark space {args.space!r}")
        if args.action == "show":
            print_json(record.model_dump(mode="json"))
            return 0
        if record.settled:
            raise NotFound(f"key {args.key!r} is settled (its outcome is recorded): "
                           "nothing to release")
        space.release_key(args.key)
        print_json({"key": args.key, "space": args.space, "released": True})
        return 0
    finally:
        space.close()


def register(sub: Any) -> None:
    parser = sub.add_parser("mark-key", help="show or release an at-most-once key of a "
                                             "mark space (a guarded call that died mid-way)")
    actions = parser.add_subparsers(dest="action", required=True)
    for name, text in (("show", "print the key's record"),
                       ("release", "let the next call under an unsettled key run (after "
                                   "checking what the dead call did)")):
        action = actions.add_parser(name, help=text)
        action.add_argument("key")
        action.add_argument("--space", default="default", help="the mark space's name")
    parser.set_defaults(func=cmd_mark_key)
