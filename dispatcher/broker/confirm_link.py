"""One connection at a time with one confirm channel: what every publisher of ours runs on.

The service's publisher (dead letters, replies) and ``replay``'s partitions
publish the same way, and this is that way written once. ``connect(node,
loop, ended)`` opens one pika ``SelectConnection`` on a ``dispatcher.loop.Loop``
(the service's engine loop; ``serve(node)`` runs one on a loop of its own in
the calling thread, for ``replay``) and calls ``ended`` when it is gone. It opens
one confirm channel, and once the broker confirms that channel it calls
``on_ready``; the owner then ``publish``-es on it, as many messages in flight
as it likes. Every message is tracked in a ``ConfirmWindow``: a ``basic.ack``
or ``basic.nack`` (``multiple`` or not) answers what it covers and a
``basic.return`` marks its message unroutable, matched by the key the owner
gave its publish (``returned`` reads the same key, and the reason, from the
returned message). The owner hears ``on_confirmed`` (each item with ``None``,
accepted, or why not).

Whatever was unconfirmed when the channel or the connection goes is handed
back, in publish order, through ``on_lost``: the service fails it, ``replay``
sends it again on the next connection. A channel the broker closes (e.g. 404,
the exchange does not exist) is reopened on the same connection with backoff
(``reopen_channel=True``, the service), or ends the connection
(``reopen_channel=False``, ``replay``, whose exchange was checked at the start).

A connection that stays up but confirms nothing (a quorum queue without a
majority holds confirms; heartbeats still flow) would hold its unconfirmed
messages forever. With ``confirm_bound``, a connection that has had messages
unconfirmed and no confirm for that long is closed: ``ended`` is called, the
messages are handed back through ``on_lost``, and ``last_error`` says why.

Which node to connect to next, and how long to wait, is the owner's choice
with ``params.Rotation``; ``ended`` says whether the connection opened and how
long its channel was in use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import Any, Final, Generic, TypeVar

import pika
import pika.exceptions
from pika import spec
from pika.spec import Basic

from dispatcher.broker.confirm_window import ConfirmWindow
from dispatcher.broker.params import Node, describe_error
from dispatcher.broker.pika_loop import LoopConnection
from dispatcher.delivery.retry import Backoff
from dispatcher.loop import Loop
from dispatcher.observe.logs import get_logger

log = get_logger()

T = TypeVar("T")

_REOPEN_CHANNEL: Final = Backoff("exponential", 0.05, 5.0)
LOST: Final = "broker connection lost before the confirm"
# A content header frame: class id, weight, body size; then the frame's own bytes.
_HEADER_FIELDS: Final = 12
_FRAME_OVERHEAD: Final[int] = spec.FRAME_HEADER_SIZE + spec.FRAME_END_SIZE
# Every property but the headers table, at its longest (short strings of 255 bytes).
_OTHER_PROPERTIES: Final = 4096
_SHORT_STRING_OCTETS: Final = 255


def properties_size(properties: pika.BasicProperties, frame_max: int) -> int | None:
    """The bytes of the content header frame that carries ``properties``, when they
    might not fit in ``frame_max`` (``None``: they surely fit). A body is split into
    frames; the properties are one frame, and pika sends one larger than the
    connection's ``frame_max`` as it is: the broker then closes the whole connection
    (501 FRAME_ERROR, ``frame_too_large``), failing every publish in flight on it."""
    headers = properties.headers or {}
    # The bound, without encoding: a header is a short-string name, a type byte, a
    # length and the value, at most 4 bytes of UTF-8 per character.
    bound = _FRAME_OVERHEAD + _HEADER_FIELDS + _OTHER_PROPERTIES + 4
    for name, value in headers.items():
        if type(value) is not str:
            bound = frame_max + 1  # tables, lists, ...: only the encoding can tell
            break
        bound += 6 + 4 * (len(name) + len(value))
    if bound <= frame_max:
        return None
    encoded: list[bytes] = properties.encode()
    return _FRAME_OVERHEAD + _HEADER_FIELDS + sum(map(len, encoded))


def fits_short_string(text: str) -> bool:
    """Whether pika can send ``text`` as an AMQP short string (a header name, the
    ``message_id`` property): at most 255 octets of UTF-8. Past it pika refuses
    the whole publish (``ShortStringTooLong``)."""
    if len(text) * 4 <= _SHORT_STRING_OCTETS:  # UTF-8: at most 4 octets a character
        return True
    try:
        return len(text.encode()) <= _SHORT_STRING_OCTETS
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 carries it
        return False


def message_id(event_id: str) -> str | None:
    """The ``message_id`` property an event is published with: its id, as Knative's
    publishers set it (``CloudEventToRabbitMQMessage``) and its RabbitMQ source
    reads it back. None for an id that is not a short string: an event id has no
    length bound, and the publish must not fail for it."""
    return event_id if fits_short_string(event_id) else None


def _long_name(headers: Mapping[str, object]) -> str | None:
    """A header name that is not a short string, which pika cannot send."""
    for name in headers:
        if not fits_short_string(name):
            return name
    return None


class ConfirmLink(Generic[T]):
    """Callbacks run on the loop the connection was opened on."""

    def __init__(
        self,
        *,
        on_ready: Callable[[], None],
        on_confirmed: Callable[[list[tuple[T, str | None]], bool], None],
        on_lost: Callable[[list[T], str], None],
        returned: Callable[[Any, Any, bytes], tuple[Hashable, str]],
        reopen_channel: bool,
        on_open: Callable[[Any], None] | None = None,
        role: str | None = None,
        confirm_bound: float | None = None,
        on_refused: Callable[[pika.exceptions.ChannelClosedByBroker], None] | None = None,
    ) -> None:
        self._on_ready = on_ready
        self._on_confirmed = on_confirmed
        self._on_lost = on_lost
        # A basic.return's method, properties and body -> its publish's key, and the reason.
        self._returned = returned
        self._reopen_channel = reopen_channel
        self._on_open = on_open  # the connection opened: e.g. to hear Connection.Blocked
        # The broker closed the channel over a publish (404, 403): before ``on_lost``.
        self._on_refused = on_refused
        self.stopping = False  # then no channel or connection is opened again
        self._role = role  # logs connection events as "<role> connected" etc.; None: silent
        self._connection: Any = None
        self._ended: Callable[[bool, float | None], None] = lambda _opened, _served: None
        self.channel: Any = None  # the confirm channel, once confirming
        self.window: ConfirmWindow[T] = ConfirmWindow()
        self.opened = 0  # connections that opened, over the link's life
        self.last_error = "no connection attempted"
        self._opened_now = False
        self._used_at: float | None = None  # when this connection's channel got ready
        self._channel_failures = 0
        self._confirm_bound = confirm_bound
        # When the window was last empty or last confirmed: the watchdog's clock.
        self._progress_at = 0.0
        self._closed_by_us = False  # then ``last_error`` already says why

    @property
    def ready(self) -> bool:
        channel = self.channel
        return channel is not None and bool(channel.is_open)

    @property
    def connected(self) -> bool:
        """A connection is open or opening: ``ended`` will be called for it."""
        return self._connection is not None

    def connect(self, node: Node, loop: Loop, ended: Callable[[bool, float | None], None]) -> None:
        """Open one connection to ``node`` on ``loop``; ``ended(opened, served)`` once it
        is gone: whether it opened, and the seconds since its channel got ready
        (None if it never did)."""
        self._opened_now = False
        self._used_at = None
        self._closed_by_us = False
        self._ended = ended
        try:
            connection = LoopConnection(
                loop,
                node.parameters,
                on_open_callback=partial(self._on_connection_open, node=node),
                on_open_error_callback=partial(self._on_open_error, node=node),
                on_close_callback=partial(self._on_connection_closed, node=node),
            )
        except Exception as e:  # nothing is open yet: end it on the next iteration
            self.last_error = describe_error(e)
            loop.call_soon(self._end)
            return
        self._connection = connection

    def serve(self, node: Node) -> tuple[bool, float | None]:
        """One connection to ``node`` on a loop of its own in the calling thread,
        until it ends (``replay``'s partitions): what ``ended`` would say."""
        loop = Loop(f"link-{node.label}")
        said: list[tuple[bool, float | None]] = []

        def ended(opened: bool, served: float | None) -> None:
            said.append((opened, served))
            loop.request_stop()

        try:
            self.connect(node, loop, ended)
            loop.run()
        finally:
            loop.close()
        return said[0] if said else (self._opened_now, None)

    def publish(
        self,
        item: T,
        key: Hashable,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties,
        mandatory: bool = True,
    ) -> str | None:
        """Send on the ready channel: None once sent (the answer comes to ``on_confirmed``),
        else why this message cannot be encoded (it fails alone; the channel is
        unharmed). Any other error means the channel broke: it is raised, and the item
        is not in the window. ``key``: what ``returned`` makes of this message."""
        too_large = self.too_large(properties)
        if too_large is not None:
            return f"cannot be published: {too_large}"
        if not self.window:
            self._progress_at = time.monotonic()
        # Unconfirmed before it is sent: a loss while sending hands it back.
        tag = self.window.sent(key, item)
        try:
            self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=mandatory)
        except (pika.exceptions.ShortStringTooLong, ValueError, TypeError) as e:
            # A header name or routing key too long for AMQP, say.
            self.window.unsend(tag)
            return f"cannot be published: {type(e).__name__}: {e}"
        except Exception:
            self.window.unsend(tag)
            raise
        return None

    def too_large(self, properties: pika.BasicProperties) -> str | None:
        """Why ``properties`` cannot go in one frame of this connection, or None. Until
        a connection has agreed on its ``frame_max`` with the broker, the one asked
        for (the broker's can only be smaller: the publish checks again)."""
        connection = self._connection
        frame_max = (
            connection.params.frame_max
            if connection is not None
            else pika.ConnectionParameters.DEFAULT_FRAME_MAX
        )
        long_name = _long_name(properties.headers or {})
        if long_name is not None:
            return f"its header name {long_name[:40]!r}... is longer than an AMQP short string"
        try:
            size = properties_size(properties, frame_max)
        except (pika.exceptions.ShortStringTooLong, ValueError, TypeError):
            return None  # the publish says what cannot be encoded
        if size is None or size <= frame_max:
            return None
        return (
            f"its AMQP properties take {size} bytes, more than one frame of this "
            f"connection holds (frame_max {frame_max})"
        )

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """On this connection's loop, ``delay`` seconds from now."""
        self._connection.ioloop.call_later(delay, callback)

    def close(self) -> None:
        """Close the connection (``stopping`` first, for good); ``ended`` follows."""
        if self._connection is not None:
            _close(self._connection)

    def abort(self) -> None:
        """Drop the connection without the closing handshake; ``ended`` follows."""
        if self._connection is not None:
            self._connection.abort()

    def _end(self) -> None:
        self._connection = None
        self.channel = None
        self._lose(LOST)
        served = None if self._used_at is None else time.monotonic() - self._used_at
        self._ended(self._opened_now, served)

    # ----------------------------------------------------------------- connection events

    def _on_connection_open(self, connection: Any, node: Node) -> None:
        self._opened_now = True
        self.opened += 1
        if self._role is not None:
            log.info(f"{self._role} connected", node=node.label)
        if self._on_open is not None:
            self._on_open(connection)
        if self.stopping:
            _close(connection)
            return
        self._open_channel(connection)

    def _on_open_error(self, connection: Any, error: BaseException | str, node: Node) -> None:
        # pika's wrappers have empty messages: the innermost error says why.
        self.last_error = f"cannot connect: {describe_error(error)}"
        if self._role is not None:
            log.warning(
                f"{self._role} connect failed", node=node.label, error=describe_error(error)
            )
        self._end()

    def _on_connection_closed(self, connection: Any, reason: BaseException, node: Node) -> None:
        if not self._closed_by_us:
            self.last_error = f"connection lost: {describe_error(reason)}"
        if self._role is not None and not self.stopping:
            log.info(
                f"{self._role} connection closed",
                node=node.label,
                detail=f"{type(reason).__name__}: {reason}",
            )
        self._end()

    def _open_channel(self, connection: Any) -> None:
        if connection.is_open and not self.stopping:
            connection.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: Any) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: self._on_confirming(channel)
        )

    def _on_confirming(self, channel: Any) -> None:
        if self._used_at is None:
            self._used_at = time.monotonic()
            if self._confirm_bound is not None:
                self._watch(self._connection, self._confirm_bound)
        self.channel = channel
        self._on_ready()

    def _watch(self, connection: Any, bound: float) -> None:
        """Every quarter of ``bound``, while ``connection`` lives: close it when
        messages have waited ``bound`` with no confirm at all."""
        if connection is not self._connection or not connection.is_open:
            return  # its own timer dies with it; the next connection starts another
        if self.window and time.monotonic() - self._progress_at > bound:
            self.last_error = f"no confirm from the broker within {bound:g}s"
            self._closed_by_us = True
            if self._role is not None:
                log.warning(f"{self._role}: {self.last_error}; reconnecting")
            _close(connection)
            return
        connection.ioloop.call_later(bound / 4, partial(self._watch, connection, bound))

    def _on_channel_closed(self, _channel: Any, reason: Any) -> None:
        self.channel = None
        if not self._closed_by_us:  # closing the connection ourselves closes it too
            self.last_error = f"channel closed: {reason}"
        if self._on_refused is not None and isinstance(
            reason, pika.exceptions.ChannelClosedByBroker
        ):
            self._on_refused(reason)
        if self._reopen_channel:  # else handed back once the connection has closed
            self._lose(_closed_why(reason))
        connection = self._connection
        if connection is None or not connection.is_open or self.stopping:
            return
        if not self._reopen_channel:
            self._closed_by_us = True  # ``last_error`` keeps the channel's reason
            connection.close()
            return
        # The connection is fine: a new channel on it, what the old had in flight failed.
        delay = _REOPEN_CHANNEL.wait(self._channel_failures)
        self._channel_failures += 1
        connection.ioloop.call_later(delay, partial(self._open_channel, connection))

    def _on_return(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        # A return comes before the confirm of the same message.
        self.window.returned(*self._returned(method, properties, body))

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        self._channel_failures = 0
        self._progress_at = time.monotonic()
        acked = isinstance(method, Basic.Ack)
        self._on_confirmed(
            self.window.confirmed(method.delivery_tag, method.multiple, acked), acked
        )

    def _lose(self, reason: str) -> None:
        lost = self.window.lost()  # and delivery tags start again at 1 on the next channel
        if lost:
            self._on_lost(lost, reason)


def _closed_why(reason: Any) -> str:
    """What a publish lost with its channel is told: the broker's doing (a 404, a
    406), or this side's (pika's ``blocked_connection_timeout``, a lost socket)."""
    if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
        return f"channel closed by the broker: {reason}"
    if isinstance(reason, pika.exceptions.ConnectionBlockedTimeout):
        return "connection closed: blocked by the broker (a resource alarm) past blocked_timeout"
    return f"channel closed: {describe_error(reason)}"


def _close(connection: Any) -> None:
    try:
        connection.close()
    except pika.exceptions.ConnectionWrongStateError:
        connection.abort()  # still opening: drop it (already closing: nothing to do)
