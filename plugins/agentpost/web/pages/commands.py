"""Commands and sagas (SMCL): the list, one command with its evidence, recovery options,
recoveries and saga, and the human highway's two recoveries, retry and compensate.

What a person may do is decided by the protocol's own rules (`recovery_options` of the
command's state, SMCL "recovery"), never by the template: the page offers retry and compensate
only where the state offers them, no other recovery of the command stands and no earlier
recovery of that kind is still alive, and the action checks the same again, under the
command's recovery lock, before writing anything (409 otherwise; the ledger refuses a second
standing recovery on its own). Each confirmation acts once (agentpost.store.highway).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from agentpost.pg.queries import load_queries
from agentpost.protocol.commands import (
    CommandKind,
    CommandState,
    CommandView,
    EvidenceType,
    recovery_options,
    stands,
)
from agentpost.protocol.errors import Conflict, InvalidInput
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.highway import recover_as_person
from agentpost.store.sagas import SagaView
from agentpost.web import actions, hitl
from agentpost.web.auth import Actor, require_viewer, user_name
from agentpost.web.context import Store
from agentpost.web.links import task_instance_url
from agentpost.web.render import page

router = APIRouter(dependencies=[Depends(require_viewer)])
Q = load_queries("agentpost.web", "commands.sql")

PAGE_SIZE = 50
MAX_PAGE = 200
EVIDENCE_LIMIT = 500
#: the recoveries a person starts from the page (cancel and reprocess stay with the DAGs)
HIGHWAY: tuple[CommandKind, ...] = (CommandKind.RETRY, CommandKind.COMPENSATE)
#: a recovery in one of these states (or a declined one) no longer stands in the way
_DEAD = frozenset({CommandState.FAILED, CommandState.REJECTED, CommandState.CANCELED,
                   CommandState.COMPENSATED})
_FIRST_PAGE = ("infinity", "")
_MAX_NOTE = 500


# ----------------------------------------------------------------------- input checks


def _state_filter(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    try:
        return CommandState(value).value
    except ValueError:
        names = ", ".join(s.value for s in CommandState)
        raise InvalidInput(f"state must be one of {names}; not {value!r}") from None


def _text_filter(value: str | None, what: str) -> str | None:
    if value in (None, ""):
        return None
    if len(value) > 200 or not value.isprintable():
        raise InvalidInput(f"{what} must be a printable name of at most 200 characters")
    return value


def _command_id(value: str) -> str:
    if not value or len(value) > 200 or not value.isprintable():
        raise InvalidInput("a command id is a printable string of at most 200 characters")
    return value


def _note(value: str | None, *, required: bool) -> str:
    note = (value or "").strip()
    if required and not note:
        raise InvalidInput("say what you did to undo the command (the note is recorded)")
    if len(note) > _MAX_NOTE or not all(c.isprintable() or c in "\r\n\t" for c in note):
        raise InvalidInput(f"the note must be printable text of at most {_MAX_NOTE} characters")
    return note


# ----------------------------------------------------------------------- reads


def list_commands(store: EnvelopeStore, workspace: str | None, state: str | None,
                  after: str | None, limit: int) -> dict[str, Any]:
    """One page, newest first; `next` is the id to pass as `after` for the next page."""
    after_at, after_id = _FIRST_PAGE
    if after:
        row = store.db.fetchone(Q["cursor"], {"id": _command_id(after)})
        if row is None:
            raise InvalidInput(f"after: no command {after!r} to page from")
        after_at, after_id = row
    rows = store.db.fetchall(Q["list"], {"workspace": workspace, "state": state,
                                         "after_at": after_at, "after_id": after_id,
                                         "limit": limit + 1})
    items = [dict(zip(("command_id", "kind", "workspace", "action", "state", "reason",
                       "target_command_id", "created_at", "last_transition_at"), r,
                      strict=True)) for r in rows[:limit]]
    more = len(rows) > limit
    return {"commands": items, "next": items[-1]["command_id"] if more else None}


def _evidence(store: EnvelopeStore, command_id: str) -> list[dict[str, Any]]:
    rows = store.db.fetchall(Q["evidence"], {"chain": f"command:{command_id}",
                                             "limit": EVIDENCE_LIMIT})
    return [{"seq": seq, "event": event, "at": at, "body": json.loads(record)["body"],
             "hash": digest, "mac": mac} for seq, event, at, record, digest, mac in rows]


def _actor_of(body: dict[str, Any], view: CommandView) -> str:
    """Who took a transition, as its artifact says: the gate's decider, the confirming person
    or agent, the originator a person's recovery carries, else the executor or the sweep."""
    for key in ("confirmed_by", "declined_by", "decided_by"):
        if body.get(key):
            return str(body[key])
    originator = (body.get("context") or {}).get("originator")
    if originator:
        return str(originator)
    lifecycle = body.get("lifecycle") or {}
    target = str(lifecycle.get("transition", "")).split("→")[-1]
    if target in ("started", "executed", "failed", "compensated"):
        return f"executor:{view.executor}"
    return f"workspace:{view.workspace}"


