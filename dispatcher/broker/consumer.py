"""One binding's channel on the supervisor's connection.

A ``Consumer`` opens its binding's channel (declaring the queue if asked),
sets per-consumer prefetch, consumes, hands each message in with the
generation of the channel it arrived on, applies verdicts, and when the
channel closes (a channel-level error, a consumer the broker cancelled)
reopens it after a backoff with a new generation, while the connection
lives. The connection itself is the supervisor's.

Generations: delivery tags restart at 1 on every channel, so a verdict
reached for a message of a channel that is gone must not be sent on the new
one (it would settle a different message). It is dropped and counted as a
stale ack (``dispatcher_stale_acks_total``); the broker redelivers the old
message itself.

Two bounds, both kept across channel flaps. At most ``effective_parallelism``
(``parallelism``) deliveries run at once; at most ``effective_prefetch``
(``prefetch``, by default the same) messages are held unacked, the rest of
them waiting here in arrival order for a slot, so a slot freed by a verdict
starts the next message at once instead of after a broker round trip. A delivery whose
channel closed keeps running (its HTTP request is never aborted) and keeps
its slot until its verdict comes back; the messages of that channel still
waiting are dropped (the broker redelivers them). So a new channel's
consumers may prefetch only what is free (``fill``): a broker that closes the
channel ten times in a row gets one prefetch's worth of messages held here,
not ten.

A binding with a circuit breaker (``dispatcher.breaker``) stops taking
messages while it is open: its consumers are cancelled (the broker keeps the
rest of the queue for other replicas), no waiting message starts, and the
deliveries already running wait in the breaker for their next attempt. Half
open, one message is started to be the probe: one that waits here, else one
taken by a consumer of prefetch 1 (unless a delivery already waits in the
breaker to be it). Closed again, consumption resumes with the free room, the
probe's consumer replaced by one with all of it (on a single-active-consumer
queue the broker would go on feeding only that first consumer).
Cancelled consumers' messages stay held and counted: their slots are not
covered by any consumer's prefetch any more (``_watermark``), so the room
given to new consumers leaves them out.

Everything here runs on the engine loop, except the plain fields read by
``Supervisor``'s inspection methods.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import pika.exceptions

from dispatcher.amqp_binding import amqp_message
from dispatcher.breaker import CircuitBreaker, CircuitState
from dispatcher.broker import amqp_properties, streams
from dispatcher.broker.params import describe_error
from dispatcher.config import BindingSettings
from dispatcher.events import AmqpMessage, Unreadable
from dispatcher.logs import get_logger
from dispatcher.metrics import Metrics
from dispatcher.retry import Backoff
from dispatcher.seams import Action, ChannelState, Received

log = get_logger()

Consumption = Literal["up", "paused", "down"]


@dataclass(frozen=True, slots=True)
class Shared:
    """What every binding's consumer shares with the supervisor."""

    metrics: Metrics
    reconnect: Backoff
    stopping: Callable[[], bool]
    generations: itertools.count[int]
    connection: Callable[[], Any]  # the current connection, or None
    on_ready: Callable[[], None]  # a channel got ready: the connection is in use
    receive: Callable[[str, Received], None]  # a message, to its delivery


