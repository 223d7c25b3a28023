"""What each message is told in the edge cases: no dead-letter target, unroutable
dead letters, shutdown, in-flight accounting."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker


def test_no_dead_letter_target_and_no_dlx_rejects_once_not_a_loop(make_subscriber, run_service):
    """Knative drops what it cannot deliver when there is no dead-letter sink: a
    reject without requeue, so the subscriber sees the event once, not forever."""
    sub = make_subscriber(lambda _r, _i: Reply(400))
    svc = run_service(sub.url, parallelism=1, delivery={"retry": 0, "backoff_delay": "10ms"})
    publish(svc.queue, headers=event_headers("n-1"))
    svc.wait_events("rejected", 1)
    # One slot: the event published after it goes only once the slot is free,
    # and the broker would have handed a message given back to it again first.
    publish(svc.queue, headers=event_headers("n-2"))
    wait_until(lambda: sub.ids().count("n-2") == 1, message="the event behind it")
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue empty")
    assert sub.ids().count("n-1") == 1
    assert svc.events("requeued") == 0


def test_every_dead_letter_target_down_requeues_with_a_wait_that_grows(
    make_subscriber, run_service
):
    """The sink refuses three times: the event goes back to the queue three times,
    each time after a longer wait (200 ms, 400 ms, 800 ms, give or take 20 %),
    never in a tight loop, then the sink takes it. The subscriber's one answer
    stands: each redelivery only tries the dead letter again (issue 45)."""
    sub = make_subscriber(lambda _r, _i: Reply(400))
    sink = make_subscriber(lambda _r, i: Reply(500) if i < 3 else Reply(200))
    svc = run_service(
        sub.url,
        delivery={"retry": 0, "backoff_delay": "200ms", "backoff_max": "5s"},
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, headers=event_headers("g-1"))
    svc.wait_events("dead_lettered", 1, timeout=20)
    assert len(sub.requests) == 1
    arrivals = [request.at for request in sink.requests]
    assert len(arrivals) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    for gap, wait in zip(gaps, (0.2, 0.4, 0.8), strict=True):
        assert gap >= wait * 0.8, gaps
    assert gaps[0] < gaps[2], gaps
    assert svc.events("requeued") == 3


def test_unroutable_dead_letter_is_not_accepted(make_subscriber, run_service):
    """An exchange with no bound queue would drop the letter: mandatory makes that a
    failure. The message goes back until a queue is bound, the subscriber's one
    answer standing: the dead letter is what is tried again, not the request."""
    sub = make_subscriber(lambda _r, i: Reply(400) if i == 0 else Reply(200))
    exchange, letters = broker.unique("nowhere"), broker.unique("letters")
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "direct")
        ch.queue_declare(letters)
    svc = run_service(
        sub.url,
        delivery={"retry": 0},
        dead_letter={"exchange": exchange},
        extra_queues=[letters],
        extra_exchanges=[exchange],
    )
    publish(svc.queue, headers=event_headers("u-1"))
    wait_until(lambda: svc.events("requeued") >= 2, message="the event back twice")
    assert svc.events("dead_lettered") == 0
    with broker.channel() as ch:
        ch.queue_bind(letters, exchange, routing_key="")
    svc.wait_events("dead_lettered", 1)
    assert sub.ids() == ["u-1"]
    assert svc.events("delivered") == 0
    assert queue_depth(letters) == 1


def test_inflight_gauge_follows_deliveries(make_subscriber, run_service):
    release = threading.Event()

    def hold(_r, _i):
        release.wait(10)
        return Reply(200)

    sub = make_subscriber(hold)
    svc = run_service(sub.url)
    publish(svc.queue, headers=event_headers("i-1"))
    sub.wait_for(1)
    assert svc.value("dispatcher_inflight", binding="b") == 1
    release.set()
    svc.wait_events("delivered", 1)
    wait_until(lambda: svc.value("dispatcher_inflight", binding="b") == 0, message="inflight 0")


def test_shutdown_with_a_hung_subscriber_is_bounded_and_leaves_the_message(
    make_subscriber, run_service
):
    sub = make_subscriber(lambda _r, _i: Reply(hang=True))
    svc = run_service(sub.url, delivery={"timeout": "60s"})
    publish(svc.queue, headers=event_headers("h-1"))
    sub.wait_for(1)
    started = time.monotonic()
    svc.service.request_stop()
    svc.service.shutdown()  # grace is 3 s in the fixture
    elapsed = time.monotonic() - started
    assert 2.5 < elapsed < 3 + 2 * 3.0 + 1
    # Not acked, not dead-lettered: the broker has it back for redelivery.
    wait_until(lambda: queue_depth(svc.queue) == 1, message="the message back in the queue")
    assert svc.events("dead_lettered") == 0


def test_shutdown_lets_in_flight_work_finish_and_acks_it(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(200, delay=1.0))
    svc = run_service(sub.url)
    publish(svc.queue, headers=event_headers("f-1"))
    sub.wait_for(1)
    svc.service.request_stop()
    svc.service.shutdown()
    assert svc.events("delivered") == 1
    assert queue_depth(svc.queue) == 0


REPLY = {"ce-specversion": "1.0", "ce-id": "r", "ce-source": "/r", "ce-type": "t"}


def test_shutdown_during_a_reply_retry_leaves_the_message_not_rejected(
    make_subscriber, run_service
):
    """The contract: at shutdown the rest is left unacked, not dead-lettered (review defect 2)."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b"{}"))
    ingress = make_subscriber(lambda _r, _i: Reply(503))
    dlx, dlq = broker.declare_fanout_with_queue()
    svc = run_service(
        sub.url,
        reply={"url": ingress.url},
        declare={"dead_letter_exchange": dlx},
        delivery={"retry": 5, "backoff_delay": "5s", "backoff_max": "5s"},
        extra_queues=[dlq],
        extra_exchanges=[dlx],
    )
    publish(svc.queue, headers=event_headers("sd-1"))
    ingress.wait_for(1)
    svc.service.request_stop()
    svc.service.shutdown()
    wait_until(lambda: queue_depth(svc.queue) == 1, message="the message back in its queue")
    assert queue_depth(dlq) == 0
    assert svc.events("rejected") == 0


