"""Operator extra links (docs/ui.md, "Extra links"): an agentpost task instance links to the
page of what it produced. Real operators and sensors run under `dag.test()` in a subprocess
(its own AIRFLOW_HOME and SQLite metadata, as tests/airflow/test_airflow_inbox.py does) against
a real store; the subprocess then reads the ``_link_*`` XComs the worker wrote and asks Airflow's
own REST API for the task instances' links. Sensors that end from the triggerer put the same links
in their success event: checked on the triggers directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
from airflow.triggers.base import TaskSuccessEvent

from agentpost.marks import PostgresMarkSpace, Scope
from agentpost.operators import InboxSensor, NeedResolvedSensor, ReplySensor
from agentpost.store import EnvelopeStore
from agentpost.triggers import InboxTrigger, ReplyTrigger
from agentpost.web.links import (
    EXTRA_LINKS,
    LinkSource,
    link_xcoms,
    page_url,
    source_url,
    trigger_links,
)
from test_airflow_inbox import airflow_env, first_event
from test_leases import BOSS, topology

BASE = "http://airflow.example:8080"
TRIPS = [Scope(name="calendar", allowed_intent_verbs=("book",),
               allowed_action_verbs=("booked",))]

DAG_FILE = '''
"""Written by tests/web/test_web_links.py: agentpost operators and a sensor, then their links."""
import json
import os
import sys
from datetime import datetime

from airflow.sdk import dag

from agentpost.marks import Scope
from agentpost.operators import (CommandOperator, ReplySensor, SendEnvelopeOperator,
                                 WriteMarkOperator)

TRIPS = [Scope(name="calendar", allowed_intent_verbs=("book",),
               allowed_action_verbs=("booked",))]


def book(room):
    return {"booked": room}


@dag(dag_id="agentpost_links_test", schedule=None, start_date=datetime(2026, 1, 1))
def links_test():
    SendEnvelopeOperator(task_id="send", sender="boss", to="w1", type="directive",
                         content="link me")
    WriteMarkOperator(task_id="need", agent="planner", scopes=TRIPS, space="trips",
                      mark_type="need", scope="calendar",
                      fields={"question": "which hotel?", "blocking": True}, via="space")
    CommandOperator(task_id="command", python_callable=book, op_args=["r1"], action="book",
                    workspace="desk", auto_confirm="test-policy")
    ReplySensor(task_id="reply", envelope_id=os.environ["AGENTPOST_TEST_ASKED"], timeout=60)


the_dag = links_test()

if __name__ == "__main__":
    from airflow.models.xcom import XComModel
    from airflow.utils.db import initdb
    from airflow.utils.session import create_session
    from sqlalchemy import select

    initdb()
    run = the_dag.test()
    xcoms = {}
    with create_session() as session:
        for row in session.scalars(select(XComModel).where(
                XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id)):
            xcoms.setdefault(row.task_id, {})[row.key] = XComModel.deserialize_value(row)
    sys.path.insert(0, os.environ["AGENTPOST_TESTS"])
    from web_support import airflow_web

    api = {}
    with airflow_web(os.environ["AGENTPOST_DSN"]) as web:
        client = web.client("viewer")
        for task_id in ("send", "need", "command", "reply"):
            r = client.get(f"/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}"
                           f"/taskInstances/{task_id}/links")
            links = r.json().get("extra_links", {})
            # each link, followed as the browser would (the base_url's host is this app)
            pages = {name: client.get(url.removeprefix(os.environ["AIRFLOW__API__BASE_URL"]))
                     for name, url in links.items() if url}
            api[task_id] = [r.status_code, r.json(),
                            {name: [p.status_code, p.text] for name, p in pages.items()}]
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    print("AGENTPOST-RESULT " + json.dumps({"run": str(run.state), "tasks": states,
                                             "xcoms": xcoms, "api": api}), flush=True)
'''


def test_page_urls_are_relative_without_a_base_url_and_quote_ids() -> None:
    """Without ``[api] base_url`` the links are relative to the API server (the UI is served
    from it); ids and spaces are quoted; no id, no link (Airflow hides an empty one)."""
    assert page_url("envelopes", "e-1") == "/agentpost/envelopes/e-1"
    assert page_url("marks", "m/1", "my space") == "/agentpost/marks/m%2F1?space=my+space"
    assert source_url("envelopes", LinkSource(path=(0, "envelope_id")), lambda _k: []) == ""
    assert source_url("marks", LinkSource(), lambda _k: "m1") == "/agentpost/marks/m1?space=default"
    assert [link.__name__ for link in EXTRA_LINKS] == ["EnvelopeLink", "CommandLink",
                                                      "MarkLink", "RouteLink",
                                                      "TrailAnalyticsLink"]


def test_sensors_say_where_their_ids_are_for_the_trigger() -> None:
    """The specs a sensor hands its trigger: serializable, with the space resolved."""
    need = NeedResolvedSensor(task_id="n", need_id="00000000-0000-0000-0000-000000000001",
                              space="trips")
    specs = trigger_links(need)
    assert specs == [["_link_MarkLink", "marks", ["need_id"], None, ["space"]]]
    assert json.loads(json.dumps(specs)) == specs
    assert link_xcoms(specs, {"status": "resolved", "need_id": "n1", "space": "trips"}) == {
        "_link_MarkLink": "/agentpost/marks/n1?space=trips"}
    assert link_xcoms(specs, {"status": "resolved"}) == {}


def test_a_trigger_that_ends_the_task_carries_the_link_xcoms(store: EnvelopeStore,
                                                              dsn: str) -> None:
    """end_from_trigger: no worker runs `finalize`, so the success event holds the links:
    the reply's envelope page for ReplySensor, the first matching envelope for a filtered
    InboxSensor. The links survive the trigger's serialization round trip."""
    topology(store, ["w1"])
    asked = store.send("w1", BOSS, "query", "question?").envelope_id
    answer = store.send(BOSS, "w1", "feedback", "the answer", in_reply_to=asked).envelope_id
    sensor = ReplySensor(task_id="r", envelope_id=asked)
    trigger = ReplyTrigger(envelope_id=asked, sender="w1", dsn=dsn, end_task=True,
                           result_key="reply", links=trigger_links(sensor))
    _, kwargs = trigger.serialize()
    assert kwargs["links"] == [["_link_EnvelopeLink", "envelopes", ["id"], None, None]]
    event, _ = first_event(ReplyTrigger(**kwargs))
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms["_link_EnvelopeLink"] == f"/agentpost/envelopes/{answer}"
    assert event.xcoms["return_value"]["id"] == answer

    sent = store.send(BOSS, "w1", "directive", "do it").envelope_id
    inbox = InboxSensor(task_id="i", workspace_id="w1", type="directive")
    event, _ = first_event(InboxTrigger(workspace_id="w1", type="directive", dsn=dsn,
                                        end_task=True, links=trigger_links(inbox)))
    assert event.xcoms["_link_EnvelopeLink"] == f"/agentpost/envelopes/{sent}"


