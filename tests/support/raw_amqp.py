"""A raw-socket AMQP 0-9-1 publisher that sends content headers no client library would write.

For hostile-message tests: the broker forwards a message's properties as
the publisher wrote them, and some encodings that RabbitMQ accepts are ones
pika cannot decode (a timestamp past year 9999, tables nested deeper than
Python's recursion limit). Ordinary frames (handshake, channel, confirms,
``basic.publish``) are encoded and decoded with pika's own ``spec`` and
``frame`` modules; only the content header's property bytes are crafted
here, by the test. The product never writes protocol bytes itself.

``publish`` waits for the broker's confirm, so a test knows whether the
broker took the message (``"ack"``) or refused the publisher (the close
reason), not just that bytes left the socket.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from pika import frame, spec

_CHANNEL = 1
_FRAME_HEADER = struct.Struct(">BHI")
_FRAME_END = bytes([spec.FRAME_END])


# --------------------------------------------------------------------- hostile bytes


def short_string(text: bytes) -> bytes:
    return struct.pack("B", len(text)) + text


def table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A field table from (name, already encoded value) pairs: the values may be anything."""
    payload = b"".join(short_string(name) + value for name, value in entries)
    return struct.pack(">I", len(payload)) + payload


def long_string(value: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(value)) + value


def timestamp(seconds: int) -> bytes:
    """A 'T' field: RabbitMQ takes any unsigned 64-bit value, Python's datetime does not."""
    return b"T" + struct.pack(">Q", seconds)


def nested_tables(depth: int) -> bytes:
    """A 'F' field holding a table holding a table ... ``depth`` levels down."""
    value = b"V"  # void, innermost
    for _ in range(depth):
        value = b"F" + table([(b"n", value)])
    return value


def properties(
    headers: bytes | None = None,
    content_type: bytes | None = None,
    message_id: bytes | None = None,
    delivery_mode: int | None = 2,
) -> bytes:
    """Basic properties as wire bytes, with ``headers`` an already encoded table."""
    flags = 0
    fields = b""
    if content_type is not None:
        flags |= spec.BasicProperties.FLAG_CONTENT_TYPE
        fields += short_string(content_type)
    if headers is not None:
        flags |= spec.BasicProperties.FLAG_HEADERS
        fields += headers
    if delivery_mode is not None:
        flags |= spec.BasicProperties.FLAG_DELIVERY_MODE
        fields += struct.pack("B", delivery_mode)
    if message_id is not None:
        flags |= spec.BasicProperties.FLAG_MESSAGE_ID
        fields += short_string(message_id)
    return struct.pack(">H", flags) + fields


# --------------------------------------------------------------------- the connection


class RawPublisher:
    """One connection, one channel in confirm mode; ``publish`` returns the broker's answer."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5672,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        timeout: float = 10.0,
    ) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._buffer = b""
        self._frame_max = 131072
        self._sock.sendall(frame.ProtocolHeader().marshal())
        self._expect(spec.Connection.Start)
        response = b"\0" + user.encode() + b"\0" + password.encode()
        self._send(0, spec.Connection.StartOk({}, "PLAIN", response, "en_US"))
        tune = self._expect(spec.Connection.Tune)
        self._frame_max = tune.frame_max or self._frame_max
        self._send(0, spec.Connection.TuneOk(tune.channel_max, self._frame_max, 0))
        self._send(0, spec.Connection.Open(vhost))
        self._expect(spec.Connection.OpenOk)
        self._send(_CHANNEL, spec.Channel.Open())
        self._expect(spec.Channel.OpenOk)
        self._send(_CHANNEL, spec.Confirm.Select())
        self._expect(spec.Confirm.SelectOk)

    def close(self) -> None:
        try:
            self._send(0, spec.Connection.Close(200, "bye", 0, 0))
            self._expect(spec.Connection.CloseOk)
        except (OSError, AssertionError):
            pass  # the broker may have closed it already (a refused publish)
        finally:
            self._sock.close()

    def __enter__(self) -> RawPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def publish(self, routing_key: str, raw_properties: bytes, body: bytes) -> str:
        """Publish to the default exchange; ``"ack"``, ``"nack"`` or why the broker closed."""
        self._send(_CHANNEL, spec.Basic.Publish(exchange="", routing_key=routing_key))
        header = struct.pack(">HHQ", spec.Basic.INDEX, 0, len(body)) + raw_properties
        self._sock.sendall(
            _FRAME_HEADER.pack(spec.FRAME_HEADER, _CHANNEL, len(header)) + header + _FRAME_END
        )
        chunk = self._frame_max - 8
        for start in range(0, len(body), chunk):
            part = body[start : start + chunk]
            self._sock.sendall(
                _FRAME_HEADER.pack(spec.FRAME_BODY, _CHANNEL, len(part)) + part + _FRAME_END
            )
        return self._answer()

    # ----------------------------------------------------------------- frames

    def _send(self, channel: int, method: Any) -> None:
        self._sock.sendall(frame.Method(channel, method).marshal())

    def _answer(self) -> str:
        value = self._read_method()
        if isinstance(value, spec.Basic.Ack):
            return "ack"
        if isinstance(value, spec.Basic.Nack):
            return "nack"
        if isinstance(value, spec.Channel.Close | spec.Connection.Close):
            return f"{value.reply_code} {value.reply_text}"
        raise AssertionError(f"unexpected answer to a publish: {value!r}")

    def _expect(self, kind: type) -> Any:
        value = self._read_method()
        if not isinstance(value, kind):
            raise AssertionError(f"expected {kind.__name__}, got {value!r}")
        return value

    def _read_method(self) -> Any:
        deadline = time.monotonic() + (self._sock.gettimeout() or 10.0)
        while True:
            consumed, value = frame.decode_frame(self._buffer)
            if value is not None:
                self._buffer = self._buffer[consumed:]
                if isinstance(value, frame.Method):
                    return value.method
                continue  # a heartbeat or content of something we do not read
            if time.monotonic() > deadline:
                raise AssertionError("no answer from the broker")
            data = self._sock.recv(65536)
            if not data:
                raise AssertionError("the broker closed the socket")
            self._buffer += data