def _last_transition(store: EnvelopeStore, view: CommandView) -> dict[str, Any] | None:
    """The newest state_change artifact of the command's chain: when, which, by whom."""
    for seq, at, record in store.db.fetchall(Q["last_transition"],
                                             {"chain": f"command:{view.command_id}"}):
        body = json.loads(record)["body"]
        lifecycle = body.get("lifecycle") or {}
        if lifecycle.get("evidence_type") == EvidenceType.STATE_CHANGE.value:
            return {"seq": seq, "at": at, "transition": lifecycle.get("transition"),
                    "event": body.get("event"), "by": _actor_of(body, view)}
    return None


def _alive(recovery: CommandView) -> bool:
    return recovery.state not in _DEAD and not recovery.declined


def highway_options(view: CommandView, recoveries: list[CommandView]
                    ) -> dict[str, str | None]:
    """For each highway recovery: None when a person may start it now, else why not: the
    state does not offer it, another recovery stands (the ledger refuses it too), or one of
    its kind is alive (an executed retry is not retried again from here)."""
    offered = recovery_options(view.state)
    out: dict[str, str | None] = {}
    for kind in HIGHWAY:
        if kind not in offered:
            offers = ", ".join(k.value for k in offered) or "nothing"
            out[kind.value] = (f"SMCL offers no {kind.value} for a command in state"
                               f" {view.state.value} (offers: {offers})")
            continue
        live = [r for r in recoveries if (r.kind is kind and _alive(r))
                or stands(r.kind, r.state, r.declined, view.state)]
        out[kind.value] = (None if not live else
                           f"{live[-1].kind.value} {live[-1].command_id} is already"
                           f" {live[-1].state.value}")
    return out


def _saga(store: EnvelopeStore, view: CommandView) -> dict[str, Any] | None:
    """The saga a step or compensation command belongs to (its key names it), as the store's
    `SagaView` reads it (a step's compensation settled: `not_needed` once it cannot come)."""
    key = view.idempotency_key
    if not key.startswith("saga:"):
        return None
    saga_id = key[5:].split("/", 1)[0]
    if not store.db.scalar(Q["saga_exists"], {"id": saga_id}):
        return None
    return SagaView.model_validate(store.db.scalar(Q["saga"], {"id": saga_id})
                                   ).model_dump(mode="json")


def command_detail(store: EnvelopeStore, command_id: str) -> dict[str, Any]:
    """Everything the command's page shows, JSON-ready apart from datetimes."""
    with CommandLedger(store) as ledger:
        view = ledger.view(_command_id(command_id))
        recoveries = ledger.recoveries(view.command_id)
    return {"command": {**view.report(), "args": view.args, "outcome": view.outcome},
            "last_transition": _last_transition(store, view),
            "recovery_options": [k.value for k in recovery_options(view.state)],
            "highway": highway_options(view, recoveries),
            "recoveries": [r.report() for r in recoveries],
            "evidence": _evidence(store, view.command_id),
            "saga": _saga(store, view), "waiting": _waiting(store, view)}


def _waiting(store: EnvelopeStore, view: CommandView) -> dict[str, Any] | None:
    """The Airflow task instance an agent's command was submitted from, while the command
    waits for a person: its approval request is settled with the decision taken here."""
    if view.state is not CommandState.CONFIRMATION_REQUIRED or view.declined:
        return None
    task = hitl.waiting_task(store, view.command_id)
    return {**task, "url": task_instance_url(**task)} if task else {}


