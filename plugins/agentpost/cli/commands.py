"""The `agentpost command` commands: ``submit``, ``view``, ``confirm``, ``decline``,
``evidence`` and ``sweep`` for SMCL commands. A person confirms or declines through the human
highway (a ``command.confirmation`` envelope injected as ``human:<user>``), so the decision is
recorded with who made it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentpost.cli.common import open_store, parse_json, print_json
from agentpost.protocol.commands import CommandView, Decision


@contextmanager
def _ledger(args: argparse.Namespace) -> Iterator[Any]:
    """The command ledger over the command's store (the store module loads only here)."""
    from agentpost.store.commands import CommandLedger

    with open_store(args) as store, CommandLedger(store) as ledger:
        yield ledger


def _print_view(view: CommandView, ledger: Any) -> None:
    """A command's report, its arguments redacted as the ledger redacts them everywhere."""
    report = view.report()
    report["args"] = ledger.redaction.redact(view.args)
    print_json(report)


def cmd_submit(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        command_args = None if args.args is None else parse_json(args.args, "--args")
        view = ledger.submit(args.workspace, args.key, action=args.action,
                             mutating=args.mutating, auto_confirm=args.auto_confirm,
                             executor=args.executor, args=command_args)
        if view.mutating and view.auto_confirm is None and view.state.value == "canonicalized":
            view = ledger.request_confirmation(view.command_id)
        _print_view(view, ledger)
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        _print_view(ledger.view(args.command_id), ledger)
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        _print_view(ledger.confirmation_envelope(args.user, args.command_id, args.decision),
                    ledger)
    return 0


def cmd_evidence(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        events = ledger.evidence(args.command_id)
    if args.json:
        print_json([e.model_dump(mode="json") for e in events])
        return 0
    for e in events:
        life = e.body["lifecycle"]
        detail = e.body.get("reason") or e.body.get("confirmed_by") or e.body.get(
            "refusal") or ""
        print(f"{e.seq}\t{life['timestamp']}\t{life['evidence_type']}\t"
              f"{life['transition'] or ''}\t{detail}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        print_json(ledger.sweep_stuck(limit=args.limit))
    return 0


def register(sub: Any) -> None:
    command = sub.add_parser("command", help="SMCL commands: submit, view, confirm, evidence")
    cmd_sub = command.add_subparsers(dest="command_action", required=True)

    submit = cmd_sub.add_parser("submit", help="submit a command (a mutating one without an "
                                               "auto-confirm policy asks for confirmation)")
    submit.add_argument("workspace")
    submit.add_argument("key", help="idempotency key")
    submit.add_argument("--action", required=True, help="a registered envelope type")
    submit.add_argument("--mutating", action="store_true")
    submit.add_argument("--auto-confirm", metavar="POLICY")
    submit.add_argument("--executor", help="executing workspace (default: the workspace)")
    submit.add_argument("--args", help="the command's arguments, JSON")
    submit.set_defaults(func=cmd_submit)

    view = cmd_sub.add_parser("view", help="state, last transition, outcome, reason, "
                                           "recovery options")
    view.add_argument("command_id")
    view.set_defaults(func=cmd_view)

    for decision in Decision:
        decide = cmd_sub.add_parser(decision.value, help=f"{decision.value} a command as a "
                                                         "person (through the human highway)")
        decide.add_argument("command_id")
        decide.add_argument("--user", required=True, help="the person deciding")
        decide.set_defaults(func=cmd_decide, decision=decision)

    evidence = cmd_sub.add_parser("evidence", help="a command's evidence, in order")
    evidence.add_argument("command_id")
    evidence.add_argument("--json", action="store_true")
    evidence.set_defaults(func=cmd_evidence)

    sweep = cmd_sub.add_parser("sweep", help="fail started commands whose executor died "
                                             "(schedule it)")
    sweep.add_argument("--limit", type=int, default=1000)
    sweep.set_defaults(func=cmd_sweep)
