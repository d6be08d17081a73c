"""A person confirms or declines a waiting command (SMCL ``confirmation_required``) on the
agentpost page, in a real Airflow API app over a real store: through the human highway as
``human:<person>``, once per confirmation key, refused (and nothing written) where the
command waits for nothing, the note is not text, or the role may only look. An agent's
command names the Airflow task instance that waits for it; the page answers its approval
request with the same decision (tests/ai/test_ai_standalone.py runs that against a parked
task; here no such task exists and the page says so)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from web_support import Web, confirm_form

BOSS = "boss-decide"


@pytest.fixture(scope="module")
def st(module_dsn: str) -> Iterator[EnvelopeStore]:
    with EnvelopeStore(module_dsn) as store:
        store.define_role("agent")
        store.register_type("refund", ["agent"], ["agent"])
        store.create_workspace("agent", workspace_id=BOSS)
        yield store


def waiting(st: EnvelopeStore, context: dict[str, Any] | None = None) -> str:
    with CommandLedger(st) as ledger:
        view = ledger.submit(BOSS, f"refund/{uuid.uuid4().hex[:8]}", action="refund",
                             mutating=True, args={"order": "A-1"}, context=context)
        return ledger.request_confirmation(view.command_id).command_id


def decide(web: Web, role: str, command_id: str, verb: str, **fields: str) -> tuple[
        Any, str, dict[str, str]]:
    client = web.client(role)
    page = client.post(f"/agentpost/commands/{command_id}/{verb}",
                       data={"csrf_token": web.csrf(role), **fields})
    assert page.status_code == 200 and 'id="confirm-button"' in page.text, page.text
    url, form = confirm_form(page.text)
    return client, url, form


def written(st: EnvelopeStore) -> tuple[int, int]:
    return (st.db.scalar("SELECT count(*) FROM agentpost.trail"),
            st.db.scalar("SELECT count(*) FROM agentpost.envelopes"))


def test_a_person_confirms_on_the_page_once(web: Web, st: EnvelopeStore) -> None:
    """The command's page offers Confirm and Decline; confirming records the person as the
    confirmation's originator; the same confirmation posted again lands on the same page
    and sends no second envelope."""
    command_id = waiting(st)
    shown = web.client("user").get(f"/agentpost/commands/{command_id}")
    assert 'id="confirm-form"' in shown.text and 'id="decline-form"' in shown.text
    assert 'id="waiting-task"' not in shown.text  # no agent's task waits for it
    client, url, form = decide(web, "user", command_id, "confirm")
    first = client.post(url, data=form)
    assert first.status_code == 303, first.text
    landed = first.headers["location"]
    assert landed.startswith(f"/agentpost/commands/{command_id}?") and "done=" in landed
    assert "no+Airflow+task+waits+for+it" in landed  # submitted by no agent's task
    before = written(st)
    again = client.post(url, data=form)
    assert again.status_code == 303
    assert again.headers["location"].split("?")[0] == landed.split("?")[0]
    assert written(st) == before
    with CommandLedger(st) as ledger:
        view = ledger.view(command_id)
    assert (view.state.value, view.confirmed_by) == ("confirmed", "human:user")
    shown = web.client("user").get(f"/agentpost/commands/{command_id}")
    assert 'id="confirm-form"' not in shown.text and "human:user" in shown.text


def test_a_person_declines_and_nothing_is_decided_twice(web: Web, st: EnvelopeStore) -> None:
    """Declining marks the command declined; then neither decision is offered, and posting
    one is a 409 that writes nothing."""
    command_id = waiting(st)
    client, url, form = decide(web, "op", command_id, "decline", note="over the limit")
    assert client.post(url, data=form).status_code == 303
    with CommandLedger(st) as ledger:
        view = ledger.view(command_id)
    assert view.declined and view.state.value == "confirmation_required"
    before = written(st)
    for verb in ("confirm", "decline"):
        late = web.client("op").post(f"/agentpost/commands/{command_id}/{verb}",
                                     data={"csrf_token": web.csrf("op")})
        assert late.status_code == 409 and "declined" in late.text, late.text
    assert written(st) == before
    assert 'id="confirm-form"' not in web.client("op").get(
        f"/agentpost/commands/{command_id}").text


def test_bad_decisions_are_refused_and_write_nothing(web: Web, st: EnvelopeStore) -> None:
    """A viewer may look but not decide (403); an unknown or malformed command id is a 404
    or 400; a note with control characters is a 400; none writes anything."""
    command_id = waiting(st)
    before = written(st)
    viewer = web.client("viewer")
    assert "Your role may only look" in viewer.get(f"/agentpost/commands/{command_id}").text
    assert viewer.post(f"/agentpost/commands/{command_id}/confirm",
                       data={"csrf_token": web.csrf("viewer")}).status_code == 403
    user = web.client("user")
    data = {"csrf_token": web.csrf("user")}
    assert user.post(f"/agentpost/commands/{uuid.uuid4()}/confirm",
                     data=data).status_code == 404
    assert user.post("/agentpost/commands/not%01an-id/confirm",
                     data=data).status_code in (400, 404)
    assert user.post(f"/agentpost/commands/{command_id}/decline",
                     data={**data, "note": "bad\x00note"}).status_code == 400
    assert written(st) == before


def test_an_agents_command_names_its_task_and_the_page_answers_for_it(
        web: Web, st: EnvelopeStore) -> None:
    """A command submitted by an agent's task records the task instance; its page links the
    task, and deciding there tries to answer that task's approval request too: with no such
    task instance in Airflow the ledger's decision is taken and the page says the request was
    not answered."""
    run = {"by": "airflow", "ref": "af:refunds:agent:manual__1",
           "attrs": {"dag_id": "refunds", "task_id": "agent", "run_id": "manual__1",
                     "map_index": -1, "try_number": 1}}
    command_id = waiting(st, {"tool_call": {"tool": "submit_command", "call_id": "c1",
                                            "run": run}})
    shown = web.client("user").get(f"/agentpost/commands/{command_id}")
    assert 'id="waiting-task"' in shown.text
    assert "/dags/refunds/runs/manual__1/tasks/agent" in shown.text
    client, url, form = decide(web, "user", command_id, "confirm")
    done = client.post(url, data=form)
    assert done.status_code == 303
    notice = web.client("user").get(done.headers["location"]).text
    assert "Airflow: the task&#39;s approval request was not answered here" in notice, notice
    with CommandLedger(st) as ledger:
        assert ledger.view(command_id).confirmed_by == "human:user"
