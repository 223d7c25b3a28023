"""What the core needs from the outside world, and the values that cross over.

The core (``handler``, ``deadletter``, ``reply``, ``dedupe``) decides what
happens to a message; the broker side (``dispatcher.broker``), the HTTP side
(``dispatcher.http``) and the shared store (``redis_claims``) carry it out.
The core sees them only through these Protocols, which is what lets the
Handler's whole decision table run on in-memory fakes
(``tests/unit/test_handler_table.py``) and keeps pika, pycurl and redis out of
the core's imports (``tests/unit/test_boundaries.py``).

- ``Target``: one URL with a retry policy (``http.target.HttpTarget``).
- ``ConfirmingPublisher``: publishes an event and says whether the broker
  confirmed it (``broker.publisher.Publisher``).
- ``Dedupe``: a binding's duplicate suppression (``dedupe.MemoryDedupe``,
  ``dedupe.SharedDedupe``); ``ClaimStore`` is what ``SharedDedupe`` needs of
  the store every replica shares (``store.redis_claims.RedisClaims``).
- ``Handle``: what a binding's channel (``broker.channel.BindingChannel``) runs
  for each ``Received`` message, and the ``Action`` it sends back; the
  message's ``ChannelState`` says whether its channel still lives.

A failed attempt is a value, not an exception: ``Response.status`` is
``None`` when no HTTP status came back (a timeout, a refused connection, a
transport error) and ``error`` says what happened. Only where the contract
writes it out (log lines, metric labels, dead-letter extensions) does that
become ``-1`` (``status_field``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal, Protocol

from dispatcher.observe import tracing

if TYPE_CHECKING:
    from dispatcher.delivery.verdicts import Verdict
    from dispatcher.event.cloudevent import AmqpMessage, Event, HttpRequestParts, Key, Unreadable
    from dispatcher.loop import Future


def status_field(status: int | None) -> int:
    """How a missing HTTP status is written in logs, metrics and dead letters."""
    return -1 if status is None else status


class Response:
    """One attempt's answer: a status with headers and (part of) the body, or no
    status (``None``) and why in ``error``."""

    __slots__ = ("_head", "body", "error", "retry_after", "status", "timed_out", "truncated")

    def __init__(
        self,
        status: int | None,
        body: bytes = b"",
        head: list[bytes] | None = None,
        error: str | None = None,
        truncated: bool = False,
        timed_out: bool = False,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self._head = head or []
        self.error = error
        self.truncated = truncated
        self.timed_out = timed_out
        self.retry_after = retry_after  # seconds the server asked for, if it did

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names lower-cased; a repeated header keeps its last value. Empty
        unless the target asked for them."""
        return parse_head(self._head)


def parse_head(lines: list[bytes]) -> dict[str, str]:
    """The headers of the final response in raw header lines.

    A client may hand over every header block it read (a ``100 Continue``
    first, say); only the last one, after the last status line, is the
    response's. What follows a block's blank line without a status line is a
    chunked body's trailers (curl hands them over too): never read as headers,
    or a plain answer's trailers could make it a reply.
    """
    headers: dict[str, str] = {}
    ended = False
    for raw in lines:
        line = raw.decode("latin-1").rstrip("\r\n")
        if line.startswith("HTTP/"):
            headers = {}
            ended = False
            continue
        if not line:
            ended = True
        if ended:
            continue
        name, sep, value = line.partition(":")
        if sep and name and not name[0].isspace():
            headers[name.strip().lower()] = value.strip()
    return headers


