"""The human highway's two steps: a form posts its fields; the page shows what will happen
and who will be recorded as doing it; only a second post with ``confirm=yes`` acts. Both
posts pass `require_actor` (role and CSRF); the action itself runs in a thread, as store calls
block."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from agentpost.web.auth import CSRF_FIELD
from agentpost.web.render import page, root


async def form_fields(request: Request) -> dict[str, str]:
    """The posted form as plain strings, without the CSRF token and the confirmation."""
    form = await request.form()
    return {k: v for k, v in form.items()
            if isinstance(v, str) and k not in (CSRF_FIELD, "confirm")}


def _same_target(request: Request) -> str:
    """The posted URL again, query string included (some actions name their space there)."""
    query = request.url.query
    return request.url.path + ("?" + query if query else "")


async def confirm_then(request: Request, *, title: str, fields: Mapping[str, str],
                       summary: list[tuple[str, Any]], back: str,
                       act: Callable[[], str]) -> Response:
    """Render the confirmation page, or (when the post says ``confirm=yes``) run `act` in a
    thread and redirect (303) to the path it returns, relative to the app, with ``done=``."""
    form = await request.form()
    if form.get("confirm") != "yes":
        return page(request, "confirm.html", action_title=title, summary=summary,
                    fields=list(fields.items()), action_url=_same_target(request),
                    back_url=root(request) + back)
    target = await asyncio.to_thread(act)
    sep = "&" if "?" in target else "?"
    return RedirectResponse(root(request) + target + sep + urlencode({"done": title}),
                            status_code=303)
