"""Publishing a stream of records on one long-lived connection with pipelined confirms.

What ``replay`` runs in each Spark partition, on the same connection, confirm
channel, window and return matching as the service's publisher
(``dispatcher.broker.confirm_link``), driven here in the partition's own
thread. One connection and one confirm channel for the whole partition (a
connection per message brings brokers down), and up to ``window`` publishes
in flight: a synchronous confirm per message (pika's
``BlockingChannel.confirm_delivery``) caps one connection at about 1,600
messages/s here, a round trip each.

Every record ends in exactly one of two counts: ``published`` (the broker
confirmed it and did not return it) or ``failed`` (nacked, returned as
unroutable, or given up on with the broker unreachable). When the connection
or channel is lost, the records still unconfirmed (and only those) are sent
again on the next connection, in their order, before anything new: confirmed
records are never sent twice. An unconfirmed record may still have reached a
queue before the loss, so a resent record can arrive twice; ``resent`` counts
them. Messages are ``mandatory``: a replay routed nowhere is a failure, not
a success. A channel the broker closes ends the connection (the exchange was
checked at the start: one that went away mid-run is retried like a lost node).

Given a cluster's nodes, connections go round them as the service's do
(``params.Rotation``): a node lost mid-partition leads straight to the next,
and the backoff applies when a whole round of nodes failed (one node: after
every failure). A connection that confirmed nothing counts as failed; the
partition's first connection starts a round as one that made progress does.
With no progress for ``give_up_after`` seconds, the rest fails.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import pika

from dispatcher.broker.confirm_link import ConfirmLink, message_id
from dispatcher.broker.params import Node, Rotation, node_label
from dispatcher.delivery.retry import Backoff

DEFAULT_WINDOW: Final = 1000
# What a source yields for "nothing yet": the loop takes its turn, then pulls again.
TURN: Final = None
_END: Final = object()
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
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        """``on_progress`` hears the published count after each confirm (replay's
        progress on a terminal)."""
        if not nodes:
            raise ValueError("a publisher needs at least one node")
        self._rotation = Rotation(
            [Node(node_label(p), p) for p in nodes],
            backoff or Backoff("exponential", 0.2, 5.0),
        )
        self._exchange = exchange
        self._routing_key = routing_key
        self._size = window
        self._interval = 1.0 / rate if rate else 0.0
        self._give_up_after = give_up_after
        self._clock = clock
        self._sleep = sleep
        self.result = PublishResult()
        self._source: Iterator[Outgoing | None] = iter(())
        self._exhausted = False
        self._resend: deque[Outgoing] = deque()
        self._link: ConfirmLink[Outgoing] = ConfirmLink(
            on_ready=self._pump,
            on_confirmed=self._on_confirmed,
            on_lost=self._requeue,
            returned=_returned,
            reopen_channel=False,
            # A live connection that confirms nothing must end for give-up to apply.
            confirm_bound=give_up_after,
        )
        self._next_slot = 0.0
        self._pump_scheduled = False
        self._source_error: Exception | None = None
        self._on_progress = on_progress

    # ----------------------------------------------------------------- the loop

    def publish(self, records: Iterable[Outgoing | None]) -> PublishResult:
        """Publish every record; returns when each is published or failed. The
        records are pulled on the connection's loop: a source with long work
        between two records yields None now and then (``TURN``) to let the loop
        answer heartbeats and take confirms meanwhile."""
        source = iter(records)
        # The first record before connecting: a Spark partition gives its first row
        # only once its sort has read every row (minutes, for a large archive), and
        # a connection opened meanwhile got no heartbeats, was closed by the broker
        # and counted as one that made no progress (past give_up_after: every
        # record of the partition failed).
        head = next((record for record in source if record is not TURN), None)
        self._source = iter(()) if head is None else itertools.chain((head,), source)
        self._next_slot = self._clock()
        progress_at = self._clock()
        first = True
        while not self._finished():
            confirmed_before = self.result.published + self.result.failed
            node = self._rotation.next()  # the node after the one used last
            self.result.connections += 1
            # A rate timer still pending died with the last connection's loop.
            self._pump_scheduled = False
            self._link.serve(node)
            progressed = self.result.published + self.result.failed > confirmed_before
            if progressed:
                progress_at = self._clock()
            if self._finished():
                break
            if self._clock() - progress_at > self._give_up_after:
                self._fail_the_rest(f"gave up: {self._link.last_error}")
                break
            # Progress (or the start) begins a round; a connection that confirmed
            # nothing, opened or not, is a failed try of the current one.
            fresh = progressed or first
            first = False
            delay = self._rotation.ended(opened=fresh, served=math.inf if fresh else None)
            if delay > 0:  # a whole round of nodes failed (or made no progress)
                self._sleep(delay)
        if self._source_error is not None:
            raise self._source_error
        return self.result

    def _finished(self) -> bool:
        return self._exhausted and not self._resend and not self._link.window

    def _fail_the_rest(self, reason: str) -> None:
        while self._resend:
            self.result.fail(self._resend.popleft(), reason)
        if not self._exhausted:
            for record in self._source:
                if record is not TURN:
                    self.result.fail(record, reason)
            self._exhausted = True

    def _requeue(self, lost: list[Outgoing], _reason: str) -> None:
        # The unconfirmed records, in their order, go before the rest on the next connection.
        self.result.resent += len(lost)
        self._resend.extendleft(reversed(lost))

    # ----------------------------------------------------------------- publishing

    def _pump(self) -> None:
        link = self._link
        if not link.ready:
            return
        window = link.window
        while len(window) < self._size:
            if self._interval:
                wait = self._next_slot - self._clock()
                if wait > 0:
                    self._schedule_pump(wait)
                    return
            record = self._next_record()
            if record is None:
                break
            if self._interval:  # taken by a record only: a TURN publishes nothing
                self._next_slot = max(self._next_slot, self._clock() - 1.0) + self._interval
            properties = pika.BasicProperties(
                headers=record.headers,
                content_type=record.content_type,
                delivery_mode=2,
                message_id=message_id(record.key[1]),
            )
            try:
                error = link.publish(
                    record, record.key, self._exchange, self._routing_key, record.body, properties
                )
            except Exception as e:
                # The channel or connection broke under us: the record goes again on
                # the next connection, after what was in flight before it. The
                # connection's close ends ``serve``; this one is dropped at once.
                self._requeue([record], "")
                link.last_error = f"{type(e).__name__}: {e}"
                link.abort()
                return
            if error is not None:  # this record alone cannot be encoded
                self.result.fail(record, error)
        if self._finished():
            link.close()

    def _schedule_pump(self, delay: float) -> None:
        # One timer at a time: confirms call _pump too, and each must not add one.
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._link.call_later(delay, self._on_pump_timer)

    def _on_pump_timer(self) -> None:
        self._pump_scheduled = False
        self._pump()

    def _next_record(self) -> Outgoing | None:
        if self._resend:
            return self._resend.popleft()
        if self._exhausted:
            return None
        try:
            record = next(self._source, _END)
        except Exception as e:
            # The input broke (a Spark read error): stop, and let publish() raise it
            # rather than count the unread rest as nothing.
            self._source_error = e
            self._exhausted = True
            return None
        if record is _END:
            self._exhausted = True
            return None
        if record is TURN:  # the loop's turn (heartbeats, confirms), then more
            self._schedule_pump(0)
            return None
        return cast(Outgoing, record)

    def _on_confirmed(self, settled: list[tuple[Outgoing, str | None]], _acked: bool) -> None:
        for record, error in settled:
            if error is None:
                self.result.published += 1
            else:
                self.result.fail(record, error)
        if self._on_progress is not None:
            self._on_progress(self.result.published)
        self._pump()


def _returned(method: Any, properties: Any, _body: bytes) -> tuple[tuple[str, str], str]:
    # Matched by the event's identity (unique within a replay, as duplicates are dropped).
    headers = properties.headers or {}
    key = (str(headers.get("ce-source")), str(headers.get("ce-id")))
    return key, f"unroutable: {method.reply_code} {method.reply_text}"
