"""The mark space pages and "resolve a need" (docs/ui.md, "The mark space" and "Resolve a
need"), in a real Airflow API app over a real PostgresMarkSpace written through its API.

Marks are written with the space's clock fixed twenty minutes back, so observations and
warnings have visibly decayed when the page renders at wall time; the page states its
render clock (data-now) and the test asks the space for `strength_of` at that clock.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import psycopg2
import pytest

from agentpost.marks import (
    Action,
    Agent,
    ConflictPolicy,
    DecayConfig,
    Guard,
    Intent,
    Need,
    Observation,
    Scope,
    Source,
    Warning,
    hours,
)
from agentpost.marks.postgres import PostgresMarkSpace
from agentpost.protocol.errors import Conflict
from agentpost.store import EnvelopeStore
from agentpost.web.pages.marks import PEOPLE, decay_series, resolve_need, strength_at
from web_support import confirm_form, csrf_from

T0 = time.time() - 1200
SCOPES = [Scope(name="ops", decay=DecayConfig(observation_half_life=600,
                                              warning_half_life=300, intent_ttl=hours(2))),
          Scope(name="lot", deferred=True, conflict_policy=ConflictPolicy.HIGHEST_CONFIDENCE,
                decay=DecayConfig(intent_ttl=hours(2)))]
ALL = ["intent", "action", "observation", "warning", "need"]
ALICE = Agent(name="alice", scopes={"ops": ALL, "lot": ALL})
BOB = Agent(name="bob", scopes={"ops": ALL, "lot": ALL})


@pytest.fixture
def space(module_dsn: str) -> Iterator[PostgresMarkSpace]:
    with PostgresMarkSpace(dsn=module_dsn, scopes=SCOPES, clock=T0,
                           space=f"web-{uuid.uuid4().hex[:8]}") as s:
        yield s


def _fill(space: PostgresMarkSpace) -> dict[str, Any]:
    """One mark of every type in scope ops, a warned and a superseded observation."""
    ids: dict[str, Any] = {}
    ids["obs"] = space.write(ALICE, Observation(scope="ops", topic="disk", content={"f": 1}))
    ids["ext"] = space.write(BOB, Observation(scope="ops", topic="cpu", initial_strength=0.8,
                                              source=Source.EXTERNAL_VERIFIED))
    space.set_clock(T0 + 100)
    ids["warn"] = space.write(BOB, Warning(scope="ops", topic="disk", invalidates=ids["obs"],
                                           initial_strength=0.3))
    ids["old"] = space.write(ALICE, Observation(scope="ops", topic="net"))
    ids["new"] = space.write(ALICE, Observation(scope="ops", topic="net",
                                                supersedes=ids["old"]))
    ids["intent"] = space.write(ALICE, Intent(scope="ops", resource="db", action="migrate"))
    ids["action"] = space.write(BOB, Action(scope="ops", resource="db", action="backup"))
    ids["need"] = space.write(ALICE, Need(scope="ops", question="Rotate the keys?",
                                          priority=0.7, context={"resource": "keys"}))
    return ids


def _json(page: str, element: str) -> Any:
    found = re.search(rf'<script type="application/json" id="{element}">(.*?)</script>',
                      page, re.S)
    assert found, f"no #{element} in the page"
    return json.loads(html.unescape(found.group(1)))


def _render_now(page: str) -> float:
    return float(re.search(r'id="render-now" data-now="([^"]+)"', page).group(1))


def _server_strengths(page: str) -> dict[str, float]:
    rows = re.findall(r'<tr data-mark="([^"]+)".*?data-strength="([^"]+)"', page, re.S)
    return {mark: float(value) for mark, value in rows}


def _url(space: PostgresMarkSpace, **extra: str) -> str:
    query = "&".join(f"{k}={quote(v)}" for k, v in {"space": space.space, **extra}.items())
    return f"/agentpost/marks?{query}"


# --------------------------------------------------------------------------- the pages


def test_spaces_are_listed_with_their_counts(web: Any, space: PostgresMarkSpace) -> None:
    _fill(space)
    page = web.client("viewer").get("/agentpost/marks")
    assert page.status_code == 200
    row = re.search(rf'<tr data-space="{space.space}">.*?<td class="num">(\d+)', page.text,
                    re.S)
    assert row and int(row.group(1)) == len(space) == 8


def test_strengths_match_the_store_at_the_render_clock(web: Any,
                                                       space: PostgresMarkSpace) -> None:
    ids = _fill(space)
    page = web.client("viewer").get(_url(space, scope="ops"))
    assert page.status_code == 200, page.text
    now = _render_now(page.text)
    shown = _server_strengths(page.text)
    assert set(shown) == {str(i) for i in ids.values()}
    order = re.findall(r'<tr data-mark="[^"]+" data-seq="(\d+)"', page.text)
    assert [int(s) for s in order] == sorted((int(s) for s in order), reverse=True)
    space.set_clock(now)
    for mark_id, value in shown.items():
        assert value == pytest.approx(space.strength_of(space.get(uuid.UUID(mark_id))),
                                      abs=1e-6)
    assert 0 < shown[str(ids["obs"])] < 0.3  # decayed and warned
    assert shown[str(ids["old"])] == 0.0  # superseded
    assert shown[str(ids["action"])] == 1.0


def test_decay_terms_are_embedded_and_give_the_same_strength(
        web: Any, space: PostgresMarkSpace) -> None:
    ids = _fill(space)
    page = web.client("viewer").get(_url(space, scope="ops")).text
    decay, now = _json(page, "mark-decay"), _render_now(page)
    obs, ext = decay[str(ids["obs"])], decay[str(ids["ext"])]
    assert (obs["type"], obs["half_life"], obs["created"]) == ("observation", 600, T0)
    assert obs["warnings"] == [[0.3, T0 + 100, 300]]
    assert ext["trust"] == 0.7 and decay[str(ids["intent"])]["ttl"] == hours(2)
    assert decay[str(ids["old"])]["superseded"] is True
    space.set_clock(now + 90)  # the browser's clock a minute and a half later
    for mark_id, terms in decay.items():
        expected = space.strength_of(space.get(uuid.UUID(mark_id)))
        assert strength_at(terms, now + 90) == pytest.approx(expected, abs=1e-9)
    assert "function markStrength" in page and "setInterval(tick, 1000)" in page


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_the_browser_formula_is_the_store_formula(web: Any, space: PostgresMarkSpace) -> None:
    """The page's own markStrength, run by node on the embedded terms, at later clocks."""
    _fill(space)
    page = web.client("viewer").get(_url(space, scope="ops")).text
    decay, now = _json(page, "mark-decay"), _render_now(page)
    script = re.search(r"(function markStrength.*?\n})\n", page, re.S).group(1)
    clocks = [now, now + 30, now + 3600]
    program = (f"{script}\nconst d = {json.dumps(decay)};\n"
               f"console.log(JSON.stringify(Object.fromEntries(Object.entries(d).map("
               f"([k, v]) => [k, {json.dumps(clocks)}.map(t => markStrength(v, t))]))));")
    out = subprocess.run(["node", "-e", program], capture_output=True, text=True, timeout=60,
                         check=True)
    for mark_id, values in json.loads(out.stdout).items():
        mark = space.get(uuid.UUID(mark_id))
        for clock, value in zip(clocks, values, strict=True):
            space.set_clock(clock)
            assert value == pytest.approx(space.strength_of(mark), abs=1e-9)


