"""Knative's data-plane contract (``specs/eventing/data-plane.md``), the sender's side.

One test per requirement that applies to a Trigger's dispatcher, named
``test_dp_<section>_<requirement>``; ``docs/conformance.md`` lists every row of
the document, these and the ones that do not apply (and why). Each runs the
service on the shared broker against real HTTP servers in this process.
"""

from __future__ import annotations

import itertools
import json
import urllib.request

import pytest

from tests.conformance.common import REPLY_EVENT, delivery
from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


# ----------------------------------------------------------------- Background


def test_dp_background_http11_and_the_cloudevents_http_binding(subscriber, run_service):
    """MUST: HTTP/1.1 and the CloudEvents HTTP binding 1.0 (binary mode: every
    attribute a ``ce-`` header, ``datacontenttype`` the Content-Type, the data
    the body)."""
    svc = run_service(subscriber.url)
    publish(svc.queue, b'{"n": 1}', headers=event_headers("dp-1", **{"ce-region": "eu"}))
    [request] = subscriber.wait_for(1)
    assert request.version == "HTTP/1.1"
    assert request.method == "POST"
    assert request.headers["ce-specversion"] == "1.0"
    assert (request.headers["ce-id"], request.headers["ce-source"]) == ("dp-1", "/tests")
    assert request.headers["ce-type"] == "dev.tests.event"
    assert request.headers["ce-region"] == "eu"
    assert request.headers["content-type"] == "application/json"
    assert request.body == b'{"n": 1}'


