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
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentpost.store import EnvelopeStore
from agentpost.store.server import PostgresServer
from conftest import fresh_database
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
        proc = subprocess.Popen([str(AIRFLOW), "api-server", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", "1"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_up(url, proc, log)
            yield Server(url, port, store, sent, log)
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

    def shot(self, name: str) -> Path:
        self.step += 1
        path = self.folder / f"{self.step:02d}-{name}.png"
        assert self.driver.save_screenshot(str(path)), path
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
