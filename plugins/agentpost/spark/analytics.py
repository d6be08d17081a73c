"""The analytics job: what one time window of the trail, and the rows beside it, say about
delivery, conflicts, needs, commands and agents, written to the analytics tables
(sql/0061_trail_analytics.sql, sql/0063_more_analytics.sql; the contract is docs/ui.md,
"Trail analytics"; how each table is computed, docs/spark.md, "The analytics job").

Every read goes through one `Snapshot`, so all tables describe the store at one moment, and
every row is computed in Spark with built-in functions (no Python UDFs: executors need only
the JDBC driver). The driver collects each table's (small) result inside the snapshot and
then replaces the window's rows of every table, and records the run, in one transaction: a
re-run of a window replaces its rows, other windows are untouched.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg2.extensions import adapt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpost.marks import envelope as ms_envelope
from agentpost.marks.core import ConflictPolicy
from agentpost.pg.queries import load_queries
from agentpost.protocol.errors import AgentpostError, ConfigurationError, InvalidInput
from agentpost.spark import jobargs
from agentpost.spark.envelope import EnvelopeRule, envelope_verdicts
from agentpost.spark.results import TableRows, Window, replace_window, rows_of
from agentpost.spark.session import sized_shuffles
from agentpost.spark.settings import SparkSettings
from agentpost.spark.source import Snapshot

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

JOB = "analytics"
Q = load_queries("agentpost.spark", "analytics.sql")
#: the policy written for a scope the job was not told about (the store does not keep it)
UNKNOWN_POLICY = "unknown"
#: the result tables and their columns after the window, in the order they are written
COLUMNS: dict[str, tuple[str, ...]] = {
    "analytics_inbox_latency": ("inbox", "delivered", "p50_ms", "p95_ms", "p99_ms"),
    "analytics_channel_latency": ("sender", "inbox", "delivered", "p50_ms", "p95_ms",
                                  "p99_ms"),
    "analytics_delivery_outcomes": ("inbox", "outcome", "reason", "count", "rate"),
    "analytics_conflicts": ("scope", "policy", "outcome", "count"),
    "analytics_needs": ("space", "scope", "cluster_key", "opened", "resolved", "still_open",
                        "ttr_p50_s", "ttr_p95_s"),
    "analytics_commands": ("workspace", "action", "commands", "executed", "failed",
                           "rejected", "canceled", "compensated", "compensation_rate"),
    "analytics_agent_activity": ("agent", "sent", "received", "acked", "nacked", "marks",
                                 "commands", "anomaly", "anomaly_score", "anomaly_reason"),
}
#: the events the tables are computed from (the job reads no other entries)
EVENTS = ("envelope_created", "envelope_rejected", "envelope_delivered", "envelope_consumed",
          "lease_nacked", "lease_expired", "envelope_redelivered", "envelope_delivery_failed",
          "envelope_undeliverable")
#: what the entries' bodies hold that the job reads (one JSON parse per entry)
_BODY = ("STRUCT<`body`: STRUCT<`from`: STRING, `to`: STRING, `workspace_id`: STRING, "
         "`reason`: STRING, `dead_lettered`: BOOLEAN, `next_attempt_at`: STRING, "
         "`row`: STRUCT<`delivered_at_us`: BIGINT, `fixed`: STRUCT<`created_at_us`: BIGINT>>>>")


class Options(BaseModel):
    """What the job is told besides the window: the scopes' conflict policies (the mark
    space does not store them) and the envelope's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policies: dict[str, ConflictPolicy] = Field(default_factory=dict)
    envelope: EnvelopeRule = Field(default_factory=EnvelopeRule)


def run_analytics(spark: SparkSession, settings: SparkSettings, window: Window,
                  options: Options | None = None) -> dict[str, int]:
    """Compute every analytics table for `window` and replace its rows; returns the rows
    written per table (and `source_rows`, the trail entries read)."""
    options = options or Options()
    with Snapshot(spark, settings) as snap:
        src = Sources(snap, window)
        try:
            source_rows = snap.trail_count(start=window.start, end=window.end)
            with sized_shuffles(spark, src.entries.count(), settings):
                tables = _tables(src, options)
        finally:
            src.release()
    replace_window(settings.libpq, JOB, window, tables, source_rows)
    return {**{t.table: len(t.rows) for t in tables}, "source_rows": source_rows}


