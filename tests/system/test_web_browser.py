"""The agentpost page in a real browser (docs/ui.md, "Browser test and benchmark").

A real `airflow api-server` runs in its own process group on a free loopback port: a private
AIRFLOW_HOME, Airflow's metadata in a fresh Postgres database (`airflow db migrate`), the
simple auth manager with users and passwords from its configuration, and AGENTPOST_DSN on a
fresh store holding a few workspaces and envelopes. Headless Chromium, driven by Selenium,
signs in through Airflow's own login page and uses the agentpost pages as a person would.
At the end the whole process group is stopped and the port checked free.

Screenshots of every step go to `AGENTPOST_TEST_OUTPUT` when set, else the test's tmp_path;
the folder is printed. Chromium comes from tests/ensure-browser.sh (`make test` runs it);
without it the module is skipped with what to install.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from agentpost.pg.server import PostgresServer
from agentpost.store import EnvelopeStore
from browser_seed import Seeded, seed_all
from dbtools import fresh_database
from test_airflow_metadata_db import sqlalchemy_url

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
AIRFLOW = Path(sys.executable).parent / "airflow"
USER, PASSWORD = "admin", "browser-test-password"
BOSS = "boss"
WORKERS = {"w1": 3, "w2": 1}  # inbox: envelopes waiting in it
STARTUP_S = 240.0
WAIT_S = 20.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                       reason="headless Chromium is missing: run `sh tests/ensure-browser.sh` "
                              "as root (Debian: apt-get install chromium chromium-driver)"),
]


# -- the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status_of(url: str, cookie: str | None = None) -> int:
    """The HTTP status of a GET straight to the loopback server; 0 when nothing answers."""
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with _DIRECT.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


@dataclass
class Server:
    url: str
    port: int
    store: EnvelopeStore
    sent: dict[str, list[str]]  # inbox: ids of the envelopes waiting in it
    log: Path
    seeded: Seeded


def seed(store: EnvelopeStore) -> dict[str, list[str]]:
    """A coordinator `boss` with workers w1 and w2, directives waiting in their inboxes."""
    store.create_workspace("coordinator", workspace_id=BOSS)
    sent: dict[str, list[str]] = {}
    for ws, n in WORKERS.items():
        store.create_workspace("worker", parent=BOSS, workspace_id=ws)
        sent[ws] = [store.send(BOSS, ws, "directive", f"task {i} for {ws}").envelope_id
                    for i in range(1, n + 1)]
    return sent


def airflow_env(home: Path, metadata_dsn: str, store_dsn: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "_AIRFLOW")) and k != "AGENTPOST_DSN"}
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy_url(metadata_dsn),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple."
                                       "simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": "browser-test-jwt-secret-" + "x" * 40,
        "AIRFLOW__API__SECRET_KEY": "browser-test-secret",
        "AGENTPOST_DSN": store_dsn,
    })
    return env


def stop_group(proc: subprocess.Popen[Any], port: int) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after 30 s; the port must
    then be free."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    assert not listening(port), f"something still listens on port {port}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def output_dir(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("AGENTPOST_TEST_OUTPUT")
    folder = (Path(where) / "browser" if where
              else tmp_path_factory.mktemp("browser"))
    folder.mkdir(parents=True, exist_ok=True)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown even when output is captured
        print(f"\nbrowser screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def server(pg_server: PostgresServer, module_dsn: str, output_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("airflow-home")
    metadata = fresh_database(pg_server, "airflow_browser")
    metadata_dsn = next(metadata)
    port = free_port()
    env = airflow_env(home, metadata_dsn, module_dsn, port)
    migrated = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True,
                              text=True, timeout=300, check=False)
    assert migrated.returncode == 0, (migrated.stdout + migrated.stderr)[-3000:]
    log = output_dir / "api-server.log"
    with EnvelopeStore(module_dsn) as store, open(log, "w") as out:
        sent = seed(store)
        seeded = seed_all(store)
        proc = subprocess.Popen([str(AIRFLOW), "api-server", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", "1"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_up(url, proc, log)
            yield Server(url, port, store, sent, log, seeded)
        finally:
            stop_group(proc, port)
            next(metadata, None)


def _wait_until_up(url: str, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"api-server exited: {log.read_text()[-3000:]}"
        if status_of(url + "/api/v2/monitor/health") == 200:
            return
        time.sleep(1.0)
    raise AssertionError(f"api-server did not answer in {STARTUP_S:.0f} s: "
                         f"{log.read_text()[-3000:]}")


# -- the browser ---------------------------------------------------------------------------------


class Browser:
    """A headless Chromium with screenshot steps numbered in the order they were taken."""

    def __init__(self, base: str, folder: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--window-size=1280,900", "--disable-gpu"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.base, self.folder, self.step = base, folder, 0

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def shot(self, name: str, selector: str | None = None) -> Path:
        """A screenshot of the window, or of one element (a chart), scrolled into view."""
        self.step += 1
        path = self.folder / f"{self.step:02d}-{name}.png"
        if selector is None:
            assert self.driver.save_screenshot(str(path)), path
        else:
            element = self.css(selector)
            self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                                       element)
            assert element.screenshot(str(path)), path
        return path

    def css(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def wait(self, what: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(what)

    def wait_for(self, selector: str, timeout: float = WAIT_S) -> Any:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        return self.wait(ec.presence_of_element_located((By.CSS_SELECTOR, selector)), timeout)

    def token_cookie(self) -> str | None:
        cookie = self.driver.get_cookie("_token")
        return f"_token={cookie['value']}" if cookie else None

    def close(self) -> None:
        self.driver.quit()


@pytest.fixture(scope="module")
def browser(server: Server, output_dir: Path) -> Iterator[Browser]:
    b = Browser(server.url, output_dir)
    try:
        yield b
    finally:
        b.close()


def log_in(b: Browser) -> None:
    """Through Airflow's own login page, as a person would."""
    from selenium.webdriver.common.keys import Keys

    b.open("/auth/login")
    user = b.wait_for("input[name='username']")
    b.shot("login-page")
    user.send_keys(USER)
    password = b.css("input[type='password']")
    password.send_keys(PASSWORD)
    password.send_keys(Keys.ENTER)
    b.wait(lambda d: d.get_cookie("_token") is not None, 60)
    # Airflow's UI after the redirect (screenshot of it, not of a blank page mid-load)
    b.wait(lambda d: "/auth/" not in d.current_url and b.css("body").text.strip(), 60)
    b.shot("signed-in")


