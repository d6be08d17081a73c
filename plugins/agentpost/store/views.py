"""Read-side views of the inboxes: Courier's stats (§10) and the latestPerAgent view (§9).

Both are computed when read, from indexes, so they cost no write on the hot paths: stats look
at one inbox's index ranges and its most recent envelopes; latestPerAgent probes one index
entry per workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentpost.pg.db import Database
from agentpost.protocol.leases import InboxStats, stream_of
from agentpost.protocol.models import Envelope
from agentpost.store.checks import ref as _ref
from agentpost.store.metrics import DEFAULT_TOP, StoreMetrics, read_metrics, record_verification
from agentpost.store.queries import QUERIES

#: rates and latencies look at most this many of an inbox's most recent envelopes ...
STATS_SAMPLE = 1000
#: ... received within this window (seconds)
STATS_WINDOW_S = 60.0


class ViewOps:
    """The view half of EnvelopeStore (mixed in)."""

    db: Database

    #: provided by EnvelopeStore: an Envelope from a row of the envelope select list
    _envelope_row: Callable[[Sequence[Any]], Envelope]

    def stats(self, workspace_id: str) -> InboxStats:
        """Depth, in-flight, rates, counters and enqueue→first-lease latency of one inbox."""
        ws = _ref(workspace_id, "workspace id")
        self.workspace(ws)  # type: ignore[attr-defined]  # unknown inbox -> NotFound
        body = self.db.scalar(QUERIES["inbox_stats"], {
            "ws": ws, "sample": STATS_SAMPLE, "window_s": STATS_WINDOW_S})
        return InboxStats(workspace_id=ws, stream=stream_of(ws), window_s=STATS_WINDOW_S,
                          **body)

    def metrics(self, *, top: int | None = DEFAULT_TOP) -> StoreMetrics:
        """What operators watch, in one snapshot (agentpost.store.metrics): the `top`
        deepest inboxes named, the rest summed (None: every inbox named)."""
        return read_metrics(self.db, top=top)

    def record_verification(self, result: Any, *, anchor: str | None, by: str) -> None:
        """Keep that the trail was verified (a `TrailVerification`) against `anchor` (a
        checkpoint's name, None: the whole trail), for the metric of its age."""
        record_verification(self.db, ok=result.ok, entries=result.entries, anchor=anchor,
                            by=by)

    def stats_all(self) -> list[InboxStats]:
        """Stats of every workspace's inbox."""
        return [self.stats(w.id) for w in self.workspaces()]  # type: ignore[attr-defined]

    def latest_per_agent(self) -> dict[str, Envelope]:
        """The last envelope delivered to each inbox, keyed by stream name."""
        rows = self.db.fetchall(QUERIES["latest_per_agent"], {"ws": None})
        return {stream_of(r[0]): self._envelope_row(r[1:]) for r in rows}

    def latest_of(self, workspace_id: str) -> Envelope | None:
        """The last envelope delivered to one inbox (for live updates of the view)."""
        rows = self.db.fetchall(QUERIES["latest_per_agent"],
                                {"ws": _ref(workspace_id, "workspace id")})
        return self._envelope_row(rows[0][1:]) if rows else None