class Sources:
    """The window's inputs as DataFrames, read in the snapshot and cached (every table reads
    the trail entries, several the marks and commands; a JDBC source is otherwise read
    again by every plan that uses it). `release()` drops the caches."""

    def __init__(self, snap: Snapshot, window: Window) -> None:
        self.snap = snap
        self._kept: list[DataFrame] = []
        params = {"start": window.start, "end": window.end,
                  "start_s": window.start.timestamp(), "end_s": window.end.timestamp()}
        self.start_us = _micros(window.start)
        self.end_us = _micros(window.end)
        self.entries = self.keep(_entries(snap, window))
        self.creations = self._read("creations", params, "id")
        self.commands = self._read("commands", params)
        self.marks = self._read("marks", params, "seq")
        self.needs_resolved = self._read("needs_resolved_in_window", params, "seq")
        self.contested = self._read("contested", params, "seq")
        self.verdicts = self._read("verdicts", params)

    def _read(self, name: str, params: Mapping[str, Any],
              partition: str | None = None) -> DataFrame:
        return self.keep(self.snap.table(_bind(Q[name], params), partition_column=partition))

    def keep(self, frame: DataFrame) -> DataFrame:
        """`frame`, cached until `release()`."""
        self._kept.append(frame.cache())
        return frame

    def release(self) -> None:
        for frame in self._kept:
            frame.unpersist()
        self._kept.clear()


def _bind(sql: str, params: Mapping[str, Any]) -> str:
    """`sql` with its %(name)s parameters as SQL literals (a JDBC source takes SQL text)."""
    return sql % {k: adapt(v).getquoted().decode("ascii") for k, v in params.items()}


def _micros(at: datetime) -> int:
    return round(at.timestamp() * 1_000_000)


def _entries(snap: Snapshot, window: Window) -> DataFrame:
    """The window's entries of EVENTS (the filter goes to Postgres with the read) with the
    body fields the job reads, parsed once."""
    from pyspark.sql import functions as F

    trail = snap.trail(start=window.start, end=window.end)
    trail = trail.where(F.col("event").isin(*EVENTS))
    b = _body("record")
    return trail.select(
        "id", "chain", "event", "envelope_id", "at_us",
        b.getField("from").alias("sender"), b.getField("to").alias("recipient"),
        b.getField("workspace_id").alias("workspace"), b.getField("reason").alias("reason"),
        F.coalesce(b.getField("dead_lettered"), F.lit(False)).alias("dead_lettered"),
        b.getField("next_attempt_at").alias("next_attempt_at"),
        b.getField("row").getField("delivered_at_us").alias("delivered_us"),
        _created_us(b))


def _body(record: str) -> Column:
    """The body of the JSON in column `record`, with the fields of _BODY."""
    from pyspark.sql import functions as F

    return F.from_json(record, _BODY).getField("body")


def _created_us(body: Column) -> Column:
    """A creation entry's signed created_at_us."""
    return body.getField("row").getField("fixed").getField("created_at_us").alias("created_us")


def _tables(src: Sources, options: Options) -> list[TableRows]:
    latency = src.keep(_latencies(src))
    frames = {
        "analytics_inbox_latency": _percentiles(latency, ["inbox"]),
        "analytics_channel_latency": _percentiles(latency, ["sender", "inbox"]),
        "analytics_delivery_outcomes": _outcomes(src),
        "analytics_conflicts": _conflicts(src, options.policies),
        "analytics_needs": _needs(src),
        "analytics_commands": _commands(src),
        "analytics_agent_activity": _activity(src, options.envelope),
    }
    return [TableRows(table=name, columns=COLUMNS[name],
                      rows=rows_of(frame.collect(), COLUMNS[name]))
            for name, frame in frames.items()]


