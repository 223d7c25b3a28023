"""A binding's circuit breaker: stop sending to a subscriber that is failing.

Every attempt to the subscriber asks the breaker first (``admit``) and tells
it the result (``record``). Closed, it admits every attempt and counts, in a
sliding ``window``, attempts and failures (a status in ``retry_on``, a
timeout, a transport error; a 2xx or a status that dead-letters at once says
nothing against the subscriber's health). When the window holds at least
``min_attempts`` attempts and the failure share reaches ``failure_ratio``,
it opens.

Open, it admits nothing: an attempt that asks waits (a future on the loop,
no thread), with its message unacked and its retries unspent, and the
binding's consumer stops taking messages (``Consumer`` listens). After
``open_for`` it is half-open: the oldest waiting attempt (or, when none
waits, the first message the consumer then takes) is the one probe. Success,
or a status that dead-letters at once, closes it: every waiting attempt goes
and consumption resumes. Failure reopens it for twice as long, at most
``max_open``.

A failed probe does not spend its message's retries (``Pass.probe``): the
probe is the breaker's question, and the same message may ask it at each
half-open period rather than being requeued each time (on RabbitMQ 4.x every
requeue counts toward a quorum queue's delivery limit).

Everything here runs on the engine loop. State is per binding and per
replica, and survives channel and connection rebuilds (it is about the
subscriber, not the broker).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from dispatcher.config import UNACKED_MAX, CircuitBreakerSettings
from dispatcher.loop import Future, Loop, Timer
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import BreakerMetrics

log = get_logger()

# The window is kept as this many buckets of attempt and failure counts, so
# memory does not grow with the request rate; an attempt leaves the window
# within one bucket's width of ``window`` after it was recorded.
_BUCKETS: Final = 20

# An attempt waits in an open breaker at most this long after its delivery
# began; then its message is given back to the queue (outcome ``requeued``)
# before the broker's ``consumer_timeout`` closes the channel over it.
HOLD_MAX: Final = UNACKED_MAX


class CircuitState(IntEnum):
    """The values of ``dispatcher_circuit_state``."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2

    @property
    def label(self) -> str:
        """As logs (``from``, ``to``) and ``dispatcher_circuit_transitions_total`` write it."""
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Pass:
    """Leave to make one attempt."""

    probe: bool


PASS: Final = Pass(probe=False)
PROBE: Final = Pass(probe=True)

# (from, to, failures, attempts): the window's counts when it happened.
Transition = Callable[[CircuitState, CircuitState, int, int], None]


