"""A binding's rate limit: at most ``delivery.rate_limit`` requests per second to
its subscriber, retries included, per replica.

Requests are spaced evenly, one every ``1 / rate`` seconds: each takes the
next free slot in the order it asked, and one whose slot is in the future
waits for it on a loop timer (no thread, no polling), however many deliveries
are in flight. Time the subscriber was not asked is not saved up, so there is
never a burst: after a quiet minute the next requests still go one interval
apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from dispatcher.delivery.waits import Waits


class RateLimit:
    def __init__(self, rate: float, waits: Waits, waited: Callable[[float], None]) -> None:
        self._interval = 1.0 / rate
        self._waits = waits
        self._waited = waited  # seconds a request waited (dispatcher_rate_limited_seconds_total)
        self._next = 0.0  # when the next request may go

    def slot(self) -> float:
        """Take the next slot: how long to wait for it (0: go now)."""
        now = self._waits.time()
        at = max(now, self._next)
        self._next = at + self._interval
        return at - now

    def wait(self, seconds: float) -> Awaitable[bool]:
        """Wait ``seconds`` for a slot; False when shutdown cut the wait short."""
        self._waited(seconds)
        return self._waits.sleep(seconds)
