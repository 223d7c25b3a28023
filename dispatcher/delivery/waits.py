"""The waits a delivery makes on the loop, and their end when shutdown runs out of time.

A delivery waits between HTTP attempts, before a requeue, and for another
replica's duplicate claim. At shutdown the service gives deliveries in flight
a grace period; when it ends, every such wait must end at once (the delivery
then leaves its message unacked for the broker to redeliver) and every later
wait must not start. ``Waits`` is that one switch over all of them. The loop
(``dispatcher/loop.py``) only keeps time; what a wait means for shutdown is
decided here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dispatcher.loop import Future, Loop

T = TypeVar("T")


class Waits:
    """Every wait a delivery makes (retry pauses, duplicate claims), so that the end of
    the shutdown grace period can end them all at once.

    ``sleep`` resolves True when the time has passed and False when ``give_up``
    cut it short; ``wait`` resolves with the awaited value, or ``None`` on
    timeout or give-up. Loop thread only.
    """

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._pending: dict[Future[Any], object] = {}  # future -> its value on give-up
        self.given_up = False
        self.time: Callable[[], float] = loop.time  # the clock itself: read often

    def future(self) -> Future[Any]:
        return self._loop.create_future()

    def sleep(self, seconds: float) -> Future[bool]:
        return self._track(self._loop.create_future(), seconds, True, False)

    def wait(self, awaited: Future[T], seconds: float) -> Future[T | None]:
        future: Future[T | None] = self._loop.create_future()
        if not self.given_up:
            awaited.on_done(future.resolve)
        return self._track(future, seconds, None, None)

    def _track(
        self, future: Future[Any], seconds: float, on_time: object, on_give_up: object
    ) -> Future[Any]:
        if self.given_up:
            future.resolve(on_give_up)
            return future
        timer = self._loop.call_later(seconds, future.resolve, on_time)
        self._pending[future] = on_give_up

        def forget(_value: object) -> None:
            timer.cancel()
            self._pending.pop(future, None)

        future.on_done(forget)
        return future

    def give_up(self) -> None:
        """End every wait now, and make every later one end at once."""
        self.given_up = True
        for future, value in list(self._pending.items()):
            future.resolve(value)
