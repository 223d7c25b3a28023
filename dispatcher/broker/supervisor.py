"""The connection supervisor: the one thread that owns pika.

It connects, opens one channel per binding (so a channel-level close of one
binding does not disturb the others), sets prefetch, consumes, notices every
way consumption can stop, and rebuilds with jittered exponential backoff,
forever. With a cluster's nodes in ``broker.url``, every connect goes to the
node after the one tried last (``params.Rotation``): losing the
connection to one node leads straight to the next, and the backoff applies
only when a whole round of nodes failed. The node connected to is logged
(``host:port``) and shown by ``dispatcher_broker_node``.

Messages are handed to the delivery engine; the engine hands its verdicts
back in batches through ``settle``, which queues them and wakes the pika
thread with ``add_callback_threadsafe`` (one wake-up per batch, not per ack).

Each binding's channel is a ``Consumer`` (``consumer``): its channel
generations, prefetch room and verdicts. A connection lost takes every
channel with it; the supervisor reconnects and the consumers open new ones.

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
from functools import partial
from typing import Any

import pika
import pika.exceptions
from pika.adapters.select_connection import SelectConnection

from dispatcher.broker.consumer import Consumer, Shared
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
from dispatcher.handler import Received
from dispatcher.logs import get_logger
from dispatcher.metrics import Metrics

log = get_logger()

_TICK = 1.0  # the loop proves it is alive this often (for /healthz)


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
        self._bindings: dict[str, Consumer] = {}
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
        self._shared = Shared(
            metrics,
            self._reconnect,
            self._stopping,
            itertools.count(1),
            self._current_connection,
            self._channel_ready,
            self._receive,
        )

    def add_binding(self, settings: BindingSettings) -> None:
        self._bindings[settings.name] = Consumer(settings, self._shared)
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
        consumer = self._bindings[binding]
        channel = consumer.channel
        return consumer.ready and channel is not None and bool(channel.is_open)

    def close_channel(self, binding: str) -> bool:
        """Ask the pika thread to close ``binding``'s channel, as a broker-side channel
        error would: counted as ``channel_closed`` and rebuilt after a backoff, with a
        new generation. False when there is no connection to ask."""
        return self.run_on_broker_thread(self._bindings[binding].close_channel)

    def run_on_broker_thread(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the pika thread, between its events (a stuck loop can be
        simulated so). False when there is no connection, hence no loop, to run it."""
        with self._lock:
            connection = self._connection
        if connection is None:
            return False
        self._call_soon(connection, callback)
        return True

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
            for consumer in self._bindings.values():
                consumer.forget_channel()
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
        for consumer in self._bindings.values():
            consumer.open(connection)

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

    # ----------------------------------------------------------------- messages and verdicts

    def _channel_ready(self) -> None:
        if self._used_at is None:
            self._used_at = time.monotonic()

    def _receive(self, binding: str, received: Received) -> None:
        if not self._inbound:
            # pika dispatches every frame of one socket read, then its timers: the
            # whole burst goes to the engine in one hand-over (one wake-up, and one
            # turn each at the GIL instead of a tug of war per message).
            self._connection.ioloop.call_later(0, self._hand_over)
        self._inbound.append((binding, received))

    def _hand_over(self) -> None:
        inbound, self._inbound = self._inbound, []
        self._deliver(inbound)

    def _current_connection(self) -> Any:
        with self._lock:
            return self._connection

    def _apply_verdicts(self) -> None:
        with self._lock:
            verdicts = list(self._verdicts)
            self._verdicts.clear()
        touched: set[str] = set()
        for verdict in verdicts:
            touched.add(verdict.binding)
            self._bindings[verdict.binding].apply(verdict)
        for name in touched:
            self._bindings[name].fill()

    def _cancel_consumers(self) -> None:
        for consumer in self._bindings.values():
            consumer.cancel()

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