# ----------------------------------------------------------------------- pages


Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]


@router.get("/commands")
def commands_page(request: Request, store: Store, workspace: str | None = None,
                  state: str | None = None, after: str | None = None,
                  limit: Limit = PAGE_SIZE) -> Response:
    ws, st = _text_filter(workspace, "workspace"), _state_filter(state)
    data = list_commands(store, ws, st, after, limit)
    return page(request, "commands.html", nav="commands", workspace=ws or "",
                state=st or "", states=[s.value for s in CommandState], limit=limit, **data)


@router.get("/api/commands")
def commands_json(store: Store, workspace: str | None = None, state: str | None = None,
                  after: str | None = None, limit: Limit = PAGE_SIZE) -> dict[str, Any]:
    return list_commands(store, _text_filter(workspace, "workspace"), _state_filter(state),
                         after, limit)


Notice = Annotated[str | None, Query(max_length=300)]


@router.get("/commands/{command_id}")
def command_page(request: Request, store: Store, command_id: str,
                 done: Notice = None, airflow: Notice = None) -> Response:
    """`done` and `airflow`: what the action just taken did (the redirect after it says)."""
    detail = command_detail(store, command_id)
    return page(request, "command.html", nav="commands", done=done, airflow=airflow,
                **detail)


@router.get("/api/commands/{command_id}")
def command_json(store: Store, command_id: str) -> dict[str, Any]:
    return command_detail(store, command_id)


# ----------------------------------------------------------------------- the human highway


def _check_highway(ledger: CommandLedger, view: CommandView, kind: CommandKind) -> None:
    """Conflict with the reason unless a person may start `kind` on `view` now."""
    why = highway_options(view, ledger.recoveries(view.command_id))[kind.value]
    if why is not None:
        raise Conflict(f"cannot {kind.value} command {view.command_id}: {why}")


def highway_act(store: EnvelopeStore, command_id: str, kind: CommandKind, person: str,
                note: str, key: str) -> str:
    """Submit the recovery with the person as its originator, confirm it through the human
    highway (a ``command.confirmation`` envelope from ``human:<person>``), and, for a
    compensation the person performed, execute it: the target becomes compensated. All under
    the target's recovery lock, keyed by the confirmation's single-use key: a replay of the
    confirmation lands on the same recovery (finishing it if it was interrupted)."""
    context = {"originator": f"human:{person}", "via": "agentpost page", "note": note}
    perform = None
    if kind is CommandKind.COMPENSATE:
        def perform() -> dict[str, str]:
            return {"performed_by": f"human:{person}", "note": note}
    with CommandLedger(store) as ledger:
        target = ledger.view(_command_id(command_id))
        recover_as_person(
            ledger, target.command_id, kind, f"highway:{kind.value}/{target.command_id}/{key}",
            person, context=context, perform=perform,
            check=lambda led, view: _check_highway(led, view, kind))
    return f"/commands/{target.command_id}"


def _summary(view: CommandView, kind: CommandKind, note: str) -> list[tuple[str, Any]]:
    what = {CommandKind.RETRY: "a retry command (new key, same action, executor and args),"
                               " confirmed by you; the command's DAG task runs it on its"
                               " next try",
            CommandKind.COMPENSATE: "a compensate command recording that you undid the"
                                    " command's effect; executing it moves the command to"
                                    " compensated"}[kind]
    return [("command", view.command_id), ("state", view.state.value),
            ("action", view.action), ("workspace", view.workspace),
            ("what happens", what), ("note", note or "—")]


async def _highway_post(request: Request, store: EnvelopeStore, user: Any,
                        command_id: str, kind: CommandKind) -> Response:
    fields = await actions.form_fields(request)
    note = _note(fields.get("note"), required=kind is CommandKind.COMPENSATE)
    confirming = (await request.form()).get("confirm") == "yes"

    def check() -> CommandView:
        with CommandLedger(store) as ledger:
            view = ledger.view(_command_id(command_id))
            if not confirming:  # the confirmed act checks again, under the lock
                _check_highway(ledger, view, kind)
            return view

    view = await asyncio.to_thread(check)
    person = user_name(user)
    return await actions.confirm_then(
        request, title=f"{kind.value} command {view.command_id}",
        fields={"note": note}, summary=_summary(view, kind, note),
        back=f"/commands/{view.command_id}",
        act=lambda key: highway_act(store, view.command_id, kind, person, note, key))