# -- the tests -----------------------------------------------------------------------------------


def test_sign_in_through_airflows_login_page(server: Server, browser: Browser) -> None:
    """The agentpost app answers 401 to no one and 200 to the signed-in browser's cookie."""
    css = server.url + "/agentpost/static/agentpost.css"
    assert status_of(css) == 401
    log_in(browser)
    assert status_of(css, browser.token_cookie()) == 200
    browser.open("/agentpost/static/agentpost.css")
    assert "{" in browser.css("body").text
    browser.shot("stylesheet")


def depth(b: Browser, ws: str) -> str:
    return b.css(f"table#inboxes tr[data-inbox='{ws}'] .depth").text.strip()


def test_inbox_overview_shows_the_seeded_inboxes(server: Server, browser: Browser) -> None:
    browser.open("/agentpost/")
    browser.wait_for("table#inboxes")
    for ws, n in WORKERS.items():
        assert depth(browser, ws) == str(n), ws
    browser.wait(lambda d: browser.css("span#live-status").text.strip() != "")
    browser.shot("inboxes")


def test_inbox_and_envelope_pages_show_what_is_there(server: Server,
                                                     browser: Browser) -> None:
    browser.open("/agentpost/inboxes/w1")
    assert browser.wait_for("h1#inbox-id").text.strip().endswith("w1")
    waiting = [row.get_attribute("data-envelope")
               for row in browser.all("table#waiting tr[data-envelope]")]
    assert sorted(waiting) == sorted(server.sent["w1"])
    browser.shot("inbox-w1")
    first = server.sent["w1"][0]
    browser.open(f"/agentpost/envelopes/{first}")
    assert first in browser.wait_for("h1#envelope-id").text
    lifecycle = browser.css("ol#lifecycle").text
    assert "created" in lifecycle and "delivered" in lifecycle, lifecycle
    browser.shot("envelope")


