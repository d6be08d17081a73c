"""Which run handled each arrival (sql/0071, agentpost.store.event_handled) against real
Postgres: a run takes its own arrivals plus what its watcher claimed that no run of its DAG
took (an asset event Airflow's scheduler stranded), each arrival once per DAG.

The watcher's claims are made as InboxEventTrigger makes them, through `ClaimSession`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentpost.protocol.errors import InvalidInput, NotFound
from agentpost.store import EnvelopeStore
from agentpost.store.event_claims import ClaimSession, drop_event_watchers
from agentpost.store.event_handled import prune_event_handled, take_arrivals
from agentpost.store.maintenance import maintain
from dbtools import query
from test_airflow_inbox import airflow_env
from test_leases import send, topology

WATCHER = "asset:inbox-w1"


@pytest.fixture
def session(store: EnvelopeStore, dsn: str) -> Iterator[ClaimSession]:
    """The watcher of inbox w1, started (arrivals count from its first claim)."""
    topology(store, ["w1"])
    claims = ClaimSession(dsn, WATCHER, "w1")
    assert claims.claim()[0] == []
    yield claims
    claims.close()


def arrive(store: EnvelopeStore, session: ClaimSession, n: int, *,
           confirm: bool = True) -> list[str]:
    """Deliver `n` envelopes to w1 and have the watcher claim them (confirmed or pending)."""
    sent = [send(store, "w1", f"m{i}") for i in range(n)]
    ids, _ = session.claim(max=n)
    assert ids == sent
    if confirm:
        session.confirm(ids)
    return sent


def take(store: EnvelopeStore, run: str, own: list[str], consumer: str = "dag_a") -> list[str]:
    return take_arrivals(store, consumer, WATCHER, f"{consumer}/{run}", own)


def marks(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT consumer, envelope_id, run_key FROM agentpost.event_handled"
                      " ORDER BY consumer, envelope_id")


def test_a_run_takes_a_stranded_claimed_arrival_and_no_later_run_takes_it_again(
        store: EnvelopeStore, session: ClaimSession) -> None:
    """E1's run also takes E2 (claimed, its event stranded); the run E2's event finally
    lands in gets nothing; a retry of E1's run gets E1 and E2 again."""
    e1, e2 = arrive(store, session, 2)
    assert take(store, "r1", [e1]) == [e1, e2]
    assert take(store, "r2", [e2]) == []
    assert take(store, "r1", [e1]) == [e1, e2]


def test_concurrent_runs_of_one_dag_split_the_arrivals_without_overlap(
        store: EnvelopeStore, session: ClaimSession) -> None:
    """Runs taking at once (max_active_runs > 1, each for one arrival): every arrival is held
    by exactly one run."""
    sent = arrive(store, session, 12)
    with ThreadPoolExecutor(6) as pool:
        held = list(pool.map(lambda i: take(store, f"r{i}", [sent[i]]), range(len(sent))))
    assert sorted(i for ids in held for i in ids) == sorted(sent)


def test_pending_claims_are_swept(store: EnvelopeStore, session: ClaimSession) -> None:
    """A claim not yet confirmed (its asset event being stored) is taken too; an envelope
    the watcher has not claimed is not."""
    (e1,) = arrive(store, session, 1)
    (e2,) = arrive(store, session, 1, confirm=False)
    unclaimed = send(store, "w1", "not claimed yet")
    assert take(store, "r1", [e1]) == [e1, e2]
    assert session.claim()[0] == [unclaimed]
    assert take(store, "r2", [unclaimed]) == [unclaimed]


def test_two_consumers_each_take_every_arrival(store: EnvelopeStore,
                                               session: ClaimSession) -> None:
    """Two DAGs on one asset: each has its own run handle each arrival."""
    e1, e2 = arrive(store, session, 2)
    assert take(store, "r1", [e1], consumer="dag_a") == [e1, e2]
    assert take(store, "r1", [e1], consumer="dag_b") == [e1, e2]
    assert take(store, "r2", [e2], consumer="dag_a") == []
    assert take(store, "r2", [e2], consumer="dag_b") == []
    assert {(c, e) for c, e, _ in marks_of(store)} == {
        ("dag_a", e1), ("dag_a", e2), ("dag_b", e1), ("dag_b", e2)}


def marks_of(store: EnvelopeStore) -> list[tuple[Any, ...]]:
    return store.db.fetchall("SELECT consumer, envelope_id, run_key"
                             " FROM agentpost.event_handled ORDER BY consumer, envelope_id")


