"""The spans ``otlp_encoding`` encodes are the spans the SDK's own OTLP encoder
would produce from the same data: the SDK is the oracle, compared message by
message after both are parsed back (attribute order is not part of OTLP)."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SdkEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from dispatcher.observe.otlp_encoding import (
    CLIENT,
    CONSUMER,
    ERROR,
    HAS_IS_REMOTE,
    IS_REMOTE,
    PRODUCER,
    UNSET,
    Encoder,
    EndedSpan,
    Shape,
)

RESOURCE = Resource.create({"service.name": "enc", "deployment.ids": (1, 2)})
SCOPE = InstrumentationScope("dispatcher", "9.9")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
KINDS = {CONSUMER: SpanKind.CONSUMER, CLIENT: SpanKind.CLIENT, PRODUCER: SpanKind.PRODUCER}
SHARED = (("messaging.system", "rabbitmq"), ("dispatcher.redelivered", False), ("n", 1.5))


def ended(
    span_id: int,
    shape: Shape,
    own: tuple[tuple[str, Any], ...] = (),
    parent: int = 0,
    state: TraceState | None = None,
    description: str | None = None,
    events: tuple[tuple[str, Any, int], ...] = (),
) -> EndedSpan:
    context = SpanContext(0xABC, span_id, False, SAMPLED, state)
    start = 1000 + span_id
    return EndedSpan(context, parent, start, start + 1000, shape, own, description, events)


def as_sdk(span: EndedSpan) -> ReadableSpan:
    """The same span as the SDK would have recorded it."""
    shape = span.shape
    parent = None
    if span.parent_id:
        remote = bool(shape.flags & IS_REMOTE)
        parent = SpanContext(0xABC, span.parent_id, remote, SAMPLED)
    code = StatusCode.ERROR if shape.status == ERROR else StatusCode.UNSET
    return ReadableSpan(
        name=shape.name,
        context=span.context,
        parent=parent,
        resource=RESOURCE,
        attributes=dict(shape.attributes + span.own),
        events=[SdkEvent(name, attributes, at) for name, attributes, at in span.events],
        kind=KINDS[shape.kind],
        status=Status(code, span.description),
        start_time=span.start,
        end_time=span.end,
        instrumentation_scope=SCOPE,
    )


def parsed(data: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                ordered = sorted(span.attributes, key=lambda kv: kv.key)
                del span.attributes[:]
                span.attributes.extend(ordered)
    return request


def encoder(shapes: int = 4096) -> Encoder:
    version = SCOPE.version or ""
    return Encoder(RESOURCE.attributes, RESOURCE.schema_url, SCOPE.name, version, shapes)


def spans() -> list[EndedSpan]:
    consumer = Shape("q process", CONSUMER, HAS_IS_REMOTE, UNSET, SHARED)
    return [
        ended(1, consumer, (("messaging.rabbitmq.message.delivery_tag", 7), ("id", "a"))),
        ended(2, consumer, (("messaging.rabbitmq.message.delivery_tag", 8), ("id", "b"))),
        ended(
            3,
            Shape("q process", CONSUMER, HAS_IS_REMOTE | IS_REMOTE, ERROR, SHARED),
            (("id", "c"),),
            parent=0x55,
            state=TraceState([("vendor", "1"), ("other", "x")]),
            description="dead_lettered",
            events=(("retry scheduled", {"delay_ms": 100, "why": "503"}, 1500), ("claim", None, 1)),
        ),
        ended(
            4,
            Shape("POST", CLIENT, HAS_IS_REMOTE, ERROR, (("error.type", "timeout"), ("port", 80))),
            parent=3,
            description="Operation timed out after 1000 milliseconds",
        ),
        ended(5, Shape("POST", CLIENT, HAS_IS_REMOTE, UNSET, (("code", 202),)), parent=1),
        ended(6, Shape("publish dlx", PRODUCER, HAS_IS_REMOTE, UNSET, SHARED), parent=3),
    ]


def test_every_span_is_what_the_sdk_encoder_makes_of_it() -> None:
    given = spans()
    ours = parsed(encoder().request(given))
    theirs = parsed(encode_spans([as_sdk(s) for s in given]).SerializeToString())
    assert len(ours.resource_spans[0].scope_spans[0].spans) == len(given)
    assert ours == theirs


def test_spans_of_one_shape_keep_their_own_attributes_apart() -> None:
    request = parsed(encoder().request(spans()[:2]))
    first, second = request.resource_spans[0].scope_spans[0].spans
    keys = [kv.key for kv in first.attributes]
    assert len(keys) == len(set(keys)) == len(SHARED) + 2
    tags = [
        kv.value.int_value
        for span in (first, second)
        for kv in span.attributes
        if kv.key == "messaging.rabbitmq.message.delivery_tag"
    ]
    assert tags == [7, 8]


def test_more_shapes_than_it_keeps_encode_the_same() -> None:
    given = spans() * 3  # six shapes over and over, through a cache of two
    small = encoder(shapes=2)
    assert parsed(small.request(given)) == parsed(encoder().request(given))
    assert len(small._shapes) <= 2
