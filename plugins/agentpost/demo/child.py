"""The child of the headless demo (`agentpost.demo.airflow.ChildRunner`): loads the DAGs
folder once, then runs what each JSON line of its standard input asks with `dag.test()`.

Run with its own AIRFLOW_HOME, SQLite metadata and the ``agentpost_default`` connection.
Commands come on a pipe of their own (its file descriptor is an argument), not on standard
input, which stays /dev/null for the tasks that run in this process. Answers are the lines
of standard output starting ``AGENTPOST-`` (the rest is Airflow's log):

- at start, ``DAGS {"dags": {id: tags}, "errors": {file: last line}}``;
- ``{"op": "run", "dags": [...]}``: one ``RESULT`` per DAG, in order, then ``DONE``;
- ``{"op": "arrival", "dag", "inbox", "watcher"}``: runs the inbox's `InboxEventTrigger`
  (the triggerer's part), says ``WATCHING`` once the watcher made its first claim (arrivals
  count from then on), waits for the event the parent's send causes, and runs the DAG with
  the event's payload as its conf ``arrivals`` (the scheduler's part); ``RESULT``, ``DONE``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

MARK = "AGENTPOST-"
#: the store, for the trigger this process runs (its tasks use the connection)
DSN_VAR = "AGENTPOST_DEMO_DSN"
#: how long an arrival may take to become the trigger's event
ARRIVAL_TIMEOUT = 120.0


def say(kind: str, data: Any = None) -> None:
    print(MARK + kind + ("" if data is None else " " + json.dumps(data, default=str)),
          flush=True)


def main(folder: str, commands_fd: int) -> int:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.db import initdb

    initdb()
    bag = DagBag(dag_folder=folder)
    say("DAGS", {"dags": {d: sorted(dag.tags) for d, dag in bag.dags.items()},
                 "errors": {p: e.strip().splitlines()[-1] for p, e in bag.import_errors.items()}})
    commands = open(commands_fd, encoding="utf-8")  # noqa: SIM115 (the process's life)
    for line in iter(commands.readline, ""):
        command = json.loads(line)
        if command["op"] == "run":
            for dag_id in command["dags"]:
                report(bag.dags[dag_id].test())
        elif command["op"] == "arrival":
            payload = asyncio.run(first_arrival(command["inbox"], command["watcher"]))
            report(bag.dags[command["dag"]].test(run_conf={"arrivals": [payload]}))
        say("DONE")
    return 0


def report(run: Any) -> None:
    """One RESULT line: the run's state, its tasks' states and end times."""
    tis = run.get_task_instances()
    say("RESULT", {
        "dag_id": run.dag_id, "state": str(run.state),
        "tasks": {(ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"):
                  str(ti.state) for ti in tis},
        "ended": {ti.task_id: ti.end_date.isoformat() if ti.end_date else "" for ti in tis}})


async def first_arrival(inbox: str, watcher: str) -> dict[str, Any]:
    """The payload of the first event the inbox's trigger yields, once the parent sent."""
    from agentpost.triggers import InboxEventTrigger

    dsn = os.environ[DSN_VAR]
    events = InboxEventTrigger(inbox, watcher=watcher, dsn=dsn, poll_interval=1.0).run()
    first = asyncio.ensure_future(anext(events))
    try:
        await asyncio.to_thread(wait_for_watcher, dsn, watcher)
        say("WATCHING")
        event = await asyncio.wait_for(first, ARRIVAL_TIMEOUT)
    finally:
        first.cancel()
        await events.aclose()
    return event.payload


def wait_for_watcher(dsn: str, watcher: str) -> None:
    """Until the watcher's row exists: its first claim set where arrivals count from."""
    import time

    from agentpost.store import EnvelopeStore

    with EnvelopeStore(dsn) as store:
        deadline = time.monotonic() + ARRIVAL_TIMEOUT
        while not store.db.fetchall("SELECT 1 FROM agentpost.event_watchers WHERE watcher = %s",
                                    (watcher,)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"watcher {watcher} made no claim")
            time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], int(sys.argv[2])))
