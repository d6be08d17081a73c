"""The commands page (issue 13) on a real Airflow API app and a real store: commands run,
failed, compensated and in sagas through the ledger's API; the list, one command, and the
human highway's retry and compensate end to end."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentpost.protocol.commands import CommandState
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.store.sagas import SagaAborted, SagaRunner
from web_support import Web, airflow_web, csrf_from

S = CommandState


@pytest.fixture(scope="module")
def mstore(module_dsn: str) -> Iterator[EnvelopeStore]:
    store = EnvelopeStore(module_dsn)
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    store.register_type("pay", ["agent"], ["agent"])
    for ws in ("desk", "till", "trips"):
        store.create_workspace("agent", workspace_id=ws)
    yield store
    store.close()


@pytest.fixture(scope="module")
def ledger(mstore: EnvelopeStore) -> Iterator[CommandLedger]:
    with CommandLedger(mstore) as ledger:
        yield ledger


@pytest.fixture(scope="module")
def web(module_dsn: str, mstore: EnvelopeStore) -> Iterator[Web]:
    with airflow_web(module_dsn) as web:
        yield web


def _boom() -> None:
    raise RuntimeError("card declined")


def _run(ledger: CommandLedger, ws: str, key: str, fn: Any = lambda: {"ok": 1},
         **kw: Any) -> Any:
    kw = {"action": "book", "mutating": True, "auto_confirm": "low-risk", **kw}
    return ledger.run(ws, key, fn, **kw)


def _rows(text: str, table: str) -> list[str]:
    body = text.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr data-command="([^"]+)"', body)


def _count(store: EnvelopeStore, sql: str, *args: Any) -> int:
    return store.db.scalar(sql, args)


def test_list_is_newest_first_with_filters_and_paging(web: Web, ledger: CommandLedger) -> None:
    """The table lists commands newest first; workspace and state filter it; pages chain
    through `after` without overlap."""
    ids = [_run(ledger, "till", f"list-{i}").command_id for i in range(3)]
    failed = _run(ledger, "till", "list-failed", _boom).command_id
    client = web.client("viewer")
    page = client.get("/agentpost/commands", params={"workspace": "till"}).text
    assert _rows(page, "commands") == [failed, *reversed(ids)]
    page = client.get("/agentpost/commands",
                      params={"workspace": "till", "state": "failed"}).text
    assert _rows(page, "commands") == [failed]
    assert "card declined" in page
    first = client.get("/agentpost/api/commands", params={"workspace": "till", "limit": 2})
    body = first.json()
    assert [c["command_id"] for c in body["commands"]] == [failed, ids[2]]
    second = client.get("/agentpost/api/commands",
                        params={"workspace": "till", "limit": 2, "after": body["next"]})
    assert [c["command_id"] for c in second.json()["commands"]] == [ids[1], ids[0]]
    assert second.json()["next"] is None
    everything = client.get("/agentpost/api/commands", params={"state": "failed"}).json()
    assert failed in [c["command_id"] for c in everything["commands"]]


def _badge(page: str, command_id: str) -> str:
    """The class of a listed command's state badge."""
    row = re.search(rf'<tr data-command="{command_id}">.*?<td class="state">'
                    r'<span class="([^"]+)">(\w+)</span>', page, re.S)
    assert row, command_id
    return row[1]


def test_each_state_has_its_own_badge(web: Web, ledger: CommandLedger) -> None:
    """`failed` must not look like `executed`: a state's badge carries its tone (agentpost.css
    colours each tone) and its name, in the list and on the command's page."""
    executed = _run(ledger, "till", "badge-ok").command_id
    failed = _run(ledger, "till", "badge-failed", _boom).command_id
    waiting = _run(ledger, "till", "badge-waiting", auto_confirm=None).command_id
    page = web.client("viewer").get("/agentpost/commands", params={"workspace": "till"}).text
    badges = {cid: _badge(page, cid) for cid in (executed, failed, waiting)}
    assert badges[executed] == "chip tone-ok state-executed"
    assert badges[failed] == "chip tone-bad state-failed"
    assert badges[waiting].startswith("chip tone-wait state-")
    detail = web.client("viewer").get(f"/agentpost/commands/{failed}").text
    assert '<td id="state"><span class="chip tone-bad state-failed">failed</span>' in detail
    from agentpost.web.display import TONES

    css = (Path(__file__).parents[2] / "plugins/agentpost/web/static/agentpost.css").read_text()
    for tone in set(TONES.values()):
        assert f".chip.tone-{tone} {{" in css, tone


