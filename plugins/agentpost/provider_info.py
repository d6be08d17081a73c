"""Airflow provider metadata (entry point `apache_airflow_provider`): the connection type
`agentpost`, its hook, the inbox sensor, the command operator and their triggers."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-agentpost",  # the distribution's name
        "name": "agentpost",
        "description": "Agent coordination over a Postgres envelope store.",
        "integrations": [{"integration-name": "agentpost", "tags": ["protocol"]}],
        "hooks": [{"integration-name": "agentpost", "python-modules": ["agentpost.hooks"]}],
        "sensors": [{"integration-name": "agentpost",
                     "python-modules": ["agentpost.operators.inbox"]}],
        "operators": [{"integration-name": "agentpost",
                       "python-modules": ["agentpost.operators.commands"]}],
        "triggers": [{"integration-name": "agentpost",
                      "python-modules": ["agentpost.triggers",
                                         "agentpost.command_triggers"]}],
        "connection-types": [{
            "hook-class-name": "agentpost.hooks.AgentpostHook",
            "hook-name": "agentpost",
            "connection-type": "agentpost",
            "ui-field-behaviour": {
                "hidden-fields": [],
                "relabeling": {"schema": "Database"},
                "placeholders": {"host": "postgres.example.internal", "port": "5432",
                                 "schema": "agentpost",
                                 "extra": '{"trail_key": "...", "sslmode": "require"}'},
            },
        }],
    }
