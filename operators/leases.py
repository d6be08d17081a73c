"""Leasing envelopes in DAGs: lease a batch, handle each envelope in a mapped task, ack or
nack each lease (Courier §6: leases with a TTL, ack, nack with a delay).

Two ways to write it:

- operators: `LeaseOperator` pushes the leases as a list of JSON objects, one per envelope,
  so that ``.expand(lease=leased.output)`` maps one task instance over each; `AckOperator`
  and `NackOperator` take one such object (or its token) each;
- the TaskFlow decorator ``@agentpost_task.consume(workspace_id=..., max=..., ttl=...)``:
  the function is called with each leased envelope (an `Envelope`) as its first argument;
  the lease is acked when it returns and nacked when it raises.

A lease outlives its task: the TTL must cover the gap until the mapped tasks run.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.sdk.bases.decorator import task_decorator_factory
from airflow.sdk.exceptions import AirflowException

from agentpost.hooks import AgentpostHook
from agentpost.operators.common import StoreOperator, open_store
from agentpost.protocol.errors import InvalidInput, LeaseLost
from agentpost.protocol.leases import Lease, split_token, to_courier, workspace_of
from agentpost.web.links import LinkSource, links_for

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator

    from agentpost.store import EnvelopeStore

#: the default lease TTL in DAGs: long enough for the scheduler to start the mapped tasks
DEFAULT_TTL = 300.0


def lease_json(lease: Lease) -> dict[str, Any]:
    """A lease as XCom carries it: the token, the attempt, the expiry and the envelope in
    Courier's JSON shape (§4.1)."""
    return {"token": lease.token, "envelope_id": lease.envelope.id,
            "attempt": lease.attempt, "expires_at": lease.expires_at.isoformat(),
            "envelope": to_courier(lease.envelope)}


def token_of(lease: Any) -> str:
    """The token of a lease given as `lease_json`'s object or as the token itself."""
    token = lease.get("token") if isinstance(lease, dict) else lease
    split_token(token)  # InvalidInput for anything that is not a token
    return token


def _check_max(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"max must be a whole number of at least 1, not {value!r}")
    return value


