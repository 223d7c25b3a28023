"""One binding's channel on the supervisor's connection: from a message's arrival
to its ack, on the channel it arrived on.

A ``BindingChannel`` opens its binding's channel (declaring the queue if
asked), consumes with the room its binding has (``broker.room``), runs the
binding's ``handle`` for each message as a task on the loop and sends the
``Action`` it returns (ack, requeue, reject, or nothing) itself, at once; when
the channel closes (a channel-level error, a consumer the broker cancelled) it
reopens it after a backoff, while the connection lives. The connection itself
is the supervisor's.

A channel's liveness is its ``ChannelState``: one object per channel, closed
with it, carried by every message that arrived on it. Delivery tags restart at
1 on every channel, so an action for a message whose channel is gone must not
be sent on the new one (it would ack a different message): it is dropped
and counted as a stale ack (``dispatcher_stale_acks_total``); the broker
redelivers the old message itself. The state's ``generation`` is only a
number to show (``Supervisor.generation``).

Under a circuit breaker (``broker.circuit_gate``) the consumers are cancelled
while it is open and the messages waiting for a slot go back to the queue;
half open, one message is the probe; closed again, consumption resumes with
the free room, the probe's consumer replaced by one with all of it (on a
single-active-consumer queue the broker would go on feeding only that first
consumer). Consumers are cancelled one after the other: pika runs a CancelOk
callback for whichever consumer's CancelOk comes first.

Everything here runs on the engine loop, except the plain fields read by
``Supervisor``'s inspection methods.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal

import pika.exceptions

from dispatcher.broker import amqp_properties, streams
from dispatcher.broker.circuit_gate import CircuitGate
from dispatcher.broker.params import describe_error
from dispatcher.broker.room import Room
from dispatcher.config import BindingSettings
from dispatcher.delivery.breaker import CircuitBreaker, CircuitState
from dispatcher.delivery.retry import Backoff
from dispatcher.delivery.seams import Action, ChannelState, Handle, Received
from dispatcher.delivery.waits import Waits
from dispatcher.event.amqp import amqp_message
from dispatcher.event.cloudevent import AmqpMessage, Unreadable
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import Metrics

log = get_logger()

Consumption = Literal["up", "paused", "down"]

# After an unexpected error (a bug, never an input problem: those are
# dead-lettered with a reason) a message is given back after this pause.
BUG_PAUSE: Final = 1.0


@dataclass(frozen=True, slots=True)
class Shared:
    """What every binding's channel shares with the supervisor."""

    metrics: Metrics
    reconnect: Backoff
    stopping: Callable[[], bool]
    generations: itertools.count[int]
    connection: Callable[[], Any]  # the current connection, or None
    on_ready: Callable[[], None]  # a channel got ready: the connection is in use
    spawn: Callable[[Coroutine[Any, Any, None]], object]  # a delivery, as a task on the loop
    waits: Waits  # the bug pause ends with the others at shutdown
    on_done: Callable[[], None]  # a delivery reached its action (shutdown waits for idle)


