"""The `agentpost role` and `agentpost type` commands: define roles and register envelope
types with their rows of the permission matrix ("WACP: Envelope" §2) from a shell, and list
both. Defining or registering again what already exists changes nothing (``created: false``,
``rows_added: 0``); a contradicting definition is refused (exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from agentpost.cli.common import open_store, print_json
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.registry import EnvelopeType, Role


def names(text: str, what: str) -> list[str]:
    """A comma-separated list of names (``a,b``); an empty item is bad input."""
    items = [item.strip() for item in text.split(",")]
    if text.strip() and any(not item for item in items):
        raise InvalidInput(f"{what} has an empty name in {text!r}")
    return [item for item in items if item]


def _listing(args: argparse.Namespace, items: list[Any], line: Callable[[Any], str]) -> int:
    """Print `items` as JSON (--json) or one tab-separated line each."""
    if args.json:
        print_json([item.model_dump(mode="json") for item in items])
    else:
        for item in items:
            print(line(item))
    return 0


def _role_line(r: Role) -> str:
    return f"{r.name}\t{'builtin' if r.builtin else 'defined'}\tlineage={'>'.join(r.lineage)}"


def _type_line(t: EnvelopeType) -> str:
    rows = ",".join(f"{p.sender}>{p.receiver}" for p in t.permissions) or "-"
    fields = ",".join(t.required_fields) or "-"
    return (f"{t.name}\t{'builtin' if t.builtin else 'registered'}\trequired={fields}"
            f"\tpermits={rows}")


def cmd_role(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.action == "define":
            print_json(store.define_role(args.name, inherits=args.inherits))
            return 0
        roles = store.roles()
    return _listing(args, roles, _role_line)


def cmd_type(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.action == "register":
            print_json(store.register_type(
                args.name, names(args.senders, "--senders"),
                names(args.receivers, "--receivers"),
                required_fields=names(args.required_fields, "--required-fields")))
            return 0
        types = store.envelope_types()
    return _listing(args, types, _type_line)


def register(sub: Any) -> None:
    role = sub.add_parser("role", help="define and list roles")
    role_sub = role.add_subparsers(dest="action", required=True)
    define = role_sub.add_parser("define", help="define a role (again: no change)")
    define.add_argument("name")
    define.add_argument("--inherits", metavar="ROLE",
                        help="the role whose permission rows it holds too")
    role_list = role_sub.add_parser("list", help="every role with its lineage")
    role_list.add_argument("--json", action="store_true")
    role.set_defaults(func=cmd_role)

    etype = sub.add_parser("type", help="register and list envelope types")
    type_sub = etype.add_subparsers(dest="action", required=True)
    reg = type_sub.add_parser("register", help="register an envelope type and the roles that "
                                               "may send and receive it (again: adds rows)")
    reg.add_argument("name")
    reg.add_argument("--senders", required=True, metavar="ROLE,...")
    reg.add_argument("--receivers", required=True, metavar="ROLE,...")
    reg.add_argument("--required-fields", default="", metavar="FIELD,...",
                     help="top-level fields a JSON payload of this type must carry")
    type_list = type_sub.add_parser("list", help="every envelope type with its permission rows")
    type_list.add_argument("--json", action="store_true")
    etype.set_defaults(func=cmd_type)
