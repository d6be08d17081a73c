"""A booking saga: book a flight, book a hotel, charge the card. The card is declined (the
`decline_card` param, on by default), so step 3 fails and the hotel and the flight are
cancelled, last first: the undo_* tasks show it. Each step is an SMCL command, at most once
per DAG run however often a task is retried.

Tagged ``expect-failure``: a run fails by design (with the default params), and the demo
counts it as expected only when it compensated (agentpost.demo.scenarios)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from agentpost.operators import DagSaga, TopologyOperator


def book(args: dict) -> dict:
    """Stand-in for the booking system: returns the booking."""
    return {"booked": args["item"], "ref": f"B-{args['item']}"}


def cancel(args: dict) -> dict:
    return {"canceled": args["item"]}


def pay(args: dict) -> dict:
    if args.get("decline") in (True, "True"):
        raise RuntimeError("card declined")
    return {"charged": args["amount"]}


HANDLERS = {"book": book, "cancel": cancel, "pay": pay}


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
     params={"decline_card": True}, tags=["agentpost", "example", "expect-failure"])
def agentpost_booking_saga():
    setup = TopologyOperator(
        task_id="setup", roles={"travel-agent": None},
        types={"trip.book": (["travel-agent"], ["travel-agent"]),
               "trip.pay": (["travel-agent"], ["travel-agent"])},
        workspaces=[("travel-desk", "travel-agent")])

    trip = DagSaga("booking", workspace="travel-desk", handlers=HANDLERS,
                   auto_confirm="policy:trips-under-1000")
    flight = trip.step("flight", "book", {"item": "flight"}, action="trip.book",
                       compensation=("cancel", {"item": "flight"}))
    trip.step("hotel", "book", {"item": "hotel"}, action="trip.book",
              compensation=("cancel", {"item": "hotel"}))
    trip.step("payment", "pay",
              {"item": "payment", "amount": 180, "decline": "{{ params.decline_card }}"},
              action="trip.pay")
    trip.end()
    setup >> flight


agentpost_booking_saga()