@pytest.mark.parametrize(("params", "message"), [
    ({"state": "exploded"}, "state must be one of"),
    ({"limit": "0"}, "limit"),
    ({"limit": "lots"}, "limit"),
    ({"after": "no-such-command"}, "no command 'no-such-command'"),
    ({"workspace": "x" * 300}, "workspace must be"),
])
def test_bad_filters_are_400_with_a_message(web: Web, params: dict[str, str],
                                           message: str) -> None:
    client = web.client("viewer")
    r = client.get("/agentpost/api/commands", params=params)
    assert r.status_code == 400 and message in r.json()["error"]["message"]
    r = client.get("/agentpost/commands", params=params)
    text = html.unescape(r.text)
    assert r.status_code == 400 and message in text and "Traceback" not in text


def test_unknown_command_is_404(web: Web) -> None:
    client = web.client("viewer")
    r = client.get("/agentpost/api/commands/6d1f5a4e-0000-4000-8000-000000000000")
    assert r.status_code == 404 and "unknown command" in r.json()["error"]["message"]
    assert client.get("/agentpost/commands/nope").status_code == 404


def test_anonymous_is_401(web: Web) -> None:
    assert web.client(None).get("/agentpost/api/commands").status_code == 401


def test_failed_command_shows_state_reason_evidence_and_options(
        web: Web, ledger: CommandLedger) -> None:
    """A failed command: its reason, the last transition (started→failed by its executor),
    the SMCL options of `failed` (retry, reprocess, compensate) and its signed evidence."""
    cid = _run(ledger, "desk", "detail-failed", _boom).command_id
    body = web.client("viewer").get(f"/agentpost/api/commands/{cid}").json()
    assert body["command"]["state"] == "failed"
    assert body["command"]["reason"] == "RuntimeError: card declined"
    assert body["recovery_options"] == ["retry", "reprocess", "compensate"]
    assert body["highway"] == {"retry": None, "compensate": None}
    assert body["last_transition"]["transition"] == "started→failed"
    assert body["last_transition"]["by"] == "executor:desk"
    assert [e["body"]["lifecycle"]["transition"] for e in body["evidence"]] == [
        "received→canonicalized", "canonicalized→authz_pending", "authz_pending→authorized",
        "authorized→started", "started→failed"]
    assert all(len(e["hash"]) == 64 and len(e["mac"]) == 64 for e in body["evidence"])
    page = web.client("viewer").get(f"/agentpost/commands/{cid}").text
    assert 'data-state="failed"' in page
    assert re.findall(r'data-option="(\w+)"', page) == ["retry", "reprocess", "compensate"]
    assert "view only" in page and 'id="retry-form"' not in page  # a viewer cannot act
    acting = web.client("user").get(f"/agentpost/commands/{cid}").text
    assert 'id="retry-form"' in acting and 'id="compensate-form"' in acting


def test_executed_command_offers_only_compensate(web: Web, ledger: CommandLedger) -> None:
    cid = _run(ledger, "desk", "detail-executed", lambda: {"room": 12}).command_id
    body = web.client("viewer").get(f"/agentpost/api/commands/{cid}").json()
    assert body["command"]["outcome"] == {"room": 12}
    assert body["recovery_options"] == ["compensate"]
    assert body["highway"]["compensate"] is None
    assert "SMCL offers no retry for a command in state executed" in body["highway"]["retry"]
    assert body["last_transition"]["transition"] == "started→executed"


def _post(client: Any, path: str, token: str, **fields: str) -> Any:
    return client.post(path, data={"csrf_token": token, **fields})