# -- delivery ------------------------------------------------------------------------------


def _latencies(src: Sources) -> DataFrame:
    """One row per envelope delivered in the window: sender, inbox, ms from its creation
    (the creation entry's signed created_at_us) to its delivery (the delivery entry's
    delivered_at_us)."""
    from pyspark.sql import functions as F

    born = F.col("event") == "envelope_created"
    earlier = src.creations.select("envelope_id", _created_us(_body("record")))
    created = src.entries.where(born).select("envelope_id", "created_us").unionByName(earlier)
    delivered = src.entries.where(F.col("event") == "envelope_delivered").select(
        "envelope_id", F.coalesce("recipient", "chain").alias("inbox"), "sender",
        "delivered_us")
    return delivered.join(created, "envelope_id").select(
        "sender", "inbox",
        F.greatest(F.lit(0.0), (F.col("delivered_us") - F.col("created_us")) / 1000.0)
        .alias("ms"))


def _percentiles(latency: DataFrame, keys: list[str]) -> DataFrame:
    """Per `keys`: envelopes delivered and the exact p50, p95, p99 of their latency
    (`percentile`: linear interpolation between the closest ranks)."""
    from pyspark.sql import functions as F

    p = F.percentile("ms", [0.5, 0.95, 0.99])
    return latency.groupBy(*keys).agg(F.count("*").alias("delivered"), p.alias("p")).select(
        *keys, "delivered", *[F.col("p")[i].alias(name)
                              for i, name in enumerate(("p50_ms", "p95_ms", "p99_ms"))])


def _outcomes(src: Sources) -> DataFrame:
    """Redeliveries (reason: what caused them), dead letters and rejections (their
    reasons) per inbox; rate = the envelopes with that outcome / the inbox's envelopes in
    play in the window (sent to it in the window, or with any outcome in it)."""
    from pyspark.sql import functions as F

    e = src.entries
    ev = F.col("event")
    inbox = F.coalesce("recipient", "workspace", "chain")
    outcome = (F.when(ev == "envelope_redelivered", F.lit("redelivered"))
               .when(ev.isin("lease_nacked", "lease_expired") & ~F.col("dead_lettered"),
                     F.lit("redelivered"))
               .when((ev == "envelope_delivery_failed") & F.col("next_attempt_at").isNotNull(),
                     F.lit("redelivered"))
               .when(ev == "envelope_undeliverable", F.lit("dead_lettered"))
               .when(ev == "envelope_rejected", F.lit("rejected")))
    reason = (F.when(ev == "envelope_redelivered", F.lit("duplicate"))
              .when(ev == "lease_nacked", F.lit("nacked"))
              .when(ev == "lease_expired", F.lit("lease_expired"))
              .when(ev == "envelope_delivery_failed", F.lit("delivery_failed"))
              .otherwise(F.coalesce("reason", F.lit(""))))
    found = (e.select(inbox.alias("inbox"), outcome.alias("outcome"), reason.alias("reason"),
                      "envelope_id")
             .where(F.col("outcome").isNotNull()))
    sent = e.where(ev.isin("envelope_created", "envelope_rejected")).select(
        F.col("recipient").alias("inbox"), "envelope_id")
    in_play = (sent.unionByName(found.select("inbox", "envelope_id")).distinct()
               .groupBy("inbox").agg(F.count("*").alias("in_play")))
    counted = found.groupBy("inbox", "outcome", "reason").agg(
        F.count("*").alias("count"), F.countDistinct("envelope_id").alias("envelopes"))
    return counted.join(in_play, "inbox").select(
        "inbox", "outcome", "reason", "count",
        (F.col("envelopes") / F.col("in_play")).alias("rate"))


# -- marks ---------------------------------------------------------------------------------


