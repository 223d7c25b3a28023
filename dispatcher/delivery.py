"""HTTP delivery of one event to one URL: attempts, timeouts, retries.

Each attempt has a wall-clock budget of ``delivery.timeout`` measured by our own
clock: httpx timeouts are per socket operation, so a subscriber trickling a
response byte by byte would otherwise hold an attempt forever. The whole
delivery, retries and waits included, also has a deadline,
``(retry + 1) * timeout + retry * backoff_max``, so a message never holds its
slot longer than that, whatever ``Retry-After`` says.

httpx errors are translated here and go no further: a failed attempt is just a
status of ``-1`` with a short reason.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

import httpx

from dispatcher.config import DeliverySettings, TlsSettings
from dispatcher.events import HttpRequestParts
from dispatcher.retry import Backoff, Verdict, classify, parse_retry_after

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


class _AttemptTimeout(Exception):
    pass


def make_client(tls: TlsSettings, max_connections: int) -> httpx.Client:
    """One client per binding, shared by its workers (httpx.Client is thread-safe)."""
    verify: ssl.SSLContext | bool = True
    if tls.ca_file or tls.cert_file:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        verify = context
    return httpx.Client(
        verify=verify,
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
        ),
        follow_redirects=False,  # a 3xx is an answer (dead-letter), not a hop
        trust_env=False,  # proxies from the environment must not reroute events
        headers={"user-agent": "dispatcher"},
    )


class HttpTarget:
    """Delivers request parts to one URL with the binding's retry policy."""

    def __init__(
        self,
        client: httpx.Client,
        url: str,
        delivery: DeliverySettings,
        stopping: threading.Event,
        observe: AttemptObserver | None = None,
        max_response_bytes: int = 8 * 1024 * 1024,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._client = client
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
        deadline = self._clock() + self.deadline_seconds()
        retries = self._delivery.retry
        number = 0
        while True:
            budget = min(self._delivery.timeout, deadline - self._clock())
            attempt = self._attempt(request, budget)
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

    def _attempt(self, request: HttpRequestParts, budget: float) -> Attempt:
        started = self._clock()
        attempt = self._post(request, started + budget, max(budget, 0.001))
        if self._observe is not None:
            self._observe(attempt.status, self._clock() - started)
        return attempt

    def _post(self, request: HttpRequestParts, deadline: float, budget: float) -> Attempt:
        try:
            with self._client.stream(
                "POST",
                self.url,
                headers=request.headers,
                content=request.body,
                timeout=httpx.Timeout(budget),
            ) as response:
                limit = (
                    self._max_response if 200 <= response.status_code < 300 else ERROR_BODY_LIMIT
                )
                body, truncated = self._read(response, deadline, limit)
                return Attempt(response.status_code, body, response.headers, truncated=truncated)
        except _AttemptTimeout:
            return Attempt(-1, error="timeout")
        except httpx.TimeoutException as e:
            return Attempt(-1, error=f"timeout ({type(e).__name__})")
        except httpx.HTTPError as e:
            return Attempt(-1, error=f"{type(e).__name__}: {e}"[:200])

    def _read(self, response: httpx.Response, deadline: float, limit: int) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            if self._clock() > deadline:
                raise _AttemptTimeout
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(chunks)[:limit], True
        return b"".join(chunks), False