def test_retry_end_to_end(web: Web, ledger: CommandLedger, mstore: EnvelopeStore) -> None:
    """viewer 403; no CSRF 403; the confirm step writes nothing; confirming submits a retry
    confirmed by the person (human envelope), originator recorded in its evidence; a second
    retry while it waits is 409 and changes nothing."""
    cid = _run(ledger, "desk", "retry-me", _boom, args={"room": 3}).command_id
    path = f"/agentpost/commands/{cid}/retry"
    viewer = web.client("viewer")
    assert _post(viewer, path, web.csrf("viewer")).status_code == 403
    user = web.client("user")
    assert user.post(path, data={"note": "x"}).status_code == 403  # no CSRF token
    before = _count(mstore, "SELECT count(*) FROM agentpost.commands")
    page = user.get(f"/agentpost/commands/{cid}").text
    confirm = _post(user, path, csrf_from(page), note="flaky card API")
    assert confirm.status_code == 200 and 'id="confirm-button"' in confirm.text
    assert "flaky card API" in confirm.text
    assert _count(mstore, "SELECT count(*) FROM agentpost.commands") == before
    key = web.confirm_key("user", path)
    done = _post(user, path, web.csrf("user"), note="flaky card API", confirm="yes",
                 confirm_key=key)
    assert done.status_code == 303
    assert done.headers["location"].startswith(f"/agentpost/commands/{cid}?done=")
    (retry,) = ledger.recoveries(cid)
    assert (retry.kind.value, retry.state, retry.confirmed_by) == ("retry", S.CONFIRMED,
                                                                  "human:user")
    assert retry.args == {"room": 3} and retry.idempotency_key == f"highway:retry/{cid}/{key}"
    first = ledger.evidence(retry.command_id)[0].body
    assert first["context"] == {"originator": "human:user", "via": "agentpost page",
                                "note": "flaky card API"}
    confirmed = next(e.body for e in ledger.evidence(retry.command_id)
                     if e.body["lifecycle"]["transition"]
                     == "confirmation_required→confirmed")
    assert confirmed["confirmed_by"] == "human:user"
    assert confirmed["source"]["user"] == "user"
    sent = mstore.trail(envelope_id=confirmed["source"]["envelope_id"])
    created = next(e for e in sent if e.event == "envelope_created")
    assert (created.chain, created.body["originator"]) == ("human:user", "user")
    assert mstore.verify_trail().ok
    # the waiting retry blocks another one: 409 with the reason, nothing written
    again = _post(user, path, web.csrf("user"), confirm="yes",
                  confirm_key=web.confirm_key("user", path))
    assert again.status_code == 409 and f"retry {retry.command_id} is already confirmed" \
        in html.unescape(again.text)
    assert len(ledger.recoveries(cid)) == 1
    # the DAG's next try (or any holder of the handler) runs the confirmed retry
    assert ledger.execute(retry.command_id, lambda: "worked").state is S.EXECUTED


def test_compensate_end_to_end(web: Web, ledger: CommandLedger,
                               mstore: EnvelopeStore) -> None:
    """A person records the undo they did: the compensate command is confirmed by them and
    executed, the target becomes compensated (its evidence names the compensation), and the
    outcome names the person and the note."""
    cid = _run(ledger, "desk", "undo-me", lambda: {"booked": "room 7"}).command_id
    path = f"/agentpost/commands/{cid}/compensate"
    user = web.client("admin")
    token = web.csrf("admin")
    missing = _post(user, path, token, note="  ")
    assert missing.status_code == 400 and "say what you did" in html.unescape(missing.text)
    assert _post(user, path, token, note="cancelled room 7").status_code == 200
    assert ledger.view(cid).state is S.EXECUTED  # the confirm step changed nothing
    done = _post(user, path, token, note="cancelled room 7", confirm="yes",
                 confirm_key=web.confirm_key("admin", path))
    assert done.status_code == 303
    target = ledger.view(cid)
    assert target.state is S.COMPENSATED and target.outcome == {"booked": "room 7"}
    (comp,) = ledger.recoveries(cid)
    assert (comp.kind.value, comp.state, comp.confirmed_by) == (
        "compensate", S.EXECUTED, "human:admin")
    assert comp.outcome == {"performed_by": "human:admin", "note": "cancelled room 7"}
    last = ledger.evidence(cid)[-1].body
    assert last["lifecycle"]["transition"] == "executed→compensated"
    assert last["compensation_command_id"] == comp.command_id
    assert mstore.verify_trail().ok
    page = web.client("viewer").get(f"/agentpost/commands/{cid}").text
    assert 'data-state="compensated"' in page and comp.command_id in page
    body = web.client("viewer").get(f"/agentpost/api/commands/{cid}").json()
    assert body["recovery_options"] == []
    assert body["last_transition"]["by"] == "executor:desk"
    # compensated offers nothing: 409, nothing written
    count = _count(mstore, "SELECT count(*) FROM agentpost.commands")
    again = _post(user, path, token, note="again", confirm="yes",
                  confirm_key=web.confirm_key("admin", path))
    assert again.status_code == 409
    refused = html.unescape(again.text)
    assert "SMCL offers no compensate for a command in state compensated" in refused
    assert _count(mstore, "SELECT count(*) FROM agentpost.commands") == count


