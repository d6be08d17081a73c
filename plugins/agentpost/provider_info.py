"""Airflow provider metadata (entry point `apache_airflow_provider`): the connection type
`agentpost` and the modules holding the provider's hooks, operators, sensors, triggers and
extra links, and the common-messaging queue provider (``MessageQueueTrigger(scheme=
"agentpost")``).

Modules are listed, not classes, as Airflow's own providers list them. Every module of the
installed package that defines one of these classes must appear under its kind:
tests/airflow/test_provider_info.py walks the package and names any module missing here.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

DISTRIBUTION = "airflow-agentpost"
INTEGRATION = "agentpost"
DEFAULT_CONN_NAME = "agentpost_default"

HOOK_MODULES = ["agentpost.hooks.agentpost"]
OPERATOR_MODULES = ["agentpost.operators.commands", "agentpost.operators.common",
                    "agentpost.operators.envelopes", "agentpost.operators.leases",
                    "agentpost.operators.marks", "agentpost.operators.sagas",
                    "agentpost.operators.setup", "agentpost.operators.spark"]
SENSOR_MODULES = ["agentpost.operators.sensors"]
TRIGGER_MODULES = ["agentpost.triggers.base", "agentpost.triggers.commands",
                   "agentpost.triggers.events", "agentpost.triggers.inbox",
                   "agentpost.triggers.needs", "agentpost.triggers.replies",
                   "agentpost.triggers.verdicts"]
#: class paths of BaseOperatorLink subclasses (the plugin registers the same classes)
EXTRA_LINKS = ["agentpost.web.links.CommandLink", "agentpost.web.links.EnvelopeLink",
               "agentpost.web.links.MarkLink", "agentpost.web.links.RouteLink",
               "agentpost.web.links.TrailAnalyticsLink"]
#: class paths of common-messaging's BaseMessageQueueProvider subclasses: the `agentpost`
#: scheme of ``MessageQueueTrigger`` (the module needs the `ai` extra; without it Airflow
#: skips the entry as an optional feature)
QUEUES = ["agentpost.triggers.messaging.AgentpostMessageQueueProvider"]
#: the project's documentation, as paths in the repository (Airflow's "how-to-guide" form)
DOCS = ["/docs/airflow.md", "/docs/api.md", "/docs/design.md"]


def _option(description: str, example: str | None = None, *,
            sensitive: bool = False) -> dict[str, Any]:
    option: dict[str, Any] = {"description": description, "version_added": "0.1.0",
                              "type": "string", "example": example, "default": None}
    if sensitive:
        option["sensitive"] = True
    return option


#: the ``[agentpost]`` section of Airflow's configuration (``airflow config list`` shows it);
#: every default is the code's own, said in each description (None here: unset)
CONFIG = {"agentpost": {
    "description": "agentpost's settings in Airflow's API server: its MCP endpoint "
                   "(docs/agents.md, \"Settings\") and its metrics (docs/operations.md).",
    "options": {
        "mcp_space": _option("A mark space whose read_marks, write_mark and claim the MCP "
                             "endpoint offers; unset: no mark tools.", "desk"),
        "mcp_scopes": _option("Its scopes, NAME[:INTENT_VERBS[:ACTION_VERBS]], separated by "
                              "spaces or new lines.", "deploys:deploy:deployed"),
        "mcp_fleet": _option("Instead of mcp_space and mcp_scopes: a fleet file whose space "
                             "and scopes the endpoint uses.", "/opt/airflow/dags/desk.yaml"),
        "mcp_token_rate": _option("Requests per second of a gateway token's bucket on the MCP "
                                  "endpoint when the token has none of its own; off: no "
                                  "limit. Default 50.", "20"),
        "mcp_token_burst": _option("That bucket's size. Default 100.", "40"),
        "mcp_token_cache": _option("Seconds a token the store confirmed live is taken as "
                                   "live without asking again; 0: every request. Default 1.",
                                   "0"),
        "metrics_token": _option("The scrape token that reads /agentpost/metrics "
                                 "(Authorization: Bearer); unset: Airflow users only "
                                 "(AGENTPOST_METRICS_TOKEN wins over it).", sensitive=True),
        "metrics_inboxes": _option("How many inboxes the metrics name, deepest first (the "
                                   "rest summed as inbox=\"_others\"), or all. Default 20.",
                                   "50"),
    },
}}


def _version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a source tree on sys.path without the distribution
        return "0+unknown"


def _modules(modules: list[str]) -> list[dict[str, Any]]:
    return [{"integration-name": INTEGRATION, "python-modules": list(modules)}]


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": DISTRIBUTION,
        "name": "agentpost",
        "description": "Agent coordination over a Postgres envelope store.",
        "versions": [_version()],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["protocol"],
                          "how-to-guide": list(DOCS)}],
        "hooks": _modules(HOOK_MODULES),
        "operators": _modules(OPERATOR_MODULES),
        "sensors": _modules(SENSOR_MODULES),
        "triggers": _modules(TRIGGER_MODULES),
        "extra-links": list(EXTRA_LINKS),
        "queues": list(QUEUES),
        "config": CONFIG,
        "connection-types": [{
            "hook-class-name": "agentpost.hooks.AgentpostHook",
            "hook-name": "agentpost",
            "connection-type": "agentpost",
            "default-conn-name": DEFAULT_CONN_NAME,
            "ui-field-behaviour": {
                "hidden-fields": [],
                "relabeling": {"schema": "Database"},
                "placeholders": {"host": "postgres.example.internal", "port": "5432",
                                 "schema": "agentpost",
                                 "extra": '{"trail_key": "...", "sslmode": "require"}'},
            },
        }],
    }
