"""The broker side of the bench: queues it owns, pre-loading and steady publishing.

Pre-loading uses ``ConfirmedPublisher`` (pipelined confirms, about 13k msg/s
here) and checks that every event was confirmed. Steady publishing (run in a
process of its own, ``steady_publisher.py``) is a plain BlockingChannel on a
fixed schedule, each event stamped just before it is sent (``ce-benchpublished``).
Every queue the bench declares is remembered and deleted, on every exit path.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pika
import pika.exceptions

from dispatcher.pipeline.confirms import ConfirmedPublisher, Outgoing
from tests.bench import payload
from tests.bench.harness import BenchError

URL: Final = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
_DECLARED: set[str] = set()


def _channel() -> tuple[Any, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    return connection, connection.channel()


def broker_version() -> str:
    connection, _ = _channel()
    try:
        properties = connection._impl.server_properties
        version = properties.get("version", b"?")
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        connection.close()


def declare(queue: str) -> None:
    """A durable classic queue, as an operator would have declared it."""
    _DECLARED.add(queue)
    connection, channel = _channel()
    try:
        channel.queue_declare(queue, durable=True)
    finally:
        connection.close()


def declare_fanout(name: str) -> None:
    """A fanout exchange with a durable queue of the same name bound to it (W7's
    dead letters); ``delete(name)`` removes both."""
    _DECLARED.add(name)
    connection, channel = _channel()
    try:
        channel.exchange_declare(name, "fanout", durable=True)
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, name)
    finally:
        connection.close()


def counts(queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue."""
    connection, channel = _channel()
    try:
        method = channel.queue_declare(queue, passive=True).method
        return int(method.message_count), int(method.consumer_count)
    finally:
        connection.close()


def wait_for_consumers(queue: str, consumers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while counts(queue)[1] < consumers:
        if time.monotonic() > deadline:
            raise BenchError(f"{queue}: fewer than {consumers} consumers after {timeout:.0f} s")
        time.sleep(0.1)


def delete(queue: str) -> None:
    """The queue, and the exchange of the same name if ``declare_fanout`` made one."""
    with contextlib.suppress(pika.exceptions.AMQPError):
        connection, channel = _channel()
        try:
            channel.queue_delete(queue)
            channel.exchange_delete(queue)  # none of that name: a no-op (3.10 says ok)
        finally:
            connection.close()
    _DECLARED.discard(queue)


def delete_all() -> None:
    for queue in list(_DECLARED):
        delete(queue)


def _records(ids: list[str]) -> Iterator[Outgoing]:
    for event_id in ids:
        headers = payload.amqp_headers(event_id)
        yield Outgoing((payload.SOURCE, event_id), payload.BODY, headers, payload.CONTENT_TYPE)


def preload(queue: str, ids: list[str]) -> None:
    publisher = ConfirmedPublisher([pika.URLParameters(URL)], "", queue)
    result = publisher.publish(_records(ids))
    if result.published != len(ids) or result.resent:
        raise BenchError(
            f"{queue}: publishing {len(ids)} events confirmed {result.published}, "
            f"failed {result.failed}, resent {result.resent} ({dict(result.reasons)})"
        )


def publisher_alone(events: int, in_flight: int) -> float:
    """Confirms per second our own publisher (``ConfirmedPublisher``, the design the
    service's dead letters use) gets with ``in_flight`` publishes outstanding:
    persistent 1 KB events into a fresh durable queue, as W7's dead letters are."""
    queue = f"bench-alone-{uuid.uuid4().hex[:8]}"
    declare(queue)
    try:
        publisher = ConfirmedPublisher([pika.URLParameters(URL)], "", queue, window=in_flight)
        started = time.monotonic()
        result = publisher.publish(_records([f"alone-{n}" for n in range(events)]))
        elapsed = time.monotonic() - started
    finally:
        delete(queue)
    if result.published != events:
        raise BenchError(f"publisher alone: {result.published} of {events} confirmed")
    return events / elapsed


def publish_steady(queue: str, ids: list[str], rate: float) -> None:
    """At ``rate`` msg/s on a fixed schedule, each event stamped just before it is sent.

    Plain ``basic_publish`` on a BlockingChannel, no confirms: measured here,
    the pipelined-confirm publisher adds about 4 ms (p50) between the stamp
    and the broker's delivery at 1,000 msg/s, a plain publish 0.4 ms. Nothing
    is assumed delivered: the subscriber's log is checked against every id.
    """
    connection, channel = _channel()
    try:
        start = time.monotonic()
        for index, event_id in enumerate(ids):
            wait = start + index / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            headers = payload.amqp_headers(event_id, time.time())
            properties = pika.BasicProperties(
                headers=headers, content_type=payload.CONTENT_TYPE, delivery_mode=2
            )
            channel.basic_publish("", queue, payload.BODY, properties)
        channel.queue_declare(queue, passive=True)  # a round trip: every publish was read
    finally:
        connection.close()
