"""The research desk and the refund desk under `airflow standalone`: reactive LLM agents
(scripted FunctionModels, tests/ai/test_ai_examples.py's scripts) woken by their inbox assets
in the real triggerer, run by the real scheduler and LocalExecutor, and a person deciding
refunds both ways: through Airflow's human-in-the-loop REST API, and on the agentpost page.

One standalone start (it stops every process it started, and leaves no port open):

- the desk: a research request reaches the newsroom as report(s) holding both researchers'
  answers, each answering its ask, with no envelope left in any inbox of the desk;
- refund A-1001: the support agent's task parks in awaiting_input on an approval request
  naming `submit_command`; the admin approves it with ``PATCH .../hitlDetails``; the command
  is confirmed in the ledger by ``human:admin`` and the customer is told "approved";
- refund A-1002: the agent parks again (a new run); the admin declines the waiting command
  on the agentpost page; the ledger records the decline by ``human:admin``, the task's
  approval request is answered Reject by admin (the page settled it), and the resumed agent
  tells the customer "declined";
- refund A-1003: the admin rejects it in Airflow (with a reason); confirming it on the page
  afterwards is a 409 (the first decision stands); the resumed task records the decline by
  ``human:admin`` and the agent tells the customer "declined".
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentpost.fleet import apply, load_fleet
from agentpost.standalone import AirflowClient, AirflowRuntime, port_open, wait_until
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from test_ai_examples import SCRIPTED

ROOT = Path(__file__).resolve().parents[2]
FLEETS = ("research_desk.yaml", "refund_desk.yaml")
DESK = ("agent_desk_coordinator", "agent_desk_researcher-a", "agent_desk_researcher-b")
REFUNDS = "agent_shop_refunds"
HITL = f"/dags/{REFUNDS}/dagRuns/~/hitlDetails"
#: a chain of agent runs on two busy cores, each a worker process importing Airflow
RUN_TIMEOUT = 420


def open_request(client: AirflowClient, runtime: AirflowRuntime) -> dict[str, Any] | None:
    """The refund agent's approval request that waits for an answer, once Airflow can take
    the answer.

    A person reads before deciding. An answer that lands before the scheduler has handled
    the paused worker's exit races Airflow 3.3's scheduler: it requeues the task on the
    answer, then handles the exit and fails the task it finds queued ("finished with state
    success, but the task instance's state attribute is queued"); on two busy cores that
    took over 6 s once. So the test answers once the scheduler has logged the paused
    workload as finished (its "TaskInstance Finished" line for the task instance)."""
    found = client.request("GET", HITL, params={"limit": 100})["hitl_details"]
    waiting = [d for d in found if not d["response_received"]]
    if not waiting:
        return None
    ti_id = waiting[0]["task_instance"]["id"]
    log = runtime.log_path.read_text(encoding="utf-8", errors="replace")
    handled = any("TaskInstance Finished" in line and f"ti_id={ti_id}" in line
                  for line in log.splitlines())
    return waiting[0] if handled else None


def statuses(store: EnvelopeStore) -> dict[str, dict[str, Any]]:
    """The refund.status replies in the customers' inbox, by order."""
    out = {}
    for envelope in store.inbox("customers"):
        if envelope.type == "refund.status":
            content = json.loads(envelope.content)
            out[content["order"]] = {**content, "in_reply_to": envelope.in_reply_to}
    return out


def decide_on_the_page(client: AirflowClient, command_id: str, verb: str) -> str:
    """Post the page's decision form, then its confirmation with the single-use key it
    gives; the final page's notice."""
    token = client._login()
    headers = {"Authorization": f"Bearer {token}"}
    path = f"/agentpost/commands/{command_id}/{verb}"
    http = client._http
    first = http.post(path, headers=headers, data={"note": "not covered by the policy"})
    assert first.status_code == 200, first.text[:500]
    key = re.search(r'name="confirm_key" value="([^"]+)"', first.text)
    assert key is not None, first.text[:2000]
    done = http.post(path, headers=headers, follow_redirects=True,
                     data={"note": "not covered by the policy", "confirm": "yes",
                           "confirm_key": key.group(1)})
    assert done.status_code == 200, done.text[:500]
    return done.text


@pytest.mark.slow
def test_the_desks_under_airflow_standalone(store: EnvelopeStore, dsn: str,
                                            tmp_path: Path) -> None:
    for fleet in FLEETS:
        apply(store, load_fleet(ROOT / "dags" / fleet))
    dags = tmp_path / "dags"
    dags.mkdir()
    for fleet in FLEETS:
        shutil.copy(ROOT / "dags" / fleet, dags)
    (dags / "scripted_desks.py").write_text(
        SCRIPTED.replace('for fleet in ("research_desk.yaml", "shared_staging.yaml", '
                         '"refund_desk.yaml"):', f"for fleet in {FLEETS!r}:")
        + "\nglobals().update(dags)\n")
    runtime = AirflowRuntime(dsn, dags_folder=dags, drop_metadata=True)
    with runtime:
        client = runtime.client()
        for dag_id in (*DESK, REFUNDS):
            client.wait_for_dag(dag_id)
            client.unpause(dag_id)
        # an inbox watcher announces what arrives once it runs: wait for the four
        wait_until(lambda: store.db.scalar("SELECT count(*) FROM agentpost.event_watchers")
                   >= 1 + len(DESK), RUN_TIMEOUT, "the triggerer to run the inbox watchers")
        request = store.send("newsroom", "desk", "research.request",
                             "What limits battery life in the cold?").envelope_id
        first = store.send("customers", "support", "refund.request",
                           {"order": "A-1001", "amount": 42}, format="json").envelope_id

        # A-1001: approved through Airflow's HITL REST API
        detail = wait_until(lambda: open_request(client, runtime), RUN_TIMEOUT,
                            "the refund agent to ask for approval")
        assert "submit_command" in detail["subject"] and "A-1001" in detail["body"], detail
        ti = detail["task_instance"]
        assert ti["state"] == "awaiting_input", ti
        with CommandLedger(store) as ledger:
            waiting = ledger.find("support", "refund/A-1001")
            assert waiting is not None and waiting.state.value == "confirmation_required"
        client.request("PATCH", f"/dags/{REFUNDS}/dagRuns/{ti['dag_run_id']}/taskInstances/"
                       f"agent/-1/hitlDetails",
                       json={"chosen_options": ["Approve"], "params_input": {}})
        told = wait_until(lambda: statuses(store).get("A-1001"), RUN_TIMEOUT,
                          "the customer to hear about A-1001")
        with CommandLedger(store) as ledger:
            view = ledger.view(waiting.command_id)
        assert (view.state.value, view.confirmed_by) == ("confirmed", "human:admin"), view
        assert told == {"order": "A-1001", "status": "approved",
                        "command_id": view.command_id, "in_reply_to": first}
        assert client.wait_for_run(REFUNDS, ti["dag_run_id"], RUN_TIMEOUT) == "success"
        assert store.get(first).consumed_at is not None

        # A-1002: declined on the agentpost page, which answers the task's request
        second = store.send("customers", "support", "refund.request",
                            {"order": "A-1002", "amount": 7}, format="json").envelope_id
        detail = wait_until(lambda: open_request(client, runtime), RUN_TIMEOUT,
                            "the refund agent to ask again")
        ti2 = detail["task_instance"]
        assert ti2["dag_run_id"] != ti["dag_run_id"]
        with CommandLedger(store) as ledger:
            waiting2 = ledger.find("support", "refund/A-1002")
        assert waiting2 is not None
        shown = client.page(f"/agentpost/commands/{waiting2.command_id}")
        assert 'id="decline-form"' in shown.text and 'id="waiting-task"' in shown.text
        page = decide_on_the_page(client, waiting2.command_id, "decline")
        assert "approval request of task agent was answered (Reject)" in page, \
            re.findall(r'<p class="notice[^>]*>.*?</p>', page)
        answered = client.request("GET", f"/dags/{REFUNDS}/dagRuns/{ti2['dag_run_id']}/"
                                  f"taskInstances/agent/-1/hitlDetails")
        assert answered["response_received"] and answered["chosen_options"] == ["Reject"]
        assert answered["responded_by_user"]["name"] == "admin", answered
        told = wait_until(lambda: statuses(store).get("A-1002"), RUN_TIMEOUT,
                          "the customer to hear about A-1002")
        assert told == {"order": "A-1002", "status": "declined", "command_id": None,
                        "in_reply_to": second}
        assert client.wait_for_run(REFUNDS, ti2["dag_run_id"], RUN_TIMEOUT) == "success"

        # A-1003: rejected in Airflow first; the page then refuses to decide (409)
        third = store.send("customers", "support", "refund.request",
                           {"order": "A-1003", "amount": 9}, format="json").envelope_id
        detail = wait_until(lambda: open_request(client, runtime), RUN_TIMEOUT,
                            "the refund agent to ask a third time")
        ti3 = detail["task_instance"]
        with CommandLedger(store) as ledger:
            waiting3 = ledger.find("support", "refund/A-1003")
        assert waiting3 is not None
        client.request("PATCH", f"/dags/{REFUNDS}/dagRuns/{ti3['dag_run_id']}/taskInstances/"
                       f"agent/-1/hitlDetails",
                       json={"chosen_options": ["Reject"],
                             "params_input": {"reason": "no receipt"}})
        # the page's confirmation now: refused, whether the task has resumed and settled
        # the ledger yet (the command is declined) or not (Airflow's answer came first)
        headers = {"Authorization": f"Bearer {client._login()}"}
        path = f"/agentpost/commands/{waiting3.command_id}/confirm"
        late = client._http.post(path, headers=headers, data={})
        if late.status_code == 200:
            key = re.search(r'name="confirm_key" value="([^"]+)"', late.text)
            assert key is not None, late.text[:2000]
            late = client._http.post(path, headers=headers,
                                     data={"confirm": "yes", "confirm_key": key.group(1)})
        assert late.status_code == 409, late.text[:500]
        told = wait_until(lambda: statuses(store).get("A-1003"), RUN_TIMEOUT,
                          "the customer to hear about A-1003")
        assert (told["status"], told["in_reply_to"]) == ("declined", third)
        with CommandLedger(store) as ledger:
            view = ledger.view(waiting3.command_id)
            evidence = json.dumps([e.body for e in ledger.evidence(view.command_id)])
        assert view.declined and "human:admin" in evidence, view
        with CommandLedger(store) as ledger:
            view = ledger.view(waiting2.command_id)
            declined = [e.body for e in ledger.evidence(view.command_id)
                        if "declined_by" in json.dumps(e.body)]
        assert view.declined and view.state.value == "confirmation_required", view
        assert declined and "human:admin" in json.dumps(declined), declined

        # the desk: both answers reached the newsroom, every inbox of the desk is empty
        def reported() -> list[dict[str, Any]] | None:
            answers = [a for e in store.inbox("newsroom") if e.type == "research.report"
                       for a in json.loads(e.content)["answers"]]
            return answers if {a["by"] for a in answers} >= {"researcher-a",
                                                             "researcher-b"} else None

        answers = wait_until(reported, RUN_TIMEOUT, "the desk's report")
        asks = {e.id: e for e in (store.get(a["answers"]) for a in answers)}
        assert all(e.type == "research.ask" for e in asks.values())
        assert {e.to for e in asks.values()} == {"researcher-a", "researcher-b"}
        assert store.get(request).consumed_at is not None
        wait_until(lambda: not any(store.inbox(w) for w in
                                   ("desk", "researcher-a", "researcher-b")),
                   RUN_TIMEOUT, "the desk's inboxes to empty")
        assert store.verify_trail().ok
    assert not any(port_open(p) for p in runtime.ports)