class BindingChannel:
    def __init__(
        self,
        settings: BindingSettings,
        shared: Shared,
        handle: Handle,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.settings = settings
        self._shared = shared
        self._handle = handle
        self._gate = CircuitGate(breaker)
        if breaker is not None:
            breaker.listen(self._on_circuit)
        self.channel: Any = None
        # What this channel's messages carry: closed with it, so a delivery that
        # has sent nothing yet leaves its message to the redelivery.
        self.state = _CLOSED
        self.consumer_tags: list[str] = []
        self.ready = False  # the channel is set up (queue declared): it may consume
        self._room: Room[Received] = Room(
            settings.effective_parallelism, settings.effective_prefetch
        )
        self._starting = False  # ``_start_waiting`` is on the stack
        # Consumers being cancelled one after the other, to pause (circuit open)
        # or to be replaced (pika runs a CancelOk callback for any consumer's CancelOk).
        self._cancelling = False
        self._to_cancel: list[str] = []
        self._replacing = False  # the probe's consumer, cancelled for a full one
        self._failures = 0  # consecutive channel failures, for backoff
        self._close_reason: str | None = None  # set when we close the channel on purpose
        # The queue delivered a stream's message: not consumed (``broker.streams``);
        # each rebuild consumes again to see whether it still is one.
        self._stream = False

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def generation(self) -> int:
        """The number of the latest channel (0 before the first)."""
        return self.state.generation

    @property
    def in_flight(self) -> int:
        """Deliveries of this binding running, whatever their channel: the one count
        of them (``dispatcher_inflight``, the shutdown's idle)."""
        return self._room.running

    @property
    def consumption(self) -> Consumption:
        """What ``/readyz`` says of this binding: consuming, paused by its circuit
        breaker on a channel that is fine, or neither."""
        channel = self.channel  # read once: the ops thread asks while the loop changes it
        if self._gate.paused and self.ready and channel is not None and channel.is_open:
            return "paused"
        consuming = self.consumer_tags or self._replacing
        return "up" if consuming and not self._stream else "down"

    @property
    def waiting(self) -> int:
        """Messages held for a free slot (``prefetch`` above ``parallelism``)."""
        return len(self._room.waiting)

    # ----------------------------------------------------------------- the channel

    def open(self, connection: Any) -> None:
        if self._shared.stopping() or not connection.is_open:
            return
        connection.channel(on_open_callback=self._on_channel_open)

    def close_channel(self) -> None:
        if self.channel is not None and self.channel.is_open:
            _close_channel(self.channel)

    def _on_channel_open(self, channel: Any) -> None:
        state = ChannelState(next(self._shared.generations))
        self.channel, self.state, self.consumer_tags = channel, state, []
        self._new_channel()
        channel.add_on_close_callback(partial(self._on_channel_closed, state))
        channel.add_on_cancel_callback(partial(self._on_cancelled, state))
        declare = self.settings.declare
        if declare is None:
            self._on_channel_ready(state)
            return
        arguments: dict[str, Any] = {"x-queue-type": declare.type}
        if declare.dead_letter_exchange is not None:
            arguments["x-dead-letter-exchange"] = declare.dead_letter_exchange
        if declare.delivery_limit is not None:
            arguments["x-delivery-limit"] = declare.delivery_limit
        channel.queue_declare(
            self.settings.queue,
            durable=declare.durable,
            arguments=arguments,
            callback=lambda _frame: self._on_channel_ready(state),
        )

    def _on_channel_ready(self, state: ChannelState) -> None:
        if state is not self.state:
            return
        self.ready = True
        self._shared.on_ready()
        orphans = self._room.orphans
        if orphans >= self.settings.effective_prefetch:
            log.warning(
                "consumer waits for room: deliveries of a closed channel still run",
                binding=self.name,
                running=orphans,
            )
        self.fill()

    def _on_cancelled(self, state: ChannelState, _frame: Any) -> None:
        """The broker cancelled our consumer (queue deleted, node failover)."""
        if state is not self.state or self.channel is None:
            return
        log.warning("consumer cancelled by the broker", binding=self.name)
        self._stream = False  # the queue was deleted, most likely: whatever comes next
        self._close_reason = "consumer_cancelled"
        _close_channel(self.channel)

    def _on_channel_closed(self, state: ChannelState, _channel: Any, reason: Any) -> None:
        if state is not self.state:
            return
        label = self._close_reason or "channel_closed"
        self.forget_channel()
        connection = self._shared.connection()
        if self._shared.stopping() or connection is None or not connection.is_open:
            return  # shutdown, or the connection's own close handles the rebuild
        self._shared.metrics.reconnects.labels(label).inc()
        delay = self._shared.reconnect.wait(self._failures)
        self._failures += 1
        log.warning(
            "channel closed",
            binding=self.name,
            reason=label,
            detail=describe_error(reason),
            retry_in_s=round(delay, 3),
        )
        connection.ioloop.call_later(delay, partial(self.open, connection))

    def forget_channel(self) -> None:
        self.state.open = False
        was_consuming = bool(self.consumer_tags)
        self.channel, self.consumer_tags, self._close_reason = None, [], None
        # Its deliveries still running are the closed channel's now: they keep
        # their slots but no longer count as this channel's. Those waiting are
        # let go: the broker redelivers them.
        self._room.drop_waiting()
        self._new_channel()
        self._shared.metrics.consumer_up.labels(self.name).set(0)
        if was_consuming:
            log.info("consumer detached", binding=self.name)

    def _new_channel(self) -> None:
        """What belongs to one channel: a new one starts from nothing."""
        self.ready = False
        self._room.new_channel()
        self._cancelling, self._to_cancel, self._replacing = False, [], False

    # ----------------------------------------------------------------- consumers

    def fill(self) -> None:
        """Consume with whatever room the binding's in-flight bound leaves
        (``Room.to_take``): a handful of consumers per channel at most. (Replacing
        the consumer instead would leave its own messages uncovered each time:
        under a backlog the new one gets only the freed few, and the binding
        churns through small consumers.)"""
        channel = self.channel
        if not self.ready or channel is None or not channel.is_open:
            return
        if self._shared.stopping() or self._cancelling:
            return
        if self._gate.paused:
            if self._gate.wants_probe_consumer(self._room, bool(self.consumer_tags)):
                self._take(1, probe=True)  # half open with nothing here to probe with
            return
        room = self._room.to_take()
        if room:
            self._take(room)

    def _take(self, room: int, probe: bool = False) -> None:
        """A consumer with prefetch ``room`` on the current channel (``probe``: the
        half-open breaker's, of prefetch 1)."""
        channel, state = self.channel, self.state
        self._room.taking(room)
        # Per consumer (global_qos=False): a global qos on a quorum queue closes
        # the connection. ordered: parallelism is 1, which keeps queue order,
        # retries included.
        channel.basic_qos(
            prefetch_count=room,
            callback=lambda _frame: self._consume(channel, state, room, probe),
        )

    def _consume(self, channel: Any, state: ChannelState, room: int, probe: bool) -> None:
        if self._shared.stopping() or state is not self.state:
            return  # shutdown, or the channel went while this consumer was being set up
        channel.basic_consume(
            self.settings.queue,
            on_message_callback=partial(self._on_message, state),
            callback=lambda frame: self._on_consuming(
                state, frame.method.consumer_tag, room, probe
            ),
        )

    def _on_consuming(self, state: ChannelState, tag: str, room: int, probe: bool) -> None:
        if state is not self.state:
            return
        self._room.consuming(room)
        self.consumer_tags.append(tag)
        if self._gate.open:
            self._pause()  # it opened while this consumer was being set up
            return
        if self._cancelling:
            # Set up before this round of cancels began (``fill`` takes none during
            # one), answered during it: it goes with the others. The round's end
            # counts no prefetch but what is still being set up, so kept, its
            # prefetch would be counted nowhere and the next consumer's added to it.
            self.consumer_tags.remove(tag)
            self._cancel([tag])
            return
        self._replacing = False
        if not self._stream:  # a stream's rebuilds back off up to the most
            self._failures = 0
        self._shared.metrics.consumer_up.labels(self.name).set(1)
        log.info(
            "consumer attached",
            binding=self.name,
            queue=self.settings.queue,
            prefetch=room,  # this consumer's; the channel's consumers hold channel_prefetch
            channel_prefetch=self._room.given,
        )
        if probe and not self._gate.paused:
            # Another delivery's probe closed the breaker while this one was set up.
            self._replace_probe_consumer()

    def cancel(self) -> None:
        """Stop consuming (shutdown): no new message arrives on this channel, and
        none waiting starts (they go back to the broker with the channel)."""
        self._room.drop_waiting()
        replacing, self._replacing = self._replacing, False
        if self.channel is not None and self.channel.is_open and (self.consumer_tags or replacing):
            for tag in self.consumer_tags:
                self.channel.basic_cancel(tag)
            self.consumer_tags = []
            self._shared.metrics.consumer_up.labels(self.name).set(0)
            log.info("consumer cancelled", binding=self.name)

    # ----------------------------------------------------------------- messages

    def _on_message(
        self, state: ChannelState, _channel: Any, method: Any, props: Any, body: bytes
    ) -> None:
        if self._shared.stopping():
            return  # after the cancel: left unacked, the broker has it back at the close
        if streams.from_a_stream(props):
            self._refuse_stream(state)
            return
        self._stream = False
        # A message of a channel that is gone (pika may still hand one over while
        # closing it) is born closed: nothing is sent for it.
        current = state is self.state
        tag = method.delivery_tag
        self._room.arrived(tag, current)
        unreadable = amqp_properties.unreadable(props)
        if unreadable is not None:
            log.warning(
                "message properties pika could not decode: it will be dead-lettered",
                binding=self.name,
                delivery_tag=tag,
                error=unreadable.error,
            )
        try:
            message = amqp_message(body, props)
        except Exception as e:
            # Raised here (pika's callback) it would abort the connection just as
            # a decode failure does, and meet this message again on the next one.
            log.exception("message properties could not be read", binding=self.name)
            message = AmqpMessage(body, {})
            unreadable = Unreadable(f"{type(e).__name__}: {e}", b"")
        received = Received(
            tag,
            bool(method.redelivered),
            message,
            unreadable,
            state if current else _CLOSED,
            time.time_ns(),
        )
        if current and (self._room.waiting or not self._gate.may_start(self._room)):
            self._room.waiting.append(received)
            return
        self._begin(received)

    def _refuse_stream(self, state: ChannelState) -> None:
        """A stream's message: nothing is sent (a nack would close the connection),
        the channel is closed and tried again with backoff, the binding down."""
        self._stream = True
        if state is not self.state or self.channel is None or self._close_reason:
            return  # its channel is gone or already closing
        log.error(
            "queue is a stream: not consumed",
            binding=self.name,
            queue=self.settings.queue,
            detail=streams.WHY,
        )
        self._close_reason = "stream_queue"
        _close_channel(self.channel)

    def _begin(self, received: Received) -> None:
        self._room.started()
        self._gate.started()
        self._shared.spawn(self._deliver(received))

    async def _deliver(self, received: Received) -> None:
        """One message's delivery: its coroutine runs at once, inside pika's
        callback, until its first wait; its action goes out as it is reached."""
        action = Action.LEAVE
        try:
            action = await self._handle(received)
        except Exception:
            log.exception("handler failed", binding=self.name)
            # Give the message back rather than hold its prefetch slot forever.
            action = Action.REQUEUE if await self._shared.waits.sleep(BUG_PAUSE) else Action.LEAVE
        finally:
            self._apply(received, action)

    def _start_waiting(self) -> None:
        """Start waiting messages while slots are free, oldest first. A delivery may
        end within ``_begin`` (a filtered event) and come back into here: the outer
        call goes on, the stack does not grow per message."""
        if self._starting:
            return
        self._starting = True
        try:
            waiting = self._room.waiting
            while waiting and self._gate.may_start(self._room):
                self._begin(waiting.popleft())
        finally:
            self._starting = False

    # ----------------------------------------------------------------- actions

    def _apply(self, received: Received, action: Action) -> None:
        """Send ``action`` for ``received`` on the channel it arrived on, if that is
        this one; start a waiting message in the freed slot; take the room left."""
        self._room.finished()
        self._gate.finished()
        self._release(received, action)
        self._start_waiting()
        self.fill()
        self._shared.on_done()

    def _release(self, received: Received, action: Action) -> None:
        """``received`` is no longer held: ``action`` goes on its own channel, if
        that is still this one."""
        current = received.channel is self.state and self.channel is not None
        self._room.released(received.tag, current)
        channel = self.channel if current else None
        if action is Action.LEAVE:
            return  # nothing to send: the broker redelivers it
        if channel is None or not channel.is_open:
            self._count_stale()
            return
        try:
            # One action per delivery, never `multiple`: one ack must not ack others.
            if action is Action.ACK:
                channel.basic_ack(received.tag, multiple=False)
            elif action is Action.REQUEUE:
                channel.basic_nack(received.tag, multiple=False, requeue=True)
            else:
                channel.basic_reject(received.tag, requeue=False)
        except pika.exceptions.AMQPError:
            self._count_stale()

    # ----------------------------------------------------------------- the circuit breaker

    def _on_circuit(self, state: CircuitState) -> None:
        if state is CircuitState.OPEN:
            self._pause()
        else:
            # Half open: a waiting message is the probe before a consumer takes one.
            self._start_waiting()
            if state is CircuitState.CLOSED and self.consumer_tags:
                self._replace_probe_consumer()
            self.fill()

    def _pause(self) -> None:
        """Cancel every consumer: the broker sends nothing more until we resume.
        Messages waiting for a slot go back to the queue now: while the breaker
        is open none of them would start, and held unacked they would reach the
        broker's consumer_timeout (and stay out of other replicas' reach)."""
        channel = self.channel
        tags, self.consumer_tags = self.consumer_tags, []
        replacing, self._replacing = self._replacing, False
        if channel is None or not channel.is_open:
            return
        self._give_back_waiting()
        if not tags and not replacing:
            return
        self._shared.metrics.consumer_up.labels(self.name).set(0)
        log.info("consumer paused: circuit open", binding=self.name)
        self._cancel(tags)

    def _replace_probe_consumer(self) -> None:
        """Closed by a probe: the consumer is the probe's, of prefetch 1. Joined
        by another, it would stay the queue's first consumer, and on a queue
        with ``x-single-active-consumer`` the broker feeds the first only: the
        binding would run one delivery at a time until the next rebuild. So the
        channel's consumers are cancelled (the probe's holds its probe, not
        acked yet: nothing can be on its way to it) and, once the broker has
        answered, ``fill`` starts one with all the room. Readiness stays up
        meanwhile."""
        tags, self.consumer_tags = self.consumer_tags, []
        self._replacing = True
        self._cancel(tags)

    def _cancel(self, tags: list[str]) -> None:
        self._to_cancel.extend(tags)
        if not self._cancelling:
            self._cancelling = True
            self._cancel_next(self.state, None)

    def _give_back_waiting(self) -> None:
        waiting = self._room.take_waiting()
        for received in waiting:
            self._release(received, Action.REQUEUE)
        if waiting:
            log.info(
                "circuit open: waiting messages given back", binding=self.name, count=len(waiting)
            )

    def _cancel_next(self, state: ChannelState, _frame: Any) -> None:
        """One cancel at a time: pika calls a CancelOk callback for whichever
        consumer's CancelOk comes first, so each is registered only once the one
        before it is answered."""
        if state is not self.state or not self._cancelling:
            return
        channel = self.channel
        if self._to_cancel and channel is not None and channel.is_open:
            channel.basic_cancel(self._to_cancel.pop(), callback=partial(self._cancel_next, state))
            return
        self._cancelling = False
        self._room.all_cancelled()
        if self._gate.open:
            self._give_back_waiting()  # those that came before the CancelOk
        self.fill()  # the breaker may have moved on meanwhile

    def _count_stale(self) -> None:
        self._shared.metrics.stale_acks.labels(self.name).inc()


# What a message of no channel of ours carries: never open.
_CLOSED: Final = ChannelState(0)
_CLOSED.open = False


def _close_channel(channel: Any) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError):
        channel.close()
