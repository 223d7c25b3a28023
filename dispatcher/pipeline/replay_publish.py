"""Replay's publishing partition: on an executor, a partition's events read whole,
in Python, with the service's validation, and published on one long-lived
connection with pipelined confirms (``confirms.ConfirmedPublisher``).

The first valid copy of each (source, id) is published, a later valid one is
a duplicate, an invalid one a reject (written to the partition's file under
``--out/rejects``); a copy whose time only Python reads is placed in the
window here. Partitions publish ordered by instant, at ``--rate`` /
partitions each, going round a cluster's nodes as the service's publisher
does.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from dispatcher.broker.params import nodes
from dispatcher.config import BrokerSettings
from dispatcher.errors import EventError
from dispatcher.event import amqp
from dispatcher.event.cloudevent import Event
from dispatcher.pipeline import progress, records
from dispatcher.pipeline.confirms import TURN, ConfirmedPublisher, Outgoing, PublishResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how fast the events go, and the window a deferred copy is placed in."""

    exchange: str
    routing_key: str = ""
    rate: float | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What one partition did: its publisher's result, and what its reading of the
    copies found besides the events it published."""

    published: PublishResult
    duplicates: int
    rejected: int
    filtered_out: int


def publish(
    chosen: DataFrame,
    partitions: int,
    broker: BrokerSettings,
    target: Target,
    progress_to: tuple[str, int] | None = None,
    rejects: Path | None = None,
) -> list[PartitionResult]:
    """Every partition of ``chosen`` published on an executor; each partition's result."""
    exchange, routing_key = target.exchange, target.routing_key
    rate = target.rate / partitions if target.rate else None

    def publish_partition(index: int, rows: Iterable[Any]) -> Iterator[PartitionResult]:
        # Runs on an executor: one connection at a time for the whole partition.
        candidates = [node.parameters for node in nodes(broker, f"replay-{index}")]
        sender = None if progress_to is None else progress.PublishedSender(progress_to, index)
        publisher = None
        copies = Copies(
            None if rejects is None else rejects / f"part-{index:05d}-replay.json",
            target.since,
            target.until,
        )
        limit = sys.getrecursionlimit()
        try:
            sys.setrecursionlimit(limit + _LOOP_FRAMES)
            publisher = ConfirmedPublisher(
                candidates, exchange, routing_key, rate=rate, on_progress=sender
            )
            result = publisher.publish(copies.outgoing(rows))
        except Exception as e:
            # Spark's worker sends a task's error to the JVM as UTF-8 and, failing to
            # encode one (a lone surrogate from a line's text), never reports the task
            # at all: the job waited for ever. Only ASCII leaves the partition.
            raise RuntimeError(
                f"replay partition {index}: {type(e).__name__}: {e!s:.2000}".encode(
                    "ascii", "backslashreplace"
                ).decode("ascii")
            ) from None
        finally:
            sys.setrecursionlimit(limit)
            copies.close()
            if sender is not None:  # the last count, and the socket released on every path
                sender.close(0 if publisher is None else publisher.result.published)
        yield PartitionResult(result, copies.duplicates, copies.rejected, copies.filtered_out)

    return chosen.rdd.mapPartitionsWithIndex(publish_partition).collect()


# About 10 ms of reading copies (20 us each) between two turns of the loop.
_SKIPS_PER_TURN: Final = 500
# Copies are read on the publisher's loop (pika's ioloop, the confirm link, the
# pump), dozens of frames deeper than the service or the archiver reads the same
# event, and Python's JSON decoder counts those frames against its nesting: data
# nested 970 deep, which both of them accept, was a "nested too deeply" reject
# here. The partition's worker runs nothing else meanwhile.
_LOOP_FRAMES: Final = 100


class Copies:
    """A partition's reading of its events' copies, in Python, with the service's
    validation: the first valid copy of each (source, id) is published, a valid
    later one is a duplicate and an invalid one a reject, written to ``rejects``
    (so a corrupt copy never stands in for a good one). A copy whose instant only
    Python can place (``deferred``) is placed here, in ``since``..``until``."""

    def __init__(
        self, rejects: Path | None, since: dt.datetime | None, until: dt.datetime | None
    ) -> None:
        self._path = rejects
        self._stream: IO[bytes] | None = None
        self._since = since
        self._until = until
        self.duplicates = 0
        self.rejected = 0
        self.filtered_out = 0

    def outgoing(self, rows: Iterable[Any]) -> Iterator[Outgoing | None]:
        """The events to publish; ``TURN`` after every ``_SKIPS_PER_TURN`` copies
        not published, so that a long run of them (rejects, duplicates, times
        outside the window) does not hold the publisher's loop past a heartbeat."""
        skipped = 0
        for row in rows:
            published = False
            for copy in row["copies"]:
                try:
                    event = records.from_line(copy["value"])
                except EventError as e:
                    self._reject(copy["file"], copy["value"], e.reason)
                else:
                    if copy["deferred"] and not self._in_window(event):
                        self.filtered_out += 1
                    elif published:
                        self.duplicates += 1
                    else:
                        published = True
                        yield _outgoing(event)
                        continue
                skipped += 1
                if skipped % _SKIPS_PER_TURN == 0:
                    yield TURN

    def _in_window(self, event: Event) -> bool:
        if self._since is None and self._until is None:
            return True
        when = records.instant(event)
        if when is None:
            return False
        return (self._since is None or when >= self._since) and (
            self._until is None or when < self._until
        )

    def _reject(self, file: str, line: str, reason: str) -> None:
        self.rejected += 1
        if self._path is None:
            return
        if self._stream is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = self._path.open("wb")
        document = {"file": file, "line": line, "reason": reason}  # as Spark writes the rest
        # Escaped to ASCII: a line or reason may hold a lone surrogate (a JSON
        # "\ud800" the service refuses), which no UTF-8 encoder takes.
        self._stream.write(json.dumps(document).encode("ascii") + b"\n")

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


def _outgoing(event: Event) -> Outgoing:
    replayed = records.for_replay(event)
    headers, content_type = amqp.to_amqp_headers(replayed)
    return Outgoing(
        key=(event.source, event.id),
        body=replayed.data or b"",
        headers=headers,
        content_type=content_type,
        archived=event.attributes.get(records.ARCHIVED),
    )


def as_event(record: Outgoing) -> Event:
    """A record the broker did not confirm, as the archive line ``OUT/failed`` keeps."""
    attributes = {name.removeprefix("ce-"): value for name, value in record.headers.items()}
    if record.content_type is not None:
        attributes["datacontenttype"] = record.content_type
    if record.archived is not None:  # so a retry places it in time as the original did
        attributes[records.ARCHIVED] = record.archived
    return Event(attributes, record.body)