def test_inject_then_watch_the_depth_rise_live(server: Server, browser: Browser) -> None:
    """Inject into w2 from its page, confirm, land on the new envelope; back on the overview
    (left open, no reload) the live refresh shows w2's depth one higher."""
    from selenium.webdriver.support.ui import Select

    browser.open("/agentpost/")
    browser.wait_for("table#inboxes")
    before = int(depth(browser, "w2"))
    marker = browser.driver.execute_script("window.agentpostNoReload = 1; return 1")
    assert marker == 1

    other = browser.driver.current_window_handle
    browser.driver.switch_to.new_window("tab")
    browser.open("/agentpost/inboxes/w2")
    form = browser.wait_for("form#inject-form")
    kind = form.find_element("name", "type")
    if kind.tag_name == "select":
        Select(kind).select_by_value("directive")
    else:
        kind.clear()
        kind.send_keys("directive")
    form.find_element("name", "content").send_keys("injected by the browser test")
    browser.shot("inject-form")
    form.submit()
    browser.wait_for("#confirm-button").click()
    envelope = browser.wait_for("h1#envelope-id").text
    browser.shot("injected-envelope")
    injected = [e for e in server.store.inbox("w2") if e.id in envelope]
    assert injected and injected[0].payload.content == "injected by the browser test"
    browser.driver.close()

    browser.driver.switch_to.window(other)
    browser.wait(lambda d: depth(browser, "w2") == str(before + 1), 30)
    assert browser.driver.execute_script("return window.agentpostNoReload") == 1
    browser.shot("live-depth")


# -- the pages, looked at (issue 22, section 5) -------------------------------------------------

#: unix seconds of this century, as a page must never show them
EPOCH = re.compile(r"\b1[6-9]\d{8}(?:\.\d+)?\b")
#: the viewer's zone in these tests: times must read in it, not in UTC
ZONE = "Europe/Berlin"


def in_zone(b: Browser) -> None:
    """The tab's clock in ZONE (Chromium's own override), as a viewer there sees it."""
    b.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ZONE})


def js(b: Browser, script: str, *args: Any) -> Any:
    return b.driver.execute_script(script, *args)


def human_times(b: Browser, where: str) -> int:
    """No epoch seconds in the page's text; every <time> reads as a human time in ZONE (its
    hour that of the viewer's zone, not UTC's), with the UTC time on hover."""
    from zoneinfo import ZoneInfo

    text = js(b, "return document.body.innerText")
    assert not EPOCH.findall(text), f"{where} shows epoch seconds: {EPOCH.findall(text)[:3]}"
    times = js(b, "return [...document.querySelectorAll('time[datetime]')].map(t => "
                  "[t.getAttribute('datetime'), t.title, t.textContent])")
    for iso, title, shown in times:
        at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        assert title == at.strftime("%Y-%m-%d %H:%M:%S.") + iso[20:23] + " UTC", (where, title)
        local = at.astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")
        assert shown.startswith(local) and not shown.endswith("UTC"), (where, iso, shown)
    return len(times)


def test_times_are_human_in_the_viewers_zone_on_every_page(server: Server,
                                                          browser: Browser) -> None:
    seeded = server.seeded
    pages = {"inbox": "/agentpost/inboxes/w1",
             "envelope": f"/agentpost/envelopes/{server.sent['w1'][0]}",
             "marks-space": f"/agentpost/marks?space={seeded.space}",
             "mark": f"/agentpost/marks/{seeded.observation}?space={seeded.space}",
             "commands": "/agentpost/commands",
             "command-saga": f"/agentpost/commands/{seeded.saga_step}",
             "consumed": f"/agentpost/inboxes/{seeded.consumed_inbox}/consumed",
             "analytics": "/agentpost/analytics"}
    in_zone(browser)
    problems = []
    for name, path in pages.items():
        look(browser, path, f"times-{name}")
        try:
            assert human_times(browser, name) > 0, f"{name} shows no time"
        except AssertionError as failed:
            problems.append(str(failed))
    assert not problems, problems
    # the mark space's render clock: a time, not 1795765990.59
    browser.open(f"/agentpost/marks?space={seeded.space}")
    render = browser.wait_for("time#render-now")
    assert float(render.get_attribute("data-now")) > 0 and not EPOCH.search(render.text)


def test_agents_are_named_where_the_store_knows_the_name(server: Server,
                                                        browser: Browser) -> None:
    """The fleet's drivers by name in marks, intents and verdicts, never a cut id; the guard's
    own agent by its name; the weather poller, whose name is no workspace id, by the name
    its writes recorded; an agent the store cannot name keeps its whole id on hover."""
    seeded = server.seeded
    look(browser, f"/agentpost/marks?space={seeded.space}", "marks-agents")
    text = js(browser, "return document.body.innerText")
    for name, ident in seeded.agents.items():
        assert name in browser.css("table#intents").text, name
        assert ident[:8] not in text, f"{name}'s id is shown cut: {ident[:8]}…"
    verdicts = {row.get_attribute("data-agent"): row.text
                for row in browser.all("table#verdicts tr[data-agent]")}
    assert "driver-b" in verdicts[seeded.agents["driver-b"]]
    assert "won" in verdicts[seeded.agents["driver-b"]]
    assert "asked by markspace-guard" in browser.css("table#needs").text
    poller = browser.css(f"span.agent[data-agent-id='{seeded.poller}']")
    assert poller.text == "weather-poller" and seeded.poller[:8] not in text
    assert seeded.poller in poller.get_attribute("title")
    unnamed = browser.css(f"code.agent.unnamed[data-agent-id='{seeded.unnamed}']")
    assert seeded.unnamed in unnamed.get_attribute("title")


