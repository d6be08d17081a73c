"""Pieces the SMCL test modules share: processes released together, and processes racing one
command through `ledger.run` (the `ledger` fixture is tests/commands/conftest.py's)."""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from agentpost.store.commands import CommandLedger


def run_in_race(dsn: str, request: dict[str, Any], pause: float, barrier: Any,
                results: Any) -> None:
    """One racer (a spawned process): wait for the others, then `ledger.run` the request with
    an effect that counts its calls and lasts `pause` seconds, so the others meet it started."""
    try:
        with CommandLedger(dsn) as ledger:
            barrier.wait(timeout=60)
            ran: list[int] = []
            view = ledger.run(fn=lambda: ran.append(1) or time.sleep(pause), **request)
            results.put(("ok", view.command_id, len(ran), view.state.value))
    except BaseException:
        results.put(("error", traceback.format_exc(), 0, ""))


def spawn_together(target: Callable[..., None], argsets: list[tuple[Any, ...]],
                   timeout: float = 120) -> list[Any]:
    """Run ``target(*args, barrier, results)`` in one spawned process per argset, all released
    by one barrier; the report each put on `results`."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(argsets)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for args in argsets]
    for proc in procs:
        proc.start()
    try:
        return [results.get(timeout=timeout) for _ in procs]
    except queue.Empty:
        pytest.fail(f"a racing process did not report within {timeout:g} s")
    finally:
        for proc in procs:
            proc.join(timeout=30)


def race(dsn: str, request: dict[str, Any], processes: int,
         pause: float) -> list[tuple[str, str, int, str]]:
    """Run `request` from `processes` spawned processes at once; their reports
    (status, command id, times the effect ran, state seen)."""
    reports = spawn_together(run_in_race, [(dsn, request, pause)] * processes)
    assert all(r[0] == "ok" for r in reports), reports
    return reports
