"""The envelope page of the agentpost UI (issue 13), in a real Airflow API app over a real
store: fields, the lifecycle from the trail in order, the thread, and each trail entry
checked on the page (WACP §3 Integrity), which must catch an entry or a row edited in SQL.
"""

from __future__ import annotations

import html
import re
from datetime import UTC

from agentpost.protocol.models import Status
from agentpost.store import EnvelopeStore
from dbtools import query

BOSS = "ev-boss"


def worker(st: EnvelopeStore, ws: str, boss: str = BOSS) -> str:
    st.create_workspace("worker", parent=boss, workspace_id=ws)
    return ws


def send(st: EnvelopeStore, ws: str, content: str, boss: str = BOSS, **kw) -> str:
    result = st.send(boss, ws, "directive", content, **kw)
    assert result.status is Status.ACKNOWLEDGED, result
    return result.envelope_id


def timeline(page: str) -> list[tuple[str, str]]:
    """(event, label) of each step of the lifecycle, in page order."""
    ol = re.search(r'<ol class="timeline" id="lifecycle">(.*?)</ol>', page, re.S)
    assert ol, "no lifecycle"
    return re.findall(r'<li data-event="([\w]+)" data-entry="\d+"><strong>([^<]+)</strong>',
                      ol[1])


def verdicts(page: str) -> dict[int, str]:
    """Trail entry id -> "yes"/"no" as the page shows them."""
    return {int(i): v for i, v in
            re.findall(r'<tr data-entry="(\d+)" data-verified="(yes|no)"[^>]*>', page)}


def field(page: str, cls: str) -> str:
    found = re.search(rf'<td class="{cls}">(.*?)</td>', page, re.S)
    assert found, cls
    return html.unescape(re.sub(r"<[^>]+>", "", found[1])).strip()


def test_envelope_page_fields_and_lifecycle_in_order(web, st):
    """Fields as stored; the timeline lists every trail entry of the envelope in trail
    order: created, delivered, leased, nacked, leased again, consumed by the ack."""
    ws = worker(st, "ev-a")
    eid = send(st, ws, "do the thing", priority="urgent")
    [lease] = st.lease(ws, 1, 60, holder="agent-1")
    st.nack(lease.token)
    [lease] = st.lease(ws, 1, 60, holder="agent-2")
    st.ack(lease.token)
    page = web.client("viewer").get(f"/agentpost/envelopes/{eid}")
    assert page.status_code == 200
    assert f'<h1 id="envelope-id">{eid}</h1>' in page.text
    assert field(page.text, "from") == BOSS and field(page.text, "to") == ws
    assert field(page.text, "type") == "directive"
    assert field(page.text, "origin") == "agent"
    assert field(page.text, "priority") == "urgent"
    assert field(page.text, "status") == "acknowledged, consumed"
    assert field(page.text, "content") == "do the thing"
    assert field(page.text, "in-reply-to") == "–"
    # a human UTC time (the script localises it; the instant is in its datetime attribute)
    created = st.get(eid).timestamp.astimezone(UTC)
    assert field(page.text, "created") == created.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'<time datetime="{created.isoformat(timespec="milliseconds")[:-6]}Z"' in page.text
    stored = st.get(eid)
    assert field(page.text, "originator") == stored.originator
    steps = timeline(page.text)
    assert [e for e, _ in steps] == [e.event for e in st.trail(envelope_id=eid)]
    labels = [label for _, label in steps if label != "signal"]
    assert labels == ["created", "delivered", "leased", "nacked", "leased", "consumed"]
    assert "by agent-1 (attempt 1)" in page.text and "acked by agent-2" in page.text
    ol = re.search(r'<ol class="timeline" id="lifecycle">(.*?)</ol>', page.text, re.S)[1]
    times = re.findall(r'<time datetime="([^"]+)" title="([^"]+) UTC" data-ms="1">', ol)
    assert len(times) == len(steps) and [t for t, _ in times] == sorted(t for t, _ in times)


def test_thread_links_ancestors_and_replies(web, st):
    ws = worker(st, "ev-b")
    root = send(st, ws, "root")
    middle = send(st, ws, "middle", in_reply_to=root)
    leaf = send(st, ws, "leaf", in_reply_to=middle)
    other_leaf = send(st, ws, "leaf 2", in_reply_to=middle)
    page = web.client("viewer").get(f"/agentpost/envelopes/{leaf}").text
    ancestors = re.search(r'<ol id="ancestors">(.*?)</ol>', page, re.S)[1]
    assert re.findall(r'href="/agentpost/envelopes/([^"]+)"', ancestors) == [root, middle]
    page = web.client("viewer").get(f"/agentpost/envelopes/{middle}").text
    replies = re.search(r'<ul id="replies">(.*?)</ul>', page, re.S)[1]
    assert re.findall(r'href="/agentpost/envelopes/([^"]+)"', replies) == [leaf, other_leaf]
    ancestors = re.search(r'<ol id="ancestors">(.*?)</ol>', page, re.S)[1]
    assert re.findall(r'href="/agentpost/envelopes/([^"]+)"', ancestors) == [root]


