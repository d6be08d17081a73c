"""`agentpost workspace`, `send` and `inbox`: the WACP basics from a shell, creating and
moving workspaces, sending one envelope (or injecting one as a person), reading an inbox."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentpost.cli.common import EXIT_FAILED, open_store, print_json


def cmd_workspace(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.action == "create":
            ws = store.create_workspace(args.role, parent=args.parent,
                                        originator=args.originator, delegation=args.delegation,
                                        workspace_id=args.id)
            print_json(ws.model_dump(mode="json"))
        elif args.action == "transition":
            print_json(store.transition(args.workspace, args.state))
        else:
            for ws in store.workspaces():
                print(f"{ws.id}\t{ws.role}\t{ws.state}\tparent={ws.parent or '-'}"
                      f"\toriginator={ws.originator}")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.content == "-" else args.content
    with open_store(args) as store:
        if args.human is not None:
            result = store.inject(args.human, args.to, args.type, content, format=args.format,
                                  in_reply_to=args.in_reply_to, priority=args.priority)
        else:
            result = store.send(args.sender, args.to, args.type, content, format=args.format,
                                in_reply_to=args.in_reply_to, priority=args.priority)
    print_json(result.model_dump(mode="json"))
    return EXIT_FAILED if result.status == "rejected" else 0


def cmd_inbox(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        envelopes = store.inbox(args.workspace, limit=args.limit)
        if args.consume:
            for env in envelopes:
                store.consume(args.workspace, env.id)
    if args.json:
        print_json([e.model_dump(mode="json", by_alias=True) for e in envelopes])
        return 0
    for e in envelopes:
        print(f"{e.id}  {e.priority:<8} {e.type:<10} from {e.from_}: {short(e.content)}")
    if not envelopes:
        print("(inbox empty)")
    return 0


def short(text: str | None, width: int = 60) -> str:
    """`text` on one line, cut to `width` characters (an ellipsis says it was cut)."""
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def register(sub: Any) -> None:
    register_workspace(sub)
    register_send(sub)
    inbox = sub.add_parser("inbox", help="list a workspace's inbox in processing order")
    inbox.add_argument("workspace")
    inbox.add_argument("--limit", type=int)
    inbox.add_argument("--consume", action="store_true", help="consume what is listed")
    inbox.add_argument("--json", action="store_true")
    inbox.set_defaults(func=cmd_inbox)


def register_workspace(sub: Any) -> None:
    ws = sub.add_parser("workspace", help="create, move or list workspaces")
    ws_sub = ws.add_subparsers(dest="action", required=True)
    create = ws_sub.add_parser("create")
    create.add_argument("role")
    create.add_argument("--parent")
    create.add_argument("--id")
    create.add_argument("--originator", default="system")
    create.add_argument("--delegation", action="store_true")
    move = ws_sub.add_parser("transition")
    move.add_argument("workspace")
    move.add_argument("state")
    ws_sub.add_parser("list")
    ws.set_defaults(func=cmd_workspace)


def register_send(sub: Any) -> None:
    send = sub.add_parser("send", help="send one envelope")
    who = send.add_mutually_exclusive_group(required=True)
    who.add_argument("--from", dest="sender", help="sending workspace")
    who.add_argument("--human", metavar="USER_ID", help="inject through the human highway")
    send.add_argument("--to", required=True)
    send.add_argument("--type", required=True)
    send.add_argument("--format", default="markdown")
    send.add_argument("--priority", default="normal", choices=["normal", "urgent", "blocking"])
    send.add_argument("--in-reply-to")
    send.add_argument("content", help="the message body, or - to read it from stdin")
    send.set_defaults(func=cmd_send)
