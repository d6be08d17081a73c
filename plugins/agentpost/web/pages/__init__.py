"""The page modules; each exposes `router`, and every route in it requires an Airflow user
(its router depends on `require_viewer`; actions add `require_actor`)."""

from __future__ import annotations

from agentpost.web.pages import agents, analytics, commands, envelopes, inboxes, marks, routes

PAGE_ROUTERS = [inboxes.router, envelopes.router, marks.router, commands.router,
                routes.router, agents.router, analytics.router]
