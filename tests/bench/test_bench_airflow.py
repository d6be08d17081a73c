"""`agentpost bench airflow` runs end to end at a tiny scale on a real `airflow standalone` and
prints what the Airflow issue asks for: send -> deferred InboxSensor task end (ended from the
triggerer, and resumed on a worker) beside the same sensor poking every 5 s, p50/p95 each; the
asset-watcher cell measured or said to be missing; the goal judged. No timing is asserted
(shared machines): the goal is printed met or MISSED. The runtime it starts is stopped: no
process of its session is left."""

from __future__ import annotations

import re

import pytest

from agentpost.benchmarks import airflow as bench
from agentpost.benchmarks.airflow import MISSING, watcher_available
from agentpost.cli import main
from agentpost.standalone import START_TIMEOUT, AirflowRuntime, port_open

CELL = r"p50 [\d.]+ s\s+p95 [\d.]+ s\s+\(n=2\)"


class Recorded(AirflowRuntime):
    """The bench's runtime, kept for a look after the bench stopped it."""

    instances: list[AirflowRuntime] = []

    def start(self, timeout: float = START_TIMEOUT) -> AirflowRuntime:
        Recorded.instances.append(self)
        return super().start(timeout)


@pytest.mark.slow
def test_bench_airflow_prints_both_sensor_modes_and_the_goal(
        dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "AirflowRuntime", Recorded)
    assert main(["--dsn", dsn, "bench", "airflow", "--scale", "0.04"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"InboxSensor, deferred \(LISTEN in the triggerer\)\s+{CELL}", out), out
    assert re.search(rf"InboxSensor, deferred, resumed on a worker \(end_from_trigger=False\)"
                     rf"\s+{CELL}", out), out
    assert re.search(rf"InboxSensor, poke mode \(5 s interval\)\s+{CELL}", out), out
    watcher = CELL if watcher_available() else re.escape(MISSING)
    assert re.search(rf"asset watcher: send -> DAG run start\s+{watcher}", out), out
    assert re.search(r"\[(met|MISSED)\] deferred p95 under 1 s end to end", out), out
    [runtime] = Recorded.instances
    assert runtime.processes() == [], "the bench left processes running"
    assert not any(port_open(port) for port in runtime.ports)