def test_the_json_variant_carries_the_same_view(web: Any, space: PostgresMarkSpace) -> None:
    ids = _fill(space)
    body = web.client("viewer").get(_url(space, scope="ops").replace("/marks", "/api/marks"))
    assert body.status_code == 200
    data = body.json()
    assert data["scope"] == "ops" and [s["scope"] for s in data["scopes"]] == ["ops"]
    by_id = {m["id"]: m for m in data["marks"]}
    space.set_clock(data["now"])
    assert by_id[str(ids["ext"])]["strength"] == pytest.approx(
        space.strength_of(space.get(ids["ext"])), abs=1e-6)
    assert by_id[str(ids["intent"])]["about"] == "migrate db"


def test_default_view_shows_newest_marks_of_every_scope(web: Any,
                                                        space: PostgresMarkSpace) -> None:
    _fill(space)
    parked = space.write(ALICE, Intent(scope="lot", resource="spot-9", action="park"))
    page = web.client("viewer").get(_url(space)).text
    shown = list(_server_strengths(page))
    assert shown[0] == str(parked) and len(shown) == 9
    assert re.findall(r'<tr data-scope="([^"]+)"', page) == ["lot", "ops"]


def test_paging_goes_back_in_write_order(web: Any, space: PostgresMarkSpace) -> None:
    written = [space.write(ALICE, Observation(scope="ops", topic=f"t{k}")) for k in range(55)]
    client = web.client("viewer")
    first = client.get(_url(space, scope="ops")).text
    assert list(_server_strengths(first)) == [str(i) for i in reversed(written)][:50]
    older = re.search(r'id="older" href="([^"]+)"', first).group(1)
    second = client.get(html.unescape(older)).text
    assert list(_server_strengths(second)) == [str(i) for i in reversed(written[:5])]
    assert 'id="older"' not in second


