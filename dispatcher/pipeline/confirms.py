"""Publishing a stream of records on one long-lived connection with pipelined confirms.

What ``replay`` runs in each Spark partition. One connection and one confirm
channel for the whole partition (FIELD-NOTES failure 4: a connection per
message brings brokers down), and up to ``window`` publishes in flight: a
synchronous confirm per message (pika's ``BlockingChannel.confirm_delivery``)
caps one connection at about 1,600 messages/s here, a round trip each.

Every record ends in exactly one of two counts: ``published`` (the broker
confirmed it and did not return it) or ``failed`` (nacked, returned as
unroutable, or given up on with the broker unreachable). When the connection
or channel is lost, the records still unconfirmed (and only those) are sent
again on the next connection, in their order, before anything new: confirmed
records are never sent twice. An unconfirmed record may still have reached a
queue before the loss, so a resent record can arrive twice; ``resent`` counts
them. Messages are ``mandatory``: a replay routed nowhere is a failure, not
a success.

Given a cluster's nodes, each connection goes to the node after the one used
last: a node lost mid-partition leads straight to the next, and the backoff
applies when a whole round of nodes failed (one node: after every failure).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pika
import pika.exceptions
from pika.spec import Basic

from dispatcher.broker.confirm_window import ConfirmWindow
from dispatcher.broker.params import release
from dispatcher.retry import Backoff

DEFAULT_WINDOW: Final = 1000
# Failed records kept for the caller, per partition (the rest are only counted).
FAILED_RECORDS_KEPT: Final = 10_000


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish."""

    key: tuple[str, str]  # (source, id): how a returned message is matched to its record
    body: bytes
    headers: dict[str, str]
    content_type: str | None
    archived: str | None = None  # the archive's receipt time, kept for a failed record's line


@dataclass(slots=True)
class PublishResult:
    published: int = 0
    failed: int = 0
    resent: int = 0
    connections: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    failed_records: list[Outgoing] = field(default_factory=list)

    def fail(self, record: Outgoing, reason: str) -> None:
        self.failed += 1
        self.reasons[reason] += 1
        if len(self.failed_records) < FAILED_RECORDS_KEPT:
            self.failed_records.append(record)


