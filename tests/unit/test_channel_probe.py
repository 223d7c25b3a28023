"""A binding channel's AMQP steps around a circuit breaker's probe, against a scripted
channel that answers only when told to (the orderings a real broker makes rare).

The main path runs on a real broker and a single-active-consumer queue in
tests/integration/test_queue_types.py; these are the races around it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from dispatcher.broker.channel import BindingChannel as Consumer
from dispatcher.broker.channel import Shared
from dispatcher.config import settings_from_dict
from dispatcher.delivery.breaker import CircuitState
from dispatcher.delivery.retry import Backoff
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Loop
from dispatcher.observe.metrics import Metrics


class ScriptedChannel:
    """Records each AMQP call; its callbacks run when the test says so."""

    is_open = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.pending: list[Callable[[], None]] = []
        self._tags = itertools.count(1)

    def add_on_close_callback(self, _callback: Any) -> None: ...

    def add_on_cancel_callback(self, _callback: Any) -> None: ...

    def basic_qos(self, prefetch_count: int, callback: Callable[[Any], None]) -> None:
        self.calls.append(("qos", prefetch_count))
        self.pending.append(lambda: callback(None))

    def basic_consume(self, _queue: str, on_message_callback: Any, callback: Any) -> None:
        tag = f"ctag-{next(self._tags)}"
        self.calls.append(("consume", tag))
        frame = type("Frame", (), {"method": type("Method", (), {"consumer_tag": tag})})
        self.pending.append(lambda: callback(frame))

    def basic_cancel(self, tag: str, callback: Callable[[Any], None] | None = None) -> None:
        self.calls.append(("cancel", tag))
        if callback is not None:
            self.pending.append(lambda: callback(None))

    def answer(self) -> None:
        """The broker answers everything asked so far, in order (and what that asks)."""
        while self.pending:
            self.pending.pop(0)()


class StubBreaker:
    def __init__(self) -> None:
        self.state = CircuitState.OPEN
        self.wants_probe = False
        self.listeners: list[Callable[[CircuitState], None]] = []

    def listen(self, listener: Callable[[CircuitState], None]) -> None:
        self.listeners.append(listener)

    def move(self, state: CircuitState, wants_probe: bool = False) -> None:
        self.state, self.wants_probe = state, wants_probe
        for listener in self.listeners:
            listener(state)


def consumer_on(channel: ScriptedChannel, breaker: StubBreaker, prefetch: int = 4) -> Consumer:
    raw = {
        "bindings": [
            {"name": "b", "queue": "q", "subscriber": "http://s/", "parallelism": prefetch}
        ]
    }
    [binding] = settings_from_dict(raw, {}).bindings
    shared = Shared(
        metrics=Metrics(),
        reconnect=Backoff("exponential", 0.1, 1.0),
        stopping=lambda: False,
        generations=itertools.count(1),
        connection=lambda: None,
        on_ready=lambda: None,
        spawn=lambda _coro: None,
        waits=Waits(Loop("test")),
        on_done=lambda: None,
    )
    consumer = Consumer(binding, shared, _never_handled, breaker)  # type: ignore[arg-type]
    consumer._on_channel_open(channel)
    return consumer


def test_a_probe_consumer_set_up_while_another_probe_closes_the_breaker_is_replaced() -> None:
    """Half open, a consumer of prefetch 1 is being set up to take a probe; a
    delivery held in the breaker is the probe meanwhile and closes it. Attached
    on a closed breaker, that consumer would stay the queue's first consumer (on a
    single-active-consumer queue, the only one fed): it is cancelled once
    attached, and one consumer with all the room is started."""
    channel, breaker = ScriptedChannel(), StubBreaker()
    consumer = consumer_on(channel, breaker)
    breaker.move(CircuitState.HALF_OPEN, wants_probe=True)
    assert channel.calls == [("qos", 1)]  # the probe's consumer, being set up
    breaker.move(CircuitState.CLOSED)  # another delivery's probe succeeded
    channel.answer()
    assert channel.calls[1:] == [
        ("qos", 3),  # the rest of the room, beside the probe's 1, as before
        ("consume", "ctag-1"),  # the probe's
        ("consume", "ctag-2"),
        ("cancel", "ctag-1"),  # attached on a closed breaker: both go
        ("cancel", "ctag-2"),
        ("qos", 4),  # and one consumer takes every slot
        ("consume", "ctag-3"),
    ]
    assert consumer.consumer_tags == ["ctag-3"]
    assert consumer.consumption == "up"


def test_the_probe_s_consumer_is_replaced_when_its_probe_closes_the_breaker() -> None:
    channel, breaker = ScriptedChannel(), StubBreaker()
    consumer = consumer_on(channel, breaker)
    breaker.move(CircuitState.HALF_OPEN, wants_probe=True)
    channel.answer()
    assert consumer.consumer_tags == ["ctag-1"]
    breaker.move(CircuitState.CLOSED)
    assert channel.calls[-1] == ("cancel", "ctag-1")
    assert consumer.consumption == "up"  # readiness stays up while it is replaced
    channel.answer()
    assert channel.calls[-2:] == [("qos", 4), ("consume", "ctag-2")]
    assert consumer.consumer_tags == ["ctag-2"]


async def _never_handled(_received: object) -> Any:
    raise AssertionError("no message is delivered here")