class Consumer:
    def __init__(
        self, settings: BindingSettings, shared: Shared, breaker: CircuitBreaker | None = None
    ) -> None:
        self.settings = settings
        self._shared = shared
        self._breaker = breaker
        if breaker is not None:
            breaker.listen(self._on_circuit)
        self.channel: Any = None
        self.generation = 0
        # What this generation's messages carry: closed with the channel, so a
        # delivery that has sent nothing yet leaves its message to the redelivery.
        self.state = ChannelState()
        self.consumer_tags: list[str] = []
        self.ready = False  # the channel is set up (queue declared): it may consume
        self._prefetch = 0  # what this channel's consumers were given, in all
        self._held = 0  # received, no verdict back yet (running or waiting): every generation
        self._current = 0  # of those, the ones that arrived on this channel
        self._running = 0  # of those held, the ones handed over to a delivery
        self._waiting: deque[Received] = deque()  # held, not handed over yet (this channel's)
        self._starting = False  # ``_start_waiting`` is on the stack
        # Consumers being cancelled one after the other, to pause (circuit open)
        # or to be replaced (pika runs a CancelOk callback for any consumer's CancelOk).
        self._cancelling = False
        self._to_cancel: list[str] = []
        self._replacing = False  # the probe's consumer, cancelled for a full one
        self._setting_up = 0  # prefetch given to consumers not confirmed yet
        self._last_tag = 0  # the latest delivery tag of this channel
        # This channel's messages below this tag came to consumers since cancelled:
        # held, but no longer counted in ``_current`` (no prefetch covers them).
        self._watermark = 0
        self._probe_started = False  # half open: a message was started to be the probe
        self._failures = 0  # consecutive channel failures, for backoff
        self._close_reason: str | None = None  # set when we close the channel on purpose
        # The queue delivered a stream's message: not consumed (``broker.streams``);
        # each rebuild consumes again to see whether it still is one.
        self._stream = False

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def in_flight(self) -> int:
        """Deliveries of this binding running, whatever their channel: the one count
        of them (``dispatcher_inflight``, the shutdown's idle)."""
        return self._running

    @property
    def consumption(self) -> Consumption:
        """What ``/readyz`` says of this binding: consuming, paused by its circuit
        breaker on a channel that is fine, or neither."""
        channel = self.channel  # read once: the ops thread asks while the loop changes it
        if self._paused() and self.ready and channel is not None and channel.is_open:
            return "paused"
        consuming = self.consumer_tags or self._replacing
        return "up" if consuming and not self._stream else "down"

    @property
    def waiting(self) -> int:
        """Messages held for a free slot (``prefetch`` above ``parallelism``)."""
        return len(self._waiting)

    # ----------------------------------------------------------------- the channel

    def open(self, connection: Any) -> None:
        if self._shared.stopping() or not connection.is_open:
            return
        connection.channel(on_open_callback=self._on_channel_open)

    def close_channel(self) -> None:
        if self.channel is not None and self.channel.is_open:
            _close_channel(self.channel)

    def _on_channel_open(self, channel: Any) -> None:
        generation = next(self._shared.generations)
        self.channel, self.generation, self.consumer_tags = channel, generation, []
        self.state = ChannelState()
        self._reset_channel_counts()
        channel.add_on_close_callback(partial(self._on_channel_closed, generation))
        channel.add_on_cancel_callback(partial(self._on_cancelled, generation))
        declare = self.settings.declare
        if declare is None:
            self._on_channel_ready(generation)
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
            callback=lambda _frame: self._on_channel_ready(generation),
        )

    def _on_channel_ready(self, generation: int) -> None:
        if generation != self.generation:
            return
        self.ready = True
        self._shared.on_ready()
        orphans = self._held
        if orphans >= self.settings.effective_prefetch:
            log.warning(
                "consumer waits for room: deliveries of a closed channel still run",
                binding=self.name,
                running=orphans,
            )
        self.fill()

    def _on_cancelled(self, generation: int, _frame: Any) -> None:
        """The broker cancelled our consumer (queue deleted, node failover)."""
        if generation != self.generation or self.channel is None:
            return
        log.warning("consumer cancelled by the broker", binding=self.name)
        self._stream = False  # the queue was deleted, most likely: whatever comes next
        self._close_reason = "consumer_cancelled"
        _close_channel(self.channel)

    def _on_channel_closed(self, generation: int, _channel: Any, reason: Any) -> None:
        if generation != self.generation:
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
        # their slots (``_held``, ``_running``) but no longer count as this
        # channel's. Those waiting are let go: the broker redelivers them.
        self._drop_waiting()
        self._reset_channel_counts()
        self._shared.metrics.consumer_up.labels(self.name).set(0)
        if was_consuming:
            log.info("consumer detached", binding=self.name)

    def _reset_channel_counts(self) -> None:
        """What belongs to one channel: a new one starts from nothing."""
        self.ready, self._prefetch, self._current = False, 0, 0
        self._cancelling, self._to_cancel, self._setting_up = False, [], 0
        self._replacing = False
        self._last_tag, self._watermark = 0, 0

    def _drop_waiting(self) -> None:
        """Forget the messages waiting for a slot, sending nothing: their channel
        is gone or closing, and the broker has them back with it."""
        self._held -= len(self._waiting)
        self._waiting.clear()

    # ----------------------------------------------------------------- consumers

    def fill(self) -> None:
        """Consume with whatever room the binding's in-flight bound leaves.

        A consumer's prefetch is fixed when it starts (per-consumer qos), so room
        that frees up later is taken by another consumer on the same channel. The
        first takes ``prefetch`` minus the closed channels' deliveries still
        running (at least one must be free); more are added as those finish, a
        quarter of ``prefetch`` at a time or the rest once they are all done:
        a handful of consumers per channel at most, never a slot left idle long.
        (Replacing the consumer instead would leave its own messages uncovered
        each time: under a backlog the new one gets only the freed few, and the
        binding churns through small consumers.)
        """
        channel = self.channel
        if not self.ready or channel is None or not channel.is_open:
            return
        if self._shared.stopping() or self._cancelling:
            return
        if self._paused():
            self._take_probe()
            return
        orphans = self._held - self._current
        room = self.settings.effective_prefetch - orphans - self._prefetch
        step = max(1, self.settings.effective_prefetch // 4)
        if room < 1 or (self._prefetch and orphans and room < step):
            return
        self._take(room)

    def _take(self, room: int, probe: bool = False) -> None:
        """A consumer with prefetch ``room`` on the current channel (``probe``: the
        half-open breaker's, of prefetch 1)."""
        channel = self.channel
        self._prefetch += room
        self._setting_up += room
        generation = self.generation
        # Per consumer (global_qos=False): a global qos on a quorum queue closes
        # the connection. ordered: workers is 1, which keeps queue order,
        # retries included.
        channel.basic_qos(
            prefetch_count=room,
            callback=lambda _frame: self._consume(channel, generation, room, probe),
        )

    def _consume(self, channel: Any, generation: int, room: int, probe: bool) -> None:
        if self._shared.stopping() or generation != self.generation:
            return  # shutdown, or the channel went while this consumer was being set up
        channel.basic_consume(
            self.settings.queue,
            on_message_callback=partial(self._on_message, generation),
            callback=lambda frame: self._on_consuming(
                generation, frame.method.consumer_tag, room, probe
            ),
        )

    def _on_consuming(self, generation: int, tag: str, room: int, probe: bool) -> None:
        if generation != self.generation:
            return
        self._setting_up -= room
        self.consumer_tags.append(tag)
        if self._breaker is not None and self._breaker.state is CircuitState.OPEN:
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
            channel_prefetch=self._prefetch,
        )
        if probe and not self._paused():
            # Another delivery's probe closed the breaker while this one was set up.
            self._replace_probe_consumer()

    def cancel(self) -> None:
        """Stop consuming (shutdown): no new message arrives on this channel, and
        none waiting starts (they go back to the broker with the channel)."""
        self._drop_waiting()
        replacing, self._replacing = self._replacing, False
        if self.channel is not None and self.channel.is_open and (self.consumer_tags or replacing):
            for tag in self.consumer_tags:
                self.channel.basic_cancel(tag)
            self.consumer_tags = []
            self._shared.metrics.consumer_up.labels(self.name).set(0)
            log.info("consumer cancelled", binding=self.name)

    def _on_message(
        self, generation: int, _channel: Any, method: Any, props: Any, body: bytes
    ) -> None:
        if self._shared.stopping():
            return  # after the cancel: left unacked, the broker has it back at the close
        if streams.from_a_stream(props):
            self._refuse_stream(generation)
            return
        self._stream = False
        # A message of a channel that is gone (pika may still hand one over while
        # closing it) is born closed: nothing is sent for it.
        current = generation == self.generation
        state = self.state if current else _CLOSED
        tag = method.delivery_tag
        self._held += 1
        self._current += current
        if current:
            self._last_tag = tag
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
            generation, tag, bool(method.redelivered), message, unreadable, state, time.time_ns()
        )
        if current and (self._waiting or not self._may_start()):
            self._waiting.append(received)
            return
        self._begin(received)

    def _refuse_stream(self, generation: int) -> None:
        """A stream's message: nothing is settled (a nack would close the connection),
        the channel is closed and tried again with backoff, the binding down."""
        self._stream = True
        if generation != self.generation or self.channel is None or self._close_reason:
            return  # its channel is gone or already closing
        log.error(
            "queue is a stream: not consumed",
            binding=self.name,
            queue=self.settings.queue,
            detail=streams.WHY,
        )
        self._close_reason = "stream_queue"
        _close_channel(self.channel)

    def _may_start(self) -> bool:
        if self._running >= self.settings.effective_parallelism:
            return False
        if not self._paused():
            return True
        # Half open: one message to be the probe, unless one already waits in the
        # breaker to be it (or is it).
        breaker = self._breaker
        return breaker is not None and breaker.wants_probe and not self._probe_started

    def _begin(self, received: Received) -> None:
        self._running += 1
        if self._paused():
            self._probe_started = True
        self._shared.receive(self.name, received)

    def _start_waiting(self) -> None:
        """Hand waiting messages over while slots are free, oldest first. A delivery
        may end within ``receive`` (a filtered event) and settle back into here:
        the outer call goes on, the stack does not grow per message."""
        if self._starting:
            return
        self._starting = True
        try:
            while self._waiting and self._may_start():
                self._begin(self._waiting.popleft())
        finally:
            self._starting = False

    # ----------------------------------------------------------------- verdicts

    def apply(self, received: Received, action: Action) -> None:
        """Send ``action`` for ``received`` on the channel it arrived on, if that is
        this one; start a waiting message in the freed slot; call ``fill`` next."""
        self._running -= 1
        # Whatever it was, the half-open period may want another probe now (a
        # started message that was filtered never asked the breaker).
        self._probe_started = False
        self._release(received, action)
        self._start_waiting()

    def _release(self, received: Received, action: Action) -> None:
        """``received`` is no longer held: ``action`` goes on its own channel, if
        that is still this one."""
        self._held -= 1
        channel = self.channel
        current = channel is not None and received.generation == self.generation
        if current and received.tag >= self._watermark:
            self._current -= 1
        self._send(received, action, channel if current else None)

    def _send(self, received: Received, action: Action, channel: Any) -> None:
        if action is Action.LEAVE:
            return  # nothing to send: the broker redelivers it
        if channel is None or not channel.is_open:
            self._count_stale()
            return
        try:
            # One verdict per delivery, never `multiple`: one ack must not settle others.
            if action is Action.ACK:
                channel.basic_ack(received.tag, multiple=False)
            elif action is Action.REQUEUE:
                channel.basic_nack(received.tag, multiple=False, requeue=True)
            else:
                channel.basic_reject(received.tag, requeue=False)
        except pika.exceptions.AMQPError:
            self._count_stale()

    # ----------------------------------------------------------------- the circuit breaker

    def _paused(self) -> bool:
        return self._breaker is not None and self._breaker.state is not CircuitState.CLOSED

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
        channel's consumers are cancelled (the probe's holds its probe, unsettled
        yet: nothing can be on its way to it) and, once the broker has answered,
        ``fill`` starts one with all the room. Readiness stays up meanwhile."""
        tags, self.consumer_tags = self.consumer_tags, []
        self._replacing = True
        self._cancel(tags)

    def _cancel(self, tags: list[str]) -> None:
        self._to_cancel.extend(tags)
        if not self._cancelling:
            self._cancelling = True
            self._cancel_next(self.generation, None)

    def _give_back_waiting(self) -> None:
        waiting, self._waiting = self._waiting, deque()
        for received in waiting:
            self._release(received, Action.REQUEUE)
        if waiting:
            log.info(
                "circuit open: waiting messages given back", binding=self.name, count=len(waiting)
            )

    def _cancel_next(self, generation: int, _frame: Any) -> None:
        """One cancel at a time: pika calls a CancelOk callback for whichever
        consumer's CancelOk comes first, so each is registered only once the one
        before it is answered."""
        if generation != self.generation or not self._cancelling:
            return
        channel = self.channel
        if self._to_cancel and channel is not None and channel.is_open:
            channel.basic_cancel(
                self._to_cancel.pop(), callback=partial(self._cancel_next, generation)
            )
            return
        self._cancelling = False
        # No consumer left on this channel but those still being set up: what it
        # holds is covered by no prefetch.
        self._watermark = self._last_tag + 1
        self._current, self._prefetch = 0, self._setting_up
        if self._breaker is not None and self._breaker.state is CircuitState.OPEN:
            self._give_back_waiting()  # those that came before the CancelOk
        self.fill()  # the breaker may have moved on meanwhile

    def _take_probe(self) -> None:
        """Half open with nothing here to probe with: one message, prefetch 1."""
        breaker = self._breaker
        if (
            breaker is not None
            and breaker.wants_probe
            and not self._probe_started
            and not self._waiting
            and not self.consumer_tags
            and not self._prefetch
            and self._held < self.settings.effective_prefetch
        ):
            self._take(1, probe=True)

    def _count_stale(self) -> None:
        self._shared.metrics.stale_acks.labels(self.name).inc()


_CLOSED = ChannelState()
_CLOSED.open = False


def _close_channel(channel: Any) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError):
        channel.close()
