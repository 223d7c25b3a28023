"""HTTP delivery of one event to one URL: attempts, timeouts, retries.

Each attempt has a wall-clock budget of ``delivery.timeout`` measured by our own
clock: socket timeouts are per operation, so a subscriber trickling a response
byte by byte would otherwise hold an attempt forever. The whole delivery,
retries and waits included, also has a deadline,
``(retry + 1) * timeout + retry * backoff_max``, so a message never holds its
slot longer than that, whatever ``Retry-After`` says.

The transport is ``http11``, a lean HTTP/1.1 client of our own on keep-alive
sockets, one set per worker thread: the HTTP layer was most of the service's
CPU (h11, under httpcore, over half of all samples). It never follows
redirects and never reads proxy settings from the environment, both of which
a dispatcher must not do. Its errors are translated here and go no further: a
failed attempt is a status of ``-1`` with a short reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from dispatcher import http11
from dispatcher.config import DeliverySettings, TlsSettings
from dispatcher.events import HttpRequestParts
from dispatcher.http11 import Connections, HttpError, Origin, ThreadConnections
from dispatcher.retry import Backoff, Verdict, classify, parse_retry_after

USER_AGENT = ("user-agent", "dispatcher")

# What an error-response body contributes to a dead letter is at most 1024
# base64 characters; keeping a little more than that is plenty.
ERROR_BODY_LIMIT = 4096


class Result(Enum):
    DELIVERED = "delivered"  # a 2xx
    FAILED = "failed"  # not retryable, or retries exhausted
    ABANDONED = "abandoned"  # shutdown began while waiting to retry: leave the message unacked


@dataclass(slots=True)
class Attempt:
    status: int  # HTTP status, or -1 for a timeout / transport error
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    truncated: bool = False


@dataclass(slots=True)
class Outcome:
    result: Result
    last: Attempt
    attempts: int


AttemptObserver = Callable[[int, float], None]  # (status, seconds)


class ThreadClients:
    """Keep-alive connections per worker thread, all configured alike.

    Threads never share a connection or wait on a shared pool's lock (with 50
    workers on one pool, most profile samples were threads waiting for it);
    each thread's connections stay warm for it. The TLS context (CA file,
    client certificate) is built once and shared.
    """

    def __init__(self, tls: TlsSettings, connections_per_thread: int = 2) -> None:
        self._connections = ThreadConnections(tls.context(), connections_per_thread)

    def get(self) -> Connections:
        return self._connections.get()

    def close(self) -> None:
        self._connections.close()


class HttpTarget:
    """Delivers request parts to one URL with the binding's retry policy."""

    def __init__(
        self,
        clients: ThreadClients,
        url: str,
        delivery: DeliverySettings,
        stopping: threading.Event,
        observe: AttemptObserver | None = None,
        max_response_bytes: int = 8 * 1024 * 1024,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._origin = Origin.parse(url)  # parsed once, not on every attempt
        self._clients = clients
        self._delivery = delivery
        self._stopping = stopping
        self._observe = observe
        self._max_response = max_response_bytes
        self._clock = clock
        self._backoff = backoff or Backoff(
            delivery.backoff_policy, delivery.backoff_delay, delivery.backoff_max
        )

    def deadline_seconds(self) -> float:
        d = self._delivery
        return (d.retry + 1) * d.timeout + d.retry * d.backoff_max

    def send(self, request: HttpRequestParts) -> Outcome:
        try:  # built once: every attempt sends the same bytes
            raw = http11.request(self._origin, [*request.headers.items(), USER_AGENT], request.body)
        except HttpError as e:
            # A header no HTTP request may carry: no attempt could ever succeed.
            return Outcome(Result.FAILED, Attempt(-1, error=e.reason), 0)
        deadline = self._clock() + self.deadline_seconds()
        retries = self._delivery.retry
        number = 0
        while True:
            budget = min(self._delivery.timeout, deadline - self._clock())
            attempt = self._attempt(raw, budget)
            number += 1
            verdict = classify(attempt.status)
            if verdict is Verdict.SUCCESS:
                return Outcome(Result.DELIVERED, attempt, number)
            if verdict is Verdict.FAIL or number > retries:
                return Outcome(Result.FAILED, attempt, number)
            wait = self._backoff.wait(
                number - 1, parse_retry_after(attempt.headers.get("retry-after"))
            )
            if self._clock() + wait >= deadline:
                return Outcome(Result.FAILED, attempt, number)
            if self._stopping.wait(wait):
                return Outcome(Result.ABANDONED, attempt, number)

    def _attempt(self, raw: bytes, budget: float) -> Attempt:
        started = self._clock()
        attempt = self._post(raw, max(budget, 0.001))
        if self._observe is not None:
            self._observe(attempt.status, self._clock() - started)
        return attempt

    def _post(self, raw: bytes, budget: float) -> Attempt:
        try:
            response = self._clients.get().post(
                self._origin, raw, budget, self._max_response, ERROR_BODY_LIMIT
            )
        except HttpError as e:
            return Attempt(-1, error="timeout" if e.timeout else e.reason)
        return Attempt(
            response.status, response.body, response.headers, truncated=response.truncated
        )
