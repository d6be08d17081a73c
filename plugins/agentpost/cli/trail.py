"""`agentpost trail`, `verify` and `checkpoint`: read the trail, check its hashes and
signatures (against a checkpoint, or only since one), and write signed checkpoints of the
chains' heads to keep outside the database."""

from __future__ import annotations

import argparse
import sys
from datetime import date
from typing import Any

from agentpost.cli.common import EXIT_FAILED, open_store, print_json
from agentpost.protocol.anchor import Checkpoint
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.trail import format_trail_event


def cmd_trail(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        events = store.trail(workspace_id=args.workspace, envelope_id=args.envelope,
                             event=args.event, limit=args.limit)
    if args.json:
        print_json([e.model_dump(mode="json") for e in events])
        return 0
    for e in events:
        print(format_trail_event(e))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    anchor = None if args.anchor is None else read_checkpoint(args.anchor)
    since = None if args.since is None else read_checkpoint(args.since)
    workers = whole_number(args.workers)
    with open_store(args) as store:
        result = store.verify_trail(anchor=anchor, since=since, workers=workers)
    if result.ok and args.out is not None:
        from agentpost.store.anchor import write_checkpoint

        write_checkpoint(Checkpoint.from_json(result.checkpoint), args.out)
    if result.ok:
        print(f"trail verified: {result.entries} entries in {result.chains} chains"
              f"{verified_since(result)}{verified_anchor(result)}"
              + ("" if args.out is None else f"; its checkpoint written to {args.out}"))
        print_unaccounted(result, sys.stdout)
        return 0
    print_failure(result)
    return EXIT_FAILED


def print_failure(result: Any) -> None:
    """A failed verification on stderr: where it first failed, then every detail."""
    where = (f" at entry #{result.failure_id} (chain {result.failure_chain}, "
             f"seq {result.failure_seq})" if result.failure_id is not None
             else f" (chain {result.failure_chain})")
    print(f"trail verification FAILED{where}: {result.failure}; {result.failures} "
          f"failure(s) in all", file=sys.stderr)
    for mismatch in result.anchor_mismatches:
        print(f"  {mismatch.problem}", file=sys.stderr)
    for row in result.missing_rows:
        print(f"  missing row: {row.kind} {row.id} (named in chain {row.chain})",
              file=sys.stderr)
    print_unaccounted(result, sys.stderr)


def print_unaccounted(result: Any, out: Any) -> None:
    if result.rows_unaccounted:
        print(f"note: the tables of {', '.join(result.rows_unaccounted)} hold rows that no "
              f"entry accounts for (added outside the store, or by a migration since the "
              f"checkpoint)", file=out)


def verified_since(result: Any) -> str:
    if result.since_taken_at is None:
        return ""
    old = ("" if result.since_rows != "named since" else
           " (a checkpoint without row digests: only the rows named since it were looked "
           "for)")
    return f" since the checkpoint of {result.since_taken_at:%Y-%m-%d %H:%M:%S} UTC{old}"


def verified_anchor(result: Any) -> str:
    if result.anchor_taken_at is None:
        return ""
    return (f"; every chain reaches the checkpoint of "
            f"{result.anchor_taken_at:%Y-%m-%d %H:%M:%S} UTC ({result.anchored_chains} chains)")


def whole_number(value: str) -> int:
    """--workers as a number; its range is the store's to check (one-line errors both)."""
    try:
        return int(value)
    except ValueError:
        raise InvalidInput(f"--workers is not a whole number: {value[:40]!r}") from None


def read_checkpoint(path: str) -> str:
    """The text of the checkpoint file `path` (- for stdin); unreadable is bad input."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the checkpoint {path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None


def cmd_checkpoint(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        checkpoint = store.checkpoint()
    if args.out is None:
        sys.stdout.write(checkpoint.to_json())
        return 0
    from agentpost.store.anchor import write_checkpoint

    write_checkpoint(checkpoint, args.out)
    print(f"checkpoint of {len(checkpoint.heads)} chains at {checkpoint.taken_at} written to "
          f"{args.out}")
    return 0


def register(sub: Any) -> None:
    trail = sub.add_parser("trail", help="print trail entries")
    trail.add_argument("--workspace")
    trail.add_argument("--envelope")
    trail.add_argument("--event")
    trail.add_argument("--limit", type=int, default=200)
    trail.add_argument("--json", action="store_true")
    trail.set_defaults(func=cmd_trail)
    register_archive(trail.add_subparsers(dest="trail_command", metavar="{archive,prune}"))
    register_verify(sub)
    checkpoint = sub.add_parser("checkpoint", help="write a signed checkpoint of every "
                                                   "chain's head, to keep outside the database")
    checkpoint.add_argument("--out", metavar="FILE", help="write it to FILE (default: stdout)")
    checkpoint.set_defaults(func=cmd_checkpoint)


def register_verify(sub: Any) -> None:
    verify = sub.add_parser("verify", help="check the trail's hashes and signatures")
    verify.add_argument("--anchor", metavar="FILE",
                        help="also check every chain against this checkpoint (- for stdin)")
    verify.add_argument("--since", metavar="FILE",
                        help="check only what came after this verified checkpoint's heads "
                             "(- for stdin)")
    verify.add_argument("--workers", metavar="N", default="1",
                        help="verify the chains in N processes sharing one snapshot")
    verify.add_argument("--out", metavar="FILE",
                        help="when it verifies, write the checkpoint of the heads verified to "
                             "FILE (the next run's --since)")
    verify.set_defaults(func=cmd_verify)


def register_archive(sub: Any) -> None:
    """`agentpost trail archive` and `trail prune` (docs/operations.md, "Archive and prune")."""
    archive = sub.add_parser("archive", help="verify, then copy the months before --before to "
                                             "Parquet with the verified checkpoint of the cut")
    prune = sub.add_parser("prune", help="drop the months before --before from Postgres, once "
                                         "their archive and its checkpoint verify")
    for p in (archive, prune):
        p.add_argument("--before", required=True, type=day, metavar="DATE",
                       help="the cut: months that end by this day (YYYY-MM-DD, UTC) go")
        p.add_argument("--archive", required=True, metavar="DIR",
                       help="the trail's export directory (AGENTPOST_TRAIL_ARCHIVE)")
    archive.add_argument("--since", metavar="FILE",
                         help="verify since this verified checkpoint (default: since the last "
                              "prune, or the whole trail)")
    archive.set_defaults(func=cmd_archive)
    prune.set_defaults(func=cmd_prune)


def day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day (YYYY-MM-DD): {value[:40]!r}") from None


def cmd_archive(args: argparse.Namespace) -> int:
    from agentpost.store.trail_archive import archive

    since = None if args.since is None else read_checkpoint(args.since)
    with open_store(args) as store:
        done = archive(store, args.archive, args.before, since=since)
    print(f"archived {done.entries:,} entries, {done.envelopes:,} envelope rows, "
          f"{done.routes:,} route rows, {done.commands:,} commands and {done.sagas:,} sagas"
          " to "
          f"{args.archive}{'' if done.batch is None else '/' + done.batch}; the cut at "
          f"{done.cut} covers "
          f"{', '.join(done.partitions)}; its verified checkpoint: {done.checkpoint}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from agentpost.store.trail_archive import prune

    with open_store(args) as store:
        done = prune(store, args.archive, args.before)
    print(f"pruned {', '.join(done.partitions)}: {done.dropped:,} entries dropped, "
          f"{done.kept:,} kept (chain heads and what open rows still need); "
          f"{done.envelopes:,} envelope rows dropped, {done.envelopes_kept:,} kept; "
          f"{done.routes:,} route rows dropped, {done.routes_kept:,} kept; "
          f"{done.commands:,} commands, {done.sagas:,} sagas and {done.saga_steps:,} saga "
          f"steps dropped, with {done.chains:,} chains of their own")
    return 0
