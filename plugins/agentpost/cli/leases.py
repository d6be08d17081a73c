"""The `agentpost` commands that consume inboxes the Courier way: ``lease``, ``ack``,
``nack``, ``expire``, ``maintain``, ``dead-letters``, ``stats`` and ``latest``."""

from __future__ import annotations

import argparse
from typing import Any

from agentpost.cli.common import open_store, print_json
from agentpost.protocol.errors import InvalidInput


def cmd_lease(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        leases = store.lease(args.workspace, max=args.max, ttl=args.ttl, holder=args.holder)
    print_json([{"token": lease.token, "attempt": lease.attempt,
                 "expires_at": lease.expires_at.isoformat(),
                 "envelope": lease.envelope.model_dump(mode="json", by_alias=True)}
                for lease in leases])
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.command == "ack":
            print(f"acknowledged {store.ack_many(args.tokens)}")
        else:
            for token in args.tokens:
                env = store.nack(token, delay=args.delay)
                print(f"{env.id}\t{env.status}\tredeliveries={env.redeliveries}")
    return 0


def cmd_expire(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        print_json(store.expire_leases())
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from agentpost.store.maintenance import maintain

    idle = None if args.drop_watchers_idle is None else args.drop_watchers_idle * 86400
    if idle is not None and not idle > 0:
        raise InvalidInput("--drop-watchers-idle must be a positive number of days")
    with open_store(args) as store:
        print_json(maintain(store, vacuum=not args.no_vacuum, drop_watchers_idle=idle))
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        envelopes = store.dead_letters(args.workspace, limit=args.limit)
    print_json([e.model_dump(mode="json", by_alias=True) for e in envelopes])
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        stats = ([store.stats(args.workspace)] if args.workspace else store.stats_all())
    print_json([s.model_dump(mode="json") for s in stats])
    return 0


def cmd_latest(args: argparse.Namespace) -> int:
    from agentpost.protocol.leases import to_courier

    with open_store(args) as store:
        latest = store.latest_per_agent()
    print_json({stream: to_courier(env) for stream, env in latest.items()})
    return 0


def register(sub: Any) -> None:
    lease = sub.add_parser("lease", help="lease envelopes of an inbox (prints tokens)")
    lease.add_argument("workspace")
    lease.add_argument("--max", type=int, default=1)
    lease.add_argument("--ttl", type=float, default=30.0, help="seconds")
    lease.add_argument("--holder")
    lease.set_defaults(func=cmd_lease)

    ack = sub.add_parser("ack", help="acknowledge leases (all or nothing)")
    ack.add_argument("tokens", nargs="+")
    ack.set_defaults(func=cmd_ack)
    nack = sub.add_parser("nack", help="return leases to their inbox")
    nack.add_argument("tokens", nargs="+")
    nack.add_argument("--delay", type=float, default=0.0, help="seconds before redelivery")
    nack.set_defaults(func=cmd_ack)

    sub.add_parser("expire", help="return every expired lease").set_defaults(func=cmd_expire)
    maintain = sub.add_parser("maintain", help="expire leases, retry deliveries, send rule "
                                               "firings, fail commands whose executor died, "
                                               "time out exhausted route hops, prune "
                                               "event claims, VACUUM "
                                               "ANALYZE (schedule it)")
    maintain.add_argument("--no-vacuum", action="store_true")
    maintain.add_argument("--drop-watchers-idle", type=float, metavar="DAYS",
                          help="also forget event watchers (InboxEventTrigger) no trigger "
                               "asked for in DAYS days; one that comes back starts afresh")
    maintain.set_defaults(func=cmd_maintain)
    dead = sub.add_parser("dead-letters", help="list an inbox's dead-lettered envelopes")
    dead.add_argument("workspace")
    dead.add_argument("--limit", type=int, default=100)
    dead.set_defaults(func=cmd_dead_letters)
    stats = sub.add_parser("stats", help="inbox statistics (all inboxes without a workspace)")
    stats.add_argument("workspace", nargs="?")
    stats.set_defaults(func=cmd_stats)
    sub.add_parser("latest", help="the latestPerAgent view").set_defaults(func=cmd_latest)
