"""Where acks are decided: one message, from delivery to its final outcome.

``Handler.handle`` is a coroutine on the engine loop (every wait in it, for
the subscriber, a retry, a confirm or a duplicate claim, awaits a future; no
thread is held) and returns an ``Action`` that the binding's channel sends at
once, on the channel the message arrived on, on the same loop. The
rules (at-least-once: a message is acked only once somebody has taken
responsibility for its event):

- ACK only after the subscriber's 2xx (and the reply's acceptance, if there is
  a reply to forward), or after a dead-letter target accepted the event;
- REJECT (no requeue) when the binding has no dead-letter target, as
  Knative's data plane drops such an event: the queue's own dead-letter
  exchange, if it has one, takes it, else the broker discards it;
- REQUEUE when configured dead-letter targets all failed, after a wait that
  grows each time the same event goes back (``requeues``): never a tight loop;
- LEAVE the message unacked when shutdown interrupts a wait: the broker
  redelivers it, nothing is dead-lettered on the way out.

Once the subscriber's answers decided the event's fate (dead-letter it, or
forward its reply and ack), a message that goes back unsettled leaves that
``Verdict`` behind (``verdicts``, kept with the dedupe memory), and its
redelivery carries it out again without a request: a second dead letter or
reply, never a second request (``_carry_out``). A reply that cannot be
forwarded on a message whose channel has closed is left so, not retried:
the broker's redelivery is the copy that forwards it.

A reply that cannot be forwarded fails the attempt that produced it: the
subscriber gets the event again within its retry budget, then the event is
dead-lettered (``reply``). A 202 is never a reply (Knative's data plane).

A message whose properties pika could not decode (``Received.unreadable``,
see ``amqp_properties``) is dead-lettered with the reason and its body, never
delivered: its attributes are unknown, and a subscriber would get a
different event than the one that was published.

An event that does not pass the binding's filter (``filters``) is acked
without a request; a message that cannot be read is dead-lettered first.

A redelivered message whose event this process already delivered or
dead-lettered (or is still delivering) is acked without a second request
(``dedupe``). An unexpected error while handling a message dead-letters it
with the reason rather than requeueing it into the same error forever.

Every final outcome writes exactly one ``event: "delivery"`` log line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from dispatcher.config import BindingSettings
from dispatcher.delivery.deadletter import DeadLetterer
from dispatcher.delivery.filters import Predicate
from dispatcher.delivery.reply import Replier
from dispatcher.delivery.requeues import RequeueCounts
from dispatcher.delivery.retry import Backoff
from dispatcher.delivery.seams import (
    Action,
    ChannelState,
    Claim,
    Dedupe,
    Received,
    Refusal,
    Response,
    Result,
    Target,
    status_field,
)
from dispatcher.delivery.verdicts import DeadLetter, Failure, ForwardReply, Verdict, dead_letter
from dispatcher.delivery.waits import Waits
from dispatcher.errors import EventError
from dispatcher.event import amqp, http
from dispatcher.event.cloudevent import AmqpMessage, Event
from dispatcher.event.json_format import is_structured
from dispatcher.observe import logs, tracing
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import BindingMetrics
from dispatcher.observe.outcomes import Outcome

log = get_logger()


@dataclass(frozen=True, slots=True)
class _Final:
    action: Action
    # The log/metric outcome (None for LEAVE), or, for a message that writes no
    # delivery line, its span's: filtered, duplicate, requeued.
    outcome: Outcome | None
    attempts: int
    status: int | None  # None: no HTTP status (timeout, transport error, our own decision)
    reason: str | None = None
    # Unsettled, after the subscriber's answers decided the event's fate: that fate,
    # for the redelivery to carry out.
    verdict: Verdict | None = None


@dataclass(slots=True)
class _PendingReply:
    """The reply of the delivery's latest 2xx while it has not been forwarded."""

    reply: Event | None = None
    status: int = 0

    def verdict(self) -> ForwardReply | None:
        return None if self.reply is None else ForwardReply(self.reply, self.status)


