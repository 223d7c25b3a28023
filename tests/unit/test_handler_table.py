"""The Handler's whole decision table on in-memory fakes: no broker, no HTTP, no sleeps.

Each row sends one message through ``Handler.handle``: how the binding is set
up, what the message is, what the subscriber and every other target answer,
what the duplicate store knows, and when shutdown comes. It states what must
follow: the ``Action`` the broker thread applies, the ``event: "delivery"``
line and the ``dispatcher_events_total{outcome}`` counter (neither for LEAVE),
and what each fake was sent. In the manner of Knative's dispatcher_test.go (a
table of subscriber, dead-letter and reply answers) and dramatiq's StubBroker
(the real logic, an in-memory transport).

The expectations are the rules of ``dispatcher/delivery/handler.py`` (its docstring:
ACK only after a 2xx and an accepted reply, or after a dead-letter target
accepted; else REJECT with the queue's own dead-letter exchange, else REQUEUE
after a backoff; LEAVE when shutdown cuts a wait short) and of
``deadletter``, ``reply`` and ``dedupe``, written down by hand, not pasted
from a run.

The fakes answer through the loop (a future resolved on the next iteration),
as the real targets and publisher do, so every row suspends where production
would. Time is compressed: the Handler's own waits are ``Waits.sleep`` (the
requeue backoff), which ``CompressedWaits`` records with the length asked for
and ends on the next loop iteration; a row with shutdown during that wait ends
it with the real ``Waits.give_up``. A redelivery waiting for an attempt in
flight is released by resolving that attempt's claim on the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest

from dispatcher.config import BindingSettings, settings_from_dict
from dispatcher.delivery.deadletter import DeadLetterer
from dispatcher.delivery.dedupe import MemoryDedupe
from dispatcher.delivery.filters import compile_filter
from dispatcher.delivery.handler import Handler
from dispatcher.delivery.reply import Replier
from dispatcher.delivery.seams import (
    Accept,
    Action,
    ChannelState,
    Claim,
    Found,
    Received,
    Response,
    Result,
    Sent,
)
from dispatcher.delivery.waits import Waits
from dispatcher.event import amqp as amqp_binding
from dispatcher.event.cloudevent import AmqpMessage, Event, HttpRequestParts, Key, Unreadable
from dispatcher.loop import Future, Loop
from dispatcher.observe import logs
from dispatcher.observe.metrics import Metrics
from dispatcher.observe.outcomes import LOGGED_OUTCOMES

# ----------------------------------------------------------------------------- fakes


@dataclass(frozen=True)
class ShutdownDuring:
    """Shutdown (``Waits.give_up``) comes while this send is in flight; it then ends as
    ``outcome`` (a real target whose retry wait is cut short answers ABANDONED)."""

    outcome: Sent


@dataclass(frozen=True)
class ChannelGone:
    """The message's channel is gone when the target would send the refused 2xx
    again: it ends the send ``ABANDONED``, unsent, the refusal kept (HttpTarget's
    rule: the redelivery forwards the reply)."""


Step = Sent | ShutdownDuring | ChannelGone | Exception


class FakeTarget:
    """A ``Target`` that answers each ``send`` with the next scripted step, on the loop.

    With ``accept`` (the Handler's reply forwarding), a 2xx step is offered to
    it, as the real target does; a refusal that may be retried moves on to the
    next scripted step (one more attempt, so one more request is recorded), and
    the last one ends the send as FAILED with the refusal. How many attempts the
    retry budget allows is ``HttpTarget``'s rule (``test_delivery.py``): here
    the script says how many there were.
    """

    def __init__(self, name: str, script: tuple[Step, ...], loop: Loop, waits: Waits) -> None:
        self.name = name
        self._script = list(script)
        self._loop = loop
        self._waits = waits
        self.requests: list[HttpRequestParts] = []

    def deadline_seconds(self) -> float:
        return 0.1

    async def send(
        self,
        request: HttpRequestParts,
        accept: Accept | None = None,
        wanted: Callable[[], bool] | None = None,
        since: float | None = None,
    ) -> Sent:
        attempts = 0
        while True:
            outcome = await self._attempt(request)
            attempts += outcome.attempts
            if outcome.result is not Result.DELIVERED or accept is None:
                return Sent(outcome.result, outcome.last, attempts)
            refusal = await accept(outcome.last)
            if refusal is None:
                return Sent(Result.DELIVERED, outcome.last, attempts)
            if not (refusal.retry and self._script):
                return Sent(Result.FAILED, outcome.last, attempts, refusal)
            if isinstance(self._script[0], ChannelGone):
                self._script.pop(0)
                return Sent(Result.ABANDONED, outcome.last, attempts, refusal)

    async def _attempt(self, request: HttpRequestParts) -> Sent:
        self.requests.append(request)
        if not self._script:  # the row's request counts say so; no exception into the Handler
            return Sent(Result.FAILED, Response(None, error=f"{self.name}: unscripted"), 1)
        step = self._script.pop(0)
        assert not isinstance(step, ChannelGone), "only after a refused 2xx"
        if isinstance(step, Exception):
            raise step
        answer: Future[Sent] = self._loop.create_future()
        if isinstance(step, ShutdownDuring):
            self._loop.call_soon(self._waits.give_up)
            step = step.outcome
        self._loop.call_soon(answer.resolve, step)
        return await answer


class FakePublisher:
    """A ``ConfirmingPublisher``: each exchange answers as scripted (``None``: confirmed)."""

    def __init__(self, answers: Mapping[str, str | None], loop: Loop) -> None:
        self._answers = answers
        self._loop = loop
        self.published: list[tuple[str, str, Event]] = []
        self.traces: list[dict[str, str]] = []

    async def publish_event(
        self,
        exchange: str,
        routing_key: str,
        event: Event,
        timeout: float,
        trace: Mapping[str, str] | None = None,
    ) -> str | None:
        self.published.append((exchange, routing_key, event))
        self.traces.append(dict(trace or {}))
        answer: Future[str | None] = self._loop.create_future()
        self._loop.call_soon(answer.resolve, self._answers.get(exchange))
        return await answer


class ScriptedDedupe:
    """A ``Dedupe`` that answers every redelivery as scripted ("settled", "busy")."""

    enabled = True

    def __init__(self, found: Found) -> None:
        self._found = found
        self.released: list[tuple[Key, bool]] = []

    async def claim_or_wait(self, key: Key, wait: float) -> Claim | Found:
        return self._found

    async def claim_first(self, key: Key, wait: float) -> Claim | Found:
        return Claim(key)

    def release(self, claim: Claim, settled: bool, verdict: Any = None) -> None:
        self.released.append((claim.key, settled))


class CompressedWaits(Waits):
    """The real ``Waits`` with time compressed: each ``sleep`` is recorded with the length
    the Handler asked for and ends on the next loop iteration. With ``shutdown_in_sleep``
    the first sleep is instead ended by ``give_up`` while it is pending, as shutdown would."""

    def __init__(self, loop: Loop, shutdown_in_sleep: bool = False) -> None:
        super().__init__(loop)
        self._test_loop = loop
        self._shutdown_in_sleep = shutdown_in_sleep
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> Future[bool]:
        self.slept.append(seconds)
        if self._shutdown_in_sleep and not self.given_up:
            self._test_loop.call_soon(self.give_up)
            return super().sleep(seconds)  # only give_up can end it this soon
        return super().sleep(0.0)


class RecordingLines(logs.DeliveryLines):
    """The ``event: "delivery"`` lines, kept as their fields; the counter moves at once."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def add(self, fields: dict[str, Any], then: Any, level: str = "info") -> None:
        self.lines.append({**fields, "level": level})
        then()


# ----------------------------------------------------------------------------- inputs

# The baseline's backoff (below). Short bounds all round: a Handler that wrongly
# waits for a claim in flight would wait 3 * 0.1 + 3 * 0.1 + 4 s (longest_attempt).
DELAY, MAXIMUM, RETRY, JITTER = 0.5, 4.0, 2, 0.2
BASE: dict[str, Any] = {
    "name": "b",
    "queue": "q",
    "subscriber": "http://subscriber.test/",
    "delivery": {"retry": RETRY, "backoff_delay": "500ms", "backoff_max": "4s", "timeout": "100ms"},
}
OWN_DLX: dict[str, Any] = {"declare": {"dead_letter_exchange": "q.dlx"}}
SINK: dict[str, Any] = {"dead_letter": {"sink": "http://sink.test/"}}
DL_EXCHANGE: dict[str, Any] = {"dead_letter": {"exchange": "dead"}}
SINK_AND_EXCHANGE: dict[str, Any] = {
    "dead_letter": {"sink": "http://sink.test/", "exchange": "dead"}
}
REPLY_URL: dict[str, Any] = {"reply": {"url": "http://reply.test/"}}
REPLY_EXCHANGE: dict[str, Any] = {"reply": {"exchange": "replies"}}
NO_DEDUPE: dict[str, Any] = {"dedupe_window": 0}
WANTS_TYPE_W: dict[str, Any] = {"filter": {"attributes": {"type": "w"}}}
WANTS_TYPE_T: dict[str, Any] = {"filter": {"attributes": {"type": "t"}}}

KEY = ("/s", "e-1")
TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "congo=t61rcWkgMzE",
}
EVENT = AmqpMessage(
    b'{"n":1}',
    {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/s", "ce-type": "t", **TRACE},
    "application/json",
)
PLAIN = AmqpMessage(b"plain text", {}, "text/plain", "m-1")  # no specversion anywhere
BAD_SPECVERSION = AmqpMessage(
    b"{}",
    {"ce-specversion": "0.3", "ce-id": "e-1", "ce-source": "/s", "ce-type": "t"},
    "application/json",
    "m-2",
)
OVERSIZED = AmqpMessage(b'{"n":123456789}', EVENT.headers, "application/json")  # 15 bytes
UNREADABLE = Unreadable("invalid short string", b"\x80\xff")
NO_PROPERTIES = AmqpMessage(b'{"n":1}', {})  # what is left of a message pika could not decode
# A reply in binary mode (``ce-`` headers), as a subscriber's 2xx may carry one.
REPLY_HEAD = [
    b"HTTP/1.1 200 OK",
    b"ce-specversion: 1.0",
    b"ce-id: r-1",
    b"ce-source: /subscriber",
    b"ce-type: reply",
    b"content-type: application/json",
]
REPLY_NO_ID = [line for line in REPLY_HEAD if not line.startswith(b"ce-id")]
REPLY_OLD_SPEC = [b"ce-specversion: 0.3" if b"specversion" in h else h for h in REPLY_HEAD]


def ok(status: int = 200, head: list[bytes] | None = None, truncated: bool = False) -> Sent:
    body = b'{"r":1}' if head else b"thanks"
    return Sent(Result.DELIVERED, Response(status, body, head, truncated=truncated), 1)


def failed(status: int, attempts: int = 1) -> Sent:
    return Sent(Result.FAILED, Response(status, b"no thanks"), attempts)


def no_answer(attempts: int = RETRY + 1) -> Sent:
    return Sent(Result.FAILED, Response(None, error="connection refused"), attempts)


def abandoned(attempts: int = 2) -> Sent:
    return Sent(Result.ABANDONED, Response(503, b"busy"), attempts)


def config(*parts: dict[str, Any]) -> dict[str, Any]:
    """The baseline binding with ``parts`` merged in (one level deep)."""
    merged: dict[str, Any] = dict(BASE)
    for part in parts:
        for key, value in part.items():
            known = merged.get(key)
            merged[key] = {**known, **value} if isinstance(known, dict) else value
    return merged


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    id: str
    # -- given
    subscriber: tuple[Step, ...] = ()
    binding: dict[str, Any] = field(default_factory=lambda: dict(BASE))
    message: AmqpMessage = EVENT
    unreadable: Unreadable | None = None
    redelivered: bool = False
    sink: tuple[Step, ...] = ()  # the dead-letter sink's answers
    reply_url: tuple[Step, ...] = ()  # the reply URL's answers
    exchanges: Mapping[str, str | None] = field(default_factory=dict)  # publish answers
    # memory: a MemoryDedupe (off with NO_DEDUPE); settled: it settled the key before;
    # in_flight: another attempt holds the key; in_flight_then_settled / _failed: that
    # attempt ends so once the Handler waits for it; busy / fake_settled: ScriptedDedupe.
    dedupe: str = "memory"
    shutdown: str = "never"  # before: give_up() first; in_backoff: during the requeue wait
    channel_open: bool = True  # False: the message's channel closed before anything was sent
    filter_raises: bool = False  # the binding's filter meets a bug (raises) on this event
    # -- then
    action: Action = Action.ACK
    outcome: str | None = None  # the line's and the counter's; None: neither
    status: int | None = None  # the line's status field (-1: no HTTP status)
    attempts: int | None = None  # the line's attempts (default: 1 if sent, else 0)
    reason: str | None = None  # in the line's reason; None: the line has no reason
    sends: int = 1  # requests to the subscriber
    letters: tuple[tuple[str, str], ...] = ()  # (where, knativeerrorcode), in order sent
    letter_reason: str | None = None  # in every letter's dispatchererror; None: absent
    # whose answer the letters' knativeerror* fields are: the reply URL's when it refused
    letter_dest: str = "http://subscriber.test/"
    last_letter_wrapped: bool = False  # the last letter is the message as received, wrapped
    replies: tuple[str, ...] = ()  # where a reply went: "url" or an exchange
    backoffs: tuple[int, ...] = ()  # the retry number of each backoff asked for
    settled_after: bool | None = None  # MemoryDedupe rows: the key is settled afterwards
    filtered: bool = False  # counted as filtered (and no line)
    suppressed: bool = False  # counted as a suppressed duplicate (and no line)


ROWS = [
    # ------------------------------------------------------------ subscriber answers
    Row(
        "2xx",
        subscriber=(ok(),),
        outcome="delivered",
        status=200,
        settled_after=True,
    ),
    Row(
        "2xx-plain-answer-with-reply-url",
        subscriber=(ok(202),),
        binding=config(REPLY_URL),
        outcome="delivered",
        status=202,
    ),
    Row(
        "2xx-reply-without-reply-target-is-just-an-answer",
        subscriber=(ok(head=REPLY_NO_ID),),
        outcome="delivered",
        status=200,
    ),
    Row(
        "2xx-reply-url-accepts",
        subscriber=(ok(head=REPLY_HEAD),),
        binding=config(REPLY_URL),
        reply_url=(ok(),),
        outcome="delivered",
        status=200,
        replies=("url",),
        settled_after=True,
    ),
    Row(
        "2xx-reply-url-refuses-every-attempt-then-dead-lettered",
        subscriber=(ok(head=REPLY_HEAD),) * (RETRY + 1),
        binding=config(REPLY_URL, SINK),
        reply_url=(failed(503),) * (RETRY + 1),
        sink=(ok(),),
        outcome="dead_lettered",
        status=200,
        attempts=RETRY + 1,
        sends=RETRY + 1,
        reason="reply URL answered 503",
        letters=(("sink", "503"),),
        letter_reason="reply URL answered 503",
        letter_dest="http://reply.test/",  # the three knativeerror* fields of one hop
        replies=("url",) * (RETRY + 1),
        settled_after=True,
    ),
    Row(
        "2xx-reply-url-refuses-once-then-accepts",
        subscriber=(ok(head=REPLY_HEAD), ok(head=REPLY_HEAD)),
        binding=config(REPLY_URL, SINK),
        reply_url=(failed(503), ok()),
        outcome="delivered",
        status=200,
        attempts=2,
        sends=2,
        replies=("url", "url"),
        settled_after=True,
    ),
    Row(
        "2xx-202-with-a-cloudevent-body-is-not-a-reply",
        subscriber=(ok(202, head=REPLY_HEAD),),
        binding=config(REPLY_URL),
        outcome="delivered",
        status=202,
    ),
    Row(
        "2xx-reply-url-no-answer-own-dlx",
        subscriber=(ok(head=REPLY_HEAD),),
        binding=config(REPLY_URL, OWN_DLX),
        reply_url=(no_answer(),),
        action=Action.REJECT,
        outcome="rejected",
        status=200,
        reason="reply URL did not answer (connection refused); no dead-letter target",
        replies=("url",),
    ),
    Row(
        "2xx-reply-exchange-confirms",
        subscriber=(ok(head=REPLY_HEAD),),
        binding=config(REPLY_EXCHANGE),
        outcome="delivered",
        status=200,
        replies=("replies",),
    ),
    Row(
        "2xx-reply-exchange-fails-dead-lettered",
        subscriber=(ok(head=REPLY_HEAD),),
        binding=config(REPLY_EXCHANGE, DL_EXCHANGE),
        exchanges={"replies": "nacked"},
        outcome="dead_lettered",
        status=200,
        reason="reply publish failed: nacked",
        letters=(("dead", "-1"),),
        letter_reason="reply publish failed: nacked",
        replies=("replies",),
    ),
    Row(
        "2xx-reply-invalid-dead-lettered-not-retried",
        subscriber=(ok(head=REPLY_NO_ID), ok(head=REPLY_NO_ID)),
        binding=config(REPLY_URL, SINK),
        sink=(ok(),),
        outcome="dead_lettered",
        status=200,
        reason="invalid reply",
        letters=(("sink", "200"),),
        letter_reason="invalid reply",
        settled_after=True,
    ),
    Row(
        "2xx-reply-bad-specversion-no-dl-target-rejected",
        subscriber=(ok(head=REPLY_OLD_SPEC),),
        binding=config(REPLY_URL),
        action=Action.REJECT,
        outcome="rejected",
        status=200,
        reason="invalid reply",
    ),
    Row(
        "2xx-reply-truncated-dead-lettered",
        subscriber=(ok(head=REPLY_HEAD, truncated=True),),
        binding=config(REPLY_EXCHANGE, DL_EXCHANGE),
        outcome="dead_lettered",
        status=200,
        reason="larger than max_body_size",
        letters=(("dead", "200"),),
        letter_reason="larger than max_body_size",
    ),
    Row(
        "4xx-not-retried-no-dl-target-rejected",
        subscriber=(failed(400),),
        action=Action.REJECT,
        outcome="rejected",
        status=400,
        reason="delivery failed; no dead-letter target",
        settled_after=False,
    ),
    Row(
        "4xx-not-retried-sink-accepts",
        subscriber=(failed(400),),
        binding=config(SINK),
        sink=(ok(),),
        outcome="dead_lettered",
        status=400,
        letters=(("sink", "400"),),
        settled_after=True,
    ),
    Row(
        "5xx-retries-exhausted-sink-accepts",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(SINK),
        sink=(ok(),),
        outcome="dead_lettered",
        status=503,
        attempts=RETRY + 1,
        letters=(("sink", "503"),),
    ),
    Row(
        "5xx-retries-exhausted-sink-refuses",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(SINK),
        sink=(failed(500),),
        action=Action.REQUEUE,
        outcome="requeued",
        status=503,
        attempts=RETRY + 1,
        reason="delivery failed; every dead-letter target failed",
        letters=(("sink", "503"),),
        backoffs=(RETRY,),
        settled_after=False,
    ),
    Row(
        "5xx-retries-exhausted-sink-refuses-own-dlx-requeued",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(SINK, OWN_DLX),
        sink=(no_answer(),),
        action=Action.REQUEUE,
        outcome="requeued",
        status=503,
        attempts=RETRY + 1,
        reason="every dead-letter target failed",
        letters=(("sink", "503"),),
        backoffs=(RETRY,),
    ),
    Row(
        "5xx-no-dl-target-own-dlx",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(OWN_DLX),
        action=Action.REJECT,
        outcome="rejected",
        status=503,
        attempts=RETRY + 1,
        reason="no dead-letter target",
    ),
    Row(
        # No status to tell a timeout, TLS and a refused connection apart: the
        # client's error is the reason, on the line and in the letter.
        "no-answer-sink-accepts",
        subscriber=(no_answer(),),
        binding=config(SINK),
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        attempts=RETRY + 1,
        reason="connection refused",
        letters=(("sink", "-1"),),
        letter_reason="connection refused",
    ),
    Row(
        "no-answer-no-dl-target-rejected",
        subscriber=(no_answer(),),
        action=Action.REJECT,
        outcome="rejected",
        status=-1,
        attempts=RETRY + 1,
        reason="no dead-letter target",
    ),
    Row(
        "no-answer-no-dl-target-own-dlx",
        subscriber=(no_answer(),),
        binding=config(OWN_DLX),
        action=Action.REJECT,
        outcome="rejected",
        status=-1,
        attempts=RETRY + 1,
        reason="no dead-letter target",
    ),
    Row(
        "abandoned-left-not-dead-lettered",
        subscriber=(abandoned(),),
        binding=config(SINK_AND_EXCHANGE),
        action=Action.LEAVE,
        settled_after=False,
    ),
    Row(
        "abandoned-own-dlx-left-not-rejected",
        subscriber=(abandoned(),),
        binding=config(OWN_DLX),
        action=Action.LEAVE,
    ),
    Row(
        "held-in-an-open-breaker-too-long-requeued-not-dead-lettered",
        subscriber=(Sent(Result.RETURNED, Response(503, b"down"), 2),),
        binding=config(SINK_AND_EXCHANGE),
        action=Action.REQUEUE,
        outcome="requeued",
        status=503,
        attempts=2,
        reason="circuit breaker open: given back to the queue unsent",
        settled_after=False,
    ),
    Row(
        "internal-error-dead-lettered-with-reason",
        subscriber=(RuntimeError("boom"),),
        binding=config(SINK),
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        attempts=0,
        reason="internal error: RuntimeError: boom",
        letters=(("sink", "-1"),),
        letter_reason="internal error: RuntimeError: boom",
    ),
    Row(
        # The event's own dead letter fails as its delivery did (the sink's first
        # answer is the exception, after its request was recorded): the message as
        # received goes instead, wrapped, with the same reason.
        "internal-error-whose-dead-letter-fails-too-sends-the-message-wrapped",
        subscriber=(RuntimeError("boom"),),
        binding=config(SINK),
        sink=(RuntimeError("boom again"), ok()),
        outcome="dead_lettered",
        status=-1,
        attempts=0,
        reason="internal error: RuntimeError: boom",
        letters=(("sink", "-1"), ("sink", "-1")),
        letter_reason="internal error: RuntimeError: boom",
        last_letter_wrapped=True,
    ),
    Row(
        # A bug in filtering (CESQL's int() once raised on 5,000 digits) went to the
        # engine, which requeued the message: every second, for ever.
        "filter-error-dead-lettered-with-reason-not-looped",
        binding=config(SINK),
        filter_raises=True,
        sink=(ok(),),
        sends=0,
        outcome="dead_lettered",
        status=-1,
        attempts=0,
        reason="internal error: RuntimeError: filter boom",
        letters=(("sink", "-1"),),
        letter_reason="internal error: RuntimeError: filter boom",
    ),
    # ------------------------------------------------------------ dead-letter targets
    Row(
        "dl-exchange-confirms",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(DL_EXCHANGE),
        outcome="dead_lettered",
        status=503,
        attempts=RETRY + 1,
        letters=(("dead", "503"),),
        settled_after=True,
    ),
    Row(
        "dl-default-exchange-is-a-target",
        subscriber=(failed(400),),
        binding=config({"dead_letter": {"exchange": ""}}),
        outcome="dead_lettered",
        status=400,
        letters=(("", "400"),),
    ),
    Row(
        "dl-exchange-fails",
        subscriber=(failed(400),),
        binding=config(DL_EXCHANGE),
        exchanges={"dead": "nacked"},
        action=Action.REQUEUE,
        outcome="requeued",
        status=400,
        reason="every dead-letter target failed",
        letters=(("dead", "400"),),
        backoffs=(RETRY,),
        settled_after=False,
    ),
    Row(
        "dl-exchange-fails-own-dlx-requeued",
        subscriber=(no_answer(),),
        binding=config(DL_EXCHANGE, OWN_DLX),
        exchanges={"dead": "timed out"},
        action=Action.REQUEUE,
        outcome="requeued",
        status=-1,
        attempts=RETRY + 1,
        reason="every dead-letter target failed",
        letters=(("dead", "-1"),),
        letter_reason="connection refused",
        backoffs=(RETRY,),
    ),
    Row(
        "dl-sink-and-exchange-both-accept",
        subscriber=(failed(400),),
        binding=config(SINK_AND_EXCHANGE),
        sink=(ok(),),
        outcome="dead_lettered",
        status=400,
        letters=(("sink", "400"), ("dead", "400")),
    ),
    Row(
        "dl-sink-refuses-exchange-confirms",
        subscriber=(failed(400),),
        binding=config(SINK_AND_EXCHANGE),
        sink=(failed(500),),
        outcome="dead_lettered",
        status=400,
        letters=(("sink", "400"), ("dead", "400")),
    ),
    Row(
        "dl-sink-accepts-exchange-fails",
        subscriber=(no_answer(),),
        binding=config(SINK_AND_EXCHANGE),
        sink=(ok(),),
        exchanges={"dead": "nacked"},
        outcome="dead_lettered",
        status=-1,
        attempts=RETRY + 1,
        reason="connection refused",
        letters=(("sink", "-1"), ("dead", "-1")),
        letter_reason="connection refused",
    ),
    Row(
        "dl-sink-and-exchange-both-fail",
        subscriber=(failed(400),),
        binding=config(SINK_AND_EXCHANGE),
        sink=(failed(500),),
        exchanges={"dead": "nacked"},
        action=Action.REQUEUE,
        outcome="requeued",
        status=400,
        reason="every dead-letter target failed",
        letters=(("sink", "400"), ("dead", "400")),
        backoffs=(RETRY,),
    ),
    Row(
        "dl-sink-and-exchange-both-fail-own-dlx-requeued",
        subscriber=(failed(400),),
        binding=config(SINK_AND_EXCHANGE, OWN_DLX),
        sink=(failed(500),),
        exchanges={"dead": "nacked"},
        action=Action.REQUEUE,
        outcome="requeued",
        status=400,
        reason="every dead-letter target failed",
        letters=(("sink", "400"), ("dead", "400")),
        backoffs=(RETRY,),
    ),
    # ------------------------------------------------------------ shutdown
    Row(
        "shutdown-during-requeue-backoff-leaves",
        subscriber=(failed(400),),
        binding=config(SINK),
        sink=(failed(500),),
        shutdown="in_backoff",
        action=Action.LEAVE,
        letters=(("sink", "400"),),
        backoffs=(RETRY,),
        settled_after=False,
    ),
    Row(
        "shutdown-during-dead-letter-leaves",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(SINK),
        sink=(ShutdownDuring(abandoned(1)),),
        action=Action.LEAVE,
        letters=(("sink", "503"),),
    ),
    Row(
        "shutdown-during-dead-letter-own-dlx-leaves-not-rejects",
        subscriber=(failed(400),),
        binding=config(SINK, OWN_DLX),
        sink=(ShutdownDuring(abandoned(1)),),
        action=Action.LEAVE,
        letters=(("sink", "400"),),
    ),
    Row(
        "shutdown-during-reply-leaves-not-dead-lettered",
        subscriber=(ok(head=REPLY_HEAD),),
        binding=config(REPLY_URL, SINK),
        reply_url=(ShutdownDuring(abandoned(1)),),
        action=Action.LEAVE,
        replies=("url",),
        settled_after=False,
    ),
    Row(
        "shutdown-before-failure-leaves-without-backoff",
        subscriber=(failed(400),),
        binding=config(NO_DEDUPE),
        shutdown="before",
        action=Action.LEAVE,
    ),
    Row(
        "shutdown-before-failure-own-dlx-leaves-not-rejects",
        subscriber=(failed(400),),
        binding=config(NO_DEDUPE, OWN_DLX),
        shutdown="before",
        action=Action.LEAVE,
    ),
    Row(
        "shutdown-before-2xx-already-in-is-acked",
        subscriber=(ok(),),
        binding=config(NO_DEDUPE),
        shutdown="before",
        outcome="delivered",
        status=200,
    ),
    Row(
        "shutdown-before-claim-no-request",
        shutdown="before",
        action=Action.LEAVE,
        sends=0,
        settled_after=False,
    ),
    # ------------------------------------------------------------ redelivery, dedupe
    Row(
        "redelivered-dedupe-disabled-sent-again",
        subscriber=(ok(),),
        binding=config(NO_DEDUPE),
        redelivered=True,
        outcome="delivered",
        status=200,
    ),
    Row(
        "redelivered-fresh-claim-delivered",
        subscriber=(ok(),),
        redelivered=True,
        outcome="delivered",
        status=200,
        settled_after=True,
    ),
    Row(
        "redelivered-fresh-claim-failed-released-unsettled",
        subscriber=(failed(503, attempts=RETRY + 1),),
        binding=config(OWN_DLX),
        redelivered=True,
        action=Action.REJECT,
        outcome="rejected",
        status=503,
        attempts=RETRY + 1,
        reason="no dead-letter target",
        settled_after=False,
    ),
    Row(
        "redelivered-settled-acked-unsent",
        dedupe="settled",
        redelivered=True,
        sends=0,
        suppressed=True,
        settled_after=True,
    ),
    Row(
        "redelivered-settled-scripted-store",
        dedupe="fake_settled",
        redelivered=True,
        sends=0,
        suppressed=True,
    ),
    Row(
        "redelivered-busy-requeued-after-backoff",
        dedupe="busy",
        redelivered=True,
        action=Action.REQUEUE,
        sends=0,
        backoffs=(0,),
    ),
    Row(
        "redelivered-busy-own-dlx-requeued-not-rejected",
        binding=config(OWN_DLX, SINK),
        dedupe="busy",
        redelivered=True,
        action=Action.REQUEUE,
        sends=0,
        backoffs=(0,),
    ),
    Row(
        "redelivered-busy-shutdown-in-backoff-leaves",
        dedupe="busy",
        redelivered=True,
        shutdown="in_backoff",
        action=Action.LEAVE,
        sends=0,
        backoffs=(0,),
    ),
    Row(
        "redelivered-in-flight-then-settled-acked-unsent",
        dedupe="in_flight_then_settled",
        redelivered=True,
        sends=0,
        suppressed=True,
        settled_after=True,
    ),
    Row(
        "redelivered-in-flight-then-failed-delivered",
        subscriber=(ok(),),
        dedupe="in_flight_then_failed",
        redelivered=True,
        outcome="delivered",
        status=200,
        settled_after=True,
    ),
    Row(
        "first-delivery-of-settled-key-not-consulted",
        subscriber=(ok(),),
        dedupe="settled",
        outcome="delivered",
        status=200,
        settled_after=True,
    ),
    Row(
        "first-delivery-waits-for-the-copy-in-flight-then-is-sent",
        subscriber=(ok(),),
        dedupe="in_flight_then_settled",
        outcome="delivered",
        status=200,
        settled_after=True,  # a publisher's duplicate: sent after the first, and claimed
    ),
    Row(
        "first-delivery-after-a-failed-copy-in-flight-is-sent",
        subscriber=(ok(),),
        dedupe="in_flight_then_failed",
        outcome="delivered",
        status=200,
        settled_after=True,
    ),
    # ------------------------------------------------------------ the channel closed first
    Row(
        "channel-closed-before-the-request-left-unsent",
        subscriber=(ok(),),
        channel_open=False,
        action=Action.LEAVE,
        sends=0,
        settled_after=False,
    ),
    Row(
        "channel-closed-redelivery-claimed-left-unsent",
        subscriber=(ok(),),
        redelivered=True,
        channel_open=False,
        action=Action.LEAVE,
        sends=0,
        settled_after=False,
    ),
    Row(
        "channel-closed-malformed-not-dead-lettered",
        binding=config(SINK),
        message=BAD_SPECVERSION,
        channel_open=False,
        action=Action.LEAVE,
        sends=0,
    ),
    # ------------------------------------------------------------ messages that cannot go
    Row(
        "not-a-cloudevent-wrapped-and-delivered",
        subscriber=(ok(),),
        message=PLAIN,
        outcome="delivered",
        status=200,
    ),
    Row(
        "not-a-cloudevent-policy-dead-letter-sink",
        binding=config({"non_cloudevent": "dead_letter"}, SINK),
        message=PLAIN,
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        sends=0,
        reason="not a CloudEvent",
        letters=(("sink", "-1"),),
        letter_reason="not a CloudEvent",
    ),
    Row(
        "not-a-cloudevent-policy-dead-letter-no-target-rejected",
        binding=config({"non_cloudevent": "dead_letter"}),
        message=PLAIN,
        action=Action.REJECT,
        outcome="rejected",
        status=-1,
        sends=0,
        reason="not a CloudEvent (non_cloudevent: dead_letter); no dead-letter target",
    ),
    Row(
        "bad-specversion-exchange-confirms",
        binding=config(DL_EXCHANGE),
        message=BAD_SPECVERSION,
        outcome="dead_lettered",
        status=-1,
        sends=0,
        reason="malformed CloudEvent: unsupported specversion",
        letters=(("dead", "-1"),),
        letter_reason="unsupported specversion",
    ),
    Row(
        "bad-specversion-no-target-own-dlx",
        binding=config(OWN_DLX),
        message=BAD_SPECVERSION,
        action=Action.REJECT,
        outcome="rejected",
        status=-1,
        sends=0,
        reason="malformed CloudEvent",
    ),
    Row(
        "oversized-body-sink",
        binding=config({"max_body_size": 8}, SINK),
        message=OVERSIZED,
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        sends=0,
        reason="message body of 15 bytes exceeds max_body_size 8",
        letters=(("sink", "-1"),),
        letter_reason="exceeds max_body_size",
    ),
    Row(
        "unreadable-properties-sink",
        binding=config(SINK),
        message=NO_PROPERTIES,
        unreadable=UNREADABLE,
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        sends=0,
        reason="unreadable AMQP properties: invalid short string",
        letters=(("sink", "-1"),),
        letter_reason="unreadable AMQP properties",
    ),
    Row(
        "unreadable-properties-no-target-own-dlx",
        binding=config(OWN_DLX),
        message=NO_PROPERTIES,
        unreadable=UNREADABLE,
        action=Action.REJECT,
        outcome="rejected",
        status=-1,
        sends=0,
        reason="unreadable AMQP properties",
    ),
    Row(
        "unreadable-properties-redelivered-settled-suppressed",
        binding=config(SINK),
        message=NO_PROPERTIES,
        unreadable=UNREADABLE,
        redelivered=True,
        dedupe="fake_settled",
        sends=0,
        suppressed=True,
    ),
    # ------------------------------------------------------------ filters
    Row(
        "filtered-acked-unsent",
        binding=config(WANTS_TYPE_W, SINK),
        sends=0,
        filtered=True,
        settled_after=False,
    ),
    Row(
        "filtered-redelivered-no-dedupe-wait",
        binding=config(WANTS_TYPE_W),
        dedupe="busy",
        redelivered=True,
        sends=0,
        filtered=True,
    ),
    Row(
        "filter-passes-delivered",
        subscriber=(ok(),),
        binding=config(WANTS_TYPE_T),
        outcome="delivered",
        status=200,
    ),
    Row(
        "filter-and-malformed-dead-lettered-first",
        binding=config(WANTS_TYPE_W, SINK),
        message=BAD_SPECVERSION,
        sink=(ok(),),
        outcome="dead_lettered",
        status=-1,
        sends=0,
        reason="malformed CloudEvent",
        letters=(("sink", "-1"),),
        letter_reason="malformed CloudEvent",
    ),
]


# ----------------------------------------------------------------------------- the run


@dataclass
class Ran:
    action: Action
    subscriber: FakeTarget
    sink: FakeTarget
    reply_url: FakeTarget
    publisher: FakePublisher
    waits: CompressedWaits
    lines: list[dict[str, Any]]
    metrics: Metrics
    dedupe: MemoryDedupe | ScriptedDedupe


def run(row: Row, messages: int = 1) -> Ran:
    """``row``'s message through a Handler built as the row says; ``messages`` > 1
    sends it that many times in turn (the same event coming back), and ``action``
    is the last one's."""
    loop = Loop("table")
    try:
        waits = CompressedWaits(loop, shutdown_in_sleep=row.shutdown == "in_backoff")
        [binding] = settings_from_dict({"bindings": [row.binding]}, {}).bindings
        subscriber = FakeTarget("subscriber", row.subscriber, loop, waits)
        sink = FakeTarget("sink", row.sink, loop, waits)
        reply_url = FakeTarget("reply URL", row.reply_url, loop, waits)
        publisher = FakePublisher(row.exchanges, loop)
        dedupe, holder = make_dedupe(row.dedupe, binding, waits)
        metrics = Metrics()
        lines = RecordingLines()
        handler = Handler(
            binding,
            "/",
            subscriber,
            DeadLetterer(
                binding.dead_letter,
                binding.subscriber,
                binding.content_mode,
                sink if binding.dead_letter.sink else None,
                publisher,
                1.0,
                binding.name,
            ),
            Replier(
                binding.reply,
                binding.content_mode,
                reply_url if binding.reply.url else None,
                publisher,
                1.0,
            ),
            dedupe,
            metrics.binding("b"),
            waits,
            lines,
            _raising_filter if row.filter_raises else compile_filter(binding),
        )
        if row.shutdown == "before":
            waits.give_up()
        if holder is not None and isinstance(dedupe, MemoryDedupe):
            # Runs once the Handler is waiting for the attempt in flight.
            loop.call_soon(dedupe.release, holder, row.dedupe == "in_flight_then_settled")
        channel = ChannelState()
        channel.open = row.channel_open
        for tag in range(messages):
            redelivered = row.redelivered or tag > 0
            received = Received(tag, redelivered, row.message, row.unreadable, channel)
            action = loop.run_until_complete(handler.handle(received))
    finally:
        loop.close()
    return Ran(action, subscriber, sink, reply_url, publisher, waits, lines.lines, metrics, dedupe)


def _raising_filter(_attributes: Mapping[str, str]) -> bool:
    raise RuntimeError("filter boom")


def make_dedupe(
    mode: str, binding: BindingSettings, waits: Waits
) -> tuple[MemoryDedupe | ScriptedDedupe, Claim | None]:
    if mode == "busy":
        return ScriptedDedupe("busy"), None
    if mode == "fake_settled":
        return ScriptedDedupe("settled"), None
    memory = MemoryDedupe(binding.dedupe_window, waits)
    if mode == "memory":
        return memory, None
    claim = memory.claim(KEY)
    assert claim is not None
    if mode == "settled":
        memory.release(claim, True)
        return memory, None
    assert mode in ("in_flight", "in_flight_then_settled", "in_flight_then_failed"), mode
    return memory, (None if mode == "in_flight" else claim)


def counters(metrics: Metrics) -> dict[str, float]:
    return {
        outcome: value
        for outcome in LOGGED_OUTCOMES
        if (value := metrics.value("dispatcher_events_total", {"binding": "b", "outcome": outcome}))
    }


def letters(ran: Ran) -> list[tuple[str, Mapping[str, str]]]:
    """Every dead letter sent, as (where, its attributes), in the order sent."""
    found: list[tuple[str, Mapping[str, str]]] = []
    for request in ran.sink.requests:  # binary mode: attributes are ce- headers
        attributes = {k[3:]: unquote(v) for k, v in request.headers.items() if k.startswith("ce-")}
        found.append(("sink", attributes))
    for exchange, _key, event in ran.publisher.published:
        if "knativeerrorcode" in event.attributes:
            found.append((exchange, event.attributes))
    return found


def backoff_bounds(retry_number: int) -> tuple[float, float]:
    """``delay * 2**n`` capped at the maximum, give or take the jitter (exponential policy)."""
    base = min(DELAY * 2**retry_number, MAXIMUM)
    return base * (1 - JITTER), min(base * (1 + JITTER), MAXIMUM)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_decision_table(row: Row) -> None:
    ran = run(row)

    # What the subscriber got: the event itself, once (the target does the retrying).
    assert len(ran.subscriber.requests) == row.sends
    for request in ran.subscriber.requests:
        expected_id = row.message.message_id if row.message is PLAIN else "e-1"
        assert request.headers["ce-id"] == expected_id
    check_letters(ran, row)
    check_replies(ran, row)
    check_trace(ran, row)

    # Every wait the Handler asked for, each as long as the backoff rule says.
    assert len(ran.waits.slept) == len(row.backoffs)
    for seconds, retry_number in zip(ran.waits.slept, row.backoffs, strict=True):
        low, high = backoff_bounds(retry_number)
        assert low <= seconds <= high, (seconds, retry_number)

    # The verdict the broker thread applies.
    assert ran.action is row.action
    check_line_and_counters(ran, row)

    # The duplicate store: settled only when delivered or dead-lettered.
    if row.settled_after is not None:
        assert isinstance(ran.dedupe, MemoryDedupe)
        assert len(ran.dedupe) == (1 if row.settled_after else 0)


def check_letters(ran: Ran, row: Row) -> None:
    """Dead letters: where, with the last status (-1: none) and dispatcher's reason."""
    sent = letters(ran)
    assert [(where, a["knativeerrorcode"]) for where, a in sent] == list(row.letters)
    for _where, attributes in sent:
        assert attributes["knativeerrordest"] == row.letter_dest
        if row.letter_reason is None:
            assert "dispatchererror" not in attributes
        else:
            assert row.letter_reason in attributes["dispatchererror"]
        if row.message is EVENT and row.unreadable is None and not row.last_letter_wrapped:
            assert (attributes["source"], attributes["id"]) == KEY
    if row.last_letter_wrapped:
        attributes = sent[-1][1]
        assert attributes["type"] == amqp_binding.WRAPPED_TYPE
        assert attributes["source"] == "rabbitmq://%2F/q"


def check_replies(ran: Ran, row: Row) -> None:
    """Replies: the reply URL's requests, then the exchanges' publishes of the reply."""
    published = [
        (exchange, event)
        for exchange, _key, event in ran.publisher.published
        if "knativeerrorcode" not in event.attributes
    ]
    replies = ["url" for _ in ran.reply_url.requests] + [exchange for exchange, _ in published]
    assert replies == list(row.replies)
    assert [r.headers["ce-id"] for r in ran.reply_url.requests] + [e.id for _, e in published] == [
        "r-1"
    ] * len(replies)


def check_trace(ran: Ran, row: Row) -> None:
    """The message's W3C trace headers ride on every request and every publish it
    causes: subscriber, reply and dead letter alike (and only its own)."""
    carries = all(row.message.headers.get(name) == value for name, value in TRACE.items())
    expected = TRACE if carries else {}
    for target in (ran.subscriber, ran.sink, ran.reply_url):
        for request in target.requests:
            found = {k: v for k, v in request.headers.items() if k in TRACE}
            assert found == expected, target.name
    assert ran.publisher.traces == [expected] * len(ran.publisher.published)


def check_line_and_counters(ran: Ran, row: Row) -> None:
    """The delivery line and the counter: exactly one each for a final outcome."""
    expected_counters = {row.outcome: 1.0} if row.outcome else {}
    if row.filtered:
        expected_counters = {"filtered": 1.0}
    assert counters(ran.metrics) == expected_counters
    suppressed = ran.metrics.value("dispatcher_duplicates_suppressed_total", {"binding": "b"})
    assert suppressed == (1.0 if row.suppressed else 0.0)
    if row.outcome is None:
        assert ran.lines == []
        return
    [line] = ran.lines
    assert line["outcome"] == row.outcome
    assert line["status"] == row.status
    default_attempts = 1 if row.sends else 0
    assert line["attempts"] == (default_attempts if row.attempts is None else row.attempts)
    assert line["redelivered"] is row.redelivered
    # An event that may now be gone for good is a warning; the others are info.
    assert line["level"] == ("warning" if row.outcome == "rejected" else "info")
    if row.message is EVENT and row.unreadable is None:
        assert (line["ce_source"], line["ce_id"]) == KEY
    if row.reason is None:
        assert "reason" not in line
    else:
        assert row.reason in line["reason"]


def test_the_table_covers_every_action_and_outcome() -> None:
    """A row for each Action and each counted outcome, and no two rows alike."""
    assert {row.action for row in ROWS} == set(Action)
    counted = {row.outcome for row in ROWS} | {"filtered" for row in ROWS if row.filtered}
    assert counted - {None} == set(LOGGED_OUTCOMES)
    assert len({row.id for row in ROWS}) == len(ROWS)


def test_a_requeue_waits_longer_each_time_the_same_event_comes_back() -> None:
    """Every dead-letter target down: the same event goes back to the queue again and
    again, each time after a longer wait (retry number ``retry``, ``retry + 1``, ...),
    up to ``backoff_max``: never a tight loop. Delivered at last, it starts over."""
    comes_back = 5
    row = Row(
        "requeued-again-and-again",
        subscriber=(failed(400),) * comes_back + (ok(),) + (failed(400),),
        binding=config(SINK, NO_DEDUPE),  # each return is delivered again, not suppressed
        sink=(failed(500),) * comes_back + (failed(500),),
    )
    ran = run(row, messages=comes_back + 2)
    waits_asked = [RETRY + n for n in range(comes_back)] + [RETRY]
    assert len(ran.waits.slept) == len(waits_asked)
    for seconds, retry_number in zip(ran.waits.slept, waits_asked, strict=True):
        low, high = backoff_bounds(retry_number)
        assert low <= seconds <= high, (seconds, retry_number)
    assert ran.waits.slept[comes_back - 1] >= MAXIMUM * (1 - JITTER)  # reached the cap
    assert ran.action is Action.REQUEUE
    assert [line["outcome"] for line in ran.lines] == ["requeued"] * comes_back + [
        "delivered",
        "requeued",
    ]
