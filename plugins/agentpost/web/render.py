"""Rendering: Jinja templates (autoescaped) with what every page needs: the app's URL prefix
for links, the user, whether they may act, and their CSRF token for forms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from agentpost.web.auth import CSRF_FIELD, can_act, csrf_token, user_name
from agentpost.web.display import agent_tag, duration, iso_utc, state_class, utc_text, when

TEMPLATES = Path(__file__).with_name("templates")
templates = Jinja2Templates(directory=str(TEMPLATES))


def _as_json(value: Any) -> str:
    return json.dumps(value, default=str, indent=2, ensure_ascii=False)


templates.env.filters["when"] = when
templates.env.filters["utc"] = utc_text
templates.env.filters["iso"] = iso_utc
templates.env.filters["duration"] = duration
templates.env.filters["pretty"] = _as_json
templates.env.filters["state_class"] = state_class
templates.env.globals["agent"] = agent_tag


def root(request: Request) -> str:
    """The prefix the app is mounted at (``/agentpost`` in Airflow), for absolute links."""
    return request.scope.get("root_path", "").rstrip("/")


def page(request: Request, template: str, status_code: int = 200,
         **context: Any) -> HTMLResponse:
    """A page of the agentpost UI. Templates extend ``base.html`` and get `root`, `user`,
    `can_act`, `csrf_field`, `csrf_token` and `read_lag` (seconds behind the primary when
    the page was read from a standby, else None) besides `context`."""
    user = getattr(request.state, "agentpost_user", None)
    acting = user is not None and can_act(user)
    return templates.TemplateResponse(request, template, {
        "root": root(request), "user": None if user is None else user_name(user),
        "can_act": acting, "csrf_field": CSRF_FIELD,
        "csrf_token": csrf_token(user) if acting else "",
        "read_lag": getattr(request.state, "agentpost_read_lag", None), **context},
        status_code=status_code)
