"""The service's publisher (dead letters, replies) against the shared broker.

The engine loop runs in the test thread; the publisher's own thread answers
it through the loop's inbox, as in the service.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.broker.publisher import Publisher
from dispatcher.config import BrokerSettings
from dispatcher.event.cloudevent import Event
from dispatcher.event.json_format import from_structured
from dispatcher.loop import Future, Loop
from tests.support import broker
from tests.support.loops import close_on_loop, run_until
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.broker

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def publishing() -> Iterator[tuple[Loop, Publisher]]:
    loop = Loop()
    publisher = Publisher(BrokerSettings(url=broker.URL), loop)
    publisher.start()
    yield loop, publisher
    close_on_loop(loop, publisher.close)


def event(number: int) -> Event:
    return Event(
        {"specversion": "1.0", "id": f"e-{number}", "source": "/tests", "type": "t"},
        b'{"n": %d}' % number,
    )


def answers(loop: Loop, futures: list[Future[str | None]]) -> list[str | None]:
    async def gather() -> list[str | None]:
        return [await future for future in futures]

    return loop.run_until_complete(gather())


def test_many_publishes_in_flight_each_answered_by_its_own_confirm(publishing):
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    try:
        futures = [publisher.publish_event(exchange, "", event(n), 10.0) for n in range(2000)]
        assert answers(loop, futures) == [None] * 2000
        assert broker.queue_depth(queue) == 2000
        assert publisher.connections_opened == 1  # long-lived: one connection for all
        got = broker.get_all(queue)
        assert [p.headers["ce-id"] for p, _body in got] == [f"e-{n}" for n in range(2000)]
        properties, body = got[7]
        assert (properties.delivery_mode, body) == (2, b'{"n": 7}')  # persistent, data as is
    finally:
        broker.delete([queue], [exchange])


def test_unroutable_fails_alone_and_its_neighbours_are_accepted(publishing):
    loop, publisher = publishing
    routed, queue = broker.declare_fanout_with_queue(prefix="pub")
    nowhere = broker.unique("pub-nowhere")
    with broker.channel() as ch:
        ch.exchange_declare(nowhere, "fanout")  # no queue bound: routes nowhere
    try:
        futures = [
            publisher.publish_event(routed, "", event(1), 10.0),
            publisher.publish_event(nowhere, "", event(2), 10.0),
            publisher.publish_event(routed, "", event(3), 10.0),
        ]
        first, unroutable, third = answers(loop, futures)
        assert (first, third) == (None, None)
        assert unroutable is not None and unroutable.startswith("unroutable")
        assert broker.queue_depth(queue) == 2
    finally:
        broker.delete([queue], [routed, nowhere])


def test_a_missing_exchange_fails_and_the_channel_comes_back(publishing):
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    try:
        [missing] = answers(
            loop, [publisher.publish_event(broker.unique("absent"), "", event(1), 10.0)]
        )
        assert missing is not None and "404" in missing
        [later] = answers(loop, [publisher.publish_event(exchange, "", event(2), 10.0)])
        assert later is None  # a new channel on the same connection
        assert publisher.connections_opened == 1
    finally:
        broker.delete([queue], [exchange])


def test_an_exchange_the_broker_refused_does_not_close_the_channel_for_the_others(publishing):
    """One binding's misspelt reply exchange, a few publishes a second, kept the one
    confirm channel closed most of the time (each 404 closes it, failing whatever
    was in flight for every binding): every other dead letter and reply failed. Now
    the refused exchange's publishes fail here for a while, never sent."""
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    absent = broker.unique("absent")
    try:
        [first] = answers(loop, [publisher.publish_event(absent, "", event(1), 10.0)])
        assert first is not None and "404" in first
        futures = []
        for n in range(20):
            futures.append(publisher.publish_event(absent, "", event(100 + n), 10.0))
            futures.append(publisher.publish_event(exchange, "", event(200 + n), 10.0))
        results = answers(loop, futures)
        assert results[1::2] == [None] * 20  # none lost with a closed channel
        for refused in results[0::2]:
            assert refused is not None and f"exchange {absent!r}" in refused
            assert "not tried again" in refused
        broker.wait_until(lambda: broker.queue_depth(queue) == 20, message="20 routed")
        assert publisher.connections_opened == 1
    finally:
        broker.delete([queue], [exchange])


def test_a_message_that_cannot_be_encoded_fails_alone(publishing):
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    try:
        too_long: dict[str, Any] = {"x" * 300: "header names are short strings in AMQP"}
        futures = [
            publisher.publish(exchange, "", b"", too_long, None, 10.0),
            publisher.publish_event(exchange, "", event(2), 10.0),
        ]
        bad, good = answers(loop, futures)
        assert bad is not None and bad.startswith("cannot be published")
        assert good is None
    finally:
        with contextlib.suppress(Exception):
            broker.delete([queue], [exchange])


def big_event(number: int, extensions: int) -> Event:
    """An event whose attributes take more than one AMQP frame (128 KiB) as headers:
    the bare booleans a Knative ingress may write become ``ce-`` strings."""
    attributes = {f"ext{n}": "false" for n in range(extensions)}
    return Event({**event(number).attributes, **attributes}, b'{"big": true}')


