"""One long-lived, confirmed publishing connection (dead letters and replies).

Publishing never shares the consuming connection: a broker memory or disk
alarm blocks connections that publish, and a blocked consuming connection
would stop acks from being read. Publishing never opens a connection or
channel per message either (FIELD-NOTES failure 4): one thread owns one
``BlockingConnection`` with one confirm channel, opened on first use and
reused until it breaks.

Callers on worker threads hand a request over and wait, bounded, for the
broker's confirm. Messages are published ``mandatory``: an event routed
nowhere was not accepted by anyone, so it is an error, not a success.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions

from dispatcher import events
from dispatcher.broker_params import connection_parameters
from dispatcher.config import BrokerSettings
from dispatcher.errors import PublishError
from dispatcher.events import Event
from dispatcher.logs import get_logger

log = get_logger()

_IDLE_POLL = 1.0  # seconds between heartbeat services while no request is waiting
# While blocked, a probe every few seconds: a fresh connection hears no
# Connection.Blocked until it publishes, so only a publish can tell the alarm
# is over. It is empty, not mandatory, and routed nowhere (the default
# exchange has no queue of that name): the broker confirms and drops it.
_PROBE_INTERVAL = 5.0
_PROBE_ROUTING_KEY = "dispatcher.blocked-probe.not-a-queue"


@dataclass(slots=True)
class _Request:
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties
    expires: float
    mandatory: bool = True
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class Publisher:
    def __init__(
        self,
        broker: BrokerSettings,
        on_blocked: Callable[[bool], None] | None = None,
    ) -> None:
        self._broker = broker
        # Built once: URL parsing and TLS files are not re-read on every reconnect.
        self._params = connection_parameters(broker, "publisher")
        # A resource alarm blocks publishing connections (this one), never the
        # consuming one; blocked_connection_timeout turns a block into an error.
        self._notify_blocked = on_blocked or (lambda _blocked: None)
        self._blocked = False
        self._next_probe = 0.0
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.connections_opened = 0  # long-lived: stays 1 while the broker stays up

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any],
        content_type: str | None,
        timeout: float = 10.0,
    ) -> None:
        """Publish persistently and wait for the confirm; raises ``PublishError``."""
        properties = pika.BasicProperties(
            headers=dict(headers), content_type=content_type, delivery_mode=2
        )
        request = _Request(exchange, routing_key, body, properties, time.monotonic() + timeout)
        self._ensure_thread()
        self._requests.put(request)
        if not request.done.wait(timeout):
            raise PublishError(f"no confirm from the broker within {timeout:g}s")
        if request.error is not None:
            raise PublishError(request.error)

    def publish_event(
        self, exchange: str, routing_key: str, event: Event, timeout: float = 10.0
    ) -> None:
        """Publish ``event`` in the binary ``ce-`` header form this dispatcher reads."""
        headers, content_type = events.to_amqp_headers(event)
        self.publish(exchange, routing_key, event.data or b"", headers, content_type, timeout)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._requests.put(None)
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._closed:
                raise PublishError("publisher is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
                self._thread.start()

    # ----------------------------------------------------------------- publisher thread

    def _run(self) -> None:
        connection: Any = None
        channel: Any = None
        while True:
            try:
                request = self._requests.get(timeout=_IDLE_POLL)
            except queue.Empty:
                if self._blocked and time.monotonic() >= self._next_probe:
                    connection, channel = self._probe(connection, channel)
                else:
                    connection = self._service_heartbeats(connection)
                continue
            if request is None:
                break
            connection, channel = self._publish_one(request, connection, channel)
        _close_quietly(connection)

    def _on_blocked(self, blocked: bool) -> None:
        self._blocked = blocked
        self._notify_blocked(blocked)

    def _probe(self, connection: Any, channel: Any) -> tuple[Any, Any]:
        self._next_probe = time.monotonic() + _PROBE_INTERVAL
        probe = _Request(
            "",
            _PROBE_ROUTING_KEY,
            b"",
            pika.BasicProperties(),
            expires=time.monotonic() + self._broker.blocked_timeout + 5.0,
            mandatory=False,
        )
        return self._publish_one(probe, connection, channel)

    def _service_heartbeats(self, connection: Any) -> Any:
        if connection is None:
            return None
        try:
            connection.process_data_events(time_limit=0)
            return connection
        except Exception:  # any pika failure: reconnect lazily on the next request
            _close_quietly(connection)
            return None

    def _publish_one(self, request: _Request, connection: Any, channel: Any) -> tuple[Any, Any]:
        # One reconnect per request at most: the caller's timeout bounds the rest,
        # and the caller decides what a failure means (retry, requeue).
        for _ in range(2):
            if time.monotonic() > request.expires:
                request.error = "timed out before it could be published"
                break
            try:
                if connection is None or not connection.is_open:
                    _close_quietly(connection)
                    connection, channel = self._connect()
                elif channel is None or channel.is_closed:
                    # A channel error (404 exchange) leaves the connection fine.
                    channel = self._open_channel(connection)
                channel.basic_publish(
                    request.exchange,
                    request.routing_key,
                    request.body,
                    properties=request.properties,
                    mandatory=request.mandatory,
                )
                request.error = None
                if self._blocked:
                    self._on_blocked(False)
                break
            except pika.exceptions.UnroutableError:
                request.error = f"unroutable: exchange {request.exchange!r} routed it to no queue"
                break
            except pika.exceptions.NackError:
                request.error = "the broker nacked it"
                break
            except pika.exceptions.ChannelClosedByBroker as e:
                # e.g. 404: the exchange does not exist. Publishing again will not help.
                request.error = f"channel closed by the broker: {e.reply_code} {e.reply_text}"
                channel = None
                break
            except pika.exceptions.ConnectionBlockedTimeout:
                # BlockingConnection delivers the Blocked notification only between
                # publishes, so the timeout is the reliable sign. Still blocked
                # until a publish goes through.
                request.error = "the broker blocked publishing (resource alarm)"
                self._on_blocked(True)
                _close_quietly(connection)
                connection, channel = None, None
                break  # a new connection would be blocked just the same
            except Exception as e:  # pika's connection errors all end here
                request.error = f"broker connection failed: {type(e).__name__}"
                _close_quietly(connection)
                connection, channel = None, None
        request.done.set()
        return connection, channel

    def _connect(self) -> tuple[Any, Any]:
        connection = pika.BlockingConnection(self._params)
        self.connections_opened += 1
        try:
            connection.add_on_connection_blocked_callback(lambda *_: self._on_blocked(True))
            connection.add_on_connection_unblocked_callback(lambda *_: self._on_blocked(False))
            channel = self._open_channel(connection)
        except Exception:
            _close_quietly(connection)  # never leave a half-set-up connection behind
            raise
        log.info("publisher connected")
        return connection, channel

    @staticmethod
    def _open_channel(connection: Any) -> Any:
        channel = connection.channel()
        channel.confirm_delivery()
        return channel


def exchange_target(
    publisher: Publisher | None, exchange: str | None
) -> tuple[Publisher, str] | None:
    """Where a configured ``exchange`` is published, or ``None`` when none is configured.

    ``""`` is the AMQP default exchange, a real target: only ``None`` means none.
    """
    return None if publisher is None or exchange is None else (publisher, exchange)


def _close_quietly(connection: Any) -> None:
    if connection is None:
        return
    try:
        if connection.is_open:
            connection.close()
    except Exception:  # closing a broken connection may raise anything; it is gone either way
        pass
