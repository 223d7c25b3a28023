"""The delivery core end to end: real broker, real HTTP subscriber, the service in-process."""

from __future__ import annotations

import base64
import gc
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, publish_events, queue_depth, wait_until
from tests.support.subscriber import Received, Reply

pytestmark = pytest.mark.broker


def test_binary_event_is_delivered_with_its_attributes_and_acked(subscriber, run_service):
    svc = run_service(subscriber.url)
    publish(
        svc.queue,
        b'{"hello": "world"}',
        headers=event_headers(
            "e-1", **{"ce-subject": "caf\u00e9 & 100%", "ce-time": "2026-01-02T03:04:05Z"}
        ),
    )
    [request] = subscriber.wait_for(1)
    assert request.headers["ce-id"] == "e-1"
    assert request.headers["ce-specversion"] == "1.0"
    assert request.headers["ce-type"] == "dev.tests.event"
    assert request.headers["ce-time"] == "2026-01-02T03:04:05Z"
    # The HTTP binding percent-encodes non-ASCII, space, '"' and '%'.
    assert request.headers["ce-subject"] == "caf%C3%A9%20&%20100%25"
    assert request.headers["content-type"] == "application/json"
    assert request.body == b'{"hello": "world"}'  # forwarded byte for byte
    svc.wait_events("delivered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue to drain")
    assert svc.value("dispatcher_delivery_attempts_total", binding="b", code_class="2xx") == 1


def test_structured_mode_sends_the_json_event_format(subscriber, run_service):
    svc = run_service(subscriber.url, content_mode="structured")
    publish(svc.queue, b'{"n": 1}', headers=event_headers("s-1"))
    [request] = subscriber.wait_for(1)
    assert request.headers["content-type"] == "application/cloudevents+json"
    document = json.loads(request.body)
    assert document["id"] == "s-1"
    assert document["datacontenttype"] == "application/json"
    assert document["data"] == {"n": 1}


def test_structured_amqp_message_is_accepted(subscriber, run_service):
    svc = run_service(subscriber.url)
    document = {
        "specversion": "1.0",
        "id": "st-1",
        "source": "/s",
        "type": "t",
        "datacontenttype": "text/plain",
        "data": "hi",
    }
    publish(svc.queue, json.dumps(document).encode(), content_type="application/cloudevents+json")
    [request] = subscriber.wait_for(1)
    assert request.headers["ce-id"] == "st-1"
    assert request.headers["content-type"] == "text/plain"
    assert request.body == b"hi"


def test_trace_headers_pass_through(subscriber, run_service):
    svc = run_service(subscriber.url)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    publish(
        svc.queue,
        headers={
            **event_headers("t-1"),
            "traceparent": traceparent,
            "tracestate": "rojo=00f067aa0ba902b7",
        },
    )
    [request] = subscriber.wait_for(1)
    assert request.headers["traceparent"] == traceparent
    assert request.headers["tracestate"] == "rojo=00f067aa0ba902b7"


def test_non_cloudevent_is_wrapped_with_a_stable_id(subscriber, run_service):
    svc = run_service(subscriber.url)
    publish(svc.queue, b"plain", content_type="text/plain", message_id="m-42")
    publish(svc.queue, b"no id", content_type="text/plain")
    requests = subscriber.wait_for(2)
    by_body = {r.body: r for r in requests}
    assert by_body[b"plain"].headers["ce-id"] == "m-42"
    assert by_body[b"plain"].headers["ce-type"] == "dev.dispatcher.rabbitmq.message"
    assert by_body[b"plain"].headers["ce-source"] == f"rabbitmq://%252F/{svc.queue}"
    assert len(by_body[b"no id"].headers["ce-id"]) == 64  # a sha256 digest


def test_retryable_statuses_are_retried_then_delivered(make_subscriber, run_service):
    statuses = [503, 429, 404, 200]
    sub = make_subscriber(lambda _r, i: Reply(statuses[i] if i < len(statuses) else 200))
    svc = run_service(sub.url, delivery={"retry": 3})
    publish(svc.queue, headers=event_headers("r-1"))
    svc.wait_events("delivered", 1)
    assert len(sub.requests) == 4
    assert svc.value("dispatcher_delivery_attempts_total", binding="b", code_class="5xx") == 1
    assert svc.value("dispatcher_delivery_attempts_total", binding="b", code_class="4xx") == 2


