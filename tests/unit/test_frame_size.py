"""Whether a message's properties fit in one AMQP frame (``confirm_link.properties_size``)."""

from __future__ import annotations

import random

import pika
import pika.exceptions
import pytest
from pika import frame

from dispatcher.broker.confirm_link import fits_short_string, message_id, properties_size


def _exact(properties: pika.BasicProperties) -> int:
    """pika's own header frame for these properties, as it would send it."""
    return len(frame.Header(1, 10, properties).marshal())


@pytest.mark.parametrize("seed", range(40))
def test_the_size_is_pikas_frame_or_none_only_when_it_surely_fits(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "az09-_\u00e9\u65e5\U0001f600"
    headers = {
        f"ce-{n}-" + "".join(rng.choices(alphabet, k=rng.randrange(1, 30))): "".join(
            rng.choices(alphabet, k=rng.randrange(0, 1 + 2_000 * (seed % 5)))
        )
        for n in range(rng.randrange(1, 60))
    }
    properties = pika.BasicProperties(
        headers=headers, content_type="application/json", delivery_mode=2, message_id="m" * 200
    )
    exact = _exact(properties)
    for frame_max in (4096, 65_536, 131_072):
        size = properties_size(properties, frame_max)
        if size is None:
            assert exact <= frame_max
        else:
            assert size == exact


def test_headers_it_cannot_bound_are_measured() -> None:
    properties = pika.BasicProperties(headers={"nested": {"n": list(range(10))}, "b": True})
    assert properties_size(properties, 131_072) == _exact(properties)


@pytest.mark.parametrize(
    "event_id",
    ["e1", "x" * 255, "x" * 256, "\U0001f600" * 63, "\U0001f600" * 64, "é" * 127, "é" * 128],
)
def test_an_event_id_is_the_message_id_when_pika_can_encode_it(event_id):
    """Knative's publishers set ``message_id`` to the event id; AMQP's short string
    holds 255 octets, and an id beyond that must not cost the publish."""
    found = message_id(event_id)
    try:
        pika.BasicProperties(message_id=event_id).encode()
    except pika.exceptions.ShortStringTooLong:
        assert found is None
    else:
        assert found == event_id


def test_text_no_utf8_carries_is_no_short_string() -> None:
    # A lone surrogate past the 63-character short cut: refused, not raised.
    assert not fits_short_string("\ud800" * 64)
    assert message_id("\ud800" * 64) is None