def test_intents_conflicts_and_verdicts(web: Any, space: PostgresMarkSpace) -> None:
    guard = Guard(space)
    guard.pre_action(ALICE, "lot", "spot-1", "park", 0.9)
    guard.pre_action(BOB, "lot", "spot-1", "park", 0.4)
    guard.pre_action(ALICE, "lot", "spot-2", "park", 0.3)
    guard.pre_action(BOB, "lot", "spot-2", "park", 0.8)
    verdicts = guard.resolve_deferred("lot", "spot-2")
    assert {a: v.verdict.value for a, v in verdicts.items()} == {
        ALICE.id: "blocked", BOB.id: "allow"}
    page = web.client("viewer").get(_url(space, scope="lot")).text
    intents = re.findall(r'<tr data-intent="[^"]+" data-resource="([^"]+)"( class="warn")?>'
                         r'.*?<td class="verdict">([^<]+)</td>', page, re.S)
    assert sorted(intents) == [("spot-1", ' class="warn"', "pending")] * 2 + [
        ("spot-2", "", "lost"), ("spot-2", "", "won")]
    assert page.count('class="chip pending-conflict"') == 1
    outcomes = re.findall(r'data-agent="([^"]+)">.*?<td class="outcome">([^<]+)', page, re.S)
    assert sorted(outcomes) == sorted([(str(ALICE.id), "lost"), (str(BOB.id), "won")])
    assert _json(page, "outcome-data") == [["won", "won, acted", "lost", "no winner"],
                                           [1, 0, 1, 0]]
    assert "uPlot.iife.min.js" in page and "agentpost.chart(" in page


def test_need_clusters_by_effective_priority(web: Any, space: PostgresMarkSpace) -> None:
    space.write(ALICE, Need(scope="ops", question="Approve the budget?", priority=0.4))
    space.write(BOB, Need(scope="ops", question="approve the budget", priority=0.6,
                          blocking=True))
    space.write(ALICE, Need(scope="ops", question="Restart the fleet?", priority=0.9))
    page = web.client("viewer").get(_url(space, scope="ops")).text
    shown = [float(p) for p in re.findall(r'<tr class="cluster" data-priority="([^"]+)"', page)]
    # the page clusters a scope's needs by similar question (aggregate_needs() groups a whole
    # scope, as the markspace package does), so the expected priorities are spelled out
    assert shown == pytest.approx([0.9, 0.6 + 0.1 * 0.6931471805599453])
    assert "1 blocking" in page
    assert page.count('name="action_taken"') == 0  # a viewer gets no forms
    assert web.client("user").get(_url(space, scope="ops")).text.count(
        'name="action_taken"') == 3


