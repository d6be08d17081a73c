"""The Airflow plugin (entry point ``airflow.plugins``): the agentpost web app at
``/agentpost`` in the API server, its page in the UI's Browse menu, and the operators'
extra links. Installing the package is all it takes; nothing to copy into plugins/.
The MCP endpoint's mark space and rate limit come from the ``[agentpost]`` section of
Airflow's configuration (`agentpost.web.mcpconfig`), read on the endpoint's first request."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI

from agentpost.web.app import create_app
from agentpost.web.links import EXTRA_LINKS
from agentpost.web.mcpconfig import airflow_mcp_options

URL_PREFIX = "/agentpost"


def plugin_app(dsn: str | None = None) -> FastAPI:
    """The app as the plugin mounts it (`dsn`: for tests; the plugin finds its store)."""
    return create_app(dsn, mcp_options=airflow_mcp_options)


class AgentpostPlugin(AirflowPlugin):
    name = "agentpost"
    fastapi_apps = [{"app": plugin_app(), "url_prefix": URL_PREFIX, "name": "agentpost"}]
    external_views = [{"name": "Agents", "href": URL_PREFIX + "/", "url_route": "agentpost",
                       "destination": "nav", "category": "browse"}]
    operator_extra_links = [link() for link in EXTRA_LINKS]
