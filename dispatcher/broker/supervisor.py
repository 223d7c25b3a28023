"""The connection supervisor: the one thread that owns pika.

It connects, opens one channel per binding (so a channel-level close of one
binding does not disturb the others), sets prefetch, consumes, notices every
way consumption can stop, and rebuilds with jittered exponential backoff,
forever. With a cluster's nodes in ``broker.url``, every connect goes to the
node after the one tried last (``broker_params.Rotation``): losing the
connection to one node leads straight to the next, and the backoff applies
only when a whole round of nodes failed. The node connected to is logged
(``host:port``) and shown by ``dispatcher_broker_node``.

Messages are handed to the delivery engine; the engine hands its verdicts
back in batches through ``settle``, which queues them and wakes the pika
thread with ``add_callback_threadsafe`` (one wake-up per batch, not per ack).

Every delivery carries the generation of the channel it arrived on. A verdict
for a generation that is gone is dropped and counted as a stale ack: delivery
tags restart at 1 on every channel, so sending it on the new channel would
settle a different message (FIELD-NOTES, failure 6 and invariant 2). The
broker redelivers the old message itself.

In flight per binding stays within ``parallelism`` across channel flaps
(invariant 8). A delivery whose channel closed keeps running (its HTTP
request is never aborted) and keeps its slot until its verdict comes back.
So a new channel's consumer may prefetch only what is free: ``parallelism``
minus the closed channels' deliveries still running. If nothing is free it
waits; as that old work finishes, more consumers on the same channel take
the freed room. A broker that closes the channel ten times in a row gets
one prefetch's worth of messages held here, not ten.

Only this thread touches pika objects; the lock guards the few fields other
threads read (current connection, pending verdicts).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pika
import pika.exceptions
from pika.adapters.select_connection import SelectConnection

from dispatcher.broker import amqp_properties
from dispatcher.broker.params import (
    Node,
    Rotation,
    describe_error,
    nodes,
    reconnect_backoff,
    release,
)
from dispatcher.config import BindingSettings, BrokerSettings
from dispatcher.engine import Verdict
from dispatcher.events import AmqpMessage, Unreadable
from dispatcher.from_amqp import amqp_message
from dispatcher.handler import Action, Received
from dispatcher.logs import get_logger
from dispatcher.metrics import Metrics

log = get_logger()

_TICK = 1.0  # the loop proves it is alive this often (for /healthz)


@dataclass(slots=True)
class _Binding:
    settings: BindingSettings
    channel: Any = None
    generation: int = 0
    consumer_tags: list[str] = field(default_factory=list)
    ready: bool = False  # the channel is set up (queue declared): it may consume
    prefetch: int = 0  # what this channel's consumers were given, in all
    in_flight: int = 0  # handed to the engine, no verdict back yet: every generation
    current: int = 0  # of those, the ones that arrived on this channel
    failures: int = 0  # consecutive channel failures, for backoff
    close_reason: str | None = None  # set when we close the channel on purpose


class Supervisor:
    def __init__(
        self,
        broker: BrokerSettings,
        metrics: Metrics,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._broker = broker
        self._metrics = metrics
        self._reconnect = reconnect_backoff(broker, rng)
        # Built once (URLs, TLS files): raises here, at start, for a bad CA or key.
        self._rotation = Rotation(nodes(broker, "consumer"), self._reconnect)
        self._node: Node = self._rotation.nodes[0]  # the pika thread's: tried last
        self._bindings: dict[str, _Binding] = {}
        self._generations = itertools.count(1)
        self._lock = threading.Lock()
        self._verdicts: deque[Verdict] = deque()
        self._inbound: list[tuple[str, Received]] = []  # the pika thread's
        self._deliver: Callable[[list[tuple[str, Received]]], None] = lambda _batch: None
        self._connection: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self._close_reason = "connection_lost"
        self._was_open = False
        self._used_at: float | None = None  # when this connection got a channel ready
        self.last_tick = time.monotonic()

    def add_binding(self, settings: BindingSettings) -> None:
        self._bindings[settings.name] = _Binding(settings)
        self._metrics.register_binding(settings.name)

    def deliver_to(self, deliver: Callable[[list[tuple[str, Received]]], None]) -> None:
        """Where received messages go (the engine), a batch per pass of pika's loop."""
        self._deliver = deliver

    # ----------------------------------------------------------------- any thread

    def start(self) -> None:
        self._thread.start()

    def consumers(self) -> dict[str, bool]:
        """Binding name -> has a live consumer."""
        return {name: bool(b.consumer_tags) for name, b in self._bindings.items()}

    # Inspection and fault injection for tests and debugging, from any thread: the
    # values are plain fields the pika thread writes, read as they are; anything
    # that touches pika runs on the pika thread.

    @property
    def nodes(self) -> tuple[str, ...]:
        """The broker nodes (``host:port``) connects go round, in order."""
        return tuple(node.label for node in self._rotation.nodes)

    def generation(self, binding: str) -> int:
        """The generation of ``binding``'s latest channel (0 before the first): each
        new channel has a higher one, and verdicts of an older one are stale."""
        return self._bindings[binding].generation

    def channel_ready(self, binding: str) -> bool:
        """``binding``'s channel is open and set up (queue declared): it consumes,
        or waits for room to."""
        b = self._bindings[binding]
        channel = b.channel
        return b.ready and channel is not None and bool(channel.is_open)

    def close_channel(self, binding: str) -> bool:
        """Ask the pika thread to close ``binding``'s channel, as a broker-side channel
        error would: counted as ``channel_closed`` and rebuilt after a backoff, with a
        new generation. False when there is no connection to ask."""
        return self.run_on_broker_thread(partial(self._close_channel_of, binding))

    def run_on_broker_thread(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the pika thread, between its events (a stuck loop can be
        simulated so). False when there is no connection, hence no loop, to run it."""
        with self._lock:
            connection = self._connection
        if connection is None:
            return False
        self._call_soon(connection, callback)
        return True

    def _close_channel_of(self, binding: str) -> None:
        channel = self._bindings[binding].channel
        if channel is not None and channel.is_open:
            _close_channel(channel)

    def settle(self, verdicts: list[Verdict]) -> None:
        """Called by the engine with a batch of verdicts (``LEAVE`` included: each one
        frees its delivery's slot)."""
        with self._lock:
            wake = not self._verdicts
            self._verdicts.extend(verdicts)
            connection = self._connection
        if wake and connection is not None:
            self._call_soon(connection, self._apply_verdicts)

    def begin_shutdown(self) -> None:
        """Not ready any more; cancel consumers so no new message arrives."""
        self._stopping.set()
        with self._lock:
            connection = self._connection
        if connection is not None:
            self._call_soon(connection, self._cancel_consumers)

    def finish(self, timeout: float) -> None:
        """Apply what workers settled, close the connection, wait (bounded) for the thread."""
        self._stopping.set()
        with self._lock:
            connection = self._connection
        if connection is not None:
            self._call_soon(connection, self._close)
        self._thread.join(timeout)

    @staticmethod
    def _call_soon(connection: Any, callback: Callable[[], None]) -> None:
        # Raises once the loop is closed: the connection is gone, and so is the need.
        with contextlib.suppress(Exception):
            connection.ioloop.add_callback_threadsafe(callback)

    # ----------------------------------------------------------------- the pika thread

    def _run(self) -> None:
        while not self._stopping.is_set():
            node = self._node = self._rotation.next()
            try:
                reason = self._serve_one_connection(node)
            except Exception:
                # Never let the one thread that consumes die: log, back off, rebuild.
                log.exception("broker supervisor error", node=node.label)
                reason = "error"
            if self._stopping.is_set():
                break
            self._metrics.reconnects.labels(reason).inc()
            # 0 while other nodes of the round are left to try.
            served = None if self._used_at is None else time.monotonic() - self._used_at
            delay = self._rotation.ended(opened=self._was_open, served=served)
            log.warning(
                "broker disconnected", node=node.label, reason=reason, retry_in_s=round(delay, 3)
            )
            self._wait_ticking(delay)
        log.info("broker supervisor stopped")

    def _wait_ticking(self, seconds: float) -> None:
        """Wait to reconnect, still ticking: a broker outage is not a stuck process."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set():
            self.last_tick = time.monotonic()
            left = deadline - self.last_tick
            if left <= 0:
                return
            self._stopping.wait(min(left, _TICK))

    def _serve_one_connection(self, node: Node) -> str:
        self._close_reason = "connect_failed"
        self._was_open = False
        self._used_at = None
        connection = SelectConnection(
            node.parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        with self._lock:
            self._connection = connection
        try:
            connection.ioloop.call_later(_TICK, partial(self._tick, connection))
            connection.ioloop.start()
        finally:
            with self._lock:
                self._connection = None
            for b in self._bindings.values():
                self._forget_channel(b)
            self._metrics.broker_connected.set(0)
            self._metrics.set_broker_node(None)
            self._metrics.set_blocked("consumer", False)
            release(connection)
        return self._close_reason

    def _tick(self, connection: Any) -> None:
        self.last_tick = time.monotonic()
        connection.ioloop.call_later(_TICK, partial(self._tick, connection))

    def _on_open(self, connection: Any) -> None:
        self._was_open = True
        self._close_reason = "connection_lost"
        self._metrics.broker_connected.set(1)
        self._metrics.set_broker_node(self._node.label)
        log.info("broker connected", node=self._node.label, connection=self._broker.connection_name)
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        self._apply_verdicts()  # verdicts queued while disconnected are stale: count them
        if self._stopping.is_set():
            self._close()
            return
        for b in self._bindings.values():
            self._open_channel(connection, b)

    def _on_open_error(self, connection: Any, error: Exception) -> None:
        self._close_reason = "connect_failed"
        log.warning("broker connect failed", node=self._node.label, error=describe_error(error))
        connection.ioloop.stop()

    def _on_close(self, connection: Any, reason: Exception) -> None:
        if self._stopping.is_set():
            self._close_reason = "shutdown"
        else:
            self._close_reason = _close_reason(reason, self._close_reason)
        log.info(
            "broker connection closed",
            node=self._node.label,
            reason=self._close_reason,
            detail=describe_error(reason),
        )
        connection.ioloop.stop()

    def _on_blocked(self, _connection: Any, _frame: Any) -> None:
        self._metrics.set_blocked("consumer", True)
        log.warning("broker blocked the connection (resource alarm)")

    def _on_unblocked(self, _connection: Any, _frame: Any) -> None:
        self._metrics.set_blocked("consumer", False)
        log.info("broker unblocked the connection")

    # ----------------------------------------------------------------- channels and consumers

    def _open_channel(self, connection: Any, b: _Binding) -> None:
        if self._stopping.is_set() or not connection.is_open:
            return
        connection.channel(on_open_callback=partial(self._on_channel_open, b))

    def _on_channel_open(self, b: _Binding, channel: Any) -> None:
        generation = next(self._generations)
        b.channel, b.generation, b.consumer_tags = channel, generation, []
        b.ready, b.prefetch, b.current = False, 0, 0
        channel.add_on_close_callback(partial(self._on_channel_closed, b, generation))
        channel.add_on_cancel_callback(partial(self._on_cancelled, b, generation))
        declare = b.settings.declare
        if declare is None:
            self._on_channel_ready(b, generation)
            return
        arguments: dict[str, Any] = {"x-queue-type": declare.type}
        if declare.dead_letter_exchange is not None:
            arguments["x-dead-letter-exchange"] = declare.dead_letter_exchange
        if declare.delivery_limit is not None:
            arguments["x-delivery-limit"] = declare.delivery_limit
        channel.queue_declare(
            b.settings.queue,
            durable=declare.durable,
            arguments=arguments,
            callback=lambda _frame: self._on_channel_ready(b, generation),
        )

    def _on_channel_ready(self, b: _Binding, generation: int) -> None:
        if generation != b.generation:
            return
        b.ready = True
        if self._used_at is None:
            self._used_at = time.monotonic()
        orphans = b.in_flight
        if orphans >= b.settings.workers:
            log.warning(
                "consumer waits for room: deliveries of a closed channel still run",
                binding=b.settings.name,
                running=orphans,
            )
        self._fill(b)

    def _fill(self, b: _Binding) -> None:
        """Consume with whatever room the binding's in-flight bound leaves.

        A consumer's prefetch is fixed when it starts (per-consumer qos), so room
        that frees up later is taken by another consumer on the same channel. The
        first takes ``parallelism`` minus the closed channels' deliveries still
        running (at least one must be free); more are added as those finish, a
        quarter of ``parallelism`` at a time or the rest once they are all done:
        a handful of consumers per channel at most, never a slot left idle long.
        """
        channel = b.channel
        if not b.ready or channel is None or not channel.is_open or self._stopping.is_set():
            return
        orphans = b.in_flight - b.current
        room = b.settings.workers - orphans - b.prefetch
        step = max(1, b.settings.workers // 4)
        if room < 1 or (b.prefetch and orphans and room < step):
            return
        b.prefetch += room
        generation = b.generation
        # Per consumer (global_qos=False): a global qos on a quorum queue closes
        # the connection. ordered: workers is 1, which keeps queue order,
        # retries included.
        channel.basic_qos(
            prefetch_count=room,
            callback=lambda _frame: self._consume(b, channel, generation),
        )

    def _consume(self, b: _Binding, channel: Any, generation: int) -> None:
        if self._stopping.is_set() or generation != b.generation:
            return  # shutdown, or the channel went while this consumer was being set up
        channel.basic_consume(
            b.settings.queue,
            on_message_callback=partial(self._on_message, b, generation),
            callback=lambda frame: self._on_consuming(b, generation, frame.method.consumer_tag),
        )

    def _on_consuming(self, b: _Binding, generation: int, tag: str) -> None:
        if generation != b.generation:
            return
        b.consumer_tags.append(tag)
        b.failures = 0
        self._metrics.consumer_up.labels(b.settings.name).set(1)
        log.info(
            "consumer attached",
            binding=b.settings.name,
            queue=b.settings.queue,
            prefetch=b.prefetch,
        )

    def _on_message(
        self, b: _Binding, generation: int, _channel: Any, method: Any, props: Any, body: bytes
    ) -> None:
        b.in_flight += 1
        b.current += 1
        tag = method.delivery_tag
        unreadable = amqp_properties.unreadable(props)
        if unreadable is not None:
            log.warning(
                "message properties pika could not decode: it will be dead-lettered",
                binding=b.settings.name,
                delivery_tag=tag,
                error=unreadable.error,
            )
        try:
            message = amqp_message(body, props)
        except Exception as e:
            # Raised here (pika's callback) it would abort the connection just as
            # a decode failure does, and meet this message again on the next one.
            log.exception("message properties could not be read", binding=b.settings.name)
            message = AmqpMessage(body, {})
            unreadable = Unreadable(f"{type(e).__name__}: {e}", b"")
        received = Received(generation, tag, bool(method.redelivered), message, unreadable)
        if not self._inbound:
            # pika dispatches every frame of one socket read, then its timers: the
            # whole burst goes to the engine in one hand-over (one wake-up, and one
            # turn each at the GIL instead of a tug of war per message).
            self._connection.ioloop.call_later(0, self._hand_over)
        self._inbound.append((b.settings.name, received))

    def _hand_over(self) -> None:
        inbound, self._inbound = self._inbound, []
        self._deliver(inbound)

    def _on_cancelled(self, b: _Binding, generation: int, _frame: Any) -> None:
        """The broker cancelled our consumer (queue deleted, node failover)."""
        if generation != b.generation or b.channel is None:
            return
        log.warning("consumer cancelled by the broker", binding=b.settings.name)
        b.close_reason = "consumer_cancelled"
        _close_channel(b.channel)

    def _on_channel_closed(self, b: _Binding, generation: int, _channel: Any, reason: Any) -> None:
        if generation != b.generation:
            return
        label = b.close_reason or "channel_closed"
        self._forget_channel(b)
        with self._lock:
            connection = self._connection
        if self._stopping.is_set() or connection is None or not connection.is_open:
            return  # shutdown, or the connection's own close handles the rebuild
        self._metrics.reconnects.labels(label).inc()
        delay = self._reconnect.wait(b.failures)
        b.failures += 1
        log.warning(
            "channel closed",
            binding=b.settings.name,
            reason=label,
            detail=describe_error(reason),
            retry_in_s=round(delay, 3),
        )
        connection.ioloop.call_later(delay, partial(self._open_channel, connection, b))

    def _forget_channel(self, b: _Binding) -> None:
        was_consuming = bool(b.consumer_tags)
        b.channel, b.consumer_tags, b.close_reason = None, [], None
        # Its deliveries still running are the closed channel's now: they keep
        # their slots (``in_flight``) but no longer count as this channel's.
        b.ready, b.prefetch, b.current = False, 0, 0
        self._metrics.consumer_up.labels(b.settings.name).set(0)
        if was_consuming:
            log.info("consumer detached", binding=b.settings.name)

    # ----------------------------------------------------------------- verdicts and shutdown

    def _apply_verdicts(self) -> None:
        with self._lock:
            verdicts = list(self._verdicts)
            self._verdicts.clear()
        touched: set[str] = set()
        for v in verdicts:
            b = self._bindings[v.binding]
            touched.add(v.binding)
            b.in_flight -= 1
            channel = b.channel
            current = channel is not None and v.received.generation == b.generation
            if current:
                b.current -= 1
            if v.action is Action.LEAVE:
                continue  # nothing to send: the broker redelivers it
            if not current or not channel.is_open:
                self._count_stale(b)
                continue
            self._send_verdict(b, channel, v.received.tag, v.action)
        for name in touched:
            self._fill(self._bindings[name])

    def _send_verdict(self, b: _Binding, channel: Any, tag: int, action: Action) -> None:
        try:
            # One verdict per delivery, never `multiple` (invariant 3).
            if action is Action.ACK:
                channel.basic_ack(tag, multiple=False)
            elif action is Action.REQUEUE:
                channel.basic_nack(tag, multiple=False, requeue=True)
            else:
                channel.basic_reject(tag, requeue=False)
        except pika.exceptions.AMQPError:
            self._count_stale(b)

    def _count_stale(self, b: _Binding) -> None:
        self._metrics.stale_acks.labels(b.settings.name).inc()

    def _cancel_consumers(self) -> None:
        for b in self._bindings.values():
            if b.channel is not None and b.channel.is_open and b.consumer_tags:
                for tag in b.consumer_tags:
                    b.channel.basic_cancel(tag)
                b.consumer_tags = []
                self._metrics.consumer_up.labels(b.settings.name).set(0)
                log.info("consumer cancelled", binding=b.settings.name)

    def _close(self) -> None:
        self._apply_verdicts()
        with self._lock:
            connection = self._connection
        if connection is None:
            return
        try:
            connection.close()
        except pika.exceptions.ConnectionWrongStateError:
            connection.ioloop.stop()  # still opening or already closing: just leave


def _close_channel(channel: Any) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError):
        channel.close()


def _close_reason(error: Exception, current: str) -> str:
    """The ``dispatcher_reconnects_total`` reason for a connection close."""
    if isinstance(error, pika.exceptions.ConnectionBlockedTimeout):
        return "blocked_timeout"
    if isinstance(error, pika.exceptions.AMQPHeartbeatTimeout):
        return "heartbeat_timeout"
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker):
        return "closed_by_broker"
    if isinstance(error, pika.exceptions.StreamLostError):
        return "connection_lost"
    return current
