"""Token buckets (Courier §12: "rate limits per token and per stream (simple token bucket)").

In-process and pure: the clock is injected, so the arithmetic is tested without sleeping. A
gateway process keeps one `RateLimiter`; several gateway processes each enforce their own
limits (the limits are per process, not global).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]

#: buckets kept at most; the least recently used is dropped first (it refills to full if seen
#: again, which only ever errs on the lenient side)
DEFAULT_MAX_KEYS = 10_000


@dataclass(frozen=True)
class Limit:
    """`rate` tokens per second refill a bucket of `burst` tokens, for one key."""

    key: str
    rate: float
    burst: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError("rate must be a positive number of requests per second")
        if not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError("burst must be at least 1")


class TokenBucket:
    """A bucket that starts full, holds at most `burst` tokens and refills at `rate`/s."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        # a clock that steps back never removes tokens
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.stamp = max(self.stamp, now)

    def wait_time(self, now: float, n: float = 1.0) -> float:
        """Seconds until `n` tokens are available (0 when they are now)."""
        self._refill(now)
        missing = n - self.tokens
        return 0.0 if missing <= 1e-12 else missing / self.rate

    def take(self, now: float, n: float = 1.0) -> None:
        self._refill(now)
        self.tokens -= n

    def retune(self, rate: float, burst: float, now: float) -> None:
        """Adopt new parameters, keeping what is in the bucket (capped by the new burst)."""
        self._refill(now)
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, float(burst))


class RateLimiter:
    """Named token buckets. `acquire(*limits)` takes one token from every bucket named, or
    from none of them: a request refused by one limit costs nothing in the others."""

    def __init__(self, clock: Clock = time.monotonic, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def _bucket(self, limit: Limit, now: float) -> TokenBucket:
        bucket = self._buckets.get(limit.key)
        if bucket is None:
            bucket = TokenBucket(limit.rate, limit.burst, now)
            self._buckets[limit.key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(limit.key)
            if (bucket.rate, bucket.burst) != (limit.rate, limit.burst):
                bucket.retune(limit.rate, limit.burst, now)
        return bucket

    def acquire(self, *limits: Limit | None) -> float:
        """0.0 when a token was taken from each bucket; otherwise the seconds to wait before
        the same request would pass (nothing is taken). `None` limits are ignored."""
        wanted = [limit for limit in limits if limit is not None]
        if not wanted:
            return 0.0
        with self._lock:
            now = self.clock()
            buckets = [self._bucket(limit, now) for limit in wanted]
            wait = max(bucket.wait_time(now) for bucket in buckets)
            if wait > 0:
                return wait
            for bucket in buckets:
                bucket.take(now)
            return 0.0

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_header(seconds: float) -> str:
    """An HTTP Retry-After value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