def test_non_retryable_4xx_is_dead_lettered_at_once_to_the_sink(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(400, body=b"bad request: field x"))
    sink = make_subscriber()
    svc = run_service(sub.url, delivery={"retry": 5}, dead_letter={"sink": sink.url})
    publish(svc.queue, b'{"a": 1}', headers=event_headers("d-1"))
    [letter] = sink.wait_for(1)
    svc.wait_events("dead_lettered", 1)
    assert len(sub.requests) == 1  # no retry for a 400
    assert letter.headers["ce-id"] == "d-1"
    assert letter.headers["ce-knativeerrorcode"] == "400"
    assert letter.headers["ce-knativeerrordest"] == sub.url
    assert base64.b64decode(letter.headers["ce-knativeerrordata"]) == b"bad request: field x"
    assert letter.body == b'{"a": 1}'
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue to drain")


@pytest.mark.parametrize(
    ("status", "retry_on", "attempts"),
    [
        (409, None, 3),  # the default retries 409 ...
        (409, ["5xx"], 1),  # ... a list without it dead-letters at once
        (503, None, 3),
        (503, [409, 429], 1),
        (503, ["503"], 3),
        (400, ["4xx"], 3),
    ],
)
def test_retry_on_decides_which_statuses_are_retried(
    make_subscriber, run_service, status, retry_on, attempts
):
    sub = make_subscriber(lambda _r, _i: Reply(status))
    sink = make_subscriber()
    delivery = {"retry": 2} if retry_on is None else {"retry": 2, "retry_on": retry_on}
    svc = run_service(sub.url, delivery=delivery, dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("ro-1"))
    [letter] = sink.wait_for(1)
    svc.wait_events("dead_lettered", 1)
    assert len(sub.requests) == attempts  # retry 2: three attempts when retried
    assert letter.headers["ce-knativeerrorcode"] == str(status)


def test_the_bindings_headers_go_with_every_request(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, i: Reply(503 if i == 0 else 400))
    sink = make_subscriber()
    headers = {"X-Tenant": "blue", "X-Version": 2}
    svc = run_service(
        sub.url, delivery={"retry": 1}, dead_letter={"sink": sink.url}, headers=headers
    )
    publish(svc.queue, headers=event_headers("h-1"))
    [letter] = sink.wait_for(1)
    attempts = sub.wait_for(2)
    for request in [*attempts, letter]:  # the retry and the dead letter included
        assert request.headers["x-tenant"] == "blue"
        assert request.headers["x-version"] == "2"
    assert attempts[0].headers["ce-id"] == letter.headers["ce-id"] == "h-1"


def test_a_rotated_bearer_token_is_sent_by_the_next_request(make_subscriber, run_service, tmp_path):
    sub = make_subscriber(lambda r, _i: Reply(400 if r.headers["ce-id"] == "b-3" else 200))
    sink = make_subscriber()
    token = tmp_path / "token"
    token.write_text("first-token\n")
    # Dated a minute back, so only the file's identity (not a fresh mtime) says it changed.
    old = time.time() - 60
    os.utime(token, (old, old))
    svc = run_service(
        sub.url, auth={"bearer_token_file": str(token)}, dead_letter={"sink": sink.url}
    )
    publish(svc.queue, headers=event_headers("b-1"))
    [first] = sub.wait_for(1)
    # Rotated the way Kubernetes does it: a new file renamed over the old one.
    (tmp_path / "token.new").write_text("second-token\n")
    os.utime(tmp_path / "token.new", (old, old))
    (tmp_path / "token.new").replace(token)
    publish(svc.queue, headers=event_headers("b-2"))
    publish(svc.queue, headers=event_headers("b-3"))
    [letter] = sink.wait_for(1)
    later = sub.wait_for(3)[1:]
    assert first.headers["authorization"] == "Bearer first-token"
    for request in [*later, letter]:  # the dead-letter sink's request too
        assert request.headers["authorization"] == "Bearer second-token"