def _conflicts(src: Sources, policies: Mapping[str, ConflictPolicy]) -> DataFrame:
    """Contested intents written in the window, per scope, policy and outcome. An intent is
    contested when another agent's intent on the same (space, scope, resource) lived at the
    same time (Markspace §6). Its outcome is its deferred verdict when a boundary decided it
    (`won`, `won, acted`, `lost`, `no winner`, as the marks page says), else what its agent
    did while it lived: `acted` (an action on the resource) or `yielded`."""
    from pyspark.sql import functions as F

    marks = src.contested
    key = ["space", "scope", "resource"]
    replaced = (marks.where(F.col("mark_type") == "intent")
                .where(F.col("supersedes").isNotNull())
                .select(F.col("supersedes").alias("id"), "space"))
    intents = (marks.where(F.col("mark_type") == "intent").join(replaced, ["space", "id"],
                                                                  "left_anti")
               .select(*key, "id", "agent", "created_at",
                       (F.col("created_at") + F.col("ttl")).alias("ends")))
    a, b = intents.alias("a"), intents.alias("b")
    start_s, end_s = src.start_us / 1e6, src.end_us / 1e6
    contested = (a.join(b, [F.col(f"a.{k}") == F.col(f"b.{k}") for k in key]
                        + [F.col("a.agent") != F.col("b.agent"),
                           F.col("a.created_at") < F.col("b.ends"),
                           F.col("b.created_at") < F.col("a.ends")])
                 .where((F.col("a.created_at") >= start_s) & (F.col("a.created_at") < end_s))
                 .select("a.*").distinct())
    actions = (marks.where((F.col("mark_type") == "action") & ~F.col("failed"))
               .select(*key, F.col("agent").alias("actor"),
                       F.col("created_at").alias("acted_at")))
    acted = (contested.join(actions, key).where(
        (F.col("actor") == F.col("agent")) & (F.col("acted_at") >= F.col("created_at"))
        & (F.col("acted_at") <= F.col("ends")))
        .select("space", "id").distinct().withColumn("acted", F.lit(True)))
    verdicts = src.verdicts.select("space", F.col("intent_id").alias("id"), "allowed",
                                   "winner_id", "consumed")
    judged = contested.join(verdicts, ["space", "id"], "left").join(acted, ["space", "id"],
                                                                    "left")
    outcome = (F.when(F.col("allowed") & F.col("consumed"), F.lit("won, acted"))
               .when(F.col("allowed"), F.lit("won"))
               .when(F.col("allowed").isNotNull() & F.col("winner_id").isNull(),
                     F.lit("no winner"))
               .when(F.col("allowed").isNotNull(), F.lit("lost"))
               .when(F.col("acted").isNotNull(), F.lit("acted"))
               .otherwise(F.lit("yielded")))
    return judged.select("scope", _policy(policies).alias("policy"),
                         outcome.alias("outcome")).groupBy("scope", "policy", "outcome").agg(
        F.count("*").alias("count"))


def _policy(policies: Mapping[str, ConflictPolicy]) -> Column:
    from pyspark.sql import functions as F

    if not policies:
        return F.lit(UNKNOWN_POLICY)
    pairs = [F.lit(x) for scope, p in sorted(policies.items()) for x in (scope, p.value)]
    return F.coalesce(F.create_map(*pairs)[F.col("scope")], F.lit(UNKNOWN_POLICY))


def _question_key(column: str) -> Column:
    """The need clustering key of the mark space (`marks.core.question_key`): the question
    in lower case, runs of non-word characters (Unicode classes) as one space, trimmed.
    Python case-folds where Spark lowers: they differ for a few letters (ß: ss)."""
    from pyspark.sql import functions as F

    spaced = F.regexp_replace(F.lower(F.coalesce(F.col(column), F.lit(""))), r"(?U)\W+", " ")
    return F.trim(spaced)


