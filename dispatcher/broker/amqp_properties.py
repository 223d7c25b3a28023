"""Message properties pika cannot decode arrive as a marker, not as a dead connection.

RabbitMQ forwards a content header as its publisher wrote it once its own
parser accepts it, and it accepts some that pika cannot decode: a timestamp
table field past year 9999 (pika's ``datetime.fromtimestamp`` raises
OverflowError or ValueError) and tables nested deeper than Python's
recursion limit (RecursionError), at any depth of the headers. pika decodes
the content header inside its socket read; the error escapes from there,
pika aborts the connection, the broker requeues the message at the head of
the queue, and the next connection meets it first again: one message stops
the queue for good.

``install`` swaps pika's class for content-header properties for a
subclass whose ``decode`` is pika's own, and which, when that raises, comes
back with every property unset plus ``decode_error`` (what pika raised) and
``encoded`` (the property bytes as received). pika then hands the message
over as usual, with its delivery tag and body, and the handler dead-letters
it with the reason. No AMQP is decoded here: what pika can read is read by
pika, and what it cannot is kept as bytes.

pika looks the class up in ``pika.spec.props`` for every content header it
decodes, on every connection of the process; a successful decode gives an
object equal to pika's own (same attributes, same ``encode``), so sharing it
with the publisher's connection or any other pika client changes nothing
for them.
"""

from __future__ import annotations

from typing import Any

from pika import spec

from dispatcher.event.cloudevent import Unreadable


class TolerantBasicProperties(spec.BasicProperties):  # type: ignore[misc]  # pika is untyped
    """pika's ``BasicProperties``, except that a decode failure is kept, not raised."""

    # Class defaults: a decoded instance's ``__dict__`` stays pika's own, so it
    # compares equal to (and prints like) a ``BasicProperties`` with the same values.
    decode_error: str | None = None
    encoded: bytes = b""

    def decode(self, encoded: bytes, offset: int = 0) -> TolerantBasicProperties:
        try:
            super().decode(encoded, offset)
        except Exception as error:
            # Whatever the bytes made pika raise (struct.error, OverflowError,
            # ValueError, RecursionError, ...): raised here it would abort the
            # connection. A half-decoded set would be read as the message's
            # real properties, so none is kept.
            self.__init__()  # type: ignore[misc]  # back to pika's "nothing set"
            self.decode_error = f"{type(error).__name__}: {error}"
            self.encoded = bytes(encoded[offset:])
        return self


def install() -> None:
    """Make pika decode every content header with ``TolerantBasicProperties`` (idempotent)."""
    spec.props[spec.BasicProperties.INDEX] = TolerantBasicProperties


def unreadable(properties: Any) -> Unreadable | None:
    """What pika could not decode in ``properties`` and its bytes, or None when it could."""
    error = decode_error(properties)
    return None if error is None else Unreadable(error, properties.encoded)


def decode_error(properties: Any) -> str | None:
    """Why pika could not decode ``properties``, or None when it could."""
    return getattr(properties, "decode_error", None)
