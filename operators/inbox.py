"""A sensor that waits for envelopes in an agent's inbox.

Deferrable by default: the sensor counts once in the worker and, when the inbox is not ready,
hands the wait to `InboxTrigger` in the triggerer, which wakes on the store's NOTIFY (issue 3,
"Live delivery") and polls only as a fallback. No worker slot is held while waiting, and the
task resumes as soon as the envelope is delivered rather than at the next poke.

The sensor does not lease anything: it reports that there is work, and the next task leases
it (a lease taken here would be held across the scheduling gap and could expire).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from agentpost.hooks import AgentpostHook
from agentpost.protocol.leases import workspace_of
from agentpost.triggers import InboxTrigger, available

if TYPE_CHECKING:
    from airflow.sdk import Context

#: the trigger's fallback poll when nothing is notified (NOTIFY normally wakes it first)
DEFAULT_POLL_INTERVAL = 30.0


class InboxSensor(BaseSensorOperator):
    """Waits until `workspace_id`'s inbox holds at least `min_envelopes` envelopes available
    to lease; returns (and pushes to XCom) ``{"status": "ready", "workspace_id",
    "available"}``.

    :param workspace_id: the workspace, or its stream name ``agents/<id>/inbox`` (templated).
    :param min_envelopes: how many available envelopes make the inbox ready.
    :param agentpost_conn_id: the ``agentpost`` connection (else AGENTPOST_DSN).
    :param deferrable: wait in the triggerer (the default) instead of poking from a worker.
    :param poke_interval: seconds between pokes; in deferrable mode, the trigger's fallback
        poll when no notification arrives.
    """

    template_fields: Sequence[str] = ("workspace_id", "agentpost_conn_id")
    ui_color = "#d9ecf2"

    def __init__(self, *, workspace_id: str, min_envelopes: int = 1,
                 agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 deferrable: bool = True, poke_interval: float = DEFAULT_POLL_INTERVAL,
                 **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if isinstance(min_envelopes, bool) or not isinstance(min_envelopes, int) \
                or min_envelopes < 1:
            raise ValueError("min_envelopes must be a whole number of at least 1")
        self.workspace_id = workspace_id
        self.min_envelopes = min_envelopes
        self.agentpost_conn_id = agentpost_conn_id
        self.deferrable = deferrable

    def _count(self) -> tuple[str, int]:
        ws = workspace_of(self.workspace_id)
        with AgentpostHook(agentpost_conn_id=self.agentpost_conn_id).get_store() as store:
            return ws, available(store, ws)

    def _ready(self, ws: str, n: int) -> dict[str, Any]:
        return {"status": "ready", "workspace_id": ws, "available": n}

    def poke(self, context: Context) -> PokeReturnValue:
        ws, n = self._count()
        self.log.info("inbox %s: %d envelope(s) available, %d wanted", ws, n,
                      self.min_envelopes)
        done = n >= self.min_envelopes
        return PokeReturnValue(is_done=done, xcom_value=self._ready(ws, n) if done else None)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        ready = self.poke(context)
        if ready.is_done:
            return ready.xcom_value
        self.defer(
            trigger=InboxTrigger(workspace_id=workspace_of(self.workspace_id),
                                 min_envelopes=self.min_envelopes,
                                 poll_interval=self.poke_interval,
                                 conn_id=self.agentpost_conn_id),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resumes after the trigger fired: the event's payload, or a clear failure."""
        if not isinstance(event, dict) or event.get("status") not in ("ready", "error"):
            raise AirflowException(f"{self.task_id}: unexpected trigger event {event!r}")
        if event["status"] == "error":
            raise AirflowException(
                f"{self.task_id}: cannot watch inbox {event.get('workspace_id')!r}: "
                f"{event.get('message')}")
        self.log.info("inbox %s: %s envelope(s) available", event.get("workspace_id"),
                      event.get("available"))
        return event
