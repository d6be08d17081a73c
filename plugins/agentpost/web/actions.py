"""The human highway's two steps: a form posts its fields; the page shows what will happen
and who will be recorded as doing it; only a second post with ``confirm=yes`` acts. Both
posts pass `require_actor` (role and CSRF); the action itself runs in a thread, as store calls
block.

A confirmation acts once. The confirm page carries a single-use key (`KEY_FIELD`), chosen
when the page is rendered and signed for this user and this action; the action passes it to
the store as its idempotency key (the injected envelope's id, the requeue's key, the recovery
command's key), so the same confirmation posted again (a double click, a browser's retry, a
replay) lands on what the first post did, or is refused (409), and nothing is done twice. A
confirming post without a valid key is a 400 and acts not at all.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from agentpost.protocol.errors import InvalidInput
from agentpost.web.auth import CSRF_FIELD, user_mac
from agentpost.web.render import page, root

KEY_FIELD = "confirm_key"
_KEY = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{24})$")


async def form_fields(request: Request) -> dict[str, str]:
    """The posted form as plain strings, without the CSRF token and the confirmation."""
    form = await request.form()
    return {k: v for k, v in form.items()
            if isinstance(v, str) and k not in (CSRF_FIELD, "confirm", KEY_FIELD)}


def _same_target(request: Request) -> str:
    """The posted URL again, query string included (some actions name their space there)."""
    query = request.url.query
    return request.url.path + ("?" + query if query else "")


def key_for(user: Any, path: str, nonce: str | None = None) -> str:
    """A single-use key for confirming the action at `path` as `user`: a random nonce and
    its signature for the two (a fresh nonce unless one is given, to check a key)."""
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return f"{nonce}-{user_mac(user, f'confirm:{path}:{nonce}')[:24]}"


def checked_key(request: Request, value: Any) -> str:
    """The posted key, if this page gave it to this user for this action; else 400."""
    found = _KEY.match(value) if isinstance(value, str) else None
    if found is None or not hmac.compare_digest(
            value, key_for(request.state.agentpost_user, request.url.path, found[1])):
        raise InvalidInput("this confirmation has no valid single-use key: open the form"
                           " again and confirm from its page")
    return value


async def confirm_then(request: Request, *, title: str, fields: Mapping[str, str],
                       summary: list[tuple[str, Any]], back: str,
                       act: Callable[[str], str]) -> Response:
    """Render the confirmation page with a new single-use key, or (when the post says
    ``confirm=yes``) run `act(key)` in a thread and redirect (303) to the path it returns,
    relative to the app, with ``done=``."""
    form = await request.form()
    if form.get("confirm") != "yes":
        return page(request, "confirm.html", action_title=title, summary=summary,
                    fields=list(fields.items()), action_url=_same_target(request),
                    back_url=root(request) + back, key_field=KEY_FIELD,
                    confirm_key=key_for(request.state.agentpost_user, request.url.path))
    key = checked_key(request, form.get(KEY_FIELD))
    target = await asyncio.to_thread(act, key)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(root(request) + target + sep + urlencode({"done": title}),
                            status_code=303)
