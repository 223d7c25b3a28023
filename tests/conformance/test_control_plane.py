"""Knative's control-plane contract (``specs/eventing/control-plane.md``): what it
requires of the delivery of a Trigger's or a Subscription's events.

One test per requirement that applies, named ``test_cp_<section>_<requirement>``;
``docs/conformance.md`` lists every row, these and the ones that do not apply
(Kubernetes resources, status conditions, the broker's ingress) with why. A
binding is a Trigger here: its queue is what the broker routed to it, its
``filter`` the Trigger's, ``reply.exchange`` the broker (a reply goes back in
through the same exchange) and ``reply.url`` a Subscription's ``replyUri``.
"""

from __future__ import annotations

import base64
import itertools
import os
import threading
from urllib.parse import unquote

import pytest

from tests.conformance.common import REPLY_EVENT, delivery
from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker


# ----------------------------------------------------------------- Content Based Routing


def test_cp_content_based_routing_each_trigger_evaluated_once(subscriber, run_service):
    """MUST: the Trigger's filter is evaluated for each event, exactly once: a
    matching event is delivered once, another is not delivered at all."""
    svc = run_service(subscriber.url, filter={"attributes": {"type": "dev.tests.wanted"}})
    publish(svc.queue, headers=event_headers("cp-1", **{"ce-type": "dev.tests.other"}))
    publish(svc.queue, headers=event_headers("cp-2", **{"ce-type": "dev.tests.wanted"}))
    svc.wait_events("delivered", 1)
    svc.wait_events("filtered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="both settled")
    assert subscriber.ids() == ["cp-2"]


def test_cp_content_based_routing_each_matching_trigger_gets_its_own_delivery(
    subscriber, run_service
):
    """MUST: one delivery per matching Trigger, even to the same destination:
    two bindings whose queues the same exchange feeds, one subscriber URL."""
    exchange = broker.unique("cp-fan")
    queues = [broker.unique("cp-fan-q"), broker.unique("cp-fan-q")]
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "fanout")
        for queue in queues:
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, exchange)
    bindings = [
        {"name": f"t{n}", "queue": queue, "subscriber": subscriber.url, "delivery": delivery()}
        for n, queue in enumerate(queues)
    ]
    svc = run_service(
        subscriber.url,
        queue=queues[0],
        extra_queues=queues[1:],
        extra_exchanges=[exchange],
        top={"bindings": bindings},
    )
    publish("", headers=event_headers("cp-3"), exchange=exchange)
    subscriber.wait_for(2)
    wait_until(lambda: all(queue_depth(q) == 0 for q in queues), message="both acked")
    assert subscriber.ids() == ["cp-3", "cp-3"]
    assert svc.value("dispatcher_events_total", binding="t0", outcome="delivered") == 1
    assert svc.value("dispatcher_events_total", binding="t1", outcome="delivered") == 1


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{ "spaced" :  [1,2 ,3] }\n', id="json-as-written"),
        pytest.param(bytes(range(256)) * 4, id="binary"),
        pytest.param(os.urandom(36 * 1024), id="36KB"),
    ],
)
def test_cp_content_based_routing_event_data_is_not_modified(subscriber, run_service, data):
    """MUST NOT: the event's data is never modified: the subscriber gets the
    message body byte for byte, JSON whitespace, binary data and 36 KB events
    (the size Knative's own conformance tests send) included."""
    svc = run_service(subscriber.url, max_body_size=64 * 1024)
    content_type = "application/json" if data.startswith(b"{") else "application/octet-stream"
    publish(svc.queue, data, headers=event_headers("cp-4"), content_type=content_type)
    [request] = subscriber.wait_for(1)
    assert request.body == data
    assert request.headers["content-type"] == content_type