# A span's outcome when the claim decided (no delivery line is written); LEAVE: none.
_CLAIM_OUTCOMES: Final = {Action.ACK: Outcome.DUPLICATE, Action.REQUEUE: Outcome.REQUEUED}


def longest_attempt(binding: BindingSettings, subscriber: Target) -> float:
    """How long a first attempt may hold its claim: its own deadline plus what may
    follow it (a reply per attempt, one ``timeout`` each, together within one
    more deadline; the dead-letter sink, bounded like the subscriber; publishes;
    the requeue wait). A redelivery waits this long at most, and a shared claim
    expires after it, so a dead owner's claim ends."""
    d = binding.delivery
    return 3 * subscriber.deadline_seconds() + 3 * d.timeout + d.backoff_max


class Handler:
    def __init__(
        self,
        binding: BindingSettings,
        vhost: str,
        subscriber: Target,
        dead_letterer: DeadLetterer,
        replier: Replier,
        dedupe: Dedupe,
        metrics: BindingMetrics,
        waits: Waits,
        lines: logs.DeliveryLines,
        accepts: Predicate | None = None,
        tracer: tracing.Tracer | None = None,
    ) -> None:
        self._binding = binding
        self._tracer = tracer
        self._accepts = accepts
        self._vhost = vhost
        self._subscriber = subscriber
        self._dead_letterer = dead_letterer
        self._replier = replier
        self._dedupe = dedupe
        self._metrics = metrics
        self._waits = waits
        self._lines = lines
        self._log = log.bind(binding=binding.name)
        d = binding.delivery
        self._requeue_backoff = Backoff(d.backoff_policy, d.backoff_delay, d.backoff_max)
        self._dedupe_wait = longest_attempt(binding, subscriber)
        # A return's count outlives the wait and the whole next delivery that follows it.
        self._returns = RequeueCounts(2 * self._dedupe_wait, waits.time)

    async def handle(self, received: Received) -> Action:
        started = self._waits.time()
        if received.unreadable is None:
            event, problem = self._read(received.message)
        else:
            event, problem = amqp.wrap_unreadable(
                received.message, self._vhost, self._binding.queue, received.unreadable
            )
        try:
            trace, span = self._trace(received, event)
        except Exception as e:  # a bug met by this message must not loop it: dead-letter it
            trace, span = {}, None
            problem = self._bug("reading trace context", e, event.id)
        if span is None:
            return (await self._decide(received, event, problem, trace, started)).action
        try:
            final = await self._decide(received, event, problem, trace, started)
        except BaseException:
            span.end(Outcome.ERROR, 0, None)  # a bug: the engine gives the message back
            raise
        span.end(final.outcome, final.attempts, final.status)
        return final.action

    async def _decide(
        self,
        received: Received,
        event: Event,
        problem: str | None,
        trace: Mapping[str, str],
        started: float,
    ) -> _Final:
        """The message's fate. The outcome of a message that writes no delivery
        line (filtered, a suppressed duplicate, a busy claim) is its span's."""
        if problem is None and self._accepts is not None:
            try:
                accepted = self._accepts(event.attributes)
            except Exception as e:  # a bug met by this event must not loop it: dead-letter it
                problem, accepted = self._bug("filtering", e, event.id), True
            if not accepted:
                self._filtered(event, received.redelivered)
                return _Final(Action.ACK, Outcome.FILTERED, 0, None)
        claim = await self._claim(event, received.redelivered)
        if isinstance(claim, Action):
            return _Final(claim, _CLAIM_OUTCOMES.get(claim), 0, None)
        if (claim is not None and self._waits.given_up) or not received.channel.open:
            # Grace ended while the claim was being made: no new request now. Or
            # the message's channel closed before anything was sent: the broker
            # has it back and redelivers it, here or to another replica, and a
            # request now would be that redelivery's twin (their claims may race).
            if claim is not None:
                self._dedupe.release(claim, False)
            if not received.channel.open:
                self._log.info(
                    "channel closed before the request: left for redelivery", ce_id=event.id
                )
            return _Final(Action.LEAVE, None, 0, None)
        settled, verdict = False, None
        try:
            earlier = None if claim is None else claim.verdict
            final = await self._conclude(event, problem, received, started, trace, earlier)
            settled = final.outcome in (Outcome.DELIVERED, Outcome.DEAD_LETTERED)
            verdict = final.verdict
        finally:
            if claim is not None:
                self._dedupe.release(claim, settled, verdict)
        if settled:
            self._returns.settled(event.key)
        self._record(received, event, final, started)
        return final

    def _trace(
        self, received: Received, event: Event
    ) -> tuple[Mapping[str, str], tracing.DeliverySpan | None]:
        """The W3C headers to pass on, and the message's CONSUMER span if it is
        sampled. Without a span the message's own headers ride along to the
        subscriber, replies and dead letters; with one, none do: each attempt and
        publish sends its own span's context. The span is the current one of this
        delivery's task from here on, and in every log line about it."""
        trace = http.trace_headers(received.message.headers)
        if self._tracer is None:
            return trace, None
        span = self._tracer.begin(
            self._binding.name,
            self._binding.queue,
            received.tag,
            received.redelivered,
            received.message.message_id,
            event,
            trace,
            received.arrived_ns or time.time_ns(),
        )
        if span is None:
            return trace, None
        tracing.CURRENT.set(span)
        logs.bind_trace(span.trace_id, span.span_id)
        return {}, span

    async def _claim(self, event: Event, redelivered: bool) -> Claim | Action | None:
        """Duplicate suppression: the claim this attempt holds (None: no claim), or
        the Action when the event needs no attempt here (settled, or still busy)."""
        if not self._dedupe.enabled:
            return None
        if redelivered:
            found = await self._dedupe.claim_or_wait(event.key, self._dedupe_wait)
        else:
            found = await self._dedupe.claim_first(event.key, self._dedupe_wait)
        if found == "settled":
            tracing.note("duplicate suppressed")
            self._metrics.duplicates_suppressed.inc()
            self._log.info("duplicate suppressed", ce_id=event.id, ce_source=event.source)
            return Action.ACK
        if found == "busy":
            # Another attempt is still running: a second request now would be the
            # duplicate we exist to prevent. Give the message back instead.
            self._log.info("delivery deferred: another attempt still in flight", ce_id=event.id)
            return Action.REQUEUE if await self._backed_off(0) else Action.LEAVE
        return found

    async def _conclude(
        self,
        event: Event,
        problem: str | None,
        received: Received,
        started: float,
        trace: Mapping[str, str],
        verdict: Verdict | None,
    ) -> _Final:
        try:
            if verdict is not None:
                return await self._carry_out(event, verdict, received, started, trace)
            if problem is not None:
                return await self._dead_letter(event, Failure(None, reason=problem), 0, None, trace)
            return await self._deliver(event, trace, received.channel, started)
        except Exception as e:
            # A bug met by this message. Requeueing would meet it again forever;
            # dead-letter it with the reason instead, so the queue moves on.
            failure = Failure(None, reason=self._bug("delivering", e, event.id))
            try:
                return await self._dead_letter(event, failure, 0, None, trace)
            except Exception:
                # The event itself is what fails, its dead letter too: the message
                # as received, wrapped as for one that cannot be read, is built
                # from the broker's bytes alone and still goes.
                self._log.exception("internal error while dead-lettering", ce_id=event.id)
                wrapped = self._wrapped(received.message)
                return await self._dead_letter(wrapped, failure, 0, None, trace)

    async def _carry_out(
        self,
        event: Event,
        verdict: Verdict,
        received: Received,
        started: float,
        trace: Mapping[str, str],
    ) -> _Final:
        """A redelivery of an event whose fate an earlier attempt decided: that fate
        again, without a request (its line says ``attempts: 0``)."""
        if isinstance(verdict, DeadLetter):
            self._log.info("earlier verdict carried out: dead-letter", ce_id=event.id)
            return await self._dead_letter(event, verdict.failure, 0, verdict.status, trace)
        self._log.info("earlier verdict carried out: reply", ce_id=event.id)
        refusal = await self._replier.send(verdict.reply, trace)
        if refusal is None:
            return _Final(Action.ACK, Outcome.DELIVERED, 0, verdict.status)
        # Still not forwarded: Knative's rule for a reply that cannot be, the
        # subscriber is asked again (and its new answer decides).
        self._log.info(
            "reply still not forwarded: delivering again", ce_id=event.id, error=refusal.reason
        )
        return await self._deliver(event, trace, received.channel, started)

    def _bug(self, doing: str, error: Exception, ce_id: str | None = None) -> str:
        """Log a bug met by one message; the reason it is dead-lettered with."""
        if ce_id is None:
            self._log.exception(f"internal error while {doing}")
        else:
            self._log.exception(f"internal error while {doing}", ce_id=ce_id)
        return f"internal error: {type(error).__name__}: {error}"

    async def _backed_off(self, retry_number: int) -> bool:
        """Wait before giving a message back (at once it would come straight back);
        False when shutdown cut the wait: then it is left, not requeued."""
        return await self._waits.sleep(self._requeue_backoff.wait(retry_number))

    # ----------------------------------------------------------------- steps

    def _read(self, message: AmqpMessage) -> tuple[Event, str | None]:
        """The event to deliver, or a wrapped stand-in plus why it must be dead-lettered."""
        if len(message.body) > self._binding.max_body_size:
            problem = (
                f"message body of {len(message.body)} bytes exceeds max_body_size "
                f"{self._binding.max_body_size}"
            )
            return self._oversized(message), problem
        try:
            return amqp.read(
                message, self._vhost, self._binding.queue, self._binding.non_cloudevent
            )
        except Exception as e:  # a mapping bug must not loop the message forever
            return self._wrapped(message), self._bug("reading a message", e)

    def _oversized(self, message: AmqpMessage) -> Event:
        """The event an oversized message carries in its headers (the binary form:
        read from them alone, its body never parsed), so that its dead letter keeps
        the event's own id, type and source; a structured one (a body to parse),
        or one that is no valid event, is wrapped."""
        if not is_structured(message.content_type):
            try:
                return amqp.from_amqp(message)
            except Exception:  # not a CloudEvent, malformed, a bug: dead-lettered all the same
                pass
        return self._wrapped(message)

    def _wrapped(self, message: AmqpMessage) -> Event:
        return amqp.wrap(message, self._vhost, self._binding.queue)

    async def _deliver(
        self, event: Event, trace: Mapping[str, str], channel: ChannelState, started: float
    ) -> _Final:
        request = http.to_http(event, self._binding.content_mode, trace)
        pending, accept = None, None
        if self._replier.enabled:
            pending = _PendingReply()
            accept = partial(self._forward_reply, trace, pending)
        outcome = await self._subscriber.send(request, accept, channel.is_open, started)
        last, refusal = outcome.last, outcome.refusal
        # The reply of the last attempt's 2xx, if it ended the delivery unforwarded
        # (an earlier attempt's is not: a later answer decides).
        verdict = pending.verdict() if pending is not None and refusal is not None else None
        if outcome.result is Result.ABANDONED:
            # Shutdown, or the channel closed with a reply not forwarded: that
            # reply is the redelivery's to forward.
            return _Final(Action.LEAVE, None, outcome.attempts, last.status, verdict=verdict)
        if outcome.result is Result.RETURNED:
            # Held by the open circuit breaker as long as the broker lets a message
            # stay unacked: back to the queue, its retries unspent.
            reason = "circuit breaker open: given back to the queue unsent"
            return _Final(Action.REQUEUE, Outcome.REQUEUED, outcome.attempts, last.status, reason)
        if outcome.result is Result.DELIVERED:
            return _Final(Action.ACK, Outcome.DELIVERED, outcome.attempts, last.status)
        if refusal is None:
            # No answer (a timeout, TLS, a refused connection): the client's error is
            # the only reason there is, on the line and in the dead letter.
            failure = Failure(last.status, last.body, reason=None if last.status else last.error)
        elif refusal.retry and self._waits.given_up:
            # Shutdown cut the reply short: not the event's failure. Leave it.
            return _Final(
                Action.LEAVE, None, outcome.attempts, last.status, refusal.reason, verdict
            )
        else:
            failure = Failure(refusal.status, refusal.body, refusal.reason, refusal.destination)
        return await self._dead_letter(event, failure, outcome.attempts, last.status, trace)

    async def _forward_reply(
        self, trace: Mapping[str, str], pending: _PendingReply, last: Response
    ) -> Refusal | None:
        """Run by the subscriber's target on each 2xx: None when there is nothing to
        forward or it was accepted. A reply not forwarded stays ``pending``."""
        pending.reply = None
        if last.status == 202:
            return None  # accepted for later: never a reply (Knative's data plane)
        headers = last.headers
        if not http.is_http_cloudevent(headers):
            return None  # a plain answer, however large, is just an answer
        if last.truncated:
            limit = self._binding.max_body_size
            reason = f"invalid reply: larger than max_body_size {limit}"
            return Refusal(reason, retry=False, status=last.status, body=last.body)
        try:
            reply = http.from_http_response(headers, last.body)
        except EventError as e:
            # Bad input from the subscriber: another attempt would not fix it.
            reason = f"invalid reply: {e.reason}"
            return Refusal(reason, retry=False, status=last.status, body=last.body)
        if reply is None:
            return None
        refusal = await self._replier.send(reply, trace)
        if refusal is not None and refusal.retry:
            pending.reply, pending.status = reply, last.status or 0
        return refusal

    async def _dead_letter(
        self,
        event: Event,
        failure: Failure,
        attempts: int,
        status: int | None,
        trace: Mapping[str, str],
    ) -> _Final:
        """Dead-letter; if there is no target, reject; if every target failed,
        requeue: never ack it. ``status``: the subscriber's last, for the line.
        Unless it was acked, the verdict stays for the message's redelivery."""
        dead_letterer = self._dead_letterer
        if dead_letterer.has_target and await dead_letterer.send(event, failure, trace):
            return _Final(Action.ACK, Outcome.DEAD_LETTERED, attempts, status, failure.reason)
        verdict = dead_letter(failure, status)
        reason = failure.reason or "delivery failed"
        if self._waits.given_up:
            # Shutdown cut a dead-letter attempt short: that is not a failure of
            # the message. Leave it for redelivery.
            return _Final(Action.LEAVE, None, attempts, status, reason, verdict)
        if not dead_letterer.has_target:
            # As Knative drops it; the queue's own dead-letter exchange may still catch it.
            reason += "; no dead-letter target"
            return _Final(Action.REJECT, Outcome.REJECTED, attempts, status, reason, verdict)
        reason += "; every dead-letter target failed"
        returned = self._returns.returned(event.key)
        if not await self._backed_off(self._binding.delivery.retry + returned):
            return _Final(Action.LEAVE, None, attempts, status, reason, verdict)
        return _Final(Action.REQUEUE, Outcome.REQUEUED, attempts, status, reason, verdict)

    def _filtered(self, event: Event, redelivered: bool) -> None:
        """Not for this subscriber: acked unsent, counted, and no info-level line
        (a busy binding may filter out most of its queue)."""
        self._metrics.events[Outcome.FILTERED].inc()
        self._log.debug(
            "event filtered",
            ce_id=event.id,
            ce_type=event.type,
            ce_source=event.source,
            redelivered=redelivered,
        )

    def _record(self, received: Received, event: Event, final: _Final, started: float) -> None:
        if final.outcome is None:
            return
        fields: dict[str, Any] = {
            "binding": self._binding.name,
            "outcome": final.outcome,
            "ce_id": event.id,
            "ce_type": event.type,
            "ce_source": event.source,
            "attempts": final.attempts,
            "status": status_field(final.status),
            "duration_ms": round((self._waits.time() - started) * 1000.0, 3),
            "redelivered": received.redelivered,
        }
        if final.reason:
            fields["reason"] = final.reason
        # The counter moves once the line is out: whoever waits on it can rely on the line.
        # A rejected event may be gone for good (no dead-letter exchange): a warning.
        level = "warning" if final.outcome is Outcome.REJECTED else "info"
        self._lines.add(fields, self._metrics.events[final.outcome].inc, level)