def test_a_new_consumer_does_not_sweep_claims_before_its_first_run(
        store: EnvelopeStore, session: ClaimSession) -> None:
    """A DAG's first run sweeps only arrivals delivered from its own earliest arrival on (a
    first run without arrivals: from now on), not the watcher's older claims."""
    old = arrive(store, session, 2)
    (own,) = arrive(store, session, 1)
    assert take(store, "r1", [own], consumer="dag_new") == [own]
    assert take(store, "r1", [], consumer="dag_empty") == []
    later = arrive(store, session, 1)
    assert take(store, "r2", [], consumer="dag_new") == later
    assert not any(e in old for _, e, _ in marks_of(store))


def test_arrivals_delivered_before_the_migration_are_not_swept(
        store: EnvelopeStore, session: ClaimSession, dsn: str) -> None:
    """Claims a watcher made before sql/0071 were handled by their own runs: its
    `handled_from` (0071's time) bounds every sweep."""
    old = arrive(store, session, 2)
    query(dsn, "UPDATE agentpost.event_watchers SET handled_from = clock_timestamp()")
    new = arrive(store, session, 1)
    assert take(store, "r1", [old[0]]) == [old[0], *new]


def test_a_pruned_claim_behind_the_watchers_cursor_still_counts_as_claimed(
        store: EnvelopeStore, session: ClaimSession, dsn: str) -> None:
    """Claim pruning (sql/0046) deletes confirmed claims behind the watcher's cursor; an
    arrival there is still swept by a run that starts late."""
    from agentpost.store.event_claims import prune_event_claims

    e1, e2 = arrive(store, session, 2)
    assert prune_event_claims(store, margin=0) == 2
    assert query(dsn, "SELECT count(*) FROM agentpost.event_claims") == [(0,)]
    assert take(store, "r1", [e1]) == [e1, e2]


def test_pruning_keeps_young_marks_and_drops_old_ones_without_sweeping_them_again(
        store: EnvelopeStore, session: ClaimSession) -> None:
    """Marks go by age only; maintain() keeps young ones (a generous default); once old
    marks are gone their arrivals are not swept again (the consumer's horizon moved)."""
    old = arrive(store, session, 2)
    assert take(store, "r1", [old[0]]) == old
    time.sleep(0.6)
    young = arrive(store, session, 1)
    assert take(store, "r2", young) == young
    assert maintain(store, vacuum=False)["event_handled_pruned"] == 0
    assert prune_event_handled(store, keep=0.4) == 2
    assert [e for _, e, _ in marks_of(store)] == young
    assert take(store, "r3", []) == []
    assert take(store, "r4", young) == []


def age(dsn: str, by: str = "2 minutes") -> None:
    """Move every arrival and bound back in time: the consumer's cursor only passes
    arrivals older than a minute."""
    query(dsn, f"UPDATE agentpost.envelopes SET delivered_at = delivered_at - interval '{by}'")
    query(dsn, f"UPDATE agentpost.event_watchers SET since = since - interval '{by}',"
               f" handled_from = handled_from - interval '{by}'")
    query(dsn, f"UPDATE agentpost.event_consumers SET since = since - interval '{by}'")


def cursor(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT e.id FROM agentpost.event_consumers c JOIN agentpost.envelopes e"
                      " ON (e.delivered_at, e.seq) = (c.cursor_at, c.cursor_seq)")


def test_the_consumers_cursor_passes_taken_arrivals_and_stops_at_a_gap(
        store: EnvelopeStore, session: ClaimSession, dsn: str) -> None:
    """The sweep only looks after the consumer's cursor, which moves over contiguous taken
    arrivals: an arrival whose claim was released (not claimed now) stops it, is not taken,
    and is swept once claimed again; what the cursor passed is not swept again even with its
    mark gone."""
    (e1,) = arrive(store, session, 1)
    gap, e3 = arrive(store, session, 2, confirm=False)
    assert session.release([gap], session.owner) == 1
    assert take(store, "r1", [e1]) == [e1, e3]
    age(dsn)
    assert take(store, "r2", []) == []
    assert cursor(dsn) == [(e1,)]
    assert session.claim()[0] == [gap]
    assert take(store, "r3", []) == [gap]
    assert take(store, "r4", []) == []
    assert cursor(dsn) == [(e3,)]
    query(dsn, "DELETE FROM agentpost.event_handled")
    assert take(store, "r5", []) == []


def test_dropping_a_watcher_drops_its_marks(store: EnvelopeStore, session: ClaimSession,
                                            dsn: str) -> None:
    """drop_event_watchers forgets a dropped watcher's consumers and marks with it."""
    e1, e2 = arrive(store, session, 2)
    assert take(store, "r1", [e1]) == [e1, e2]
    query(dsn, "UPDATE agentpost.event_watchers SET seen_at = now() - interval '40 days'")
    assert drop_event_watchers(store, idle=30 * 86400) == [WATCHER]
    assert marks_of(store) == []
    assert query(dsn, "SELECT count(*) FROM agentpost.event_consumers") == [(0,)]


