"""Sensors that wait on the agentpost store: `InboxSensor` (envelopes to lease, optionally
matching a filter), `ReplySensor` (the answer to an envelope), `NeedResolvedSensor` (a
Markspace need resolved) and `VerdictSensor` (a deferred-resolution boundary's verdict).

They share one shape (`StoreSensor`): deferrable by default; the worker checks once before
deferring (what is already there never defers); the trigger is the same check, run in the
triggerer on LISTEN/NOTIFY with polling as the fallback; `poke` runs that check from the
worker when not deferrable. By default the trigger ends the task itself when the wait is
over (``end_from_trigger``: Airflow's TaskSuccessEvent, the result pushed as XCom there), so
no worker resumes it: that is fast and cannot meet Airflow 3.3's deferral race. With
``end_from_trigger=False`` the event resumes the task on a worker, and the trigger holds an
event that comes within `settle` seconds of the deferral until then, because Airflow 3.3 can
fail a task resumed before the scheduler processed the deferring worker's exit
(docs/airflow.md, "The deferral race"). Sensors only look: nothing is leased or consumed, so
a re-run after success checks again and succeeds again while what it waited for is there.
"""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from agentpost.hooks import AgentpostHook
from agentpost.protocol.leases import workspace_of
from agentpost.store.watches import PRIORITIES
from agentpost.triggers import (
    InboxTrigger,
    NeedResolvedTrigger,
    ReplyTrigger,
    VerdictTrigger,
    WatchTrigger,
)
from agentpost.web.links import LinkSource, links_for, trigger_links

if TYPE_CHECKING:
    from airflow.sdk import Context

    from agentpost.store import EnvelopeStore

#: the trigger's fallback poll when nothing is notified (NOTIFY normally wakes it first)
DEFAULT_POLL_INTERVAL = 30.0
#: seconds the scheduler may take, after a worker's supervisor finished, to process its
#: report (a loop or two): added to the supervisor's own lag for the default settle time
SCHEDULER_MARGIN = 3.0


def default_settle() -> float:
    """How long after a deferral a trigger must not fire: the deferring worker's supervisor
    notices its task process has exited only when its select() times out, up to
    ``[workers] min_heartbeat_interval`` (5 s) later, and its "success" must reach the
    scheduler while the task instance is still deferred (docs/airflow.md, "The deferral
    race"). Measured under standalone: the supervisor finished 0.05 s or 5.05 s after the
    deferral, nothing in between."""
    from airflow.sdk.configuration import conf

    return conf.getfloat("workers", "min_heartbeat_interval", fallback=5.0) + SCHEDULER_MARGIN


def default_end_from_trigger() -> bool:
    """True unless Airflow has listeners registered (plugins' ``listeners``): Airflow
    refuses to load a DAG whose tasks end from the triggerer when listeners exist, since
    those would never hear of the task's end; the sensors then resume on a worker."""
    from airflow.sdk.listener import get_listener_manager

    return not get_listener_manager().has_listeners


def default_deferrable() -> bool:
    """True, unless the deployment sets ``[operators] default_deferrable`` through the
    environment (AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE), which is then obeyed.

    Why not airflow.cfg: Airflow 3.3 writes every default into a new airflow.cfg, so its
    ``default_deferrable = false`` cannot be told from a deliberate choice, and honouring it
    would make these sensors hold worker slots in every stock deployment. Per sensor (or in
    a DAG's default_args), ``deferrable=`` decides."""
    if "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE" not in os.environ:
        return True
    from airflow.sdk.configuration import conf

    return conf.getboolean("operators", "default_deferrable", fallback=True)


