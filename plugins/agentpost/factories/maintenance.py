"""The store's housekeeping as a DAG: sweeps, then the trail checked and checkpointed.

Three tasks, in order:

1. ``maintain``: `agentpost.store.maintenance.maintain` (what ``agentpost maintain`` runs):
   expired leases returned, due redeliveries, rule firings, stuck commands failed
   (``executor_lost``), timed-out routes moved to error-end, VACUUM ANALYZE;
2. ``verify``: `verify_trail(since=...)` since the newest checkpoint kept so far (the one
   the previous run verified): only what was added since is read, and a chain cut short or
   rewritten at its head is caught; without one, the whole trail. A failure fails the task,
   and no new checkpoint blesses the trail;
3. ``checkpoint``: the checkpoint of the heads the ``verify`` task verified (signed, in its
   XCom), written outside the database to ``<checkpoint_dir>/checkpoint-<taken_at>.json``,
   keeping the newest ``keep`` files; it is also the task's XCom (and its path the XCom
   ``path``). Not a fresh `store.checkpoint()`: entries written between the two tasks would
   be anchored without ever being verified, and the next run starts after them (the chain
   of custody, docs/design.md "Long-lived stores: verification, pruning and export").

4. ``archive_and_prune`` (off unless ``trail_retention_days`` is set): the months of the
   trail that end more than that many days ago are archived to ``trail_archive`` (verified
   since the checkpoint the run just kept) and dropped from Postgres
   (`agentpost.store.trail_archive`; docs/operations.md, "Archive and prune"). A run with
   nothing old enough does nothing.

``checkpoint_dir``, ``keep``, ``trail_retention_days`` and ``trail_archive`` come from the
factory's arguments, and a manual trigger may override them as params.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentpost.factories.common import DEFAULT_CONN_ID, dag_kwargs, store_errors
from agentpost.protocol.errors import AgentpostError, InvalidInput

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from agentpost.protocol.anchor import Checkpoint

PREFIX, SUFFIX = "checkpoint-", ".json"


def maintenance_dag(*, checkpoint_dir: str | Path | None = None, keep: int = 10,
                    schedule: Any = timedelta(minutes=5), vacuum: bool = True,
                    trail_retention_days: int | None = None,
                    trail_archive: str | Path | None = None,
                    agentpost_conn_id: str = DEFAULT_CONN_ID,
                    dag_id: str = "agentpost_maintenance", **dag_args: Any) -> DAG:
    """The maintenance DAG: maintain >> verify >> checkpoint >> archive_and_prune, every
    `schedule`."""
    from airflow.sdk import DAG, Param, get_current_context, task

    if keep < 1:
        raise InvalidInput("keep must be at least 1: verify needs the previous checkpoint")
    if trail_retention_days is not None and (trail_retention_days < 1 or not trail_archive):
        raise InvalidInput("trail_retention_days needs a trail_archive and at least 1 day")
    params = {
        "checkpoint_dir": Param(None if checkpoint_dir is None else str(checkpoint_dir),
                                type=["null", "string"],
                                description="where checkpoints are kept (outside the store)"),
        "keep": Param(keep, type="integer", minimum=1,
                      description="how many checkpoints to keep"),
        "trail_retention_days": Param(trail_retention_days, type=["null", "integer"],
                                      minimum=1, description="archive and drop the trail's "
                                      "months older than this (null: keep everything)"),
        "trail_archive": Param(None if trail_archive is None else str(trail_archive),
                               type=["null", "string"],
                               description="the trail's Parquet archive directory"),
    }

    def store() -> Any:
        from agentpost.hooks import AgentpostHook

        return AgentpostHook(agentpost_conn_id).get_store()

    def directory() -> Path:
        value = get_current_context()["params"].get("checkpoint_dir")
        if not value:
            raise InvalidInput("no checkpoint directory: give the factory checkpoint_dir= "
                               "or trigger with the param checkpoint_dir")
        return Path(value)

    with DAG(dag_id=dag_id, schedule=schedule, params=params,
             description="agentpost sweeps, trail verification and signed checkpoints",
             **dag_kwargs(**{"tags": ["agentpost", "maintenance"], **dag_args})) as dag:

        @task(task_id="maintain")
        def maintain() -> dict[str, Any]:
            from agentpost.factories.metrics import emit_store_metrics
            from agentpost.store.maintenance import maintain as sweep

            with store_errors("maintenance"), store() as opened:
                swept = sweep(opened, vacuum=vacuum)
                # Airflow's metrics ([metrics]: StatsD or OpenTelemetry) get the store's
                # numbers each run
                swept["metrics_sent"] = emit_store_metrics(opened.metrics())
                return swept

        @task(task_id="verify")
        def verify() -> dict[str, Any]:
            with store_errors("trail verification"), store() as opened:
                return verify_against_latest(opened, directory())

        @task(task_id="checkpoint")
        def checkpoint(verified: dict[str, Any]) -> dict[str, Any]:
            from agentpost.protocol.anchor import Checkpoint

            context = get_current_context()
            with store_errors("trail checkpoint"):
                taken = Checkpoint.from_json(verified["checkpoint"])
                path = save_checkpoint(taken, directory(), int(context["params"]["keep"]))
            context["ti"].xcom_push(key="path", value=str(path))
            return taken.to_dict()

        @task(task_id="archive_and_prune")
        def archive_and_prune(kept: dict[str, Any]) -> dict[str, Any]:
            params = get_current_context()["params"]
            with store_errors("trail archive"), store() as opened:
                return retain(opened, params.get("trail_retention_days"),
                              params.get("trail_archive"), json.dumps(kept))

        swept, checked = maintain(), verify()
        swept >> checked
        archive_and_prune(checkpoint(checked))
    return dag


def retain(store: Any, days: int | None, directory: str | None, since: str) -> dict[str, Any]:
    """Archive and prune the trail's months that end `days` days ago or earlier, verified
    since `since`; nothing when `days` is None or no month is that old."""
    if not days:
        return {"retention": None}
    if not directory:
        raise InvalidInput("trail_retention_days needs trail_archive, the archive's directory")
    from agentpost.store.trail_archive import archive, due, prune

    cut = (datetime.now(UTC) - timedelta(days=int(days))).date()
    if not due(store, cut):
        return {"retention": days, "cut": cut.isoformat(), "pruned": []}
    archived = archive(store, directory, cut, since=since)
    pruned = prune(store, directory, cut)
    return {"retention": days, "cut": cut.isoformat(), "archived": archived.entries,
            "pruned": pruned.partitions, "dropped": pruned.dropped, "kept": pruned.kept,
            "envelopes_dropped": pruned.envelopes}


def checkpoints(directory: Path) -> list[Path]:
    """The checkpoint files of `directory`, oldest first (their names sort by time)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX))