def test_an_unknown_watcher_sweeps_nothing(store: EnvelopeStore, session: ClaimSession) -> None:
    """A watcher that never claimed (no trigger ran): the run takes only its own."""
    e1, _ = arrive(store, session, 2)
    assert take_arrivals(store, "dag_a", "asset:nobody", "dag_a/r1", [e1]) == [e1]


@pytest.mark.parametrize("consumer, watcher, run, own, error", [
    ("", WATCHER, "dag_a/r1", None, InvalidInput),
    ("dag_a", "bad\x00watcher", "dag_a/r1", None, InvalidInput),
    ("dag_a", WATCHER, "   ", None, InvalidInput),
    ("dag_a", WATCHER, 7, None, InvalidInput),
    ("dag_a", WATCHER, "dag_a/r1", "not-a-list", InvalidInput),
    ("dag_a", WATCHER, "dag_a/r1", ["ok", None], InvalidInput),
    ("dag_a", WATCHER, "dag_a/r1", ["no-such-envelope"], NotFound),
])
def test_bad_input_is_refused_and_takes_nothing(store: EnvelopeStore, session: ClaimSession,
                                                dsn: str, consumer: Any, watcher: Any,
                                                run: Any, own: Any, error: type) -> None:
    """Bad names, a run key that is not text, ids that are not a list of ids, an unknown
    envelope: a clear error, and nothing taken (the claimed arrival is still there)."""
    e1, e2 = arrive(store, session, 2)
    given = [e1, *own] if isinstance(own, list) else own if own is not None else [e1]
    with pytest.raises(error):
        take_arrivals(store, consumer, watcher, run, given)
    assert marks(dsn) == []
    assert query(dsn, "SELECT count(*) FROM agentpost.event_consumers") == [(0,)]
    assert take(store, "r1", [e1]) == [e1, e2]


# -- a reactive DAG under dag.test() ---------------------------------------------------------------

REACTIVE_DAG = '''
"""Written by tests/airflow/test_event_handled.py: a reactive Airflow DAG on inbox w1, without a
handler (its task returns the arrivals it handled)."""
from agentpost.factories.reactive import reactive_agent_dag

dag = reactive_agent_dag("reactive_w1", "w1")
'''

RUNNER = '''
"""Written by tests/airflow/test_event_handled.py: dag.test() the reactive DAG once per conf given,
printing what each run's task returned."""
import json
import sys

from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.db import initdb
from airflow.utils.session import create_session

initdb()
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
for conf in json.loads(sys.argv[2]):
    run = bag.get_dag("reactive_w1").test(run_conf=conf)
    with create_session() as session:
        found = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                   task_id="handle_arrivals",
                                                   key="return_value").one_or_none()
        handled = None if found is None else XComModel.deserialize_value(found)
    print("AGENTPOST-RUN " + json.dumps({"state": str(run.state), "handled": handled}),
          flush=True)
'''


@pytest.mark.slow
def test_a_reactive_run_handles_its_arrival_and_the_stranded_one_once(
        store: EnvelopeStore, dsn: str, tmp_path: Path) -> None:
    """With E1 and E2 claimed by the DAG's watcher, a run for [E1] handles E1 and E2 (E2's
    asset event stranded by the scheduler); the run for [E2] that follows handles nothing.
    dag.test() in a private Airflow, the store through the agentpost_default connection."""
    topology(store, ["w1"])
    session = ClaimSession(dsn, "asset:agentpost-inbox-w1", "w1")
    try:
        assert session.claim()[0] == []
        e1, e2 = arrive(store, session, 2)
    finally:
        session.close()
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "reactive_w1.py").write_text(REACTIVE_DAG)
    (tmp_path / "runner.py").write_text(RUNNER)
    confs = [{"arrivals": [{"envelope_id": e1}]}, {"arrivals": [{"envelope_id": e2}]}]
    proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(dags),
                           json.dumps(confs)], env=airflow_env(tmp_path, dsn), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    runs = [json.loads(line.removeprefix("AGENTPOST-RUN "))
            for line in proc.stdout.splitlines() if line.startswith("AGENTPOST-RUN ")]
    assert proc.returncode == 0 and len(runs) == 2, output[-6000:]
    first, second = runs
    assert first["state"] == "success" and second["state"] == "success", output[-6000:]
    assert [a["envelope_id"] for a in first["handled"]] == [e1, e2]
    assert first["handled"][1] == {**first["handled"][1], "watcher": "asset:agentpost-inbox-w1",
                                   "workspace_id": "w1"}
    assert second["handled"] == []
