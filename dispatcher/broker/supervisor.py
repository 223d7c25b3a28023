"""The connection supervisor: the consuming connection, watched and rebuilt forever.

It connects, opens one channel per binding (so a channel-level close of one
binding does not disturb the others), sets prefetch, consumes, notices every
way consumption can stop, and rebuilds with jittered exponential backoff,
forever. With a cluster's nodes in ``broker.url``, every connect goes to the
node after the one tried last (``params.Rotation``): losing the
connection to one node leads straight to the next, and the backoff applies
only when a whole round of nodes failed. The node connected to is logged
(``host:port``) and shown by ``dispatcher_broker_node``.

It runs on the engine loop, as every delivery does (pika through
``pika_loop.LoopConnection``). The supervisor is not a thread but a set of
callbacks on that loop: the connection's close callback schedules the next
connect, as Knative's dispatcher has a goroutine watching its connection's
close notification.

Each binding's channel is a ``BindingChannel`` (``channel``): it receives its
binding's messages, runs the binding's ``handle`` on each and sends the action
itself, so an ack is on the wire in the iteration that decided it. A
connection lost takes every channel with it; the supervisor reconnects and
the binding channels open new ones.

Everything here runs on the loop thread, except the methods marked "any
thread": those only schedule work on the loop, or read plain fields.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions

from dispatcher.broker.channel import BindingChannel, Consumption, Shared
from dispatcher.broker.params import (
    Node,
    Rotation,
    describe_error,
    nodes,
    reconnect_backoff,
)
from dispatcher.broker.pika_loop import LoopConnection, close_within
from dispatcher.config import BindingSettings, BrokerSettings
from dispatcher.delivery.breaker import CircuitBreaker
from dispatcher.delivery.seams import Handle
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Loop
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import Metrics

log = get_logger()

_TICK = 1.0  # the loop proves it is alive this often (for /healthz)


class Supervisor:
    def __init__(
        self,
        broker: BrokerSettings,
        metrics: Metrics,
        loop: Loop,
        waits: Waits,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._broker = broker
        self._metrics = metrics
        self._loop = loop
        self._reconnect = reconnect_backoff(broker, rng)
        # Built once (URLs, TLS files): raises here, at start, for a bad CA or key; TLS
        # files that change later are read again at the next connect (params.Node).
        self._rotation = Rotation(nodes(broker, "consumer"), self._reconnect)
        self._node: Node = self._rotation.nodes[0]  # tried last
        self._bindings: dict[str, BindingChannel] = {}
        self._connection: Any = None
        self._stopping = False
        self._idle = threading.Event()  # stopping, and no delivery in flight
        self._closed = threading.Event()  # stopping, and no connection left
        self._used_at: float | None = None  # when this connection got a channel ready
        self.last_tick = time.monotonic()
        self._shared = Shared(
            metrics,
            self._reconnect,
            lambda: self._stopping,
            itertools.count(1),
            lambda: self._connection,
            self._channel_ready,
            loop.spawn,
            waits,
            self._delivery_done,
        )

    def add_binding(
        self, settings: BindingSettings, handle: Handle, breaker: CircuitBreaker | None = None
    ) -> None:
        """``handle``: what the binding does with each message (``Handler.handle``)."""
        channel = BindingChannel(settings, self._shared, handle, breaker)
        self._bindings[settings.name] = channel
        self._metrics.register_binding(settings.name)
        # Read when scraped: no gauge update (and its lock) per delivery.
        self._metrics.binding(settings.name).inflight.set_function(lambda: channel.in_flight)

    # ----------------------------------------------------------------- any thread

    def start(self) -> None:
        self._loop.call_soon_threadsafe(lambda _arg: self._start(), None)

    def consumers(self) -> dict[str, Consumption]:
        """Binding name -> ``up`` (a live consumer), ``paused`` (its circuit breaker
        stopped it, on a channel that is fine) or ``down``."""
        return {name: b.consumption for name, b in self._bindings.items()}

    # Inspection and fault injection for tests and debugging: the values are plain
    # fields the loop writes, read as they are; anything that touches pika runs on
    # the loop.

    @property
    def nodes(self) -> tuple[str, ...]:
        """The broker nodes (``host:port``) connects go round, in order."""
        return tuple(node.label for node in self._rotation.nodes)

    def generation(self, binding: str) -> int:
        """The generation of ``binding``'s latest channel (0 before the first): each
        new channel has a higher one, and verdicts of an older one are stale."""
        return self._bindings[binding].generation

    def waiting(self, binding: str) -> int:
        """``binding``'s messages held for a free slot (``prefetch`` above ``parallelism``)."""
        return self._bindings[binding].waiting

    def channel_ready(self, binding: str) -> bool:
        """``binding``'s channel is open and set up (queue declared): it consumes,
        or waits for room to."""
        bound = self._bindings[binding]
        channel = bound.channel
        return bound.ready and channel is not None and bool(channel.is_open)

    def close_channel(self, binding: str) -> bool:
        """Close ``binding``'s channel as a broker-side channel error would: counted as
        ``channel_closed`` and rebuilt after a backoff, with a new generation. False
        when there is no connection to ask."""
        return self._connection is not None and self.run_on_loop(
            self._bindings[binding].close_channel
        )

    def run_on_loop(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` on the loop, between its events (a stuck loop can be
        simulated so). False once the loop has stopped."""
        return self._loop.call_soon_threadsafe(lambda _arg: callback(), None)

    def begin_shutdown(self) -> None:
        """Cancel consumers so no new message arrives; one that still does is left
        unacked (the broker has it back when the channel closes)."""
        self.run_on_loop(self._begin_shutdown)

    def wait_idle(self, timeout: float) -> bool:
        """After ``begin_shutdown``: True once no delivery is in flight; bounded."""
        return self._idle.wait(timeout)

    def finish(self, timeout: float) -> None:
        """Close the connection; wait (bounded) until it is closed, or aborted."""
        close_within(self._loop, self._close, self._abort, self._closed, timeout)

    # ----------------------------------------------------------------- the connection

    def _start(self) -> None:
        self._tick()
        self._connect()

    def _tick(self) -> None:
        self.last_tick = time.monotonic()
        self._loop.call_later(_TICK, self._tick)

    def _connect(self) -> None:
        if self._stopping:
            self._closed.set()
            return
        node = self._node = self._rotation.next()
        self._used_at = None
        try:
            connection = LoopConnection(
                self._loop,
                node.parameters,
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_close,
            )
        except Exception:
            # Never let consumption end: log, back off, rebuild.
            log.exception("broker supervisor error", node=node.label)
            self._loop.call_soon(self._ended, "error", False)
            return
        self._connection = connection

    def _on_open(self, connection: Any) -> None:
        self._metrics.broker_connected.set(1)
        self._metrics.set_broker_node(self._node.label)
        log.info("broker connected", node=self._node.label, connection=self._broker.connection_name)
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        if self._stopping:
            self._close()
            return
        for bound in self._bindings.values():
            bound.open(connection)

    def _on_open_error(self, _connection: Any, error: Exception) -> None:
        log.warning("broker connect failed", node=self._node.label, error=describe_error(error))
        self._ended("connect_failed", opened=False)

    def _on_close(self, _connection: Any, reason: Exception) -> None:
        label = "shutdown" if self._stopping else _close_reason(reason)
        log.info(
            "broker connection closed",
            node=self._node.label,
            reason=label,
            detail=describe_error(reason),
        )
        self._ended(label, opened=True)  # pika calls this only for an opened connection

    def _ended(self, reason: str, opened: bool) -> None:
        self._connection = None
        for bound in self._bindings.values():
            bound.forget_channel()
        self._metrics.broker_connected.set(0)
        self._metrics.set_broker_node(None)
        self._metrics.set_blocked("consumer", False)
        if self._stopping:
            self._closed.set()
            log.info("broker supervisor stopped")
            return
        self._metrics.reconnects.labels(reason).inc()
        # 0 while other nodes of the round are left to try.
        served = None if self._used_at is None else time.monotonic() - self._used_at
        delay = self._rotation.ended(opened=opened, served=served)
        log.warning(
            "broker disconnected", node=self._node.label, reason=reason, retry_in_s=round(delay, 3)
        )
        self._loop.call_later(delay, self._connect)

    def _on_blocked(self, _connection: Any, _frame: Any) -> None:
        self._metrics.set_blocked("consumer", True)
        log.warning("broker blocked the connection (resource alarm)")

    def _on_unblocked(self, _connection: Any, _frame: Any) -> None:
        self._metrics.set_blocked("consumer", False)
        log.info("broker unblocked the connection")

    def _channel_ready(self) -> None:
        if self._used_at is None:
            self._used_at = time.monotonic()

    # ----------------------------------------------------------------- shutdown

    def _delivery_done(self) -> None:
        """A delivery reached its action (each frees its slot)."""
        if self._stopping:
            self._check_idle()

    def _begin_shutdown(self) -> None:
        self._stopping = True
        for bound in self._bindings.values():
            bound.cancel()
        self._check_idle()

    def _check_idle(self) -> None:
        if all(bound.in_flight == 0 for bound in self._bindings.values()):
            self._idle.set()

    def _close(self) -> None:
        self._stopping = True
        connection = self._connection
        if connection is None:
            self._closed.set()  # waiting to reconnect: the wait's timer finds it stopping
            return
        try:
            connection.close()
        except pika.exceptions.ConnectionWrongStateError:
            connection.abort()  # still opening: drop it (closing already: wait for it)

    def _abort(self) -> None:
        if self._connection is not None:
            self._connection.abort()


def _close_reason(error: Exception) -> str:
    """The ``dispatcher_reconnects_total`` reason for an opened connection's close."""
    if isinstance(error, pika.exceptions.ConnectionBlockedTimeout):
        return "blocked_timeout"
    if isinstance(error, pika.exceptions.AMQPHeartbeatTimeout):
        return "heartbeat_timeout"
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker):
        return "closed_by_broker"
    return "connection_lost"