def test_cp_content_based_routing_replies_are_enqueued_with_the_same_routing_and_persistence(
    make_subscriber, run_service
):
    """MUST: a reply goes back into the broker like any event: persistent, through
    the broker's exchange, so whatever is bound there receives it."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b'{"r": 1}'))
    exchange, replies = broker.declare_fanout_with_queue(prefix="cp-rx")
    svc = run_service(
        sub.url, reply={"exchange": exchange}, extra_queues=[replies], extra_exchanges=[exchange]
    )
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    publish(svc.queue, headers=event_headers("cp-5", traceparent=traceparent))
    [(props, body)] = wait_until(lambda: broker.get_all(replies), message="the reply")
    assert props.delivery_mode == 2
    assert (props.headers["ce-id"], body) == ("reply-1", b'{"r": 1}')
    assert props.headers["traceparent"] == traceparent  # the trace goes on


def test_cp_content_based_routing_a_reply_meets_every_trigger_its_own_included(
    make_subscriber, run_service
):
    """MUST: a reply is evaluated against every Trigger, the one whose subscriber
    replied included: the reply goes to the exchange that feeds this binding's
    queue, and the same binding delivers it."""
    exchange = broker.unique("cp-loop")
    queue = broker.unique("cp-loop-q")
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "fanout")
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange)

    def answer(request, _index):
        if request.headers["ce-type"] == "dev.tests.event":
            return Reply(200, headers=REPLY_EVENT, body=b"{}")
        return Reply(202)

    sub = make_subscriber(answer)
    svc = run_service(
        sub.url, queue=queue, reply={"exchange": exchange}, extra_exchanges=[exchange]
    )
    publish("", headers=event_headers("cp-6"), exchange=exchange)
    sub.wait_for(2)
    svc.wait_events("delivered", 2)
    assert [r.headers["ce-type"] for r in sub.requests] == ["dev.tests.event", "dev.tests.reply"]


def test_cp_content_based_routing_a_reply_that_cannot_be_stored_fails_the_delivery(
    make_subscriber, run_service
):
    """MUST: if storing the reply in the broker fails, the whole delivery fails and
    the delivery to the subscriber is retried (here the reply exchange is gone:
    each attempt's reply is refused, so the subscriber sees the event ``retry + 1``
    times, then it is dead-lettered)."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b"{}"))
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        reply={"exchange": broker.unique("cp-missing")},
        delivery=delivery(retry=2),
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, headers=event_headers("cp-7"))
    svc.wait_events("dead_lettered", 1, timeout=20)
    assert sub.ids() == ["cp-7"] * 3
    [letter] = sink.requests
    assert "reply publish failed" in unquote(letter.headers["ce-dispatchererror"])


# ----------------------------------------------------------------- Topology Based Routing


def test_cp_topology_based_routing_each_subscription_at_least_once(make_subscriber, run_service):
    """MUST: every event reaches each Subscription at least once: the binding's
    channel closes while the request is in flight, and the event is still
    delivered and acked (once: the redelivery waits for the first attempt)."""
    release = threading.Event()

    def answer(_request, index):
        if index == 0:
            release.wait(10)
        return Reply(200)

    sub = make_subscriber(answer)
    svc = run_service(sub.url)
    publish(svc.queue, headers=event_headers("cp-at-least-once"))
    sub.wait_for(1)
    generation = svc.service.supervisor.generation("b")
    svc.service.supervisor.close_channel("b")
    wait_until(lambda: svc.service.supervisor.generation("b") > generation, message="a new channel")
    release.set()
    svc.wait_events("delivered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the redelivery settled")
    assert sub.ids() == ["cp-at-least-once"]
    assert svc.value("dispatcher_duplicates_suppressed_total", binding="b") == 1


# ----------------------------------------------------------------- Event Delivery


@pytest.mark.parametrize(
    ("policy", "bases"),
    [("exponential", (0.1, 0.2, 0.4, 0.8)), ("linear", (0.1, 0.2, 0.3, 0.4))],
)
def test_cp_event_delivery_retried_up_to_retry_times_following_the_backoff(
    make_subscriber, run_service, policy, bases
):
    """MUST: a retryable failure is retried up to ``retry`` times, following
    ``backoffPolicy`` and ``backoffDelay``. Exponential: delay x 2^n. Linear is
    read as Knative's API reference has it (delay x n), not the specification's
    "the same delay each time" (docs/conformance.md says why)."""
    sub = make_subscriber(lambda _r, _i: Reply(503))
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        delivery=delivery(retry=4, backoff_policy=policy, backoff_delay="100ms", backoff_max="5s"),
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, headers=event_headers("cp-8"))
    svc.wait_events("dead_lettered", 1)
    assert len(sub.requests) == 5
    gaps = [b.at - a.at for a, b in itertools.pairwise(sub.requests)]
    for gap, base in zip(gaps, bases, strict=True):
        # Never shorter than the jittered wait; the slack above it is for a loaded
        # machine, and still tells 0.4 s (linear) from 0.8 s (exponential).
        assert base * 0.8 <= gap <= base * 1.2 + 0.25, gaps