def look(b: Browser, path: str, shot: str) -> None:
    """Open a page and keep a screenshot of it as it first shows (before any assertion, so
    a failing run still shows what was wrong)."""
    b.open(path)
    b.wait_for("main h1")
    time.sleep(0.5)  # the charts' first frame
    b.shot(shot)


def chart_facts(b: Browser, chart_id: str) -> dict[str, Any]:
    """What the uPlot chart in #chart_id shows: its x axis kind, scales, tick labels and
    legend (agentpost.charts keeps each chart)."""
    return js(b, """
      const u = (agentpost.charts || {})[arguments[0]];
      if (!u) return null;
      const legend = [...u.root.querySelectorAll('.u-legend .u-series')];
      const box = u.root.getBoundingClientRect();
      return {xaxis: document.getElementById(arguments[0]).dataset.xaxis,
              x: [u.scales.x.min, u.scales.x.max], y: [u.scales.y.min, u.scales.y.max],
              ticks: u.axes[0]._values, data: u.data,
              legend: legend.map(r => { const b = r.getBoundingClientRect();
                                        return [r.textContent, b.width > 0 && b.height > 0
                                                && b.left >= box.left - 1
                                                && b.right <= box.right + 1]; })};
    """, chart_id)


def test_bar_charts_have_category_axes_and_whole_bars(server: Server,
                                                      browser: Browser) -> None:
    """Verdicts by outcome and the latency histogram are bar charts over categories (their
    names on the x axis, every bar whole); a strength's y axis is its range, 0 to 1."""
    seeded = server.seeded
    mark = f"/agentpost/marks/{{}}?space={seeded.space}"
    facts = {}
    for path, shot, charts in [
            (f"/agentpost/marks?space={seeded.space}", "marks-space",
             {"outcome-chart": "outcomes"}),
            ("/agentpost/inboxes/w1", "inbox-charts",
             {"latency-chart": "histogram", "throughput-chart": "throughput"}),
            (mark.format(seeded.observation), "mark", {"decay-chart": "decay"}),
            (mark.format(seeded.superseded), "mark-superseded", {"decay-chart": "zero"})]:
        look(browser, path, shot)
        for chart, name in charts.items():
            browser.shot(f"chart-{name}", f"#{chart}")
            facts[name] = chart_facts(browser, chart)
    outcomes = facts["outcomes"]
    assert outcomes and outcomes["xaxis"] == "category", outcomes
    assert outcomes["ticks"] == ["won", "won, acted", "lost", "no winner"]
    assert outcomes["x"] == [-0.5, 3.5]  # half a slot beyond the last bar: never cut
    assert outcomes["y"][0] == 0 and outcomes["y"][1] >= max(outcomes["data"][1])
    hist = facts["histogram"]
    assert hist["xaxis"] == "category" and hist["ticks"][-2:] == ["≤60 s", ">60 s"]
    assert hist["x"] == [-0.5, len(hist["ticks"]) - 0.5]
    assert facts["throughput"]["xaxis"] == "time"
    assert facts["decay"]["y"] == [0, 1], facts["decay"]
    # a superseded mark's strength is 0 throughout: still a 0-to-1 axis, not 0 to 100
    assert set(facts["zero"]["data"][1]) == {0} and facts["zero"]["y"] == [0, 1], facts["zero"]


