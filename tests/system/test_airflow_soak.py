"""A short version of the deferral soak (agentpost.benchmarks.airflow_soak) under a real
``airflow standalone`` on Postgres with a second ``airflow triggerer`` beside standalone's:
sensors held deferred over both triggerers while the second is killed with SIGKILL must all
end once their envelopes arrive; then deferred InboxSensor runs whose envelope arrives the
moment the task instance is deferred, half ending from the triggerer and half resumed on a
worker, must all succeed with the sensor's result as their XCom, with no "state attribute is"
line in the log (the race in docs/airflow.md, "Sensors and triggers"); the event-driven DAG
built by the reactive factory handles every arrival in exactly one run; standalone stops on
SIGINT and leaves its port closed. Slow (a minute or two): standalone starts four processes.
"""

from __future__ import annotations

import pytest

from agentpost.benchmarks.airflow_soak import soak
from agentpost.pg.server import PostgresServer


@pytest.mark.slow
def test_deferred_sensors_survive_a_short_soak_under_standalone(
        pg_server: PostgresServer) -> None:
    result = soak(runs=12, concurrency=3, settle=None, admin_dsn=pg_server.dsn, events=3,
                  triggerers=2, kill=True)
    two = result["triggerers"]
    # both triggerers held triggers (their capacity forces it), the second was killed with
    # SIGKILL while it held some, and every sensor held across the kill still ended
    assert two["spread"] == 2 and min(two["triggers_by_triggerer"]) >= 1, two
    held = two["held_across_kill"]
    assert held["killed"] and held["killed_held"] >= 1, held
    assert held["held_success"] == held["held"], held
    assert not two["extra_left_running"], two
    assert result["runs"] == 12 and result["failed"] == 0, result
    assert result["never_deferred"] == 0, result
    assert result["state_mismatches"] == 0 and result["wrong_xcom"] == 0, result
    assert not result["port_left_open"], result
    events = result["event_driven"]
    assert events["each_once"] and events["failed_runs"] == 0, events