def _needs(src: Sources) -> DataFrame:
    """Per (space, scope, question key) (Markspace §8.4's clusters): needs opened in the
    window, resolved in the window, opened in it and still open at its end, and the time to
    resolution (seconds) of the resolutions in the window."""
    from pyspark.sql import functions as F

    m = src.marks
    key = ["space", "scope", "cluster_key"]
    is_copy = (F.col("mark_type") == "need") & F.col("resolved_by").isNotNull()
    opened = (m.where((F.col("mark_type") == "need") & F.col("resolved_by").isNull())
              .select("space", "id", "scope", _question_key("question").alias("cluster_key")))
    ended = m.where(F.col("supersedes").isNotNull()).select(
        "space", F.col("supersedes").alias("id")).distinct()
    still = opened.join(ended, ["space", "id"], "left_anti")
    copies = m.where(is_copy).select("space", F.col("supersedes").alias("id"),
                                     F.col("created_at").alias("resolved_at"))
    originals = src.needs_resolved.select(
        "space", "id", "scope", _question_key("question").alias("cluster_key"), "created_at")
    resolved = copies.join(originals, ["space", "id"]).select(
        *key, F.greatest(F.lit(0.0), F.col("resolved_at") - F.col("created_at")).alias("s"))
    ttr = resolved.groupBy(*key).agg(
        F.count("*").alias("resolved"),
        F.percentile("s", [0.5, 0.95]).alias("p"))
    counts = opened.groupBy(*key).agg(F.count("*").alias("opened")).join(
        still.groupBy(*key).agg(F.count("*").alias("still_open")), key, "left")
    return counts.join(ttr, key, "full").select(
        *key, F.coalesce("opened", F.lit(0)).alias("opened"),
        F.coalesce("resolved", F.lit(0)).alias("resolved"),
        F.coalesce("still_open", F.lit(0)).alias("still_open"),
        F.col("p")[0].alias("ttr_p50_s"), F.col("p")[1].alias("ttr_p95_s"))


# -- commands ------------------------------------------------------------------------------


def _commands(src: Sources) -> DataFrame:
    """Commands submitted in the window per workspace and action, by current state (SMCL):
    primary commands and their retries and reprocessings (the recovery commands that cancel
    or compensate another act on it, not on the action). compensation_rate = compensated /
    those that ended executed or failed (compensated ones did), 0 when none did."""
    from pyspark.sql import functions as F

    c = src.commands.where(F.col("kind").isin("primary", "retry", "reprocess"))

    def n(*states: str) -> Column:
        return F.count(F.when(F.col("state").isin(*states), True))

    done = n("executed", "failed", "compensated")
    return c.groupBy("workspace", "action").agg(
        F.count("*").alias("commands"), n("executed").alias("executed"),
        n("failed").alias("failed"), n("rejected").alias("rejected"),
        n("canceled").alias("canceled"), n("compensated").alias("compensated"),
        F.when(done > 0, n("compensated") / done).otherwise(F.lit(0.0))
        .alias("compensation_rate"))


# -- agents --------------------------------------------------------------------------------


def _agent_events(src: Sources) -> DataFrame:
    """(agent, kind, at_us) of everything agents did in the window: a workspace's envelope
    traffic and commands, a mark-space agent's (by its UUID) mark writes by mark type (not
    the copies that resolving a need writes in the need's agent's name)."""
    from pyspark.sql import functions as F

    from agentpost.spark.audit_checks import lane_inbox_col

    e = src.entries
    ev = F.col("event")
    traffic = e.select(
        F.when(ev.isin("envelope_created", "envelope_rejected"), F.col("sender"))
        .when(ev.isin("envelope_delivered", "envelope_consumed"), lane_inbox_col("chain"))
        .when(ev == "lease_nacked", F.coalesce("workspace", "chain")).alias("agent"),
        F.when(ev.isin("envelope_created", "envelope_rejected"), F.lit("sent"))
        .when(ev == "envelope_delivered", F.lit("received"))
        .when(ev == "envelope_consumed", F.lit("acked"))
        .when(ev == "lease_nacked", F.lit("nacked")).alias("kind"),
        "at_us").where(F.col("kind").isNotNull())
    commands = src.commands.select(F.col("workspace").alias("agent"),
                                   F.lit("commands").alias("kind"), "at_us")
    marks = src.marks.where(~((F.col("mark_type") == "need") & F.col("resolved_by").isNotNull())
                            ).select("agent", F.col("mark_type").alias("kind"),
                                     (F.col("created_at") * 1e6).cast("long").alias("at_us"))
    return traffic.unionByName(commands).unionByName(marks).where(F.col("agent").isNotNull())