def test_filtered_events_are_acked_unsent_and_counted(make_subscriber, run_service, capsys):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        dead_letter={"sink": sink.url},
        filters=[
            {"prefix": {"type": "com.example."}},
            {"any": [{"exact": {"region": "eu"}}, {"not": {"suffix": {"source": "/test"}}}]},
        ],
    )
    published = {
        "pass-eu": {"ce-type": "com.example.a", "ce-source": "/test", "ce-region": "eu"},
        "pass-source": {"ce-type": "com.example.b", "ce-source": "/prod"},
        "drop-type": {"ce-type": "org.other.a", "ce-source": "/prod", "ce-region": "eu"},
        "drop-region": {"ce-type": "com.example.a", "ce-source": "/test", "ce-region": "us"},
        "drop-no-region": {"ce-type": "com.example.a", "ce-source": "/test"},
    }
    for event_id, attributes in published.items():
        publish(svc.queue, headers={**event_headers(event_id), **attributes})
    # Filtering comes after reading: a malformed event is still dead-lettered.
    publish(svc.queue, headers={"ce-specversion": "1.0", "ce-type": "org.other.a"})
    svc.wait_events("filtered", 3)
    svc.wait_events("delivered", 2)
    [letter] = sink.wait_for(1)
    wait_until(lambda: queue_depth(svc.queue) == 0, 10, "the queue to drain")
    assert sorted(r.headers["ce-id"] for r in sub.requests) == ["pass-eu", "pass-source"]
    assert letter.headers["ce-type"] == "dev.dispatcher.rabbitmq.message"
    assert svc.events("filtered") == 3
    assert svc.events("dead_lettered") == 1
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    about = [line for line in logged if line.get("ce_id", "").startswith("drop-")]
    assert {(line["event"], line["level"]) for line in about} == {("event filtered", "debug")}
    assert len(about) == 3


def test_cesql_filters_pass_and_filter_events(make_subscriber, run_service):
    """CESQL beside the other dialects: an extension compared as an integer, a
    missing attribute and an evaluation error each make the filter fail."""
    sub = make_subscriber()
    svc = run_service(
        sub.url,
        dead_letter={"sink": sub.url},
        filters=[
            {"cesql": "type LIKE 'com.example.%' AND (NOT EXISTS region OR region = 'eu')"},
            {"any": [{"cesql": "priority > 2"}, {"cesql": "INT(retries) / INT(divisor) = 0"}]},
        ],
    )
    published = {
        "pass-priority": {"ce-type": "com.example.a", "ce-priority": "3"},
        "pass-eu": {"ce-type": "com.example.b", "ce-region": "eu", "ce-priority": "5"},
        "pass-division": {
            "ce-type": "com.example.c",
            "ce-priority": "1",
            "ce-retries": "1",
            "ce-divisor": "2",
        },
        "drop-type": {"ce-type": "org.other.a", "ce-priority": "9"},
        "drop-region": {"ce-type": "com.example.a", "ce-region": "us", "ce-priority": "9"},
        "drop-priority": {"ce-type": "com.example.a", "ce-priority": "1"},
        # No priority and no divisor: a missing attribute in both, neither passes.
        "drop-missing": {"ce-type": "com.example.a"},
        # Division by zero, and a priority that is not an integer: errors, not passes.
        "drop-error": {
            "ce-type": "com.example.a",
            "ce-priority": "high",
            "ce-retries": "1",
            "ce-divisor": "0",
        },
    }
    for event_id, attributes in published.items():
        publish(svc.queue, headers={**event_headers(event_id), **attributes})
    svc.wait_events("filtered", 5)
    svc.wait_events("delivered", 3)
    wait_until(lambda: queue_depth(svc.queue) == 0, 10, "the queue to drain")
    assert sorted(r.headers["ce-id"] for r in sub.requests) == [
        "pass-division",
        "pass-eu",
        "pass-priority",
    ]
    assert svc.events("filtered") == 5
    assert svc.events("dead_lettered") == 0


