"""The Airflow plugin (entry point ``airflow.plugins``): the agentpost web app at
``/agentpost`` in the API server, its page in the UI's Browse menu, and the operators'
extra links. Installing the package is all it takes; nothing to copy into plugins/."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from agentpost.web.app import create_app
from agentpost.web.links import EXTRA_LINKS

URL_PREFIX = "/agentpost"


class AgentpostPlugin(AirflowPlugin):
    name = "agentpost"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "agentpost"}]
    external_views = [{"name": "Agents", "href": URL_PREFIX + "/", "url_route": "agentpost",
                       "destination": "nav", "category": "browse"}]
    operator_extra_links = [link() for link in EXTRA_LINKS]