@router.post("/commands/{command_id}/retry")
async def retry(request: Request, store: Store, user: Actor, command_id: str) -> Response:
    return await _highway_post(request, store, user, command_id, CommandKind.RETRY)


@router.post("/commands/{command_id}/compensate")
async def compensate(request: Request, store: Store, user: Actor,
                     command_id: str) -> Response:
    return await _highway_post(request, store, user, command_id, CommandKind.COMPENSATE)


# ----------------------------------------------------------------------- a person decides


def decide_act(store: EnvelopeStore, command_id: str, user: Any, approve: bool, note: str,
               key: str) -> str:
    """A person's confirmation or refusal of a command waiting for one (SMCL
    ``confirmation_required``), through the human highway as ``human:<person>``, keyed by
    the form's single-use key; the approval request of the agent's task that waits for it
    is answered with the same decision (agentpost.web.hitl), or neither is."""
    person = user_name(user)
    decision_id = f"page:{key}"[:120]
    with CommandLedger(store) as ledger:
        view = ledger.view(_command_id(command_id))
        if _decided_by(store, decision_id, view.command_id):
            return f"/commands/{view.command_id}"  # a replay lands on the first post's act
        _check_waiting(view)
        reason = note or f"declined on the agentpost page by {person}"
        with hitl.answering(hitl.waiting_task(store, view.command_id), user, approve,
                            reason) as said:
            ledger.confirmation_envelope(person, view.command_id,
                                         "confirm" if approve else "decline",
                                         envelope_id=decision_id)
    return f"/commands/{view.command_id}?{urlencode({'airflow': said()})}"


def _check_waiting(view: CommandView) -> None:
    """Conflict unless the command waits for a person's decision (a declined command stays
    confirmation_required)."""
    if view.state is not CommandState.CONFIRMATION_REQUIRED or view.declined:
        state = "declined" if view.declined else view.state.value
        raise Conflict(f"command {view.command_id} is {state}: it waits for no decision")


def _decided_by(store: EnvelopeStore, envelope_id: str, command_id: str) -> bool:
    """Whether the confirmation envelope `envelope_id` (a page decision's key) decided
    `command_id` already."""
    return bool(store.db.scalar(Q["decided_by"], {"id": envelope_id,
                                                 "command_id": command_id}))


async def _decide_post(request: Request, store: EnvelopeStore, user: Any, command_id: str,
                       approve: bool) -> Response:
    fields = await actions.form_fields(request)
    note = _note(fields.get("note"), required=False)
    confirming = (await request.form()).get("confirm") == "yes"

    def check() -> CommandView:
        with CommandLedger(store) as ledger:
            view = ledger.view(_command_id(command_id))
        if not confirming:  # the confirmed act checks again (a replay lands on its act)
            _check_waiting(view)
        return view

    view = await asyncio.to_thread(check)
    verb = "confirm" if approve else "decline"
    what = ("the command may go on (SMCL: confirmed), recorded as your confirmation"
            if approve else "the command will not run (SMCL: declined), recorded as yours")
    return await actions.confirm_then(
        request, title=f"{verb} command {view.command_id}", fields={"note": note},
        summary=[("command", view.command_id), ("action", view.action),
                 ("workspace → executor", f"{view.workspace} → {view.executor}"),
                 ("args", json.dumps(view.args)), ("what happens", what),
                 ("note", note or "—")],
        back=f"/commands/{view.command_id}",
        act=lambda key: decide_act(store, view.command_id, user, approve, note, key))


@router.post("/commands/{command_id}/confirm")
async def confirm(request: Request, store: Store, user: Actor, command_id: str) -> Response:
    return await _decide_post(request, store, user, command_id, approve=True)


@router.post("/commands/{command_id}/decline")
async def decline(request: Request, store: Store, user: Actor, command_id: str) -> Response:
    return await _decide_post(request, store, user, command_id, approve=False)


__all__ = ["command_detail", "decide_act", "highway_act", "highway_options", "list_commands",
           "router"]
