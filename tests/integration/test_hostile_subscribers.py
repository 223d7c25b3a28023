"""Issue 11: hostile subscribers never crash the service, hang a delivery past its
attempt timeout, or lose a message. Each answer below comes from a raw-socket
server; the service retries it (a failed attempt) and then dead-letters the
event to a well-behaved sink, or delivers it where RFC 9112 reads the answer
as a valid one. The client-level tests (tests/unit/test_httpclient.py) show
how libcurl reads each.
"""

from __future__ import annotations

import time

import pytest

from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.raw_http import RawServer, Step, drip

pytestmark = pytest.mark.broker

BIG_HEADER = b"x-big: " + b"a" * 200_000 + b"\r\n"

FAILED_ATTEMPTS: dict[str, list[Step]] = {
    "invalid-chunk-size": [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", None],
    "no-crlf-after-chunk": [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
        None,
    ],
    "header-line-past-curls-limit": [b"HTTP/1.1 200 OK\r\n" + BIG_HEADER + b"\r\n", None],
    "closed-half-way-through-a-body": [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-part",
        None,
    ],
    "garbage-instead-of-a-status-line": [b"\x00\x01garbage\r\n\r\n", None],
    "body-drips-a-byte-a-second": [
        b"HTTP/1.1 200 OK\r\ncontent-length: 60\r\n\r\n",
        *drip(b"x" * 60, 1.0),
    ],
}


@pytest.mark.parametrize("answer", sorted(FAILED_ATTEMPTS))
def test_a_hostile_answer_is_a_failed_attempt_then_a_dead_letter(
    answer, make_subscriber, run_service
):
    hostile = RawServer(lambda _i: FAILED_ATTEMPTS[answer])
    sink = make_subscriber()
    try:
        svc = run_service(
            hostile.url(),
            dead_letter={"sink": sink.url},
            delivery={"retry": 1, "backoff_delay": "10ms", "backoff_max": "50ms", "timeout": "1s"},
        )
        started = time.monotonic()
        publish(svc.queue, headers=event_headers("hostile-1"), body=b'{"n": 1}')
        svc.wait_events("dead_lettered", 1, timeout=15)
        # Two attempts, each bounded by its 1 s budget, then the sink.
        assert time.monotonic() - started < 6
        assert len(hostile.requests) == 2
        [letter] = sink.wait_for(1)
        assert letter.headers["ce-id"] == "hostile-1"
        assert letter.headers["ce-knativeerrorcode"] == "-1"
        assert letter.body == b'{"n": 1}'  # the original event, not lost
        assert svc.value("dispatcher_delivery_attempts_total", binding="b", code_class="error") == 2
        wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
    finally:
        hostile.close()


DELIVERIES: dict[str, list[Step]] = {
    # RFC 9112 6.3: Transfer-Encoding overrides Content-Length.
    "content-length-and-transfer-encoding": [
        b"HTTP/1.1 202 OK\r\ncontent-length: 999\r\ntransfer-encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    ],
    # A header line of 100 KB is legal (no limit in RFC 9112; libcurl allows 100 KiB).
    "a-100KB-header-line": [
        b"HTTP/1.1 202 OK\r\nx-big: " + b"a" * 100_000 + b"\r\ncontent-length: 0\r\n\r\n"
    ],
    # A 2xx is the answer, however large its body: read up to max_body_size, no further.
    "a-2xx-body-over-max-body-size": [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10000000\r\n\r\n",
        *([b"y" * 65536] * 160),
    ],
}


@pytest.mark.parametrize("answer", sorted(DELIVERIES))
def test_answers_rfc_9112_reads_as_valid_are_deliveries(answer, run_service):
    hostile = RawServer(lambda _i: DELIVERIES[answer])
    try:
        svc = run_service(hostile.url(), max_body_size="64KiB", delivery={"retry": 0})
        publish(svc.queue, headers=event_headers("valid-1"))
        svc.wait_events("delivered", 1)
        assert len(hostile.requests) == 1
        wait_until(lambda: queue_depth(svc.queue) == 0, message="the message acked")
        if answer == "a-2xx-body-over-max-body-size":
            assert hostile.send_failed.wait(10)  # curl stopped reading at the limit
    finally:
        hostile.close()