class CircuitBreaker:
    def __init__(
        self,
        settings: CircuitBreakerSettings,
        loop: Loop,
        transition: Transition,
        hold_max: float = HOLD_MAX,
    ) -> None:
        self.hold_max = hold_max
        self.closed = False  # the loop is stopping: waits end, nothing is given back
        self._settings = settings
        self._loop = loop
        self._transition = transition
        self.state = CircuitState.CLOSED
        self._left_closed_at = 0.0
        self._width = settings.window / _BUCKETS
        self._buckets: deque[list[float]] = deque()  # [start, attempts, failures]
        self._attempts = 0
        self._failures = 0
        self._open_for = settings.open_for
        self._timer: Timer | None = None
        self._waiting: deque[Future[Pass | None]] = deque()
        self._probe_out = False
        self._listeners: list[Callable[[CircuitState], None]] = []

    def listen(self, listener: Callable[[CircuitState], None]) -> None:
        """Call ``listener(state)`` after each transition (the binding's consumer)."""
        self._listeners.append(listener)

    @property
    def wants_probe(self) -> bool:
        """Half-open with no probe out and no attempt waiting to be it: the next
        message the consumer starts will be."""
        return self.state is CircuitState.HALF_OPEN and not self._probe_out and not self._waiting

    # ----------------------------------------------------------------- attempts

    def admit(self) -> Pass | Future[Pass | None]:
        """A pass now, or a future that resolves with one when the breaker lets
        this attempt go (``None`` if ``close`` ended the wait)."""
        if self.state is CircuitState.CLOSED:
            return PASS
        if self.wants_probe:
            self._probe_out = True
            return PROBE
        future: Future[Pass | None] = self._loop.create_future()
        self._waiting.append(future)
        return future

    def withdraw(self, future: Future[Pass | None]) -> None:
        """The attempt behind ``future`` stopped waiting (held too long, shutdown).
        A probe it was given just now goes to the next one."""
        if not future.done():
            self._waiting.remove(future)
            future.resolve(None)
        else:
            self.release(future.result() or PASS)

    def release(self, given: Pass) -> None:
        """``given`` will not be used (shutdown, its message is gone): a probe goes
        to the next attempt that waits."""
        if given.probe:
            self._probe_out = False
            self._next_probe()

    def record(self, given: Pass, failed: bool) -> None:
        """The result of an attempt ``given`` let go."""
        if given.probe:
            self._probe_out = False
            if failed:
                self._open_for = min(2 * self._open_for, self._settings.max_open)
                self._open()
            else:
                self._close()
            return
        if self.state is not CircuitState.CLOSED:
            return  # admitted before it opened: the window starts afresh at the close
        self._count(failed)
        s = self._settings
        if self._attempts >= s.min_attempts and self._failures >= s.failure_ratio * self._attempts:
            self._open()

    # ----------------------------------------------------------------- transitions

    def _count(self, failed: bool) -> None:
        now = self._loop.time()
        buckets = self._buckets
        while buckets and buckets[0][0] <= now - self._settings.window:
            _, attempts, failures = buckets.popleft()
            self._attempts -= int(attempts)
            self._failures -= int(failures)
        if not buckets or buckets[-1][0] + self._width <= now:
            buckets.append([now, 0, 0])
        last = buckets[-1]
        last[1] += 1
        self._attempts += 1
        if failed:
            last[2] += 1
            self._failures += 1

    def _open(self) -> None:
        self._move(CircuitState.OPEN)
        self._timer = self._loop.call_later(self._open_for, self._half_open)

    def _half_open(self) -> None:
        self._timer = None
        self._move(CircuitState.HALF_OPEN)
        self._next_probe()

    def _next_probe(self) -> None:
        if self.state is not CircuitState.HALF_OPEN or self._probe_out:
            return
        while self._waiting:
            if self._waiting.popleft().resolve(PROBE):
                self._probe_out = True
                return

    def _close(self) -> None:
        self._open_for = self._settings.open_for
        self._move(CircuitState.CLOSED)
        self._buckets.clear()
        self._attempts = self._failures = 0
        waiting, self._waiting = self._waiting, deque()
        for future in waiting:
            future.resolve(PASS)

    def open_seconds(self) -> float:
        """How long it has been open or half-open without closing; 0 while closed.
        Read by the metrics scrape from another thread: plain fields."""
        if self.state is CircuitState.CLOSED:
            return 0.0
        return self._loop.time() - self._left_closed_at

    def _move(self, to: CircuitState) -> None:
        was, self.state = self.state, to
        if was is CircuitState.CLOSED:
            self._left_closed_at = self._loop.time()
        self._transition(was, to, self._failures, self._attempts)
        for listener in self._listeners:
            listener(to)

    def close(self) -> None:
        """The loop is stopping: end every wait (its delivery leaves its message)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        waiting, self._waiting = self._waiting, deque()
        for future in waiting:
            future.resolve(None)


def reported(binding: str, metrics: BreakerMetrics) -> Transition:
    """What a transition of ``binding``'s breaker shows: the state gauge, the
    transition counter and one ``event: "circuit"`` line."""

    def transition(was: CircuitState, to: CircuitState, failures: int, attempts: int) -> None:
        metrics.state.set(int(to))
        metrics.transitions[to.label].inc()
        say = log.warning if to is CircuitState.OPEN else log.info
        fields = {"from": was.label, "to": to.label, "failures": failures, "attempts": attempts}
        say("circuit", binding=binding, **fields)

    return transition
