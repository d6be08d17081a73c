"""The inboxes pages of the agentpost UI (issue 13), in a real Airflow API app over a real
store: the overview (the app's index) and its JSON, one inbox's page and its JSON, and the
human highway's inject (WACP §3 origin and originator) and dead-letter requeue (WACP §7)
with their confirm step, roles and CSRF. Data is written through the store's API; numbers on
the page are compared with `stats()`, rows with the database.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from agentpost.protocol.models import Origin, Status
from agentpost.store import EnvelopeStore
from agentpost.web.pages.inboxes import millis, number
from dbtools import query

BOSS = "ib-boss"


def worker(st: EnvelopeStore, ws: str) -> str:
    st.create_workspace("worker", parent=BOSS, workspace_id=ws)
    return ws


def send(st: EnvelopeStore, ws: str, n: int, prefix: str = "m",
         priority: str = "normal") -> list[str]:
    ids = []
    for i in range(n):
        result = st.send(BOSS, ws, "directive", f"{prefix}{i}", priority=priority)
        assert result.status is Status.ACKNOWLEDGED, result
        ids.append(result.envelope_id)
    return ids


def dead_letter(st: EnvelopeStore, ws: str) -> str:
    """One envelope of `ws` dead-lettered the way the store's rules say: its fourth return
    (urgent, so it is leased first whatever else waits)."""
    [eid] = send(st, ws, 1, prefix="doomed", priority="urgent")
    for _ in range(4):
        [lease] = st.lease(ws, 1, 60)
        assert lease.envelope.id == eid
        st.nack(lease.token)
    assert st.get(eid).status is Status.UNDELIVERABLE
    return eid


def row_cells(page: str, ws: str) -> dict[str, str]:
    """The overview's cells of inbox `ws`, by class name."""
    row = re.search(rf'<tr data-inbox="{re.escape(ws)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {ws}"
    return {cls: html.unescape(text) for cls, text in
            re.findall(r'<td class="num ([\w-]+)">(.*?)</td>', row.group(1), re.S)}


def expected_cells(st: EnvelopeStore, ws: str) -> dict[str, str]:
    s = st.stats(ws)
    return {"depth": number(s.depth), "in-flight": number(s.in_flight),
            "rate-in": f"{number(s.rate_in)}/s", "rate-out": f"{number(s.rate_out)}/s",
            "p50": millis(s.lat_p50_ms), "p95": millis(s.lat_p95_ms),
            "dead": number(s.dead_lettered)}


def table_ids(page: str, table: str) -> list[str]:
    body = re.search(rf'<table id="{table}">(.*?)</table>', page, re.S)
    assert body, f"no table {table}"
    return re.findall(r'<tr data-envelope="([^"]+)">', body.group(1))


def count_envelopes(dsn: str, ws: str) -> int:
    return query(dsn, "SELECT count(*) FROM agentpost.envelopes WHERE recipient = %s",
                 (ws,))[0][0]


# -- the overview ------------------------------------------------------------------------------

def test_overview_numbers_match_the_stores_stats(web, st):
    """Each inbox's row shows what `stats()` computes: depth, in flight, rates, latency
    percentiles and dead letters, for inboxes in different states."""
    a, b, c = (worker(st, w) for w in ("ov-a", "ov-b", "ov-c"))
    send(st, a, 3)
    st.lease(a, 1, 60)
    send(st, b, 1)
    dead_letter(st, c)
    page = web.client("viewer").get("/agentpost/")
    assert page.status_code == 200
    assert '<table id="inboxes">' in page.text and 'id="live-status"' in page.text
    for ws in (a, b, c):
        shown = row_cells(page.text, ws)
        assert shown.pop("oldest") != ""
        assert shown == expected_cells(st, ws), ws
        assert f'href="/agentpost/inboxes/{ws}"' in page.text
    assert row_cells(page.text, a)["depth"] == "3"
    assert row_cells(page.text, a)["in-flight"] == "1"
    assert row_cells(page.text, c)["dead"] == "1"
    assert row_cells(page.text, c)["depth"] == "0"
    assert row_cells(page.text, b)["oldest"].endswith(" s")


def test_overview_json_and_a_new_inbox_shows_up(web, st):
    """/api/inboxes carries the same cells as the page; an inbox created and fed after the
    page was read appears in the next poll with its envelope."""
    client = web.client("viewer")
    before = client.get("/agentpost/api/inboxes").json()["inboxes"]
    assert "ov-new" not in {r["workspace_id"] for r in before}
    worker(st, "ov-new")
    send(st, "ov-new", 2)
    reply = client.get("/agentpost/api/inboxes")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith(
        "application/json")
    rows = {r["workspace_id"]: r for r in reply.json()["inboxes"]}
    new = rows["ov-new"]
    assert new["cells"]["depth"] == "2" and new["cells"]["in-flight"] == "0"
    cells = dict(new["cells"])
    cells.pop("oldest")
    assert cells == expected_cells(st, "ov-new")
    send(st, "ov-new", 1, prefix="later")
    again = {r["workspace_id"]: r for r in client.get("/agentpost/api/inboxes").json()["inboxes"]}
    assert again["ov-new"]["cells"]["depth"] == "3"


def test_overview_pages_through_many_inboxes(web, st):
    """A page holds PAGE inboxes by id (each reads its stats sample, so the page bounds the
    cost); the next page starts after the last one shown, and the JSON pages alike."""
    from agentpost.web.pages.inboxes import PAGE

    names = [worker(st, f"zz-{i:03d}") for i in range(PAGE + 3)]
    client = web.client("viewer")
    first = client.get("/agentpost/", params={"after": "zz-"}).text
    shown = re.findall(r'<tr data-inbox="([^"]+)">', first)
    assert shown == names[:PAGE]
    link = re.search(r'id="next-page" href="/agentpost/\?after=([^"]+)"', first)
    assert link and link[1] == names[PAGE - 1]
    second = client.get("/agentpost/", params={"after": link[1]}).text
    assert re.findall(r'<tr data-inbox="([^"]+)">', second) == names[PAGE:]
    assert 'id="next-page"' not in second
    body = client.get("/agentpost/api/inboxes", params={"after": names[PAGE - 1]}).json()
    assert [r["workspace_id"] for r in body["inboxes"]] == names[PAGE:]
    assert body["next_after"] is None
    too_long = client.get("/agentpost/api/inboxes", params={"after": "x" * 10_000})
    assert too_long.status_code == 400 and "after" in too_long.json()["error"]["message"]


def test_anonymous_is_refused(web):
    assert web.client(None).get("/agentpost/").status_code == 401
    assert web.client(None).get("/agentpost/api/inboxes").status_code == 401


# -- one inbox ---------------------------------------------------------------------------------

def test_inbox_page_shows_waiting_envelopes_dead_letters_and_charts(web, st):
    ws = worker(st, "pg-a")
    ids = send(st, ws, 4)
    [lease] = st.lease(ws, 1, 60)
    st.ack(lease.token)  # one consumed: not waiting, counts as "out"
    dead = dead_letter(st, ws)
    viewer = web.client("viewer").get(f"/agentpost/inboxes/{ws}")
    assert viewer.status_code == 200
    assert f'<h1 id="inbox-id">{ws}</h1>' in viewer.text
    assert table_ids(viewer.text, "waiting") == ids[1:]
    for eid in ids[1:]:
        assert f'href="/agentpost/envelopes/{eid}"' in viewer.text
    assert table_ids(viewer.text, "dead-letters") == [dead]
    assert "requeue" not in viewer.text.split('<table id="dead-letters">')[1].split("</table>")[0]
    assert 'id="inject-form"' not in viewer.text  # a viewer may not act
    assert "uPlot.iife.min.js" in viewer.text
    hist = json.loads(re.search(r'id="latency-data">(.*?)</script>', viewer.text, re.S)[1])
    assert sum(hist["counts"]) == 2  # the acked one and the dead letter were leased
    assert len(hist["labels"]) == len(hist["counts"]) == len(hist["x"])
    flow = json.loads(re.search(r'id="throughput-data">(.*?)</script>', viewer.text, re.S)[1])
    assert len(flow["x"]) == 60 and sum(flow["in"]) == 5 and sum(flow["out"]) == 1
    user = web.client("user").get(f"/agentpost/inboxes/{ws}")
    assert (f'action="/agentpost/inboxes/{ws}/dead-letters/{dead}/requeue"' in user.text)
    form = re.search(r'<form id="inject-form".*?</form>', user.text, re.S)[0]
    assert f'action="/agentpost/inboxes/{ws}/inject"' in form
    assert 'name="csrf_token" value="' + web.csrf("user") + '"' in form
    for name in ('name="type"', '<textarea name="content"', '<select name="priority"',
                 'name="in_reply_to"'):
        assert name in form


def test_inbox_json_lists_waiting_in_processing_order(web, st):
    ws = worker(st, "pg-b")
    normal = send(st, ws, 2)
    urgent = st.send(BOSS, ws, "directive", "now", priority="urgent").envelope_id
    body = web.client("viewer").get(f"/agentpost/api/inboxes/{ws}").json()
    assert [e["id"] for e in body["waiting"]] == [urgent, *normal]
    assert body["stats"]["depth"] == 3 and body["cells"]["depth"] == "3"
    assert body["waiting"][0]["priority"] == "urgent"
    page = web.client("viewer").get(f"/agentpost/inboxes/{ws}").text
    assert table_ids(page, "waiting") == [urgent, *normal]
    assert table_ids(page, "dead-letters") == [] and 'id="no-dead-letters"' in page


def test_unknown_or_absurd_inbox_is_a_clear_4xx(web):
    client = web.client("viewer")
    missing = client.get("/agentpost/inboxes/no-such-inbox")
    assert missing.status_code == 404 and "unknown workspace" in missing.text
    api = client.get("/agentpost/api/inboxes/no-such-inbox")
    assert api.status_code == 404 and "unknown workspace" in api.json()["error"]["message"]
    nul = client.get("/agentpost/inboxes/a%00b")
    assert nul.status_code == 400 and "Traceback" not in nul.text
    for path in ("/agentpost/inboxes/", "/agentpost/api/inboxes/"):
        absurd = client.get(path + "x" * 10_000)
        assert absurd.status_code in (400, 404), absurd.status_code
        assert "Traceback" not in absurd.text and "psycopg" not in absurd.text


def consumed_ids(page: str) -> list[str]:
    body = re.search(r'<table id="consumed">(.*?)</table>', page, re.S)
    assert body, "no table of consumed envelopes"
    return re.findall(r'<tr data-envelope="([^"]+)" data-seq="\d+">', body[1])


def consume(st: EnvelopeStore, ws: str, n: int) -> list[str]:
    """Lease and ack `n` waiting envelopes of `ws`, in processing order."""
    done = []
    for lease in st.lease(ws, n, 60):
        st.ack(lease.token)
        done.append(lease.envelope.id)
    return done


def test_consumed_envelopes_are_listed_newest_first_a_page_at_a_time(web, st):
    """From an inbox one reaches its consumed envelopes, not only waiting ones and dead
    letters: its page shows the most recent, and a list pages back through all of them by
    key (?before=<seq>), skipping what still waits and what was dead-lettered."""
    from agentpost.web.pages.inboxes import CONSUMED_PAGE, CONSUMED_RECENT

    ws = worker(st, "cons-a")
    ids = send(st, ws, CONSUMED_PAGE + 7)
    eaten = consume(st, ws, CONSUMED_PAGE + 5)  # two still wait
    dead = dead_letter(st, ws)
    newest = list(reversed(eaten))
    client = web.client("viewer")
    page = client.get(f"/agentpost/inboxes/{ws}").text
    assert consumed_ids(page) == newest[:CONSUMED_RECENT]
    assert f'href="/agentpost/inboxes/{ws}/consumed"' in page
    assert table_ids(page, "waiting") == ids[-2:]
    first = client.get(f"/agentpost/inboxes/{ws}/consumed").text
    assert consumed_ids(first) == newest[:CONSUMED_PAGE] and dead not in first
    link = re.search(rf'id="next-page" href="/agentpost/inboxes/{ws}/consumed\?before=(\d+)"',
                     first)
    assert link, "no link to older consumed envelopes"
    second = client.get(f"/agentpost/inboxes/{ws}/consumed", params={"before": link[1]}).text
    assert consumed_ids(second) == newest[CONSUMED_PAGE:] and 'id="next-page"' not in second
    body = client.get(f"/agentpost/api/inboxes/{ws}/consumed").json()
    assert [e["id"] for e in body["consumed"]] == newest[:CONSUMED_PAGE]
    assert body["next_before"] == int(link[1])
    assert body["consumed"][0]["consumed_at"] and body["consumed"][0]["from"] == BOSS


def test_a_page_of_consumed_envelopes_walks_a_bounded_slice(web, st, monkeypatch):
    """However many envelopes wait between consumed ones, one page reads at most
    CONSUMED_WALK of the inbox's deliveries; when the walk ends before the page is full,
    the next page goes on from there, and nothing is skipped or shown twice."""
    from agentpost.web.pages import inboxes

    monkeypatch.setattr(inboxes, "CONSUMED_WALK", 4)
    ws = worker(st, "cons-b")
    first = send(st, ws, 3, prefix="early")
    eaten = consume(st, ws, 3)
    assert eaten == first
    send(st, ws, 6, prefix="waiting")  # the newest six wait: a walk of 4 finds none of them
    client, seen, before = web.client("viewer"), [], None
    for _ in range(5):
        body = client.get(f"/agentpost/api/inboxes/{ws}/consumed",
                          params={} if before is None else {"before": before}).json()
        seen += [e["id"] for e in body["consumed"]]
        before = body["next_before"]
        if before is None:
            break
    assert seen == list(reversed(eaten)) and before is None


@pytest.mark.parametrize("before", ["0", "-3", "x", str(2**64)])
def test_a_bad_consumed_cursor_is_a_400(web, st, before):
    if "cons-c" not in {w.id for w in st.workspaces()}:
        worker(st, "cons-c")
    for path in ("/agentpost/inboxes/cons-c/consumed", "/agentpost/api/inboxes/cons-c/consumed"):
        reply = web.client("viewer").get(path, params={"before": before})
        assert reply.status_code == 400 and "before" in reply.text, reply.text
    missing = web.client("viewer").get("/agentpost/inboxes/no-such-inbox/consumed")
    assert missing.status_code == 404


# -- inject ------------------------------------------------------------------------------------

def _inject(client, ws: str, token: str | None, **fields: str):
    form = {"type": "directive", "content": "hello from a person", "priority": "urgent",
            **fields}
    if token is not None:
        form["csrf_token"] = token
    return client.post(f"/agentpost/inboxes/{ws}/inject", data=form)


def test_inject_end_to_end(web, st, module_dsn):
    """Viewer 403; user without CSRF 403; user with CSRF: the first post only shows the
    confirm page, the second creates the envelope (origin human, originator the user,
    recorded in the trail) and redirects to it."""
    ws = worker(st, "inj-a")
    parent = send(st, ws, 1)[0]
    viewer = _inject(web.client("viewer"), ws, web.csrf("viewer"))
    assert viewer.status_code == 403
    user = web.client("user")
    assert _inject(user, ws, None).status_code == 403
    assert _inject(user, ws, "forged").status_code == 403
    assert count_envelopes(module_dsn, ws) == 1
    confirm = _inject(user, ws, web.csrf("user"), in_reply_to=parent)
    assert confirm.status_code == 200 and 'id="confirm-button"' in confirm.text
    assert "hello from a person" in confirm.text
    assert count_envelopes(module_dsn, ws) == 1  # nothing written yet
    done = _inject(user, ws, web.csrf("user"), in_reply_to=parent, confirm="yes",
                   confirm_key=web.confirm_key("user", f"/agentpost/inboxes/{ws}/inject"))
    assert done.status_code == 303
    found = re.match(r"/agentpost/envelopes/([^?]+)\?done=", done.headers["location"])
    assert found, done.headers["location"]
    envelope = st.get(found[1])
    assert envelope.origin is Origin.HUMAN and envelope.originator == "user"
    assert envelope.sender == "human:user" and envelope.to == ws
    assert envelope.priority.value == "urgent" and envelope.in_reply_to == parent
    assert envelope.content == "hello from a person"
    events = [(e.chain, e.event) for e in st.trail(envelope_id=envelope.id)]
    assert ("human:user", "envelope_created") in events
    assert (ws, "envelope_delivered") in events
    shown = user.get(done.headers["location"])
    assert shown.status_code == 200 and f'<h1 id="envelope-id">{envelope.id}</h1>' in shown.text


def test_rejected_inject_shows_its_reason(web, st):
    """A type the registry does not know is rejected by the runtime (type and structure are
    validated for the human highway too; the reason is one of WACP §9's): the user lands
    on the rejected envelope's page with the reason, not on a 500."""
    ws = worker(st, "inj-b")
    user = web.client("user")
    done = _inject(user, ws, web.csrf("user"), type="no_such_type", confirm="yes",
                   confirm_key=web.confirm_key("user", f"/agentpost/inboxes/{ws}/inject"))
    assert done.status_code == 303
    eid = re.match(r"/agentpost/envelopes/([^?]+)", done.headers["location"])[1]
    assert st.get(eid).status is Status.REJECTED
    page = user.get(done.headers["location"])
    assert page.status_code == 200
    rejection = re.search(r'<p class="notice bad" id="rejection">(.*?)</p>', page.text, re.S)
    assert rejection and st.get(eid).reason in rejection[1]
    # the store keeps no payload of a rejected envelope (docs/design.md): the page says so
    # rather than showing the Python None it reads
    content = re.search(r'<td class="content">(.*?)</td>', page.text, re.S)[1]
    assert "None" not in content and "not kept" in content


@pytest.mark.parametrize(("fields", "message"), [
    ({"priority": "whenever"}, "priority: one of normal, urgent, blocking"),
    ({"content": "   "}, "content: the envelope needs some content"),
    ({"type": ""}, "type: give an envelope type"),
    ({"in_reply_to": "x" * 300}, "in_reply_to: an envelope id of at most 200"),
])
def test_bad_inject_input_is_a_400_that_writes_nothing(web, st, module_dsn, fields, message):
    ws = "inj-bad"
    if ws not in {w.id for w in st.workspaces()}:
        worker(st, ws)
    for confirm in ({}, {"confirm": "yes"}):
        reply = _inject(web.client("user"), ws, web.csrf("user"), **fields, **confirm)
        assert reply.status_code == 400 and message in html.unescape(reply.text)
    assert count_envelopes(module_dsn, ws) == 0


def test_inject_into_an_unknown_inbox_is_404(web):
    reply = _inject(web.client("user"), "nowhere", web.csrf("user"))
    assert reply.status_code == 404 and "unknown workspace" in reply.text


# -- requeue -----------------------------------------------------------------------------------

def _requeue(client, ws: str, eid: str, token: str | None, **extra: str):
    data = {**({"csrf_token": token} if token else {}), **extra}
    return client.post(f"/agentpost/inboxes/{ws}/dead-letters/{eid}/requeue", data=data)


def test_requeue_end_to_end(web, st):
    """A dead letter goes back to its inbox, leasable with a fresh redelivery count; the
    trail records the person; the whole trail still verifies."""
    ws = worker(st, "rq-a")
    eid = dead_letter(st, ws)
    assert st.leasable(ws) == 0
    assert _requeue(web.client("viewer"), ws, eid, web.csrf("viewer")).status_code == 403
    user = web.client("user")
    assert _requeue(user, ws, eid, None).status_code == 403
    confirm = _requeue(user, ws, eid, web.csrf("user"))
    assert confirm.status_code == 200 and 'id="confirm-button"' in confirm.text
    assert st.get(eid).status is Status.UNDELIVERABLE  # nothing done yet
    done = _requeue(user, ws, eid, web.csrf("user"), confirm="yes", confirm_key=web.confirm_key(
        "user", f"/agentpost/inboxes/{ws}/dead-letters/{eid}/requeue"))
    assert done.status_code == 303
    assert done.headers["location"].startswith(f"/agentpost/inboxes/{ws}?done=")
    envelope = st.get(eid)
    assert envelope.status is Status.ACKNOWLEDGED and envelope.redeliveries == 0
    assert envelope.reason is None and st.leasable(ws) == 1
    [entry] = st.trail(envelope_id=eid, event="envelope_requeued")
    assert entry.chain == ws and entry.body["originator"] == "user"
    assert entry.body["origin"] == "human"
    assert entry.body["previous_reason"] == "redelivery_exhausted"
    assert st.verify_trail().ok
    [lease] = st.lease(ws, 1, 60)
    assert lease.envelope.id == eid
    st.ack(lease.token)
    assert st.verify_trail().ok
    page = user.get(done.headers["location"])
    assert eid not in table_ids(page.text, "dead-letters")
    shown = user.get(f"/agentpost/envelopes/{eid}").text
    steps = re.findall(r'<li data-event="(\w+)"', shown)
    assert steps.index("envelope_undeliverable") < steps.index("envelope_requeued") \
        < len(steps) - 1 and steps[-1] == "envelope_consumed"
    assert "<strong>requeued</strong>" in shown and "· by user" in shown
    assert 'data-verified="no"' not in shown


def test_requeue_refusals(web, st):
    """Unknown id 404; an envelope that is not a dead letter, or one of another inbox,
    409; all with a readable message and nothing changed."""
    ws = worker(st, "rq-b")
    other = worker(st, "rq-c")
    live = send(st, ws, 1)[0]
    dead = dead_letter(st, ws)
    user, token = web.client("user"), web.csrf("user")
    missing = _requeue(user, ws, "no-such-envelope", token, confirm="yes")
    assert missing.status_code == 404 and "unknown envelope" in missing.text
    not_dead = _requeue(user, ws, live, token, confirm="yes")
    assert not_dead.status_code == 409 and "not a dead letter" in not_dead.text
    elsewhere = _requeue(user, other, dead, token, confirm="yes")
    assert elsewhere.status_code == 409 and "not a dead letter of the inbox" in elsewhere.text
    assert st.get(dead).status is Status.UNDELIVERABLE
    assert st.trail(envelope_id=dead, event="envelope_requeued") == []
    absurd = _requeue(user, ws, "x" * 10_000, token, confirm="yes")
    assert absurd.status_code in (400, 404) and "Traceback" not in absurd.text


def test_store_requeue_checks_in_the_database(st):
    """The store method refuses on its own (the page's pre-check is only a courtesy):
    not a dead letter, another inbox, unknown."""
    from agentpost.protocol.errors import Conflict, NotFound

    ws = worker(st, "rq-d")
    dead = dead_letter(st, ws)
    with pytest.raises(Conflict, match="belongs to the inbox"):
        st.requeue(BOSS, dead, "alice")
    st.requeue(ws, dead, "alice")
    with pytest.raises(Conflict, match="not a dead letter"):
        st.requeue(ws, dead, "alice")
    with pytest.raises(NotFound):
        st.requeue(ws, "nope", "alice")
    sealed = worker(st, "rq-f")
    dead = dead_letter(st, sealed)
    st.transition(sealed, "closed")
    with pytest.raises(Conflict, match="is closed: nothing can be delivered"):
        st.requeue(sealed, dead, "alice")
    assert st.get(dead).status is Status.UNDELIVERABLE


def test_a_requeued_blocking_dead_letter_closes_the_gate_again(st):
    """A blocking envelope requeued waits in its inbox like a delivered one (WACP §6,
    blocking priority): sends queue behind it, and its ack reopens the inbox."""
    ws = worker(st, "rq-e")
    [gate] = send(st, ws, 1, prefix="gate", priority="blocking")
    for _ in range(4):
        [lease] = st.lease(ws, 1, 60)
        st.nack(lease.token)
    assert st.get(gate).status is Status.UNDELIVERABLE
    st.requeue(ws, gate, "alice")
    behind = st.send(BOSS, ws, "directive", "behind the gate")
    assert behind.status is Status.VALIDATED  # queued, not delivered
    assert [e.id for e in st.inbox(ws)] == [gate]
    [lease] = st.lease(ws, 5, 60)
    assert lease.envelope.id == gate
    st.ack(lease.token)
    assert st.get(behind.envelope_id).status is Status.ACKNOWLEDGED
    assert st.leasable(ws) == 1
