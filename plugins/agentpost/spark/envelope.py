"""The statistical envelope of Markspace §9.7 applied offline, for the analytics job: per
agent, each bucket of the window judged against the agent's earlier buckets, and the worst
finding kept (docs/spark.md, "The analytics job"). Apart from `analytics.py` because it is
one self-contained computation with its own parameters (`EnvelopeRule`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from agentpost.marks import envelope as ms_envelope
from agentpost.marks.guard import SYSTEM_AGENT_ID

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from agentpost.spark.analytics import Sources

#: what an agent does, for the statistical envelope: its own writes (what it receives is
#: others' doing); the mark types are Markspace's, the rest the envelope traffic's
ENVELOPE_KINDS = ("sent", "acked", "nacked", "commands",
                  *(t.value for t in ms_envelope.ALL_TYPES))
#: writers the envelope never judges (Markspace §9.7, "Exempt agents")
EXEMPT_AGENTS = (str(SYSTEM_AGENT_ID),)


class EnvelopeRule(BaseModel):
    """The statistical envelope's parameters (Markspace §9.7; defaults as the guard's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket_seconds: float = Field(default=ms_envelope.DEFAULT_WINDOW_SECONDS, gt=0,
                                  le=86_400)
    k: float = Field(default=ms_envelope.DEFAULT_K, gt=0)
    min_samples: int = Field(default=ms_envelope.DEFAULT_MIN_SAMPLES, ge=1)
    type_shift_threshold: float = Field(default=ms_envelope.DEFAULT_TYPE_SHIFT_THRESHOLD,
                                        gt=0, le=1)
    type_shift_min: int = Field(default=5, ge=1)
    std_floor: float = Field(default=1.0, ge=0)
    concentration: int = Field(default=ms_envelope.DEFAULT_CONCENTRATION_THRESHOLD, ge=2)


