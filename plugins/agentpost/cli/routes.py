"""The `agentpost route` commands (Asya routes): ``setup``, ``start``, ``status``,
``family`` and ``sweep``. Each prints JSON."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store, print_json, read_json


def _routes(store: Any) -> Any:
    from agentpost.store.routes import RouteStore

    return RouteStore(store)


def _read_envelopes(source: str) -> list[Any]:
    """One routed envelope (a JSON object) or a list of them, from a file or stdin (-)."""
    data = read_json(source, "the envelope")
    return data if isinstance(data, list) else [data]


def cmd_route(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        routes = _routes(store)
        if args.action == "setup":
            print_json({"created": routes.setup(args.actors)})
        elif args.action == "start":
            started = routes.start_many(_read_envelopes(args.source), sender=args.sender)
            views = routes.get_many([e.id for e in started])
            print_json([v.model_dump(mode="json") for v in views])
        elif args.action == "status":
            views = {v.id: v for v in routes.get_many(args.ids)}
            missing = [i for i in args.ids if i not in views]
            if missing:
                routes.get(missing[0])  # raises NotFound naming it
            print_json([views[i].model_dump(mode="json") for i in args.ids])
        elif args.action == "family":
            print_json(routes.family(args.id).model_dump(mode="json"))
        else:
            print_json({"moved_to_error_end": routes.sweep_timeouts()})
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
