"""The gateway's token buckets (Courier §12: "rate limits per token and per stream (simple token
bucket)"), with an injected clock: no sleeping, no timing."""

from __future__ import annotations

import pytest

from agentpost.gateway.ratelimit import Limit, RateLimiter, TokenBucket, retry_after_header


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_and_allows_a_burst_then_refuses() -> None:
    """Courier §12 token bucket: `burst` requests pass at once, the next one waits."""
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limit = Limit("token:a", rate=2.0, burst=3)
    assert [limiter.acquire(limit) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.acquire(limit)
    assert wait == pytest.approx(0.5)  # one token at 2/s


def test_bucket_refills_at_its_rate_and_never_beyond_burst() -> None:
    """Courier §12: the bucket refills at `rate` per second, capped at `burst`."""
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limit = Limit("k", rate=1.0, burst=2)
    limiter.acquire(limit)
    limiter.acquire(limit)
    clock.now += 0.5
    assert limiter.acquire(limit) == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.acquire(limit) == 0.0
    clock.now += 3600  # a long idle time refills to burst, not more
    assert [limiter.acquire(limit) for _ in range(3)][:2] == [0.0, 0.0]
    assert limiter.acquire(limit) > 0


def test_keys_are_independent() -> None:
    """Courier §12: one bucket per token and one per stream: draining one leaves the others."""
    limiter = RateLimiter(FakeClock())
    a, b = Limit("token:a", 1.0, 1), Limit("token:b", 1.0, 1)
    assert limiter.acquire(a) == 0.0
    assert limiter.acquire(a) > 0
    assert limiter.acquire(b) == 0.0


def test_acquire_takes_from_every_bucket_or_from_none() -> None:
    """A request refused by the stream's bucket costs nothing in the token's bucket."""
    limiter = RateLimiter(FakeClock())
    token, stream = Limit("token:t", 1.0, 5), Limit("stream:s", 1.0, 1)
    assert limiter.acquire(token, stream) == 0.0
    assert limiter.acquire(token, stream) > 0  # the stream is empty
    # the token bucket still holds 4 of its 5
    assert [limiter.acquire(token) for _ in range(4)] == [0.0] * 4
    assert limiter.acquire(token) > 0


def test_none_limits_are_unlimited() -> None:
    limiter = RateLimiter(FakeClock())
    assert all(limiter.acquire(None) == 0.0 for _ in range(1000))
    assert len(limiter) == 0


def test_clock_stepping_back_removes_no_tokens() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=2, now=clock.now)
    bucket.take(clock.now)
    clock.now -= 100
    assert bucket.wait_time(clock.now) == 0.0
    clock.now += 100.5  # back to where it was, plus half a second
    assert bucket.tokens <= 2


def test_changed_parameters_are_adopted_keeping_the_level() -> None:
    """A token's own rate (from the token table) replaces the default for its bucket."""
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limiter.acquire(Limit("k", 1.0, 10))
    smaller = Limit("k", 1.0, 1)
    assert limiter.acquire(smaller) == 0.0  # 9 left, capped to the new burst of 1 ...
    assert limiter.acquire(smaller) > 0  # ... and spent
    clock.now += 1
    assert limiter.acquire(smaller) == 0.0


def test_least_recently_used_keys_are_dropped_beyond_max_keys() -> None:
    limiter = RateLimiter(FakeClock(), max_keys=3)
    for key in "abcd":
        limiter.acquire(Limit(key, 1.0, 1))
    assert len(limiter) == 3
    # "a" was dropped: it starts full again
    assert limiter.acquire(Limit("a", 1.0, 1)) == 0.0
    assert limiter.acquire(Limit("d", 1.0, 1)) > 0


@pytest.mark.parametrize("rate,burst", [(0, 1), (-1, 1), (float("nan"), 1), (1, 0.5),
                                        (float("inf"), 1)])
def test_limits_refuse_nonsense(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        Limit("k", rate, burst)


@pytest.mark.parametrize("seconds,header", [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.0, "30")])
def test_retry_after_is_whole_seconds_rounded_up(seconds: float, header: str) -> None:
    """Courier §11 "back-off guidance": Retry-After in whole seconds, never 0."""
    assert retry_after_header(seconds) == header
