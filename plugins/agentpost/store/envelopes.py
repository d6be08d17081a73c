"""The envelope store: WACP envelopes on Postgres.

Each public method is one protocol step carried out by one server-side function or procedure
(see sql/), so a send is one round trip however much it validates and records. This class
checks what it can without the database (draft structure), turns rows into models, and turns
database errors into typed errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from agentpost.config import Settings
from agentpost.pg.db import Database
from agentpost.pg.migrations import migrate
from agentpost.protocol.anchor import AnchorLike, Checkpoint
from agentpost.protocol.anchor import load as load_anchor
from agentpost.protocol.chains import reserved_chain, reserved_message
from agentpost.protocol.errors import InvalidAnchor, InvalidInput, NotFound
from agentpost.protocol.leases import courier_draft
from agentpost.protocol.models import (
    Envelope,
    Payload,
    PortRight,
    RejectionReason,
    SendResult,
    Signal,
    Status,
    TrailEvent,
    TrailVerification,
    Workspace,
    WorkspaceState,
)
from agentpost.protocol.registry import EnvelopeType, Permission, Role
from agentpost.protocol.validation import (
    DraftRow,
    draft_fields,
    normalize_draft,
    required_fields_problem,
    sanitize,
)
from agentpost.store.anchor import take_checkpoint
from agentpost.store.checks import count as _count
from agentpost.store.checks import name as _name
from agentpost.store.checks import ref as _ref
from agentpost.store.checks import strings as _strings
from agentpost.store.checks import text as _text
from agentpost.store.leases import LeaseOps
from agentpost.store.queries import QUERIES
from agentpost.store.rules import RuleOps
from agentpost.store.verify import MAX_NAMED_ROWS, MAX_WORKERS
from agentpost.store.verify import run as run_verification
from agentpost.store.views import ViewOps

#: the columns of queries.sql's envelope select list, in its order
ROW = ("id", "sender", "recipient", "originator", "type", "format", "content", "attachments",
       "in_reply_to", "rights", "priority", "created_at", "origin", "status", "seq", "reason",
       "delivered_at", "consumed_at", "attempts", "tags", "headers", "meta", "redeliveries")


def envelope_from_row(row: Sequence[Any]) -> Envelope:
    """An Envelope from the columns of queries.sql's envelope select list (`ROW`, in that
    order)."""
    (eid, sender, recipient, originator, etype, fmt, content, attachments, reply, rights,
     priority, created_at, origin, status, seq, reason, delivered_at, consumed_at,
     attempts, tags, headers, meta, redeliveries) = row
    return Envelope.model_validate({
        "id": eid, "from": sender, "to": recipient, "originator": originator, "type": etype,
        "payload": Payload(format=fmt, content=content, attachments=tuple(attachments)),
        "in_reply_to": reply, "rights": rights, "priority": priority,
        "timestamp": created_at, "origin": origin, "status": status, "seq": seq,
        "reason": reason, "delivered_at": delivered_at, "consumed_at": consumed_at,
        "attempts": attempts, "tags": tuple(tags), "headers": headers, "meta": meta,
        "redeliveries": redeliveries,
    })


def _workspace(row: Sequence[Any]) -> Workspace:
    wid, role, lineage, parent, originator, delegation, state, created_at, updated_at = row
    return Workspace(id=wid, role=role, lineage=tuple(lineage), parent=parent,
                     originator=originator, delegation=delegation, state=state,
                     created_at=created_at, updated_at=updated_at)


class SendOptions(NamedTuple):
    """What `EnvelopeStore.send_options` answers: the envelope types the sender may send the
    recipient now (sorted; empty: none), and the required fields of the type asked about
    (None: no such type)."""

    types: tuple[str, ...]
    required_fields: tuple[str, ...] | None


#: tables whose rows are updated or deleted on hot paths (queue indexes, counters, outbox)
_BUSY_TABLES = ("envelopes", "inbox_counters", "rule_outbox", "signals", "trail", "commands",
                "routes")


class EnvelopeStore(LeaseOps, ViewOps, RuleOps):
    """WACP envelopes, workspaces, port rights and the signed trail, on Postgres; leases,
    rules and views of the inboxes (Courier) in the mixins."""

    def _envelope_row(self, row: Sequence[Any]) -> Envelope:
        return envelope_from_row(row)

    def __init__(self, dsn: str | None = None, *, settings: Settings | None = None,
                 trail_key: str | None = None, ack_timeout: float | None = None,
                 max_content_bytes: int | None = None, durable_acks: bool | None = None,
                 pool_size: int = 4) -> None:
        self.settings = settings or Settings.from_env(
            dsn=dsn, trail_key=trail_key, ack_timeout=ack_timeout,
            max_content_bytes=max_content_bytes, durable_acks=durable_acks)
        self.dsn = self.settings.require_dsn()
        self._key = self.settings.trail_key.encode("utf-8")
        self.db = Database(self.dsn, self._key, pool_size=pool_size)

    @classmethod
    def from_env(cls, **overrides: Any) -> EnvelopeStore:
        """A store configured from AGENTPOST_* variables (see agentpost.config)."""
        return cls(**overrides)

    def close(self) -> None:
        self.db.dispose()

    def __enter__(self) -> EnvelopeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (none the second time)."""
        return migrate(self.dsn)

    @property
    def _timeout_ms(self) -> int:
        return max(1, round(self.settings.ack_timeout * 1000))

    # -- registry -----------------------------------------------------------------------

    def define_role(self, name: str, inherits: str | None = None) -> dict[str, Any]:
        """Define a role; a derived role holds every permission row of the role it inherits."""
        parent = None if inherits is None else _name(inherits, "inherits")
        return self.db.scalar("SELECT agentpost.define_role(%s, %s)",
                              (_name(name, "role name"), parent))

    def register_type(self, name: str, senders: Iterable[str], receivers: Iterable[str],
                      required_fields: Iterable[str] = ()) -> dict[str, Any]:
        """Register an envelope type with its permission rows (every sender role to every
        receiver role) and the top-level fields its JSON payload must carry."""
        senders = [_name(s, "sender role") for s in _strings(senders, "senders")]
        receivers = [_name(r, "receiver role") for r in _strings(receivers, "receivers")]
        fields = [_name(f, "required field") for f in _strings(required_fields,
                                                               "required_fields")]
        if not senders or not receivers:
            raise InvalidInput("a type needs at least one sender role and one receiver role")
        return self.db.scalar("SELECT agentpost.register_type(%s, %s, %s, %s)",
                              (_name(name, "type name"), senders, receivers, fields))

    def create_workspace(self, role: str, parent: str | None = None,
                         originator: str = "system", delegation: bool = False, *,
                         workspace_id: str | None = None,
                         caused_by: str | None = None) -> Workspace:
        """Create a workspace. Its originator is inherited from `caused_by` (an envelope) or
        from the parent, and never changes; send rights along the parent edge follow the
        permission matrix."""
        if not isinstance(delegation, bool):
            raise InvalidInput("delegation must be true or false")
        wid = None if workspace_id is None else _name(workspace_id, "workspace id")
        if wid is not None and reserved_chain(wid):
            raise InvalidInput(reserved_message(wid))
        row = self.db.scalar(
            "SELECT agentpost.create_workspace(%s, %s, %s, %s, %s, %s)",
            (wid,
             _name(role, "role"), None if parent is None else _ref(parent, "parent"),
             _name(originator, "originator"), delegation,
             None if caused_by is None else _ref(caused_by, "caused_by")))
        return Workspace.model_validate(row)

    def transition(self, workspace_id: str, state: str | WorkspaceState) -> dict[str, Any]:
        """Move a workspace to `state`. Resuming delivers what queued, in order; sealing
        (integrating, closed, failed) makes what queued undeliverable."""
        try:
            target = WorkspaceState(state)
        except ValueError:
            raise InvalidInput(f"unknown workspace state {sanitize(state, 40)!r}") from None
        row = self.db.fetchone(QUERIES["transition"],
                               {"ws": _ref(workspace_id, "workspace id"),
                                "state": target.value})
        return row[0]

    def workspace(self, workspace_id: str) -> Workspace:
        row = self.db.fetchone(QUERIES["workspace"], {"id": _ref(workspace_id, "workspace id")})
        if row is None:
            raise NotFound(f"unknown workspace {workspace_id!r}")
        return _workspace(row)

    def workspaces(self) -> list[Workspace]:
        return [_workspace(r) for r in self.db.fetchall(QUERIES["workspaces"])]

    def roles(self) -> list[Role]:
        """Every role, built-in or defined, by name."""
        return [Role(name=n, inherits=i, lineage=tuple(lineage), builtin=b)
                for n, i, lineage, b in self.db.fetchall(QUERIES["roles"])]

    def envelope_types(self) -> list[EnvelopeType]:
        """Every registered envelope type with its rows of the permission matrix, by name."""
        return [EnvelopeType(name=n, required_fields=tuple(fields), builtin=b,
                             permissions=tuple(Permission(**row) for row in rows))
                for n, fields, b, rows in self.db.fetchall(QUERIES["envelope_types"])]

    # -- sending ------------------------------------------------------------------------

    def send(self, sender: str, to: str, type: str, content: Any, *,
             format: str = "markdown", attachments: Iterable[str] = (),
             in_reply_to: str | None = None, priority: str = "normal",
             rights: Iterable[Any] = (), envelope_id: str | None = None,
             tags: Iterable[str] = (), headers: Mapping[str, Any] | None = None,
             meta: Mapping[str, Any] | None = None) -> SendResult:
        """Validate, record and deliver one envelope. Never raises for a bad envelope: it
        comes back rejected with its §9 reason. Raises for an unknown or sealed sender.

        `envelope_id` is an idempotency key: a send with an id already used by the same
        sender to the same receiver sends nothing and returns the original outcome
        (``duplicate=True``); used for another channel it is a Conflict."""
        fields = {"from": sender, "to": to, "type": type, "content": content,
                  "format": format, "attachments": attachments, "in_reply_to": in_reply_to,
                  "priority": priority, "rights": rights, "envelope_id": envelope_id,
                  "tags": tags, "headers": headers, "meta": meta}
        draft = self._draft(fields, 0)
        row = draft.row
        if draft.problem is None and not (row["rights"] or row["envelope_id"] or row["tags"]
                                          or row["headers"] or row["meta"]):
            return self._send_one(draft)
        return self._send([draft], "agent", None)[0]

    def send_checked(self, sender: str, to: str, type: str, content: Any, *,
                     format: str = "markdown", in_reply_to: str | None = None,
                     priority: str = "normal",
                     meta: Mapping[str, Any] | None = None) -> SendResult | None:
        """Send only the common case, in one round trip: a well-formed draft on a live send
        right that the matrix (or a delegation edge) allows, to a receiver that takes
        envelopes, with no rules enabled. Anything else returns None having written nothing,
        for a caller that must not send what would be rejected (a rejection is recorded):
        it decides the rest with `send_options` and `send`. None is not a refusal."""
        draft = self._draft({"from": sender, "to": to, "type": type, "content": content,
                             "format": format, "in_reply_to": in_reply_to,
                             "priority": priority, "meta": meta}, 0)
        if draft.problem is not None:
            return None
        params = self._one_params(draft)
        params["meta"] = json.dumps(draft.row["meta"] or {}, ensure_ascii=False)
        res = self.db.scalar(QUERIES["send_checked"], params)
        return None if res is None else self._result(draft, res)

    def _send_one(self, draft: DraftRow) -> SendResult:
        """The common case: one well-formed draft carrying no rights, with scalar
        parameters (the server takes its four-statement path when it can)."""
        res = self.db.scalar(QUERIES["send_one"], self._one_params(draft))
        return self._result(draft, res)

    def _one_params(self, draft: DraftRow) -> dict[str, Any]:
        """The scalar parameters of the one-envelope sends (`send_one`, `send_checked`)."""
        row = draft.row
        return {"sender": row["sender"], "recipient": row["recipient"], "type": row["type"],
                "format": row["format"], "content": row["content"],
                "attachments": json.dumps(row["attachments"], ensure_ascii=False),
                "in_reply_to": row["in_reply_to"], "priority": row["priority"],
                "keys": row["keys"], "timeout_ms": self._timeout_ms}

    def send_many(self, drafts: Iterable[Mapping[str, Any] | Any]) -> list[SendResult]:
        """Send many envelopes in one call: one durable commit for the lot, then delivery.
        Each draft is a mapping with `from`, `to`, `type`, `content` and the optional fields
        of `send`, or a `Draft`. Results come back in draft order."""
        if isinstance(drafts, str | bytes | Mapping) or not isinstance(drafts, Iterable):
            raise InvalidInput("send_many takes a list of drafts")
        rows = [self._draft(draft_fields(d), i) for i, d in enumerate(drafts)]
        return self._send(rows, "agent", None) if rows else []

    def enqueue(self, to: str, envelope: Mapping[str, Any]) -> SendResult:
        """Courier's enqueue (§7): append a Courier-shaped envelope (§4.1: `id`, `ts`,
        `from`, `type`, `payload`, optional `tags`, `headers`, `schema`, `version`, `corr`,
        `refs`) to the stream `to` (``agents/<workspace>/inbox``). The id is the
        idempotency key. `from` is the sending workspace, or ``human:<user>`` for the human
        highway; the usual WACP checks apply."""
        fields, human = courier_draft(to, envelope)
        if human is not None:
            return self._send([self._draft(fields, 0)], "human", _name(human, "user id"))[0]
        return self._send([self._draft(fields, 0)], "agent", None)[0]

    def inject(self, user_id: str, to: str, type: str, content: Any, *,
               format: str = "markdown", attachments: Iterable[str] = (),
               in_reply_to: str | None = None, priority: str = "normal",
               **extras: Any) -> SendResult:
        """The human highway: a person sends into any non-sealed workspace. The envelope has
        origin `human` and originator = `user_id`; it needs no send right and no matrix row,
        but is validated for structure and type like any other."""
        user = _name(user_id, "user id")
        fields = {"from": f"human:{user}", "to": to, "type": type, "content": content,
                  "format": format, "attachments": attachments, "in_reply_to": in_reply_to,
                  "priority": priority, **extras}
        return self._send([self._draft(fields, 0)], "human", user)[0]

    def _draft(self, fields: Mapping[str, Any], index: int) -> DraftRow:
        return normalize_draft(fields, index=index,
                               max_content_bytes=self.settings.max_content_bytes)

    def _send(self, rows: list[DraftRow], origin: str, user: str | None) -> list[SendResult]:
        # a caller-chosen id used twice in one batch: the later drafts are duplicates of the
        # first, answered from its result
        first: dict[str, int] = {}
        unique = []
        for row in rows:
            eid = row.row["envelope_id"]
            if eid is None or eid not in first:
                if eid is not None:
                    first[eid] = len(unique)
                unique.append(row)
        payload = json.dumps([r.row for r in unique], ensure_ascii=False)
        results = self.db.scalar(QUERIES["send"], {
            "drafts": payload, "origin": origin, "user": user, "timeout_ms": self._timeout_ms})
        by_draft = dict(zip((id(r) for r in unique), results, strict=True))
        out = []
        for row in rows:
            res = by_draft.get(id(row))
            dup = res is None
            if dup:
                res = results[first[row.row["envelope_id"]]]
            out.append(self._result(row, res, duplicate=dup))
        return out

    def _result(self, draft: DraftRow, res: Mapping[str, Any], *,
                duplicate: bool = False) -> SendResult:
        """The SendResult of `draft`; a rejection's detail says what was wrong, also when
        the database found it (a required field missing: the type's fields are named)."""
        detail = draft.problem
        if detail is None and res["reason"] == RejectionReason.INVALID_STRUCTURE.value:
            required = self.db.scalar("SELECT required_fields FROM agentpost.envelope_types"
                                      " WHERE name = %s", (draft.row["type"],))
            detail = required_fields_problem(draft.row["type"], required or (),
                                             draft.row["keys"])
        return SendResult(envelope_id=res["envelope_id"], status=res["status"],
                          reason=res["reason"], detail=detail,
                          duplicate=duplicate or bool(res.get("duplicate")))

    # -- receiving ----------------------------------------------------------------------

    def inbox(self, workspace_id: str, limit: int | None = None) -> list[Envelope]:
        """Delivered, unconsumed envelopes in processing order. A waiting blocking envelope
        holds back the rest: then only blocking envelopes are listed."""
        _count(limit, "limit", optional=True)
        ws = self.workspace(workspace_id).id
        return [envelope_from_row(r) for r in self.db.fetchall(QUERIES["inbox"],
                                                       {"ws": ws, "limit": limit})]

    def queued(self, workspace_id: str) -> list[Envelope]:
        """Validated envelopes waiting for delivery to this workspace, in creation order."""
        ws = _ref(workspace_id, "workspace id")
        return [envelope_from_row(r) for r in self.db.fetchall(QUERIES["queued"], {"ws": ws})]

    def consume(self, workspace_id: str, envelope_id: str) -> Envelope:
        """Mark an inbox envelope as acted on. Consuming a blocking envelope reopens
        delivery of what queued behind it."""
        self.db.scalar("SELECT agentpost.consume(%s, %s)",
                       (_ref(workspace_id, "workspace id"), _ref(envelope_id, "envelope id")))
        return self.get(envelope_id)

    def get(self, envelope_id: str) -> Envelope:
        row = self.db.fetchone(QUERIES["get_envelope"], {"id": _ref(envelope_id, "envelope id")})
        if row is None:
            raise NotFound(f"unknown envelope {envelope_id!r}")
        return envelope_from_row(row)

    def signals(self, workspace_id: str, after: int = 0) -> list[Signal]:
        """Signals the runtime emitted to a workspace (acknowledged, failed, rejected)."""
        _count(after, "after")
        rows = self.db.fetchall(QUERIES["signals"],
                                {"ws": _ref(workspace_id, "workspace id"), "after": after})
        return [Signal(id=r[0], workspace_id=r[1], signal=r[2], ref=r[3], reason=r[4],
                       emitted_by=r[5], at=r[6]) for r in rows]

    # -- port rights --------------------------------------------------------------------

    def rights(self, workspace_id: str, *, include_ended: bool = False) -> list[PortRight]:
        rows = self.db.fetchall(QUERIES["rights"], {"ws": _ref(workspace_id, "workspace id"),
                                                    "all": include_ended})
        return [PortRight(id=r[0], holder=r[1], target=r[2], kind=r[3], state=r[4],
                          created_by=r[5], via_envelope=r[6]) for r in rows]

    def send_options(self, sender: str, to: str, type: str | None = None) -> SendOptions:
        """The types `sender` may send `to` now, decided as `send` decides them (a live
        send or send_once right to a recipient that takes envelopes, and a permission-matrix
        row or a delegation edge), and the required fields of `type`: one read-only round
        trip, for a caller that must not send what the store would reject (a rejection is
        recorded). NotFound for an unknown sender."""
        row = self.db.fetchone(QUERIES["send_options"], {
            "ws": _ref(sender, "workspace id"), "to": _ref(to, "recipient"),
            "type": None if type is None else _ref(type, "type")})
        known, types, required = row
        if not known:
            raise NotFound(f"unknown workspace {sender!r}")
        return SendOptions(types=tuple(sorted(set(types))),
                           required_fields=None if required is None else tuple(required))

    def grant_right(self, granted_by: str, holder: str, target: str,
                    kind: str = "send") -> str:
        """Mint a send or send_once right to `target`; only the target itself or a
        coordinator may."""
        if kind not in ("send", "send_once"):
            raise InvalidInput("kind is send or send_once")
        return self.db.scalar("SELECT agentpost.grant_right(%s, %s, %s, %s)",
                              (_ref(granted_by, "granted_by"), _ref(holder, "holder"),
                               _ref(target, "target"), kind))

    def revoke_right(self, right_id: str, revoked_by: str, reason: str = "") -> dict[str, Any]:
        """A coordinator revokes a live right."""
        why = _text(reason, "reason")
        return self.db.scalar("SELECT agentpost.revoke_right(%s, %s, %s)",
                              (_ref(right_id, "right id"), _ref(revoked_by, "revoked_by"), why))

    # -- maintenance --------------------------------------------------------------------

    def deliver(self, envelope_id: str) -> str:
        """A transport-level delivery attempt of one envelope. A duplicate of a delivered
        envelope is suppressed and recorded as `envelope_redelivered` ("duplicate")."""
        return self.db.scalar("SELECT agentpost.deliver_again(%s)",
                              (_ref(envelope_id, "envelope id"),))

    def redeliver(self) -> dict[str, Any]:
        """Retry due deliveries (acknowledgment timeout, §7.1): attempt k waits k × the base
        timeout; the fourth failed attempt makes the envelope undeliverable."""
        return self.db.scalar(QUERIES["redeliver"], {"timeout_ms": self._timeout_ms})

    def recover(self) -> dict[str, Any]:
        """Complete every validated-but-undelivered envelope after a crash (§7.2)."""
        result = self.db.scalar(QUERIES["recover"])
        result["rules_sent"] = self.fire_rules()["sent"]
        return result

    def maintain(self, *, vacuum: bool = True) -> dict[str, Any]:
        """The periodic housekeeping in one call: return expired leases, retry due
        deliveries, send what rules queued, then VACUUM ANALYZE the store's busy tables.
        The last step stands in for autovacuum where it is off (the store's queue indexes
        and cached plans degrade without it); with autovacuum on it is cheap."""
        return {"leases": self.expire_leases(), "deliveries": self.redeliver(),
                "rules": self.fire_rules(), "vacuumed": self.vacuum() if vacuum else []}

    def vacuum(self) -> list[str]:
        """VACUUM ANALYZE the store's busy tables; returns their names."""
        with self.db.cursor() as cur:
            for table in _BUSY_TABLES:
                cur.execute(f"VACUUM (ANALYZE) agentpost.{table}")
        return list(_BUSY_TABLES)

    def trail(self, *, workspace_id: str | None = None, envelope_id: str | None = None,
              event: str | None = None, after: int = 0, limit: int = 10_000) -> list[TrailEvent]:
        """Trail entries in the order they were written, filtered. A workspace's are those
        of its chain and of its consumer lanes (`lane:<k>:<workspace>`, where its inbox's
        leases and acks go while another consumer holds its chain)."""
        _count(after, "after")
        _count(limit, "limit")
        params = {"chain": None if workspace_id is None else _ref(workspace_id, "workspace"),
                  "envelope_id": None if envelope_id is None else _ref(envelope_id, "envelope"),
                  "event": None if event is None else _ref(event, "event"),
                  "after": after, "limit": limit}
        return [TrailEvent(id=r[0], chain=r[1], seq=r[2], event=r[3], envelope_id=r[4],
                           at=r[5], body=json.loads(r[6])["body"])
                for r in self.db.fetchall(QUERIES["trail"], params)]

    def checkpoint(self) -> Checkpoint:
        """A signed manifest of every chain's head, taken in one snapshot, to keep outside
        the database (`.to_json()` for a file, `.to_dict()` for an XCom) and to give back to
        `verify_trail(anchor=...)`: cutting the end off a chain leaves no trace inside the
        database, but the chain no longer reaches its anchored head (WACP §3 Integrity)."""
        return take_checkpoint(self.db, self._key)

    def verify_trail(self, anchor: AnchorLike | os.PathLike[str] | None = None, *,
                     since: AnchorLike | os.PathLike[str] | None = None,
                     workers: int = 1) -> TrailVerification:
        """Check the trail with the configured key (WACP §3 Integrity): every entry's hash,
        signature, columns and link to the one before, gap-free sequence numbers, that every
        row the entries name exists (`missing_rows`: envelopes, commands, sagas and their
        steps, rules, workspaces, routes, port rights, roles, types), and every row signed
        under the trail (envelopes, commands, routes) against its entries.

        `anchor` (a `checkpoint()` as itself, its JSON text or dict, or a path to its file):
        also report every chain it names that is gone, shorter than it, or diverges.

        `since` (the same forms, best the `checkpoint` of a previous run's result): check only
        what came after it. Each chain it names starts at its anchored head: that entry is
        re-read (hash, signature, columns) and must be the anchored one, and the next entry
        must link to it; a chain that is gone, shorter or diverges fails as with `anchor`;
        chains created since are checked whole. Every row the trail names must exist,
        whenever it was named (`since_rows` "all": the checkpoint's row digests, brought up
        to date by the new entries, are compared with the tables; where one differs, every
        row of its kind that the trail names is looked for); a checkpoint without row
        digests (version 1) checks the rows the new entries name only (`since_rows` "named
        since"). The envelopes, commands and routes the new entries name are compared with
        them. What `since` does NOT check: entries strictly before a head (an edit there
        that leaves the head entry intact is caught only by a full run, or was by the run
        that verified the checkpoint: hence chain each run on the checkpoint the previous run
        verified, never on one taken apart), rows that no new entry names edited in the
        table, and an envelope whose every new entry was cut off with the end of its chain.
        `workers` > 1 shares the chains out among that many processes reading one exported
        snapshot. On a pruned trail (`agentpost trail prune`) a run without `since` runs since
        the last prune's checkpoint: the entries before it are in the archive.

        A malformed `anchor` or `since`, or one not signed with the trail key, raises
        InvalidAnchor before anything is read. A run that passes returns, as `checkpoint`,
        the signed heads it verified, to keep outside the database as the next `since`."""
        anchored = None if anchor is None else load_anchor(_checkpoint_text(anchor), self._key)
        if since is None:  # a pruned trail verifies from its last cut on
            since = self.db.scalar("SELECT checkpoint FROM agentpost.trail_prunes"
                                   " ORDER BY id DESC LIMIT 1")
        start = None if since is None else load_anchor(_checkpoint_text(since), self._key)
        if isinstance(workers, bool) or not isinstance(workers, int) \
                or not 1 <= workers <= MAX_WORKERS:
            raise InvalidInput(f"workers must be a whole number from 1 to {MAX_WORKERS}")
        out = run_verification(self.db, self._key, since=start, anchor=anchored,
                               workers=workers)
        check = out.check
        first = check.first_failure()
        verified = out.verified_checkpoint()
        fields = dict(out.anchored)
        if out.since_mismatches:
            fields["anchor_mismatches"] = (*fields.get("anchor_mismatches", ()),
                                           *out.since_mismatches)
        return TrailVerification(
            ok=first is None, entries=check.entries, chains=check.chains,
            failures=len(check.failures),
            failure_id=None if first is None or first[0] < 0 else first[0],
            failure_chain=None if first is None else first[1],
            failure_seq=None if first is None else first[2],
            failure=None if first is None else first[3],
            since_taken_at=None if start is None else start.taken,
            checkpoint=None if verified is None else verified.to_dict(),
            missing_rows=tuple(out.missing[:MAX_NAMED_ROWS]),
            since_rows=None if out.rows is None else out.rows.mode,
            rows_unaccounted=tuple(out.unaccounted), **fields)


def _checkpoint_text(value: Any) -> Any:
    """A checkpoint argument as `load_anchor` takes it: a path is read (one-line error)."""
    if not isinstance(value, os.PathLike):
        return value
    try:
        return Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidAnchor(f"cannot read the checkpoint {os.fspath(value)}: "
                            f"{getattr(exc, 'strerror', None) or exc}") from None


__all__ = ["EnvelopeStore", "RejectionReason", "SendOptions", "Status"]
