"""A person's recovery of a command through the human highway, acting once.

A person's retry or compensate is several ledger steps (submit, ask for the confirmation,
confirm by a ``command.confirmation`` envelope, and for a compensation the person performed,
execute it), each its own transaction: the confirmation envelope is a send, which commits on
its own. `recover_as_person` runs them under the target's *recovery lock*, a
transaction-scoped advisory lock held on a connection of its own for the whole sequence, so
two people (or one person's double click) acting on one command at once take turns: the
second sees what the first did and is refused (Conflict) or, with the same key, lands on the
same recovery, writing nothing. The ledger's own rule (one standing recovery per target,
checked under the target's row lock at submit) holds for every other caller as well.

The key is single-use: the recovery's idempotency key, chosen when the person was shown the
confirmation. A repeated call with it continues where an interrupted one stopped (each step
runs only if the recovery's state still asks for it; the envelope's id is fixed by the
recovery's id) and sends nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from agentpost.pg.db import Database
from agentpost.protocol.commands import RECOVERY_KINDS, CommandKind, CommandState, CommandView
from agentpost.protocol.errors import Conflict, InvalidInput
from agentpost.store.commands import CommandLedger

S = CommandState
#: a confirmed recovery whose remaining gates need nobody: `perform` may execute it
_STARTABLE = frozenset({S.CONFIRMED, S.AUTHZ_PENDING, S.AUTHORIZED})
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


@contextmanager
def recovery_lock(db: Database, target_command_id: str) -> Iterator[None]:
    """Hold the recovery lock of one target command until the block ends (also when the
    process dies: the lock belongs to a transaction of its own connection)."""
    with db.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(_LOCK, (f"agentpost.command_recovery:{target_command_id}",))
            yield
        finally:
            cur.execute("ROLLBACK")


def recover_as_person(ledger: CommandLedger, target_command_id: str,
                      kind: CommandKind | str, key: str, user_id: str, *,
                      context: Mapping[str, Any] | None = None,
                      check: Callable[[CommandLedger, CommandView], None] | None = None,
                      perform: Callable[[], Any] | None = None) -> CommandView:
    """Start (or, with a key used before, continue) a person's recovery of the target: a
    mutating recovery command with idempotency key `key`, confirmed by `user_id` through a
    human-highway envelope, and executed with `perform` when given (a compensation the person
    did by hand). `check(ledger, target)` runs under the lock before a new recovery is
    submitted (a caller's own rules; raise to refuse). Conflict when the target's state does
    not offer `kind` or another recovery of it stands; nothing is written then."""
    if kind not in RECOVERY_KINDS:
        raise InvalidInput("a recovery command is retry, cancel, reprocess or compensate")
    kind = CommandKind(kind)
    target = ledger.view(target_command_id)
    with recovery_lock(ledger.db, target.command_id):
        rec = ledger.find(target.workspace, key)
        if rec is None:
            target = ledger.view(target.command_id)
            if check is not None:
                check(ledger, target)
            rec = ledger.recover(target.command_id, kind, key, mutating=True,
                                 context=context)
        elif rec.kind is not kind or rec.target_command_id != target.command_id:
            raise Conflict(f"key {key!r} was used for command {rec.command_id}, a {rec.kind}"
                           f" of {rec.target_command_id}")
        return _advance(ledger, rec, user_id, perform)


def _advance(ledger: CommandLedger, rec: CommandView, user_id: str,
             perform: Callable[[], Any] | None) -> CommandView:
    """Take the recovery through the steps its state still asks for."""
    if rec.state is S.CANONICALIZED:
        rec = ledger.request_confirmation(rec.command_id)
    if rec.state is S.CONFIRMATION_REQUIRED and not rec.declined:
        rec = ledger.confirmation_envelope(user_id, rec.command_id,
                                           envelope_id=f"confirm-{rec.command_id}")
    if perform is not None and rec.state in _STARTABLE:
        rec = ledger.execute(rec.command_id, perform)
    return rec


__all__ = ["recover_as_person", "recovery_lock"]
