"""`agentpost bench growth --large`: half the history archived and pruned, then measured again.

The fill writes the inbox pairs of the first half of the large size as if in a month four
months back (the partition of their entries, signals and envelope rows, sql/0086 to 0088: only
`part_day`, which nothing signs or checks). After the large size is measured, `agentpost
trail archive` and `prune` take that month out (timed; the archive verifies since the
checkpoint the large size's `verify_trail(since=)` handed back, as the maintenance DAG's run
verifies since the checkpoint it kept), the sizes of the trail, the signals
and the envelopes are printed before and after, and
every measurement runs again beside the empty store: the rates, the latency and
`verify_trail(since=)`, which after a prune runs over heads kept from the pruned month.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from agentpost.benchmarks import growth_fill

#: how far back the pruned half is written
MONTHS_BACK = 4


@dataclass
class PruneNumbers:
    """What archiving and pruning the old half did, and the sizes around it."""

    cut: date | None = None
    archived: int = 0
    archive_s: float = 0.0
    prune_s: float = 0.0
    dropped: int = 0
    kept: int = 0
    signals: int = 0
    envelopes: int = 0
    envelopes_kept: int = 0
    locked_s: float = 0.0
    locked_total_s: float = 0.0
    trail_locked_s: float = 0.0
    whole: bool = True  # the archive verified the whole trail (no checkpoint to start from)
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)


def old_month(now: datetime | None = None) -> date:
    """The first day of the month MONTHS_BACK months ago."""
    today = (now or datetime.now(UTC)).date().replace(day=1)
    month = today.month - MONTHS_BACK
    return date(today.year + (month - 1) // 12, (month - 1) % 12 + 1, 1)


def plan_old_half(cur: Any, filled: growth_fill.Filled, large: int) -> None:
    """Make the fill write its first `large` / 2 envelopes into the old month's partition."""
    filled.old_day = old_month()
    filled.old_pairs = max(1, large // 2 // growth_fill.PER_INBOX)
    cur.execute("SELECT agentpost.trail_ensure_partitions(2, %s)", (filled.old_day,))


def sizes(side: Any) -> dict[str, int]:
    """Bytes on disk of the trail, the signals and the envelopes (every partition, indexes
    and TOAST included), and the trail's entries and the envelopes' rows."""
    found = side.store.db.fetchone(
        "SELECT " + ", ".join(f"(SELECT sum(pg_total_relation_size(relid)) FROM"
                              f" pg_partition_tree('agentpost.{t}') WHERE isleaf)"
                              for t in ("trail", "signals", "envelopes"))
        + ", (SELECT count(*) FROM agentpost.trail), (SELECT count(*) FROM agentpost.envelopes)")
    trail, signals, envelopes, entries, rows = (int(v) for v in found)
    return {"trail bytes": trail, "trail entries": entries, "signals bytes": signals,
            "envelopes bytes": envelopes, "envelopes rows": rows}


def archive_and_prune(side: Any, filled: growth_fill.Filled,
                      since: dict[str, Any] | None = None) -> PruneNumbers:
    """Archive then prune the old month, timed, with the sizes before and after. The
    archive verifies since `since` (a checkpoint a verification handed back), as the
    maintenance DAG's run does with the checkpoint it kept; without it, the whole trail."""
    from agentpost.store.trail_archive import archive, prune

    cut = date(filled.old_day.year + filled.old_day.month // 12,
               filled.old_day.month % 12 + 1, 1)
    numbers = PruneNumbers(cut=cut, before=sizes(side), whole=since is None)
    with tempfile.TemporaryDirectory(prefix="agentpost-bench-archive-") as directory:
        started = time.perf_counter()
        archived = archive(side.store, directory, cut,
                           since=None if since is None else json.dumps(since))
        numbers.archive_s = time.perf_counter() - started
        started = time.perf_counter()
        pruned = prune(side.store, directory, cut)
        numbers.prune_s = time.perf_counter() - started
    numbers.archived, numbers.dropped, numbers.kept = (archived.entries, pruned.dropped,
                                                       pruned.kept)
    numbers.signals, numbers.envelopes = pruned.signals, pruned.envelopes
    numbers.envelopes_kept, numbers.locked_s = pruned.envelopes_kept, pruned.envelopes_locked_s
    numbers.locked_total_s = pruned.envelopes_locked_total_s
    numbers.trail_locked_s = pruned.trail_locked_s
    side.store.db.scalar("SELECT 1")  # the store still answers after the drop
    numbers.after = sizes(side)
    return numbers


def report_rows(report: Any, numbers: PruneNumbers) -> None:
    mib = 1024 * 1024
    report.add("archive and prune half: the cut", f"{numbers.cut} (entries written as of "
               f"{old_month():%Y-%m})")
    verified = "verify whole" if numbers.whole else "verify since the last checkpoint"
    report.add(f"archive and prune half: archive ({verified} + Parquet)",
               f"{numbers.archive_s:,.1f} s for {numbers.archived:,} entries")
    report.add("archive and prune half: prune (check + keep + drop)",
               f"{numbers.prune_s:,.1f} s: {numbers.dropped:,} entries dropped, "
               f"{numbers.kept:,} kept; {numbers.signals:,} signals and "
               f"{numbers.envelopes:,} envelope rows dropped")
    report.add("archive and prune half: the envelopes' lock held",
               f"{numbers.locked_s:,.2f} s at most at once, {numbers.locked_total_s:,.2f} s in "
               f"all (to move {numbers.envelopes_kept:,} rows kept, a batch at a time, and "
               "drop the month)")
    report.add("archive and prune half: the trail's lock held",
               f"{numbers.trail_locked_s:,.2f} s (to detach and drop its months; every append "
               "waits that long)")
    for name in ("trail bytes", "signals bytes", "envelopes bytes"):
        before, after = numbers.before[name], numbers.after[name]
        report.add(f"archive and prune half: {name.split()[0]} size",
                   f"{before / mib:,.0f} MiB before, {after / mib:,.0f} MiB after "
                   f"({after / before:.2f}x)")
    for name in ("trail entries", "envelopes rows"):
        report.add(f"archive and prune half: {name}",
                   f"{numbers.before[name]:,} before, {numbers.after[name]:,} after")



#: the longest an agent's step may wait for one of the prune's locks
LOCK_GOAL_S = 1.0


def goal(report: Any, numbers: PruneNumbers) -> None:
    """The space goes with the partitions: the trail and the envelopes after the prune are
    no larger than their rows' share of them before (10% slack); and the agents never wait
    long for the prune, however many rows it keeps."""
    longest = max(numbers.locked_s, numbers.trail_locked_s)
    report.goal(f"the prune holds the trail's and the envelopes' locks under {LOCK_GOAL_S:.0f} s"
                f" at once, whatever it drops and keeps (trail {numbers.trail_locked_s:.2f} s "
                f"for {numbers.dropped:,} entries dropped; envelopes {numbers.locked_s:.2f} s "
                f"for {numbers.envelopes_kept:,} rows kept)", longest < LOCK_GOAL_S)
    for table, whose, rows in (("trail", "trail's", "entries"),
                               ("envelopes", "envelopes'", "rows")):
        share = numbers.after[f"{table} {rows}"] / numbers.before[f"{table} {rows}"]
        ratio = numbers.after[f"{table} bytes"] / numbers.before[f"{table} bytes"]
        report.goal(f"after the prune the {whose} size follows what is left of it"
                    f" ({ratio:.2f}x the bytes for {share:.2f}x the {rows})",
                    ratio <= share * 1.1)
