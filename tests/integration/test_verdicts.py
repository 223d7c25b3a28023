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


def lose_the_confirm(proxy: FaultProxy, queue: str) -> None:
    """Once the publish is in ``queue`` (its confirm held back), cut both connections."""
    wait_until(lambda: queue_depth(queue) >= 1, message=f"the publish in {queue}")
    proxy.pass_confirms()
    proxy.reset_all()


def test_a_dead_letter_whose_confirm_was_lost_is_published_again_not_sent_again(
    make_subscriber, run_service, confirms_lost
):
    sub = make_subscriber(lambda _r, i: Reply(400) if i == 0 else Reply(200))
    dlx, dlq = broker.declare_fanout_with_queue()
    svc = run_service(
        sub.url,
        url=confirms_lost.url,
        delivery={"retry": 0, "timeout": "5s"},
        dead_letter={"exchange": dlx},
        extra_queues=[dlq],
        extra_exchanges=[dlx],
    )
    publish(svc.queue, headers=event_headers("lost-dl"))
    lose_the_confirm(confirms_lost, dlq)
    wait_until(lambda: settled(svc) >= 1, 20, "the redelivery to end")
    assert svc.events("dead_lettered") == 1
    assert sub.ids() == ["lost-dl"]  # one request: the redelivery carried the verdict out
    assert svc.events("delivered") == 0
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    letters = broker.get_all(dlq)
    assert [props.headers["ce-id"] for props, _ in letters] == ["lost-dl", "lost-dl"]
    # Both copies carry the subscriber's one answer.
    assert {props.headers["ce-knativeerrorcode"] for props, _ in letters} == {"400"}


def test_a_reply_whose_confirm_was_lost_is_published_again_not_sent_again(
    make_subscriber, run_service, confirms_lost
):
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b'{"r": 1}'))
    exchange, replies = broker.declare_fanout_with_queue()
    svc = run_service(
        sub.url,
        url=confirms_lost.url,
        delivery={"retry": 2, "timeout": "5s"},
        reply={"exchange": exchange},
        extra_queues=[replies],
        extra_exchanges=[exchange],
    )
    publish(svc.queue, headers=event_headers("lost-reply"))
    lose_the_confirm(confirms_lost, replies)
    wait_until(lambda: settled(svc) >= 1, 20, "the redelivery to end")
    assert svc.events("delivered") == 1
    assert sub.ids() == ["lost-reply"]
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    copies = broker.get_all(replies)
    assert [props.headers["ce-id"] for props, _ in copies] == ["r-1", "r-1"]
    assert {body for _, body in copies} == {b'{"r": 1}'}
    assert svc.events("dead_lettered") == 0
