"""Each confirmation of the human highway acts once (issue 22), in a real Airflow API app over
a real store: the confirm page carries a single-use key; posting its form again (a double
click, a browser's retry, a replay) lands on what the first post did or is refused, and
nothing is sent, requeued, resolved or recovered twice. A compensation is refused while a
confirmed retry waits; two people compensating one command at once leave one compensate
command, the loser a 409 and nothing written (threads through the page, and processes through
the page's action)."""

from __future__ import annotations

import html
import queue
import re
import threading
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.marks import Agent, Need, Scope
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.protocol.commands import CommandKind, CommandState
from agentpost.protocol.errors import Conflict
from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from agentpost.store.commands import CommandLedger
from agentpost.web.pages.commands import highway_act
from smcl_support import spawn_together
from web_support import Web, confirm_form

S = CommandState
ACTORS = ("user", "op", "admin")


@pytest.fixture(scope="module")
def st(module_dsn: str) -> Iterator[EnvelopeStore]:
    with EnvelopeStore(module_dsn) as store:
        store.define_role("agent")
        store.register_type("book", ["agent"], ["agent"])
        store.register_type("directive", ["agent"], ["agent"])
        store.create_workspace("agent", workspace_id="boss")
        yield store


@pytest.fixture(scope="module")
def ledger(st: EnvelopeStore) -> Iterator[CommandLedger]:
    with CommandLedger(st) as ledger:
        yield ledger


def _inbox(st: EnvelopeStore) -> str:
    return st.create_workspace("agent", parent="boss",
                               workspace_id=f"in-{uuid.uuid4().hex[:8]}").id


def _count(st: EnvelopeStore, sql: str, *args: Any) -> int:
    return st.db.scalar(sql, args)


def _trail_id(st: EnvelopeStore) -> int:
    return st.db.scalar("SELECT coalesce(max(id), 0) FROM agentpost.trail")


def _written_since(st: EnvelopeStore, trail_id: int) -> list[tuple[str, str]]:
    return [tuple(r) for r in st.db.fetchall(
        "SELECT chain, event FROM agentpost.trail WHERE id > %s ORDER BY id", (trail_id,))]


def _confirm_page(client: Any, path: str, role: str, web: Web, **fields: str) -> tuple[
        str, dict[str, str]]:
    """Post the action's form; the confirm page it answers, as its form would be posted."""
    page = client.post(path, data={"csrf_token": web.csrf(role), **fields})
    assert page.status_code == 200 and 'id="confirm-button"' in page.text, page.text
    return confirm_form(page.text)


