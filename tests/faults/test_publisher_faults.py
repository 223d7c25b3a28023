"""The publisher's timeout is final (issue 11): a late confirm never turns "not accepted"
into "accepted", and a request whose time ran out is never published afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatcher.broker.publisher import Publisher
from dispatcher.config import BrokerSettings
from dispatcher.event.cloudevent import Event
from dispatcher.loop import Future, Loop
from tests.support.broker import channel, delete, queue_depth, unique, wait_until
from tests.support.loops import close_on_loop, run_until
from tests.support.node import RabbitNode

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]


def event(number: int) -> Event:
    attributes = {"specversion": "1.0", "id": f"late-{number}", "source": "/t", "type": "t"}
    return Event(attributes, b"{}")


def answer(loop: Loop, future: Future[str | None]) -> str | None:
    async def read() -> str | None:
        return await future

    return loop.run_until_complete(read())


@pytest.fixture
def durable_target(live_node: RabbitNode) -> Iterator[tuple[str, str]]:
    exchange, queue = unique("late-x"), unique("late-q")
    with channel(live_node.url) as ch:
        ch.exchange_declare(exchange, "fanout", durable=True)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange)
    yield exchange, queue
    delete([queue], [exchange], url=live_node.url)


@pytest.fixture
def publishing(live_node: RabbitNode) -> Iterator[tuple[Loop, Publisher]]:
    loop = Loop()
    publisher = Publisher(BrokerSettings(url=live_node.url, blocked_timeout=60.0), loop)
    publisher.start()
    yield loop, publisher
    close_on_loop(loop, publisher.close)


def test_a_confirm_after_the_timeout_changes_nothing(live_node, durable_target, publishing):
    loop, publisher = publishing
    exchange, queue = durable_target
    assert answer(loop, publisher.publish_event(exchange, "", event(0), 10.0)) is None
    live_node.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        # During an alarm the broker confirms one more publish and holds the rest:
        # both written before its Connection.Blocked (after it, nothing is written
        # until Unblocked: tests/faults/test_broker_faults.py).
        first = publisher.publish_event(exchange, "", event(1), 10.0)
        held = publisher.publish_event(exchange, "", event(2), 0.5)
        assert answer(loop, held) == "no confirm from the broker within 0.5s"
        answer(loop, first)
    finally:
        live_node.ctl("set_vm_memory_high_watermark", "0.4")
    # The alarm is over: the broker now takes the held message and confirms it...
    wait_until(lambda: queue_depth(queue, url=live_node.url) == 3, 30, "the held publish")
    ping = publisher.publish_event(exchange, "", event(3), 10.0)
    assert answer(loop, ping) is None  # (and its confirm came after the late one)
    # ... but the delivery that waited for it was told "no", and stays told.
    assert held.result() == "no confirm from the broker within 0.5s"


def test_a_request_that_expired_while_disconnected_is_never_published(
    live_node, durable_target, publishing
):
    loop, publisher = publishing
    exchange, queue = durable_target
    assert answer(loop, publisher.publish_event(exchange, "", event(0), 10.0)) is None
    opened = publisher.connections_opened
    live_node.stop_app()
    try:
        run_until(loop, lambda: not publisher.ready, 30, "the publisher to see the broker go")
        expired = publisher.publish_event(exchange, "", event(1), 0.3)
        assert answer(loop, expired) == "no confirm from the broker within 0.3s"
    finally:
        live_node.start_app()
    run_until(loop, lambda: publisher.connections_opened > opened, 30, "the publisher to reconnect")
    assert answer(loop, publisher.publish_event(exchange, "", event(2), 10.0)) is None
    ids = []
    with channel(live_node.url) as ch:
        while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
            ids.append(got[1].headers["ce-id"])
    assert ids == ["late-0", "late-2"]  # late-1 waited for nobody: never sent
