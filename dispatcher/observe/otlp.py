"""Tracing with the OpenTelemetry SDK, exported over OTLP/HTTP (protobuf).

What it records is ``dispatcher.observe.tracing``'s: a CONSUMER span per message,
a CLIENT span per HTTP attempt, a PRODUCER span per publish. Imported only
when tracing is on.

How the SDK is called, and why:

- Spans are recorded on the engine loop as plain objects and, when they end,
  become an ``otlp_encoding.EndedSpan`` handed straight to the SDK's
  ``BatchSpanProcessor``: what repeats from span to span (name, kind, status,
  most attributes) apart from what is each span's own, so the export thread
  encodes the repeated part once per shape. The SDK's own ``Span`` (a lock,
  attribute validation on every ``set_attribute``, the span processor's start
  hook) cost about 45 us per span here, and its encoder about 40 us more per
  span; these spans only ever carry attributes of known types.
- Sampling is the SDK's rule (``TraceIdRatioBased``'s bound on the trace id,
  parent-based) decided before anything is built: a message that is not
  sampled costs a trace-id draw or a parent's flags, and nothing else.
- The W3C headers are written by the SDK's propagator, never by hand.
- Exporting runs on the processor's own thread. A collector that is down,
  slow or refusing never reaches the loop: at most ``queue_size`` spans wait
  for it, and every span beyond that, or in a batch the collector did not
  take, is dropped and counted (``dispatcher_spans_dropped_total``). The
  processor's own bound is set above ours, so it never drops uncounted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dispatcher import __version__
from dispatcher.config import TracingSettings, redact_url
from dispatcher.event.cloudevent import Event
from dispatcher.observe.logs import get_logger
from dispatcher.observe.otlp_encoding import (
    CLIENT,
    CONSUMER,
    ERROR,
    HAS_IS_REMOTE,
    IS_REMOTE,
    PRODUCER,
    UNSET,
    Attributes,
    Encoder,
    EndedSpan,
    Shape,
)
from dispatcher.observe.outcomes import Outcome
from dispatcher.observe.tracing import Peer

log = get_logger()

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_IDS: Final = RandomIdGenerator()
_PROPAGATOR: Final = TraceContextTextMapPropagator()
# The propagator's own pattern for a traceparent, read here for one thing only:
# whether a well-formed parent says "not sampled" (its extract costs 6 us).
_TRACEPARENT: Final = TraceContextTextMapPropagator._TRACEPARENT_HEADER_FORMAT_RE
_NO_ID: Final = frozenset({"0" * 32, "0" * 16})
# Outcomes that end a consumer span in error: the event did not reach its
# subscriber, or handling it met a bug.
_FAILED: Final = frozenset({Outcome.DEAD_LETTERED, Outcome.REJECTED, Outcome.ERROR})

Dropped = Callable[[int], None]
# What ``_parent`` says of a parent that is not sampled, before anything is built.
UNSAMPLED: Final = SpanContext(1, 1, True, TraceFlags(0))


def _headers(context: SpanContext) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=set_span_in_context(NonRecordingSpan(context)))
    return carrier


class OtlpTracer:
    """``tracing.Tracer`` on the OpenTelemetry SDK."""

    def __init__(
        self,
        settings: TracingSettings,
        url: str,
        dropped: Dropped,
        queue_size: int = 2048,
        batch_size: int = 512,
        schedule_delay: float = 1.0,
    ) -> None:
        # OTEL_RESOURCE_ATTRIBUTES joins in here; the service name is the
        # setting's, which OTEL_SERVICE_NAME already overrode (config.otel).
        resource = Resource.create({SERVICE_NAME: settings.service_name})
        encoder = Encoder(resource.attributes, resource.schema_url, "dispatcher", __version__)
        self.dropped = dropped
        self._limit = queue_size
        self.given = 0  # spans handed to the processor (the loop's count)
        self.taken = 0  # spans the exporter was handed (the export thread's count)
        # The exporter reads OTEL_EXPORTER_OTLP_HEADERS and _TIMEOUT itself.
        exporter = _CountedExporter(OTLPSpanExporter(endpoint=url), encoder, self, url)
        self._processor = BatchSpanProcessor(
            exporter,
            max_queue_size=queue_size + batch_size,
            schedule_delay_millis=schedule_delay * 1000.0,
            max_export_batch_size=batch_size,
        )
        self._bound = TraceIdRatioBased.get_bound_for_rate(settings.sample_ratio)

    # ------------------------------------------------------------- tracing.Tracer

    def begin(
        self,
        binding: str,
        queue: str,
        tag: int,
        redelivered: bool,
        message_id: str | None,
        event: Event,
        trace: Mapping[str, str],
        arrived_ns: int,
    ) -> _Delivery | None:
        parent = _parent(trace, event)
        if parent is UNSAMPLED:
            return None  # parent-based: an unsampled parent is followed
        if parent is None:
            trace_id = _IDS.generate_trace_id()
            if (trace_id & TraceIdRatioBased.TRACE_ID_LIMIT) >= self._bound:
                return None
            context = SpanContext(trace_id, _IDS.generate_span_id(), False, _SAMPLED)
        elif not parent.trace_flags.sampled:
            return None
        else:
            span_id = _IDS.generate_span_id()
            context = SpanContext(parent.trace_id, span_id, False, _SAMPLED, parent.trace_state)
        attributes = event.attributes
        shared: Attributes = (
            ("messaging.system", "rabbitmq"),
            ("messaging.destination.name", queue),
            ("messaging.operation.type", "process"),
            ("messaging.operation.name", "process"),
            ("cloudevents.event_type", event.type),
            ("cloudevents.event_source", event.source),
            ("cloudevents.event_spec_version", attributes.get("specversion", "1.0")),
            ("dispatcher.binding", binding),
            ("dispatcher.redelivered", redelivered),
        )
        own: Attributes = (
            ("messaging.rabbitmq.message.delivery_tag", tag),
            ("cloudevents.event_id", event.id),
        )
        if message_id:
            own += (("messaging.message.id", message_id),)
        subject = attributes.get("subject")
        if subject is not None:
            own += (("cloudevents.event_subject", subject),)
        return _Delivery(self, f"{queue} process", context, parent, arrived_ns, shared, own)

    def shutdown(self, timeout: float) -> None:
        # The SDK's shutdown waits for an export in progress without a bound of
        # its own that we can pass: it runs on a thread we stop waiting for.
        closing = threading.Thread(
            target=self._processor.shutdown, name="trace-shutdown", daemon=True
        )
        closing.start()
        closing.join(timeout)

    # ------------------------------------------------------------- the loop

    def emit(
        self,
        shape: Shape,
        context: SpanContext,
        parent_id: int,
        start: int,
        own: Attributes = (),
        description: str | None = None,
        events: tuple[tuple[str, Mapping[str, Any] | None, int], ...] = (),
    ) -> None:
        if self.given - self.taken >= self._limit:
            self.dropped(1)  # the collector is behind: a span, never time
            return
        self.given += 1
        span = EndedSpan(context, parent_id, start, time.time_ns(), shape, own, description, events)
        # The processor only reads whether ``span.context`` is sampled; what it
        # queues reaches our exporter, which encodes these, not the SDK's spans.
        self._processor.on_end(span)  # type: ignore[arg-type]


def _unsampled(header: str) -> bool:
    """A well-formed version-00 parent whose sampled flag is off: not traced, and
    nothing more to read (the propagator's rules: ids not all zero, nothing after)."""
    match = _TRACEPARENT.match(header)
    if match is None or match.group(1) != "00" or match.group(5):
        return False
    return not int(match.group(4), 16) & 1 and not {match.group(2), match.group(3)} & _NO_ID


def _parent(trace: Mapping[str, str], event: Event) -> SpanContext | None:
    """The message's W3C context: its AMQP headers, else the event's
    ``traceparent`` extension; ``None`` for none, or one that is malformed,
    and ``UNSAMPLED`` for a parent that is not sampled."""
    carrier: Mapping[str, str] = trace
    if "traceparent" not in trace:
        extension = event.attributes.get("traceparent")
        if extension is None:
            return None
        carrier = {"traceparent": extension}
        state = event.attributes.get("tracestate")
        if state is not None:
            carrier["tracestate"] = state
    if _unsampled(carrier["traceparent"]):
        return UNSAMPLED
    found = get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return found if found.is_valid else None


class _Delivery:
    """A message's CONSUMER span (``tracing.DeliverySpan``)."""

    __slots__ = (
        "_events",
        "_own",
        "_parent",
        "_shared",
        "_start",
        "context",
        "name",
        "span_id",
        "trace_id",
        "tracer",
    )

    def __init__(
        self,
        tracer: OtlpTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start: int,
        shared: Attributes,
        own: Attributes,
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.context = context
        self._parent = parent
        self._start = start
        self._shared = shared
        self._own = own
        self._events: list[tuple[str, Mapping[str, Any] | None, int]] = []
        self.trace_id = format(context.trace_id, "032x")
        self.span_id = format(context.span_id, "016x")

    def child(self) -> SpanContext:
        c = self.context
        return SpanContext(c.trace_id, _IDS.generate_span_id(), False, _SAMPLED, c.trace_state)

    def attempt(self, peer: Peer, resend_count: int) -> _Attempt:
        return _Attempt(self, peer, resend_count)

    def publish(self, exchange: str, routing_key: str, purpose: str) -> _Publish:
        return _Publish(self, exchange, routing_key, purpose)

    def note(self, name: str, attributes: Mapping[str, str | int | float] | None = None) -> None:
        self._events.append((name, attributes, time.time_ns()))

    def end(self, outcome: str | None, attempts: int, status: int | None) -> None:
        ended: Attributes = (
            ("dispatcher.outcome", str(outcome or Outcome.LEFT)),
            ("dispatcher.attempts", attempts),
        )
        if status is not None:
            ended += (("dispatcher.status", status),)
        failed = outcome in _FAILED
        parent = self._parent
        # A parent here came in the message: it is remote.
        flags = HAS_IS_REMOTE | IS_REMOTE if parent else HAS_IS_REMOTE
        shape = Shape(self.name, CONSUMER, flags, ERROR if failed else UNSET, self._shared + ended)
        self.tracer.emit(
            shape,
            self.context,
            parent.span_id if parent else 0,
            self._start,
            self._own,
            outcome if failed else None,
            tuple(self._events),
        )


class _Attempt:
    """One HTTP attempt's CLIENT span (``tracing.AttemptSpan``)."""

    __slots__ = ("_attributes", "_context", "_delivery", "_start", "header_lines")

    def __init__(self, delivery: _Delivery, peer: Peer, resend_count: int) -> None:
        self._delivery = delivery
        self._context = delivery.child()
        self._start = time.time_ns()
        attributes: Attributes = (
            ("http.request.method", "POST"),
            ("server.address", peer.address),
            ("server.port", peer.port),
            ("url.full", peer.url),
        )
        if resend_count:
            attributes += (("http.request.resend_count", resend_count),)
        self._attributes = attributes
        self.header_lines = [f"{k}: {v}" for k, v in _headers(self._context).items()]

    def end(self, status: int | None, error: str | None, timed_out: bool) -> None:
        attributes = self._attributes
        code = UNSET
        if status is not None:
            attributes += (("http.response.status_code", status),)
            if status >= 400:
                attributes += (("error.type", str(status)),)
                code = ERROR
        else:
            # Low cardinality, as the convention asks; the whole text is the description.
            attributes += (("error.type", "timeout" if timed_out else "transport"),)
            code = ERROR
        d = self._delivery
        shape = Shape("POST", CLIENT, HAS_IS_REMOTE, code, attributes)
        description = error if status is None else None
        d.tracer.emit(shape, self._context, d.context.span_id, self._start, (), description)


class _Publish:
    """One publish's PRODUCER span (``tracing.PublishSpan``)."""

    __slots__ = ("_attributes", "_context", "_delivery", "_name", "_start", "headers")

    def __init__(self, delivery: _Delivery, exchange: str, routing_key: str, purpose: str) -> None:
        self._delivery = delivery
        self._context = delivery.child()
        self._start = time.time_ns()
        self._name = f"publish {exchange or 'amq.default'}"
        attributes: Attributes = (
            ("messaging.system", "rabbitmq"),
            ("messaging.operation.type", "send"),
            ("messaging.operation.name", "publish"),
            ("messaging.destination.name", exchange),
            ("dispatcher.purpose", purpose),
        )
        if routing_key:
            attributes += (("messaging.rabbitmq.destination.routing_key", routing_key),)
        self._attributes = attributes
        self.headers = _headers(self._context)

    def end(self, problem: str | None) -> None:
        d = self._delivery
        shape = Shape(
            self._name,
            PRODUCER,
            HAS_IS_REMOTE,
            UNSET if problem is None else ERROR,
            self._attributes,
        )
        d.tracer.emit(shape, self._context, d.context.span_id, self._start, (), problem)


class _CountedExporter(SpanExporter):
    """Encodes what the processor hands it (``otlp_encoding``) and posts it with
    the SDK's OTLP/HTTP exporter's client (its retries, headers, compression,
    timeout and TLS settings); counts what it takes and what it loses, and says
    once when export starts failing and once when it works again."""

    def __init__(
        self, inner: OTLPSpanExporter, encoder: Encoder, tracer: OtlpTracer, url: str
    ) -> None:
        self._inner = inner
        self._encoder = encoder
        self._tracer = tracer
        self._url = redact_url(url)
        self._failing = False

    def export(self, spans: Sequence[EndedSpan]) -> SpanExportResult:  # type: ignore[override]
        self._tracer.taken += len(spans)
        problem = None
        try:
            # The exporter's own ``export`` takes only the SDK's spans, and
            # encoding those is the cost ``otlp_encoding`` exists to avoid; its
            # client is the rest of it. Pinned to the SDK's minor version.
            sent = self._inner._client.export(self._encoder.request(spans)).success
        except Exception as error:  # a bug here must not stop the processor's thread
            sent = False
            problem = repr(error)
        if sent:
            if self._failing:
                self._failing = False
                log.info("trace export works again", endpoint=self._url)
            return SpanExportResult.SUCCESS
        self._tracer.dropped(len(spans))
        if not self._failing:
            self._failing = True
            # ``error``: only when our own encoding raised (the exporter logs its own).
            said = {"error": problem} if problem else {}
            log.warning("trace export failed: spans dropped", endpoint=self._url, **said)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call]
