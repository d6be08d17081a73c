"""The `agentpost` command line.

Every command finds its store the same way: ``--dsn``, else AGENTPOST_DSN, else the store of
the `make demo` running from this checkout (`agentpost.demo_store`; a note on stderr says so),
else Postgres discovery (a server on 127.0.0.1:5432, else the private cluster under ``.pg/``)
with the database ``agentpost``, created and migrated on first use. Errors print one line to
stderr and exit non-zero: 1 for a failed check (verify) or a rejected envelope, 2 for bad
usage or input, 3 when the store cannot be reached or is misconfigured. An error about
something missing (an unknown workspace, command, ...) names the store it looked in.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from agentpost.benchmarks import SUITES
from agentpost.protocol.errors import (
    AgentpostError,
    ConfigurationError,
    InvalidInput,
    NotFound,
    StoreError,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
DEFAULT_DATABASE = "agentpost"


def store_dsn(args: argparse.Namespace) -> str:
    """The DSN of the store the command works on (see the module docstring), remembered on
    `args` so an error can name it; with the trail key a running demo published."""
    if getattr(args, "store_dsn", None):
        return args.store_dsn
    dsn = args.dsn or os.environ.get("AGENTPOST_DSN")
    if not dsn:
        dsn = _demo_store(args) or _default_store()
    args.store_dsn = dsn
    return dsn


def _demo_store(args: argparse.Namespace) -> str | None:
    from agentpost.demo_store import running_demo_store
    from agentpost.store.server import redact_dsn

    demo = running_demo_store()
    if demo is None:
        return None
    if not os.environ.get("AGENTPOST_TRAIL_KEY"):
        args.trail_key = demo.trail_key
    print(f"agentpost: using the store of the demo running here (pid {demo.pid}): "
          f"{redact_dsn(demo.dsn)}", file=sys.stderr)
    return demo.dsn


def _default_store() -> str:
    from agentpost.store.bootstrap import ensure_database

    return ensure_database(DEFAULT_DATABASE)


def _store(args: argparse.Namespace) -> Any:
    """The store the command works on (created and migrated when found by discovery)."""
    from agentpost.store import EnvelopeStore

    dsn = store_dsn(args)
    return EnvelopeStore(dsn, trail_key=getattr(args, "trail_key", None))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def cmd_migrate(args: argparse.Namespace) -> int:
    with _store(args) as store:
        applied = store.migrate()
    print("applied: " + ", ".join(applied) if applied else "already up to date")
    return 0


def cmd_workspace(args: argparse.Namespace) -> int:
    with _store(args) as store:
        if args.action == "create":
            ws = store.create_workspace(args.role, parent=args.parent,
                                        originator=args.originator, delegation=args.delegation,
                                        workspace_id=args.id)
            _print_json(ws.model_dump(mode="json"))
        elif args.action == "transition":
            _print_json(store.transition(args.workspace, args.state))
        else:
            for ws in store.workspaces():
                print(f"{ws.id}\t{ws.role}\t{ws.state}\tparent={ws.parent or '-'}"
                      f"\toriginator={ws.originator}")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.content == "-" else args.content
    with _store(args) as store:
        if args.human is not None:
            result = store.inject(args.human, args.to, args.type, content, format=args.format,
                                  in_reply_to=args.in_reply_to, priority=args.priority)
        else:
            result = store.send(args.sender, args.to, args.type, content, format=args.format,
                                in_reply_to=args.in_reply_to, priority=args.priority)
    _print_json(result.model_dump(mode="json"))
    return EXIT_FAILED if result.status == "rejected" else 0


def cmd_inbox(args: argparse.Namespace) -> int:
    with _store(args) as store:
        envelopes = store.inbox(args.workspace, limit=args.limit)
        if args.consume:
            for env in envelopes:
                store.consume(args.workspace, env.id)
    if args.json:
        _print_json([e.model_dump(mode="json", by_alias=True) for e in envelopes])
        return 0
    for e in envelopes:
        print(f"{e.id}  {e.priority:<8} {e.type:<10} from {e.from_}: {_short(e.content)}")
    if not envelopes:
        print("(inbox empty)")
    return 0


def cmd_trail(args: argparse.Namespace) -> int:
    with _store(args) as store:
        events = store.trail(workspace_id=args.workspace, envelope_id=args.envelope,
                             event=args.event, limit=args.limit)
    if args.json:
        _print_json([e.model_dump(mode="json") for e in events])
        return 0
    for e in events:
        print(format_trail_event(e))
    return 0


def format_trail_event(e: Any) -> str:
    body = {k: v for k, v in e.body.items() if v is not None and k != "envelope_id"}
    ref = f" {e.envelope_id[:8]}" if e.envelope_id else ""
    where = f"{e.chain}:{e.seq}"
    return f"#{e.id:<5} {where:<16} {e.event:<24}{ref} {json.dumps(body, default=str)}"


def cmd_verify(args: argparse.Namespace) -> int:
    anchor = None if args.anchor is None else _read_file(args.anchor, "checkpoint")
    since = None if args.since is None else _read_file(args.since, "checkpoint")
    workers = _workers(args.workers)
    with _store(args) as store:
        result = store.verify_trail(anchor=anchor, since=since, workers=workers)
    if result.ok and args.out is not None:
        from agentpost.protocol.anchor import Checkpoint
        from agentpost.store.anchor import write_checkpoint

        write_checkpoint(Checkpoint.from_json(result.checkpoint), args.out)
    if result.ok:
        print(f"trail verified: {result.entries} entries in {result.chains} chains"
              f"{_verified_since(result)}{_verified_anchor(result)}"
              + ("" if args.out is None else f"; its checkpoint written to {args.out}"))
        _unaccounted(result, sys.stdout)
        return 0
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
    _unaccounted(result, sys.stderr)
    return EXIT_FAILED


def _unaccounted(result: Any, out: Any) -> None:
    if result.rows_unaccounted:
        print(f"note: the tables of {', '.join(result.rows_unaccounted)} hold rows that no "
              f"entry accounts for (added outside the store, or by a migration since the "
              f"checkpoint)", file=out)


def _verified_since(result: Any) -> str:
    if result.since_taken_at is None:
        return ""
    old = ("" if result.since_rows != "named since" else
           " (a checkpoint without row digests: only the rows named since it were looked "
           "for)")
    return f" since the checkpoint of {result.since_taken_at:%Y-%m-%d %H:%M:%S} UTC{old}"


def _verified_anchor(result: Any) -> str:
    if result.anchor_taken_at is None:
        return ""
    return (f"; every chain reaches the checkpoint of "
            f"{result.anchor_taken_at:%Y-%m-%d %H:%M:%S} UTC ({result.anchored_chains} chains)")


def _workers(value: str) -> int:
    """--workers as a number; its range is the store's to check (one-line errors both)."""
    try:
        return int(value)
    except ValueError:
        raise InvalidInput(f"--workers is not a whole number: {value[:40]!r}") from None


