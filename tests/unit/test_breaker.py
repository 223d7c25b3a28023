"""The circuit breaker's state machine and the rate limit, on a loop with a clock of
the test's own (transitions happen when the clock says so, not when a test sleeps)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from dispatcher.config import CircuitBreakerSettings
from dispatcher.delivery.breaker import PASS, PROBE, CircuitBreaker, CircuitState, reported
from dispatcher.delivery.rate_limit import RateLimit
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Future, Loop
from dispatcher.observe.metrics import Metrics

SETTINGS = CircuitBreakerSettings(
    failure_ratio=0.5, min_attempts=4, window=10.0, open_for=2.0, max_open=5.0
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, settings: CircuitBreakerSettings = SETTINGS) -> None:
        self.clock = Clock()
        self.loop = Loop(clock=self.clock)
        self.transitions: list[tuple[str, str, int, int]] = []
        self.heard: list[CircuitState] = []
        self.breaker = CircuitBreaker(settings, self.loop, self._transition, hold_max=60.0)
        self.breaker.listen(self.heard.append)

    def _transition(self, was: CircuitState, to: CircuitState, failures: int, attempts: int):
        self.transitions.append((was.label, to.label, failures, attempts))

    def attempts(self, *failed: bool) -> None:
        for one in failed:
            given = self.breaker.admit()
            assert given is PASS
            self.breaker.record(given, one)

    def advance(self, seconds: float) -> None:
        """Move the clock and run what became due."""
        self.clock.now += seconds
        tick: Future[None] = self.loop.create_future()
        self.loop.call_soon(tick.resolve, None)

        async def step() -> None:
            await tick

        self.loop.run_until_complete(step())

    @property
    def state(self) -> CircuitState:
        return self.breaker.state


@pytest.fixture
def h() -> Iterator[Harness]:
    made = Harness()
    yield made
    made.loop.close()


def test_opens_at_the_failure_ratio_once_min_attempts_were_made(h: Harness) -> None:
    h.attempts(True, True, True)
    assert h.state is CircuitState.CLOSED  # 3 of 3 failed, but fewer than min_attempts
    h.attempts(False)
    assert h.state is CircuitState.OPEN  # 3 of 4 >= 0.5
    assert h.transitions == [("closed", "open", 3, 4)]
    assert h.heard == [CircuitState.OPEN]


def test_successes_in_the_window_keep_it_closed(h: Harness) -> None:
    h.attempts(*([False] * 10))
    h.attempts(True, True, True, True, True, True, True, True, True)
    assert h.state is CircuitState.CLOSED  # 9 of 19
    h.attempts(True)
    assert h.state is CircuitState.OPEN  # 10 of 20


def test_attempts_older_than_the_window_no_longer_count(h: Harness) -> None:
    h.attempts(*([False] * 10))
    h.advance(10.6)  # past the window (and one bucket)
    h.attempts(True, True, False, True)
    assert h.state is CircuitState.OPEN  # 3 of 4: the ten successes are gone


def test_open_holds_every_attempt_then_half_open_lets_exactly_one_go(h: Harness) -> None:
    h.attempts(True, True, True, True)
    waiting = [h.breaker.admit() for _ in range(3)]
    assert all(isinstance(w, Future) and not w.done() for w in waiting)
    h.advance(1.9)
    assert not any(w.done() for w in waiting)  # type: ignore[union-attr]
    h.advance(0.2)
    assert h.state is CircuitState.HALF_OPEN
    assert [w.done() for w in waiting] == [True, False, False]  # type: ignore[union-attr]
    assert waiting[0].result() is PROBE  # type: ignore[union-attr]
    assert isinstance(h.breaker.admit(), Future)  # a fourth waits too: one probe only
    h.breaker.record(PROBE, False)
    assert h.state is CircuitState.CLOSED
    h.advance(0)
    assert [w.result() for w in waiting[1:]] == [PASS, PASS]  # type: ignore[union-attr]
    assert h.breaker.admit() is PASS
    assert [t[:2] for t in h.transitions] == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


def test_a_failed_probe_reopens_for_twice_as_long_up_to_max_open(h: Harness) -> None:
    h.attempts(True, True, True, True)
    opened: list[float] = []
    for _ in range(4):
        start = h.clock.now
        while h.state is not CircuitState.HALF_OPEN:
            h.advance(0.5)
        opened.append(h.clock.now - start)
        probe = h.breaker.admit()
        assert probe is PROBE
        h.breaker.record(probe, True)
        assert h.state is CircuitState.OPEN
    assert opened == [2.0, 4.0, 5.0, 5.0]  # open_for, doubled, capped at max_open
    while h.state is not CircuitState.HALF_OPEN:
        h.advance(0.5)
    h.breaker.record(h.breaker.admit(), False)  # type: ignore[arg-type]
    h.attempts(True, True, True, True)  # closed again: a new window, open_for reset
    start = h.clock.now
    while h.state is not CircuitState.HALF_OPEN:
        h.advance(0.5)
    assert h.clock.now - start == 2.0


def test_with_nobody_waiting_half_open_wants_a_probe(h: Harness) -> None:
    h.attempts(True, True, True, True)
    assert not h.breaker.wants_probe
    h.advance(2.0)
    assert h.state is CircuitState.HALF_OPEN and h.breaker.wants_probe
    assert h.heard[-1] is CircuitState.HALF_OPEN  # the consumer hears it and starts one
    assert h.breaker.admit() is PROBE
    assert not h.breaker.wants_probe


def test_a_probe_given_to_an_attempt_that_no_longer_wants_it_goes_to_the_next(h: Harness) -> None:
    h.attempts(True, True, True, True)
    first, second = h.breaker.admit(), h.breaker.admit()
    assert isinstance(first, Future) and isinstance(second, Future)
    h.advance(2.0)
    assert first.result() is PROBE and not second.done()
    h.breaker.withdraw(first)  # it timed out as the probe came: the next gets it
    assert second.done() and second.result() is PROBE
    h.breaker.release(PROBE)  # and it is shut down before sending
    assert h.breaker.wants_probe


def test_a_withdrawn_waiter_is_not_woken(h: Harness) -> None:
    h.attempts(True, True, True, True)
    gone, staying = h.breaker.admit(), h.breaker.admit()
    assert isinstance(gone, Future) and isinstance(staying, Future)
    h.breaker.withdraw(gone)
    assert gone.result() is None
    h.advance(2.0)
    assert staying.result() is PROBE


def test_attempts_admitted_before_it_opened_do_not_count_after(h: Harness) -> None:
    early: list[Any] = [h.breaker.admit() for _ in range(3)]
    h.attempts(True, True, True, True)
    for given in early:
        h.breaker.record(given, True)  # finishing while it is open
    h.advance(2.0)
    probe = h.breaker.admit()
    h.breaker.record(probe, False)  # type: ignore[arg-type]
    assert h.state is CircuitState.CLOSED
    h.attempts(True, True, True)
    assert h.state is CircuitState.CLOSED  # a fresh window: 3 attempts < min_attempts


def test_close_ends_every_wait(h: Harness) -> None:
    h.attempts(True, True, True, True)
    waiting = h.breaker.admit()
    assert isinstance(waiting, Future)
    h.breaker.close()
    assert waiting.result() is None and h.breaker.closed


def test_the_window_is_kept_in_bounded_memory(h: Harness) -> None:
    for _ in range(2000):
        h.attempts(False)
        h.clock.now += 0.05  # 100 s of attempts, 20 per second
    assert len(h.breaker._buckets) <= 21
    assert h.breaker._attempts <= 10 / 0.05 + 20


def test_a_transition_is_one_circuit_line_a_state_and_a_count() -> None:
    metrics = Metrics()
    transition = reported("orders", metrics.register_breaker("orders", 300.0))
    with structlog.testing.capture_logs() as logged:
        transition(CircuitState.CLOSED, CircuitState.OPEN, 12, 20)
        transition(CircuitState.OPEN, CircuitState.HALF_OPEN, 12, 20)
    assert logged == [
        {
            "event": "circuit",
            "binding": "orders",
            "from": "closed",
            "to": "open",
            "failures": 12,
            "attempts": 20,
            "log_level": "warning",
        },
        {
            "event": "circuit",
            "binding": "orders",
            "from": "open",
            "to": "half_open",
            "failures": 12,
            "attempts": 20,
            "log_level": "info",
        },
    ]
    assert metrics.value("dispatcher_circuit_state", {"binding": "orders"}) == 2
    for to, count in (("open", 1), ("half_open", 1), ("closed", 0)):
        labels = {"binding": "orders", "to": to}
        assert metrics.value("dispatcher_circuit_transitions_total", labels) == count
    assert metrics.value("dispatcher_circuit_max_open_seconds", {"binding": "orders"}) == 300


# ----------------------------------------------------------------------------- rate limit


def test_rate_limit_spaces_requests_evenly_and_saves_nothing_up() -> None:
    clock = Clock()
    loop = Loop(clock=clock)
    waited: list[float] = []
    limit = RateLimit(50.0, Waits(loop), waited.append)
    assert [limit.slot() for _ in range(4)] == pytest.approx([0.0, 0.02, 0.04, 0.06])
    clock.now += 60.0  # a quiet minute
    assert [limit.slot() for _ in range(3)] == pytest.approx([0.0, 0.02, 0.04])
    loop.close()


def test_rate_limit_waits_on_the_loop_and_counts_the_wait() -> None:
    loop = Loop()
    waited: list[float] = []
    waits = Waits(loop)
    limit = RateLimit(100.0, waits, waited.append)

    async def three() -> list[bool]:
        results = []
        for _ in range(3):
            pause = limit.slot()
            results.append(True if pause == 0 else await limit.wait(pause))
        return results

    assert loop.run_until_complete(three()) == [True, True, True]
    assert len(waited) == 2 and sum(waited) == pytest.approx(0.02, abs=0.005)
    waits.give_up()
    assert loop.run_until_complete(_wait(limit, 5.0)) is False  # shutdown: at once
    loop.close()


async def _wait(limit: RateLimit, seconds: float) -> bool:
    return await limit.wait(seconds)


def test_readiness_says_paused_only_while_the_channel_is_fine(h: Harness) -> None:
    """FIELD-NOTES invariant 5: a binding without a working channel is not ready,
    breaker or not; paused is only for an open channel its breaker stopped."""
    import itertools
    from types import SimpleNamespace

    from dispatcher.broker.channel import BindingChannel, Shared
    from dispatcher.config import BindingSettings
    from dispatcher.delivery.retry import Backoff

    shared = Shared(
        Metrics(),
        Backoff("exponential", 0.1, 1.0),
        lambda: False,
        itertools.count(1),
        lambda: None,
        lambda: None,
        lambda _coro: None,
        Waits(h.loop),
        lambda: None,
    )
    consumer = BindingChannel(
        BindingSettings(name="b", queue="q", subscriber="http://127.0.0.1:1/"),
        shared,
        _never_handled,
        h.breaker,
    )
    h.attempts(True, True, True, True)
    assert h.state is CircuitState.OPEN
    assert consumer.consumption == "down"  # no channel yet
    consumer.channel, consumer.ready = SimpleNamespace(is_open=True), True
    assert consumer.consumption == "paused"
    consumer.channel.is_open = False  # closing: a rebuild is coming
    assert consumer.consumption == "down"
    consumer.channel, consumer.ready = None, False
    assert consumer.consumption == "down"


async def _never_handled(_received: object) -> Any:
    raise AssertionError("no message is delivered here")
