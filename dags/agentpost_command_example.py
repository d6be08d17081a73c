"""Example: side effects as SMCL commands, at most once however often Airflow retries.

`book_room` is mutating and confirmed by a policy: it runs at once, and a retry of the task
after the booking replays the booking's outcome instead of booking again. `charge_card` has no
auto-confirm policy: the task waits (deferred, in the triggerer) until a person answers with
``agentpost command confirm <id> --user <name>`` (or ``decline``); the id is in the task log.

Needs an ``agentpost`` connection (``agentpost_default``) or AGENTPOST_DSN, a workspace
``travel-desk`` and envelope types ``room.book`` / ``card.charge`` its role may perform:
``agentpost fleet apply dags/fleet.yaml`` declares them (what `make demo` does).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task

from agentpost.operators import CommandOperator


def book_room(room: str, nights: int) -> dict:
    """The side effect (here a stand-in): call the booking system, return JSON."""
    return {"room": room, "nights": nights, "booking": f"B-{room}-{nights}"}


def charge_card(amount: int, currency: str) -> dict:
    return {"charged": amount, "currency": currency}


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["agentpost", "example"],
     default_args={"retries": 3, "retry_delay": timedelta(seconds=30)})
def agentpost_command_example():
    booking = CommandOperator(
        task_id="book_room", python_callable=book_room, action="room.book",
        workspace="travel-desk", auto_confirm="policy:rooms-under-200",
        op_kwargs={"room": "101", "nights": 2})
    charge = CommandOperator(
        task_id="charge_card", python_callable=charge_card, action="card.charge",
        workspace="travel-desk", op_kwargs={"amount": 180, "currency": "EUR"},
        poke_interval=30, wait_timeout=timedelta(hours=4))

    @task
    def receipt(booked: dict, charged: dict, ti=None) -> str:
        command = ti.xcom_pull(task_ids="charge_card", key="command_id")
        return f"{booked['booking']}: {charged['charged']} {charged['currency']} ({command})"

    receipt(booking.output, charge.output)


agentpost_command_example()