def cmd_checkpoint(args: argparse.Namespace) -> int:
    with _store(args) as store:
        checkpoint = store.checkpoint()
    if args.out is None:
        sys.stdout.write(checkpoint.to_json())
        return 0
    from agentpost.store.anchor import write_checkpoint

    write_checkpoint(checkpoint, args.out)
    print(f"checkpoint of {len(checkpoint.heads)} chains at {checkpoint.taken_at} written to "
          f"{args.out}")
    return 0


def _read_file(path: str, what: str) -> str:
    """The text of `path` (- for stdin); an unreadable file is bad input, in one line."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the {what} {path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None


def cmd_recover(args: argparse.Namespace) -> int:
    with _store(args) as store:
        _print_json(store.recover() if args.command == "recover" else store.redeliver())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.airflow:
        from agentpost.airflow_demo import run_airflow_demo

        return run_airflow_demo(dsn=args.dsn, dags_folder=args.dags_folder)
    if args.headless:
        from agentpost.airflow_demo import run_headless_demo

        return run_headless_demo(dsn=args.dsn, dags_folder=args.dags_folder)
    if args.dags_folder is not None:
        raise InvalidInput("--dags-folder is for the Airflow demos (--airflow, --headless); "
                           "the terminal demo plays no DAGs")
    from agentpost.demo import run_demo

    return run_demo(dsn=args.dsn)


def cmd_bench(args: argparse.Namespace) -> int:
    from agentpost.benchmarks import run_benchmark

    if args.large and args.suite != "growth":
        print("agentpost: --large is for `agentpost bench growth` only", file=sys.stderr)
        return EXIT_USAGE
    return run_benchmark(args.suite, dsn=args.dsn, scale=args.scale, large=args.large)


def cmd_spark(args: argparse.Namespace) -> int:
    """A Spark job in this process (local mode unless --master says otherwise); the same
    `main` spark-submit runs. `check` only says whether the jobs can run here."""
    from agentpost.spark import install
    from agentpost.spark.apps import run

    if args.job == "check":
        trouble = install.problem()
        print(f"agentpost spark check: {trouble}" if trouble else install.summary(),
              file=sys.stderr if trouble else sys.stdout)
        return EXIT_USAGE if trouble else 0
    job_args = list(args.job_args)
    if args.dsn and "--dsn" not in job_args:
        job_args = ["--dsn", args.dsn, *job_args]
    return run(args.job, job_args)


def _short(text: str | None, width: int = 60) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentpost",
                                     description="Agent coordination over a Postgres store.")
    parser.add_argument("--dsn", help="Postgres DSN of the store (default: AGENTPOST_DSN, "
                                      "else discovery)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_migrate)
    demo = sub.add_parser("demo", help="run a demo: in the terminal (default), on a real "
                                       "Airflow, or under dag.test()")
    mode = demo.add_mutually_exclusive_group()
    mode.add_argument("--airflow", action="store_true",
                      help="run the example DAGs on `airflow standalone` until Ctrl-C")
    mode.add_argument("--headless", action="store_true",
                      help="run the example DAGs with dag.test(), no servers")
    demo.add_argument("--dags-folder", metavar="DIR",
                      help="the DAGs and fleet.yaml the Airflow demos play (default: dags/ "
                           "of the agentpost checkout this runs in)")
    demo.set_defaults(func=cmd_demo)

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

    inbox = sub.add_parser("inbox", help="list a workspace's inbox in processing order")
    inbox.add_argument("workspace")
    inbox.add_argument("--limit", type=int)
    inbox.add_argument("--consume", action="store_true", help="consume what is listed")
    inbox.add_argument("--json", action="store_true")
    inbox.set_defaults(func=cmd_inbox)

    trail = sub.add_parser("trail", help="print trail entries")
    trail.add_argument("--workspace")
    trail.add_argument("--envelope")
    trail.add_argument("--event")
    trail.add_argument("--limit", type=int, default=200)
    trail.add_argument("--json", action="store_true")
    trail.set_defaults(func=cmd_trail)

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
    checkpoint = sub.add_parser("checkpoint", help="write a signed checkpoint of every "
                                                   "chain's head, to keep outside the database")
    checkpoint.add_argument("--out", metavar="FILE", help="write it to FILE (default: stdout)")
    checkpoint.set_defaults(func=cmd_checkpoint)
    sub.add_parser("recover", help="complete deliveries cut off by a crash").set_defaults(
        func=cmd_recover)
    sub.add_parser("redeliver", help="retry deliveries whose backoff is due").set_defaults(
        func=cmd_recover)

    spark = sub.add_parser("spark", help="run a Spark job over the trail in this process: "
                                         "analytics, audit or export (--help after the job "
                                         "lists its options); check: can the jobs run here")
    spark.add_argument("job", choices=["analytics", "audit", "export", "check"])
    spark.add_argument("job_args", nargs=argparse.REMAINDER,
                       help="the job's options (e.g. --start ... --end ...)")
    spark.set_defaults(func=cmd_spark)

    bench = sub.add_parser("bench", help="run a benchmark and print its numbers")
    bench.add_argument("suite", choices=sorted(SUITES))
    bench.add_argument("--scale", type=float, default=1.0,
                       help="multiply the number of operations measured")
    bench.add_argument("--large", action="store_true",
                       help="growth only: also fill the store to 10M envelopes")
    bench.set_defaults(func=cmd_bench)
    from agentpost.commands_cli import register as register_commands
    from agentpost.fleet_cli import register as register_fleet
    from agentpost.gateway.cli import register as register_gateway
    from agentpost.inbox_cli import register as register_inbox
    from agentpost.marks_cli import register as register_mark_keys
    from agentpost.registry_cli import register as register_registry
    from agentpost.routes_cli import register as register_routes

    register_inbox(sub)
    register_gateway(sub)
    register_commands(sub)
    register_routes(sub)
    register_registry(sub)
    register_fleet(sub)
    register_mark_keys(sub)
    return parser


_EXIT_CODES: Sequence[tuple[type[Exception], int]] = (
    (InvalidInput, EXIT_USAGE),
    (NotFound, EXIT_USAGE),
    (ConfigurationError, EXIT_STORE),
    (StoreError, EXIT_STORE),
    (AgentpostError, EXIT_USAGE),
)


def _where(args: argparse.Namespace, exc: AgentpostError) -> str:
    """For something missing: the store it was looked for in (its DSN without a password),
    since "unknown workspace" in the wrong database is the usual first-hour puzzle."""
    dsn = getattr(args, "store_dsn", None)
    if not isinstance(exc, NotFound) or not dsn:
        return ""
    from agentpost.store.server import redact_dsn

    return f" (in the store {redact_dsn(dsn)})"


def _one_line_warning(message: Warning | str, *args: object, **kwargs: object) -> str:
    return f"agentpost: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    warnings.formatwarning = _one_line_warning
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at shutdown
        return code
    except AgentpostError as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"agentpost: {message}{_where(args, exc)}", file=sys.stderr)
        return next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`agentpost trail | head`): stop quietly, as a Unix tool does;
        # stdout is pointed at /dev/null so the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
