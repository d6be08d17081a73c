"""Two triggerers for the deferral soak (agentpost.benchmarks.airflow_soak): a second
``airflow triggerer`` beside standalone's, both with a small capacity so that Airflow must
spread the deferred sensors and the asset watcher over the two; sensors held deferred while
one triggerer is killed with SIGKILL; the other takes their triggers over once the dead one's
heartbeat is older than the health-check threshold, and every held run must still end once
its envelope arrives.

Which triggerer holds which trigger is read from Airflow's metadata (`trigger.triggerer_id`,
the `job` rows of the TriggererJob), sampled while the soak runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

#: each triggerer's capacity: the held sensors and the watcher exceed one triggerer's
CAPACITY = 3
#: sensors held deferred across the kill
HELD = 4
#: seconds after its last heartbeat that a triggerer counts as gone (Airflow's default: 30)
HEALTH_CHECK_S = 10


def triggerer_env(env: dict[str, str]) -> dict[str, str]:
    """The Airflow settings both triggerers run with."""
    return {**env, "AIRFLOW__TRIGGERER__CAPACITY": str(CAPACITY),
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_S)}


@dataclass
class ExtraTriggerer:
    """``airflow triggerer`` in a process group of its own (no log server: standalone's
    triggerer serves on the default port)."""

    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False

    def start(self) -> None:
        out = self.log.open("wb")
        self.proc = subprocess.Popen(["airflow", "triggerer", "--skip-serve-logs"],
                                     env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self) -> None:
        """SIGKILL to its whole group: a crash, not a shutdown (no job end written)."""
        assert self.proc is not None
        os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        self.proc.wait(30)
        self.killed = True

    def stop(self, within: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(within)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)
        try:
            os.killpg(pgid, signal.SIGKILL)  # stragglers of the group, if any
        except ProcessLookupError:
            pass


def alive_triggerers(dsn: str, within: float = HEALTH_CHECK_S) -> list[int]:
    """The ids of the TriggererJobs that heartbeat within `within` seconds."""
    return [r[0] for r in _rows(dsn, (
        "SELECT id FROM job WHERE job_type = 'TriggererJob' AND end_date IS NULL "
        "AND latest_heartbeat > now() - %s * interval '1 second' ORDER BY id"), (within,))]


def holders(dsn: str) -> dict[int, int | None]:
    """Each trigger's triggerer (None: unassigned)."""
    return dict(_rows(dsn, 'SELECT id, triggerer_id FROM "trigger"', ()))


def _rows(dsn: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    finally:
        conn.close()


@dataclass
class Spread:
    """Samples which triggerer holds each trigger, every `every` seconds, until stopped."""

    dsn: str
    every: float = 0.5
    seen: dict[int, set[int]] = field(default_factory=dict)  #: triggerer -> triggers held
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agentpost-bench-spread",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> dict[int, int | None]:
        held = holders(self.dsn)
        for trigger, triggerer in held.items():
            if triggerer is not None:
                self.seen.setdefault(triggerer, set()).add(trigger)
        return held

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def wait_for(check: Callable[[], Any], what: str, within: float = 180.0,
             alive: Callable[[], None] | None = None) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def held_across_a_kill(api: Any, dsn: str, extra: ExtraTriggerer, spread: Spread,
                       dag_id: str, task_id: str, alive: Callable[[], None]
                       ) -> dict[str, Any]:
    """`HELD` sensor runs deferred with nothing in their inboxes, spread over both
    triggerers; the extra one killed; then each inbox gets its envelope and every run must
    end in success."""
    from agentpost.store import EnvelopeStore

    with EnvelopeStore(dsn) as store:
        spaces = [store.create_workspace("worker", parent="boss").id for _ in range(HELD)]
        runs = [api.trigger(dag_id, {"ws": ws}) for ws in spaces]
        wait_for(lambda: all(api.ti_state(dag_id, r, task_id) == "deferred" for r in runs),
                 "the held sensors to defer", alive=alive)
        # every trigger assigned (the watcher's too): capacity forces both triggerers
        held = wait_for(lambda: (lambda h: h if h and None not in h.values() else None)(
            spread.sample()), "every trigger to be assigned", alive=alive)
        by_triggerer = sorted({t for t in held.values() if t is not None})
        killed_held = 0
        if len(by_triggerer) == 2:
            victim = max(by_triggerer)  # the extra triggerer started after standalone's
            killed_held = sum(1 for t in held.values() if t == victim)
            extra.kill()
        took_over = time.monotonic()
        for ws in spaces:
            store.send("boss", ws, "directive", "after the kill")
        states = wait_for(lambda: (lambda s: s if all(x in ("success", "failed") for x in s)
                                   else None)([api.run_state(dag_id, r) for r in runs]),
                          "the held runs to end", within=240.0, alive=alive)
    return {"held": HELD, "triggerers_holding": len(by_triggerer),
            "killed_held": killed_held, "killed": extra.killed,
            "held_success": sum(s == "success" for s in states),
            "ended_after_kill_s": round(time.monotonic() - took_over, 1)}
