"""The audit: what the store promises, verified at scale by Spark in one snapshot.

Every check of `verify_trail()` (each entry's hash, signature and columns, gap-free chains
linked from the genesis hash, every row the entries name present, the envelope, command and
route rows against their last signed entries, the chains against signed checkpoints kept
outside the database), plus what the
trail promises across entries: every envelope delivered once or found undeliverable (WACP §7),
channel order (WACP §4 rule 4, §5), no envelope acknowledged or consumed twice, every command
transition an allowed one (SMCL "Allowed Transitions"), every compensation aimed at a command
that executed or failed (SMCL "Compensation Model"). Each check is counted and names its
first offenders; the job exits 1 when one fails, so spark-submit and its Airflow task fail.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2
from pydantic import BaseModel, ConfigDict, Field

from agentpost.pg.db import one_line, translate
from agentpost.protocol import named_rows as nr
from agentpost.protocol.anchor import Checkpoint, load, mismatches
from agentpost.protocol.errors import AgentpostError, InvalidInput
from agentpost.spark import archive
from agentpost.spark.jobargs import add_common, settings_from
from agentpost.spark.session import literal_rows, sized_shuffles
from agentpost.spark.settings import SparkSettings
from agentpost.spark.source import Snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from agentpost.spark.audit_checks import Found

#: the order of the checks in a report
CHECKS = ("entry_hash", "entry_signature", "entry_columns", "chain_sequence", "chain_links",
          "delivered_once", "channel_order", "acked_once", "command_transitions",
          "compensation_target", "rows_exist", "lifecycle_entries", "envelope_rows", "command_rows",
          "route_rows", "checkpoint_anchors")
#: the maintenance DAG's checkpoint files (factories/maintenance.py): names sort by time
CHECKPOINT_PREFIX, CHECKPOINT_SUFFIX = "checkpoint-", ".json"
_ENVELOPES = ("SELECT e.id, e.seq, e.status, e.sender, e.recipient, "
              "e.delivered_at IS NOT NULL AS delivered, e.consumed_at IS NOT NULL AS consumed, "
              "agentpost._envelope_row(e, true)::text AS now FROM agentpost.envelopes e")
_COMMANDS = "SELECT c.id, c.state FROM agentpost.commands c"
#: offenders named per check at most (Spark limits a row_number filter up to 1,000 in each
#: partition before the shuffle: spark.sql.optimizer.windowGroupLimitThreshold)
MAX_FIRST = 1_000
#: the pseudo-check that counts delivered_once's pending envelopes
PENDING = "delivered_once.pending"
_ROUTES = ("SELECT r.id, r.envelope_id, r.current, r.end_actor, r.phase "
           "FROM agentpost.routes r")
#: the kinds of rows the trail names whose tables the audit reads whole for other checks
_READ_KINDS = (nr.ENVELOPE, nr.COMMAND, nr.ROUTE)
#: the tables of the other rows the trail names (protocol/named_rows.py): (kind, key, sub,
#: table), sub a saga step's name, else ''
_OTHER_TABLES = (
    (nr.SAGA, "id", "''", "sagas"), (nr.SAGA_STEP, "saga_id", "name", "saga_steps"),
    (nr.RULE, "id", "''", "rules"), (nr.WORKSPACE, "id", "''", "workspaces"),
    (nr.PORT_RIGHT, "id", "''", "port_rights"), (nr.ROLE, "name", "''", "roles"),
    (nr.TYPE, "name", "''", "envelope_types"))
#: every kind rows_exist looks for (a test holds it to protocol/named_rows.py's KINDS)
PRESENT_KINDS = (*_READ_KINDS, *(kind for kind, *_ in _OTHER_TABLES))
#: their keys, as rows_exist takes them: (kind, key, sub)
_OTHER_ROWS = " UNION ALL ".join(
    f"SELECT '{kind}' AS kind, {key} AS key, {sub} AS sub FROM agentpost.{table}"
    for kind, key, sub, table in _OTHER_TABLES)


class CheckResult(BaseModel):
    """One check: how many items it checked, how many failed, the first offenders' ids."""

    model_config = ConfigDict(frozen=True)

    checked: int = Field(ge=0)
    failed: int = Field(ge=0)
    first: list[str] = Field(default_factory=list)
    #: delivered_once: envelopes still queued (validated, never delivered): not failures
    pending: int = Field(default=0, ge=0)
    #: checkpoint_anchors: what is wrong with each of the first offenders
    problems: list[str] = Field(default_factory=list)