def _check_seconds(value: object, what: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or value < 0 or (positive and value == 0):
        raise InvalidInput(f"{what} must be a {'positive' if positive else 'non-negative'} "
                           f"number of seconds, not {value!r}")
    return float(value)


class LeaseOperator(StoreOperator):
    """Leases up to `max` envelopes of `workspace_id` for `ttl` seconds; returns the leases
    (`lease_json` objects, in processing order; ``[]`` when the inbox is empty, so the mapped
    tasks after it are skipped).

    :param workspace_id: the workspace, or its stream ``agents/<id>/inbox`` (templated).
    :param max: at most this many leases.
    :param ttl: seconds each lease lasts (default 300: until the mapped tasks run).
    :param holder: the lease holder recorded with each lease (default ``airflow:<task>``).
    """

    template_fields: Sequence[str] = ("workspace_id", "holder", "agentpost_conn_id")
    #: the first leased envelope
    agentpost_links = {"envelopes": LinkSource(path=(0, "envelope_id"))}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#d9e6f2"

    def __init__(self, *, workspace_id: str, max: int = 1, ttl: float = DEFAULT_TTL,
                 holder: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workspace_id = workspace_id
        self.max = _check_max(max)
        self.ttl = _check_seconds(ttl, "ttl", positive=True)
        self.holder = holder

    def execute(self, context: Context) -> list[dict[str, Any]]:
        with self.store() as store:
            leases = store.lease(workspace_of(self.workspace_id), max=self.max, ttl=self.ttl,
                                 holder=self.holder or f"airflow:{self.task_id}")
        self.log.info("leased %d envelope(s) of %s: %s", len(leases), self.workspace_id,
                      [lease.envelope.id for lease in leases])
        return [lease_json(lease) for lease in leases]


class _SettleOperator(StoreOperator):
    """Acks or nacks one lease; a retry after the first try settled it succeeds."""

    template_fields: Sequence[str] = ("lease", "agentpost_conn_id")
    agentpost_links = {"envelopes": LinkSource()}
    operator_extra_links = links_for(agentpost_links)
    ui_color = "#d9e6f2"

    def __init__(self, *, lease: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease = lease

    def execute(self, context: Context) -> str:
        with self.store() as store:
            token = token_of(self.lease)
            envelope_id, _ = split_token(token)
            try:
                self.settle(store, token)
            except LeaseLost:
                if not self.settled(store, envelope_id):
                    raise
                self.log.info("envelope %s: already settled by an earlier try", envelope_id)
        return envelope_id

    @abc.abstractmethod
    def settle(self, store: EnvelopeStore, token: str) -> None:
        """Ack or nack the lease."""

    @abc.abstractmethod
    def settled(self, store: EnvelopeStore, envelope_id: str) -> bool:
        """Whether an earlier try of this task did what this one was asked to do."""


class AckOperator(_SettleOperator):
    """Acks one lease (consumes its envelope); returns the envelope id. Map it:
    ``AckOperator.partial(task_id="ack").expand(lease=leased.output)``.

    :param lease: a `LeaseOperator` lease object, or a lease token (templated).
    """

    def settle(self, store: EnvelopeStore, token: str) -> None:
        store.ack(token)
        self.log.info("acked %s", token)

    def settled(self, store: EnvelopeStore, envelope_id: str) -> bool:
        return store.get(envelope_id).consumed_at is not None


class NackOperator(_SettleOperator):
    """Gives one lease back: its envelope is leasable again after `delay` seconds (the fourth
    return dead-letters it, Courier's rule); returns the envelope id.

    :param lease: a `LeaseOperator` lease object, or a lease token (templated).
    :param delay: seconds before the envelope can be leased again.
    """

    def __init__(self, *, lease: Any, delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(lease=lease, **kwargs)
        self.delay = _check_seconds(delay, "delay", positive=False)

    def settle(self, store: EnvelopeStore, token: str) -> None:
        store.nack(token, delay=self.delay)
        self.log.info("nacked %s (leasable again in %.1f s)", token, self.delay)

    def settled(self, store: EnvelopeStore, envelope_id: str) -> bool:
        return store.get(envelope_id).consumed_at is None


# -- the TaskFlow decorator -------------------------------------------------------------------


def _envelope_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as Airflow's decorator sees it: without its first parameter (the envelope), which
    the operator supplies, so binding the call's arguments checks only the others."""
    if getattr(fn, "_agentpost_envelope_first", False):
        return fn
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise InvalidInput(f"{fn.__name__} must take the envelope as its first argument")

    @functools.wraps(fn)
    def without_envelope(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("called by the consume operator with an envelope only")

    without_envelope.__signature__ = signature.replace(parameters=params[1:])  # type: ignore[attr-defined]
    without_envelope._agentpost_envelope_first = True  # type: ignore[attr-defined]
    return without_envelope


class ConsumeFailed(AirflowException):
    """Some envelopes' handler raised: their leases were nacked (the try fails, a retry
    leases them again); the others were acked."""


class _ConsumeDecoratedOperator(_PythonDecoratedOperator):
    """Leases, calls the function once per envelope, acks on return, nacks on exception.
    Returns ``[{"envelope_id", "result"}]`` for the acked envelopes."""

    template_fields: Sequence[str] = (*_PythonDecoratedOperator.template_fields,
                                      "workspace_id", "agentpost_conn_id")
    custom_operator_name = "@agentpost_task.consume"
    ui_color = "#d9e6f2"

    def __init__(self, *, python_callable: Callable[..., Any], workspace_id: str,
                 max: int = 1, ttl: float = DEFAULT_TTL, nack_delay: float = 0.0,
                 agentpost_conn_id: str = AgentpostHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(python_callable=_envelope_first(python_callable), **kwargs)
        self.workspace_id = workspace_id
        self.max = _check_max(max)
        self.ttl = _check_seconds(ttl, "ttl", positive=True)
        self.nack_delay = _check_seconds(nack_delay, "nack_delay", positive=False)
        self.agentpost_conn_id = agentpost_conn_id

    def execute_callable(self) -> list[dict[str, Any]]:
        handler = self.python_callable.__wrapped__
        done, failed = [], []
        with open_store(self.agentpost_conn_id, self.task_id) as store:
            for lease in store.lease(workspace_of(self.workspace_id), max=self.max,
                                     ttl=self.ttl, holder=f"airflow:{self.task_id}"):
                envelope = lease.envelope
                try:
                    result = handler(envelope, *self.op_args, **self.op_kwargs)
                except Exception as exc:
                    self.log.exception("envelope %s: the handler raised; nacking it",
                                       envelope.id)
                    store.nack(lease.token, delay=self.nack_delay)
                    failed.append(f"{envelope.id}: {type(exc).__name__}: {exc}")
                    continue
                store.ack(lease.token)
                self.log.info("envelope %s handled and acked", envelope.id)
                done.append({"envelope_id": envelope.id, "result": result})
        if failed:
            raise ConsumeFailed(f"{self.task_id}: {len(failed)} envelope(s) nacked, "
                                f"{len(done)} acked: " + "; ".join(failed))
        return done


def consume(python_callable: Callable[..., Any] | None = None, *, workspace_id: str,
            max: int = 1, ttl: float = DEFAULT_TTL, nack_delay: float = 0.0,
            multiple_outputs: bool | None = None, **kwargs: Any) -> TaskDecorator:
    """``@agentpost_task.consume(workspace_id=..., max=..., ttl=...)``: a task that leases up
    to `max` envelopes of `workspace_id` and calls the function with each (an `Envelope`)
    as its first argument; return acks the lease, an exception nacks it (leasable again
    after `nack_delay` seconds) and fails the try once every envelope was handled."""
    return task_decorator_factory(python_callable=python_callable,
                                  multiple_outputs=multiple_outputs,
                                  decorated_operator_class=_ConsumeDecoratedOperator,
                                  workspace_id=workspace_id, max=max, ttl=ttl,
                                  nack_delay=nack_delay, **kwargs)


class _AgentpostTask:
    """The namespace of agentpost's TaskFlow decorators (``agentpost_task.consume``)."""

    consume = staticmethod(consume)


agentpost_task = _AgentpostTask()

__all__ = ["DEFAULT_TTL", "AckOperator", "ConsumeFailed", "LeaseOperator", "NackOperator",
           "agentpost_task", "consume", "lease_json", "token_of"]
