"""The slice of Airflow's REST API (``/api/v2``) the demo, the tests and the benchmarks use.

`AirflowClient` gets a token from the SimpleAuthManager password file through
``/auth/token``, then unpauses, triggers, waits for a run, lists task instances, reads a
task's log and extra links. `wait_until` polls, riding out an API server too busy to answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HEALTH_PATH = "/api/v2/monitor/health"
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
ADMIN_USER = "admin"
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"


class AirflowError(RuntimeError):
    """Airflow did not start, did not answer, or a run did not end as expected."""


@dataclass(frozen=True)
class Credentials:
    """A SimpleAuthManager login."""

    username: str
    password: str


def read_credentials(home: Path) -> Credentials:
    """The admin login standalone generated into its home."""
    users = json.loads((home / PASSWORD_FILE).read_text(encoding="utf-8"))
    return Credentials(ADMIN_USER, users[ADMIN_USER])


class AirflowClient:
    """The slice of Airflow's REST API (``/api/v2``) the demo, tests and bench use."""

    def __init__(self, base_url: str, credentials: Credentials | None = None,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self._token: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AirflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """``/api/v2/monitor/health`` (anonymous)."""
        response = self._http.get(HEALTH_PATH)
        response.raise_for_status()
        return response.json()

    def _login(self) -> str:
        if self.credentials is None:
            raise AirflowError("no credentials to log in with")
        response = self._http.post("/auth/token", json={
            "username": self.credentials.username, "password": self.credentials.password})
        if response.status_code != 201:
            raise AirflowError(f"login failed ({response.status_code}): {response.text[:200]}")
        return response.json()["access_token"]

    def page(self, path: str) -> httpx.Response:
        """A signed-in GET of a path outside the REST API (the agentpost page at
        ``/agentpost/...``), answered as it is, errors included."""
        if self._token is None:
            self._token = self._login()
        return self._http.get(path, headers={"Authorization": f"Bearer {self._token}"})

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """An authenticated call to ``/api/v2{path}``; a token that expired is renewed once."""
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._login()
            headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {self._token}"}
            response = self._http.request(method, f"/api/v2{path}", headers=headers, **kwargs)
            if response.status_code == 401 and attempt == 1:
                self._token = None
                continue
            if response.is_error:
                raise AirflowError(f"{method} {path}: {response.status_code} "
                                   f"{response.text[:300]}")
            return response.json() if response.content else None
        raise AssertionError("unreachable")

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's details, or None while the dag-processor has not parsed it."""
        try:
            return self.request("GET", f"/dags/{dag_id}")
        except AirflowError as exc:
            if " 404 " in str(exc):
                return None
            raise

    def dag_ids(self, *, prefix: str = "", tag: str | None = None) -> list[str]:
        """Ids of the parsed DAGs starting with `prefix` (and tagged `tag`), sorted."""
        params: dict[str, Any] = {"limit": 1000}
        if prefix:
            params["dag_id_prefix_pattern"] = prefix
        if tag:
            params["tags"] = tag
        found = self.request("GET", "/dags", params=params)["dags"]
        return sorted(d["dag_id"] for d in found if d["dag_id"].startswith(prefix))

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None,
                run_id: str | None = None, *, slot: bool = False) -> str:
        """Start a manual run now; its run id. With `slot`, the run takes the DAG's next
        scheduled slot (`next_slot`), so the scheduler makes no run of its own for it."""
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if slot:
            body.update(self.next_slot(dag_id))
        if run_id is not None:
            body["dag_run_id"] = run_id
        return self.request("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def next_slot(self, dag_id: str) -> dict[str, str]:
        """The logical date and data interval of the DAG's next scheduled run. Unpausing a
        DAG without catch-up starts the latest slot at once; a run triggered into it first
        stands for it (the scheduler skips a slot that has a run)."""
        dag = self.request("GET", f"/dags/{dag_id}")
        if dag["next_dagrun_logical_date"] is None:
            raise AirflowError(f"DAG {dag_id} has no next scheduled run")
        return {"logical_date": dag["next_dagrun_logical_date"],
                "data_interval_start": dag["next_dagrun_data_interval_start"],
                "data_interval_end": dag["next_dagrun_data_interval_end"]}

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs, oldest first."""
        return self.request("GET", f"/dags/{dag_id}/dagRuns",
                            params={"limit": 1000, "order_by": "run_after"})["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                            params={"limit": 1000})["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1,
                 lines: int | None = 20) -> str:
        """The last `lines` events (None: all) of a task try's log as text, as the UI shows
        it: to say why a task failed, or to find what a task reported."""
        found = self.request("GET", f"{_task_path(dag_id, run_id, task_id)}/logs/{try_number}",
                             params={"full_content": "true"},
                             headers={"Accept": "application/json"})["content"]
        events = [_log_line(m) for m in found]
        return "\n".join(events if lines is None else events[-lines:])

    def extra_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        """The task instance's extra links by name, as the UI gets them (None: no URL)."""
        return self.request("GET", f"{_task_path(dag_id, run_id, task_id)}/links")["extra_links"]

    def wait_for_dag(self, dag_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """The DAG once the dag-processor has parsed it."""
        return wait_until(lambda: self.dag(dag_id), timeout, f"DAG {dag_id} to be parsed")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300.0,
                     tick: Callable[[], None] | None = None) -> str:
        """The run's final state (success or failed); `tick` is called between polls (the
        demo's person answers confirmations there)."""
        def ended() -> str | None:
            if tick is not None:
                tick()
            state = self.run(dag_id, run_id)["state"]
            return state if state in TERMINAL_RUN_STATES else None

        return wait_until(ended, timeout, f"run {run_id} of {dag_id} to end", interval=0.5)


def wait_until(probe: Callable[[], Any], timeout: float, what: str,
               interval: float = 1.0) -> Any:
    """`probe()`'s first truthy value, polled every `interval` seconds for `timeout`. A poll
    the API server did not answer in time (a busy machine) counts as "not yet", not as the
    end of the wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except httpx.TimeoutException:
            if time.monotonic() > deadline:
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _task_path(dag_id: str, run_id: str, task_id: str) -> str:
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"


def _log_line(message: str | dict[str, Any]) -> str:
    """One structured log message as text, with its exception's type and message (Airflow
    keeps those apart from the event, in ``error_detail``)."""
    if isinstance(message, str):
        return message
    errors = message.get("error_detail") or []
    causes = [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in errors
              if isinstance(e, dict)]
    return "\n".join([str(message.get("event", "")), *causes])
