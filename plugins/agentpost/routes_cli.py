"""The `agentpost route` commands (Asya routes): ``setup``, ``start``, ``status``,
``family`` and ``sweep``. Registered by agentpost.cli through `register`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentpost.protocol.errors import InvalidInput


def _cli() -> Any:
    from agentpost import cli

    return cli


def _routes(store: Any) -> Any:
    from agentpost.store.routes import RouteStore

    return RouteStore(store)


def _read_envelopes(source: str) -> list[Any]:
    """One routed envelope (a JSON object) or a list of them, from a file or stdin (-)."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read {source}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"the envelope is not valid JSON: {exc}") from None
    return data if isinstance(data, list) else [data]


def cmd_route(args: argparse.Namespace) -> int:
    cli = _cli()
    with cli._store(args) as store:
        routes = _routes(store)
        if args.action == "setup":
            cli._print_json({"created": routes.setup(args.actors)})
        elif args.action == "start":
            started = routes.start_many(_read_envelopes(args.source), sender=args.sender)
            views = routes.get_many([e.id for e in started])
            cli._print_json([v.model_dump(mode="json") for v in views])
        elif args.action == "status":
            views = {v.id: v for v in routes.get_many(args.ids)}
            missing = [i for i in args.ids if i not in views]
            if missing:
                routes.get(missing[0])  # raises NotFound naming it
            cli._print_json([views[i].model_dump(mode="json") for i in args.ids])
        elif args.action == "family":
            cli._print_json(routes.family(args.id).model_dump(mode="json"))
        else:
            cli._print_json({"moved_to_error_end": routes.sweep_timeouts()})
    return 0


def register(sub: Any) -> None:
    route = sub.add_parser("route", help="Asya routes: set up actors, start routed "
                                         "envelopes, status, families, timeouts")
    actions = route.add_subparsers(dest="action", required=True)
    setup = actions.add_parser("setup", help="create actor workspaces (and happy-end, "
                                             "error-end, the gateway) and their rights")
    setup.add_argument("actors", nargs="+")
    start = actions.add_parser("start", help="start routed envelopes from a JSON file "
                                             "(- for stdin): an object or a list")
    start.add_argument("source")
    start.add_argument("--sender", default="asya-gateway")
    status = actions.add_parser("status", help="status and progress of routed envelopes")
    status.add_argument("ids", nargs="+")
    family = actions.add_parser("family", help="a fan-out family (by any member's id)")
    family.add_argument("id")
    actions.add_parser("sweep", help="move envelopes whose hop timed out (dead-lettered) "
                                     "to error-end (schedule it)")
    route.set_defaults(func=cmd_route)
