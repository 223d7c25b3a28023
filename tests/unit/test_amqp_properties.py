"""pika's own decoding, with a decode failure kept on the properties instead of raised.

The shapes are the ones RabbitMQ 3.10 forwards and pika 1.4 cannot decode
(tests/integration/test_hostile_frames.py publishes them through the broker).
"""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from pika import frame, spec
from pika.exceptions import InvalidFieldTypeException

from dispatcher.broker import amqp_properties
from dispatcher.broker.amqp_properties import TolerantBasicProperties
from tests.support.raw_amqp import nested_tables, properties, table, timestamp

HOSTILE = {
    "timestamp-past-time_t": (table([(b"t", timestamp(2**63))]), "OverflowError"),
    "timestamp-in-year-10000": (table([(b"t", timestamp(253402300800))]), "ValueError"),
    "tables-nested-1000-deep": (table([(b"n", nested_tables(1000))]), "RecursionError"),
    # RabbitMQ refuses this one (541), but a decode error of pika's own kind is kept too.
    "unknown-field-type": (table([(b"z", b"Z")]), "InvalidFieldTypeException"),
}


def full_properties() -> spec.BasicProperties:
    return spec.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "s": "text",
            "b": b"\xff bytes",
            "i": 7,
            "l": 2**40,
            "t": True,
            "d": decimal.Decimal("1.25"),
            "ts": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            "f": {"nested": ["a", 1, None]},
            "v": None,
        },
        delivery_mode=2,
        priority=3,
        correlation_id="c",
        reply_to="r",
        expiration="1000",
        message_id="m",
        timestamp=1_700_000_000,
        type="t",
        user_id="guest",
        app_id="a",
        cluster_id="x",
    )


def test_what_pika_decodes_is_decoded_exactly_as_pika_does() -> None:
    encoded = b"".join(full_properties().encode())
    ours = TolerantBasicProperties().decode(encoded)
    pikas = spec.BasicProperties().decode(encoded)
    assert ours == pikas
    assert pikas == ours
    assert ours.decode_error is None
    assert b"".join(ours.encode()) == encoded
    assert repr(ours) == repr(pikas)


@pytest.mark.parametrize(("headers", "error"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_decode_failure_is_kept_with_the_bytes_and_no_property_set(
    headers: bytes, error: str
) -> None:
    encoded = properties(headers=headers, content_type=b"text/plain", message_id=b"m-1")
    with pytest.raises((OverflowError, ValueError, RecursionError, InvalidFieldTypeException)):
        spec.BasicProperties().decode(encoded)  # what used to abort the connection
    decoded = TolerantBasicProperties().decode(encoded)
    assert decoded.decode_error is not None
    assert error in decoded.decode_error
    assert decoded.encoded == encoded
    # Half-decoded values (content_type comes before the headers) are not kept.
    assert decoded.content_type is None
    assert decoded.headers is None
    assert decoded.message_id is None
    assert amqp_properties.decode_error(decoded) == decoded.decode_error


def test_installed_pika_hands_a_hostile_content_header_over_as_a_frame() -> None:
    """The boundary that mattered: ``decode_frame`` raised from pika's socket read."""
    raw = properties(headers=HOSTILE["timestamp-past-time_t"][0])
    payload = struct.pack(">HHQ", spec.Basic.INDEX, 0, 7) + raw
    data = struct.pack(">BHI", spec.FRAME_HEADER, 1, len(payload)) + payload + b"\xce"
    amqp_properties.install()
    consumed, header = frame.decode_frame(data)
    assert consumed == len(data)
    assert isinstance(header, frame.Header)
    assert header.body_size == 7
    assert amqp_properties.decode_error(header.properties) is not None


def test_properties_pika_decoded_have_no_decode_error() -> None:
    assert amqp_properties.decode_error(spec.BasicProperties()) is None