def test_dp_background_unrecognised_negotiation_is_ignored(make_subscriber, run_service):
    """SHOULD: ignore negotiation options it does not know (an ``Upgrade`` header
    in the answer): the answer is a 200 like any other."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers={"upgrade": "h2c, websocket"}))
    svc = run_service(sub.url)
    publish(svc.queue, headers=event_headers("dp-2"))
    svc.wait_events("delivered", 1)
    assert len(sub.requests) == 1


# ----------------------------------------------------------------- Event Delivery


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_dp_minimum_supported_protocol_both_content_modes(subscriber, run_service, mode):
    """MUST: both content modes of the CloudEvents HTTP binding."""
    svc = run_service(subscriber.url, content_mode=mode)
    publish(svc.queue, b'{"n": 2}', headers=event_headers("dp-3"))
    [request] = subscriber.wait_for(1)
    if mode == "binary":
        assert request.headers["ce-id"] == "dp-3"
        assert request.body == b'{"n": 2}'
    else:
        assert request.headers["content-type"].startswith("application/cloudevents+json")
        document = json.loads(request.body)
        assert (document["id"], document["specversion"]) == ("dp-3", "1.0")
        assert document["data"] == {"n": 2}
        assert not any(name.startswith("ce-") for name in request.headers)


def test_dp_http_verbs_post(subscriber, run_service):
    """MUST: the event is sent with POST (the test server answers only POST, and
    records the method of every request it gets)."""
    svc = run_service(subscriber.url)
    publish(svc.queue, headers=event_headers("dp-4"))
    svc.wait_events("delivered", 1)
    assert [r.method for r in subscriber.requests] == ["POST"]


# (status, retried?, outcome): the table of "Event Acknowledgement and Delivery Retry".
STATUS_TABLE = [
    (200, False, "delivered"),
    (202, False, "delivered"),
    (204, False, "delivered"),
    (301, False, "dead_lettered"),  # 3xx: an error, not retried
    (400, False, "dead_lettered"),
    (403, False, "dead_lettered"),  # other 4xx
    (404, True, "dead_lettered"),
    (409, True, "dead_lettered"),
    (429, True, "dead_lettered"),
    (500, True, "dead_lettered"),
    (503, True, "dead_lettered"),
]


@pytest.mark.parametrize(("status", "retried", "outcome"), STATUS_TABLE)
def test_dp_acknowledgement_and_retry_the_status_table(
    make_subscriber, run_service, status, retried, outcome
):
    """MUST: the answer's status decides: 2xx completes the delivery; 404, 409,
    429 and 5xx are retried; 400, other 4xx and 3xx are errors, not retried."""
    sub = make_subscriber(
        lambda _r, _i: Reply(
            status, headers={"location": "http://elsewhere/"} if status < 400 else {}
        )
    )
    sink = make_subscriber()
    svc = run_service(sub.url, delivery=delivery(retry=2), dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("dp-5"))
    svc.wait_events(outcome, 1)
    assert len(sub.requests) == (3 if retried else 1)
    assert len(sink.requests) == (1 if outcome == "dead_lettered" else 0)


@pytest.mark.parametrize("status", [600, 999])
def test_dp_acknowledgement_and_retry_a_code_not_in_the_table_is_retried(
    make_subscriber, run_service, status
):
    """SHOULD: a code the table does not list is a retriable error (a status
    outside 100-599 belongs to no class: it counts as a 5xx)."""
    raw = make_raw_server(status)
    try:
        sink = make_subscriber()
        svc = run_service(raw.url, delivery=delivery(retry=2), dead_letter={"sink": sink.url})
        publish(svc.queue, headers=event_headers("dp-6"))
        svc.wait_events("dead_lettered", 1)
        assert raw.requests() == 3
        assert svc.value("dispatcher_delivery_attempts_total", binding="b", code_class="5xx") == 3
    finally:
        raw.close()


def test_dp_acknowledgement_and_retry_duplicates_are_told_by_source_and_id(
    make_subscriber, run_service
):
    """MUST (where duplicates are detected): by ``source`` and ``id`` together.
    The service suppresses redeliveries of events it already delivered; an event
    with the same id from another source is not one of them: redelivered (its
    first attempt failed and its dead-letter sink too), it is not suppressed but
    carried on, its own answer standing: dead-lettered once the sink takes it."""

    def answer(request, _index):
        return Reply(503 if request.headers["ce-source"] == "/b" else 200)

    sub = make_subscriber(answer)
    sink = make_subscriber(lambda _r, i: Reply(500 if i == 0 else 200))
    svc = run_service(
        sub.url, parallelism=1, delivery=delivery(retry=0), dead_letter={"sink": sink.url}
    )
    publish(svc.queue, headers=event_headers("same-id", **{"ce-source": "/a"}))
    svc.wait_events("delivered", 1)
    publish(svc.queue, headers=event_headers("same-id", **{"ce-source": "/b"}))
    svc.wait_events("dead_lettered", 1)
    assert svc.events("requeued") == 1
    assert [r.headers["ce-source"] for r in sub.requests] == ["/a", "/b"]
    assert [r.headers["ce-source"] for r in sink.requests] == ["/b", "/b"]
    assert svc.value("dispatcher_duplicates_suppressed_total", binding="b") == 0


def test_dp_acknowledgement_and_retry_retryable_answers_are_retried(make_subscriber, run_service):
    """SHOULD: re-attempt delivery after a retryable status; the event is
    delivered by the attempt that succeeds."""
    sub = make_subscriber(lambda _r, i: Reply(503) if i < 2 else Reply(202))
    svc = run_service(sub.url, delivery=delivery(retry=3))
    publish(svc.queue, headers=event_headers("dp-7"))
    svc.wait_events("delivered", 1)
    assert [r.headers["ce-id"] for r in sub.requests] == ["dp-7"] * 3


def test_dp_acknowledgement_and_retry_congestion_control_is_exponential_backoff(
    make_subscriber, run_service
):
    """RECOMMENDED: congestion control such as exponential backoff: the waits
    between attempts double (100, 200, 400 ms, give or take the 20 % jitter)."""
    sub = make_subscriber(lambda _r, _i: Reply(503))
    sink = make_subscriber()
    svc = run_service(
        sub.url,
        delivery={"retry": 3, "backoff_delay": "100ms", "backoff_max": "5s", "timeout": "2s"},
        dead_letter={"sink": sink.url},
    )
    publish(svc.queue, headers=event_headers("dp-8"))
    svc.wait_events("dead_lettered", 1)
    gaps = arrival_gaps(sub)
    for gap, base in zip(gaps, (0.1, 0.2, 0.4), strict=True):
        assert base * 0.8 <= gap <= base * 1.2 + 0.25, gaps  # slack: a loaded machine


def test_dp_acknowledgement_and_retry_brokers_implement_retries_and_congestion_control(
    make_subscriber, run_service
):
    """MUST (brokers and channels): retries, and congestion control: a failing
    subscriber never has more than ``parallelism`` requests at once, retries
    included, and each event is retried ``retry`` times."""
    sub = make_subscriber(lambda _r, _i: Reply(503, delay=0.05))
    sink = make_subscriber()
    svc = run_service(
        sub.url, parallelism=3, delivery=delivery(retry=2), dead_letter={"sink": sink.url}
    )
    ids = [f"dp-9-{n}" for n in range(9)]
    broker.publish_events(svc.queue, ids)
    svc.wait_events("dead_lettered", 9, timeout=30)
    assert sub.max_concurrent <= 3
    assert sorted(sub.ids()) == sorted(ids * 3)


# ----------------------------------------------------------------- Observability


def test_dp_observability_trace_context_passes_through(subscriber, run_service):
    """MAY (senders may update ``traceparent``/``tracestate``): with tracing off
    they reach the subscriber exactly as the message carried them."""
    svc = run_service(subscriber.url)
    headers = event_headers("dp-10", traceparent=TRACEPARENT, tracestate="k=v")
    publish(svc.queue, headers=headers)
    [request] = subscriber.wait_for(1)
    assert (request.headers["traceparent"], request.headers["tracestate"]) == (TRACEPARENT, "k=v")


def test_dp_observability_delivery_telemetry_is_exposed(subscriber, run_service):
    """SHOULD: expose event-delivery telemetry: Prometheus metrics on the ops
    listener count every outcome and attempt."""
    svc = run_service(subscriber.url)
    publish(svc.queue, headers=event_headers("dp-11"))
    svc.wait_events("delivered", 1)
    port = svc.service.ops.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    assert 'dispatcher_events_total{binding="b",outcome="delivered"} 1.0' in text
    assert 'dispatcher_delivery_attempts_total{binding="b",code_class="2xx"} 1.0' in text


# ----------------------------------------------------------------- Derived (Reply) Events


def test_dp_derived_events_brokers_send_prefer_reply_to_the_subscriber(
    make_subscriber, run_service
):
    """MUST (brokers and channels): ``Prefer: reply`` on every request to the
    subscriber, retries included; not on the dead-letter sink's."""
    sub = make_subscriber(lambda _r, i: Reply(503) if i == 0 else Reply(400))
    sink = make_subscriber()
    svc = run_service(sub.url, delivery=delivery(retry=2), dead_letter={"sink": sink.url})
    publish(svc.queue, headers=event_headers("dp-12"))
    svc.wait_events("dead_lettered", 1)
    assert [r.headers.get("prefer") for r in sub.requests] == ["reply", "reply"]
    assert "prefer" not in sink.requests[0].headers