class AuditReport(BaseModel):
    """A run's report (the JSON kept in agentpost.audit_reports and written by --report)."""

    ok: bool
    started_at: datetime
    taken_at: datetime
    entries: int = Field(ge=0)
    checks: dict[str, CheckResult]

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.checks.values())

    def summary(self) -> str:
        """One line per check: checked, failed, the first offenders."""
        lines = [f"agentpost audit: {'OK' if self.ok else 'FAILED'}, {self.entries} entries, "
                 f"snapshot {self.taken_at.isoformat()}"]
        for name, c in self.checks.items():
            line = f"  {name:<20} checked {c.checked:>9}  failed {c.failed:>7}"
            if name == "delivered_once":
                line += f"  pending {c.pending}"
            if c.first:
                line += "  first: " + ", ".join(c.first)
            lines.append(line)
        return "\n".join(lines)


def run_audit(spark: SparkSession, settings: SparkSettings, *,
              checkpoints: Iterable[Checkpoint | str | bytes | dict[str, Any]] = (),
              first: int = 20) -> AuditReport:
    """Audit the store of `settings` in one snapshot. `checkpoints` are loaded and their
    signatures verified with the trail key before anything is read (InvalidAnchor)."""
    loaded = [load(c, settings.key) for c in checkpoints]
    if not 0 <= first <= MAX_FIRST:
        raise InvalidInput(f"first must be from 0 to {MAX_FIRST}")
    started = datetime.now(UTC)
    from pyspark import StorageLevel

    from agentpost.spark.audit_checks import prepare

    with Snapshot(spark, settings) as snap:
        trail = prepare(snap.trail(), settings.key).persist(StorageLevel.MEMORY_AND_DISK)
        envelopes = snap.table(_ENVELOPES, partition_column="seq")
        exported = archive.load(settings.archive) if settings.archive else None
        if exported is not None:  # with the rows a prune dropped, from the archive
            envelopes = archive.with_archived(exported, spark, envelopes, "envelopes")
        envelopes = envelopes.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            entries = trail.count()
            envelopes.count()
            with sized_shuffles(spark, entries, settings, hash_joins=True):
                checks = _run_checks(trail, envelopes, snap, exported, entries, first)
                checks["checkpoint_anchors"] = _anchors(spark, trail, loaded, first)
        finally:
            trail.unpersist()
            envelopes.unpersist()
        taken_at = snap.taken_at
    ordered = {name: checks[name] for name in CHECKS}
    return AuditReport(ok=all(c.failed == 0 for c in ordered.values()), started_at=started,
                       taken_at=taken_at, entries=entries, checks=ordered)


def _run_checks(trail: DataFrame, envelopes: DataFrame, snap: Snapshot,
                exported: archive.Export | None, entries: int,
                first: int) -> dict[str, CheckResult]:
    from pyspark import StorageLevel

    from agentpost.spark import audit_checks as ac

    commands = snap.table(_COMMANDS)
    routes = snap.table(_ROUTES)
    others = snap.table(_OTHER_ROWS)
    if exported is not None:  # with the rows a prune dropped, from the archive
        commands = archive.with_archived(exported, snap.spark, commands, "commands")
        routes = archive.with_archived(exported, snap.spark, routes, "routes")
        others = _union([others, *archive.archived_keys(exported, snap.spark)])
    present = _present(envelopes, commands, routes, others)
    # aggregates two checks or a check's two counts read: kept, so each is computed once
    # (their plans are pruned differently per use, so Spark would not reuse the shuffles)
    shared = [ac.outcomes(trail), ac.named_rows(trail)]
    outcome, named = (frame.persist(StorageLevel.MEMORY_AND_DISK) for frame in shared)
    try:
        return _checks_of(trail, envelopes, commands, routes, outcome,
                          ac.rows_exist(trail, named, present), entries, first)
    finally:
        for frame in shared:
            frame.unpersist()