def _activity(src: Sources, rule: EnvelopeRule) -> DataFrame:
    """Per agent: its counts in the window, and the statistical envelope's verdict on it."""
    from pyspark.sql import functions as F

    events = src.keep(_agent_events(src))
    marks = F.col("kind").isin(*[t.value for t in ms_envelope.ALL_TYPES])
    counts = events.groupBy("agent").agg(
        *[F.count(F.when(F.col("kind") == k, True)).alias(k)
          for k in ("sent", "received", "acked", "nacked", "commands")],
        F.count(F.when(marks, True)).alias("marks"))
    verdicts = envelope_verdicts(src, events, rule)
    return counts.join(verdicts, "agent", "left").select(
        *COLUMNS["analytics_agent_activity"][:7],
        F.coalesce("anomaly", F.lit(False)).alias("anomaly"), "anomaly_score",
        "anomaly_reason")


# -- command line --------------------------------------------------------------------------


def parse_policies(text: str) -> dict[str, ConflictPolicy]:
    """`scope=policy,...` (policies: first_writer, highest_confidence, yield_all)."""
    out: dict[str, ConflictPolicy] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        scope, sep, policy = item.partition("=")
        if not sep or not scope.strip():
            raise InvalidInput(f"--policies: {item!r} is not scope=policy")
        try:
            out[scope.strip()] = ConflictPolicy(policy.strip().lower())
        except ValueError:
            choices = ", ".join(p.value for p in ConflictPolicy)
            raise InvalidInput(f"--policies: unknown conflict policy {policy.strip()!r} for "
                               f"scope {scope.strip()!r} (one of {choices})") from None
    return out


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and an exit code instead of SystemExit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise _Exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="run_analytics", description="Compute the trail analytics of one time window "
        "and replace that window's rows of the analytics tables.")
    jobargs.add_common(parser)
    jobargs.add_window(parser, required=True)
    parser.add_argument("--policies", default="",
                        help="the scopes' conflict policies, scope=policy,... (the mark "
                             "space does not store them; others are written 'unknown')")
    parser.add_argument("--bucket-seconds", type=float,
                        default=ms_envelope.DEFAULT_WINDOW_SECONDS,
                        help="the statistical envelope's window (Markspace §9.7), seconds")
    return parser


def _inputs(argv: list[str] | None) -> tuple[SparkSettings, Window, Options, str | None]:
    args = _parser().parse_args(argv)
    settings = jobargs.settings_from(args)
    try:
        window = jobargs.window_from(args)
        options = Options(policies=parse_policies(args.policies),
                          envelope=EnvelopeRule(bucket_seconds=args.bucket_seconds))
    except ValidationError as exc:
        raise InvalidInput(_first_error(exc)) from None
    return settings, window, options, args.master


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err['msg']}" if where else str(err["msg"]).removeprefix("Value error, ")


def main(argv: list[str] | None = None) -> int:
    """Run the job for `--start`/`--end`; print the rows written per table. Exit 2 on bad
    input (nothing written), 1 when the store fails."""
    try:
        settings, window, options, master = _inputs(argv)
        settings.jdbc()
        settings.require_jar()
    except _Exit as stop:
        return stop.code
    except (InvalidInput, ConfigurationError) as exc:
        print(f"run_analytics: {exc}", file=sys.stderr)
        return 2
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    from agentpost.spark.session import spark_session

    try:
        spark = spark_session("agentpost-analytics", settings, master=master)
        summary = run_analytics(spark, settings, window, options)
    except AgentpostError as exc:
        print(f"run_analytics: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidInput | ConfigurationError) else 1
    except (PySparkException, Py4JError) as exc:  # a JDBC read or a Spark stage failed
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"run_analytics: the Spark job failed, nothing written: {first}",
              file=sys.stderr)
        return 1
    print(f"analytics {window.start.isoformat()} .. {window.end.isoformat()}: "
          + ", ".join(f"{k} {v}" for k, v in summary.items()))
    return 0
