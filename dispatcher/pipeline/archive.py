"""``dispatcher archive``: drain a queue into date-partitioned JSON-lines files.

This module is the run against the broker; the files it writes (names, hidden
temporary files, fsync, all-or-nothing batches) are
``dispatcher/pipeline/archive_files.py``'s.

Why it is built this way:

- **Ack after the file is durable.** A message is acked only once
  ``archive_files.write_batch`` has returned the file that holds it: written,
  fsynced, renamed into place, its folder fsynced. A crash (or a full disk) at
  any earlier point leaves the message unacked and the broker redelivers it:
  an acked message is always in a file, the one thing an archive must never
  get wrong. The price is at-least-once: a crash between the rename and the
  acks archives those messages again on the next run (their CloudEvent ids
  are stable, and ``replay`` drops duplicate (source, id) pairs).
- **A batch is all or nothing.** If one of its files cannot be written, nothing
  is acked: closing the connection gives every message of the batch back to
  the broker.
- **Bounded wait.** A batch is written when it is full, when its oldest
  message has waited ``FLUSH_INTERVAL`` (so a trickle is still archived and
  acked within about a second), and when the run stops.
- **Individual acks.** One ``basic_ack`` per message, never ``multiple=True``:
  a multiple ack settles whatever else is unacked on the channel, including
  messages that are in no file yet.
- **Prefetch = batch size** (at most the ``--max-events`` still wanted), so the
  broker never hands out more than one file's worth, and messages that were
  prefetched but not archived are simply given back (rejected with requeue when
  the consumer is cancelled, requeued by the broker when the connection closes).
- **One thread, plain pika ``BlockingConnection``.** A batch command has nothing
  else to do while it writes. The consume generator's inactivity timeout lets
  the loop notice a stop request (the first SIGTERM/SIGINT: ``dispatcher.signals``),
  idle time and the flush deadline.
- **A cluster's nodes.** With several URLs in ``broker.url`` it connects to the
  first node that answers, in the order given, and logs which (``host:port``).
  A connection lost while draining ends the run (exit 1) as with one node;
  nothing unacked is lost, and the next run starts again from the first node.
- **Every message is archived, nothing is dropped.** A message becomes an event
  exactly as the service reads it; a non-CloudEvent is wrapped like the service
  wraps it, a malformed one is wrapped too and says why in ``dispatchererror``.

pika's exceptions are translated into ``BatchFailed`` here, at the boundary.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pika
import pika.exceptions

from dispatcher.broker import amqp_properties, streams
from dispatcher.broker.params import (
    connect_blocking,
    describe_error,
    nodes,
    redacted_urls,
    virtual_host,
)
from dispatcher.config import BrokerSettings
from dispatcher.delivery.deadletter import with_reason
from dispatcher.errors import BatchFailed, BatchInputError, DispatcherError
from dispatcher.event import amqp
from dispatcher.event.cloudevent import AmqpMessage, Event, Unreadable
from dispatcher.observe import logs
from dispatcher.pipeline import records
from dispatcher.pipeline.archive_files import os_reason, prepare_out, write_batch
from dispatcher.pipeline.progress import Progress

# A partial batch is written once its oldest message has waited this long.
FLUSH_INTERVAL: Final = 1.0
# How often the consume loop wakes up when no message arrives.
_POLL: Final = 0.2
_MAX_PREFETCH: Final = 65535  # prefetch-count is a 16-bit field in AMQP 0-9-1

log = logs.get_logger()


@dataclass(frozen=True, slots=True)
class ArchiveResult:
    archived: int  # events written into files (and acked, unless the run failed)
    files: int
    stopped: str  # "max-events", "idle", "stop" (signal or stop event) or "failed"


# --------------------------------------------------------------------- message -> line


def read_event(
    message: AmqpMessage, vhost: str, queue: str, unreadable: Unreadable | None = None
) -> Event:
    """The event as the service reads it; bad input is wrapped with the reason, never
    raised. ``unreadable``: pika could not decode the properties (``amqp_properties``):
    the body is wrapped as the service dead-letters such a message."""
    if unreadable is not None:
        return with_reason(*amqp.wrap_unreadable(message, vhost, queue, unreadable))
    try:
        event, problem = amqp.read(message, vhost, queue)
    except Exception as e:  # a mapping bug must not stop the drain or drop the message
        log.exception("internal error while reading a message")
        event, problem = (
            amqp.wrap(message, vhost, queue),
            f"internal error: {type(e).__name__}: {e}",
        )
    return event if problem is None else with_reason(event, problem)


def to_record(
    message: AmqpMessage,
    vhost: str,
    queue: str,
    archived_at: dt.datetime,
    unreadable: Unreadable | None = None,
) -> tuple[str, bytes]:
    """(date folder, archive line without newline) for one message."""
    event = read_event(message, vhost, queue, unreadable)
    try:
        line = records.to_line(event, archived_at)
    except Exception as e:  # same: archive the raw message rather than stop
        log.exception("internal error while formatting an event")
        event = with_reason(
            amqp.wrap(message, vhost, queue), f"internal error: {type(e).__name__}: {e}"
        )
        line = records.to_line(event, archived_at)
    return records.partition_date(event, archived_at), line


# --------------------------------------------------------------------- broker


@dataclass(slots=True)
class _Batch:
    started: float | None = None  # clock() when its first message arrived
    tags: list[int] = field(default_factory=list)
    lines: dict[str, list[bytes]] = field(default_factory=dict)

    def add(self, tag: int, date: str, line: bytes, at: float) -> None:
        if self.started is None:
            self.started = at
        self.tags.append(tag)
        self.lines.setdefault(date, []).append(line)

    def __len__(self) -> int:
        return len(self.tags)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def archive(
    queue: str,
    out: str | Path,
    broker: BrokerSettings,
    *,
    max_events: int | None = None,
    idle_exit: float | None = None,
    batch_size: int = 1000,
    stop: threading.Event | None = None,
    flush_interval: float = FLUSH_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], dt.datetime] = _utc_now,
    progress: Callable[[int], None] | None = None,
) -> ArchiveResult:
    """Drain ``queue`` into ``out`` until a stop condition; ``BatchFailed`` if it cannot.

    Stops after ``max_events`` archived, after ``idle_exit`` seconds without a
    message, or when ``stop`` is set; the batch in hand is written first.
    ``progress`` hears the archived count after each batch.
    """
    if not queue:
        raise BatchInputError("--queue: must not be empty")
    if batch_size < 1 or (max_events is not None and max_events < 1):
        raise ValueError("batch_size and max_events must be >= 1")
    limits = _Limits(max_events, idle_exit, batch_size, flush_interval)
    run = _Run(queue, Path(out), broker, limits, stop or threading.Event(), clock, now, progress)
    return run.run()


@dataclass(frozen=True, slots=True)
class _Limits:
    max_events: int | None
    idle_exit: float | None
    batch_size: int
    flush_interval: float


class _Run:
    def __init__(
        self,
        queue: str,
        out: Path,
        broker: BrokerSettings,
        limits: _Limits,
        stop: threading.Event,
        clock: Callable[[], float],
        now: Callable[[], dt.datetime],
        progress: Callable[[int], None] | None,
    ) -> None:
        self.queue = queue
        self.out = out
        self.broker = broker
        self.max_events = limits.max_events
        self.idle_exit = limits.idle_exit
        self.batch_size = limits.batch_size
        self.flush_interval = limits.flush_interval
        self.vhost = virtual_host(broker)
        self.stop = stop
        self.clock = clock
        self.now = now
        self.archived = 0
        self.files = 0
        self.progress = progress

    def run(self) -> ArchiveResult:
        prepare_out(self.out)
        log.info(
            "archive started",
            queue=self.queue,
            out=str(self.out),
            broker=redacted_urls(self.broker),
            batch_size=self.batch_size,
            max_events=self.max_events,
            idle_exit=self.idle_exit,
        )
        connection = self._connect()
        try:
            stopped = self._drain(connection)
        except BatchFailed as e:
            log.error("archive failed", error=e.message, archived=self.archived, files=self.files)
            if self.archived:  # what did get archived before the failure
                e.summary = summary(
                    ArchiveResult(self.archived, self.files, "failed"), self.out, self.queue
                )
            raise
        finally:
            _close(connection)  # whatever is still unacked goes back to the queue
        log.info("archive stopped", reason=stopped, archived=self.archived, files=self.files)
        return ArchiveResult(self.archived, self.files, stopped)

    def _connect(self) -> Any:
        where = redacted_urls(self.broker)
        try:
            candidates = nodes(self.broker, "archive")
        except OSError as e:  # TLS files that cannot be read or used
            raise BatchInputError(f"broker.tls: {os_reason(e)}") from e
        try:
            connection, node = connect_blocking(candidates)
        except pika.exceptions.AMQPError as e:
            raise BatchFailed(f"cannot connect to the broker at {where}: {_describe(e)}") from e
        log.info("archive connected", node=node.label)
        return connection

    def _drain(self, connection: Any) -> str:
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch())
            stopped = self._consume(channel)
            channel.cancel()  # rejects (requeues) what was prefetched but not taken
        except pika.exceptions.AMQPError as e:
            raise self._broker_error(e) from e
        return stopped

    def _prefetch(self) -> int:
        return min(self.batch_size, self.max_events or self.batch_size, _MAX_PREFETCH)

    def _consume(self, channel: Any) -> str:
        batch = _Batch()
        last_message = self.clock()
        for method, properties, body in channel.consume(self.queue, inactivity_timeout=_POLL):
            if method is not None:
                if streams.from_a_stream(properties):
                    raise BatchInputError(f"queue {self.queue!r} is a stream: {streams.WHY}")
                last_message = self.clock()
                if not self.stop.is_set():  # once stopping, leave it to the broker
                    batch.add(method.delivery_tag, *self._record(properties, body), last_message)
            stopped = self._stop_reason(len(batch), last_message)
            if stopped == "stop":
                log.info("stop requested: writing the batch in hand", pending=len(batch))
            if batch and (stopped or self._batch_due(batch)):
                self._flush(channel, batch)
                batch = _Batch()
            if stopped:
                return stopped
        # The generator ends only when the broker cancels the consumer.
        self._flush(channel, batch)
        raise BatchFailed(
            f"the broker cancelled the consumer of queue {self.queue!r} (queue deleted?) "
            f"after {self.archived} events were archived"
        )

    def _record(self, properties: Any, body: bytes) -> tuple[str, bytes]:
        message = amqp.amqp_message(body, properties)
        return to_record(
            message, self.vhost, self.queue, self.now(), amqp_properties.unreadable(properties)
        )

    def _stop_reason(self, in_batch: int, last_message: float) -> str | None:
        if self.stop.is_set():
            return "stop"
        if self.max_events is not None and self.archived + in_batch >= self.max_events:
            return "max-events"
        if self.idle_exit is not None and self.clock() - last_message >= self.idle_exit:
            return "idle"
        return None

    def _batch_due(self, batch: _Batch) -> bool:
        if len(batch) >= self.batch_size:
            return True
        assert batch.started is not None
        return self.clock() - batch.started >= self.flush_interval

    def _flush(self, channel: Any, batch: _Batch) -> None:
        if not batch:
            return
        written = write_batch(self.out, batch.lines, self.now())
        self.files += len(written)
        self.archived += len(batch)
        log.debug("batch archived", events=len(batch), files=[str(p) for p in written])
        # Only now is every message of the batch durable: settle each on its own.
        for tag in batch.tags:
            channel.basic_ack(delivery_tag=tag)
        if self.progress is not None:
            self.progress(self.archived)

    def _broker_error(self, error: pika.exceptions.AMQPError) -> DispatcherError:
        code = getattr(error, "reply_code", None)
        if isinstance(error, pika.exceptions.ChannelClosedByBroker) and code == 404:
            return BatchInputError(
                f"queue {self.queue!r} not found in vhost {self.vhost!r}: "
                "archive drains an existing queue and never declares one"
            )
        what = (
            "the broker closed the channel"
            if isinstance(error, pika.exceptions.AMQPChannelError)
            else "lost the connection to the broker"
        )
        return BatchFailed(
            f"{what} while draining queue {self.queue!r}: {_describe(error)}; "
            f"{self.archived} events were archived, every message not acked stays in the "
            "queue (some may be archived again)"
        )


def _describe(error: BaseException) -> str:
    code = getattr(error, "reply_code", None)
    text = getattr(error, "reply_text", None)
    if code is not None and text:
        return f"{text} ({code})"
    return describe_error(error)


def _close(connection: Any) -> None:
    with contextlib.suppress(Exception):  # a dead connection is closed enough
        if connection.is_open:
            connection.close()


# --------------------------------------------------------------------- command


def command(args: argparse.Namespace, broker: BrokerSettings, stop: threading.Event) -> str:
    """``dispatcher archive`` inside the commands' frame (``dispatcher.cli``): the summary."""
    shown = Progress()
    try:
        result = archive(
            args.queue,
            args.out,
            broker,
            max_events=args.max_events,
            idle_exit=args.idle_exit,
            batch_size=args.batch_size,
            stop=stop,
            progress=lambda archived: shown.show(archived, "events", "archived"),
        )
    finally:
        shown.close()
    return summary(result, args.out, args.queue)


def summary(result: ArchiveResult, out: Path | str, queue: str) -> str:
    """The one stdout line of a run, finished or not."""
    events_word = "event" if result.archived == 1 else "events"
    files_word = "file" if result.files == 1 else "files"
    return (
        f"archived {result.archived} {events_word} into {result.files} {files_word} "
        f"under {out} (queue {queue})"
    )