def test_every_entry_verifies_and_the_json_variant(web, st):
    ws = worker(st, "ev-c")
    eid = send(st, ws, "check me")
    [lease] = st.lease(ws, 1, 60)
    st.ack(lease.token)
    client = web.client("viewer")
    page = client.get(f"/agentpost/envelopes/{eid}").text
    shown = verdicts(page)
    assert set(shown) == {e.id for e in st.trail(envelope_id=eid)}
    assert set(shown.values()) == {"yes"}
    assert "The row matches what its entries signed." in page
    body = client.get(f"/agentpost/api/envelopes/{eid}").json()
    assert body["envelope"]["id"] == eid and body["envelope"]["from"] == BOSS
    assert body["all_verified"] is True and body["row_problems"] == []
    assert [e["event"] for e in body["entries"]] == [e.event for e in st.trail(envelope_id=eid)]


def test_a_tampered_entry_shows_as_failing(web, st, module_dsn):
    """An entry whose body was edited in SQL fails its hash on the page; one whose hash was
    replaced too fails its signature; the entry after it (same chain) fails through its
    predecessor. Untouched entries of the envelope still verify. (Chains of their own, so
    the other tests' entries are not behind a broken link.)"""
    boss = st.create_workspace("coordinator", workspace_id="ev-boss-d").id
    ws = worker(st, "ev-d", boss)
    eid = send(st, ws, "tamper with me", boss)
    [lease] = st.lease(ws, 1, 60, holder="honest")
    st.ack(lease.token)
    entries = {e.event: e for e in st.trail(envelope_id=eid)}
    leased = entries["envelope_leased"]
    query(module_dsn, "UPDATE agentpost.trail SET record = replace(record, 'honest', 'forger')"
                      " WHERE id = %s RETURNING id", (leased.id,))
    page = web.client("viewer").get(f"/agentpost/envelopes/{eid}").text
    shown = verdicts(page)
    assert shown[leased.id] == "no"
    assert "hash does not match the entry&#39;s content" in page
    assert shown[entries["envelope_consumed"].id] == "no"  # its predecessor fails
    assert "its predecessor" in page
    assert shown[entries["envelope_created"].id] == "yes"
    assert 'id="trail-verdict" class="bad"' in page

    created = entries["envelope_created"]
    query(module_dsn, "UPDATE agentpost.trail SET hash = sha256(convert_to(record, 'UTF8'))"
                      " WHERE id = %s RETURNING id", (created.id,))
    page = web.client("viewer").get(f"/agentpost/envelopes/{eid}").text
    assert verdicts(page)[created.id] == "no"


def test_an_edited_row_shows_against_its_entries(web, st, module_dsn):
    """The row itself edited in SQL (priority raised) is reported against what the trail
    signed, while the entries themselves still verify."""
    ws = worker(st, "ev-e")
    eid = send(st, ws, "row edit")
    query(module_dsn, "UPDATE agentpost.envelopes SET priority = 'blocking' WHERE id = %s"
                      " RETURNING id", (eid,))
    page = web.client("viewer").get(f"/agentpost/envelopes/{eid}").text
    assert set(verdicts(page).values()) == {"yes"}
    problems = re.search(r'<ul id="row-problems" class="bad">(.*?)</ul>', page, re.S)
    assert problems and "priority" in problems[1] and "blocking" in problems[1]


def test_lookup_redirects_and_bad_ids_are_clear_4xx(web, st):
    client = web.client("viewer")
    ws = worker(st, "ev-f")
    eid = send(st, ws, "find me")
    found = client.get("/agentpost/envelopes", params={"id": eid})
    assert found.status_code == 303 and found.headers["location"] == f"/agentpost/envelopes/{eid}"
    assert client.get("/agentpost/envelopes").status_code == 400
    blank = client.get("/agentpost/envelopes", params={"id": "  "})
    assert blank.status_code == 400 and "give an envelope id" in blank.text
    missing = client.get("/agentpost/envelopes/no-such-envelope")
    assert missing.status_code == 404
    assert "unknown envelope" in html.unescape(missing.text)
    api = client.get("/agentpost/api/envelopes/no-such-envelope")
    assert api.status_code == 404 and "unknown envelope" in api.json()["error"]["message"]
    for path in ("/agentpost/envelopes/", "/agentpost/api/envelopes/"):
        absurd = client.get(path + "x" * 10_000)
        assert absurd.status_code in (400, 404), absurd.status_code
        assert "Traceback" not in absurd.text and "psycopg" not in absurd.text
    assert client.get("/agentpost/envelopes", params={"id": "x" * 10_000}).status_code == 400
    nul = client.get("/agentpost/envelopes/a%00b")
    assert nul.status_code == 400 and "Traceback" not in nul.text
    assert web.client(None).get(f"/agentpost/envelopes/{eid}").status_code == 401