def test_a_cesql_filter_of_one_boolean_extension_passes_it_in_every_content_mode(
    make_subscriber, run_service
):
    """Issue 41, the test kit's ``mybool`` on the real broker: the extension as a JSON
    Boolean (structured), as an AMQP boolean header and as the text a Knative ingress
    writes (binary) reaches the subscriber; false, text that is no Boolean, and no
    extension at all are filtered."""
    sub = make_subscriber()
    svc = run_service(sub.url, filters=[{"cesql": "mybool"}])
    structured = {"specversion": "1.0", "source": "/tests", "type": "t", "data": {}}
    for event_id, value in (("json-true", True), ("json-false", False)):
        body = json.dumps({**structured, "id": event_id, "mybool": value}).encode()
        publish(svc.queue, body, content_type="application/cloudevents+json")
    for event_id, value in (("amqp-true", True), ("text-true", "true"), ("text-TRUE", "TRUE")):
        publish(svc.queue, headers={**event_headers(event_id), "ce-mybool": value})
    for event_id, value in (("amqp-false", False), ("text-yes", "yes"), ("text-1", "1")):
        publish(svc.queue, headers={**event_headers(event_id), "ce-mybool": value})
    publish(svc.queue, headers=event_headers("absent"))
    svc.wait_events("delivered", 4)
    svc.wait_events("filtered", 5)
    wait_until(lambda: queue_depth(svc.queue) == 0, 10, "the queue to drain")
    assert sorted(sub.ids()) == ["amqp-true", "json-true", "text-TRUE", "text-true"]


def dead_letters_to_an_exchange(
    make_subscriber: Any, run_service: Any, answer: Callable[..., Reply], **service: Any
) -> tuple[Any, Any, str]:
    """A subscriber giving ``answer`` and a service dead-lettering to a fresh fanout
    exchange: (subscriber, service, the exchange's queue)."""
    sub = make_subscriber(answer)
    exchange, dlq = broker.declare_fanout_with_queue(prefix="dlx")
    svc = run_service(
        sub.url,
        dead_letter={"exchange": exchange},
        extra_queues=[dlq],
        extra_exchanges=[exchange],
        **service,
    )
    return sub, svc, dlq


def test_exhausted_retries_dead_letter_to_an_exchange_with_confirms(make_subscriber, run_service):
    sub, svc, dlq = dead_letters_to_an_exchange(
        make_subscriber,
        run_service,
        lambda _r, _i: Reply(500, body=b"x" * 5000),
        delivery={"retry": 1},
    )
    publish(svc.queue, b'{"a": 2}', headers=event_headers("d-2"))
    svc.wait_events("dead_lettered", 1)
    assert len(sub.requests) == 2
    [(props, body)] = wait_until(lambda: broker.get_all(dlq), message="the dead letter")
    assert props.headers["ce-id"] == "d-2"
    assert props.message_id == "d-2"  # as Knative's dispatcher publishes its dead letters
    assert props.headers["ce-knativeerrorcode"] == "500"
    assert len(props.headers["ce-knativeerrordata"]) == 1024  # capped
    assert props.delivery_mode == 2
    assert body == b'{"a": 2}'


def test_failed_dead_letter_is_never_acked_but_requeued(make_subscriber, run_service):
    """Sink down, no DLX: the message must come back, not be lost (invariant 1), and
    the subscriber's answer stands: its redeliveries try the dead letter again, not
    the request (issue 45), until the sink takes it."""
    sub = make_subscriber(lambda _r, i: Reply(400) if i == 0 else Reply(200))
    sink = make_subscriber(lambda _r, i: Reply(500) if i < 2 else Reply(200))
    svc = run_service(sub.url, delivery={"retry": 0}, dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("k-1"))
    svc.wait_events("dead_lettered", 1)
    assert svc.events("requeued") == 2
    assert svc.events("delivered") == 0
    assert sub.ids() == ["k-1"]
    assert [r.headers["ce-knativeerrorcode"] for r in sink.requests] == ["400"] * 3


def test_no_target_and_a_queue_dlx_rejects_into_the_dlx(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(422))
    exchange, dlq = broker.declare_fanout_with_queue(prefix="qdlx")
    svc = run_service(
        sub.url,
        declare={"dead_letter_exchange": exchange},
        extra_queues=[dlq],
        extra_exchanges=[exchange],
    )
    publish(svc.queue, headers=event_headers("x-1"))
    svc.wait_events("rejected", 1)
    [(props, _body)] = wait_until(lambda: broker.get_all(dlq), message="the broker's dead letter")
    assert props.headers["ce-id"] == "x-1"
    assert props.headers["x-death"][0]["reason"] == "rejected"


