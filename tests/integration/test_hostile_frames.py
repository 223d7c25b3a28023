"""Issue 12: a message whose properties pika cannot decode does not stop consumption.

RabbitMQ 3.10 checks a published content header with its own table parser
and forwards what that parser accepts, byte for byte. Some of it pika 1.4
cannot decode: a timestamp field (``T``) beyond what Python's ``datetime``
holds raises OverflowError or ValueError, and tables nested deeper than
Python's recursion limit raise RecursionError. pika decodes the content
header inside its socket read, so the error aborts the whole connection; the
broker requeues the message at the head of the queue, the service reconnects
and meets it again, forever, and nothing behind it is ever delivered.

Each test publishes such a message with a raw-socket publisher (the broker's
confirm shows it took it), then ordinary events behind it, and holds the
service to: every good event delivered exactly once, the hostile one ended as
a dead letter with the reason (or rejected into the queue's own dead-letter
exchange), at most one reconnect.

Which shapes the broker refuses (``541 INTERNAL_ERROR`` on the publisher's
connection, so no consumer ever sees them): unknown field types, ``U``,
NaN or infinite floats and doubles, a string or table longer than its frame,
trailing bytes after the properties, a continuation bit in the flags or an
unassigned flag bit. Those need no test here: they never arrive.
"""

from __future__ import annotations

import struct
from typing import Any
from urllib.parse import unquote

import pytest
from pika import spec

from dispatcher.broker import amqp_properties
from dispatcher.observe.metrics import RECONNECT_REASONS
from tests.support import broker
from tests.support.broker import publish_events, queue_depth, wait_until
from tests.support.raw_amqp import (
    RawPublisher,
    long_string,
    nested_tables,
    properties,
    table,
    timestamp,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

GOOD = 5

# Each one the broker acks (publish_hostile checks) and pika fails to decode
# (test_pika_itself_cannot_decode_them).
HOSTILE_HEADERS = {
    # OverflowError: timestamp out of range for platform time_t
    "timestamp-past-time_t": table(
        [(b"ce-specversion", long_string(b"1.0")), (b"ce-time", timestamp(2**63))]
    ),
    # ValueError: year 10000 is out of range
    "timestamp-in-year-10000": table([(b"t", timestamp(253402300800))]),
    # the same OverflowError from inside an array inside a nested table
    "timestamp-in-an-array-in-a-table": table(
        [(b"x", b"F" + table([(b"a", b"A" + struct.pack(">I", 9) + timestamp(2**64 - 1))]))]
    ),
    # RecursionError: pika decodes nested tables recursively
    "tables-nested-1000-deep": table([(b"n", nested_tables(1000))]),
}


def reconnects(svc: Any) -> float:
    return sum(svc.value("dispatcher_reconnects_total", reason=r) for r in RECONNECT_REASONS)


def publish_hostile(queue: str, headers: bytes, body: bytes) -> None:
    with RawPublisher() as raw:
        answer = raw.publish(queue, properties(headers=headers), body)
    assert answer == "ack", f"the broker refused the hostile message: {answer}"


def stop(svc: Any) -> None:
    """Stop the service: what it left unacked goes back to the queue, where a test sees it."""
    svc.service.request_stop()
    svc.service.shutdown()


@pytest.mark.parametrize("name", sorted(HOSTILE_HEADERS))
def test_pika_itself_cannot_decode_them(name: str) -> None:
    """Without this, a shape pika learned to decode would make the tests below
    pass without ever meeting an undecodable message."""
    encoded = properties(headers=HOSTILE_HEADERS[name])
    with pytest.raises((OverflowError, ValueError, RecursionError)):
        spec.BasicProperties().decode(encoded)


@pytest.mark.parametrize("headers", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_undecodable_properties_are_dead_lettered_and_the_queue_moves_on(
    make_subscriber, run_service, headers: bytes
):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url})
    publish_hostile(svc.queue, headers, b"hostile")
    good = [f"good-{i}" for i in range(GOOD)]
    publish_events(svc.queue, good)

    sub.wait_for(GOOD, timeout=20)
    [letter] = sink.wait_for(1, timeout=20)
    svc.wait_events("delivered", GOOD)
    svc.wait_events("dead_lettered", 1)
    assert reconnects(svc) <= 1
    stop(svc)

    # Exactly once each, and the hostile message never reached the subscriber.
    assert sorted(sub.ids()) == good
    assert letter.body == b"hostile"
    reason = unquote(letter.headers["ce-dispatchererror"])
    assert reason.startswith("unreadable AMQP properties:"), reason
    assert letter.headers["ce-knativeerrorcode"] == "-1"
    assert len(sink.requests) == 1
    # Everything was settled: a message left unacked would be back in the queue now.
    assert queue_depth(svc.queue) == 0
    assert svc.events("requeued") == 0


def test_without_a_dead_letter_target_it_is_rejected_into_the_queues_own_dlx(
    make_subscriber, run_service
):
    """The broker's dead-letter exchange then keeps the message, hostile header and all."""
    sub = make_subscriber()
    exchange, dlq = broker.declare_fanout_with_queue(prefix="hostile-dlx")
    svc = run_service(
        sub.url,
        declare={"dead_letter_exchange": exchange},
        extra_queues=[dlq],
        extra_exchanges=[exchange],
    )
    publish_hostile(svc.queue, HOSTILE_HEADERS["timestamp-past-time_t"], b"hostile")
    good = [f"good-{i}" for i in range(GOOD)]
    publish_events(svc.queue, good)

    sub.wait_for(GOOD, timeout=20)
    svc.wait_events("delivered", GOOD)
    svc.wait_events("rejected", 1)
    [(props, body)] = wait_until(lambda: broker.get_all(dlq), message="the broker's dead letter")
    assert reconnects(svc) <= 1
    stop(svc)

    assert sorted(sub.ids()) == good
    assert queue_depth(svc.queue) == 0
    assert body == b"hostile"
    # Read here by this process's pika, which the service taught to keep a decode
    # failure: the header that broke it is still in the dead letter.
    assert amqp_properties.decode_error(props) is not None