def test_cp_event_delivery_success_without_a_reply_completes_it(make_subscriber, run_service):
    """MUST: a successful attempt with no event in the answer completes the
    delivery: acked, nothing forwarded."""
    sub = make_subscriber(lambda _r, _i: Reply(200, body=b"thanks"))
    ingress = make_subscriber()
    svc = run_service(sub.url, reply={"url": ingress.url})
    publish(svc.queue, headers=event_headers("cp-9"))
    svc.wait_events("delivered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    assert ingress.requests == []


def test_cp_event_delivery_a_reply_goes_to_the_reply_uri(make_subscriber, run_service):
    """MUST: an event in a successful answer is delivered to ``replyUri``, once,
    with the original message's trace context (Knative's conformance tests)."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b'{"r": 2}'))
    ingress = make_subscriber(lambda _r, _i: Reply(202))
    svc = run_service(sub.url, reply={"url": ingress.url})
    publish(svc.queue, headers=event_headers("cp-10", traceparent=traceparent))
    svc.wait_events("delivered", 1)
    [forwarded] = ingress.requests
    assert (forwarded.headers["ce-id"], forwarded.body) == ("reply-1", b'{"r": 2}')
    assert forwarded.headers["traceparent"] == traceparent


def test_cp_event_delivery_no_reply_uri_drops_the_reply(make_subscriber, run_service):
    """MUST: without a reply destination the reply event is dropped; the event
    itself is delivered (and, as the data plane says, a 200 with an event is
    still an acceptance)."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b"{}"))
    svc = run_service(sub.url)
    publish(svc.queue, headers=event_headers("cp-11"))
    svc.wait_events("delivered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    assert len(sub.requests) == 1


def test_cp_event_delivery_a_failing_reply_uri_retries_the_whole_delivery(
    make_subscriber, run_service
):
    """MUST (Subscriptions): if delivering the reply fails with a retryable error,
    the whole delivery is retried up to ``retry`` times; then the original event
    goes to the dead-letter sink. Never a loop: the subscriber sees it
    ``retry + 1`` times, and the reply URL once per attempt."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b"{}"))
    ingress = make_subscriber(lambda _r, _i: Reply(503, body=b"ingress down"))
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        reply={"url": ingress.url},
        delivery=delivery(retry=1),
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, headers=event_headers("cp-12"))
    svc.wait_events("dead_lettered", 1)
    [letter] = sink.wait_for(1)
    assert sub.ids() == ["cp-12", "cp-12"]
    assert [r.headers["ce-id"] for r in ingress.requests] == ["reply-1", "reply-1"]
    assert letter.headers["ce-id"] == "cp-12"
    assert letter.headers["ce-knativeerrorcode"] == "503"
    assert base64.b64decode(letter.headers["ce-knativeerrordata"]) == b"ingress down"
    assert "reply URL answered 503" in unquote(letter.headers["ce-dispatchererror"])
    wait_until(lambda: queue_depth(svc.queue) == 0, message="nothing left to loop")


def test_cp_event_delivery_an_undeliverable_event_goes_to_the_dead_letter_sink(
    make_subscriber, run_service
):
    """MUST: an event that cannot be delivered goes to the ``deadLetterSink``; MAY
    carry extra attributes: Knative's ``knativeerrordest``, ``knativeerrorcode``
    and ``knativeerrordata``, with the data unchanged."""
    sub = make_subscriber(lambda _r, _i: Reply(500, body=b"broken"))
    sink = make_subscriber()
    svc = run_service(sub.url, delivery=delivery(retry=1), dead_letter={"sink": sink.url})
    publish(svc.queue, b'{"n": 13}', headers=event_headers("cp-13"))
    [letter] = sink.wait_for(1)
    svc.wait_events("dead_lettered", 1)
    assert (letter.headers["ce-id"], letter.body) == ("cp-13", b'{"n": 13}')
    assert unquote(letter.headers["ce-knativeerrordest"]) == sub.url
    assert letter.headers["ce-knativeerrorcode"] == "500"
    assert base64.b64decode(letter.headers["ce-knativeerrordata"]) == b"broken"


def test_cp_event_delivery_a_failed_reply_dead_letters_the_original_event(
    make_subscriber, run_service
):
    """MUST: "an event (either the initial event or a reply) cannot be delivered":
    when the reply never gets through, the event dead-lettered is the original
    one, with its trace context, not the reply. Its ``knativeerror*`` fields are
    the reply URL's, all three (Knative's dispatcher reports a failed reply so):
    the subscriber answered 200."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b"{}"))
    ingress = make_subscriber(lambda _r, _i: Reply(500, body=b"ingress says no"))
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        reply={"url": ingress.url},
        delivery=delivery(retry=0),
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, b'{"o": 1}', headers=event_headers("cp-14", traceparent=traceparent))
    [letter] = sink.wait_for(1)
    svc.wait_events("dead_lettered", 1)
    assert (letter.headers["ce-id"], letter.body) == ("cp-14", b'{"o": 1}')
    assert letter.headers["traceparent"] == traceparent
    assert letter.headers["ce-knativeerrordest"] == ingress.url
    assert letter.headers["ce-knativeerrorcode"] == "500"
    assert base64.b64decode(letter.headers["ce-knativeerrordata"]) == b"ingress says no"