def _post_at_once(posts: list[tuple[Any, str, dict[str, str]]]) -> list[Any]:
    """Post each (client, url, form) from its own thread, all released together."""
    barrier, answers = threading.Barrier(len(posts)), queue.Queue()

    def post(client: Any, url: str, form: dict[str, str]) -> None:
        barrier.wait(timeout=60)
        answers.put(client.post(url, data=form))

    threads = [threading.Thread(target=post, args=p) for p in posts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [answers.get_nowait() for _ in threads]


def _boom() -> None:
    raise RuntimeError("card declined")


def _failed(ledger: CommandLedger) -> str:
    return ledger.run("boss", f"cmd-{uuid.uuid4().hex[:8]}", _boom, action="book",
                      mutating=True, auto_confirm="low-risk").command_id


# ------------------------------------------------------------------ the single-use key


def test_a_replayed_inject_confirmation_injects_once(web: Web, st: EnvelopeStore) -> None:
    """The confirm page's form posted again, one after the other and twice at once: every
    post lands on the one envelope (its id is the confirmation's key), nothing is sent
    twice."""
    ws = _inbox(st)
    user = web.client("user")
    path = f"/agentpost/inboxes/{ws}/inject"
    url, form = _confirm_page(user, path, "user", web, type="directive", content="go")
    assert form["confirm"] == "yes" and form["confirm_key"]
    first = user.post(url, data=form)
    assert first.status_code == 303
    assert first.headers["location"].startswith(
        f"/agentpost/envelopes/human-{form['confirm_key']}?done=")
    again = user.post(url, data=form)
    assert (again.status_code, again.headers["location"]) == (303, first.headers["location"])
    url, form = _confirm_page(user, path, "user", web, type="directive", content="twice")
    answers = _post_at_once([(web.client("user"), url, form) for _ in range(3)])
    assert {a.status_code for a in answers} == {303}
    assert len({a.headers["location"] for a in answers}) == 1
    contents = [r[0] for r in st.db.fetchall(
        "SELECT content FROM agentpost.envelopes WHERE recipient = %s ORDER BY seq", (ws,))]
    assert contents == ["go", "twice"]


def test_a_confirmation_needs_its_own_valid_key(web: Web, st: EnvelopeStore) -> None:
    """A confirming post without the key, with a made-up one, with one given to another
    person or for another action is a 400 that writes nothing."""
    ws, other = _inbox(st), _inbox(st)
    path = f"/agentpost/inboxes/{ws}/inject"
    form = {"csrf_token": web.csrf("user"), "type": "directive", "content": "x",
            "confirm": "yes"}
    keys = [None, "0" * 32 + "-" + "0" * 24, "not a key",
            web.confirm_key("op", path), web.confirm_key("user", f"/agentpost/inboxes/"
                                                                 f"{other}/inject")]
    for key in keys:
        data = form if key is None else {**form, "confirm_key": key}
        answer = web.client("user").post(path, data=data)
        text = html.unescape(answer.text)
        assert answer.status_code == 400 and "no valid single-use key" in text, key
        assert "Traceback" not in text
    assert _count(st, "SELECT count(*) FROM agentpost.envelopes WHERE recipient = %s",
                  ws) == 0


def test_malformed_inject_content_is_refused_before_confirming(web: Web,
                                                               st: EnvelopeStore) -> None:
    """Content the store would take as malformed (it then keeps no caller-chosen id, so its
    confirmation could not act once) is a 400 at the first post."""
    ws = _inbox(st)
    answer = web.client("user").post(f"/agentpost/inboxes/{ws}/inject", data={
        "csrf_token": web.csrf("user"), "type": "directive", "content": "a\x00b"})
    assert answer.status_code == 400 and "NUL" in html.unescape(answer.text)
    assert _count(st, "SELECT count(*) FROM agentpost.envelopes WHERE recipient = %s",
                  ws) == 0


def _dead_letter(st: EnvelopeStore, ws: str) -> str:
    eid = st.send("boss", ws, "directive", "doomed", priority="urgent").envelope_id
    for _ in range(4):
        [lease] = st.lease(ws, 1, 60)
        st.nack(lease.token)
    assert st.get(eid).status is Status.UNDELIVERABLE
    return eid


def test_a_replayed_requeue_confirmation_requeues_once(web: Web, st: EnvelopeStore) -> None:
    """A requeue's confirmation replayed after the envelope became a dead letter again
    requeues nothing: it lands where the first post did, one `envelope_requeued` entry."""
    ws = _inbox(st)
    eid = _dead_letter(st, ws)
    user = web.client("user")
    url, form = _confirm_page(user, f"/agentpost/inboxes/{ws}/dead-letters/{eid}/requeue",
                              "user", web)
    first = user.post(url, data=form)
    assert first.status_code == 303 and st.get(eid).status is Status.ACKNOWLEDGED
    for _ in range(4):  # dead again
        [lease] = st.lease(ws, 1, 60)
        st.nack(lease.token)
    assert st.get(eid).status is Status.UNDELIVERABLE
    replay = user.post(url, data=form)
    assert replay.status_code == 303 and st.get(eid).status is Status.UNDELIVERABLE
    assert len(st.trail(envelope_id=eid, event="envelope_requeued")) == 1
    assert st.verify_trail().ok


def test_store_requeue_under_a_key_acts_once(st: EnvelopeStore) -> None:
    """The store's own rule: a key requeues once; reused by another person or for another
    envelope it is a Conflict; two calls at once with one key requeue once."""
    ws = _inbox(st)
    eid, other = _dead_letter(st, ws), _dead_letter(st, ws)
    first = st.requeue(ws, eid, "ann", key="k-1")
    assert first["duplicate"] is False and first["envelope_id"] == eid
    with pytest.raises(Conflict, match="already used for another action"):
        st.requeue(ws, other, "ann", key="k-1")
    with pytest.raises(Conflict, match="already used for another action"):
        st.requeue(ws, eid, "bob", key="k-1")
    assert st.requeue(ws, eid, "ann", key="k-1") == {**first, "duplicate": True}
    answers: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=lambda: answers.put(
        st.requeue(ws, other, "ann", key="k-2"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(answers.get_nowait()["duplicate"] for _ in threads) == [False, True, True]
    assert len(st.trail(envelope_id=other, event="envelope_requeued")) == 1


def test_a_replayed_need_resolution_resolves_once(web: Web, st: EnvelopeStore,
                                                  module_dsn: str) -> None:
    """A need resolves once: its confirmation posted twice at once and again later gives
    one resolution; the other posts are 409 with the reason."""
    name = f"web-{uuid.uuid4().hex[:8]}"
    with PostgresMarkSpace(dsn=module_dsn, scopes=[Scope(name="ops")], space=name) as space:
        need = space.write(Agent(name="alice", scopes={"ops": ["need"]}),
                           Need(scope="ops", question="Rotate the keys?"))
        url, form = _confirm_page(web.client("user"),
                                  f"/agentpost/marks/needs/{need}/resolve?space={name}",
                                  "user", web, action_taken="rotated")
        answers = _post_at_once([(web.client("user"), url, form) for _ in range(2)])
        assert sorted(a.status_code for a in answers) == [303, 409]
        assert web.client("user").post(url, data=form).status_code == 409
        copies = [m for m in space.all_marks() if m.supersedes == need]
        assert len(copies) == 1
    resolved = [e for e in st.trail(workspace_id="human:user")
                if e.event == "need_resolved_by_human" and e.body["need_id"] == str(need)]
    assert len(resolved) == 1


def test_a_replayed_retry_confirmation_lands_on_the_same_retry(
        web: Web, st: EnvelopeStore, ledger: CommandLedger) -> None:
    """A retry's confirmation posted again, and twice at once: one retry command, confirmed
    by one envelope; every post lands on the command's page; no refused or duplicate
    evidence."""
    cid = _failed(ledger)
    path = f"/agentpost/commands/{cid}/retry"
    url, form = _confirm_page(web.client("user"), path, "user", web, note="again")
    answers = _post_at_once([(web.client("user"), url, form) for _ in range(2)])
    answers.append(web.client("user").post(url, data=form))
    assert [a.status_code for a in answers] == [303] * 3
    assert {a.headers["location"].split("?")[0] for a in answers} == {
        f"/agentpost/commands/{cid}"}
    (retry,) = ledger.recoveries(cid)
    assert retry.state is S.CONFIRMED
    assert retry.idempotency_key == f"highway:retry/{cid}/{form['confirm_key']}"
    assert _count(st, "SELECT count(*) FROM agentpost.envelopes WHERE type = "
                      "'command.confirmation' AND content::jsonb ->> 'command_id' = %s",
                  retry.command_id) == 1
    kinds = [e.body["lifecycle"]["evidence_type"] for e in ledger.evidence(retry.command_id)]
    assert kinds == ["state_change"] * 3


def test_a_replayed_compensate_confirmation_compensates_once(
        web: Web, st: EnvelopeStore, ledger: CommandLedger) -> None:
    cid = _failed(ledger)
    path = f"/agentpost/commands/{cid}/compensate"
    url, form = _confirm_page(web.client("admin"), path, "admin", web, note="refunded")
    first = web.client("admin").post(url, data=form)
    replay = web.client("admin").post(url, data=form)
    assert (first.status_code, replay.status_code) == (303, 303)
    (undo,) = ledger.recoveries(cid)
    assert undo.state is S.EXECUTED and ledger.view(cid).state is S.COMPENSATED
    assert undo.outcome == {"performed_by": "human:admin", "note": "refunded"}


# ------------------------------------------------------------------ recoveries of one command


def test_a_compensation_is_refused_while_a_confirmed_retry_waits(
        web: Web, st: EnvelopeStore, ledger: CommandLedger) -> None:
    """A person confirms a retry (it waits for its DAG); a compensation is then refused (409,
    at the form and at the confirmation, with the reason), writes nothing, and the page
    offers no compensate; the retry runs as confirmed."""
    cid = _failed(ledger)
    user = web.client("user")
    url, form = _confirm_page(user, f"/agentpost/commands/{cid}/retry", "user", web)
    assert user.post(url, data=form).status_code == 303
    (retry,) = ledger.recoveries(cid)
    trail = _trail_id(st)
    path = f"/agentpost/commands/{cid}/compensate"
    refused = user.post(path, data={"csrf_token": web.csrf("user"), "note": "undone"})
    text = html.unescape(refused.text)
    assert refused.status_code == 409
    assert f"retry {retry.command_id} is already confirmed" in text
    confirmed = user.post(path, data={"csrf_token": web.csrf("user"), "note": "undone",
                                      "confirm": "yes",
                                      "confirm_key": web.confirm_key("user", path)})
    assert confirmed.status_code == 409 and "Traceback" not in confirmed.text
    assert _written_since(st, trail) == []
    assert [r.command_id for r in ledger.recoveries(cid)] == [retry.command_id]
    assert ledger.view(cid).state is S.FAILED
    page = web.client("user").get(f"/agentpost/commands/{cid}").text
    assert 'id="compensate-form"' not in page and 'data-refused="compensate"' in page
    assert ledger.execute(retry.command_id, lambda: "booked").state is S.EXECUTED


def _loser_wrote_nothing(st: EnvelopeStore, trail: int, cid: str, winner: str,
                         person: str) -> None:
    """Since `trail`: the winner's command and its confirmation envelope (its sender's chain
    and the inbox's), the target's compensation; nothing in any loser's name."""
    written = _written_since(st, trail)
    assert {c for c, _ in written} <= {f"command:{winner}", f"command:{cid}",
                                       f"human:{person}", "boss"}, written
    assert not [e for _, e in written if e in ("command_invalid_transition_attempt",
                                               "command_duplicate_delivery")], written
    assert [e for c, e in written if c == f"command:{cid}"] == [
        "command_recovery_requested", "command_state_change"]


def test_two_people_compensating_at_once_compensate_once(
        web: Web, st: EnvelopeStore, ledger: CommandLedger) -> None:
    """Three people confirm a compensation of one command at the same moment: one compensate
    command (executed), the target compensated once, the others a 409 page (no 500) and
    nothing written for them: no command, no envelope, no trail entry."""
    cid = _failed(ledger)
    path = f"/agentpost/commands/{cid}/compensate"
    posts = []
    for role in ACTORS:
        client = web.client(role)
        url, form = _confirm_page(client, path, role, web, note=f"refunded by {role}")
        posts.append((client, url, form))
    trail = _trail_id(st)
    answers = _post_at_once(posts)
    assert sorted(a.status_code for a in answers) == [303, 409, 409], [
        (a.status_code, a.text[:300]) for a in answers]
    assert all("Traceback" not in a.text for a in answers)
    (undo,) = ledger.recoveries(cid)
    assert undo.state is S.EXECUTED and ledger.view(cid).state is S.COMPENSATED
    by = undo.confirmed_by.removeprefix("human:")
    _loser_wrote_nothing(st, trail, cid, undo.command_id, by)
    assert _count(st, "SELECT count(*) FROM agentpost.envelopes WHERE type = "
                      "'command.confirmation' AND content::jsonb ->> 'command_id' = %s",
                  undo.command_id) == 1
    assert st.verify_trail().ok


def _act_in_process(dsn: str, cid: str, person: str, barrier: Any, results: Any) -> None:
    """One person's confirmed compensation, as the page's POST runs it, in its own process."""
    try:
        with EnvelopeStore(dsn) as store:
            barrier.wait(timeout=60)
            highway_act(store, cid, CommandKind.COMPENSATE, person, "refunded",
                        uuid.uuid4().hex)
            results.put(("ok", person))
    except Conflict as exc:
        results.put(("conflict", str(exc)))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def test_processes_compensating_at_once_compensate_once(
        st: EnvelopeStore, ledger: CommandLedger, module_dsn: str) -> None:
    """The same race between API server processes: the page's action in three processes on
    one database; one compensate command, two refusals, nothing written for them."""
    cid = _failed(ledger)
    trail = _trail_id(st)
    reports = spawn_together(_act_in_process, [(module_dsn, cid, p) for p in ACTORS])
    assert sorted(r[0] for r in reports) == ["conflict", "conflict", "ok"], reports
    (winner,) = [r[1] for r in reports if r[0] == "ok"]
    (undo,) = ledger.recoveries(cid)
    assert (undo.state, undo.confirmed_by) == (S.EXECUTED, f"human:{winner}")
    assert ledger.view(cid).state is S.COMPENSATED
    _loser_wrote_nothing(st, trail, cid, undo.command_id, winner)
    assert re.search(r"compensated|standing", " ".join(r[1] for r in reports
                                                         if r[0] == "conflict"))