def test_analytics_chart_spans_its_windows_and_shows_every_series(server: Server,
                                                                  browser: Browser) -> None:
    seeded = server.seeded
    look(browser, "/agentpost/analytics", "analytics")
    browser.shot("chart-analytics-latency", "#latency-chart")
    facts = chart_facts(browser, "latency-chart")
    assert facts, "no chart"
    starts = [w.timestamp() for w in seeded.windows]
    assert facts["xaxis"] == "time" and facts["data"][0] == starts
    low, high = facts["x"]
    day = 86_400
    assert starts[0] - day <= low < starts[0] and starts[-1] < high <= starts[-1] + day, (
        facts["x"], starts)
    series = [name for name, _ in facts["legend"][1:]]
    assert len(series) == 10 and all(shown for _, shown in facts["legend"]), facts["legend"]
    note = browser.css("#latency-chart-note").text
    assert "5 of its 10 inboxes are not charted" in note, note
    browser.shot("analytics-agents", "table#analytics-agents")
    agents = browser.css("table#analytics-agents").text
    assert "driver-b" in agents and seeded.agents["driver-b"] not in agents

    # one window only (a first run): its point sits inside a span of about a window, not at
    # the edge of years of empty axis
    conn = psycopg2.connect(server.store.dsn)
    with conn, conn.cursor() as cur:
        cur.execute("DELETE FROM agentpost.analytics_inbox_latency WHERE window_start < %s",
                    (seeded.windows[-1],))
    conn.close()
    look(browser, "/agentpost/analytics", "analytics-one-window")
    browser.shot("chart-analytics-one-window", "#latency-chart")
    one = chart_facts(browser, "latency-chart")
    low, high = one["x"]
    assert one["data"][0] == starts[-1:] and low < starts[-1] < high and high - low <= 2 * day, (
        one["x"], starts[-1])


def test_command_states_have_their_own_colours(server: Server, browser: Browser) -> None:
    seeded = server.seeded
    look(browser, "/agentpost/commands", "command-states")

    def colour(command_id: str) -> str:
        chip = browser.css(f"tr[data-command='{command_id}'] td.state .chip")
        return js(browser, "return getComputedStyle(arguments[0]).backgroundColor", chip)

    assert colour(seeded.failed) != colour(seeded.executed)
    look(browser, f"/agentpost/commands/{seeded.saga_step}", "saga-compensated")
    browser.shot("saga-steps", "#saga-steps")
    payment = browser.css("tr[data-step='payment']")
    assert payment.get_attribute("data-compensation") == "not_needed"
    assert "not needed" in payment.text and "pending" not in payment.text


def test_a_rejected_inject_says_its_content_was_not_kept(server: Server,
                                                         browser: Browser) -> None:
    browser.open("/agentpost/inboxes/w2")
    form = browser.wait_for("form#inject-form")
    form.find_element("name", "type").send_keys("no-such-type")
    form.find_element("name", "content").send_keys("typed by a person")
    form.submit()
    browser.wait_for("#confirm-button").click()
    browser.wait_for("#rejection")
    browser.shot("rejected-inject")
    content = browser.css("td.content").text
    assert "None" not in content and "not kept" in content, content


def test_consumed_envelopes_are_reachable_from_their_inbox(server: Server,
                                                           browser: Browser) -> None:
    seeded = server.seeded
    look(browser, f"/agentpost/inboxes/{seeded.consumed_inbox}", "inbox-consumed")
    browser.shot("consumed-table", "table#consumed")
    rows = browser.all("table#consumed tr[data-envelope]")
    assert sorted(r.get_attribute("data-envelope") for r in rows) == sorted(seeded.consumed)
    rows[0].find_element("css selector", "a").click()
    assert "consumed" in browser.wait_for("ol#lifecycle").text
    look(browser, f"/agentpost/inboxes/{seeded.consumed_inbox}/consumed", "consumed-list")
    listed = [r.get_attribute("data-envelope")
              for r in browser.all("table#consumed tr[data-envelope]")]
    assert sorted(listed) == sorted(seeded.consumed)


def test_airflows_browse_menu_shows_the_page_in_an_iframe(server: Server,
                                                          browser: Browser) -> None:
    """Browse > Agents: Airflow's UI embeds /agentpost/ in an iframe."""
    browser.open("/")
    browse = browser.wait(lambda d: [e for e in browser.all("button, a")
                                     if e.text.strip() == "Browse"], 60)
    browse[0].click()
    agents = browser.wait(lambda d: [e for e in browser.all("a, button, [role='menuitem']")
                                     if e.text.strip() == "Agents"])
    browser.shot("browse-menu")
    agents[0].click()
    frame = browser.wait_for("iframe")
    assert "/agentpost/" in frame.get_attribute("src")
    browser.wait(lambda d: "/plugin/agentpost" in d.current_url)
    time.sleep(1.0)  # the frame's own page loading
    browser.shot("airflow-ui-agents")
    browser.driver.switch_to.frame(frame)
    try:
        browser.wait_for("table#inboxes")
        assert depth(browser, "w1") == str(WORKERS["w1"])
    finally:
        browser.driver.switch_to.default_content()
    browser.shot("airflow-ui-iframe")


def test_output_folder_holds_the_screenshots(output_dir: Path) -> None:
    shots = sorted(p.name for p in output_dir.glob("*.png"))
    assert shots and all((output_dir / s).stat().st_size > 1000 for s in shots), shots