def test_cp_event_delivery_without_a_dead_letter_sink_the_event_is_dropped(
    make_subscriber, run_service
):
    """MUST: with no ``deadLetterSink`` the event is dropped: rejected without
    requeue (the broker discards it; a queue dead-letter exchange would keep it),
    after exactly its retries, never again."""
    sub = make_subscriber(lambda _r, _i: Reply(400))
    svc = run_service(sub.url, parallelism=1, delivery=delivery(retry=0))
    publish(svc.queue, headers=event_headers("cp-15"))
    svc.wait_events("rejected", 1)
    publish(svc.queue, headers=event_headers("cp-15-after"))
    wait_until(lambda: "cp-15-after" in sub.ids(), message="the next event")
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue empty")
    assert sub.ids() == ["cp-15", "cp-15-after"]


def test_cp_event_delivery_the_dead_letter_sink_is_retried(make_subscriber, run_service):
    """SHOULD: a dead-letter delivery that fails with a retryable error is retried
    up to ``retry`` times, with the same backoff."""
    sub = make_subscriber(lambda _r, _i: Reply(400))
    sink = make_subscriber(lambda _r, i: Reply(503) if i < 2 else Reply(202))
    svc = run_service(sub.url, delivery=delivery(retry=2), dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("cp-16"))
    svc.wait_events("dead_lettered", 1)
    assert [r.headers["ce-id"] for r in sink.requests] == ["cp-16"] * 3


# ----------------------------------------------------------------- TriggerFilter


@pytest.mark.parametrize(
    ("attributes", "delivered"),
    [
        ({"type": "dev.tests.event"}, True),
        ({"type": "dev.tests.Event"}, False),  # case-sensitive
        ({"type": "dev.tests.event", "region": "eu"}, True),  # an extension
        ({"type": "dev.tests.event", "region": "us"}, False),  # every key must match
        ({"region": ""}, True),  # "" matches any value of a present attribute
        ({"tenant": ""}, False),  # ... but the attribute must be present
    ],
)
def test_cp_trigger_filter_exact_match_on_attributes(
    subscriber, run_service, attributes, delivered
):
    """MUST: every key is compared with the event's attribute of that name, which
    must be present; a non-empty value must match exactly, case-sensitively; an
    empty value matches every value."""
    svc = run_service(subscriber.url, filter={"attributes": attributes})
    publish(svc.queue, headers=event_headers("cp-17", **{"ce-region": "eu"}))
    svc.wait_events("delivered" if delivered else "filtered", 1)
    assert subscriber.ids() == (["cp-17"] if delivered else [])