@pytest.mark.slow
def test_dag_test_writes_the_links_and_the_rest_api_serves_them(
        store: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """Under `dag.test()`: the worker's `finalize` stores each link's URL (with
    ``[api] base_url`` in front) in XCom ``_link_<Class>``, pointing at what the task
    produced in the store; Airflow's REST API (the UI's source) returns the same links."""
    _desk(store)
    topology(store, ["w1"])
    asked = store.send("w1", BOSS, "query", "question?").envelope_id
    answer = store.send(BOSS, "w1", "feedback", "the answer", in_reply_to=asked).envelope_id
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "links_test.py").write_text(DAG_FILE)
    env = airflow_env(tmp_path, dsn)
    env.update({"AGENTPOST_TEST_ASKED": asked, "AGENTPOST_DSN": dsn,
                "AGENTPOST_TESTS": str(Path(__file__).parent),
                "AIRFLOW__API__BASE_URL": BASE,
                "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                               "simple_auth_manager.SimpleAuthManager",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "viewer:viewer"})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(dags / "links_test.py")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    output = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("AGENTPOST-RESULT ")]
    assert proc.returncode == 0 and lines, output[-4000:]
    result = json.loads(lines[-1].removeprefix("AGENTPOST-RESULT "))
    assert result["run"] == "success", (result, output[-4000:], time.monotonic() - started)

    sent = [e.id for e in store.inbox("w1") if e.type == "directive"]
    mark_id = result["xcoms"]["need"]["return_value"]
    with PostgresMarkSpace(dsn=dsn, scopes=TRIPS, space="trips") as marks:
        assert marks.get(UUID(mark_id)) is not None
    command_id = _only_command(dsn)
    expected = {
        "send": ("Envelope", f"{BASE}/agentpost/envelopes/{sent[0]}"),
        "need": ("Mark", f"{BASE}/agentpost/marks/{mark_id}?space=trips"),
        "command": ("Command", f"{BASE}/agentpost/commands/{command_id}"),
        "reply": ("Envelope", f"{BASE}/agentpost/envelopes/{answer}"),
    }
    assert len(sent) == 1
    for task_id, (name, url) in expected.items():
        xcoms = result["xcoms"][task_id]
        assert xcoms[f"_link_{name}Link"] == url, (task_id, xcoms)
        status, body, pages = result["api"][task_id]
        assert status == 200 and body["extra_links"] == {name: url}, (task_id, body)
        if task_id in FOLLOWED:
            page_status, html = pages[name]
            assert page_status == 200 and FOLLOWED[task_id](result) in html, (task_id, html)


#: the tasks whose link is followed to the page, and what that page must show
FOLLOWED = {"send": lambda result: result["xcoms"]["send"]["return_value"],
            "command": lambda result: result["xcoms"]["command"]["command_id"],
            "need": lambda result: result["xcoms"]["need"]["return_value"],
            "reply": lambda result: result["xcoms"]["reply"]["return_value"]["id"]}


def _desk(store: EnvelopeStore) -> None:
    """What tests/airflow/test_airflow_commands.py's `desk` sets up: `desk` may perform `book`."""
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.create_workspace("agent", workspace_id="desk")


def _only_command(dsn: str) -> str:
    from dbtools import connect, rows

    conn = connect(dsn)
    try:
        found = rows(conn, "SELECT id FROM agentpost.commands")
    finally:
        conn.close()
    assert len(found) == 1, found
    return str(found[0][0])

