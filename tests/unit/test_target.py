"""HTTP attempts against a real local server: retries, timeouts, deadlines, bodies.

Each test drives the delivery coroutine on a loop run in the test thread.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest

from dispatcher.config import CircuitBreakerSettings, DeliverySettings
from dispatcher.delivery.breaker import CircuitBreaker, CircuitState
from dispatcher.delivery.seams import Accept, Refusal, Response, Result, Sent
from dispatcher.delivery.waits import Waits
from dispatcher.event.cloudevent import HttpRequestParts
from dispatcher.http.client import HttpClient
from dispatcher.http.endpoint import Endpoint
from dispatcher.http.target import ERROR_BODY_LIMIT, HttpTarget
from dispatcher.loop import Loop
from tests.support.subscriber import Reply

REQUEST = HttpRequestParts({"ce-id": "1"}, b"{}")


@dataclass
class Engine:
    loop: Loop
    http: HttpClient
    waits: Waits

    def send(
        self, target: HttpTarget, request: HttpRequestParts = REQUEST, accept: Accept | None = None
    ) -> Sent:
        return self.loop.run_until_complete(target.send(request, accept))


@pytest.fixture
def client():
    loop = Loop()
    engine = Engine(loop, HttpClient(loop, 10), Waits(loop))
    yield engine
    engine.http.close()
    loop.close()


def target(client, url, observed=None, **delivery):
    settings = DeliverySettings(
        **{"retry": 2, "backoff_delay": 0.01, "backoff_max": 0.05, "timeout": 1.0, **delivery}
    )
    return HttpTarget(
        client.http,
        Endpoint(url),
        settings,
        client.waits,
        observe=(lambda s, d: observed.append(s)) if observed is not None else None,
    )


def test_success_on_first_attempt(client, subscriber):
    observed: list[int] = []
    outcome = client.send(target(client, subscriber.url, observed=observed))
    assert outcome.result is Result.DELIVERED
    assert outcome.attempts == 1
    assert observed == [200]
    assert subscriber.requests[0].headers["ce-id"] == "1"


def test_retries_until_exhausted(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503, body=b"busy"))
    outcome = client.send(target(client, sub.url, retry=3))
    assert outcome.result is Result.FAILED
    assert outcome.attempts == 4
    assert outcome.last.status == 503
    assert outcome.last.body == b"busy"


def test_non_retryable_fails_at_once(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(302, headers={"location": "http://elsewhere/"}))
    outcome = client.send(target(client, sub.url, retry=5))
    assert (outcome.result, outcome.attempts, outcome.last.status) == (Result.FAILED, 1, 302)


def test_per_attempt_timeout_is_retried_as_no_status(client, make_subscriber):
    sub = make_subscriber(lambda _r, i: Reply(200, delay=2.0) if i == 0 else Reply(200))
    started = time.monotonic()
    outcome = client.send(target(client, sub.url, timeout=0.3))
    assert outcome.result is Result.DELIVERED
    assert outcome.attempts == 2
    assert time.monotonic() - started < 1.5


def test_slow_drip_body_is_cut_at_the_attempt_budget(client):
    """Socket timeouts are per read; our clock bounds the whole attempt."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        while not stop.wait(0.1):
            try:
                conn.sendall(b"x")
            except OSError:
                return
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    try:
        started = time.monotonic()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        outcome = client.send(target(client, url, retry=0, timeout=0.5))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        server.close()
    assert outcome.last.status is None
    assert outcome.last.error == "timeout"
    assert elapsed < 1.5


def test_connection_refused_is_retried_as_no_status(client):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    outcome = client.send(target(client, f"http://127.0.0.1:{port}/", retry=1))
    assert outcome.result is Result.FAILED
    assert outcome.attempts == 2
    assert outcome.last.status is None
    assert outcome.last.error


def test_retry_after_is_honoured(client, make_subscriber):
    sub = make_subscriber(
        lambda _r, i: Reply(429, headers={"retry-after": "1"}) if i == 0 else Reply(200)
    )
    started = time.monotonic()
    outcome = client.send(target(client, sub.url, backoff_max=5.0))
    assert outcome.result is Result.DELIVERED
    assert sub.requests[1].at - sub.requests[0].at >= 0.95
    assert time.monotonic() - started < 3


def test_retry_after_is_capped_by_backoff_max(client, make_subscriber):
    sub = make_subscriber(
        lambda _r, i: Reply(503, headers={"retry-after": "3600"}) if i == 0 else Reply(200)
    )
    outcome = client.send(target(client, sub.url, backoff_max=0.2))
    assert outcome.result is Result.DELIVERED
    assert sub.requests[1].at - sub.requests[0].at < 1.0


def test_shutdown_abandons_a_retry_wait(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503))
    t = target(client, sub.url, retry=5, backoff_delay=10.0, backoff_max=10.0)
    client.loop.call_later(0.2, client.waits.give_up)
    started = time.monotonic()
    outcome = client.send(t)
    assert outcome.result is Result.ABANDONED
    assert time.monotonic() - started < 2


