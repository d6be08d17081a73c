"""The audit's checks, each a Spark plan over the trail and the rows beside it.

Every check returns a `Found`: the items it checked (one row each) and the offending ones
(`ord`, a number that orders them, and `oid`, the id the report names: an entry id, an
envelope id, a command id or a route id; `rows_exist` names `<kind> <id>`). Everything per
row is Spark SQL built-ins (no Python UDFs), so executors on a cluster need only the JDBC
driver, not agentpost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column, Window
from pyspark.sql import functions as F

from agentpost.protocol import named_rows as nr
from agentpost.protocol.chains import LANE_PATTERN, RESERVED_PREFIXES, SYSTEM_CHAIN
from agentpost.protocol.commands import ALLOWED, CommandState
from agentpost.protocol.trail import GENESIS, key_pads

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: the body fields the checks read: each a string as get_json_object reads it, but a
#: transition (lifecycle.transition), a route's index (an int, as route_rows compares it) and
#: the signed envelope row (its JSON text, parsed for the few rows envelope_rows compares)
BODY_FIELDS = tuple(sorted({name for fields in nr.BODY_FIELDS.values() for _, name in fields}
                           | {nr.STEP_FIELD, "signal", "ref", "kind", "target_command_id",
                              "end", "phase"}))
BODY_SCHEMA = ("struct<" + ", ".join(f"`{name}`: string" for name in BODY_FIELDS)
               + ", `lifecycle`: struct<`transition`: string>, `current`: int, `row`: string>")
#: the fields of a record the entry_columns check compares with the columns, and the body
#: (one parse per entry: a field that does not parse is null, the others still are read)
RECORD_SCHEMA = ("chain string, seq bigint, event string, envelope_id string, at_us bigint, "
                 f"body {BODY_SCHEMA}")
#: the columns of a prepared entry (`prepare`) before its check of the columns and the body
#: fields (a column each, `b_<name>`: a scan decodes only the fields its check reads)
PREPARED = ("id", "chain", "chain_seq", "event", "envelope_id", "prev_hash", "hash", "hash_ok",
            "mac_ok")
#: events that change an envelope's row and sign it (sql/0017, sql/0057)
LIFECYCLE = ("envelope_created", "envelope_rejected", "envelope_delivered",
             "envelope_delivery_failed", "envelope_undeliverable", "envelope_leased",
             "lease_nacked", "lease_expired", "envelope_consumed", "envelope_requeued")
BIRTH = ("envelope_created", "envelope_rejected")
ARROW = "→"
#: a command's first transition starts here (SMCL S0, never stored as a row state)
COMMAND_START = CommandState.RECEIVED.value
ALLOWED_TRANSITIONS = tuple(sorted(f"{a.value}{ARROW}{b.value}" for a, b in ALLOWED))
REACHED = (CommandState.EXECUTED.value, CommandState.FAILED.value)


@dataclass(frozen=True)
class Found:
    """A check's plan: `checked` has a row per item checked (None: every entry), `bad` a row
    (check, ord, oid) per offender."""

    names: tuple[str, ...]
    checked: DataFrame | None
    bad: DataFrame


def _found(name: str, checked: DataFrame, frame: DataFrame, ord_col: Column | str,
           oid: Column | str) -> Found:
    return Found((name,), checked, _bad(frame, ord_col, oid, F.lit(name)))


def _bad(frame: DataFrame, ord_col: Column | str, oid: Column | str,
         check: Column | str | None = None) -> DataFrame:
    ord_c = F.col(ord_col) if isinstance(ord_col, str) else ord_col
    oid_c = F.col(oid) if isinstance(oid, str) else oid
    check_c = F.col(check) if isinstance(check, str) else check
    return frame.select(check_c.alias("check") if check_c is not None
                        else F.lit(None).cast("string").alias("check"),
                        ord_c.cast("bigint").alias("ord"), oid_c.cast("string").alias("oid"))


def _body_column(field: str) -> str:
    return f"b_{field}"


def _body(field: str) -> Column:
    """A field of the parsed body (`prepare`), e.g. "signal" or "lifecycle.transition"."""
    return F.col(_body_column(field.rsplit(".", 1)[-1]))


# -- entries -----------------------------------------------------------------------------

def prepare(trail: DataFrame, key: bytes) -> DataFrame:
    """The trail as the checks read it (PREPARED): each entry's hash, signature and columns
    checked as `protocol.trail.ChainCheck` checks them, and its body parsed, in one pass over
    `record`, which is then dropped. Every check reads these few short columns: no plan
    parses a record again, and no sort, shuffle or cache carries the signed text."""
    ipad, opad = key_pads(key)
    inner = F.unhex(F.sha2(F.concat(_binary(ipad), F.col("hash")), 256))
    mac = F.unhex(F.sha2(F.concat(_binary(opad), inner), 256))
    digest = F.unhex(F.sha2(F.concat(F.col("prev_hash"), F.encode("record", "UTF-8")), 256))
    rec = F.col("rec")
    # a record that is not a JSON object (an array, a scalar, truncated text) parses to
    # all-null fields, and its chain (a column that is never null) then differs: no second
    # parse of every record is needed to tell an object (json_object_keys was one)
    columns_ok = (rec["chain"].eqNullSafe(F.col("chain"))
                  & rec["seq"].eqNullSafe(F.col("chain_seq"))
                  & rec["event"].eqNullSafe(F.col("event"))
                  & rec["envelope_id"].eqNullSafe(F.col("envelope_id"))
                  & rec["at_us"].eqNullSafe(F.col("at_us")))
    parsed = trail.select("id", "chain", "chain_seq", "event", "envelope_id", "at_us",
                          "prev_hash", "hash", digest.eqNullSafe(F.col("hash")).alias("hash_ok"),
                          mac.eqNullSafe(F.col("mac")).alias("mac_ok"),
                          F.from_json("record", RECORD_SCHEMA).alias("rec"))
    body = rec["body"]
    fields = [body[name].alias(_body_column(name)) for name in BODY_FIELDS]
    return parsed.select(*PREPARED, columns_ok.alias("columns_ok"), *fields,
                         body["lifecycle"]["transition"].alias(_body_column("transition")),
                         body["current"].alias(_body_column("current")),
                         body["row"].alias(_body_column("row")))


def entry_checks(trail: DataFrame) -> Found:
    """entry_hash, entry_signature, entry_columns, chain_sequence, chain_links: every entry
    as `protocol.trail.ChainCheck` checks it, each entry on its own (a failure does not hide
    the rest of its chain); `trail` prepared (`prepare`)."""
    order = Window.partitionBy("chain").orderBy("chain_seq", "id")
    flags = {
        "entry_hash": F.col("hash_ok"),
        "entry_signature": F.col("mac_ok"),
        "entry_columns": F.col("columns_ok"),
        "chain_sequence": F.col("chain_seq")
        == F.coalesce(F.lag("chain_seq").over(order), F.lit(0)) + 1,
        "chain_links": F.col("prev_hash").eqNullSafe(
            F.coalesce(F.lag("hash").over(order), _binary(GENESIS))),
    }
    failing = F.filter(F.array(*[F.when(~F.coalesce(ok, F.lit(False)), F.lit(name))
                                 for name, ok in flags.items()]), lambda c: c.isNotNull())
    marked = trail.select("id", failing.alias("failing")).where(F.size("failing") > 0)
    bad = _bad(marked.select("id", F.explode("failing").alias("check")), "id", "id", "check")
    return Found(tuple(flags), None, bad)


def _binary(value: bytes) -> Column:
    """A binary literal (the key's pads, the genesis hash)."""
    return F.unhex(F.lit(value.hex()))


# -- envelopes -----------------------------------------------------------------------------

def outcomes(trail: DataFrame) -> DataFrame:
    """Per envelope with a creation, delivery or undeliverable entry, for each of the three
    (prefix c, d, u): how many (`<p>_n`), and the first's id, chain and chain_seq (`<p>_id`,
    `<p>_chain`, `<p>_seq`), in one aggregation that delivered_once and channel_order share
    (the audit keeps it while they run)."""
    events = {"c": "envelope_created", "d": "envelope_delivered", "u": "envelope_undeliverable"}
    firsts = []
    for p, event in events.items():
        this = F.col("event") == event
        firsts += [F.count(F.when(this, True)).alias(f"{p}_n"),
                   F.min(F.when(this, F.struct("id", "chain", "chain_seq"))).alias(p)]
    per = (trail.where(F.col("event").isin(*events.values())).groupBy("envelope_id")
           .agg(*firsts))
    return per.select("envelope_id", *[c for p in events for c in (
        F.col(f"{p}_n"), F.col(f"{p}.id").alias(f"{p}_id"),
        F.col(f"{p}.chain").alias(f"{p}_chain"), F.col(f"{p}.chain_seq").alias(f"{p}_seq"))])


def delivered_once(outcome: DataFrame, envelopes: DataFrame) -> tuple[Found, DataFrame]:
    """Every envelope_created has exactly one delivery outcome (WACP §7): one
    envelope_delivered, or never delivered and one envelope_undeliverable. A delivered
    envelope may be dead-lettered later (Courier §6.3: envelope_undeliverable after its
    delivery, again after a requeue); an outcome before the delivery, a second delivery or
    an outcome without a creation fails. Never delivered and no outcome: pending when its
    row is still queued (validated, no delivered_at), else a failure. `outcome`: the
    trail's `outcomes`. Returns the check and the pending envelopes."""
    rows = envelopes.select(F.col("id").alias("envelope_id"), "status", "delivered")
    joined = outcome.join(rows, "envelope_id", "left")
    silent = (F.col("d_n") == 0) & (F.col("u_n") == 0)
    queued = (F.col("status") == "validated") & ~F.coalesce(F.col("delivered"), F.lit(True))
    pending = joined.where((F.col("c_n") == 1) & silent & queued)
    failing = ((F.col("c_n") != 1) | (F.col("d_n") > 1)
               | ((F.col("d_n") == 0) & (F.col("u_n") > 1))
               | ((F.col("d_n") == 1) & (F.col("u_n") > 0) & (F.col("u_id") < F.col("d_id")))
               | (silent & ~queued))
    bad = joined.where(failing)
    ord_col = F.coalesce("c_id", "d_id", "u_id")
    return (_found("delivered_once", outcome.where(F.col("c_n") > 0).select("envelope_id"),
                  bad, ord_col, "envelope_id"),
            pending.select("envelope_id"))


def channel_order(outcome: DataFrame) -> Found:
    """WACP §4 rule 4 / §5 "Channel ordering": in each channel (the chain of the creation,
    the sender's, and the chain of the delivery, the recipient's) the recipient-chain order
    of envelope_delivered equals the sender-chain order of envelope_created. Envelopes with
    both entries are compared (a missing or second delivery is delivered_once's finding).
    `outcome`: the trail's `outcomes`."""
    pairs = outcome.where((F.col("c_n") > 0) & (F.col("d_n") > 0))
    channel = Window.partitionBy("c_chain", "d_chain")
    ranked = pairs.select(
        "envelope_id", "c_id",
        F.row_number().over(channel.orderBy("c_seq", "c_id")).alias("created_rank"),
        F.row_number().over(channel.orderBy("d_seq", "d_id")).alias("delivered_rank"))
    bad = ranked.where(F.col("created_rank") != F.col("delivered_rank"))
    return _found("channel_order", pairs.select("envelope_id"), bad, "c_id", "envelope_id")


def acked_once(trail: DataFrame) -> Found:
    """No envelope consumed twice (two envelope_consumed entries) and none acknowledged twice
    (two signal_emitted entries with signal 'acknowledged' for it)."""
    consumed = trail.where(F.col("event") == "envelope_consumed").select(
        F.col("envelope_id").alias("eid"), "id", F.lit("consumed").alias("kind"))
    acked = trail.where((F.col("event") == "signal_emitted")
                        & (_body("signal") == "acknowledged")).select(
        F.coalesce(F.col("envelope_id"), _body("ref")).alias("eid"), "id",
        F.lit("acknowledged").alias("kind"))
    counted = (consumed.unionByName(acked).groupBy("eid", "kind")
               .agg(F.count("*").alias("n"), F.min("id").alias("first_id")))
    bad = (counted.where(F.col("n") > 1).groupBy("eid")
           .agg(F.min("first_id").alias("first_id")))
    return _found("acked_once", counted.select("eid").distinct(), bad, "first_id", "eid")


# -- commands ------------------------------------------------------------------------------

def _transitions(trail: DataFrame) -> DataFrame:
    """Every command_state_change entry of a command chain with its transition split."""
    changes = trail.where(F.col("chain").startswith("command:")
                          & (F.col("event") == "command_state_change"))
    transition = _body("lifecycle.transition")
    parts = F.split(transition, ARROW)
    return changes.select(
        "id", "chain", "chain_seq", transition.alias("transition"),
        F.when(F.size(parts) == 2, parts[0]).alias("source"),
        F.when(F.size(parts) == 2, parts[1]).alias("target"))


def command_transitions(trail: DataFrame) -> Found:
    """SMCL "Allowed Transitions": each command chain's state changes are allowed ones, each
    starting where the one before ended, the first at `received` (S0)."""
    changes = _transitions(trail)
    order = Window.partitionBy("chain").orderBy("chain_seq", "id")
    expected = F.coalesce(F.lag("target").over(order), F.lit(COMMAND_START))
    marked = changes.select(
        "id", "chain",
        (F.coalesce(F.col("transition").isin(*ALLOWED_TRANSITIONS), F.lit(False))
         & F.col("source").eqNullSafe(expected)).alias("ok"))
    bad = (marked.where(~F.col("ok")).groupBy("chain").agg(F.min("id").alias("first_id")))
    return _found("command_transitions", changes.select("chain").distinct(),
                 bad, "first_id", _command_id("chain"))


def _command_id(chain: str) -> Column:
    return F.substring_index(F.col(chain), "command:", -1)


def compensation_target(trail: DataFrame) -> Found:
    """SMCL "Compensation Model": every command whose first entry has kind compensate
    targets (target_command_id) a command that reached executed or failed before it."""
    firsts = trail.where(F.col("chain").startswith("command:") & (F.col("chain_seq") == 1))
    compensations = firsts.where(_body("kind") == "compensate").select(
        "id", "chain", _body("target_command_id").alias("target"))
    reached = (_transitions(trail).where(F.col("target").isin(*REACHED))
               .groupBy("chain").agg(F.min("id").alias("reached_id"))
               .withColumnRenamed("chain", "target_chain"))
    joined = compensations.join(
        reached, F.concat(F.lit("command:"), F.col("target")) == F.col("target_chain"), "left")
    bad = joined.where(F.col("reached_id").isNull() | (F.col("reached_id") > F.col("id")))
    return _found("compensation_target", compensations.select("chain"),
                 bad, "id", _command_id("chain"))


# -- rows under the trail (store/queries.sql: lifecycle_gaps, envelope_gaps, record_gaps) ---

def lifecycle_entries(trail: DataFrame, envelopes: DataFrame) -> Found:
    """The `lifecycle_gaps` rule: a row whose state says an entry must exist in a chain (its
    creation in the sender's, its delivery and acknowledgment in the recipient's, ...) has
    that entry; a row without it is what cutting the end off a chain leaves behind. An
    inbox's acknowledgments may be in its consumer lanes (sql/0083), counted as its own."""
    status = F.col("status")
    needs = [("envelope_created", "sender",
              status.isin("validated", "acknowledged", "undeliverable")),
             ("envelope_delivered", "recipient", status == "acknowledged"),
             ("signal_emitted", "recipient", status == "acknowledged"),
             ("envelope_rejected", "sender", status == "rejected"),
             ("signal_emitted", "sender", status.isin("rejected", "undeliverable")),
             ("envelope_undeliverable", "sender", status == "undeliverable"),
             ("envelope_consumed", "recipient", F.col("consumed"))]
    wanted = envelopes.select(
        "id", "seq", F.explode(F.array(*[
            F.struct(F.lit(event).alias("event"), F.col(party).alias("chain"),
                     F.coalesce(cond, F.lit(False)).alias("required"))
            for event, party, cond in needs])).alias("need"))
    wanted = wanted.where("need.required").select("id", "seq", "need.event", "need.chain")
    present = (trail.where(F.col("envelope_id").isNotNull())
               .select(F.col("envelope_id").alias("id"), "event",
                       lane_inbox_col("chain").alias("chain")).distinct())
    missing = wanted.join(present, ["id", "event", "chain"], "left_anti")
    bad = missing.groupBy("id").agg(F.min("seq").alias("seq"))
    return _found("lifecycle_entries", envelopes.select("id"), bad, "seq", "id")


def lane_inbox_col(chain: str) -> Column:
    """`agentpost.lane_inbox` in Spark: a consumer lane's inbox, else the chain itself (the
    pattern is anchored, so any other name is left as it is)."""
    return F.regexp_replace(F.col(chain), LANE_PATTERN, "")


def envelope_rows(trail: DataFrame, envelopes: DataFrame) -> Found:
    """The `envelope_gaps` rule (WACP §3 Integrity): each envelope row, as
    `agentpost._envelope_row(e, true)` shows it now, equals field by field the `row` its last
    lifecycle entry signed and the `row.fixed` of its creation entry."""
    signed = _signed_rows(trail)
    as_map = "map<string,string>"
    now = F.from_json("now", as_map)
    rows = (envelopes.join(signed, "id", "left")
            .select("id", "seq", now.alias("now"),
                    F.from_json(now["fixed"], as_map).alias("now_fixed"),
                    F.map_filter(F.from_json("last_row", as_map), lambda k, _v: k != "fixed")
                    .alias("signed"),
                    F.from_json(F.from_json("born_row", as_map)["fixed"], as_map)
                    .alias("signed_fixed")))
    moving = rows.select("id", "seq", "now", F.explode("signed").alias("field", "value")) \
        .where(~F.col("now")[F.col("field")].eqNullSafe(F.col("value")))
    fixed = rows.select("id", "seq", "now_fixed",
                        F.explode("signed_fixed").alias("field", "value")) \
        .where(~F.col("now_fixed")[F.col("field")].eqNullSafe(F.col("value")))
    differing = moving.select("id", "seq").unionByName(fixed.select("id", "seq"))
    bad = differing.groupBy("id").agg(F.min("seq").alias("seq"))
    return _found("envelope_rows", envelopes.select("id"), bad, "seq", "id")


def _signed_rows(trail: DataFrame) -> DataFrame:
    """(id: an envelope's id, last_row: the row its last lifecycle entry signed, born_row:
    the row its first creation entry signed). The two entries' ids are found in one hash
    aggregation of short columns, and only those entries' signed text is kept (a broadcast
    semi-join) and paired up: a max_by over every lifecycle entry's text would be a sort
    aggregation of them all."""
    lifecycle = trail.where(F.col("envelope_id").isNotNull()
                            & F.col("event").isin(*LIFECYCLE))
    birth_id = F.when(F.col("event").isin(*BIRTH), F.col("id"))
    picked = (lifecycle.groupBy("envelope_id")
              .agg(F.max("id").alias("last_id"), F.min(birth_id).alias("born_id"))
              .select(F.explode(F.array("last_id", "born_id")).alias("id"))
              .where(F.col("id").isNotNull()))
    kept = lifecycle.join(F.broadcast(picked.distinct()), "id", "left_semi")
    return kept.groupBy(F.col("envelope_id").alias("id")).agg(
        F.max_by(_body("row"), "id").alias("last_row"),
        F.min_by(_body("row"), birth_id).alias("born_row"))


def command_rows(trail: DataFrame, commands: DataFrame) -> Found:
    """The `record_gaps` rule for commands: a command row's state is the target of the last
    command_state_change in its chain."""
    last = (_transitions(trail).groupBy("chain")
            .agg(F.max_by(F.split("transition", ARROW)[1], "chain_seq").alias("signed"),
                 F.min("id").alias("first_id")))
    joined = commands.join(last, F.concat(F.lit("command:"), F.col("id")) == F.col("chain"),
                           "left")
    bad = joined.where(~F.col("state").eqNullSafe(F.col("signed")))
    return _found("command_rows", commands.select("id"),
                 bad, F.coalesce(F.col("first_id"), F.lit(0)), "id")


def route_rows(trail: DataFrame, routes: DataFrame) -> Found:
    """The `record_gaps` rule for routes: a route row is where the last route_progress entry
    of its envelope left it (same route id, index, end and phase)."""
    signed = F.struct(*[_body(name).alias(name) for name in ("id", "current", "end", "phase")])
    last = (trail.where(F.col("event") == "route_progress").groupBy("envelope_id")
            .agg(F.max_by(signed, "id").alias("b"), F.max("id").alias("last_id")))
    joined = routes.join(last, "envelope_id", "left")
    same = (F.col("b.id").eqNullSafe(F.col("id"))
            & F.col("b.current").eqNullSafe(F.col("current"))
            & F.col("b.end").eqNullSafe(F.col("end_actor"))
            & F.col("b.phase").eqNullSafe(F.col("phase")))
    bad = joined.where(~F.coalesce(same, F.lit(False)))
    return _found("route_rows", routes.select("id"),
                 bad, F.coalesce(F.col("last_id"), F.lit(0)), "id")


# -- rows the trail names (store/queries.sql: missing_rows; protocol/named_rows.py) --------

def named_rows(trail: DataFrame) -> DataFrame:
    """Every row the entries name, once: (kind, key, sub, first_id: the first entry naming
    it). Kept by the audit while its checks run: rows_exist counts these and joins them."""
    return _named(trail).groupBy("kind", "key", "sub").agg(F.min("id").alias("first_id"))


def rows_exist(trail: DataFrame, named: DataFrame, present: DataFrame) -> Found:
    """The `missing_rows` rule (WACP §3 Integrity): every row the entries name (`named`: the
    trail's `named_rows`, by their envelope_id, their chain, or a field of their body) is
    among `present` (kind, key, sub: a saga step's name, else ''), but a rule whose last
    definition entry in the system chain is rule_removed (remove_rule deletes its row). The
    report names `<kind> <id>`."""
    rules = trail.where((F.col("chain") == SYSTEM_CHAIN)
                        & F.col("event").isin("rule_defined", "rule_removed"))
    removed = (rules.groupBy(_body("id").alias("key"))
               .agg(F.max_by("event", "chain_seq").alias("last"))
               .where(F.col("last") == "rule_removed")
               .select(F.lit(nr.RULE).alias("kind"), "key"))
    missing = (named.join(present, ["kind", "key", "sub"], "left_anti")
               .join(removed, ["kind", "key"], "left_anti"))
    shown = F.concat_ws(" ", "kind", F.concat_ws("/", "key", F.nullif(F.col("sub"), F.lit(""))))
    return _found("rows_exist", named.select("kind"), missing, "first_id", shown)


def _named(trail: DataFrame) -> DataFrame:
    """(kind, key, sub, id) for each row an entry names: by its envelope_id, its chain (once
    per chain), a field of its body."""
    chains = trail.groupBy("chain").agg(F.min("id").alias("id"))
    kind = F.when(F.col("chain") == SYSTEM_CHAIN, F.lit(None))
    for prefix, named in nr.CHAIN_KINDS.items():
        kind = kind.when(F.col("chain").startswith(prefix), F.lit(named))
    for prefix in RESERVED_PREFIXES:
        kind = kind.when(F.col("chain").startswith(prefix), F.lit(None))
    kind = kind.otherwise(F.lit(nr.WORKSPACE))
    key = F.when(kind == nr.WORKSPACE, F.col("chain")).otherwise(_after_prefix())
    by_field: dict[tuple[str, str], list[str]] = {}
    for event, fields in nr.BODY_FIELDS.items():
        for row_kind, name in fields:
            by_field.setdefault((row_kind, name), []).append(event)
    per_entry = [(F.lit(nr.ENVELOPE), F.col("envelope_id"), F.lit("")),
                 *[(F.lit(row_kind), F.when(F.col("event").isin(*events), _body(name)),
                    F.lit("")) for (row_kind, name), events in by_field.items()],
                 (F.lit(nr.SAGA_STEP), F.when(F.col("chain").startswith("saga:"),
                                              _after_prefix()), _body(nr.STEP_FIELD))]
    # one scan of the entries: each one's named rows as an array (those with a key), exploded
    rows = F.array(*[F.struct(row_kind.alias("kind"), row_key.alias("key"), sub.alias("sub"))
                     for row_kind, row_key, sub in per_entry])
    named = trail.select("id", F.explode(F.filter(rows, lambda r: r["key"].isNotNull()))
                         .alias("n")).select("n.*", "id")
    out = _rows(chains, kind, key).unionByName(named)
    return out.where(F.col("kind").isNotNull() & F.col("key").isNotNull()
                     & F.col("sub").isNotNull())


def _rows(frame: DataFrame, kind: Column, key: Column, sub: Column | None = None
          ) -> DataFrame:
    return frame.select(kind.alias("kind"), key.alias("key"),
                        (F.lit("") if sub is None else sub).alias("sub"), "id")


def _after_prefix() -> Column:
    """A chain's name after its `<prefix>:` (command:, saga:, rule:)."""
    return F.expr("substr(chain, instr(chain, ':') + 1)")


# -- checkpoints ---------------------------------------------------------------------------

def anchored_entries(trail: DataFrame, anchored: DataFrame) -> DataFrame:
    """For each (chain, seq) of `anchored`: the hash of the chain's entry at that seq (null:
    none) and the chain's head now (0: no entries), as the `anchored_entries` query."""
    heads = trail.groupBy("chain").agg(F.max("chain_seq").alias("head"))
    at_seq = trail.select("chain", F.col("chain_seq").alias("seq"), "hash")
    return (anchored.join(at_seq, ["chain", "seq"], "left").join(heads, "chain", "left")
            .select("chain", "seq", "hash", F.coalesce("head", F.lit(0)).alias("head")))
