"""Seats of the MCP server: the mark-space agent of a seat, scopes given on a command line,
and `TokenSeat`, a seat whose rights are also bounded by a gateway capability token."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from agentpost.gateway.tokens import TokenInfo
from agentpost.marks import Agent, MarkType, Scope
from agentpost.protocol.errors import InvalidInput
from agentpost.protocol.leases import stream_of
from agentpost.tools import AgentTools, ToolRefused
from agentpost.tools.models import SubmitCommandArgs

KINDS = (MarkType.INTENT, MarkType.ACTION, MarkType.OBSERVATION, MarkType.WARNING,
         MarkType.NEED)
_GLOB = set("*?[]!")


def mark_agent(name: str, scopes: list[Scope]) -> Agent:
    """The mark-space agent called `name`: its id derived from the name (the same in every
    run, as `AgentpostToolset` derives it), writing every mark type in every scope given."""
    return Agent(id=uuid.uuid5(uuid.NAMESPACE_URL, f"agentpost-agent:{name}"), name=name,
                 scopes={scope.name: KINDS for scope in scopes})


def parse_scope(text: str) -> Scope:
    """A scope from ``NAME[:INTENT_VERBS[:ACTION_VERBS]]``, verbs comma-separated
    (``deploys:deploy:deployed``)."""
    name, _, rest = text.partition(":")
    intents, _, actions = rest.partition(":")

    def verbs(part: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in part.split(",") if v.strip())

    try:
        return Scope(name=name.strip(), allowed_intent_verbs=verbs(intents),
                     allowed_action_verbs=verbs(actions))
    except ValueError as exc:
        raise InvalidInput(f"bad --scope {text!r}: use NAME[:INTENT_VERBS[:ACTION_VERBS]] "
                           f"({str(exc).splitlines()[0]})") from None


def token_workspace(token: TokenInfo) -> str | None:
    """The one workspace a token acts as: the pattern of its ``senders:<workspace>:send``
    scopes, when they name exactly one workspace literally (no wildcard); else None."""
    names = {scope[len("senders:"):-len(":send")] for scope in token.scopes
             if scope.startswith("senders:") and scope.endswith(":send")}
    if len(names) != 1:
        return None
    (name,) = names
    # a wildcard, or a person (human:<user>), is no one workspace; no workspace id has a ':'
    return None if _GLOB & set(name) or ":" in name else name


class TokenSeat(AgentTools):
    """A seat whose workspace a gateway token fixes (`token_workspace`), and whose rights
    are the seat's as the store has them *and* the token's as the gateway reads them:

    - a recipient (of send_envelope, reply, or a command's executor other than this
      workspace) needs ``streams:agents/<recipient>/inbox:enqueue``;
    - read_inbox and ack need ``streams:agents/<workspace>/inbox:subscribe``.

    A tool the token does not allow is not listed, and refused when called anyway."""

    READS = frozenset({"read_inbox", "ack"})

    def __init__(self, store: Any, *, token: TokenInfo, **kwargs: Any) -> None:
        workspace = token_workspace(token)
        if workspace is None:
            raise ValueError("the token names no single workspace (senders:<workspace>:send)")
        super().__init__(store, workspace_id=workspace, **kwargs)
        self.token = token

    def _may_read(self) -> bool:
        return self.token.allows("streams", stream_of(self.workspace_id), "subscribe")

    def _may_send(self, to: str) -> bool:
        return self.token.allows("streams", stream_of(to), "enqueue")

    def routes(self) -> dict[str, list[str]]:
        return {to: types for to, types in super().routes().items() if self._may_send(to)}

    def _seat_allows(self, to: str) -> bool:
        return self._may_send(to)

    def specs(self) -> list[Any]:
        return [spec for spec in super().specs()
                if spec.name not in self.READS or self._may_read()]

    def call(self, name: str, args: Mapping[str, Any] | None = None, *,
             call_id: str | None = None) -> dict[str, Any]:
        if name in self.READS and not self._may_read():
            raise ToolRefused(f"permission denied: token {self.token.name!r} may not read "
                              f"the inbox of {self.workspace_id!r} (it needs the scope "
                              f"streams:{stream_of(self.workspace_id)}:subscribe)")
        return super().call(name, args, call_id=call_id)

    def submit_command(self, args: SubmitCommandArgs, *, call_id: str | None = None) -> Any:
        executor = args.executor or self.workspace_id
        if executor != self.workspace_id and not self._may_send(executor):
            raise ToolRefused(f"permission denied: token {self.token.name!r} may not send to "
                              f"{executor!r} (it needs the scope "
                              f"streams:{stream_of(executor)}:enqueue)")
        return super().submit_command(args, call_id=call_id)
