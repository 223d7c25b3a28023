"""HTTP delivery of one event to one URL: attempts, timeouts, retry waits.

Each attempt has a wall-clock budget of ``delivery.timeout`` (libcurl's
``TIMEOUT_MS``: connect, send and the whole response, however slowly it
trickles in). The whole delivery, retries and waits included, also has a
deadline, ``(retry + 1) * timeout + retry * backoff_max``, so a message never
holds its slot longer than that, whatever ``Retry-After`` says.

A 2xx may still fail the attempt: the handler's ``accept`` (forwarding the
reply in it) can refuse it, and then the same event is sent again after a
backoff, within the same ``retry`` budget, as Knative's data plane has it (a
reply that cannot be delivered is a failed delivery). The time ``accept``
takes is bounded by its own target, and does not eat into this URL's deadline.

A retry wait is a timer on the engine loop, not a sleeping thread. Shutdown
ends the wait (``Waits.give_up``) and the delivery is ``ABANDONED``: the
message is left for the broker to redeliver.

The subscriber's target may have a circuit breaker and a rate limit
(``dispatcher.delivery.breaker``, ``dispatcher.delivery.rate_limit``): every attempt asks both
first. Time spent waiting in either is not taken from the deadline, and a
failed probe of a half-open breaker does not spend a retry: the message
keeps its retries for when the subscriber is back. An attempt held in an
open breaker past ``hold_max`` ends the delivery as ``RETURNED``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from dispatcher.config import DeliverySettings
from dispatcher.credentials.bearer import BearerToken
from dispatcher.delivery.breaker import PASS, CircuitBreaker, CircuitState, Pass
from dispatcher.delivery.rate_limit import RateLimit
from dispatcher.delivery.retry import Backoff, Decision, classify, retried_statuses
from dispatcher.delivery.seams import Accept, Refusal, Response, Result, Sent
from dispatcher.delivery.waits import Waits
from dispatcher.event.cloudevent import HttpRequestParts
from dispatcher.http.client import HttpClient, Reading, request_headers
from dispatcher.http.endpoint import Endpoint
from dispatcher.observe import tracing

# What an error-response body contributes to a dead letter is at most 1024
# base64 characters; keeping a little more than that is plenty.
ERROR_BODY_LIMIT: Final = 4096


AttemptObserver = Callable[[int | None, float], None]  # (status, seconds)

# The "last answer" of a delivery that ended before its first attempt.
_NOT_SENT: Final = Response(None, error="not sent: the circuit breaker was open")


class HttpTarget:
    """Delivers request parts to one endpoint with the binding's retry policy."""

    def __init__(
        self,
        client: HttpClient,
        endpoint: Endpoint,
        delivery: DeliverySettings,
        waits: Waits,
        observe: AttemptObserver | None = None,
        max_response_bytes: int = 8 * 1024 * 1024,
        read_reply: bool = False,
        extra_headers: tuple[tuple[str, str], ...] = (),
        bearer: BearerToken | None = None,
        breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self._breaker = breaker
        self._rate_limit = rate_limit
        self._endpoint = endpoint
        self._client = client
        self._delivery = delivery
        self._waits = waits
        self._observe = observe
        # A body is read up to max_body_size at most; kept whole (with the headers)
        # only when a reply may be in it, else as much as a dead letter can carry.
        keep = max_response_bytes if read_reply else ERROR_BODY_LIMIT
        self._reading = Reading(min(keep, max_response_bytes), max_response_bytes, read_reply)
        self._retried = retried_statuses(delivery.retry_on)
        self._extra_headers = [f"{name}: {value}" for name, value in extra_headers]
        self._bearer = bearer
        self._peer = tracing.peer(endpoint.url)
        self._backoff = Backoff(
            delivery.backoff_policy, delivery.backoff_delay, delivery.backoff_max
        )

    def deadline_seconds(self) -> float:
        d = self._delivery
        return (d.retry + 1) * d.timeout + d.retry * d.backoff_max

    async def send(
        self,
        request: HttpRequestParts,
        accept: Accept | None = None,
        wanted: Callable[[], bool] | None = None,
        since: float | None = None,
    ) -> Sent:
        # Built once: every attempt sends the same, but for a bearer token that
        # may have rotated in between. The binding's own headers last.
        headers = request_headers(request.headers)
        if self._extra_headers:
            headers.extend(self._extra_headers)
        waits = self._waits
        started = waits.time()
        deadline = started + self.deadline_seconds()
        number = 0  # attempts that count toward ``retry``
        made = 0  # every attempt, failed probes included
        response = _NOT_SENT
        while True:
            given = PASS
            if self._breaker is not None or self._rate_limit is not None:
                waited_from = waits.time()
                admitted = await self._admit(started if since is None else since, wanted)
                if not isinstance(admitted, Pass):
                    return Sent(admitted, response, made)
                now = waits.time()
                if now > waited_from:
                    # Time spent waiting is not the delivery's, and the attempt
                    # that follows gets its whole timeout.
                    deadline = max(deadline + now - waited_from, now + self._delivery.timeout)
                given = admitted
            attempted = waits.time()
            response = await self._attempt(headers, request.body, deadline, made, given)
            made += 1
            decision = classify(response.status, self._retried)
            if self._breaker is not None:
                self._breaker.record(given, decision is Decision.RETRY)
            if given.probe and decision is Decision.RETRY:
                # The breaker's question, not the event's failure: no retry spent,
                # no time taken from the deadline, and no backoff (the breaker
                # is open again: the next attempt waits there).
                deadline += waits.time() - attempted
                continue
            number += 1
            refusal: Refusal | None = None
            if decision is Decision.SUCCESS and accept is not None:
                accepting = waits.time()
                refusal = await accept(response)
                # The reply's target bounds its own time; the deadline is this URL's.
                deadline += waits.time() - accepting
                if refusal is not None:
                    decision = Decision.RETRY if refusal.retry else Decision.FAIL
            if decision is Decision.SUCCESS:
                return Sent(Result.DELIVERED, response, made)
            wait = self._retry_wait(decision, number, response, refusal, deadline)
            if wait is None:
                return Sent(Result.FAILED, response, made, refusal)
            tracing.note("retry wait", {"seconds": round(wait, 6), "attempt": made})
            # After the wait, a 2xx whose reply was not forwarded is sent again only
            # while the message is still ours: with its channel gone, the broker's
            # redelivery forwards that reply (the handler's verdict), and a request
            # now would be its twin.
            if not await waits.sleep(wait) or (
                refusal is not None and wanted is not None and not wanted()
            ):
                return Sent(Result.ABANDONED, response, made, refusal)

    async def _admit(self, since: float, wanted: Callable[[], bool] | None) -> Pass | Result:
        """Leave from the breaker, then a slot from the rate limit; or why not. After
        waiting for either, the message must still be ours to send (``wanted``):
        if its channel closed meanwhile, the broker's redelivery is the copy."""
        waits = self._waits
        waited = False
        given = PASS
        breaker = self._breaker
        if breaker is not None:
            admitted = breaker.admit()
            if not isinstance(admitted, Pass):
                tracing.note("circuit breaker hold")
                held = await waits.wait(admitted, since + breaker.hold_max - waits.time())
                if held is None:
                    breaker.withdraw(admitted)
                    return Result.ABANDONED if waits.given_up or breaker.closed else Result.RETURNED
                admitted, waited = held, True
            given = admitted
        limit = self._rate_limit
        if limit is not None:
            pause = limit.slot()
            if pause > 0:
                waited = True
                if not await limit.wait(pause):
                    return self._unused(given)
        if waited and wanted is not None and not wanted():
            return self._unused(given)
        return given

    def _unused(self, given: Pass) -> Result:
        """``given`` will not be used: the delivery ends here, unsent."""
        if self._breaker is not None:
            self._breaker.release(given)
        return Result.ABANDONED

    async def _attempt(
        self, headers: list[str], body: bytes, deadline: float, made: int, given: Pass
    ) -> Response:
        """One request. ``made``: the attempts before it (its resend count)."""
        waits = self._waits
        budget = min(self._delivery.timeout, deadline - waits.time())
        started = waits.time()
        sent = headers if self._bearer is None else [*headers, self._bearer.header()]
        try:
            span = tracing.CURRENT.get()
            attempt = None
            if span is not None:
                # The subscriber's span becomes a child of this attempt's.
                attempt = span.attempt(self._peer, made)
                sent = [*sent, *attempt.header_lines]
            response = await self._client.post(
                self._endpoint, sent, body, max(budget, 0.001), self._reading
            )
            if attempt is not None:
                attempt.end(response.status, response.error, response.timed_out)
            if self._observe is not None:
                self._observe(response.status, waits.time() - started)
        except BaseException:
            # A probe that is never recorded would keep the breaker half-open for
            # ever: every later message held until hold_max.
            self._unused(given)
            raise
        return response

    def _retry_wait(
        self,
        decision: Decision,
        number: int,
        response: Response,
        refusal: Refusal | None,
        deadline: float,
    ) -> float | None:
        """How long to wait before attempt ``number + 1``; None: no more attempts."""
        if decision is Decision.FAIL or number > self._delivery.retry:
            return None
        # A subscriber's Retry-After is for its own failures, not a reply target's.
        retry_after = None if refusal is not None else response.retry_after
        wait = self._backoff.wait(number - 1, retry_after)
        breaker = self._breaker
        if breaker is not None and breaker.state is not CircuitState.CLOSED:
            # The next attempt waits for the breaker, whose time is not the
            # delivery's: the message keeps its retries, never dead-lettered
            # for an outage.
            return wait
        return None if self._waits.time() + wait >= deadline else wait