def envelope_verdicts(src: Sources, events: DataFrame, rule: EnvelopeRule) -> DataFrame:
    """Markspace §9.7 applied offline: the window cut into tumbling buckets of
    `bucket_seconds` from its start; per agent and kind, each bucket's count is judged
    against the mean and sample deviation of the agent's earlier buckets (from its first
    active one: a detector starts at its agent's first write; idle buckets count as zero),
    as Welford's accumulators hold them, once `min_samples` buckets closed (P41: never
    before). Findings: rate (count > mean + k * max(sd, floor)), burst (this and the
    previous bucket > twice that), type shift (the bucket's mix of kinds further than the
    threshold from the agent's mean mix, total variation distance, with enough writes),
    concentration (`concentration` or more agents wrote marks to one (scope, topic) in the
    bucket). anomaly_score: the largest observed/threshold ratio of a ready bucket;
    anomaly: any finding; anomaly_reason: the largest finding, set exactly when anomaly."""
    from pyspark.sql import functions as F

    bucket_us = rule.bucket_seconds * 1e6
    last = int((src.end_us - src.start_us - 1) // bucket_us)
    judged = (events.where(F.col("kind").isin(*ENVELOPE_KINDS)
                           & ~F.col("agent").isin(*EXEMPT_AGENTS))
              .withColumn("bucket", F.floor((F.col("at_us") - src.start_us) / bucket_us)
                          .cast("int")))
    counts = judged.groupBy("agent", "bucket", "kind").agg(F.count("*").cast("double")
                                                          .alias("c"))
    first = judged.groupBy("agent").agg(F.min("bucket").alias("first"))
    stats = src.keep(_running(counts.join(first, "agent"), rule))
    findings = (_rate_findings(stats).unionByName(_shift_findings(stats, rule))
                .unionByName(_concentration_findings(src, first, rule, bucket_us, last)))
    flagged = F.col("flag")
    return findings.groupBy("agent").agg(
        F.max("ratio").alias("score"), F.max(flagged.cast("int")).alias("any"),
        F.max(F.when(flagged, F.struct("ratio", "bucket", "reason"))).alias("worst"),
    ).select(
        "agent", (F.col("any") == 1).alias("anomaly"), F.col("score").alias("anomaly_score"),
        F.when(F.col("any") == 1, F.format_string(
            "%s (bucket %d of %.0f s from the window start)", F.col("worst.reason"),
            F.col("worst.bucket"), F.lit(rule.bucket_seconds))).alias("anomaly_reason"))


def _running(counts: DataFrame, rule: EnvelopeRule) -> DataFrame:
    """Per (agent, bucket, kind) with a count `c` > 0: the mean and sample deviation of the
    kind's counts over the agent's earlier buckets (from its first; idle ones are zeros),
    from running sums over the agent's active buckets only: n = bucket - first earlier
    buckets, of which the active ones carry the sums (s1 of counts, s2 of squares), so
    mean = s1 / n and variance = (n s2 - s1^2) / (n (n - 1)). `prev`: the kind's count in
    the bucket before (0 when idle); `written`: every judged kind's writes of the agent in
    the earlier buckets (what the mean mix of a type shift divides by)."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    per_kind = W.partitionBy("agent", "kind").orderBy("bucket")
    before = per_kind.rowsBetween(W.unboundedPreceding, -1)
    per_agent = W.partitionBy("agent").orderBy("bucket").rangeBetween(W.unboundedPreceding, -1)
    n = F.col("n")
    s1, s2 = F.col("s1"), F.col("s2")
    variance = F.greatest(F.lit(0.0), (n * s2 - s1 * s1) / (n * (n - 1)))
    return (counts.withColumn("n", (F.col("bucket") - F.col("first")).cast("double"))
            .withColumn("s1", F.coalesce(F.sum("c").over(before), F.lit(0.0)))
            .withColumn("s2", F.coalesce(F.sum(F.col("c") * F.col("c")).over(before),
                                         F.lit(0.0)))
            .withColumn("prev", F.when(F.lag("bucket").over(per_kind) == F.col("bucket") - 1,
                                       F.lag("c").over(per_kind)).otherwise(F.lit(0.0)))
            .withColumn("written", F.coalesce(F.sum("c").over(per_agent), F.lit(0.0)))
            .withColumn("mean", F.when(n > 0, s1 / n).otherwise(F.lit(0.0)))
            .withColumn("sd", F.when(n > 1, F.sqrt(variance)).otherwise(F.lit(0.0)))
            .withColumn("ready", n >= rule.min_samples)
            .withColumn("limit", F.col("mean") + rule.k * F.greatest(
                F.col("sd"), F.lit(rule.std_floor))))


def _rate_findings(stats: DataFrame) -> DataFrame:
    """Rate and burst (per kind): ratio = observed / threshold, flagged above 1."""
    from pyspark.sql import functions as F

    ready = stats.where(F.col("ready") & (F.col("c") > 0))
    rate = ready.select(
        "agent", "bucket", (F.col("c") / F.col("limit")).alias("ratio"),
        (F.col("c") > F.col("limit")).alias("flag"),
        F.format_string("%s rate: %.0f > threshold %.2f (mean %.2f, sd %.2f)", "kind", "c",
                        "limit", "mean", "sd").alias("reason"))
    burst = ready.select(
        "agent", "bucket", ((F.col("c") + F.col("prev")) / (2 * F.col("limit"))).alias("ratio"),
        ((F.col("c") + F.col("prev")) > 2 * F.col("limit")).alias("flag"),
        F.format_string("%s burst across a bucket boundary: %.0f > threshold %.2f", "kind",
                        F.col("c") + F.col("prev"), 2 * F.col("limit")).alias("reason"))
    return rate.unionByName(burst)


def _shift_findings(stats: DataFrame, rule: EnvelopeRule) -> DataFrame:
    """Type shift (per agent and bucket): the total variation distance between the bucket's
    mix of kinds and the mean mix of the agent's earlier buckets; ratio = distance /
    threshold, flagged above 1 when the bucket has `type_shift_min` writes. A kind's share
    of the mean mix is its mean over the sum of the means, s1 / written (the n cancels). The
    kinds idle in the bucket (no row) each differ by their whole share, so the distance is
    half of: the active kinds' |share here - share before| + 1 - their shares before."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    per_bucket = W.partitionBy("agent", "bucket")
    mix = (stats.where("ready")
           .withColumn("total", F.sum("c").over(per_bucket))
           .where((F.col("total") >= rule.type_shift_min) & (F.col("written") > 0))
           .withColumn("before", F.col("s1") / F.col("written"))
           .withColumn("dev", F.col("c") / F.col("total") - F.col("before")))
    grown = F.max(F.struct("dev", "kind")).getField("kind")
    shifted = mix.groupBy("agent", "bucket").agg(
        (0.5 * (F.sum(F.abs("dev")) + 1.0 - F.sum("before"))).alias("distance"),
        grown.alias("toward"))
    return shifted.select(
        "agent", "bucket", (F.col("distance") / rule.type_shift_threshold).alias("ratio"),
        (F.col("distance") > rule.type_shift_threshold).alias("flag"),
        F.format_string("type mix shifted toward %s (distance %.2f > %.2f)", "toward",
                        "distance", F.lit(rule.type_shift_threshold)).alias("reason"))


def _concentration_findings(src: Sources, first: DataFrame, rule: EnvelopeRule,
                            bucket_us: float, last: int) -> DataFrame:
    """Concentration (across agents): `concentration` or more agents wrote marks to one
    (space, scope, topic) in a bucket; each of them is flagged (once ready: `min_samples`
    buckets after its first, within the window); ratio = writers / that number."""
    from pyspark.sql import functions as F

    topical = (src.marks.where(F.col("topic").isNotNull()
                               & ~F.col("agent").isin(*EXEMPT_AGENTS))
               .withColumn("bucket", F.floor(
                   (F.col("created_at") * 1e6 - src.start_us) / bucket_us).cast("int")))
    crowds = topical.groupBy("bucket", "space", "scope", "topic").agg(
        F.countDistinct("agent").alias("writers")).where(F.col("writers") >= rule.concentration)
    return (topical.select("agent", "bucket", "space", "scope", "topic").distinct()
            .join(crowds, ["bucket", "space", "scope", "topic"])
            .join(first, "agent")
            .where((F.col("bucket") - F.col("first") >= rule.min_samples)
                   & (F.col("bucket") <= last))
            .select("agent", "bucket",
                    (F.col("writers") / F.lit(float(rule.concentration))).alias("ratio"),
                    F.lit(True).alias("flag"),
                    F.format_string("%d agents wrote to (%s, %s) in one bucket", "writers",
                                    "scope", "topic").alias("reason")))