def _checks_of(trail: DataFrame, envelopes: DataFrame, commands: DataFrame,
               routes: DataFrame, outcome: DataFrame, rows_exist: Found, entries: int,
               first: int) -> dict[str, CheckResult]:
    from pyspark.sql import functions as F

    from agentpost.spark import audit_checks as ac

    delivered, pending = ac.delivered_once(outcome, envelopes)
    found = [ac.entry_checks(trail), delivered, ac.channel_order(outcome),
             ac.acked_once(trail), ac.command_transitions(trail),
             ac.compensation_target(trail), rows_exist,
             ac.lifecycle_entries(trail, envelopes),
             ac.envelope_rows(trail, envelopes), ac.command_rows(trail, commands),
             ac.route_rows(trail, routes),
             ac.Found((PENDING,), pending, pending.limit(0).select(
                 F.lit(PENDING).alias("check"), F.lit(0).cast("bigint").alias("ord"),
                 F.col("envelope_id").alias("oid")))]
    counts, failed, firsts = _collect(found, first)
    results = {}
    for f in found:
        for name in f.names:
            results[name] = CheckResult(
                checked=entries if f.checked is None else counts.get(name, 0),
                failed=failed.get(name, 0), first=firsts.get(name, []))
    pending_count = results.pop(PENDING).checked
    results["delivered_once"] = results["delivered_once"].model_copy(
        update={"pending": pending_count})
    return results


def _present(envelopes: DataFrame, commands: DataFrame, routes: DataFrame,
             others: DataFrame) -> DataFrame:
    """Every row rows_exist looks for, as (kind, key, sub)."""
    from pyspark.sql import functions as F

    keyed = [frame.select(F.lit(kind).alias("kind"), F.col("id").alias("key"),
                          F.lit("").alias("sub"))
             for kind, frame in zip(_READ_KINDS, (envelopes, commands, routes), strict=True)]
    return _union([*keyed, others])


def _collect(found: Sequence[Found], first: int
             ) -> tuple[dict[str, int], dict[str, int], dict[str, list[str]]]:
    """Every check's items checked and offenders, counted in one Spark job (partial
    aggregation, so no check's rows meet in one task); then, only if a check failed, the
    first `first` offenders of each in a second (a row_number filter, which Spark limits
    in each partition before the shuffle)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bad = _union(f.bad.select("check", "ord", "oid") for f in found)
    rows = _union([bad.select("check", F.lit(True).alias("bad")),
                   *[f.checked.select(F.lit(f.names[0]).alias("check"),
                                      F.lit(False).alias("bad"))
                     for f in found if f.checked is not None]])
    totals = rows.groupBy("check").agg(
        F.sum((~F.col("bad")).cast("long")).alias("checked"),
        F.sum(F.col("bad").cast("long")).alias("failed")).collect()
    counts = {r["check"]: r["checked"] for r in totals}
    failed = {r["check"]: r["failed"] for r in totals if r["failed"]}
    firsts: dict[str, list[tuple[int, str]]] = {}
    if failed and first > 0:
        ranked = bad.select("check", "oid", F.row_number().over(
            Window.partitionBy("check").orderBy("ord", "oid")).alias("k"))
        for r in ranked.where(F.col("k") <= first).collect():
            firsts.setdefault(r["check"], []).append((r["k"], r["oid"]))
    return counts, failed, {c: [oid for _, oid in sorted(v)] for c, v in firsts.items()}


def _union(frames: Iterable[DataFrame]) -> DataFrame:
    frames = list(frames)
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _anchors(spark: SparkSession, trail: DataFrame, checkpoints: list[Checkpoint],
             first: int) -> CheckResult:
    """Every chain a checkpoint anchors that is gone, shorter or diverging (the messages of
    `protocol.anchor.mismatches`), read from the snapshot's trail."""
    from agentpost.spark.audit_checks import anchored_entries

    wanted = sorted({(h.chain, h.seq) for cp in checkpoints for h in cp.heads})
    if not wanted:
        return CheckResult(checked=0, failed=0)
    anchored = literal_rows(spark, wanted, {"chain": "string", "seq": "bigint"})
    found = {(r["chain"], r["seq"]): (None if r["hash"] is None else bytes(r["hash"]),
                                      r["head"])
             for r in anchored_entries(trail, anchored).collect()}
    problems = []
    for cp in checkpoints:
        seen = {h.chain: found[(h.chain, h.seq)] for h in cp.heads}
        problems.extend(mismatches(cp, seen))
    chains = sorted({m.chain for m in problems})
    return CheckResult(checked=len(wanted), failed=len(problems), first=chains[:first],
                       problems=[m.problem for m in problems][:first])


# -- the job -------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentpost-spark-audit",
        description="Audit the agentpost trail and the rows it signs; exit 1 if a check fails.")
    add_common(p)
    p.add_argument("--checkpoint", action="append", default=[], metavar="FILE",
                   help="a signed trail checkpoint to check the chains against (repeatable)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="the maintenance DAG's checkpoint directory: its newest "
                        "checkpoint-*.json is checked")
    p.add_argument("--no-checkpoint-ok", action="store_true",
                   help="with --checkpoint-dir: a directory with no checkpoint yet (a fresh "
                        "install, before the maintenance DAG's first run) is a warning, not an "
                        "error; the chain heads are then checked against nothing")
    p.add_argument("--report", metavar="PATH", help="also write the report (JSON) here")
    p.add_argument("--first", type=_count, default=20, metavar="N",
                   help="offending ids named per check (default 20)")
    return p


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_FIRST:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_FIRST}")
    return value