def test_properties_larger_than_a_frame_fail_alone_and_the_connection_stays(publishing):
    """The broker answers such a frame by closing the whole connection (501
    frame_too_large), failing everything in flight on it; pika sends it regardless."""
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    try:
        huge = {"ce-big": "x" * 140_000}
        futures = [
            publisher.publish_event(exchange, "", event(1), 10.0),
            publisher.publish(exchange, "", b"", huge, None, 10.0),
            publisher.publish_event(exchange, "", event(3), 10.0),
        ]
        first, too_large, third = answers(loop, futures)
        assert (first, third) == (None, None)
        assert too_large is not None and "more than one frame" in too_large
        assert "frame_max 131072" in too_large
        assert publisher.connections_opened == 1
        assert [p.headers["ce-id"] for p, _body in broker.get_all(queue)] == ["e-1", "e-3"]
    finally:
        broker.delete([queue], [exchange])


def test_an_event_too_large_for_headers_is_published_whole_in_structured_form(publishing):
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    big = big_event(1, 8_000)
    try:
        futures = [
            publisher.publish_event(exchange, "", big, 10.0, {"traceparent": TRACEPARENT}),
            publisher.publish_event(exchange, "", event(2), 10.0),
        ]
        assert answers(loop, futures) == [None, None]
        assert publisher.connections_opened == 1
        (structured, body), (binary, _) = broker.get_all(queue)
        assert structured.content_type == "application/cloudevents+json"
        assert structured.headers == {"traceparent": TRACEPARENT}
        assert structured.delivery_mode == 2
        again = from_structured(structured.content_type, body)
        assert again == big  # every attribute, and the data
        assert binary.headers["ce-id"] == "e-2"  # the rest stays in binary form
    finally:
        broker.delete([queue], [exchange])


def test_an_event_whose_header_name_is_no_short_string_goes_structured(publishing):
    loop, publisher = publishing
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    long_name = Event({**event(1).attributes, "x" * 300: "v"}, b"{}")
    try:
        assert answers(loop, [publisher.publish_event(exchange, "", long_name, 10.0)]) == [None]
        [(properties, body)] = broker.get_all(queue)
        assert properties.content_type == "application/cloudevents+json"
        assert from_structured(properties.content_type, body) == long_name
    finally:
        broker.delete([queue], [exchange])


def test_a_structured_publish_returned_fails_itself_not_another_in_flight(publishing):
    """Two structured publishes to one exchange and routing key, the first routed
    (its confirm waits for the disk), the second routed nowhere (returned at
    once): the return is the second's. Matched by a key without the event's
    identity, it was charged to the first, and the second, accepted, would have
    had its message acked with its dead letter nowhere."""
    loop, publisher = publishing
    exchange, queue = broker.unique("pub-hdr"), broker.unique("pub-hdrq")
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "headers")
        ch.queue_declare(queue)
        ch.queue_bind(queue, exchange, arguments={"x-match": "all", "traceparent": TRACEPARENT})
    other = TRACEPARENT.replace("b7ad", "c8be")
    try:
        for _round in range(5):
            futures = [
                publisher.publish_event(exchange, "k", big_event(1, 8_000), 10.0,
                                        {"traceparent": TRACEPARENT}),
                publisher.publish_event(exchange, "k", big_event(2, 8_000), 10.0,
                                        {"traceparent": other}),
            ]  # fmt: skip
            routed, nowhere = answers(loop, futures)
            assert routed is None
            assert nowhere is not None and nowhere.startswith("unroutable")
        assert [from_structured(p.content_type, b).id for p, b in broker.get_all(queue)] == [
            "e-1"
        ] * 5
    finally:
        broker.delete([queue], [exchange])


def test_a_connection_that_never_confirms_is_replaced_not_kept_forever():
    """A broker that stays up and confirms nothing (a quorum queue without a
    majority): the requests are answered at their timeout, and the connection
    holding them unconfirmed is closed after ``blocked_timeout``, so they do not
    pile up on it for ever."""
    proxy = FaultProxy(5672, drop_confirms=True)
    loop = Loop()
    publisher = Publisher(BrokerSettings(url=proxy.url, blocked_timeout=1.0), loop)
    exchange, queue = broker.declare_fanout_with_queue(prefix="pub")
    try:
        publisher.start()
        futures = [publisher.publish_event(exchange, "", event(n), 0.3) for n in range(50)]
        reasons = answers(loop, futures)
        assert reasons == ["no confirm from the broker within 0.3s"] * 50
        run_until(loop, lambda: publisher.connections_opened >= 2, 20, "a new publisher connection")
    finally:
        close_on_loop(loop, publisher.close)
        proxy.close()
        broker.delete([queue], [exchange])


def test_a_close_the_broker_never_answers_still_releases_the_socket_in_time():
    """Invariant 6 and no leak: closing over a black-holed network (no answer to
    Connection.Close, no FIN) returns within its bound, and the socket is aborted
    rather than left established, as it was when pika's own loop was released."""
    proxy = FaultProxy(5672)
    loop = Loop()
    publisher = Publisher(BrokerSettings(url=proxy.url), loop)
    try:
        loop.start()
        publisher.start()
        broker.wait_until(lambda: publisher.ready, message="the publisher's channel")
        assert _established_to(proxy.port) == 1
        proxy.blackhole()
        started = time.monotonic()
        publisher.close(timeout=2.0)
        assert time.monotonic() - started < 2.5
        broker.wait_until(lambda: _established_to(proxy.port) == 0, 5, "the socket released")
    finally:
        loop.stop(3.0)
        loop.close()
        proxy.close()


def _established_to(port: int) -> int:
    """This process's TCP connections to ``port`` still established (``/proc``)."""
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == "01":
            count += 1
    return count
