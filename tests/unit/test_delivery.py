"""HTTP attempts against a real local server: retries, timeouts, deadlines, bodies."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dispatcher.config import DeliverySettings, TlsSettings
from dispatcher.delivery import ERROR_BODY_LIMIT, HttpTarget, Result, ThreadClients
from dispatcher.events import HttpRequestParts
from dispatcher.http11 import Connections
from tests.support.subscriber import Reply

REQUEST = HttpRequestParts({"ce-id": "1"}, b"{}")


@pytest.fixture
def client():
    c = ThreadClients(TlsSettings())
    yield c
    c.close()


def target(client, url, stopping=None, observed=None, **delivery):
    settings = DeliverySettings(
        **{"retry": 2, "backoff_delay": 0.01, "backoff_max": 0.05, "timeout": 1.0, **delivery}
    )
    return HttpTarget(
        client,
        url,
        settings,
        stopping or threading.Event(),
        observe=(lambda s, d: observed.append(s)) if observed is not None else None,
    )


def test_success_on_first_attempt(client, subscriber):
    observed: list[int] = []
    outcome = target(client, subscriber.url, observed=observed).send(REQUEST)
    assert outcome.result is Result.DELIVERED
    assert outcome.attempts == 1
    assert observed == [200]
    assert subscriber.requests[0].headers["ce-id"] == "1"


def test_retries_until_exhausted(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503, body=b"busy"))
    outcome = target(client, sub.url, retry=3).send(REQUEST)
    assert outcome.result is Result.FAILED
    assert outcome.attempts == 4
    assert outcome.last.status == 503
    assert outcome.last.body == b"busy"


def test_non_retryable_fails_at_once(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(302, headers={"location": "http://elsewhere/"}))
    outcome = target(client, sub.url, retry=5).send(REQUEST)
    assert (outcome.result, outcome.attempts, outcome.last.status) == (Result.FAILED, 1, 302)


def test_per_attempt_timeout_is_retried_as_minus_one(client, make_subscriber):
    sub = make_subscriber(lambda _r, i: Reply(200, delay=2.0) if i == 0 else Reply(200))
    started = time.monotonic()
    outcome = target(client, sub.url, timeout=0.3).send(REQUEST)
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
        outcome = target(
            client, f"http://127.0.0.1:{server.getsockname()[1]}/", retry=0, timeout=0.5
        ).send(REQUEST)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        server.close()
    assert outcome.last.status == -1
    assert outcome.last.error == "timeout"
    assert elapsed < 1.5


def test_connection_refused_is_retried_as_minus_one(client):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    outcome = target(client, f"http://127.0.0.1:{port}/", retry=1).send(REQUEST)
    assert outcome.result is Result.FAILED
    assert outcome.attempts == 2
    assert outcome.last.status == -1
    assert outcome.last.error


def test_retry_after_is_honoured(client, make_subscriber):
    sub = make_subscriber(
        lambda _r, i: Reply(429, headers={"retry-after": "1"}) if i == 0 else Reply(200)
    )
    started = time.monotonic()
    outcome = target(client, sub.url, backoff_max=5.0).send(REQUEST)
    assert outcome.result is Result.DELIVERED
    assert sub.requests[1].at - sub.requests[0].at >= 0.95
    assert time.monotonic() - started < 3


def test_retry_after_is_capped_by_backoff_max(client, make_subscriber):
    sub = make_subscriber(
        lambda _r, i: Reply(503, headers={"retry-after": "3600"}) if i == 0 else Reply(200)
    )
    outcome = target(client, sub.url, backoff_max=0.2).send(REQUEST)
    assert outcome.result is Result.DELIVERED
    assert sub.requests[1].at - sub.requests[0].at < 1.0


def test_shutdown_abandons_a_retry_wait(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503))
    stopping = threading.Event()
    t = target(client, sub.url, stopping=stopping, retry=5, backoff_delay=10.0, backoff_max=10.0)
    threading.Timer(0.2, stopping.set).start()
    started = time.monotonic()
    outcome = t.send(REQUEST)
    assert outcome.result is Result.ABANDONED
    assert time.monotonic() - started < 2


def test_overall_deadline_bounds_the_delivery(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(503))
    settings = DeliverySettings(retry=5, backoff_delay=0.01, backoff_max=0.01, timeout=0.1)
    ticks = iter(range(1_000_000))
    # A clock on which every reading is 0.2 s later: attempts overrun their budget,
    # as a trickling subscriber would make them, and the deadline must stop the retries.
    t = HttpTarget(client, sub.url, settings, threading.Event(), clock=lambda: next(ticks) * 0.2)
    assert t.deadline_seconds() == pytest.approx(6 * 0.1 + 5 * 0.01)
    outcome = t.send(REQUEST)
    assert outcome.result is Result.FAILED
    assert outcome.attempts < 6


def test_error_bodies_are_truncated(client, make_subscriber):
    sub = make_subscriber(lambda _r, _i: Reply(400, body=b"e" * (ERROR_BODY_LIMIT * 3)))
    outcome = target(client, sub.url).send(REQUEST)
    assert len(outcome.last.body) == ERROR_BODY_LIMIT
    assert outcome.last.truncated


def test_proxy_settings_in_the_environment_are_ignored(client, subscriber, monkeypatch):
    # A dispatcher must not reroute events through whatever proxy its pod inherits.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    assert target(client, subscriber.url, retry=0).send(REQUEST).result is Result.DELIVERED


def test_user_agent_and_headers_are_sent(client, subscriber):
    target(client, subscriber.url).send(HttpRequestParts({"ce-id": "7", "x-a": "b"}, b"body"))
    [request] = subscriber.requests
    assert request.headers["user-agent"] == "dispatcher"
    assert request.headers["ce-id"] == "7"
    assert request.headers["content-length"] == "4"
    assert request.body == b"body"


def test_each_thread_gets_its_own_client_and_close_closes_all():
    clients = ThreadClients(TlsSettings())
    mine = clients.get()
    assert clients.get() is mine
    theirs: list[Connections] = []
    thread = threading.Thread(target=lambda: theirs.append(clients.get()))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    clients.close()
    assert clients._connections._all == []