def test_malformed_event_is_dead_lettered_with_the_reason(make_subscriber, run_service):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url})
    publish(
        svc.queue, b"body", headers={"ce-specversion": "1.0", "ce-source": "/s"}
    )  # no id, no type
    [letter] = sink.wait_for(1)
    svc.wait_events("dead_lettered", 1)
    assert sub.requests == []
    assert "malformed CloudEvent" in unquote(letter.headers["ce-dispatchererror"])
    assert "missing required attribute(s): id, type" in unquote(
        letter.headers["ce-dispatchererror"]
    )
    assert letter.headers["ce-knativeerrorcode"] == "-1"
    assert letter.body == b"body"  # the original bytes survive in the wrapped letter


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"ce-subject": "a\r\nx-injected: 1"}, "control characters"),
        ({"ce-subject": b"\xff\xfe"}, "not valid UTF-8"),
        ({"ce-subject": {"nested": "table"}}, "type dict"),
    ],
)
def test_bad_header_values_are_dead_lettered(make_subscriber, run_service, headers, reason):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url})
    publish(svc.queue, headers={**event_headers("h-1"), **headers})
    [letter] = sink.wait_for(1)
    assert reason in unquote(letter.headers["ce-dispatchererror"])
    assert sub.requests == []
    svc.wait_events("dead_lettered", 1)


@pytest.mark.parametrize("sink", [True, False])
def test_a_surrogate_escaped_in_a_json_event_is_dead_lettered_not_looped(
    make_subscriber, run_service, sink
):
    """JSON can spell a lone UTF-16 surrogate (``\\ud800``), which no CloudEvents
    string may hold and no UTF-8 can carry: refused as malformed with the reason,
    through a sink or an exchange, never requeued to meet the same error again."""
    sub = make_subscriber()
    document = b'{"specversion": "1.0", "id": "s-1", "source": "/s", "type": "t\\ud800x"}'
    if sink:
        letters = make_subscriber()
        svc = run_service(sub.url, dead_letter={"sink": letters.url})
    else:
        exchange, dead = broker.declare_fanout_with_queue(prefix="sx")
        svc = run_service(
            sub.url,
            dead_letter={"exchange": exchange},
            extra_queues=[dead],
            extra_exchanges=[exchange],
        )
    publish(svc.queue, document, content_type="application/cloudevents+json")
    svc.wait_events("dead_lettered", 1)
    if sink:
        [letter] = letters.wait_for(1)
        reason = unquote(letter.headers["ce-dispatchererror"])
        assert letter.body == document  # the original bytes, wrapped
    else:
        [(props, body)] = wait_until(lambda: broker.get_all(dead), message="the dead letter")
        reason = props.headers["ce-dispatchererror"]
        assert body == document
    assert "surrogate" in reason, reason
    assert sub.requests == []


def test_oversized_body_is_dead_lettered(make_subscriber, run_service):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url}, max_body_size=1024)
    publish(svc.queue, b"x" * 2048, headers=event_headers("big-1"))
    [letter] = sink.wait_for(1)
    assert "exceeds max_body_size 1024" in unquote(letter.headers["ce-dispatchererror"])
    assert len(letter.body) == 2048
    # The event itself, found and replayed by its own id (it was a wrapper's digest).
    assert (letter.headers["ce-id"], letter.headers["ce-type"]) == ("big-1", "dev.tests.event")
    assert sub.requests == []


def test_an_oversized_structured_message_is_wrapped_unparsed(make_subscriber, run_service):
    sub, sink = make_subscriber(), make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url}, max_body_size=1024)
    document = {
        "specversion": "1.0",
        "id": "big-2",
        "source": "/s",
        "type": "t",
        "data": "x" * 2048,
    }
    body = json.dumps(document).encode()
    publish(svc.queue, body, content_type="application/cloudevents+json")
    [letter] = sink.wait_for(1)
    assert "exceeds max_body_size 1024" in unquote(letter.headers["ce-dispatchererror"])
    assert letter.headers["ce-type"] == "dev.dispatcher.rabbitmq.message"
    assert letter.body == body


