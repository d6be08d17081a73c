"""`agentpost maintain` / `agentpost.store.maintenance.maintain`: the one call to schedule also
sweeps what only a schedule can catch — a command whose executor died (SMCL: never in
progress forever) and a routed hop whose leases ran out (Asya: "routed to error-end on
timeout")."""

from __future__ import annotations

import time

import pytest

from agentpost.protocol.commands import CommandState
from agentpost.protocol.routes import ERROR_END
from agentpost.store import CommandLedger, EnvelopeStore, RouteStore
from test_cli import agentpost

ACTORS = ["prep", "post"]


class Crash(BaseException):
    """The executor dying mid-execution (not an Exception: the ledger must not record it)."""


def _crashed_command(store: EnvelopeStore) -> str:
    store.define_role("agent")
    store.register_type("book", ["agent"], ["agent"])
    ws = store.create_workspace("agent", workspace_id="desk").id
    with CommandLedger(store, lease_ttl=0.3) as ledger:
        def dies() -> None:
            raise Crash()

        with pytest.raises(Crash):
            ledger.run(ws, "k1", dies, action="book", mutating=True, auto_confirm="low-risk")
        [command] = store.db.fetchall("SELECT id FROM agentpost.commands")
    return command[0]


def _exhausted_hop(store: EnvelopeStore) -> RouteStore:
    routes = RouteStore(store)
    routes.setup(ACTORS)
    routes.start({"id": "r1", "route": {"actors": ACTORS}, "payload": {"n": 1}})
    for _ in range(4):
        [hop] = routes.receive("prep")
        store.nack(hop.lease.token)
    return routes


def test_maintain_sweeps_dead_executors_and_timed_out_hops(dsn: str,
                                                           store: EnvelopeStore) -> None:
    """SMCL 'started ... MUST NOT create parallel executions' without a stuck command: the
    crashed executor's command is failed (`executor_lost`); Asya 'error-end ... on timeout':
    the exhausted hop goes to error-end; then VACUUM ANALYZE covers the new tables."""
    command_id = _crashed_command(store)
    routes = _exhausted_hop(store)
    time.sleep(0.5)  # the command's lease (0.3 s) runs out
    done = agentpost(dsn, "maintain").json()
    assert done["commands_failed"] == [command_id]
    assert done["routes_timed_out"] == ["r1"]
    assert {"commands", "routes", "envelopes"} <= set(done["vacuumed"])
    with CommandLedger(store) as ledger:
        view = ledger.view(command_id)
    assert (view.state, view.reason) == (CommandState.FAILED, "executor_lost")
    assert routes.get("r1").route.end == ERROR_END
    again = agentpost(dsn, "maintain", "--no-vacuum").json()
    assert (again["commands_failed"], again["routes_timed_out"], again["vacuumed"]) == (
        [], [], [])
    assert store.verify_trail().ok