def _has_checkpoint(directory: str) -> bool:
    path = Path(directory)
    return path.is_dir() and any(p.name.startswith(CHECKPOINT_PREFIX)
                                 and p.name.endswith(CHECKPOINT_SUFFIX) for p in path.iterdir())


def newest_checkpoint(directory: str) -> Path:
    """The newest checkpoint file of the maintenance DAG's `directory`."""
    path = Path(directory)
    if not path.is_dir():
        raise InvalidInput(f"--checkpoint-dir {directory}: no such directory")
    files = sorted(p for p in path.iterdir()
                   if p.name.startswith(CHECKPOINT_PREFIX) and p.name.endswith(CHECKPOINT_SUFFIX))
    if not files:
        raise InvalidInput(f"--checkpoint-dir {directory}: no {CHECKPOINT_PREFIX}*"
                           f"{CHECKPOINT_SUFFIX} file in it")
    return files[-1]


def read_checkpoints(files: Sequence[str], directory: str | None, key: bytes) -> list[Checkpoint]:
    """Each checkpoint file loaded and its signature verified (InvalidInput otherwise)."""
    paths = [Path(f) for f in files]
    if directory:
        paths.append(newest_checkpoint(directory))
    out = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read checkpoint {path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        try:
            out.append(load(text, key))
        except InvalidInput as exc:
            raise InvalidInput(f"checkpoint {path}: {exc}") from None
    return out


def save_report(dsn: str, report: AuditReport) -> None:
    """Insert the report into agentpost.audit_reports (sql/0064_audit_reports.sql)."""
    try:
        conn = psycopg2.connect(dsn, application_name="agentpost-spark-audit")
    except psycopg2.Error as exc:
        raise translate(exc) from None
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO agentpost.audit_reports (started_at, taken_at, ok, "
                        "entries, failed, report) VALUES (%s, %s, %s, %s, %s, %s)",
                        (report.started_at, report.taken_at, report.ok, report.entries,
                         report.failed, report.model_dump_json()))
    except psycopg2.Error as exc:
        raise translate(exc) from None
    finally:
        conn.close()


def write_report(path: str, report: AuditReport) -> None:
    try:
        Path(path).write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write the report to {path}: {exc.strerror or exc}") from None


def _check_report_path(path: str | None) -> None:
    if path and not Path(path).resolve().parent.is_dir():
        raise InvalidInput(f"--report {path}: its directory does not exist")


def main(argv: list[str] | None = None) -> int:
    """Exit 0: every check passed; 1: a check failed; 2: bad input or the store unreachable
    (one line on stderr, nothing written)."""
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
        settings.jdbc()
        settings.require_jar()
        directory = args.checkpoint_dir
        if directory and args.no_checkpoint_ok and not _has_checkpoint(directory):
            print(f"agentpost audit: warning: no checkpoint in {directory} yet: the chain heads "
                  "are not checked against a signed checkpoint this run", file=sys.stderr)
            directory = None
        checkpoints = read_checkpoints(args.checkpoint, directory, settings.key)
        _check_report_path(args.report)
    except AgentpostError as exc:
        print(f"agentpost audit: {one_line(str(exc))}", file=sys.stderr)
        return 2
    return _run(args, settings, checkpoints)


def _run(args: argparse.Namespace, settings: SparkSettings,
         checkpoints: list[Checkpoint]) -> int:
    from pyspark.sql import SparkSession

    from agentpost.spark.session import spark_session

    ours = SparkSession.getActiveSession() is None
    spark = spark_session("agentpost-audit", settings, master=args.master)
    try:
        report = run_audit(spark, settings, checkpoints=checkpoints, first=args.first)
        if args.report:
            write_report(args.report, report)
        save_report(settings.libpq, report)
    except AgentpostError as exc:
        print(f"agentpost audit: {one_line(str(exc))}", file=sys.stderr)
        return 2
    finally:
        if ours:
            spark.stop()
    print(report.summary())
    print(json.dumps(report.model_dump(mode="json"), sort_keys=False))
    return 0 if report.ok else 1