def test_mark_page_charts_the_decay_law(web: Any, space: PostgresMarkSpace) -> None:
    ids = _fill(space)
    page = web.client("viewer").get(f"/agentpost/marks/{ids['obs']}?space={space.space}")
    assert page.status_code == 200
    xs, ys = _json(page.text, "decay-data")
    assert xs[0] == T0 and xs[-1] == pytest.approx(T0 + 600 * 6.643856189774724)
    for k in (0, 7, 30, 60, 120):
        space.set_clock(xs[k])
        assert ys[k] == pytest.approx(space.strength_of(space.get(ids["obs"])), abs=1e-6)
    assert ys[-1] < 0.01
    assert 'data-field="topic"' in page.text and "disk" in page.text
    terms = _json(page.text, "decay-terms")
    assert decay_series(terms, _render_now_mark(page.text)) == [xs, ys]
    intent = web.client("viewer").get(f"/agentpost/marks/{ids['intent']}?space={space.space}")
    xs, ys = _json(intent.text, "decay-data")
    assert ys[0] == 1.0 and ys[-1] == 0.0 and xs[-1] == pytest.approx(T0 + 100 + 3 * 3600)


#: unix seconds of this century, which a page must never show a person
EPOCH = re.compile(r"\b1[6-9]\d{8}(?:\.\d+)?\b")


def _visible(page: str) -> str:
    """The text a person reads: no scripts (the embedded JSON), no tags or attributes."""
    text = re.sub(r"<script\b.*?</script>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", text))


def test_times_are_human_never_epoch_seconds(web: Any, space: PostgresMarkSpace) -> None:
    """The mark space keeps unix seconds; the pages show a <time> with a human UTC time (the
    script localises it), the exact instant in its datetime attribute."""
    ids = _fill(space)
    page = web.client("viewer").get(_url(space, scope="ops")).text
    clock = re.search(r'<time id="render-now" data-now="([^"]+)" datetime="([^"]+)" '
                      r'title="([^"]+)">([^<]+)</time>', page)
    assert clock, "the render clock is not a <time>"
    at = datetime.fromtimestamp(float(clock[1]), UTC)
    assert clock[4] == at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert clock[2] == at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert not EPOCH.findall(_visible(page))
    mark = web.client("viewer").get(f"/agentpost/marks/{ids['obs']}?space={space.space}").text
    created = re.search(r'<tr data-field="created_at"><th>created at</th><td>(.*?)</td>',
                        mark, re.S)[1]
    assert datetime.fromtimestamp(T0, UTC).strftime("%Y-%m-%d %H:%M:%S") in created
    assert "<time datetime=" in created
    assert re.search(r'data-field="half_life"><th>half life</th><td>\s*10 min</td>', mark)
    assert not EPOCH.findall(_visible(mark))


