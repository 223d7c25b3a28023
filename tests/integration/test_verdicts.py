"""A verdict stands across a redelivery: once the subscriber's answers decided an
event's fate (dead-letter it, or forward its reply and ack), a redelivery of the
message carries that fate out again instead of sending the subscriber a second
request (issue 45).

The faults are made with a proxy between the service and the shared broker
(which is never touched): it lets the dead letter or reply reach the broker,
keeps the broker's confirm from the service, and then resets both of the
service's connections, as a broker stopping does. The broker has the message
back and redelivers it to the service once it reconnects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.proxy import FaultProxy
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker

REPLY = {"ce-specversion": "1.0", "ce-id": "r-1", "ce-source": "/r", "ce-type": "t"}


@pytest.fixture
def confirms_lost() -> Iterator[FaultProxy]:
    proxy = FaultProxy(5672, drop_confirms=True)
    yield proxy
    proxy.close()


def settled(svc) -> float:
    """Events delivered or dead-lettered: the redelivery's end, whichever way it went."""
    return svc.events("delivered") + svc.events("dead_lettered")


def through_a_lost_confirm(
    run_service: Any, proxy: FaultProxy, sub: Any, event_id: str, publishes: str, retry: int
) -> tuple[Any, list[tuple[Any, bytes]]]:
    """A service publishing ``event_id``'s dead letter or reply (``publishes``: the
    binding's ``dead_letter`` or ``reply``) to a fresh exchange: once that publish
    is in its queue, its confirm held back, both connections are cut. When the
    redelivery has ended: the subscriber was asked once, the message is acked,
    and what the exchange's queue holds is returned."""
    exchange, queue = broker.declare_fanout_with_queue()
    svc = run_service(
        sub.url,
        url=proxy.url,
        delivery={"retry": retry, "timeout": "5s"},
        extra_queues=[queue],
        extra_exchanges=[exchange],
        **{publishes: {"exchange": exchange}},
    )
    publish(svc.queue, headers=event_headers(event_id))
    wait_until(lambda: queue_depth(queue) >= 1, message=f"the publish in {queue}")
    proxy.pass_confirms()
    proxy.reset_all()
    wait_until(lambda: settled(svc) >= 1, 20, "the redelivery to end")
    assert sub.ids() == [event_id]  # one request: the redelivery carried the verdict out
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    return svc, broker.get_all(queue)


def test_a_dead_letter_whose_confirm_was_lost_is_published_again_not_sent_again(
    make_subscriber, run_service, confirms_lost
):
    sub = make_subscriber(lambda _r, i: Reply(400) if i == 0 else Reply(200))
    svc, letters = through_a_lost_confirm(
        run_service, confirms_lost, sub, "lost-dl", "dead_letter", retry=0
    )
    assert (svc.events("dead_lettered"), svc.events("delivered")) == (1, 0)
    assert [props.headers["ce-id"] for props, _ in letters] == ["lost-dl", "lost-dl"]
    # Both copies carry the subscriber's one answer.
    assert {props.headers["ce-knativeerrorcode"] for props, _ in letters} == {"400"}


def test_a_reply_whose_confirm_was_lost_is_published_again_not_sent_again(
    make_subscriber, run_service, confirms_lost
):
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b'{"r": 1}'))
    svc, copies = through_a_lost_confirm(
        run_service, confirms_lost, sub, "lost-reply", "reply", retry=2
    )
    assert (svc.events("delivered"), svc.events("dead_lettered")) == (1, 0)
    assert [props.headers["ce-id"] for props, _ in copies] == ["r-1", "r-1"]
    assert {body for _, body in copies} == {b'{"r": 1}'}
