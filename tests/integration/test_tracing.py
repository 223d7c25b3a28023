"""Every delivery in the user's traces, as a real OTLP receiver decodes them.

Producer -> the CONSUMER span of the message -> one CLIENT span per attempt ->
the subscriber's received ``traceparent``; PRODUCER spans for dead letters and
replies, whose context the published message carries. The receiver is an HTTP
server that decodes each export with ``opentelemetry-proto``
(``tests/support/otlp.py``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.integration.test_delivery import REPLY
from tests.support import broker
from tests.support.broker import event_headers, publish, wait_until
from tests.support.otlp import Collector, ReceivedSpan
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
SAMPLED_PARENT = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-01$")


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.stop()


@pytest.fixture
def traced(run_service, collector):
    """``run_service`` with tracing on, exporting to ``collector``."""

    def start(subscriber_url: str, ratio: float = 1.0, **binding: Any):
        tracing = {"enabled": True, "endpoint": collector.endpoint, "sample_ratio": ratio}
        return run_service(subscriber_url, top={"tracing": tracing}, **binding)

    return start


def by_kind(spans: list[ReceivedSpan], kind: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == kind]


def consumer_of(collector: Collector, event_id: str) -> ReceivedSpan:
    spans = collector.wait_for(
        lambda spans: any(s.attributes.get("cloudevents.event_id") == event_id for s in spans),
        what=f"the consumer span of {event_id}",
    )
    [span] = [s for s in spans if s.attributes.get("cloudevents.event_id") == event_id]
    return span


def children(collector: Collector, parent: ReceivedSpan, count: int) -> list[ReceivedSpan]:
    spans = collector.wait_for(
        lambda spans: sum(s.parent_span_id == parent.span_id for s in spans) >= count,
        what=f"{count} children of {parent.name}",
    )
    return [s for s in spans if s.parent_span_id == parent.span_id]


def test_one_trace_from_the_producer_through_the_attempt_to_the_subscriber(
    make_subscriber, traced, collector, capsys
):
    sub = make_subscriber()
    svc = traced(sub.url)
    publish(
        svc.queue,
        headers=event_headers("t-1", traceparent=SAMPLED_PARENT, tracestate="vendor=1"),
        message_id="m-1",
    )
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-1")
    [attempt] = children(collector, consumer, 1)
    # The producer's span is the consumer span's parent, in the producer's trace.
    assert consumer.trace_id == PRODUCER_TRACE
    assert consumer.parent_span_id == PRODUCER_SPAN
    assert consumer.kind == "CONSUMER"
    assert consumer.name == f"{svc.queue} process"
    assert consumer.status == "UNSET"
    assert consumer.trace_state == "vendor=1"
    assert consumer.attributes == {
        "messaging.system": "rabbitmq",
        "messaging.destination.name": svc.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": "m-1",
        "messaging.rabbitmq.message.delivery_tag": 1,
        "cloudevents.event_id": "t-1",
        "cloudevents.event_type": "dev.tests.event",
        "cloudevents.event_source": "/tests",
        "cloudevents.event_spec_version": "1.0",
        "dispatcher.binding": "b",
        "dispatcher.redelivered": False,
        "dispatcher.outcome": "delivered",
        "dispatcher.attempts": 1,
        "dispatcher.status": 200,
    }
    assert consumer.resource["service.name"] == "dispatcher"
    # One CLIENT span, the consumer's child; the subscriber's parent is that span.
    assert (attempt.kind, attempt.name, attempt.trace_id) == ("CLIENT", "POST", PRODUCER_TRACE)
    port = int(sub.url.rsplit(":", 1)[1].rstrip("/"))
    assert attempt.attributes == {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "url.full": sub.url,
        "http.response.status_code": 200,
    }
    [request] = sub.requests
    assert TRACEPARENT.match(request.headers["traceparent"]).groups() == (
        PRODUCER_TRACE,
        attempt.span_id,
    )
    assert request.headers["tracestate"] == "vendor=1"
    assert consumer.start_ns <= attempt.start_ns <= attempt.end_ns <= consumer.end_ns
    # The delivery line carries the consumer span's ids.
    [line] = [
        json.loads(text)
        for text in capsys.readouterr().out.splitlines()
        if text.startswith("{") and '"delivery"' in text
    ]
    assert (line["trace_id"], line["span_id"]) == (consumer.trace_id, consumer.span_id)


def test_a_retried_delivery_has_an_attempt_span_each_and_the_wait_as_an_event(
    make_subscriber, traced, collector
):
    sub = make_subscriber(lambda _r, i: Reply(503 if i == 0 else 200))
    svc = traced(sub.url)
    publish(svc.queue, headers=event_headers("t-2"))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-2")
    first, second = sorted(children(collector, consumer, 2), key=lambda s: s.start_ns)
    assert first.attributes["http.response.status_code"] == 503
    assert first.attributes["error.type"] == "503"
    assert first.status == "ERROR"
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["http.response.status_code"] == 200
    assert second.attributes["http.request.resend_count"] == 1
    assert second.status == "UNSET"
    assert consumer.event_names() == ["retry wait"]
    assert consumer.attributes["dispatcher.attempts"] == 2
    # Each attempt sent its own span's context.
    sent = [TRACEPARENT.match(r.headers["traceparent"]).group(2) for r in sub.requests]
    assert sent == [first.span_id, second.span_id]


def test_a_transport_error_is_an_error_type_not_a_status(
    make_subscriber, traced, collector, capsys
):
    sub = make_subscriber()
    url = sub.url
    sub.close()  # nothing listens there now
    svc = traced(url, delivery={"retry": 0})
    publish(svc.queue, headers=event_headers("t-3"))
    svc.wait_events("rejected", 1)
    consumer = consumer_of(collector, "t-3")
    [attempt] = children(collector, consumer, 1)
    assert "http.response.status_code" not in attempt.attributes
    assert attempt.attributes["error.type"] == "transport"
    assert attempt.status == "ERROR"
    assert consumer.status == "ERROR"
    assert consumer.attributes["dispatcher.outcome"] == "rejected"
    # A warning-level line (structlog's own path, not the batched delivery lines)
    # carries the trace too.
    [line] = [
        json.loads(text)
        for text in capsys.readouterr().out.splitlines()
        if text.startswith("{") and '"delivery"' in text
    ]
    assert line["level"] == "warning"
    assert (line["trace_id"], line["span_id"]) == (consumer.trace_id, consumer.span_id)


def test_dead_letters_to_sink_and_exchange_are_spans_of_the_delivery(
    make_subscriber, traced, collector
):
    sub = make_subscriber(lambda _r, _i: Reply(400))
    sink = make_subscriber()
    exchange, dlq = broker.declare_fanout_with_queue(prefix="dlx")
    svc = traced(
        sub.url,
        dead_letter={"sink": sink.url, "exchange": exchange},
        extra_queues=[dlq],
        extra_exchanges=[exchange],
    )
    publish(svc.queue, headers=event_headers("t-4", traceparent=SAMPLED_PARENT))
    svc.wait_events("dead_lettered", 1)
    consumer = consumer_of(collector, "t-4")
    spans = children(collector, consumer, 3)
    assert consumer.status == "ERROR"
    assert consumer.attributes["dispatcher.outcome"] == "dead_lettered"
    subscriber_attempt, sink_attempt = sorted(by_kind(spans, "CLIENT"), key=lambda s: s.start_ns)
    assert subscriber_attempt.attributes["url.full"] == sub.url
    assert sink_attempt.attributes["url.full"] == sink.url
    [producer] = by_kind(spans, "PRODUCER")
    assert producer.name == f"publish {exchange}"
    assert producer.attributes["messaging.destination.name"] == exchange
    assert producer.attributes["messaging.operation.type"] == "send"
    assert producer.attributes["dispatcher.purpose"] == "dead_letter"
    assert producer.status == "UNSET"
    # The sink and the dead-letter message carry their own spans' contexts.
    [to_sink] = sink.requests
    assert TRACEPARENT.match(to_sink.headers["traceparent"]).group(2) == sink_attempt.span_id
    [(props, _body)] = wait_until(lambda: broker.get_all(dlq), message="the dead letter")
    assert TRACEPARENT.match(props.headers["traceparent"]).groups() == (
        PRODUCER_TRACE,
        producer.span_id,
    )


def test_a_reply_published_is_a_producer_span_whose_context_it_carries(
    make_subscriber, traced, collector
):
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b'{"r": 1}'))
    exchange, replies = broker.declare_fanout_with_queue(prefix="rx")
    svc = traced(
        sub.url, reply={"exchange": exchange}, extra_queues=[replies], extra_exchanges=[exchange]
    )
    publish(svc.queue, headers=event_headers("t-5"))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-5")
    [producer] = by_kind(children(collector, consumer, 2), "PRODUCER")
    assert producer.attributes["dispatcher.purpose"] == "reply"
    [(props, _body)] = wait_until(lambda: broker.get_all(replies), message="the reply")
    assert TRACEPARENT.match(props.headers["traceparent"]).groups() == (
        consumer.trace_id,
        producer.span_id,
    )


def test_a_filtered_event_is_a_span_without_an_attempt(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url, filter={"attributes": {"type": "dev.tests.other"}})
    publish(svc.queue, headers=event_headers("t-6"))
    svc.wait_events("filtered", 1)
    consumer = consumer_of(collector, "t-6")
    assert consumer.attributes["dispatcher.outcome"] == "filtered"
    assert consumer.status == "UNSET"
    assert [s for s in collector.spans if s.parent_span_id == consumer.span_id] == []
    assert sub.requests == []


def test_without_a_context_the_message_starts_a_trace(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url)
    publish(svc.queue, headers=event_headers("t-7"))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-7")
    [attempt] = children(collector, consumer, 1)
    assert consumer.parent_span_id == ""
    assert attempt.trace_id == consumer.trace_id
    [request] = sub.requests
    assert TRACEPARENT.match(request.headers["traceparent"]).groups() == (
        consumer.trace_id,
        attempt.span_id,
    )


def test_the_event_s_traceparent_extension_is_the_parent_and_stays_as_it_came(
    make_subscriber, traced, collector
):
    sub = make_subscriber()
    svc = traced(sub.url)
    # A binary CloudEvent with the distributed-tracing extension, no AMQP trace headers.
    publish(svc.queue, headers=event_headers("t-8", **{"ce-traceparent": SAMPLED_PARENT}))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-8")
    [attempt] = children(collector, consumer, 1)
    assert (consumer.trace_id, consumer.parent_span_id) == (PRODUCER_TRACE, PRODUCER_SPAN)
    [request] = sub.requests
    assert request.headers["ce-traceparent"] == SAMPLED_PARENT  # never changed
    assert TRACEPARENT.match(request.headers["traceparent"]).group(2) == attempt.span_id


def test_a_structured_event_s_traceparent_is_the_parent(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url)
    event = {
        "specversion": "1.0",
        "id": "t-9",
        "source": "/tests",
        "type": "dev.tests.event",
        "traceparent": SAMPLED_PARENT,
    }
    publish(
        svc.queue,
        json.dumps(event).encode(),
        headers={},
        content_type="application/cloudevents+json",
    )
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-9")
    assert (consumer.trace_id, consumer.parent_span_id) == (PRODUCER_TRACE, PRODUCER_SPAN)


def test_a_malformed_traceparent_starts_a_new_trace(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url)
    publish(svc.queue, headers=event_headers("t-10", traceparent="00-nothex-zz-01"))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-10")
    assert consumer.parent_span_id == ""
    assert consumer.trace_id != PRODUCER_TRACE
    [request] = sub.requests
    assert TRACEPARENT.match(request.headers["traceparent"]).group(1) == consumer.trace_id


def test_sampling_follows_the_parent_and_the_ratio_for_new_traces(
    make_subscriber, traced, collector
):
    sub = make_subscriber()
    svc = traced(sub.url, ratio=0.0)
    unsampled = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-00"
    publish(svc.queue, headers=event_headers("root"))
    publish(svc.queue, headers=event_headers("unsampled", traceparent=unsampled))
    publish(svc.queue, headers=event_headers("sampled", traceparent=SAMPLED_PARENT))
    svc.wait_events("delivered", 3)
    consumer = consumer_of(collector, "sampled")  # a sampled parent is always followed
    children(collector, consumer, 1)
    traced_ids = {s.attributes.get("cloudevents.event_id") for s in collector.spans}
    assert traced_ids == {"sampled", None}  # None: its CLIENT span
    sent = {r.headers["ce-id"]: r.headers.get("traceparent") for r in sub.requests}
    # Not sampled: the W3C headers pass through as they came, as with tracing off.
    assert sent["root"] is None
    assert sent["unsampled"] == unsampled
    assert sent["sampled"] != SAMPLED_PARENT


def test_a_ratio_samples_about_that_share_of_new_traces(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url, ratio=0.25)
    ids = [f"r-{i:03d}" for i in range(400)]
    broker.publish_events(svc.queue, ids)
    svc.wait_events("delivered", 400, timeout=30)
    # Every request has been answered, so the subscriber's count is final; the
    # spans reach the collector later, in the batch processor's exports.
    sent = sum("traceparent" in r.headers for r in sub.requests)
    # Binomial(400, 0.25): mean 100, sd 8.7; these bounds are over 4.5 sd away.
    assert 60 <= sent <= 140
    spans = collector.wait_for(
        lambda spans: (
            len(by_kind(spans, "CONSUMER")) >= sent and len(by_kind(spans, "CLIENT")) >= sent
        ),
        what=f"{sent} consumer and {sent} client spans",
    )
    assert len(by_kind(spans, "CONSUMER")) == len(by_kind(spans, "CLIENT")) == sent


def test_userinfo_never_reaches_a_span(make_subscriber, traced, collector):
    sub = make_subscriber(lambda _r, i: Reply(503 if i == 0 else 200))
    port = sub.url.rsplit(":", 1)[1]
    svc = traced(f"http://user:s3cr3t@127.0.0.1:{port}?q=1")
    publish(svc.queue, headers=event_headers("t-11"))
    svc.wait_events("delivered", 1)
    consumer = consumer_of(collector, "t-11")
    attempts = children(collector, consumer, 2)
    assert {s.attributes["url.full"] for s in attempts} == {f"http://127.0.0.1:{port}?q=1"}
    everything = repr([(s.attributes, s.events, s.status_message) for s in collector.spans])
    assert "s3cr3t" not in everything and "user" not in everything
    assert sub.requests[0].headers["authorization"].startswith("Basic ")


def test_a_bug_while_handling_ends_the_span_in_error(make_subscriber, traced, collector):
    sub = make_subscriber()
    svc = traced(sub.url)
    dedupe = svc.service.handlers["b"]._dedupe

    async def broken(_key, _wait):
        raise RuntimeError("boom")

    # A first delivery claims with claim_first; its redelivery, with claim_or_wait.
    dedupe.claim_first = broken
    publish(svc.queue, headers=event_headers("t-12"))
    svc.wait_events("delivered", 1)  # given back by the engine, then delivered
    spans = collector.wait_for(
        lambda spans: len(by_kind(spans, "CONSUMER")) == 2, what="both consumer spans"
    )
    failed, delivered = sorted(by_kind(spans, "CONSUMER"), key=lambda s: s.start_ns)
    assert (failed.attributes["dispatcher.outcome"], failed.status) == ("error", "ERROR")
    assert delivered.attributes["dispatcher.outcome"] == "delivered"
    assert len(sub.requests) == 1