class Result(Enum):
    DELIVERED = "delivered"  # a 2xx
    FAILED = "failed"  # not retryable, or retries exhausted
    # Shutdown ended a retry wait, or the message's channel went while it waited:
    # leave the message unacked (the broker's redelivery is the copy).
    ABANDONED = "abandoned"
    # Held in an open circuit breaker as long as a message may stay unacked: give
    # it back to the queue, its retries unspent.
    RETURNED = "returned"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a 2xx did not deliver the event: the reply in it could not be forwarded.

    ``retry``: the attempt failed and the next one may do better (the reply
    target refused or did not answer); False when no attempt can (the reply
    itself is invalid). ``status`` and ``body`` are what the dead letter
    carries: the reply target's answer, or the subscriber's for a bad reply;
    ``destination`` is whose they are (None: the subscriber's).
    """

    reason: str
    retry: bool
    status: int | None = None
    body: bytes = b""
    destination: str | None = None


# Run on a 2xx before it counts as delivered: ``None`` accepts it.
Accept = Callable[[Response], Awaitable[Refusal | None]]


@dataclass(slots=True)
class Sent:
    """How sending to a target ended: the result, the last answer, how many attempts,
    and, when the last 2xx was refused by ``accept``, why."""

    result: Result
    last: Response
    attempts: int
    refusal: Refusal | None = None


class Target(Protocol):
    """One URL with a retry policy: every attempt, wait and deadline is its own."""

    def send(
        self,
        request: HttpRequestParts,
        accept: Accept | None = None,
        wanted: Callable[[], bool] | None = None,
        since: float | None = None,
    ) -> Awaitable[Sent]:
        """Attempts until a 2xx that ``accept`` accepts, a failure that is not
        retried, the last retry or the deadline. A 2xx that ``accept`` refuses
        with ``retry`` is a failed attempt like a 503: the same event is sent again
        after a backoff, within the same retry budget. ``wanted``: asked after a
        wait for the circuit breaker or the rate limit; False (the message's
        channel is gone) ends the delivery as ``ABANDONED``. ``since``: when the
        delivery began (a hold in the breaker is bounded from then)."""
        ...

    def deadline_seconds(self) -> float:
        """The longest a ``send`` may take, retries and waits included (and
        whatever time ``accept`` takes on top: it bounds its own)."""
        ...


class ConfirmingPublisher(Protocol):
    """Publishes persistently; the answer is ``None`` once the broker confirmed, else why not."""

    def publish_event(
        self,
        exchange: str,
        routing_key: str,
        event: Event,
        timeout: float,
        trace: Mapping[str, str] | None = None,
    ) -> Awaitable[str | None]:
        """``trace``: W3C trace headers (``traceparent``, ``tracestate``) the
        published message carries as AMQP headers."""
        ...


async def traced_publish(
    publisher: ConfirmingPublisher,
    exchange: str,
    routing_key: str,
    event: Event,
    timeout: float,
    trace: Mapping[str, str],
    purpose: str,
) -> str | None:
    """``publisher.publish_event`` in a PRODUCER span of the current delivery, whose
    context the message carries instead of ``trace``; as it is without a span."""
    span = tracing.CURRENT.get()
    if span is None:
        return await publisher.publish_event(exchange, routing_key, event, timeout, trace)
    producing = span.publish(exchange, routing_key, purpose)
    error = await publisher.publish_event(exchange, routing_key, event, timeout, producing.headers)
    producing.end(error)
    return error


@dataclass(slots=True)
class Claim:
    """An attempt in flight. ``done`` (made by the first waiter only: waiters are
    rare) resolves with whether the attempt settled the event."""

    key: Key
    done: Future[bool] | None = None
    shared: tuple[str, str] | None = None  # (store key, owner value) when the store holds it
    # A redelivery's: the fate an earlier attempt decided and could not carry out.
    verdict: Verdict | None = None


Found = Literal["settled", "busy"]


class Dedupe(Protocol):
    """A binding's duplicate suppression, as the Handler uses it."""

    @property
    def enabled(self) -> bool: ...

    async def claim_or_wait(self, key: Key, wait: float) -> Claim | Found:
        """For a redelivery: settled already, a new claim (carrying the verdict an
        earlier attempt left, if any), or still busy after ``wait``."""
        ...

    async def claim_first(self, key: Key, wait: float) -> Claim | Literal["busy"]:
        """For a first delivery: a claim once no other attempt holds the key (it
        waits for one that does); ``"busy"`` if that one still runs after ``wait``."""
        ...

    def release(self, claim: Claim, settled: bool, verdict: Verdict | None = None) -> None:
        """The attempt ended, settled or not; an unsettled one may leave the
        ``verdict`` its redelivery carries out."""
        ...


class ClaimStore(Protocol):
    """What ``SharedDedupe`` needs of the store every replica shares."""

    def claim(
        self, key: str, owner: str, ttl: float, verdict_key: str | None = None
    ) -> Future[int | bytes | None]:
        """Resolved in every case, within a bounded time (``None``: no answer).
        With ``verdict_key``, a claim made that finds a verdict there answers with
        its bytes."""
        ...

    def settle(
        self,
        key: str,
        owner: str,
        settled: bool,
        window: float,
        verdict: tuple[str, bytes] | None = None,
    ) -> None:
        """Settle or release; ``verdict`` (its key, its bytes) is kept for ``window``,
        written before the claim is released."""
        ...


# --------------------------------------------------------------------------
# A message between the broker side and the core
# --------------------------------------------------------------------------


class Action(Enum):
    """What the broker is told of a message, on the channel it arrived on."""

    ACK = "ack"
    REQUEUE = "requeue"  # basic.nack requeue=True
    REJECT = "reject"  # basic.reject requeue=False: the queue's dead-letter exchange, or dropped
    LEAVE = "leave"  # send nothing; the broker redelivers when the channel closes


class ChannelState:
    """The channel a message arrived on, as long as it lives: one object per
    channel, closed by the binding's channel when it closes. It is the one thing
    that says whether a message's action may still be sent (its identity: the
    message came on the current channel) and whether a request may still start
    (``open``: the handler sends nothing for a message whose channel is gone).
    ``generation`` only numbers the channels, to be shown."""

    __slots__ = ("generation", "open")

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        self.open = True

    def is_open(self) -> bool:
        return self.open


# For messages that belong to no channel of ours (tests, tools): always open.
NO_CHANNEL = ChannelState()


@dataclass(frozen=True, slots=True)
class Received:
    """One message as received on one channel."""

    tag: int
    redelivered: bool
    message: AmqpMessage
    # Set when pika could not decode the properties: ``message`` then has the
    # body and no properties, and the message is dead-lettered, not delivered.
    unreadable: Unreadable | None = None
    channel: ChannelState = NO_CHANNEL
    # When it arrived (time.time_ns()), where a trace's span begins; 0: unknown.
    arrived_ns: int = 0


# A binding's handling of one message (``Handler.handle``): the action its channel
# sends once it is reached.
Handle = Callable[[Received], Awaitable[Action]]
