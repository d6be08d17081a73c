"""`agentpost rule add|list|remove|enable|disable`: the store's on-insert rules (Courier §8)
from a shell; a rule is added from a JSON file or stdin."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store, print_json, read_json


def cmd_rule(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.action == "add":
            rule = store.add_rule(read_json(args.source, "the rule"), replace=args.replace)
            print_json(rule.model_dump(mode="json", by_alias=True))
        elif args.action == "list":
            print_json([r.model_dump(mode="json", by_alias=True) for r in store.rules()])
        elif args.action == "remove":
            store.remove_rule(args.id)
            print(f"removed {args.id}")
        else:
            rule = store.enable_rule(args.id, args.action == "enable")
            print(f"{rule.id}\t{'enabled' if rule.enabled else 'disabled'}")
    return 0


def register(sub: Any) -> None:
    rule = sub.add_parser("rule", help="manage on-insert rules")
    rule_sub = rule.add_subparsers(dest="action", required=True)
    add = rule_sub.add_parser("add", help="add a rule from a JSON file (- for stdin)")
    add.add_argument("source")
    add.add_argument("--replace", action="store_true")
    rule_sub.add_parser("list")
    for action in ("remove", "enable", "disable"):
        rule_sub.add_parser(action).add_argument("id")
    rule.set_defaults(func=cmd_rule)
