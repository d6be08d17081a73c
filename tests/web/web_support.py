"""The agentpost page inside a real Airflow API app (``airflow.api_fastapi.app.create_app``,
auth on, plugins mounted from the installed entry point) under FastAPI's TestClient.

`airflow_web(dsn)` yields a `Web`: `client(role)` is a TestClient signed in as one of the
simple auth manager's users `viewer`, `user`, `op`, `admin` (the UI's cookie), or anonymous
(`role=None`); `bearer(role)` gives the header a script would send; `csrf(role)` the form
token the pages embed; `confirm_key(role, path)` a confirmation's single-use key. The
plugin's app is pointed at `dsn` for the duration.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

ROLES = ("viewer", "user", "op", "admin")


@dataclass
class Web:
    app: Any
    tokens: dict[str, str]
    _clients: list[Any] = field(default_factory=list)

    def client(self, role: str | None, **kwargs: Any):
        from fastapi.testclient import TestClient

        c = TestClient(self.app, base_url="http://testserver", follow_redirects=False,
                       **kwargs)
        if role is not None:
            c.cookies.set("_token", self.tokens[role])
        self._clients.append(c)
        return c

    def bearer(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def csrf(self, role: str) -> str:
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        from agentpost.web.auth import csrf_token

        return csrf_token(SimpleAuthManagerUser(username=role, role=role.upper()))

    def confirm_key(self, role: str, path: str) -> str:
        """A fresh single-use key, as the confirm page of the action at `path` gives `role`
        (for tests that post a confirmation without rendering its page first)."""
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        from agentpost.web.actions import key_for

        return key_for(SimpleAuthManagerUser(username=role, role=role.upper()), path)


def csrf_from(html: str) -> str:
    """The CSRF token a rendered page embeds (the body's data-csrf)."""
    found = re.search(r'data-csrf="([^"]*)"', html)
    assert found, "page has no data-csrf attribute"
    return found.group(1)


def confirm_form(page: str) -> tuple[str, dict[str, str]]:
    """The confirm page's form as a browser would post it: its action and hidden fields
    (CSRF token, the action's fields, the single-use key, confirm=yes)."""
    form = re.search(r'<form method="post" action="([^"]*)" class="confirm">(.*?)</form>',
                     page, re.S)
    assert form, "page has no confirm form"
    fields = re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', form[2])
    return html.unescape(form[1]), {html.unescape(n): html.unescape(v) for n, v in fields}


def plugin_app():
    from agentpost.web.plugin import AgentpostPlugin

    return AgentpostPlugin.fastapi_apps[0]["app"]


@cache
def _airflow_app() -> Any:
    """Airflow's API app, built once per test process (its metadata database migrated once):
    each `airflow_web` only points the plugin at another store."""
    os.environ["AIRFLOW__CORE__AUTH_MANAGER"] = (
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = ",".join(
        f"{r}:{r}" for r in ROLES)
    from airflow.api_fastapi.app import create_app
    from airflow.utils.db import initdb

    initdb()
    return create_app("all")


@contextmanager
def airflow_web(dsn: str, *, read_dsn: str | None = None) -> Iterator[Web]:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from agentpost.web.context import WebContext

    app = _airflow_app()
    sub = plugin_app()
    previous = sub.state.agentpost
    sub.state.agentpost = WebContext(dsn, read_dsn=read_dsn)
    manager = get_auth_manager()
    tokens = {r: manager.generate_jwt(SimpleAuthManagerUser(username=r, role=r.upper()))
              for r in ROLES}
    web = Web(app=app, tokens=tokens)
    try:
        yield web
    finally:
        for c in web._clients:
            c.close()
        sub.state.agentpost.close()
        sub.state.agentpost = previous