def test_dp_derived_events_a_sender_that_reads_replies_says_so(make_subscriber, run_service):
    """MUST: a sender that processes reply events includes ``Prefer: reply``."""
    sub = make_subscriber(lambda _r, _i: Reply(200, headers=REPLY_EVENT, body=b"{}"))
    ingress = make_subscriber()
    svc = run_service(sub.url, reply={"url": ingress.url})
    publish(svc.queue, headers=event_headers("dp-13"))
    ingress.wait_for(1)
    assert sub.requests[0].headers["prefer"] == "reply"


def test_dp_derived_events_a_202_is_never_a_reply(make_subscriber, run_service):
    """MUST NOT: a 202 is not processed as a reply, even with a CloudEvent in it."""
    sub = make_subscriber(lambda _r, _i: Reply(202, headers=REPLY_EVENT, body=b"{}"))
    ingress = make_subscriber()
    svc = run_service(sub.url, reply={"url": ingress.url})
    publish(svc.queue, headers=event_headers("dp-14"))
    svc.wait_events("delivered", 1)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    assert ingress.requests == []


# ----------------------------------------------------------------- helpers


def arrival_gaps(sub) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(sub.requests)]


class RawServer:
    """Answers every request with a status line no HTTP library would write."""

    def __init__(self, status: int) -> None:
        import socket
        import threading

        self._status = status
        self._count = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/"
        threading.Thread(target=self._serve, daemon=True).start()

    def requests(self) -> int:
        with self._lock:
            return self._count

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                with self._lock:
                    self._count += 1
                answer = (
                    f"HTTP/1.1 {self._status} Odd\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                )
                conn.sendall(answer.encode())

    def close(self) -> None:
        self._server.close()


def make_raw_server(status: int) -> RawServer:
    return RawServer(status)