def test_non_cloudevent_with_dead_letter_policy(make_subscriber, run_service):
    sub = make_subscriber()
    sink = make_subscriber()
    svc = run_service(sub.url, dead_letter={"sink": sink.url}, non_cloudevent="dead_letter")
    publish(svc.queue, b"raw", content_type="text/plain")
    [letter] = sink.wait_for(1)
    assert "not a CloudEvent" in unquote(letter.headers["ce-dispatchererror"])
    assert sub.requests == []


REPLY = {
    "ce-specversion": "1.0",
    "ce-id": "reply-1",
    "ce-source": "/subscriber",
    "ce-type": "dev.tests.reply",
    "content-type": "application/json",
}


def test_reply_is_published_to_the_reply_exchange_before_the_ack(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b'{"r": 1}'))
    exchange, replies = broker.declare_fanout_with_queue(prefix="rx")
    svc = run_service(
        sub.url, reply={"exchange": exchange}, extra_queues=[replies], extra_exchanges=[exchange]
    )
    publish(svc.queue, headers=event_headers("q-1"))
    svc.wait_events("delivered", 1)
    [(props, body)] = wait_until(lambda: broker.get_all(replies), message="the reply")
    assert props.headers["ce-id"] == "reply-1"
    assert props.headers["ce-type"] == "dev.tests.reply"
    assert props.content_type == "application/json"
    assert body == b'{"r": 1}'


