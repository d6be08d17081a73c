"""Airflow for real: `airflow standalone` in a private home, driven over its REST API.

The demo, the end-to-end tests and `agentpost bench airflow` need the same thing: a real
scheduler, dag-processor, triggerer and API server running the repo's DAGs against the
agentpost store, then everything they started gone afterwards. `AirflowRuntime`
(`agentpost.standalone.runtime`) starts and stops it; `AirflowClient`
(`agentpost.standalone.client`) is the small REST client over it. Both, and their helpers,
are importable from here.
"""

from agentpost.standalone.client import (
    ADMIN_USER,
    HEALTH_PATH,
    PASSWORD_FILE,
    TERMINAL_RUN_STATES,
    AirflowClient,
    AirflowError,
    Credentials,
    read_credentials,
    wait_until,
)
from agentpost.standalone.runtime import (
    COMPONENTS,
    LOG_FILE,
    SPARK_LOCAL,
    START_TIMEOUT,
    STOP_GRACE,
    AirflowRuntime,
    connection_json,
    free_port,
    port_open,
    private_environment,
    sqlalchemy_url,
    venv_bin,
)

__all__ = [
    "ADMIN_USER",
    "COMPONENTS",
    "HEALTH_PATH",
    "LOG_FILE",
    "PASSWORD_FILE",
    "SPARK_LOCAL",
    "START_TIMEOUT",
    "STOP_GRACE",
    "TERMINAL_RUN_STATES",
    "AirflowClient",
    "AirflowError",
    "AirflowRuntime",
    "Credentials",
    "connection_json",
    "free_port",
    "port_open",
    "private_environment",
    "read_credentials",
    "sqlalchemy_url",
    "venv_bin",
    "wait_until",
]