def test_a_large_plain_answer_with_reply_configured_is_just_delivered(make_subscriber, run_service):
    """Only a CloudEvent answer is a reply; size limits apply to replies (review defect 4)."""
    sub = make_subscriber(
        lambda _r, _i: Reply(200, headers={"content-type": "text/html"}, body=b"x" * 4096)
    )
    ingress = make_subscriber()
    svc = run_service(sub.url, reply={"url": ingress.url}, max_body_size=1024)
    publish(svc.queue, headers=event_headers("big-answer"))
    svc.wait_events("delivered", 1)
    assert ingress.requests == []
    assert svc.events("dead_lettered") == 0


def test_publisher_keeps_one_connection_across_channel_errors(make_subscriber, run_service):
    """A 404 exchange closes the channel, not the connection (review defect 3)."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b"{}"))
    svc = run_service(
        sub.url,
        reply={"exchange": broker.unique("missing")},
        delivery={"retry": 3, "backoff_delay": "10ms"},
    )
    publish(svc.queue, headers=event_headers("p-1"))
    svc.wait_events("rejected", 1, timeout=20)
    assert len(sub.requests) == 4  # each attempt's reply closed the channel
    assert svc.service.publisher is not None
    assert svc.service.publisher.connections_opened == 1


def test_an_internal_error_dead_letters_instead_of_looping(
    make_subscriber, run_service, monkeypatch
):
    from dispatcher.event import http as http_binding

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url})
    # trace_headers is the first step once the event is read.
    monkeypatch.setattr(http_binding, "trace_headers", broken)
    publish(svc.queue, headers=event_headers("bug-1"))
    svc.wait_events("dead_lettered", 1)
    assert sub.requests == []
    [letter] = sink.requests
    assert "internal error: RuntimeError: boom" in letter.headers["ce-dispatchererror"].replace(
        "%20", " "
    )
