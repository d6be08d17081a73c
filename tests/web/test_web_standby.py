"""Reads off the primary: the agentpost page, its JSON and the metrics read a real streaming
standby (a private primary and a ``pg_basebackup -R`` standby on loopback, both stopped
afterwards), say how far behind it is, and send every action to the primary; the full trail
verifies on the standby. With the standby's replay paused, what the primary wrote since does
not show, which is how the test knows where each read came from."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentpost.cli import main
from agentpost.smcl import CommandLedger
from agentpost.standalone import port_open
from agentpost.store import EnvelopeStore
from standby_support import Pair, primary_and_standby
from web_support import airflow_web

DB = "agentpost_standby"
PAGES = ("/agentpost/", "/agentpost/inboxes/sb-w1", "/agentpost/commands",
         "/agentpost/marks", "/agentpost/agents", "/agentpost/routes", "/agentpost/analytics")


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_and_standby() as made:
        yield made
    for port in (made.standby_port, int(made.primary.dsn.rsplit(":", 1)[1].split("/")[0])):
        assert not port_open(port), f"port {port} is still open"


@pytest.fixture(scope="module")
def world(pair: Pair) -> Iterator[dict[str, Any]]:
    primary, standby = pair.database(DB)
    with EnvelopeStore(primary) as store:
        store.create_workspace("coordinator", workspace_id="sb-boss")
        store.create_workspace("worker", parent="sb-boss", workspace_id="sb-w1")
        sent = store.send("sb-boss", "sb-w1", "directive", "first, before the pause")
        with CommandLedger(store) as ledger:
            ledger.submit("sb-boss", "sb-k1", action="query", mutating=False)
        pair.caught_up()
        yield {"primary": primary, "standby": standby,
               "store": store, "first": sent.envelope_id}


def test_pages_read_the_standby_and_actions_reach_the_primary(pair: Pair,
                                                             world: dict[str, Any]) -> None:
    store: EnvelopeStore = world["store"]
    with airflow_web(world["primary"], read_dsn=world["standby"]) as web:
        user = web.client("user")
        for path in PAGES:
            shown = user.get(path)
            assert shown.status_code == 200, (path, shown.text[:500])
            assert 'id="standby"' in shown.text and "caught up" in shown.text, path
        assert world["first"] in user.get("/agentpost/inboxes/sb-w1").text

        pair.replay(False)
        try:
            later = store.send("sb-boss", "sb-w1", "directive", "second, while paused")
            time.sleep(1.2)  # the standby's lag is now over a second
            inbox = user.get("/agentpost/inboxes/sb-w1")
            assert inbox.status_code == 200
            assert later.envelope_id not in inbox.text  # read from the paused standby
            assert "behind the primary" in inbox.text
            assert user.get(f"/agentpost/envelopes/{later.envelope_id}").status_code == 404
            data = user.get("/agentpost/api/inboxes/sb-w1")
            assert data.status_code == 200 and world["first"] in data.text
            assert later.envelope_id not in data.text
            metrics = user.get("/agentpost/metrics").text
            assert re.search(r'agentpost_inbox_depth\{inbox="sb-w1"\} 1\.0', metrics)

            # an action goes to the primary, paused standby or not
            path = "/agentpost/inboxes/sb-w1/inject"
            done = user.post(path, data={
                "type": "directive", "content": "from a person", "priority": "normal",
                "csrf_token": web.csrf("user"), "confirm": "yes",
                "confirm_key": web.confirm_key("user", path)})
            assert done.status_code == 303, done.text[:500]
            injected = re.match(r"/agentpost/envelopes/([^?]+)", done.headers["location"])[1]
            assert store.get(injected).originator == "user"
        finally:
            pair.replay(True)
        pair.caught_up()
        shown = user.get("/agentpost/inboxes/sb-w1").text
        assert later.envelope_id in shown and "caught up" in shown
        assert user.get(f"/agentpost/envelopes/{injected}").status_code == 200


def test_the_trail_verifies_on_the_standby_which_takes_no_write(
        pair: Pair, world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    pair.caught_up()
    with EnvelopeStore(world["standby"]) as replica:
        assert replica.db.scalar("SELECT pg_is_in_recovery()") is True
        checked = replica.verify_trail()
        assert checked.ok and checked.entries == world["store"].verify_trail().entries
        with pytest.raises(Exception, match="read-only transaction"):
            replica.send("sb-boss", "sb-w1", "directive", "a write to the standby")
    # the CLI's full verification, pointed at the standby
    assert main(["--dsn", world["standby"], "verify"]) == 0
    entries = world["store"].verify_trail().entries
    assert f"trail verified: {entries} entries" in capsys.readouterr().out