def test_overall_deadline_bounds_the_delivery(make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503))
    settings = DeliverySettings(retry=5, backoff_delay=0.01, backoff_max=0.01, timeout=0.1)
    real = time.monotonic
    skew = [0.0]

    def clock() -> float:
        # Every reading is 0.2 s later than the one before: attempts overrun their
        # budget, as a trickling subscriber would make them, and the deadline must
        # stop the retries.
        skew[0] += 0.2
        return real() + skew[0]

    loop = Loop(clock=clock)
    engine = Engine(loop, HttpClient(loop, 10), Waits(loop))
    t = HttpTarget(engine.http, Endpoint(sub.url), settings, engine.waits)
    assert t.deadline_seconds() == pytest.approx(6 * 0.1 + 5 * 0.01)
    outcome = engine.send(t)
    engine.http.close()
    loop.close()
    assert outcome.result is Result.FAILED
    assert outcome.attempts < 6


def test_error_bodies_are_truncated(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(400, body=b"e" * (ERROR_BODY_LIMIT * 3)))
    outcome = client.send(target(client, sub.url))
    assert len(outcome.last.body) == ERROR_BODY_LIMIT
    assert outcome.last.truncated


def test_user_agent_and_headers_are_sent(client, subscriber):
    client.send(
        target(client, subscriber.url), HttpRequestParts({"ce-id": "7", "x-a": "b"}, b"body")
    )
    [request] = subscriber.requests
    assert request.headers["user-agent"] == "dispatcher"
    assert request.headers["ce-id"] == "7"
    assert request.headers["content-length"] == "4"
    assert request.body == b"body"
    # Nothing curl would add on its own: no form content type, no 100-continue.
    assert "content-type" not in request.headers
    assert "expect" not in request.headers


# ----------------------------------------------------------------------------- accept


def refusing(*answers: Refusal | None, pause: float = 0.0, waits: Waits | None = None):
    """An ``accept`` that answers each 2xx with the next of ``answers`` (the last one
    again once they run out), after ``pause`` seconds on the loop; records the statuses."""
    seen: list[int | None] = []

    async def accept(response: Response) -> Refusal | None:
        seen.append(response.status)
        if pause:
            assert waits is not None
            await waits.sleep(pause)
        return answers[min(len(seen), len(answers)) - 1]

    return accept, seen


def test_a_refused_2xx_is_a_failed_attempt_within_the_same_retry_budget(client, subscriber):
    """A reply that cannot be forwarded: the subscriber gets the event again, at most
    ``retry + 1`` times in all, and the outcome carries why."""
    refusal = Refusal("reply URL answered 503 (HTTP)", retry=True, status=503, body=b"down")
    accept, seen = refusing(refusal)
    outcome = client.send(target(client, subscriber.url, retry=2), accept=accept)
    assert (outcome.result, outcome.attempts, outcome.refusal) == (Result.FAILED, 3, refusal)
    assert outcome.last.status == 200
    assert len(subscriber.requests) == 3
    assert seen == [200, 200, 200]


def test_a_refused_2xx_is_not_sent_again_once_its_message_is_gone(client, subscriber):
    """The reply was not forwarded and, by the end of the retry wait, the message's
    channel has closed: the broker's redelivery is the copy that forwards the reply
    (issue 45), so no second request goes from here."""
    refusal = Refusal("reply publish failed: connection lost", retry=True)
    accept, seen = refusing(refusal)
    gone = target(client, subscriber.url, retry=5)
    outcome = client.loop.run_until_complete(gone.send(REQUEST, accept, lambda: False))
    assert (outcome.result, outcome.attempts, outcome.refusal) == (Result.ABANDONED, 1, refusal)
    assert len(subscriber.requests) == len(seen) == 1
    # A retry for the subscriber's own failure is not the reply's: it goes on.
    failing = target(client, "http://127.0.0.1:9/", retry=1)
    outcome = client.loop.run_until_complete(failing.send(REQUEST, None, lambda: False))
    assert (outcome.result, outcome.attempts) == (Result.FAILED, 2)


def test_a_refusal_that_no_attempt_can_mend_ends_at_once(client, subscriber):
    refusal = Refusal("invalid reply: no id", retry=False, status=200)
    accept, _seen = refusing(refusal)
    outcome = client.send(target(client, subscriber.url, retry=5), accept=accept)
    assert (outcome.result, outcome.attempts, outcome.refusal) == (Result.FAILED, 1, refusal)
    assert len(subscriber.requests) == 1


def test_a_refusal_then_an_acceptance_is_delivered(client, subscriber):
    accept, seen = refusing(Refusal("reply publish failed: nacked", retry=True), None)
    outcome = client.send(target(client, subscriber.url, retry=5), accept=accept)
    assert (outcome.result, outcome.attempts, outcome.refusal) == (Result.DELIVERED, 2, None)
    assert len(subscriber.requests) == len(seen) == 2


