"""The in-memory space's index: marks bucketed by (scope, type, resource or topic), each
bucket in write order with how long its marks can live, so reads skip faded marks.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from uuid import UUID

from agentpost.marks.core import (
    Agent,
    DecayConfig,
    Mark,
    MarkType,
    WatchPattern,
    mark_resource,
    mark_topic,
    trust_weight,
)
from agentpost.marks.space.protocol import BucketKey

# --------------------------------------------------------------------------- buckets


def _life(mark: Mark, decay: DecayConfig) -> float:
    """How long a mark can stay alive: TTL for intents, half-life for observations and
    warnings (scaled at read time), forever for actions and needs."""
    if mark.mark_type is MarkType.INTENT:
        return decay.intent_ttl
    if mark.mark_type is MarkType.OBSERVATION:
        return decay.observation_half_life
    if mark.mark_type is MarkType.WARNING:
        return decay.warning_half_life
    return math.inf


#: slack when bisecting by time, so float rounding never hides a mark that is still alive
_TIME_SLACK = 1e-6


class _Bucket:
    """Marks of one mark type under one key, in created_at order, with what a read needs
    to skip the ones too old to matter: the longest life and the strongest start."""

    __slots__ = ("dead", "kind", "marks", "max_life", "max_weight", "times")

    def __init__(self, kind: MarkType) -> None:
        self.kind = kind
        self.marks: list[Mark] = []
        self.times: list[float] = []
        self.max_life = 0.0
        self.max_weight = 0.0
        self.dead = 0

    def add(self, mark: Mark, life: float) -> None:
        self.marks.append(mark)
        self.times.append(mark.created_at)
        self.max_life = max(self.max_life, life)
        self.max_weight = max(self.max_weight, mark.initial_strength * trust_weight(mark))

    def start(self, now: float, threshold: float) -> int:
        """Index of the first mark that may still reach `threshold` at `now`."""
        if self.kind is MarkType.INTENT:
            return bisect_left(self.times, now - self.max_life - _TIME_SLACK)
        if self.kind not in (MarkType.OBSERVATION, MarkType.WARNING) or threshold <= 0.0:
            return 0
        if self.max_weight < threshold:
            return len(self.times)
        span = self.max_life * math.log2(self.max_weight / threshold)
        return bisect_left(self.times, now - span * (1 + 1e-9) - _TIME_SLACK)

    def live(self, now: float, threshold: float) -> list[Mark]:
        return self.marks[self.start(now, threshold) :]

    def compact(self, superseded: dict[UUID, UUID]) -> None:
        """Drop superseded marks once half the bucket is dead (amortized O(1) per write)."""
        self.dead += 1
        if self.dead * 2 < len(self.marks):
            return
        kept = [m for m in self.marks if m.id not in superseded]
        self.marks = kept
        self.times = [m.created_at for m in kept]
        self.dead = 0


def _keyed(mark: Mark) -> str | None:
    """The resource (intents, actions) or topic (observations, warnings) a mark is read by."""
    return mark_resource(mark) or mark_topic(mark)


def _bucket_keys(mark: Mark) -> list[BucketKey]:
    keys: list[BucketKey] = [(mark.scope, mark.mark_type, None)]
    key = _keyed(mark)
    if key is not None:
        keys.append((mark.scope, mark.mark_type, key))
    return keys


@dataclass
class _Subscription:
    agent: Agent
    patterns: tuple[WatchPattern, ...]
    queue: list[Mark] = field(default_factory=list)
