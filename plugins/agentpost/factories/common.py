"""What the DAG factories share: the fleet they are built from, DAG defaults, and how a
store error becomes a task failure (one line, the store's reason, no SQL traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from agentpost.fleet.files import checked, load_fleet
from agentpost.fleet.model import Fleet
from agentpost.protocol.errors import AgentpostError, StoreUnavailable

#: a fixed start in the past: with catchup off, the first run is the next one due
START_DATE = datetime(2026, 1, 1)
DEFAULT_CONN_ID = "agentpost_default"

FleetLike = Fleet | str | Path


def fleet_of(fleet: FleetLike) -> Fleet:
    """A Fleet, read from its file when given a path (at parse time: the file only); one
    given as an object is checked as a file would be."""
    return checked(fleet) if isinstance(fleet, Fleet) else load_fleet(fleet)


def dag_kwargs(**given: Any) -> dict[str, Any]:
    """DAG arguments every factory uses unless told otherwise: one active run (Markspace
    P56 for agents, one boundary at a time for boundaries), no catchup (a missed interval is
    not run late), a fixed start date."""
    kwargs = {"start_date": START_DATE, "catchup": False, "max_active_runs": 1}
    kwargs.update({k: v for k, v in given.items() if v is not None})
    return kwargs


@contextmanager
def store_errors(what: str) -> Iterator[None]:
    """Turn agentpost errors raised inside into task failures that read `what: Kind:
    reason`. An unreachable store is retried as Airflow is configured; anything else the
    store refused would be refused again, so the task fails without retries."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    try:
        yield
    except StoreUnavailable as exc:
        raise AirflowException(f"{what}: {type(exc).__name__}: {exc}") from None
    except AgentpostError as exc:
        raise AirflowFailException(f"{what}: {type(exc).__name__}: {exc}") from None
