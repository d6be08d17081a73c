"""The agentpost page in Airflow's UI: a FastAPI app the plugin mounts at ``/agentpost``.

Server-rendered pages (Jinja templates, a little JavaScript for live refresh and charts)
over the store: inboxes, envelopes, the mark space, commands, routes and trail analytics;
the human highway's actions; and the Courier gateway under ``/v1``. Every route needs an
Airflow user (auth.py); the plugin itself is in plugin.py.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agentpost.web import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
