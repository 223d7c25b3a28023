"""Dead letters and replies: one long-lived confirm channel, many publishes in flight.

Publishing never shares the consuming connection: a broker memory or disk
alarm blocks connections that publish, and a blocked consuming connection
would stop acks from being read. Nor does it open a connection or channel per
message: brokers fall over under that churn. One
``confirm_link.ConfirmLink`` (the connection, confirm channel, window and
returns that ``replay`` publishes on too), connected at start and rebuilt
with backoff whenever it breaks; a channel the broker closes is reopened on
the same connection. With a cluster's nodes in ``broker.url`` it goes round
them as the consumer does (``params.Rotation``): a lost connection
leads straight to the next node, the backoff comes after a whole round
failed, and logs name the node (``host:port``).

Deliveries on the engine loop call ``publish`` and await the answer: ``None``
once the broker confirmed the message, else why not (nacked, returned as
unroutable, the channel or connection lost, or no confirm in time). Many
publishes are in flight at once, and each delivery waits only for its own
confirm. The connection runs on the engine loop itself (``pika_loop``): a
publish is on the wire in the iteration that asked for it, and its confirm
resolves the delivery's future with no thread in between.

While a resource alarm blocks this connection, ``dispatcher_broker_blocked``
stays 1, across the reconnects that ``blocked_timeout`` causes. What ends it
is ``Connection.Unblocked``, or a confirm on a connection that has not heard
``Connection.Blocked``. Checked on RabbitMQ 3.10: during an alarm the first
publish on a fresh connection is still confirmed, but the broker sends
``Connection.Blocked`` before that confirm and holds every later publish.
Once it has said so, publishes wait here, not in the broker: one written to
a blocked connection would go out when the alarm ends, long after its
delivery was told "no confirm" and had published another copy. A
fresh connection hears nothing until it publishes, so while blocked an empty
probe goes out every few seconds (not mandatory, to a routing key no queue
has: the broker confirms and drops it).

The timeout is decided on the engine loop and is final: a confirm that
arrives after it changes nothing (the future was already resolved), so the
delivery's verdict never flips from "not accepted" to "accepted". A request
still waiting here when its time is up is dropped, never published late.
Messages are ``mandatory``: an event routed nowhere was accepted by no one.
An exchange the broker refused (404, 403) is not published to again for a
while (``refused_exchanges``): each refusal closes the channel every binding
shares.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pika
import pika.exceptions

from dispatcher.broker.confirm_link import ConfirmLink, message_id
from dispatcher.broker.params import Node, Rotation, nodes, reconnect_backoff
from dispatcher.broker.pika_loop import close_within
from dispatcher.broker.refused_exchanges import RefusedExchanges
from dispatcher.config import BrokerSettings
from dispatcher.event import amqp
from dispatcher.event.cloudevent import Event
from dispatcher.event.json_format import STRUCTURED_CONTENT_TYPE, to_json
from dispatcher.loop import Future, Loop, Timer
from dispatcher.observe.logs import get_logger

log = get_logger()

_CLOSE_BOUND: Final = 3.0
_PROBE_INTERVAL: Final = 5.0
_PROBE_ROUTING_KEY: Final = "dispatcher.blocked-probe.not-a-queue"


@dataclass(slots=True)
class _Request:
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties
    key: tuple[str, str, object, object]  # matches a basic.return to its publish
    expires: float
    future: Future[str | None] | None  # None: the blocked probe, answered to nobody
    mandatory: bool = True
    timer: Timer | None = None


class Publisher:
    """Everything here runs on the engine loop, except ``start`` and ``close``."""

    def __init__(
        self,
        broker: BrokerSettings,
        loop: Loop,
        on_blocked: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Built once (URLs parsed); TLS files are read again when they change (params.Node).
        self._rotation = Rotation(nodes(broker, "publisher"), reconnect_backoff(broker))
        self._node: Node = self._rotation.nodes[0]  # tried last
        self._loop = loop
        self._on_blocked = on_blocked or (lambda _blocked: None)
        self._clock = clock
        self._queue: deque[_Request] = deque()  # waiting for a ready channel
        self._blocked = False  # a resource alarm blocks us
        self._heard_blocked = False  # this connection got Connection.Blocked, no Unblocked
        self._closed = threading.Event()  # set once stopping and no connection is left
        self._refused = RefusedExchanges(clock)
        self._link: ConfirmLink[_Request] = ConfirmLink(
            on_ready=self._on_ready,
            on_confirmed=self._on_confirmed,
            on_lost=self._on_lost,
            returned=_returned,
            reopen_channel=True,
            on_open=self._on_open,
            role="publisher",
            # Unconfirmed requests (their futures long answered) must not pile up
            # on a connection that stopped confirming: as long as a block may last.
            confirm_bound=broker.blocked_timeout,
            on_refused=self._on_refused,
        )

    @property
    def ready(self) -> bool:
        """A confirm channel is open: a publish goes out at once, else it waits."""
        return self._link.ready

    @property
    def connections_opened(self) -> int:
        """Long-lived: stays 1 while the broker stays up."""
        return self._link.opened

    # ----------------------------------------------------------------- the loop

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, Any],
        content_type: str | None,
        timeout: float,
    ) -> Future[str | None]:
        """Publish persistently and ``mandatory``; the future says None (confirmed) or why not."""
        properties = pika.BasicProperties(
            headers=dict(headers), content_type=content_type, delivery_mode=2
        )
        key = (exchange, routing_key, headers.get("ce-source"), headers.get("ce-id"))
        return self._publish(exchange, routing_key, body, properties, timeout, key)

    def _publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        timeout: float,
        key: tuple[str, str, object, object],
    ) -> Future[str | None]:
        future: Future[str | None] = self._loop.create_future()
        request = _Request(
            exchange, routing_key, body, properties, key, self._clock() + timeout, future
        )
        refused = self._refused.why_not(exchange)
        if refused is not None:
            future.resolve(refused)  # not sent: it would close the channel for everyone
            return future
        request.timer = self._loop.call_later(
            timeout, future.resolve, f"no confirm from the broker within {timeout:g}s"
        )
        if self._link.ready and not self._heard_blocked:
            self._send(request)
        else:
            # No channel, or one the broker said it holds publishes on: kept here
            # until it can go, and dropped unsent once its time is up. Written to a
            # blocked connection it would wait in the broker past its timeout, go
            # out when the alarm ends, and its delivery, told "no confirm", would
            # already have tried again: one more reply or dead letter each time.
            self._wait_for_channel(request)
        return future

    def publish_event(
        self,
        exchange: str,
        routing_key: str,
        event: Event,
        timeout: float,
        trace: Mapping[str, str] | None = None,
    ) -> Future[str | None]:
        """``event`` in the binary ``ce-`` header form this dispatcher reads, with the
        W3C trace headers of the message it came from. An event whose attributes do
        not fit in one AMQP frame as headers (a frame holds 128 KiB unless the broker
        says less) goes in the structured form instead, a JSON body, which has no
        such bound: still a CloudEvent, and whole."""
        headers: dict[str, Any]
        headers, content_type = amqp.to_amqp_headers(event)
        if trace:
            headers.update(trace)
        id_property = message_id(event.id)
        properties = pika.BasicProperties(
            headers=headers, content_type=content_type, delivery_mode=2, message_id=id_property
        )
        body = event.data or b""
        if self._link.too_large(properties) is not None:
            properties = pika.BasicProperties(
                headers=dict(trace or {}),
                content_type=STRUCTURED_CONTENT_TYPE,
                delivery_mode=2,
                message_id=id_property,
            )
            body = to_json(event)
        # The event's identity, whatever the form: a return is matched to its publish
        # by it (``_returned`` reads it back from the headers, or a structured body).
        key = (exchange, routing_key, event.source, event.id)
        return self._publish(exchange, routing_key, body, properties, timeout, key)

    def _wait_for_channel(self, request: _Request) -> None:
        queue = self._queue
        now = self._clock()
        # Disconnected for long, the queue would only hold what nobody waits
        # for any more: drop what expired (its delivery has moved on).
        while queue and queue[0].expires <= now:
            queue.popleft()
        queue.append(request)

    def _send(self, request: _Request) -> None:
        error = self._publish_one(request)
        if error is not None:
            _answer(request, error)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """From any thread: connect on the loop."""
        self._loop.call_soon_threadsafe(lambda _arg: self._connect(), None)

    def close(self, timeout: float = _CLOSE_BOUND) -> None:
        """From any thread but the loop's: close the connection, wait (bounded) until
        it is closed, or aborted."""
        close_within(self._loop, self._stop, self._link.abort, self._closed, timeout)

    def _stop(self) -> None:
        self._link.stopping = True
        if self._link.connected:
            self._link.close()
        else:
            self._closed.set()  # waiting to reconnect: the wait's timer finds it stopping

    def _connect(self) -> None:
        if self._link.stopping:
            self._closed.set()
            return
        self._node = self._rotation.next()
        self._link.connect(self._node, self._loop, self._ended)

    def _ended(self, opened: bool, served: float | None) -> None:
        if self._link.stopping:
            self._closed.set()
            return
        # 0 while other nodes of the round are left to try.
        delay = self._rotation.ended(opened=opened, served=served)
        log.warning("publisher disconnected", node=self._node.label, retry_in_s=round(delay, 3))
        self._loop.call_later(delay, self._connect)

    def _on_open(self, connection: Any) -> None:
        self._heard_blocked = False
        connection.add_on_connection_blocked_callback(lambda *_: self._heard(blocked=True))
        connection.add_on_connection_unblocked_callback(lambda *_: self._heard(blocked=False))

    def _heard(self, blocked: bool) -> None:
        self._heard_blocked = blocked
        self._set_blocked(blocked)
        if not blocked and self._link.ready:
            self._send_waiting()

    def _set_blocked(self, blocked: bool) -> None:
        if blocked == self._blocked:
            return
        self._blocked = blocked
        self._on_blocked(blocked)
        if blocked:
            log.warning("broker blocked the publishing connection (resource alarm)")
        else:
            log.info("broker unblocked the publishing connection")

    def _on_ready(self) -> None:
        if not self._heard_blocked:  # a channel reopened on a blocked connection: not yet
            self._send_waiting()
        self._probe(self._link.channel)

    def _send_waiting(self) -> None:
        requests, self._queue = self._queue, deque()
        now = self._clock()
        for request in requests:
            if request.expires > now:  # else its delivery stopped waiting: never late
                self._send(request)

    def _probe(self, channel: Any) -> None:
        """While blocked, an empty publish every few seconds: its confirm ends the block."""
        if not self._blocked or channel is not self._link.channel or not channel.is_open:
            return
        probe = _Request(
            "",
            _PROBE_ROUTING_KEY,
            b"",
            pika.BasicProperties(),
            ("", _PROBE_ROUTING_KEY, None, None),
            expires=float("inf"),
            future=None,
            mandatory=False,
        )
        self._publish_one(probe)
        self._link.call_later(_PROBE_INTERVAL, lambda: self._probe(channel))

    def _publish_one(self, request: _Request) -> str | None:
        try:
            error = self._link.publish(
                request,
                request.key,
                request.exchange,
                request.routing_key,
                request.body,
                request.properties,
                mandatory=request.mandatory,
            )
        except Exception as e:  # the channel or connection broke under us
            return f"broker connection failed: {type(e).__name__}"
        return None if error is None else error[:300]

    def _on_confirmed(self, answered: list[tuple[_Request, str | None]], acked: bool) -> None:
        if acked and not self._heard_blocked:
            self._set_blocked(False)  # read and confirmed with no alarm said: not blocked
        for request, error in answered:
            if acked:
                self._refused.accepted(request.exchange)
            _answer(request, error)

    def _on_refused(self, close: pika.exceptions.ChannelClosedByBroker) -> None:
        refused = self._refused.refused(close)
        if refused is None:
            log.warning("broker closed the publishing channel", detail=str(close))
            return
        exchange, wait = refused
        log.warning(
            "broker refused a publish: not sent to that exchange for a while",
            exchange=exchange,
            detail=f"{close.reply_code} {close.reply_text}",
            retry_in_s=round(wait, 3),
        )

    def _on_lost(self, requests: list[_Request], reason: str) -> None:
        # Still blocked, as far as anyone knows: the next confirm will tell.
        for request in requests:
            _answer(request, reason)


def _answer(request: _Request, error: str | None) -> None:
    if request.timer is not None:
        request.timer.cancel()
    if request.future is not None:
        request.future.resolve(error)


def _returned(
    method: Any, properties: Any, body: bytes
) -> tuple[tuple[str, str, object, object], str]:
    headers = properties.headers or {}
    source, event_id = headers.get("ce-source"), headers.get("ce-id")
    if event_id is None and (properties.content_type or "").startswith(STRUCTURED_CONTENT_TYPE):
        source, event_id = _identity(body)
    key = (method.exchange, method.routing_key, source, event_id)
    return key, (
        f"unroutable: exchange {method.exchange!r} routed it to no queue "
        f"({method.reply_code} {method.reply_text})"
    )


def _identity(body: bytes) -> tuple[object, object]:
    """A structured event's source and id, read back from a returned message."""
    try:
        document = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(document, dict):
        return None, None
    return document.get("source"), document.get("id")