def save_checkpoint(checkpoint: Checkpoint, directory: Path, keep: int) -> Path:
    """Write `checkpoint` whole (a temporary file, then renamed) and delete all but the
    newest `keep` checkpoint files."""
    from agentpost.store.anchor import write_checkpoint

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot create {directory}: {exc.strerror or exc}") from None
    stamp = checkpoint.taken_at.replace("-", "").replace(":", "")
    path = directory / f"{PREFIX}{stamp}{SUFFIX}"
    write_checkpoint(checkpoint, str(path))
    for old in checkpoints(directory)[:-keep]:
        os.unlink(old)
    return path


def verify_against_latest(store: Any, directory: Path) -> dict[str, Any]:
    """`verify_trail` since the newest checkpoint in `directory` (none: the whole trail);
    the summary carries the signed checkpoint of the heads verified, for the next run.
    Raises TrailCheckFailed (one line) when the trail does not verify."""
    kept = checkpoints(directory)
    result = store.verify_trail(since=kept[-1] if kept else None)
    # kept for the metric of the trail's last verification (agentpost_trail_verified_age_seconds)
    store.record_verification(result, anchor=kept[-1].name if kept else None, by="maintenance")
    summary = {"ok": result.ok, "entries": result.entries, "chains": result.chains,
               "anchor": kept[-1].name if kept else None, "checkpoint": result.checkpoint}
    if not result.ok:
        raise TrailCheckFailed(
            f"{result.failure} (chain {result.failure_chain}, seq {result.failure_seq}); "
            f"{result.failures} failure(s) in all, checked against "
            f"{summary['anchor'] or 'no checkpoint'}")
    return summary


class TrailCheckFailed(AgentpostError):
    """The trail does not verify, or no longer reaches the previous checkpoint."""


__all__ = ["TrailCheckFailed", "checkpoints", "maintenance_dag", "retain", "save_checkpoint",
           "verify_against_latest"]