class ConfirmedPublisher:
    def __init__(
        self,
        nodes: Sequence[pika.ConnectionParameters],
        exchange: str,
        routing_key: str,
        *,
        window: int = DEFAULT_WINDOW,
        rate: float | None = None,
        give_up_after: float = 60.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not nodes:
            raise ValueError("a publisher needs at least one node")
        self._nodes = tuple(nodes)
        self._exchange = exchange
        self._routing_key = routing_key
        self._size = window
        self._interval = 1.0 / rate if rate else 0.0
        self._give_up_after = give_up_after
        self._backoff = backoff or Backoff("exponential", 0.2, 5.0)
        self._clock = clock
        self._sleep = sleep
        self.result = PublishResult()
        self._source: Iterator[Outgoing] = iter(())
        self._exhausted = False
        self._resend: deque[Outgoing] = deque()
        self._window: ConfirmWindow[Outgoing] = ConfirmWindow()
        self._next_slot = 0.0
        self._pump_scheduled = False
        self._connection: Any = None
        self._channel: Any = None
        self._last_error = "no connection attempted"
        self._source_error: Exception | None = None

    # ----------------------------------------------------------------- the loop

    def publish(self, records: Iterable[Outgoing]) -> PublishResult:
        """Publish every record; returns when each is published or failed."""
        self._source = iter(records)
        self._next_slot = self._clock()
        failures = 0
        progress_at = self._clock()
        while not self._finished():
            confirmed_before = self.result.published + self.result.failed
            self._run_one_connection()
            if self.result.published + self.result.failed > confirmed_before:
                failures, progress_at = 0, self._clock()
            if self._finished():
                break
            if self._clock() - progress_at > self._give_up_after:
                self._fail_the_rest(f"gave up: {self._last_error}")
                break
            failures += 1
            rounds, tried = divmod(failures, len(self._nodes))
            if tried == 0:  # a whole round of nodes failed (or made no progress)
                self._sleep(self._backoff.wait(rounds - 1))
        if self._source_error is not None:
            raise self._source_error
        return self.result

    def _finished(self) -> bool:
        return self._exhausted and not self._resend and not self._window

    def _run_one_connection(self) -> None:
        node = self._nodes[self.result.connections % len(self._nodes)]  # in turn
        self.result.connections += 1
        connection = None
        try:
            connection = self._connection = pika.SelectConnection(
                node,
                on_open_callback=self._on_connection_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_connection_closed,
            )
            connection.ioloop.start()
        except Exception as e:  # pika raises from inside its loop on socket errors
            self._last_error = f"{type(e).__name__}: {e}"
            self._requeue_unconfirmed()
        finally:
            if connection is not None:
                release(connection)  # every attempt's socket and loop, not the GC's job
            self._connection, self._channel = None, None

    def _fail_the_rest(self, reason: str) -> None:
        self._requeue_unconfirmed()
        while self._resend:
            self.result.fail(self._resend.popleft(), reason)
        if not self._exhausted:
            for record in self._source:
                self.result.fail(record, reason)
            self._exhausted = True

    # ----------------------------------------------------------------- connection events

    def _on_connection_open(self, connection: Any) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: Any, error: BaseException | str) -> None:
        self._last_error = f"cannot connect: {error}"
        connection.ioloop.stop()

    def _on_connection_closed(self, connection: Any, reason: BaseException) -> None:
        if not self._finished():
            self._last_error = f"connection lost: {reason}"
        self._requeue_unconfirmed()
        connection.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirming)

    def _on_confirming(self, _frame: Any) -> None:
        self._pump()

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        # e.g. 404: the exchange was deleted. The connection goes too; the
        # loop reconnects (or gives up) and resends what was not confirmed.
        self._last_error = f"channel closed: {reason}"
        if self._connection is not None and self._connection.is_open:
            self._connection.close()

    def _requeue_unconfirmed(self) -> None:
        lost = self._window.lost()  # and delivery tags start again at 1 on the next channel
        self.result.resent += len(lost)
        self._resend.extendleft(reversed(lost))

    # ----------------------------------------------------------------- publishing

    def _pump(self) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            return
        while len(self._window) < self._size:
            if self._interval:
                wait = self._next_slot - self._clock()
                if wait > 0:
                    self._schedule_pump(wait)
                    return
                self._next_slot = max(self._next_slot, self._clock() - 1.0) + self._interval
            record = self._next_record()
            if record is None:
                break
            # Unconfirmed before it is sent: if sending raises, the record is
            # resent on the next connection rather than lost.
            tag = self._window.sent(record.key, record)
            try:
                channel.basic_publish(
                    self._exchange,
                    self._routing_key,
                    record.body,
                    pika.BasicProperties(
                        headers=record.headers, content_type=record.content_type, delivery_mode=2
                    ),
                    mandatory=True,
                )
            except (pika.exceptions.ShortStringTooLong, ValueError, TypeError) as e:
                # The record itself cannot be encoded (a header name or routing key
                # too long for AMQP): fail it alone; the connection is unharmed.
                self._window.unsend(tag)
                self.result.fail(record, f"cannot be published: {type(e).__name__}: {e}")
        if self._finished():
            self._connection.close()

    def _schedule_pump(self, delay: float) -> None:
        # One timer at a time: confirms call _pump too, and each must not add one.
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._connection.ioloop.call_later(delay, self._on_pump_timer)

    def _on_pump_timer(self) -> None:
        self._pump_scheduled = False
        self._pump()

    def _next_record(self) -> Outgoing | None:
        if self._resend:
            return self._resend.popleft()
        if self._exhausted:
            return None
        try:
            record = next(self._source, None)
        except Exception as e:
            # The input broke (a Spark read error): stop, and let publish() raise it
            # rather than count the unread rest as nothing.
            self._source_error = e
            self._exhausted = True
            return None
        if record is None:
            self._exhausted = True
        return record

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        # A return comes before the confirm of the same message; match it by
        # the event's identity (unique within a replay, as duplicates are dropped).
        headers = properties.headers or {}
        key = (str(headers.get("ce-source")), str(headers.get("ce-id")))
        self._window.returned(key, f"unroutable: {method.reply_code} {method.reply_text}")

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, Basic.Ack)
        for record, error in self._window.confirmed(method.delivery_tag, method.multiple, acked):
            if error is None:
                self.result.published += 1
            else:
                self.result.fail(record, error)
        self._pump()
