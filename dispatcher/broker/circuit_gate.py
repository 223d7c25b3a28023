"""Whether a binding takes messages under its circuit breaker, and which one is the probe.

A binding with a circuit breaker (``delivery.breaker``) stops taking messages
while it is open: its channel cancels its consumers (the broker keeps the
rest of the queue for other replicas), no waiting message starts, and the
deliveries already running wait in the breaker for their next attempt. Half
open, one message is started to be the probe: one that waits here, else one
taken by a consumer of prefetch 1 (unless a delivery already waits in the
breaker to be it). These are the decisions; the AMQP steps that carry them
out (cancelling consumers, the probe's consumer, replacing it once the probe
closed the breaker) are the channel's (``broker.channel``). No pika here.
"""

from __future__ import annotations

from typing import Any

from dispatcher.broker.room import Room
from dispatcher.delivery.breaker import CircuitBreaker, CircuitState


class CircuitGate:
    def __init__(self, breaker: CircuitBreaker | None) -> None:
        self._breaker = breaker
        self._probe_started = False  # half open: a message was started to be the probe

    @property
    def paused(self) -> bool:
        """The breaker is not closed: no message starts but a probe."""
        return self._breaker is not None and self._breaker.state is not CircuitState.CLOSED

    @property
    def open(self) -> bool:
        return self._breaker is not None and self._breaker.state is CircuitState.OPEN

    def may_start(self, room: Room[Any]) -> bool:
        if not room.may_start():
            return False
        if not self.paused:
            return True
        # Half open: one message to be the probe, unless one already waits in the
        # breaker to be it (or is it).
        breaker = self._breaker
        return breaker is not None and breaker.wants_probe and not self._probe_started

    def started(self) -> None:
        if self.paused:
            self._probe_started = True

    def finished(self) -> None:
        """Whatever it was, the half-open period may want another probe now (a started
        message that was filtered never asked the breaker)."""
        self._probe_started = False

    def wants_probe_consumer(self, room: Room[Any], consuming: bool) -> bool:
        """Half open with nothing here to probe with: a consumer of prefetch 1 should
        take one message."""
        breaker = self._breaker
        return (
            breaker is not None
            and breaker.wants_probe
            and not self._probe_started
            and not room.waiting
            and not consuming
            and not room.given
            and room.held < room.prefetch
        )