def test_reply_to_a_missing_exchange_fails_the_delivery(make_subscriber, run_service):
    """Not acked as delivered: each attempt's reply failed, so the attempts are spent
    and, with no dead-letter target, the event is rejected."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b"{}"))
    svc = run_service(
        sub.url,
        reply={"exchange": broker.unique("missing")},
        delivery={"retry": 1, "backoff_delay": "10ms"},
    )
    publish(svc.queue, headers=event_headers("q-2"))
    svc.wait_events("rejected", 1)
    assert svc.events("delivered") == 0
    assert sub.ids() == ["q-2", "q-2"]


def test_reply_is_posted_to_the_reply_url(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY, body=b'{"r": 2}'))
    ingress = make_subscriber(lambda _r, _i: Reply(202))
    svc = run_service(sub.url, reply={"url": ingress.url})
    publish(svc.queue, headers=event_headers("q-3"))
    [forwarded] = ingress.wait_for(1)
    svc.wait_events("delivered", 1)
    assert forwarded.headers["ce-id"] == "reply-1"
    assert forwarded.body == b'{"r": 2}'


def test_invalid_reply_dead_letters_the_event_with_a_reason(make_subscriber, run_service):
    bad = {"ce-specversion": "1.0", "ce-source": "/subscriber", "ce-type": "t"}  # no id
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=bad, body=b"{}"))
    sink, ingress = make_subscriber(), make_subscriber()
    svc = run_service(sub.url, reply={"url": ingress.url}, dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("q-4"))
    [letter] = sink.wait_for(1)
    assert letter.headers["ce-id"] == "q-4"
    assert "invalid reply" in unquote(letter.headers["ce-dispatchererror"])
    assert ingress.requests == []
    svc.wait_events("dead_lettered", 1)


def test_parallelism_bounds_concurrent_requests(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, _i: Reply(200, delay=0.2))
    svc = run_service(sub.url, parallelism=3)
    publish_events(svc.queue, [f"p-{i}" for i in range(12)])
    svc.wait_events("delivered", 12)
    assert sub.max_concurrent == 3


def test_a_publishers_two_copies_are_both_sent_but_never_at_once(make_subscriber, run_service):
    """The soak's same-replica duplicate: the publisher sent an event twice and both
    copies were in this process together. The second is the subscriber's to judge,
    so it is sent, but after the first attempt ended, never beside it."""

    def hold_the_first(_request: Received, index: int) -> Reply:
        if index == 0:
            # Both copies are with the dispatcher before the first is answered; the
            # half second is room for a second request that must not come.
            wait_until(lambda: queue_depth(svc.queue) == 0, message="both copies taken")
            return Reply(200, delay=0.5)
        return Reply(200)

    sub = make_subscriber(hold_the_first)
    svc = run_service(sub.url, parallelism=5)
    publish(svc.queue, b"1", headers=event_headers("twice-1"))
    publish(svc.queue, b"2", headers=event_headers("twice-1"))
    first, second = sub.wait_for(2)
    svc.wait_events("delivered", 2)
    assert (first.body, second.body) == (b"1", b"2")
    assert sub.max_concurrent == 1


def test_ordered_delivers_one_at_a_time_in_queue_order_retries_included(
    make_subscriber, run_service
):
    lock = threading.Lock()
    seen: dict[str, int] = {}

    def flaky_first_try(request: Received, _i: int) -> Reply:
        with lock:
            n = seen.get(request.headers["ce-id"], 0)
            seen[request.headers["ce-id"]] = n + 1
        return Reply(503 if n == 0 else 200, delay=0.01)

    sub = make_subscriber(flaky_first_try)
    svc = run_service(sub.url, parallelism=8, ordered=True)
    ids = [f"o-{i:02d}" for i in range(10)]
    publish_events(svc.queue, ids)
    svc.wait_events("delivered", 10)
    assert sub.max_concurrent == 1
    assert sub.ids() == [i for i in ids for _ in range(2)]


def test_quorum_queue_declaration_with_delivery_limit(subscriber, run_service):
    svc = run_service(subscriber.url, declare={"type": "quorum", "delivery_limit": 3})
    publish(svc.queue, headers=event_headers("qq-1"))
    subscriber.wait_for(1)
    svc.wait_events("delivered", 1)
    with broker.channel() as ch:
        # Re-declaring with the same arguments succeeds only if they match.
        ch.queue_declare(
            svc.queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3}
        )


def test_delivery_log_line(subscriber, run_service, capsys):
    svc = run_service(subscriber.url)
    publish(svc.queue, headers=event_headers("log-1"))
    svc.wait_events("delivered", 1)
    lines = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    [line] = [entry for entry in lines if entry.get("event") == "delivery"]
    assert line["binding"] == "b"
    assert line["outcome"] == "delivered"
    assert line["ce_id"] == "log-1"
    assert line["ce_type"] == "dev.tests.event"
    assert line["ce_source"] == "/tests"
    assert line["attempts"] == 1
    assert line["status"] == 200
    assert line["redelivered"] is False
    assert line["duration_ms"] >= 0
    assert line["timestamp"].endswith("Z")


def test_startup_objects_are_kept_out_of_full_garbage_collections(run_service, subscriber):
    # A full collection walking every module and client stalled all threads for
    # tens of milliseconds (W2's p99 was 37-78 ms); frozen, they are not walked.
    before = gc.get_freeze_count()
    running = run_service(subscriber.url)
    assert gc.get_freeze_count() > before
    running.service.request_stop()
    running.service.shutdown()
    assert gc.get_freeze_count() == 0


def test_an_event_id_too_long_for_a_message_id_is_dead_lettered_without_one(
    make_subscriber, run_service
):
    """An event id has no length bound, AMQP's ``message_id`` holds 255 octets:
    pika would refuse the whole dead letter, and the message would be requeued
    for ever."""
    _sub, svc, dlq = dead_letters_to_an_exchange(
        make_subscriber, run_service, lambda _r, _i: Reply(400)
    )
    long_id = "é" * 200  # 400 octets
    publish(svc.queue, b"{}", headers=event_headers(long_id))
    svc.wait_events("dead_lettered", 1)
    [(props, _body)] = wait_until(lambda: broker.get_all(dlq), message="the dead letter")
    assert props.headers["ce-id"] == long_id
    assert props.message_id is None


def test_the_default_exchange_is_a_dead_letter_target(make_subscriber, run_service):
    # `exchange: ""` is AMQP's default exchange (routing key = queue name), not "none".
    sub = make_subscriber(lambda _r, _i: Reply(400))
    dlq = broker.unique("default-dlq")
    with broker.channel() as ch:
        ch.queue_declare(dlq)
    svc = run_service(sub.url, dead_letter={"exchange": "", "routing_key": dlq}, extra_queues=[dlq])
    publish(svc.queue, b"{}", headers=event_headers("dflt-1"))
    wait_until(lambda: queue_depth(dlq) == 1, message="the dead letter in the queue")
    svc.wait_events("dead_lettered", 1)
    ((properties, _body),) = broker.get_all(dlq)
    assert properties.headers["ce-id"] == "dflt-1"
