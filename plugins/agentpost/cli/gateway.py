"""``agentpost gateway`` and ``agentpost token``: serve the gateway, manage its tokens.

    agentpost gateway [--host H] [--port P] [--no-auth] [--log-level L]
    agentpost token create --name N --scope S [--scope S ...] [--rate R [--burst B]]
    agentpost token list [--json]
    agentpost token revoke ID

`token create` prints the secret once (it is stored only as a hash). The gateway itself is
`agentpost.gateway`; FastAPI and uvicorn are imported only when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentpost.cli.common import open_store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from agentpost.gateway.app import create_app
    from agentpost.gateway.core import is_loopback
    from agentpost.gateway.tokens import TokenStore

    if args.no_auth and not is_loopback(args.host):
        print("agentpost: warning: --no-auth serves requests without a token only from "
              "loopback addresses; others still need one", file=sys.stderr)
    with open_store(args) as store:
        TokenStore(store).check()
        app = create_app(store, require_tokens=not args.no_auth)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from agentpost.gateway.tokens import TokenStore

    with open_store(args) as store:
        tokens = TokenStore(store)
        if args.action == "create":
            info, secret = tokens.create(args.name, args.scope, rate=args.rate, burst=args.burst)
            print(json.dumps({**info.as_json(), "secret": secret}, indent=2))
            print("agentpost: the secret is shown only now; it is stored as a hash",
                  file=sys.stderr)
        elif args.action == "revoke":
            print(json.dumps(tokens.revoke(args.id).as_json(), indent=2))
        elif getattr(args, "json", False):
            print(json.dumps([t.as_json() for t in tokens.tokens()], indent=2))
        else:
            for t in tokens.tokens():
                state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
                limit = f"rate={t.rate:g}/s burst={t.burst}" if t.rate else "default limit"
                print(f"{t.id}\t{t.name}\t{state}\t{limit}\t{' '.join(t.scopes)}")
    return 0


def register(sub: Any) -> None:
    """Add the `gateway` and `token` commands to the main parser's subparsers."""
    gateway = sub.add_parser("gateway", help="serve the HTTP/WebSocket gateway (uvicorn)")
    gateway.add_argument("--host", default=DEFAULT_HOST)
    gateway.add_argument("--port", type=int, default=DEFAULT_PORT)
    gateway.add_argument("--no-auth", action="store_true",
                         help="serve requests without a token when they come from loopback")
    gateway.add_argument("--log-level", default="info",
                         choices=["critical", "error", "warning", "info", "debug"])
    gateway.set_defaults(func=cmd_gateway)

    token = sub.add_parser("token", help="create, list or revoke gateway tokens")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a token and print its secret once")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", action="append", required=True,
                        help="kind:pattern:action, e.g. 'streams:agents/*/inbox:enqueue' "
                             "(repeatable)")
    create.add_argument("--rate", type=float, help="requests per second (default: the "
                                                   "gateway's)")
    create.add_argument("--burst", type=int, help="bucket size (default: one second's worth)")
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("--json", action="store_true")
    revoke = actions.add_parser("revoke", help="revoke a token for good")
    revoke.add_argument("id")
    token.set_defaults(func=cmd_token)
