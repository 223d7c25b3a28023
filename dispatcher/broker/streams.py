"""Stream queues are refused: how a message from one is recognised.

A RabbitMQ stream (``x-queue-type: stream``) looks like any queue to a
passive declare, and accepts an AMQP 0-9-1 consumer, but it does not hold
messages the way the service and ``archive`` rely on: a consumer starts at
the next message published (what the stream already holds is never seen),
an ack only grants credit, and a nack or reject closes the whole connection
(``540 NOT_IMPLEMENTED``), every binding on it included. A requeued event
would be skipped for good when the consumer starts again at "next".

The broker marks every message it delivers from a stream with the
``x-stream-offset`` header (checked on RabbitMQ 3.10); there is no other way
to tell over AMQP 0-9-1. So the first such message stops consumption: the
service closes that binding's channel (a stream keeps its messages; nothing
is acked or lost) and ``archive`` exits 2.
"""

from __future__ import annotations

from typing import Any, Final

OFFSET_HEADER: Final = "x-stream-offset"


def from_a_stream(properties: Any) -> bool:
    """Whether the broker delivered this message from a stream queue."""
    headers = properties.headers
    return bool(headers) and isinstance(headers.get(OFFSET_HEADER), int)


# Why, and what to do instead: the service's log line and archive's error say it.
WHY: Final = (
    "this dispatcher consumes classic and quorum queues (a stream starts a consumer "
    "at its next message and refuses requeues); bind a classic or quorum queue to "
    "the same exchange instead"
)