class StoreSensor(BaseSensorOperator):
    """The shared shape of agentpost's sensors (see the module docstring). Subclasses build
    their trigger (`make_trigger`), say what the wait is about (`watched`) and may turn the
    trigger's payload into the sensor's result (`result`).

    :param agentpost_conn_id: the ``agentpost`` connection (else AGENTPOST_DSN).
    :param deferrable: wait in the triggerer instead of poking from a worker; default
        `default_deferrable()`.
    :param poke_interval: seconds between pokes; in deferrable mode the trigger's fallback
        poll when no notification arrives.
    :param end_from_trigger: when deferred, end the task from the triggerer the moment the
        wait is over (its XCom pushed there) instead of resuming it on a worker: sub-second
        from the event to the task's end, no worker slot, and no deferral race. Default
        `default_end_from_trigger()`: on, unless Airflow has listeners (which would miss the
        task's end). An error still resumes on a worker, which fails with the reason.
    :param settle: seconds after a deferral before the trigger may fire an event that
        resumes the task on a worker (0: at once); default `default_settle()`, 8 s with
        Airflow's defaults. Not applied to an event that ends the task from the triggerer.
    :param timeout: as every sensor's: the wait fails after it (deferred or poking).
    """

    #: the status of a trigger event that ends the wait
    done_status = "ready"
    #: the entry of the trigger's payload that is the sensor's result (None: all of it)
    result_key: str | None = None
    ui_color = "#d9ecf2"

    def __init__(self, *, agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 deferrable: bool | None = None, poke_interval: float = DEFAULT_POLL_INTERVAL,
                 settle: float | None = None, end_from_trigger: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if settle is None:
            settle = default_settle()
        if isinstance(settle, bool) or not isinstance(settle, int | float) or settle < 0:
            raise ValueError("settle must be a number of seconds, 0 or more")
        if end_from_trigger is not None and not isinstance(end_from_trigger, bool):
            raise ValueError("end_from_trigger must be True, False or None (the default)")
        self.agentpost_conn_id = agentpost_conn_id
        self.deferrable = default_deferrable() if deferrable is None else bool(deferrable)
        self.settle = float(settle)
        self.end_from_trigger = (default_end_from_trigger() if end_from_trigger is None
                                 else end_from_trigger)
        self._trigger: WatchTrigger | None = None

    @abc.abstractmethod
    def make_trigger(self, store: EnvelopeStore) -> WatchTrigger:
        """The trigger for this wait (templated fields are rendered by now)."""

    @abc.abstractmethod
    def watched(self, event: dict[str, Any]) -> str:
        """What was waited for, for messages (``inbox 'w1'``)."""

    def result(self, payload: dict[str, Any]) -> Any:
        """The sensor's return value (its XCom) for the trigger's payload; the trigger
        computes the same when it ends the task itself."""
        return payload if self.result_key is None else payload[self.result_key]

    def check_now(self) -> dict[str, Any] | None:
        """The trigger's check, run here; keeps the trigger for a deferral."""
        with AgentpostHook(agentpost_conn_id=self.agentpost_conn_id).get_store() as store:
            self._trigger = self.make_trigger(store)
            return self._trigger.check(store)

    def poke(self, context: Context) -> PokeReturnValue:
        payload = self.check_now()
        done = payload is not None
        return PokeReturnValue(is_done=done, xcom_value=self.result(payload) if done else None)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        ready = self.poke(context)
        if ready.is_done:
            return ready.xcom_value
        trigger = self._trigger
        assert trigger is not None  # set by the check
        trigger.not_before = time.time() + self.settle if self.settle else None
        trigger.end_task, trigger.result_key = self.end_from_trigger, self.result_key
        trigger.links = trigger_links(self) if self.end_from_trigger else []
        self.defer(trigger=trigger, method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Context,
                         event: dict[str, Any] | str | None = None) -> Any:
        """Resumes after the trigger fired: the result, or a clear failure.

        ``event == "success"``: the trigger ended the task itself, but this runner resumed
        it anyway with that event's bare state (``dag.test()`` does), its XCom lost; the
        check runs again here for the result."""
        if event == "success" and self.end_from_trigger:
            payload = self.check_now()
            if payload is None:
                watched = self.watched(self._trigger.subject() if self._trigger else {})
                raise AirflowException(f"{self.task_id}: the trigger ended the wait, but "
                                       f"{watched} is no longer there")
            return self.result(payload)
        if not isinstance(event, dict) or event.get("status") not in (self.done_status, "error"):
            raise AirflowException(f"{self.task_id}: unexpected trigger event {event!r}")
        if event["status"] == "error":
            raise AirflowException(
                f"{self.task_id}: cannot watch {self.watched(event)}: {event.get('message')}")
        self.log.info("%s: %s", self.watched(event), event["status"])
        return self.result(event)


class InboxSensor(StoreSensor):
    """Waits until `workspace_id`'s inbox holds at least `min_envelopes` envelopes a lease
    could take now (matching `type`, `sender`, `in_reply_to` and `priority` where given);
    returns (and pushes to XCom) ``{"status": "ready", "workspace_id", "available"}``, and
    with a filter also ``"envelope_ids"``: the matching ids, first 100 in processing order.
    Nothing is leased: another consumer may take them first, and ``store.lease`` takes the
    inbox in its own order; a task that must handle exactly these consumes them by id.

    :param workspace_id: the workspace, or its stream name ``agents/<id>/inbox`` (templated).
    :param min_envelopes: how many available envelopes make the inbox ready.
    """

    template_fields: Sequence[str] = ("workspace_id", "type", "sender", "in_reply_to",
                                      "agentpost_conn_id")
    #: the first matching envelope (filtered waits list them)
    agentpost_links = {"envelopes": LinkSource(path=("envelope_ids", 0))}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, workspace_id: str, min_envelopes: int = 1, type: str | None = None,
                 sender: str | None = None, in_reply_to: str | None = None,
                 priority: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(min_envelopes, bool) or not isinstance(min_envelopes, int) \
                or min_envelopes < 1:
            raise ValueError("min_envelopes must be a whole number of at least 1")
        if priority is not None and priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        self.workspace_id = workspace_id
        self.min_envelopes = min_envelopes
        self.type, self.sender, self.in_reply_to = type, sender, in_reply_to
        self.priority = priority

    def make_trigger(self, store: EnvelopeStore) -> InboxTrigger:
        return InboxTrigger(workspace_id=workspace_of(self.workspace_id),
                            min_envelopes=self.min_envelopes, poll_interval=self.poke_interval,
                            conn_id=self.agentpost_conn_id, type=self.type or None,
                            sender=self.sender or None, in_reply_to=self.in_reply_to or None,
                            priority=self.priority)

    def watched(self, event: dict[str, Any]) -> str:
        return f"inbox {event.get('workspace_id')!r}"


class ReplySensor(StoreSensor):
    """Waits for the answer to envelope `envelope_id` (of `type`, if given): an envelope
    whose in_reply_to is it, delivered to its sender's inbox. Returns that envelope as JSON
    (the §3 fields by wire name: ``id``, ``from``, ``to``, ``type``, ``payload``,
    ``in_reply_to``, ...). Consumed or not: a re-run finds the same answer."""

    template_fields: Sequence[str] = ("envelope_id", "type", "agentpost_conn_id")
    done_status = "replied"
    result_key = "reply"
    agentpost_links = {"envelopes": LinkSource(path=("id",))}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, envelope_id: str, type: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.envelope_id = envelope_id
        self.type = type

    def make_trigger(self, store: EnvelopeStore) -> ReplyTrigger:
        original = store.get(self.envelope_id)  # unknown envelope: NotFound, one line
        return ReplyTrigger(envelope_id=original.id, type=self.type or None,
                            sender=original.sender, poll_interval=self.poke_interval,
                            conn_id=self.agentpost_conn_id)

    def watched(self, event: dict[str, Any]) -> str:
        return f"replies to {event.get('envelope_id')!r}"


class NeedResolvedSensor(StoreSensor):
    """Waits until need `need_id` of the PostgresMarkSpace named `space` is resolved;
    returns ``{"status": "resolved", "need_id", "space", "resolution_id", "resolved_by"}``.
    A resolution is permanent, so a re-run returns at once."""

    template_fields: Sequence[str] = ("need_id", "space", "agentpost_conn_id")
    done_status = "resolved"
    agentpost_links = {"marks": LinkSource(path=("need_id",), space_path=("space",))}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, need_id: str | UUID, space: str = "default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.need_id = str(need_id)
        self.space = space

    def make_trigger(self, store: EnvelopeStore) -> NeedResolvedTrigger:
        return NeedResolvedTrigger(need_id=self.need_id, space=self.space,
                                   poll_interval=self.poke_interval,
                                   conn_id=self.agentpost_conn_id)

    def watched(self, event: dict[str, Any]) -> str:
        return f"need {event.get('need_id')!r} in {event.get('space')!r}"


class VerdictSensor(StoreSensor):
    """Waits for the verdict of a deferred-resolution boundary on (`scope`, `resource`) of
    the PostgresMarkSpace `space` for agent `agent_id` (about intent `intent_id`, if given);
    returns ``{"status": "decided", "verdict": "ALLOW"|"BLOCKED", "winner_id", "intent_id",
    "boundary", ...}``. The verdict is what the space keeps (docs/marks.md, "Deferred
    verdicts: the contract"): it lasts while the intent's TTL does, so a re-run within it
    returns the same verdict (or a later boundary's)."""

    template_fields: Sequence[str] = ("scope", "resource", "agent_id", "space", "intent_id",
                                      "agentpost_conn_id")
    done_status = "decided"
    #: the intent the verdict is about
    agentpost_links = {"marks": LinkSource(path=("intent_id",), space_path=("space",))}
    operator_extra_links = links_for(agentpost_links)

    def __init__(self, *, scope: str, resource: str, agent_id: str | UUID,
                 space: str = "default", intent_id: str | UUID | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scope, self.resource, self.space = scope, resource, space
        self.agent_id = str(agent_id)
        self.intent_id = None if intent_id is None else str(intent_id)

    def make_trigger(self, store: EnvelopeStore) -> VerdictTrigger:
        return VerdictTrigger(scope=self.scope, resource=self.resource, agent_id=self.agent_id,
                              space=self.space, intent_id=self.intent_id or None,
                              poll_interval=self.poke_interval, conn_id=self.agentpost_conn_id)

    def watched(self, event: dict[str, Any]) -> str:
        return (f"the verdict for {event.get('agent_id')!r} on "
                f"{event.get('scope')!r}/{event.get('resource')!r}")