def test_time_taken_by_accept_does_not_use_up_the_subscribers_deadline(client, subscriber):
    """The deadline is (retry + 1) * timeout + retry * backoff_max = 0.7 s here; three
    refusals of 0.4 s each take longer, and still every attempt is made: the reply's
    own target bounds its time, not the subscriber's deadline."""
    refusal = Refusal("reply URL answered -1 (timed out)", retry=True)
    accept, seen = refusing(refusal, pause=0.4, waits=client.waits)
    deliver = target(client, subscriber.url, retry=2, timeout=0.2)
    assert deliver.deadline_seconds() == pytest.approx(0.7)
    outcome = client.send(deliver, accept=accept)
    assert (outcome.result, outcome.attempts) == (Result.FAILED, 3)
    assert len(seen) == 3


def test_a_status_outside_every_http_class_is_retried_as_5xx(client):
    """curl hands over any three-digit status; a 600 is a broken server, so it is
    retried like a 500 (and counted as 5xx), not dead-lettered at once."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    answered: list[int] = []

    def answer() -> None:
        for status in (600, 999, 200):
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(f"HTTP/1.1 {status} Odd\r\ncontent-length: 0\r\n\r\n".encode())
            answered.append(status)
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    observed: list[int | None] = []
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        outcome = client.send(target(client, url, observed=observed, retry=3))
    finally:
        server.close()
    assert (outcome.result, outcome.attempts) == (Result.DELIVERED, 3)
    assert observed == [600, 999, 200]


# ----------------------------------------------------------------------------- the breaker


def breaker_target(client, url, breaker: CircuitBreaker, **delivery) -> HttpTarget:
    settings = DeliverySettings(
        **{"retry": 2, "backoff_delay": 0.01, "backoff_max": 0.05, "timeout": 0.5, **delivery}
    )
    return HttpTarget(client.http, Endpoint(url), settings, client.waits, breaker=breaker)


def quick_breaker(client) -> CircuitBreaker:
    settings = CircuitBreakerSettings(
        failure_ratio=0.5, min_attempts=1, window=10.0, open_for=0.02, max_open=0.02
    )
    return CircuitBreaker(settings, client.loop, lambda *_: None)


def test_failed_probes_spend_neither_retries_nor_the_deadline(client, make_subscriber):
    """Retry 2 and a deadline of 3 x 0.5 s + 2 x 0.05 s = 1.6 s: twelve slow 503s
    (0.15 s each, 1.8 s in all) after the first would exhaust both if the probes'
    failures were the event's. They are the breaker's: the 13th request delivers."""
    sub = make_subscriber(lambda _r, i: Reply(503 if i < 12 else 200, delay=0.15))
    breaker = quick_breaker(client)
    outcome = client.send(breaker_target(client, sub.url, breaker))
    assert outcome.result is Result.DELIVERED
    assert outcome.attempts == 13
    assert breaker.state is CircuitState.CLOSED


def test_a_delivery_whose_channel_went_while_held_is_abandoned_unsent(client, make_subscriber):
    sub = make_subscriber(lambda _r, i: Reply(503 if i == 0 else 200))
    breaker = quick_breaker(client)
    wanted = [True]

    async def deliver() -> Sent:
        t = breaker_target(client, sub.url, breaker)
        return await t.send(REQUEST, None, lambda: wanted[0])

    wanted[0] = False  # the channel closes while the first attempt fails
    outcome = client.loop.run_until_complete(deliver())
    assert outcome.result is Result.ABANDONED
    assert len(sub.requests) == 1  # the probe went to nobody: no second request


def test_held_past_hold_max_is_returned(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503))
    settings = CircuitBreakerSettings(
        failure_ratio=0.5, min_attempts=1, window=10.0, open_for=60.0, max_open=60.0
    )
    breaker = CircuitBreaker(settings, client.loop, lambda *_: None, hold_max=0.3)
    started = time.monotonic()
    outcome = client.send(breaker_target(client, sub.url, breaker))
    assert outcome.result is Result.RETURNED
    assert outcome.attempts == 1 and len(sub.requests) == 1
    assert 0.3 <= time.monotonic() - started < 5


def test_a_probe_whose_attempt_raised_goes_to_the_next_attempt(client, make_subscriber):
    """A bug during the probe's attempt (here the attempt observer) must not keep
    the breaker half-open for ever, holding every later message until hold_max."""
    sub = make_subscriber(lambda _r, i: Reply(503 if i == 0 else 200))
    settings = CircuitBreakerSettings(
        failure_ratio=0.5, min_attempts=1, window=10.0, open_for=0.02, max_open=0.02
    )
    breaker = CircuitBreaker(settings, client.loop, lambda *_: None, hold_max=2.0)
    calls: list[int | None] = []

    def observe(status: int | None, _seconds: float) -> None:
        calls.append(status)
        if len(calls) == 2:  # the probe's attempt
            raise RuntimeError("boom")

    delivery = DeliverySettings(retry=2, backoff_delay=0.01, backoff_max=0.05, timeout=0.5)
    target = HttpTarget(
        client.http, Endpoint(sub.url), delivery, client.waits, observe=observe, breaker=breaker
    )

    async def raising() -> str:
        try:
            await target.send(REQUEST)
        except RuntimeError:
            return "raised"
        return "returned"

    assert client.loop.run_until_complete(raising()) == "raised"
    outcome = client.send(target)
    assert outcome.result is Result.DELIVERED
    assert breaker.state is CircuitState.CLOSED
