"""A token bucket: the one pacer of every stage (the scan's reads, the delete's chunks, the repair's calls)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens a second. `acquire(n)` sleeps until the n tokens are earned (a debt is allowed,
    so a request larger than the bucket is paced rather than refused); `slice` keeps each send small
    enough that the pace is smooth at the server, not a burst every second.

    `burst` is how many tokens the bucket banks while nobody asks (one slice by default). Work that pays
    after it is done (the delete's chunks) banks a whole chunk, so the time the work itself took counts
    toward its budget; `start_full=False` makes the first such payment wait like every other.
    """

    SLICE_S = 0.02  # a send covers at most this much of the rate

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, burst: float | None = None,
                 start_full: bool = True) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst = max(1.0, self.rate * self.SLICE_S) if burst is None else float(burst)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst if start_full else 0.0
        self._updated = clock()
        self.acquired = 0  # tokens taken, for the run's report
        self.waited_s = 0.0  # time spent waiting for them

    @classmethod
    def for_requests(cls, rate: float, request: int) -> TokenBucket:
        """A bucket for reads sent `request` at a time (a multiRead): it banks at least one whole request. With only
        the default bank (20 ms of the rate: 50 reads at 2,500/s) a request of 100 waited a further 20 ms each time
        the reader's own work took longer than that, and the reader stayed below its limit (1,667/s at 40 ms a
        request). The rate, the limit itself, is unchanged."""
        return cls(rate, burst=max(1.0, rate * cls.SLICE_S, float(request)))

    def slice(self, unit: int = 1) -> int:
        """How many tokens one send should take: about SLICE_S of the rate, in whole `unit`s (at least one)."""
        return max(unit, int(self.rate * self.SLICE_S) // unit * unit)

    def acquire(self, n: int) -> float:
        """Take `n` tokens, sleeping until they are earned; returns the time slept."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        self._tokens -= n
        self.acquired += n
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        self._sleep(wait)
        self.waited_s += wait
        return wait