def _forget_names(dsn: str) -> None:
    """Drop every recorded name (pages look ids up in any space): the store's marks then
    look as if written before sql/0076."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM agentpost.mark_agents")
    conn.close()


def test_agents_are_named_where_the_store_knows_the_name(
        web: Any, space: PostgresMarkSpace, module_dsn: str) -> None:
    """With no recorded names (marks from before sql/0076), the names are derived: an agent
    of a fleet (its id derived from space and name), an operator's agent given by name, and
    the signed-in person are shown by name wherever a mark, intent or verdict names them; an
    agent with a random id keeps its id (shortened, whole on hover)."""
    from agentpost.fleet.model import AGENT_NAMESPACE
    from agentpost.operators.marks import stable_agent

    driver, clerk = f"{space.space}-driver", f"{space.space}-clerk"
    with EnvelopeStore(module_dsn) as st:
        for ws in (driver, clerk):
            st.create_workspace("coordinator", workspace_id=ws)
    fleet_agent = Agent(id=uuid.uuid5(AGENT_NAMESPACE, f"{space.space}/{driver}"), name=driver,
                        scopes={"ops": ALL, "lot": ALL})
    named = {driver: fleet_agent, clerk: stable_agent(clerk, {"ops": ALL, "lot": ALL}),
             "human:viewer": Agent(id=uuid.uuid5(PEOPLE, "viewer"), name="human:viewer",
                                   scopes={"ops": ALL})}
    for agent in named.values():
        space.write(agent, Observation(scope="ops", topic="disk"))
    space.write(ALICE, Observation(scope="ops", topic="disk"))
    guard = Guard(space)
    guard.pre_action(fleet_agent, "lot", "spot-1", "park", 0.9)
    guard.pre_action(named[clerk], "lot", "spot-1", "park", 0.4)
    guard.resolve_deferred("lot", "spot-1")
    _forget_names(module_dsn)
    page = web.client("viewer").get(_url(space)).text
    text = _visible(page)
    for name, agent in named.items():
        assert f'<span class="agent" data-agent-id="{agent.id}"' in page, name
        assert name in text and str(agent.id)[:8] not in text, name
    for table in ("intents", "verdicts"):
        body = re.search(rf'<table id="{table}">(.*?)</table>', page, re.S)[1]
        assert driver in _visible(body) and clerk in _visible(body), table
    unnamed = re.search(rf'<code class="agent unnamed" data-agent-id="{ALICE.id}" '
                        r'title="([^"]+)">([^<]+)</code>', page)
    assert unnamed and str(ALICE.id) in unnamed[1] and unnamed[2] == str(ALICE.id)[:8] + "…"
    newest = re.search(r'<tr data-mark="([^"]+)"', page)[1]  # the clerk's intent
    mark = web.client("viewer").get(f"/agentpost/marks/{newest}?space={space.space}").text
    agent_field = re.search(r'data-field="agent_id">(.*?)</tr>', mark, re.S)[1]
    assert clerk in _visible(agent_field) and str(named[clerk].id) in agent_field


def test_recorded_names_name_any_agent_the_newest_name_first(
        web: Any, space: PostgresMarkSpace) -> None:
    """Every write records its agent's name (sql/0076), so the pages name agents the
    derivation cannot: a fleet's `weather-poller`, whose name is no workspace id, and an
    agent with a random id, in marks, intents, verdicts and a mark's own page, never as a
    cut id. An agent that writes under a new name (the same id) shows the newest."""
    from agentpost.fleet.model import AGENT_NAMESPACE

    poller = Agent(id=uuid.uuid5(AGENT_NAMESPACE, f"{space.space}/weather-poller"),
                   name="weather-poller", scopes={"ops": ALL, "lot": ALL})
    porter = Agent(name="night-porter", scopes={"ops": ALL, "lot": ALL})  # a uuid4 id
    observed = space.write(poller, Observation(scope="ops", topic="rain"))
    space.write(porter, Observation(scope="ops", topic="doors"))
    guard = Guard(space)
    guard.pre_action(poller, "lot", "spot-9", "park", 0.9)
    guard.pre_action(porter, "lot", "spot-9", "park", 0.4)
    guard.resolve_deferred("lot", "spot-9")
    porter = Agent(id=porter.id, name="day-porter", scopes={"ops": ALL})
    porters = space.write(porter, Observation(scope="ops", topic="doors"))
    page = web.client("viewer").get(_url(space)).text
    text = _visible(page)
    for name, agent in (("weather-poller", poller), ("day-porter", porter)):
        assert f'<span class="agent" data-agent-id="{agent.id}"' in page, name
        assert name in text and str(agent.id)[:8] not in text, name
    assert "night-porter" not in text, "the newest name is shown"
    for table in ("intents", "verdicts"):
        body = _visible(re.search(rf'<table id="{table}">(.*?)</table>', page, re.S)[1])
        assert "weather-poller" in body and "day-porter" in body, table
    for mark, name in ((observed, "weather-poller"), (porters, "day-porter")):
        one = web.client("viewer").get(f"/agentpost/marks/{mark}?space={space.space}").text
        assert name in _visible(re.search(r'data-field="agent_id">(.*?)</tr>', one, re.S)[1])


def _render_now_mark(page: str) -> float:
    return float(re.search(r'id="strength-now" data-now="([^"]+)"', page).group(1))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("path", "code", "message"), [
    ("/agentpost/marks?space=no-such-space", 404, "no mark space"),
    ("/agentpost/marks?space=", 400, "space"),
    ("/agentpost/marks?space={s}&scope=a//b", 400, "scope"),
    ("/agentpost/marks?space={s}&scope=elsewhere", 404, "no marks in scope"),
    ("/agentpost/marks?space={s}&scope=ops&before=0", 400, "before"),
    ("/agentpost/marks?space={s}&scope=ops&before=x", 400, "before"),
    ("/agentpost/marks/not-a-uuid?space={s}", 400, "not a mark id"),
    ("/agentpost/marks/5f0c2a6e-4b1d-4c8e-9a3f-2d7e8b1c0a94?space={s}", 404, "no mark"),
    ("/agentpost/marks/{obs}?space=other", 404, "no mark"),
    ("/agentpost/marks/{obs}", 400, "space"),
])
def test_bad_input_is_a_clean_4xx(web: Any, space: PostgresMarkSpace, path: str, code: int,
                                  message: str) -> None:
    ids = _fill(space)
    url = path.format(s=space.space, obs=ids["obs"])
    page = web.client("viewer").get(url)
    assert page.status_code == code
    assert message in html.unescape(page.text) and "Traceback" not in page.text
    api = web.client("viewer").get(url.replace("/agentpost/marks", "/agentpost/api/marks", 1))
    if "/marks/" not in url:
        assert api.status_code == code and message in api.json()["error"]["message"]


def test_anonymous_is_refused(web: Any, space: PostgresMarkSpace) -> None:
    assert web.client(None).get(_url(space)).status_code == 401


# --------------------------------------------------------------------------- resolve a need


def _resolve(web: Any, role: str, marks: PostgresMarkSpace, need: Any, **form: str) -> Any:
    return web.client(role).post(
        f"/agentpost/marks/needs/{need}/resolve?space={marks.space}", data=form)


def _mark_count(dsn: str, space: str) -> int:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM agentpost.marks WHERE space = %s", (space,))
        return cur.fetchone()[0]


def _trail(dsn: str, chain: str) -> list[tuple[str, dict[str, Any]]]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT event, record FROM agentpost.trail WHERE chain = %s "
                    "ORDER BY chain_seq", (chain,))
        return [(e, json.loads(r)["body"]) for e, r in cur.fetchall()]


def test_resolve_a_need_end_to_end(web: Any, space: PostgresMarkSpace,
                                   module_dsn: str) -> None:
    ids = _fill(space)
    need, before = ids["need"], _mark_count(module_dsn, space.space)
    text = "Rotated the keys by hand"
    assert _resolve(web, "viewer", space, need, action_taken=text,
                    csrf_token=web.csrf("viewer")).status_code == 403
    assert _resolve(web, "user", space, need, action_taken=text).status_code == 403
    form = web.client("user").get(_url(space, scope="ops")).text
    token = csrf_from(form)
    assert f'action="/agentpost/marks/needs/{need}/resolve?space={space.space}"' in form
    confirm = _resolve(web, "user", space, need, action_taken=text, space=space.space,
                       csrf_token=token)
    assert confirm.status_code == 200 and 'id="confirm-button"' in confirm.text
    assert "Rotate the keys?" in confirm.text and "human:user" in confirm.text
    assert _mark_count(module_dsn, space.space) == before  # confirming wrote nothing
    action, fields = confirm_form(confirm.text)  # posted as the confirm form posts it
    assert fields["confirm"] == "yes" and fields["csrf_token"] == token
    done = web.client("user").post(action, data=fields)
    assert done.status_code == 303
    assert done.headers["location"].startswith(
        f"/agentpost/marks?space={space.space}&scope=ops&done=")
    assert _mark_count(module_dsn, space.space) == before + 2
    assert all(c.needs[0].id != need for c in space.aggregate_needs())
    copy = next(m for m in space.all_marks() if m.supersedes == need)
    action = space.get(copy.resolved_by)
    person = uuid.uuid5(PEOPLE, "user")
    assert (action.mark_type.value, action.agent_id, action.resource, action.action) == (
        "action", person, None, "resolve_need")
    assert dict(action.result) == {"action_taken": text, "need_id": str(need), "by": "user",
                                   "about": "keys"}
    # answering a need claims nothing: the guard does not see the person holding "keys"
    assert space.claims("ops", "keys") == []
    entries = _trail(module_dsn, "human:user")
    event, body = entries[-1]
    assert event == "need_resolved_by_human"
    assert (body["originator"], body["need_id"], body["action_id"], body["agent_id"]) == (
        "user", str(need), str(action.id), str(person))
    assert body["resolution_id"] == str(copy.id) and body["action_taken"] == text
    with EnvelopeStore(module_dsn) as store:
        assert store.verify_trail().ok
    again = _resolve(web, "user", space, need, action_taken=text, csrf_token=token,
                     confirm="yes")
    assert again.status_code == 409 and "already resolved" in again.text
    assert len(_trail(module_dsn, "human:user")) == len(entries)


@pytest.mark.parametrize(("target", "form", "code", "message"), [
    ("unknown", {"action_taken": "x"}, 404, "no mark"),
    ("bad", {"action_taken": "x"}, 400, "not a mark id"),
    ("obs", {"action_taken": "x"}, 400, "not a need"),
    ("need", {"action_taken": "  "}, 400, "describe the action"),
    ("need", {"action_taken": "x" * 2001}, 400, "at most 2000"),
    ("need", {"action_taken": "x", "space": ""}, 400, "space"),
])
def test_resolve_bad_input_changes_nothing(web: Any, space: PostgresMarkSpace,
                                           module_dsn: str, target: str,
                                           form: dict[str, str], code: int,
                                           message: str) -> None:
    ids = _fill(space)
    need = {"unknown": uuid.uuid4(), "bad": "nope"}.get(target) or ids[target]
    before = _mark_count(module_dsn, space.space)
    query = "" if "space" in form else f"?space={space.space}"
    answer = web.client("user").post(
        f"/agentpost/marks/needs/{need}/resolve{query}",
        data={**form, "csrf_token": web.csrf("user"), "confirm": "yes"})
    assert answer.status_code == code
    assert message in html.unescape(answer.text) and "Traceback" not in answer.text
    assert _mark_count(module_dsn, space.space) == before


def test_a_need_resolved_meanwhile_rolls_the_whole_resolution_back(
        space: PostgresMarkSpace, module_dsn: str) -> None:
    """Someone resolves the need between the page's check and the confirmed act: the second
    resolution's action mark is rolled back with it, and the trail gets one entry."""
    ids = _fill(space)
    need = {"scope": "ops", "question": "Rotate the keys?", "resource": "keys"}
    key = os.environ["AGENTPOST_TRAIL_KEY"].encode()
    resolve_need(module_dsn, key, space.space, ids["need"], need, "carol", "first")
    count, entries = _mark_count(module_dsn, space.space), _trail(module_dsn, "human:carol")
    with pytest.raises(Conflict, match="already resolved"):
        resolve_need(module_dsn, key, space.space, ids["need"], need, "carol", "second")
    assert _mark_count(module_dsn, space.space) == count
    assert _trail(module_dsn, "human:carol") == entries
    assert [b["action_taken"] for _, b in entries if b["need_id"] == str(ids["need"])] == [
        "first"]