def test_wrong_state_is_409_before_the_confirm_page(web: Web, ledger: CommandLedger,
                                                   mstore: EnvelopeStore) -> None:
    """Retry of an executed command: refused with the reason at the first post."""
    cid = _run(ledger, "desk", "no-retry", lambda: 1).command_id
    trail = _count(mstore, "SELECT count(*) FROM agentpost.trail")
    r = _post(web.client("user"), f"/agentpost/commands/{cid}/retry", web.csrf("user"))
    assert r.status_code == 409
    assert "SMCL offers no retry for a command in state executed" in html.unescape(r.text)
    r = _post(web.client("user"), f"/agentpost/commands/{cid}/retry", web.csrf("user"),
              confirm="yes", confirm_key=web.confirm_key("user",
                                                         f"/agentpost/commands/{cid}/retry"))
    assert r.status_code == 409
    assert _count(mstore, "SELECT count(*) FROM agentpost.trail") == trail
    r = _post(web.client("user"), "/agentpost/commands/unknown-id/retry", web.csrf("user"))
    assert r.status_code == 404


def test_saga_progress_on_a_step_command(web: Web, ledger: CommandLedger) -> None:
    """A step of a saga shows the saga: steps in order, which executed, which compensated."""
    runner = SagaRunner(ledger, {"book": lambda a: {"booked": a["item"]},
                                 "cancel": lambda a: {"canceled": a["item"]}},
                        sleep=lambda s: None)
    saga = runner.begin("trips", "trip-1")
    saga.step("flight", "book", {"item": "flight"}, action="book",
              compensation=("cancel", {"item": "flight"}), auto_confirm="p")
    saga.step("hotel", "book", {"item": "hotel"}, action="book",
              compensation=("cancel", {"item": "hotel"}), auto_confirm="p")
    with pytest.raises(SagaAborted):
        saga.step("payment", _boom, action="pay", auto_confirm="p")
    view = runner.view(saga.view().saga_id)
    flight = view.step("flight").command_id
    body = web.client("viewer").get(f"/agentpost/api/commands/{flight}").json()
    assert body["command"]["state"] == "compensated"
    steps = body["saga"]["steps"]
    assert [(s["name"], s["command_state"], s["compensation"]) for s in steps] == [
        ("flight", "compensated", "compensated"), ("hotel", "compensated", "compensated"),
        ("payment", "failed", "not_needed")]
    assert body["saga"]["state"] == "compensated"
    page = web.client("viewer").get(f"/agentpost/commands/{flight}").text
    assert re.findall(r'data-step="(\w+)" data-compensation="(\w+)"', page) == [
        ("flight", "compensated"), ("hotel", "compensated"), ("payment", "not_needed")]
    # a compensated saga's step that never executed has nothing to undo, and says so
    payment = re.search(r'<tr data-step="payment".*?</tr>', page, re.S)[0]
    assert "not needed" in payment and "pending" not in payment
    # the compensate command of a step links back to the same saga
    comp = ledger.recoveries(flight)[0].command_id
    assert web.client("viewer").get(
        f"/agentpost/api/commands/{comp}").json()["saga"]["saga_id"] == view.saga_id
